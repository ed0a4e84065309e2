package bench

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/go-sql-driver/mysql"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
)

// capturedStmt is a statement a pool ran, with its arguments, and the call that ran it.
type capturedStmt struct {
	call  string
	query string
	args  []any
}

// stmtLog records the statements run on a capturing pool, each text once per call, and has
// them explained by flush: after each call, and before each statement that changes rows, so
// that every plan is taken on the table as the statement found it.
type stmtLog struct {
	mu      sync.Mutex
	call    string
	seen    map[string]bool
	pending []capturedStmt
	explain func(capturedStmt) // run by flush on each pending statement, in order
}

func (l *stmtLog) add(q string, args []driver.NamedValue) {
	l.mu.Lock()
	defer l.mu.Unlock()
	key := l.call + "\x00" + q
	if l.seen[key] {
		return
	}
	l.seen[key] = true
	a := make([]any, len(args))
	for i, v := range args {
		a[i] = v.Value
	}
	l.pending = append(l.pending, capturedStmt{call: l.call, query: q, args: a})
}

// flush explains the pending statements.
func (l *stmtLog) flush() {
	l.mu.Lock()
	p := l.pending
	l.pending = nil
	l.mu.Unlock()
	for _, s := range p {
		l.explain(s)
	}
}

// setCall names the call whose statements follow.
func (l *stmtLog) setCall(name string) {
	l.mu.Lock()
	l.call = name
	l.mu.Unlock()
}

// capturingPool opens a pool on env whose every statement goes to the log: the library's
// own text, as it sends it. The driver interpolates the arguments (interpolateParams), so
// that every statement is one query on the wire and its text is what is recorded.
func capturingPool(env Env, log *stmtLog) (*sql.DB, error) {
	cfg, err := mysql.ParseDSN(env.DSN)
	if err != nil {
		return nil, err
	}
	cfg.ParseTime, cfg.InterpolateParams = true, true
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(captureConnector{c, log}), nil
}

type captureConnector struct {
	driver.Connector
	log *stmtLog
}

func (c captureConnector) Connect(ctx context.Context) (driver.Conn, error) {
	cn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return captureConn{cn, c.log}, nil
}

// captureConn passes every call on to the driver's connection, recording the statements.
type captureConn struct {
	driver.Conn
	log *stmtLog
}

func (c captureConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	c.log.add(q, args)
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, q, args)
}

func (c captureConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	c.log.add(q, args)
	c.log.flush() // before the statement changes what the ones before it read
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, q, args)
}

func (c captureConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	c.log.add(q, nil)
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, q)
}

func (c captureConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

func (c captureConn) Ping(ctx context.Context) error { return c.Conn.(driver.Pinger).Ping(ctx) }

func (c captureConn) ResetSession(ctx context.Context) error {
	return c.Conn.(driver.SessionResetter).ResetSession(ctx)
}

func (c captureConn) IsValid() bool { return c.Conn.(driver.Validator).IsValid() }

func (c captureConn) CheckNamedValue(v *driver.NamedValue) error {
	return c.Conn.(driver.NamedValueChecker).CheckNamedValue(v)
}

// Plan is one line of a statement's ANALYZE (EXPLAIN for a statement that changes rows):
// the table, the access type, the key, the optimizer's rows estimate and, for ANALYZE, the
// rows it read (r_rows) and the extra notes.
type Plan struct {
	ID, SelectType, Table, Type, Key string
	Rows, RRows                      string
	Extra                            string
}

// Explained is a statement the console's calls ran, and its plan on the console table.
type Explained struct {
	Call, Query string
	Plans       []Plan
	Analyzed    bool // ANALYZE (the statement ran); false: EXPLAIN only (it changes rows)
	// Timed is what ANALYZE FORMAT=JSON says of each table it read (when Analyzed): the
	// rows it read per loop, the loops, and the time in the engine and beside it.
	Timed   []TableTime
	TotalMS float64 // the statement's r_total_time_ms by ANALYZE FORMAT=JSON (when Analyzed)
}

// TableTime is one table access of ANALYZE FORMAT=JSON.
type TableTime struct {
	Table                string
	Loops, Rows          float64 // r_loops, r_rows (per loop)
	TableMS, OtherMS     float64 // r_table_time_ms (the engine), r_other_time_ms (conditions, grouping)
	UsedPriorityQueueFor int     // the filesort's r_limit when it kept a priority queue, else 0
}

// timed runs ANALYZE FORMAT=JSON of q and reads the time of each table access.
func timed(ctx context.Context, db *sql.DB, q string, args []any) ([]TableTime, float64, error) {
	var doc string
	if err := db.QueryRowContext(ctx, "ANALYZE FORMAT=JSON "+q, args...).Scan(&doc); err != nil {
		return nil, 0, err
	}
	var root any
	if err := json.Unmarshal([]byte(doc), &root); err != nil {
		return nil, 0, err
	}
	// num reads a number of m (a missing map or value: 0).
	num := func(m map[string]any, k string) float64 {
		f, _ := m[k].(float64)
		return f
	}
	var (
		out   []TableTime
		total float64
		walk  func(v any, limit int)
	)
	walk = func(v any, limit int) {
		switch v := v.(type) {
		case map[string]any:
			if fs, ok := v["filesort"].(map[string]any); ok && fs["r_used_priority_queue"] == true {
				limit = int(num(fs, "r_limit"))
			}
			if name, ok := v["table_name"].(string); ok {
				out = append(out, TableTime{Table: name, Loops: num(v, "r_loops"), Rows: num(v, "r_rows"),
					TableMS: num(v, "r_table_time_ms"), OtherMS: num(v, "r_other_time_ms"), UsedPriorityQueueFor: limit})
			}
			for _, k := range slices.Sorted(maps.Keys(v)) {
				walk(v[k], limit)
			}
		case []any:
			for _, e := range v {
				walk(e, limit)
			}
		}
	}
	walk(root, 0)
	// The statement's time: its query block's, or for a UNION the sum of its parts'.
	if top, ok := root.(map[string]any); ok {
		qb, _ := top["query_block"].(map[string]any)
		total = num(qb, "r_total_time_ms")
		if u, ok := qb["union_result"].(map[string]any); ok {
			specs, _ := u["query_specifications"].([]any)
			for _, sp := range specs {
				if m, ok := sp.(map[string]any); ok {
					part, _ := m["query_block"].(map[string]any)
					total += num(part, "r_total_time_ms")
				}
			}
		}
	}
	return out, total, nil
}

// ExplainConsole runs every console call once on a capturing pool, then ANALYZEs each
// SELECT they ran (and EXPLAINs each statement that changes rows), on the table as it is.
// With mutate, last it runs RequeueFailed and SkipFailed for real on a few dead letters, to capture their
// id selects and updates: the table has that many dead letters fewer afterwards.
func (t *ConsoleTable) ExplainConsole(ctx context.Context, env Env, mutate bool) ([]Explained, error) {
	plain, err := env.open()
	if err != nil {
		return nil, err
	}
	defer plain.Close()
	var (
		out  []Explained
		errs []error
	)
	log := &stmtLog{seen: map[string]bool{}, explain: func(s capturedStmt) {
		q := strings.TrimSpace(s.query)
		verb := strings.ToUpper(strings.Fields(q)[0])
		if verb != "SELECT" && verb != "UPDATE" && verb != "DELETE" {
			return // SHOW, the session's settings
		}
		e := Explained{Call: s.call, Query: q, Analyzed: verb == "SELECT"}
		how := "EXPLAIN "
		if e.Analyzed {
			how = "ANALYZE "
		}
		var err error
		if e.Plans, err = plans(ctx, plain, how+q, s.args); err != nil {
			errs = append(errs, fmt.Errorf("%s: %s: %w", s.call, q, err))
		}
		if e.Analyzed && err == nil {
			if e.Timed, e.TotalMS, err = timed(ctx, plain, q, s.args); err != nil {
				errs = append(errs, fmt.Errorf("%s: %s: ANALYZE FORMAT=JSON: %w", s.call, q, err))
			}
		}
		out = append(out, e)
	}}
	db, err := capturingPool(env, log)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	calls, err := t.consoleCalls(db)
	if err != nil {
		return nil, err
	}
	if mutate {
		calls = append(calls, t.mutations(db)...)
	}
	for _, c := range calls {
		if c.Baseline {
			continue
		}
		log.setCall(c.Name)
		if _, err := c.run(ctx); err != nil {
			return nil, fmt.Errorf("%s: %w", c.Name, err)
		}
		log.flush()
	}
	return out, errors.Join(errs...)
}

// plans runs an EXPLAIN or ANALYZE and reads its table.
func plans(ctx context.Context, db *sql.DB, q string, args []any) ([]Plan, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	var out []Plan
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		get := func(name string) string {
			for i, c := range cols {
				if c == name {
					if vals[i].Valid {
						return vals[i].String
					}
					return "NULL"
				}
			}
			return "-"
		}
		out = append(out, Plan{ID: get("id"), SelectType: get("select_type"), Table: get("table"), Type: get("type"),
			Key: get("key"), Rows: get("rows"), RRows: get("r_rows"), Extra: get("Extra")})
	}
	return out, rows.Err()
}

// WriteExplained writes each statement and its plan, as text.
func WriteExplained(w io.Writer, es []Explained) {
	for _, e := range es {
		how := "ANALYZE"
		if !e.Analyzed {
			how = "EXPLAIN"
		}
		fmt.Fprintf(w, "\n%s: %s\n  %s\n", e.Call, how, strings.Join(strings.Fields(e.Query), " "))
		for _, p := range e.Plans {
			fmt.Fprintf(w, "  id=%s %s table=%s type=%s key=%s rows=%s r_rows=%s extra=%s\n",
				p.ID, p.SelectType, p.Table, p.Type, p.Key, p.Rows, p.RRows, p.Extra)
		}
		if e.Analyzed {
			fmt.Fprintf(w, "  FORMAT=JSON: %.1f ms in all", e.TotalMS)
			for _, tt := range e.Timed {
				fmt.Fprintf(w, "; %s: %.0f loops x %.2f rows read, %.1f ms in the engine + %.1f ms beside", tt.Table, tt.Loops, tt.Rows, tt.TableMS, tt.OtherMS)
				if tt.UsedPriorityQueueFor > 0 {
					fmt.Fprintf(w, " (sorted into a priority queue of %d)", tt.UsedPriorityQueueFor)
				}
			}
			fmt.Fprintln(w)
		}
	}
}

// mutations are the console's writes, run for real by ExplainConsole: the rejected page's
// lookup by event id, a replay and a resend of a rejected message; a requeue of one dead
// letter and of every one of a type; a skip of one, and of every one of another type; and a
// requeue of the first 500 of those left.
func (t *ConsoleTable) mutations(db *sql.DB) []ConsoleCall {
	store, err := outbox.NewMySQLStore(db, t.storeConfig())
	if err != nil {
		return []ConsoleCall{{Name: "store", run: func(context.Context) (int, error) { return 0, err }}}
	}
	admin := outbox.NewAdmin(store)
	// The newest dead letter, read on the table's own pool (not a console call).
	one := func(f func(context.Context, int64) error) func(ctx context.Context) (int, error) {
		return func(ctx context.Context) (int, error) {
			var id sql.NullInt64
			if err := t.db.QueryRowContext(ctx, "SELECT MAX(id) FROM `"+t.Name+"` WHERE status = 'FAIL'").Scan(&id); err != nil {
				return 0, err
			}
			if !id.Valid {
				return 0, errNoDeadLetter
			}
			return 1, f(ctx, id.Int64)
		}
	}
	all := func(f func(context.Context, outbox.Filter, outbox.RequeueOptions) (int64, error), flt outbox.Filter) func(ctx context.Context) (int, error) {
		return func(ctx context.Context) (int, error) {
			n, err := f(ctx, flt, outbox.RequeueOptions{})
			if err == nil && n == 0 {
				err = errNoDeadLetter
			}
			return int(n), err
		}
	}
	in, err := inbox.New(db, inbox.Config{Group: ConsoleGroup, Table: t.Inbox})
	if err != nil {
		return []ConsoleCall{{Name: "inbox", run: func(context.Context) (int, error) { return 0, err }}}
	}
	// The group's oldest rejected messages, read on the table's own pool (not a console
	// call): the first is found by its event id, the second replayed, the third resent.
	rejected := func(i int, f func(context.Context, inbox.RejectedMessage) error) func(ctx context.Context) (int, error) {
		return func(ctx context.Context) (int, error) {
			setup, err := inbox.New(t.db, inbox.Config{Group: ConsoleGroup, Table: t.Inbox})
			if err != nil {
				return 0, err
			}
			page, err := setup.Rejected(ctx, 0, i+1)
			if err != nil {
				return 0, err
			}
			if len(page) <= i {
				return 0, fmt.Errorf("console table: %d rejected messages, want %d", len(page), i+1)
			}
			return 1, f(ctx, page[i])
		}
	}
	fail := outbox.StatusFail
	return []ConsoleCall{
		{Name: "RejectedByEventID", run: rejected(0, func(ctx context.Context, r inbox.RejectedMessage) error {
			_, err := in.RejectedByEventID(ctx, r.Message.EventID)
			return err
		})},
		{Name: "Replay(id)", run: rejected(0, func(ctx context.Context, r inbox.RejectedMessage) error {
			_, err := in.Replay(ctx, r.ID, func(context.Context, *sql.Tx, *inbox.Message) error { return nil })
			return err
		})},
		{Name: "Resend(id)", run: rejected(0, func(ctx context.Context, r inbox.RejectedMessage) error {
			return in.Resend(ctx, r.ID, outbox.SenderFunc(func(context.Context, outbox.Event) error { return nil }))
		})},
		{Name: "Requeue(id)", run: one(admin.Requeue)},
		{Name: "Skip(id)", run: one(admin.Skip)},
		{Name: "RequeueFailed(FAIL, type)", run: all(admin.RequeueFailed, outbox.Filter{Status: fail, EventType: "RefundRequested"})},
		{Name: "SkipFailed(FAIL, type)", run: all(admin.SkipFailed, outbox.Filter{Status: fail, EventType: "StockReserved"})},
		{Name: "RequeueFailed(FAIL, Limit 500)", run: all(admin.RequeueFailed, outbox.Filter{Status: fail, Limit: 500})},
	}
}

// errNoDeadLetter is returned when the table has no dead letter left to requeue or skip.
var errNoDeadLetter = errors.New("console table: no dead letter left to change")
