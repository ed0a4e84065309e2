package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/mysqldialect"
)

// An item is one committed transaction's share of the outbox table, in commit order, or
// only a position (transactions that did not touch it).
type item struct {
	events  []outbox.Event // rows inserted WAIT and due
	reread  []int64        // rows that became WAIT by an UPDATE (a retry, a reclaim, a requeue), or inserted not due yet
	held    []string       // biz nos of rows inserted not due yet (EventInput.Delay, NotBefore), in key order holding back their later events
	unblock []string       // biz nos whose dead letter left FAIL
	hazard  string         // a statement the row reader cannot follow
	claimed []string       // owners that claimed rows while the relay leads
	pos     string         // the position after the transaction
}

func (it *item) bare() bool {
	return len(it.events) == 0 && len(it.reread) == 0 && len(it.unblock) == 0 && it.hazard == "" && len(it.claimed) == 0
}

// queue hands items from the reader to the sender. A bare item following a bare item
// replaces it, so an idle outbox beside busy tables queues one position, not thousands.
type queue struct {
	mu      sync.Mutex
	items   []item
	events  int // events queued
	limit   int // the reader waits while more are queued
	wake    chan struct{}
	drained chan struct{}
}

func (q *queue) init(limit int) {
	q.limit, q.wake, q.drained = limit, make(chan struct{}, 1), make(chan struct{}, 1)
}

func (q *queue) push(ctx context.Context, it item) error {
	for {
		q.mu.Lock()
		if q.events < q.limit || len(it.events) == 0 {
			if n := len(q.items); n > 0 && it.bare() && q.items[n-1].bare() {
				q.items[n-1].pos = it.pos
			} else {
				q.items = append(q.items, it)
				q.events += len(it.events)
			}
			q.mu.Unlock()
			select {
			case q.wake <- struct{}{}:
			default:
			}
			return nil
		}
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-q.drained:
		}
	}
}

// take removes and returns the items queued, at most max events' worth (but at least one
// item).
func (q *queue) take(max int) []item {
	q.mu.Lock()
	defer q.mu.Unlock()
	n, events := 0, 0
	for n < len(q.items) && (n == 0 || events+len(q.items[n].events) <= max) {
		events += len(q.items[n].events)
		n++
	}
	out := append([]item(nil), q.items[:n]...)
	q.items = q.items[n:]
	q.events -= events
	select {
	case q.drained <- struct{}{}:
	default:
	}
	return out
}

func (q *queue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}

// read streams the binlog from start and queues the outbox table's transactions. A broken
// connection is reopened from the processed position once the sender has caught up (so
// nothing is queued twice); a lost position ends the term.
func (t *term) read(start gomysql.GTIDSet) error {
	from := start
	for {
		err := t.stream(from)
		if t.ctx.Err() != nil {
			return nil
		}
		var me *gomysql.MyError
		if errors.As(err, &me) && me.Code == mysqldialect.ErrSourceFatalBinlogRead {
			return fmt.Errorf("%w: error 1236: %s", errPositionLost, me.Message)
		}
		if errors.Is(err, errPositionLost) || errors.Is(err, outbox.ErrInvalidConfig) {
			return err
		}
		t.log().WarnContext(t.ctx, "relay: binlog stream broken; reopening it", slog.Any("error", err))
		// Wait until the sender has delivered everything queued, then resume after it.
		for t.q.len() > 0 || *t.processed.Load() != t.pushed {
			select {
			case <-t.ctx.Done():
				return nil
			case <-time.After(20 * time.Millisecond):
			}
		}
		select {
		case <-t.ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
		pos := *t.processed.Load()
		if from, err = gomysql.ParseGTIDSet(t.info.flavor, pos); err != nil {
			return err
		}
	}
}

// stream reads one binlog connection until it breaks.
func (t *term) stream(from gomysql.GTIDSet) error {
	r := t.r
	host, portStr, err := net.SplitHostPort(r.conn.Addr)
	if err != nil {
		return fmt.Errorf("%w: relay: the DSN's address %q: %w", outbox.ErrInvalidConfig, r.conn.Addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return fmt.Errorf("%w: relay: the DSN's port %q", outbox.ErrInvalidConfig, portStr)
	}
	heartbeat := min(r.cfg.CheckpointInterval, time.Second)
	syncer := replication.NewBinlogSyncer(replication.BinlogSyncerConfig{
		ServerID: r.cfg.ServerID, Flavor: t.info.flavor, Host: host, Port: uint16(port),
		User: r.conn.User, Password: r.conn.Passwd, TLSConfig: r.conn.TLS,
		ParseTime: true, TimestampStringLocation: time.UTC,
		HeartbeatPeriod: heartbeat, ReadTimeout: 10 * heartbeat,
		DisableRetrySync: true, Logger: quietLogger(r.cfg.Logger),
		// Only the outbox table's rows are decoded: the server streams every table's.
		RowsEventDecodeFunc: func(e *replication.RowsEvent, data []byte) error {
			pos, err := e.DecodeHeader(data)
			if err != nil {
				return err
			}
			if e.Table == nil || string(e.Table.Schema) != r.conn.DBName || string(e.Table.Table) != r.cfg.Table {
				return nil
			}
			return e.DecodeData(pos, data)
		},
	})
	defer syncer.Close()
	st, err := syncer.StartSyncGTID(from)
	if err != nil {
		return err
	}
	d := decoder{t: t, tables: map[uint64]*columns{},
		table:       regexp.MustCompile(`(?i)(^|[^A-Za-z0-9_$])` + regexp.QuoteMeta(r.cfg.Table) + `($|[^A-Za-z0-9_$])`),
		maintenance: partitionMaintenance(r.cfg.Table)}
	for {
		ev, err := st.GetEvent(t.ctx)
		if err != nil {
			return err
		}
		it, done, err := d.decode(ev)
		if err != nil {
			return err
		}
		if done {
			if err := t.q.push(t.ctx, it); err != nil {
				return err
			}
			t.pushed = it.pos
		}
	}
}

// decoder turns binlog events into items.
type decoder struct {
	t     *term
	table *regexp.Regexp // matches a statement that may name the outbox table
	// maintenance matches the partition statements of the outbox package's retention,
	// which change no row the relay has to send (see partitionMaintenance).
	maintenance *regexp.Regexp
	tables      map[uint64]*columns
	cur         item
	open        bool
}

// columns maps the outbox table's columns to their positions in a row, from the table map
// (binlog_row_metadata=FULL gives the names).
type columns struct {
	idx   map[string]int
	enums []string // the status column's values, when the metadata has them
}

func (d *decoder) decode(ev *replication.BinlogEvent) (it item, done bool, err error) {
	cfg := d.t.r.cfg
	switch e := ev.Event.(type) {
	case *replication.MariadbGTIDEvent, *replication.GTIDEvent:
		d.cur, d.open = item{}, true
	case *replication.TableMapEvent:
		if string(e.Schema) == d.t.r.conn.DBName && string(e.Table) == cfg.Table {
			cols, err := mapColumns(e)
			if err != nil {
				return it, false, err
			}
			d.tables[e.TableID] = cols
		}
	case *replication.RowsEvent:
		cols := d.tables[e.TableID]
		if cols == nil || string(e.Table.Schema) != d.t.r.conn.DBName || string(e.Table.Table) != cfg.Table {
			return it, false, nil
		}
		if err := d.rows(ev.Header.EventType, e, cols); err != nil {
			return it, false, err
		}
	case *replication.XIDEvent:
		return d.commit(e.GSet)
	case *replication.QueryEvent:
		q := strings.TrimSpace(string(e.Query))
		switch strings.ToUpper(q) {
		case "BEGIN":
			d.open = true
			return it, false, nil
		case "COMMIT":
			return d.commit(e.GSet)
		}
		if d.names(q) && !(string(e.Schema) == d.t.r.conn.DBName && d.maintenance.MatchString(q)) {
			d.cur.hazard = q
		}
		if !d.open || e.GSet != nil && isDDL(q) {
			// A statement outside a transaction (DDL) commits by itself.
			return d.commit(e.GSet)
		}
	}
	return it, false, nil
}

func (d *decoder) commit(gset gomysql.GTIDSet) (item, bool, error) {
	it := d.cur
	d.cur, d.open = item{}, false
	if gset == nil {
		return it, false, nil
	}
	it.pos = gset.String()
	return it, true, nil
}

var ddl = regexp.MustCompile(`(?i)^\s*(ALTER|CREATE|DROP|RENAME|TRUNCATE|OPTIMIZE|REPAIR|ANALYZE|GRANT|REVOKE)\b`)

func isDDL(q string) bool { return ddl.MatchString(q) }

// partitionMaintenance matches, whole, the statements by which the outbox package's purge
// maintains a table partitioned by RANGE (id) (MySQLConfig.PartitionIDs): ADD PARTITION and
// REORGANIZE PARTITION make partitions (and move rows between them, unchanged), and DROP
// PARTITION drops partitions that held only SUCCESS and SKIPPED rows, checked with the
// table locked. None adds or changes a row the relay has to send, so the term goes on
// reading instead of handing over. Anything else naming the table (another ALTER, a
// TRUNCATE PARTITION, an EXCHANGE PARTITION, which brings rows in) stays a hazard.
func partitionMaintenance(table string) *regexp.Regexp {
	name := "`?[A-Za-z0-9_]+`?"
	bound := `PARTITION\s+` + name + `\s+VALUES\s+LESS\s+THAN\s*\(\s*[0-9]+\s*\)`
	return regexp.MustCompile(`(?is)^ALTER\s+TABLE\s+` + "`?" + regexp.QuoteMeta(table) + "`?" + `\s+(` +
		`DROP\s+PARTITION\s+` + name + `(\s*,\s*` + name + `)*` +
		`|ADD\s+PARTITION\s*\(\s*` + bound + `(\s*,\s*` + bound + `)*\s*\)` +
		`|REORGANIZE\s+PARTITION\s+` + name + `\s+INTO\s*\(\s*(` + bound + `\s*,\s*)*` +
		`PARTITION\s+` + name + `\s+VALUES\s+LESS\s+THAN\s+MAXVALUE\s*\)` +
		`)\s*;?\s*$`)
}

// names reports whether statement q may name the outbox table (in any database): a conservative test (a false alarm costs a sweep, a miss would lose events).
func (d *decoder) names(q string) bool { return d.table.MatchString(q) }

func mapColumns(e *replication.TableMapEvent) (*columns, error) {
	names := e.ColumnNameString()
	if len(names) == 0 {
		return nil, fmt.Errorf("%w: relay: the binlog's table map has no column names: set binlog_row_metadata=FULL (SET GLOBAL binlog_row_metadata = 'FULL', and in the server's configuration)", outbox.ErrInvalidConfig)
	}
	c := &columns{idx: map[string]int{}}
	for i, n := range names {
		c.idx[strings.ToLower(n)] = i
	}
	for _, need := range []string{"id", "status"} {
		if _, ok := c.idx[need]; !ok {
			return nil, fmt.Errorf("%w: relay: the outbox table in the binlog has no column %s", outbox.ErrInvalidConfig, need)
		}
	}
	if enums := e.EnumStrValueString(); len(enums) > 0 {
		// The enum columns' values in column order; status is the outbox table's only ENUM.
		c.enums = enums[0]
	}
	return c, nil
}

func (d *decoder) rows(et replication.EventType, e *replication.RowsEvent, cols *columns) error {
	switch et {
	case replication.WRITE_ROWS_EVENTv0, replication.WRITE_ROWS_EVENTv1, replication.WRITE_ROWS_EVENTv2, replication.MARIADB_WRITE_ROWS_COMPRESSED_EVENT_V1:
		for _, row := range e.Rows {
			if cols.status(row) != string(outbox.StatusWait) {
				continue // a row written already done (a migration, say): nothing to send
			}
			ev, ok := cols.event(row)
			if !ok {
				return fmt.Errorf("%w: relay: an inserted row lacks columns the relay sends (binlog_row_image MINIMAL?): set binlog_row_image=FULL or NOBLOB", outbox.ErrInvalidConfig)
			}
			if ev.NextRetryTime.After(ev.CreateTime) {
				// Not due yet (written with a delay): the table says when. So is a later row
				// of its biz no in this transaction, whatever its own time, so that in key order
				// it follows the delayed one (see term.deliverItems for later transactions).
				d.cur.reread = append(d.cur.reread, ev.ID)
				d.cur.held = append(d.cur.held, ev.BizNo)
				continue
			}
			if slices.Contains(d.cur.held, ev.BizNo) {
				d.cur.reread = append(d.cur.reread, ev.ID)
				continue
			}
			d.cur.events = append(d.cur.events, ev)
		}
	case replication.UPDATE_ROWS_EVENTv0, replication.UPDATE_ROWS_EVENTv1, replication.UPDATE_ROWS_EVENTv2, replication.MARIADB_UPDATE_ROWS_COMPRESSED_EVENT_V1:
		for i := 0; i+1 < len(e.Rows); i += 2 {
			before, after := cols.status(e.Rows[i]), cols.status(e.Rows[i+1])
			if before == after || after == "" {
				continue
			}
			id, _ := toInt64(e.Rows[i][cols.idx["id"]])
			switch {
			case after == string(outbox.StatusWait):
				d.cur.reread = append(d.cur.reread, id)
			case after == string(outbox.StatusSending) && before == string(outbox.StatusWait):
				owner := ""
				if j, ok := cols.idx["claim_owner"]; ok && j < len(e.Rows[i+1]) {
					owner = toString(e.Rows[i+1][j])
				}
				d.cur.claimed = append(d.cur.claimed, owner)
			}
			if before == string(outbox.StatusFail) {
				if j, ok := cols.idx["biz_no"]; ok && j < len(e.Rows[i]) {
					d.cur.unblock = append(d.cur.unblock, toString(e.Rows[i][j]))
				}
			}
		}
	}
	return nil
}

// status returns a row's status ("" if the image lacks it).
func (c *columns) status(row []any) string {
	i := c.idx["status"]
	if i >= len(row) || row[i] == nil {
		return ""
	}
	switch v := row[i].(type) {
	case string:
		return v
	case int64, int32, int, uint64:
		n, _ := toInt64(v)
		values := c.enums
		if len(values) == 0 {
			values = []string{"WAIT", "SENDING", "SUCCESS", "FAIL", "SKIPPED"} // schema.sql's order
		}
		if n >= 1 && int(n) <= len(values) {
			return strings.ToUpper(values[n-1])
		}
	}
	return ""
}

// event builds the event of an inserted row; false if the image lacks a column.
func (c *columns) event(row []any) (outbox.Event, bool) {
	get := func(name string) (any, bool) {
		i, ok := c.idx[name]
		if !ok || i >= len(row) {
			return nil, false
		}
		return row[i], true
	}
	var ev outbox.Event
	ok := true
	need := func(name string) any {
		v, present := get(name)
		if !present {
			ok = false
		}
		return v
	}
	ev.ID, _ = toInt64(need("id"))
	ev.EventID = toString(need("event_id"))
	ev.BizNo = toString(need("biz_no"))
	ev.EventType = toString(need("event_type"))
	ev.Payload = toBytes(need("payload"))
	rc, _ := toInt64(need("retry_count"))
	ev.RetryCount = int(rc)
	ev.NextRetryTime, _ = need("next_retry_time").(time.Time)
	ev.CreateTime, _ = need("create_time").(time.Time)
	if v, present := get("trace_parent"); present {
		ev.TraceParent = toString(v)
	}
	if v, present := get("trace_state"); present {
		ev.TraceState = toString(v)
	}
	if v, present := get("topic"); present {
		ev.Topic = toString(v)
	}
	ev.Status = outbox.StatusWait
	return ev, ok && ev.ID > 0 && ev.Payload != nil
}

func toInt64(v any) (int64, bool) {
	switch n := v.(type) {
	case int64:
		return n, true
	case int32:
		return int64(n), true
	case int:
		return int64(n), true
	case int16:
		return int64(n), true
	case int8:
		return int64(n), true
	case uint64:
		return int64(n), true
	case uint32:
		return int64(n), true
	}
	return 0, false
}

func toString(v any) string {
	switch s := v.(type) {
	case string:
		return s
	case []byte:
		return string(s)
	}
	return ""
}

func toBytes(v any) []byte {
	switch b := v.(type) {
	case []byte:
		return b
	case string:
		return []byte(b)
	}
	return nil
}

// quietLogger passes on the binlog client's warnings and errors only.
func quietLogger(l *slog.Logger) *slog.Logger {
	return slog.New(binlogLogs{minLevel{l.Handler(), slog.LevelWarn}})
}

type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(as []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(as), h.min}
}

func (h minLevel) WithGroup(n string) slog.Handler { return minLevel{h.Handler.WithGroup(n), h.min} }
