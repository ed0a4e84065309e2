package bench

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/relay"
)

// ConsoleGroup is the consumer group of the console table's inbox: the group whose rejected
// messages the overview lists (two other groups' share the rejected table).
const ConsoleGroup = "bench_console"

// ConsoleMix is what a console table holds, by status: a service's outbox after a week of
// traffic. History is the SUCCESS rows sent before the last hour, spread over seven days;
// Recent those sent in the last hour, spread evenly over it (what sent-per-minute counts);
// Fail and Skipped are dead letters spread over the week; Wait is the backlog (mostly due,
// some retries not due yet), Sending the claims in flight. Blocked is how many of the dead
// letters have WAIT events of their biz no after them (BlockedWaiting of them in all).
type ConsoleMix struct {
	Rows                         int
	History, Recent              int
	Wait, Sending, Fail, Skipped int
	Blocked, BlockedWaiting      int
	Rejected, RejectedOfGroup    int
	EventTypes, FailTypes        int
}

// ConsoleTable is an outbox table of many rows with the mix of a service's week, and an
// inbox whose rejected table holds the rejections of three consumer groups, and the
// checkpoint row of a binlog relay leading the table: what the console's pages read. Drop
// removes its tables.
type ConsoleTable struct {
	db    *sql.DB
	Name  string // the outbox table
	Inbox string // the inbox table; its rejected messages are in Inbox + "_rejected"
	Relay string // the binlog relay's checkpoint table (MySQLConfig.RelayTable), one row
	Mix   ConsoleMix
	// Load is how long loading took (the outbox table and the rejected messages).
	Load time.Duration
	// Ordered is set once KeyOrder has made the table ordered (idx_biz_no_status).
	Ordered bool
}

// consoleFailEvery and consoleSkipEvery put a dead letter (FAIL) every 311th and a skipped one
// every 1999th row of the history: 3,000 and 500 in a million rows.
const (
	consoleFailEvery  = 311
	consoleSkipEvery  = 1999
	consoleChunk      = 50_000
	consoleBlockedMax = 600 // dead letters that get WAIT events of their key behind them
)

// consoleEventTypes are the event types of the history; consoleFailTypes those of the dead
// letters, uneven as in a real service (one type failing most).
var (
	consoleEventTypes = []string{"OrderCreated", "OrderCreated", "OrderCreated", "OrderPaid", "OrderPaid",
		"OrderShipped", "InvoiceIssued", "RefundRequested", "StockReserved", "CustomerNotified"}
	consoleFailTypes = []string{"OrderPaid", "OrderPaid", "OrderPaid", "InvoiceIssued", "RefundRequested", "StockReserved"}
)

// sqlList writes ss as an SQL list of string literals (the names above: nothing to escape).
func sqlList(ss []string) string { return "'" + strings.Join(ss, "', '") + "'" }

// LoadConsole creates and fills a console table of rows events (at least 10,000) in the
// database of env, with INSERT ... SELECT from MariaDB's sequence engine (seq_1_to_N), in
// statements of 50,000 rows. Every time is relative to the database clock at the start.
func LoadConsole(ctx context.Context, env Env, rows int) (*ConsoleTable, error) {
	if rows < 10_000 {
		return nil, fmt.Errorf("console table: at least 10000 rows, got %d", rows)
	}
	db, err := env.open()
	if err != nil {
		return nil, err
	}
	stamp := time.Now().UnixNano() % 1e9
	t := &ConsoleTable{db: db, Name: fmt.Sprintf("t_bench_console_%d", stamp), Inbox: fmt.Sprintf("t_bench_console_%d_inbox", stamp),
		Relay: fmt.Sprintf("t_bench_console_%d_relay", stamp)}
	m := ConsoleMix{Rows: rows, Recent: rows * 6 / 100, Wait: rows * 3 / 1000, Sending: rows * 3 / 10_000,
		EventTypes: 7, FailTypes: 4}
	m.History = rows - m.Recent - m.Wait - m.Sending
	m.Rejected = 15_000 * rows / 1_000_000
	t.Mix = m
	ok := false
	defer func() {
		if !ok {
			t.Drop()
		}
	}()
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: t.Name})
	if err == nil {
		err = store.CreateSchema(ctx)
	}
	if err != nil {
		return nil, err
	}
	in, err := inbox.New(db, inbox.Config{Group: ConsoleGroup, Table: t.Inbox})
	if err == nil {
		err = in.CreateSchema(ctx)
	}
	if err != nil {
		return nil, err
	}
	// The binlog relay's checkpoint row, as a relay leading the table writes it: what the
	// overview's relay state reads.
	if err := relay.CreateSchema(ctx, db, relay.Config{Table: t.Name, CheckpointTable: t.Relay}); err != nil {
		return nil, err
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO `"+t.Relay+"` (outbox_table, epoch, mode, leader, gtid, fallback_after_ms, heartbeat_at, updated_at) "+
		"VALUES (?, 3, 'relay', 'orders-1', '0-1-48213377', 15000, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3))", t.Name); err != nil {
		return nil, err
	}
	var now time.Time
	if err := db.QueryRowContext(ctx, "SELECT UTC_TIMESTAMP(3)").Scan(&now); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := t.fill(ctx, now); err != nil {
		return nil, fmt.Errorf("console table: %w", err)
	}
	t.Load = time.Since(start)
	// What the fill made, counted rather than computed (the statuses come from modulo
	// rules).
	err = db.QueryRowContext(ctx, "SELECT COUNT(CASE WHEN status = 'FAIL' THEN 1 END), COUNT(CASE WHEN status = 'SKIPPED' THEN 1 END) FROM `"+t.Name+"` WHERE status IN ('FAIL', 'SKIPPED')").
		Scan(&t.Mix.Fail, &t.Mix.Skipped)
	if err == nil {
		err = db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+t.Inbox+"_rejected` WHERE consumer_group = ?", ConsoleGroup).Scan(&t.Mix.RejectedOfGroup)
	}
	if err == nil {
		err = db.QueryRowContext(ctx, "SELECT COUNT(DISTINCT biz_no), COUNT(*) FROM `"+t.Name+"` WHERE status = 'WAIT' AND biz_no LIKE 'ORD-0%'").
			Scan(&t.Mix.Blocked, &t.Mix.BlockedWaiting)
	}
	if err != nil {
		return nil, fmt.Errorf("console table: count what was loaded: %w", err)
	}
	t.Mix.History -= t.Mix.Fail + t.Mix.Skipped
	if _, err := db.ExecContext(ctx, "ANALYZE TABLE `"+t.Name+"`, `"+t.Inbox+"_rejected`"); err != nil {
		return nil, err
	}
	ok = true
	return t, nil
}

// eventIDExpr is a UUIDv7-shaped event id for row g made at ts: the millisecond of ts, then g
// (unique in the table), so that ids grow with time as InsertEvent's do.
const eventIDExpr = `CONCAT(SUBSTR(LPAD(HEX(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', ts) DIV 1000), 12, '0'), 1, 8), '-',
	SUBSTR(LPAD(HEX(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', ts) DIV 1000), 12, '0'), 9, 4), '-7',
	SUBSTR(LPAD(HEX(g), 15, '0'), 1, 3), '-8', SUBSTR(LPAD(HEX(g), 15, '0'), 4, 3), '-', SUBSTR(LPAD(HEX(g), 15, '0'), 7, 9), LPAD(HEX(g % 4096), 3, '0'))`

// payloadExpr is an order event's JSON body, about 220 bytes.
const payloadExpr = `CONCAT('{"orderNo":"', biz, '","userId":', g % 50000, ',"amount":"', g % 100000 / 100, '","currency":"EUR",',
	'"lines":[{"sku":"SKU-', g % 997, '","qty":', 1 + g % 5, '}],"channel":"web","note":"', REPEAT('x', 80), '"}')`

const consoleColumns = "(event_id, biz_no, event_type, payload, status, retry_count, next_retry_time, claim_owner, claimed_at, last_error, create_time, update_time, failures)"

// failureLine is the failure history of a dead letter as the publisher writes it.
const failureLine = `CONCAT('{"at": "', DATE_FORMAT(ts, '%Y-%m-%d %H:%i:%s.000'), '", "instance": "orders-', g % 3,
	'", "class": "permanent", "message": "send: broker answered CODE: 17 DESC: topic not exist"}')`

func (t *ConsoleTable) fill(ctx context.Context, now time.Time) error {
	m := t.Mix
	at := func(d time.Time) string { return "'" + d.UTC().Format("2006-01-02 15:04:05.000000") + "'" }
	var stmts []string
	// The history: seven days up to an hour ago, one row every step, a dead letter every
	// consoleFailEvery rows and a skipped one every consoleSkipEvery.
	from := now.Add(-7 * 24 * time.Hour)
	step := (7*24*time.Hour - time.Hour).Microseconds() / int64(m.History)
	for off := 0; off < m.History; off += consoleChunk {
		n := min(consoleChunk, m.History-off)
		stmts = append(stmts, fmt.Sprintf(`INSERT INTO `+"`%s`"+` %s
SELECT %s, biz, CASE WHEN st = 'SUCCESS' THEN ELT(1 + g %% 10, %s) ELSE ELT(1 + (g DIV %d) %% 6, %s) END, %s, st,
	IF(st = 'SUCCESS', 0, 5), ts, CONCAT('orders-', g %% 3), ts + INTERVAL 40000 MICROSECOND,
	IF(st = 'SUCCESS', NULL, 'send: broker answered CODE: 17 DESC: topic not exist'), ts,
	IF(st = 'SUCCESS', ts + INTERVAL 45000 MICROSECOND, ts + INTERVAL 20 MINUTE), IF(st = 'SUCCESS', NULL, %s)
FROM (SELECT g, ts, CONCAT('ORD-', LPAD(g %% 300000, 7, '0')) AS biz,
             CASE WHEN g %% %d = 0 THEN 'FAIL' WHEN g %% %d = 1000 THEN 'SKIPPED' ELSE 'SUCCESS' END AS st
      FROM (SELECT seq + %d AS g, %s + INTERVAL (seq + %d) * %d MICROSECOND AS ts FROM seq_1_to_%d) s0) s`,
			t.Name, consoleColumns, eventIDExpr, sqlList(consoleEventTypes), consoleFailEvery, sqlList(consoleFailTypes),
			payloadExpr, failureLine, consoleFailEvery, consoleSkipEvery, off, at(from), off, step, n))
	}
	// The last hour's sends, evenly spread over it.
	recentFrom := now.Add(-time.Hour)
	rstep := time.Hour.Microseconds() / int64(m.Recent)
	for off := 0; off < m.Recent; off += consoleChunk {
		n := min(consoleChunk, m.Recent-off)
		stmts = append(stmts, fmt.Sprintf(`INSERT INTO `+"`%s`"+` %s
SELECT %s, biz, ELT(1 + g %% 10, %s), %s, 'SUCCESS', 0, ts, CONCAT('orders-', g %% 3), ts + INTERVAL 40000 MICROSECOND,
	NULL, ts, ts + INTERVAL 45000 MICROSECOND, NULL
FROM (SELECT g, ts, CONCAT('ORD-N', LPAD(g, 8, '0')) AS biz
      FROM (SELECT seq + %d AS g, %s + INTERVAL (seq + %d) * %d MICROSECOND AS ts FROM seq_1_to_%d) s0) s`,
			t.Name, consoleColumns, eventIDExpr, sqlList(consoleEventTypes), payloadExpr,
			m.History+off, at(recentFrom), off, rstep, n))
	}
	// The backlog, committed over the last two minutes: three of five rows behind a dead
	// letter of their key (the first consoleBlockedMax dead letters, about three rows each),
	// one of five a retry not due yet.
	wstep := (2 * time.Minute).Microseconds() / int64(m.Wait)
	stmts = append(stmts, fmt.Sprintf(`INSERT INTO `+"`%s`"+` %s
SELECT %s, biz, ELT(1 + g %% 10, %s), %s, 'WAIT', IF(w %% 5 = 4, 2, 0), IF(w %% 5 = 4, ts + INTERVAL 10 MINUTE, ts), '', '1970-01-01',
	IF(w %% 5 = 4, 'send: context deadline exceeded', NULL), ts, ts, NULL
FROM (SELECT g, w, ts, IF(w %% 5 < 3, CONCAT('ORD-', LPAD((1 + (w DIV 5) %% %d) * %d %% 300000, 7, '0')), CONCAT('ORD-W', LPAD(w, 7, '0'))) AS biz
      FROM (SELECT seq AS w, seq + %d AS g, %s + INTERVAL seq * %d MICROSECOND AS ts FROM seq_1_to_%d) s0) s`,
		t.Name, consoleColumns, eventIDExpr, sqlList(consoleEventTypes), payloadExpr,
		consoleBlockedMax, consoleFailEvery, m.History+m.Recent, at(now.Add(-2*time.Minute)), wstep, m.Wait))
	// The claims in flight, of three instances, the oldest 30 s old.
	stmts = append(stmts, fmt.Sprintf(`INSERT INTO `+"`%s`"+` %s
SELECT %s, biz, ELT(1 + g %% 10, %s), %s, 'SENDING', 0, ts, CONCAT('orders-', g %% 3), ts, NULL, ts, ts, NULL
FROM (SELECT g, ts, CONCAT('ORD-S', LPAD(g, 8, '0')) AS biz
      FROM (SELECT seq + %d AS g, %s - INTERVAL (seq %% 30) SECOND AS ts FROM seq_1_to_%d) s0) s`,
		t.Name, consoleColumns, eventIDExpr, sqlList(consoleEventTypes), payloadExpr,
		m.History+m.Recent+m.Wait, at(now), m.Sending))
	// The rejected messages of three consumer groups, interleaved, over the week.
	rj := t.Mix.Rejected
	jstep := (7 * 24 * time.Hour).Microseconds() / int64(rj)
	stmts = append(stmts, fmt.Sprintf(`INSERT INTO `+"`%s_rejected`"+`
	(consumer_group, msg_key, event_id, msg_id, topic, reason_class, reason, properties, body, deliveries, first_rejected, last_rejected)
SELECT ELT(1 + g %% 3, '%s', 'billing', 'shipping'), %s, %s, CONCAT('7F0000010001', LPAD(HEX(g), 20, '0')), 'ORDER_EVENT_TOPIC',
	IF(g %% 7 = 0, 'max_deliveries', 'permanent'), 'handle: order not found in the ledger',
	CONCAT('{"eventId":"', %s, '","eventType":"OrderPaid","bizNo":"', biz, '","KEYS":"', biz, '"}'), %s,
	IF(g %% 7 = 0, 5, 1), ts, ts
FROM (SELECT g, ts, CONCAT('ORD-R', LPAD(g, 7, '0')) AS biz
      FROM (SELECT seq AS g, %s + INTERVAL seq * %d MICROSECOND AS ts FROM seq_1_to_%d) s0) s`,
		t.Inbox, ConsoleGroup, eventIDExpr, eventIDExpr, eventIDExpr, payloadExpr, at(from), jstep, rj))
	for _, q := range stmts {
		if _, err := t.db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("%w\n%s", err, q)
		}
	}
	return nil
}

// KeyOrder makes the table ordered, as docs/ordering.md's ALTER TABLE does (idx_biz_no_status
// in place of idx_biz_no), and returns how long the ALTER took.
func (t *ConsoleTable) KeyOrder(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	if _, err := t.db.ExecContext(ctx, fmt.Sprintf(orderedIndex, t.Name)); err != nil {
		return 0, err
	}
	if _, err := t.db.ExecContext(ctx, "ANALYZE TABLE `"+t.Name+"`"); err != nil {
		return 0, err
	}
	t.Ordered = true
	return time.Since(start), nil
}

// Drop removes the console table's tables and closes its pool.
func (t *ConsoleTable) Drop() {
	for _, name := range []string{t.Name, t.Inbox, t.Inbox + "_rejected", t.Relay} {
		_, _ = t.db.Exec("DROP TABLE IF EXISTS `" + name + "`")
	}
	_ = t.db.Close()
}

// storeConfig is the configuration of the console's store of t.
func (t *ConsoleTable) storeConfig() outbox.MySQLConfig {
	cfg := outbox.MySQLConfig{Table: t.Name, RelayTable: t.Relay}
	if t.Ordered {
		cfg.Ordering = outbox.KeyOrder
	}
	return cfg
}

// ConsoleLease is the publishers' lease the overview judges SENDING rows against (the
// default Tuning.Lease).
const ConsoleLease = 30 * time.Second

// ConsoleCall is one call the console makes, or one statement a hand-written console would
// run instead (Baseline).
type ConsoleCall struct {
	Name     string
	Baseline bool
	// Overview marks the calls the overview page is made of: their sum per round is the
	// overview's time.
	Overview bool
	run      func(ctx context.Context) (int, error) // rows (or entries) it returned
}

// ConsoleTiming is a call's times over the rounds, sorted, and the rows it returned.
type ConsoleTiming struct {
	ConsoleCall
	Sorted []time.Duration
	Rows   int
}

// Quantile returns the q-quantile (0 < q <= 1), by nearest rank.
func (c ConsoleTiming) Quantile(q float64) time.Duration {
	return LatencyResult{Sorted: c.Sorted}.Quantile(q)
}

// consoleCalls are what the console's pages run on t, through the library's calls on db,
// then the baseline's statements.
func (t *ConsoleTable) consoleCalls(db *sql.DB) ([]ConsoleCall, error) {
	cfg := t.storeConfig()
	store, err := outbox.NewMySQLStore(db, cfg)
	if err != nil {
		return nil, err
	}
	admin := outbox.NewAdmin(store)
	in, err := inbox.New(db, inbox.Config{Group: ConsoleGroup, Table: t.Inbox})
	if err != nil {
		return nil, err
	}
	// A dead letter in the middle of the history: the biz no, id and time the filtered
	// pages use.
	// It is read on the table's own pool: not a console call.
	var (
		mid         outbox.ListedEvent
		secondAfter int64 // the last dead letter of the first page of blocked keys
	)
	{
		setup, err := outbox.NewMySQLStore(t.db, cfg)
		if err != nil {
			return nil, err
		}
		var id int64
		if err := t.db.QueryRow("SELECT MAX(id) FROM `"+t.Name+"` FORCE INDEX (idx_status_next_retry) WHERE status = 'FAIL' AND id < ?", t.Mix.Rows/2).Scan(&id); err != nil {
			return nil, err
		}
		l, err := outbox.NewAdmin(setup).List(context.Background(), outbox.Filter{IDs: []int64{id}})
		if err != nil {
			return nil, fmt.Errorf("console table: the dead letter %d: %w", id, err)
		}
		if len(l) != 1 {
			return nil, fmt.Errorf("console table: the dead letter %d: %d rows listed", id, len(l))
		}
		mid = l[0]
		if first, err := outbox.NewAdmin(setup).Blocked(context.Background(), 0, 51); err != nil {
			return nil, err
		} else if len(first) > 0 {
			secondAfter = first[len(first)-1].ID
		}
	}
	fail := outbox.Filter{Status: outbox.StatusFail, Limit: 51}
	list := func(f outbox.Filter) func(ctx context.Context) (int, error) {
		return func(ctx context.Context) (int, error) {
			l, err := admin.List(ctx, f)
			return len(l), err
		}
	}
	withType, withBiz, withTime, page := fail, fail, fail, fail
	withType.EventType = mid.EventType
	withBiz.BizNo = mid.BizNo
	withTime.CreatedSince, withTime.CreatedUntil = mid.CreateTime.Add(-24*time.Hour), mid.CreateTime
	page.MaxID = mid.ID
	count := func(f outbox.Filter) func(ctx context.Context) (int, error) {
		return func(ctx context.Context) (int, error) {
			f.Limit = 0
			n, err := admin.RequeueFailed(ctx, f, outbox.RequeueOptions{DryRun: true})
			return int(n), err
		}
	}
	naive := func(q string) func(ctx context.Context) (int, error) {
		return func(ctx context.Context) (int, error) {
			rows, err := db.QueryContext(ctx, strings.ReplaceAll(q, "t_event_record", "`"+t.Name+"`"))
			if err != nil {
				return 0, err
			}
			defer rows.Close()
			n := 0
			for rows.Next() {
				n++
			}
			return n, rows.Err()
		}
	}
	return []ConsoleCall{
		{Name: "Stats(Lease, SentPerMinute, CountSkipped)", Overview: true, run: func(ctx context.Context) (int, error) {
			st, err := store.Stats(ctx, outbox.StatsOptions{Lease: ConsoleLease, SentPerMinute: true, CountSkipped: true})
			var sent int64
			for _, n := range st.SentPerMinute {
				sent += n
			}
			return int(sent), err
		}},
		{Name: "List(FAIL, limit 51)", Overview: true, run: list(fail)},
		{Name: "Blocked(0, 51)", Overview: true, run: func(ctx context.Context) (int, error) {
			b, err := admin.Blocked(ctx, 0, 51)
			return len(b), err
		}},
		{Name: "Rejected(0, 51)", Overview: true, run: func(ctx context.Context) (int, error) {
			r, err := in.Rejected(ctx, 0, 51)
			return len(r), err
		}},
		{Name: "Stats(Lease), no SentPerMinute", run: func(ctx context.Context) (int, error) {
			st, err := store.Stats(ctx, outbox.StatsOptions{Lease: ConsoleLease})
			return int(st.Wait + st.Sending + st.Fail), err
		}},
		{Name: "List(FAIL, type, limit 51)", run: list(withType)},
		{Name: "List(FAIL, biz no, limit 51)", run: list(withBiz)},
		{Name: "List(FAIL, created 1 day, limit 51)", run: list(withTime)},
		{Name: "List(FAIL, MaxID page, limit 51)", run: list(page)},
		{Name: "Get(id)", run: func(ctx context.Context) (int, error) {
			_, err := admin.Get(ctx, mid.ID)
			return 1, err
		}},
		{Name: "Blocked(after, 51), 2nd page", run: func(ctx context.Context) (int, error) {
			b, err := admin.Blocked(ctx, secondAfter, 51)
			return len(b), err
		}},
		{Name: "RequeueFailed dry run (FAIL)", run: count(fail)},
		{Name: "RequeueFailed dry run (FAIL, type)", run: count(withType)},
		{Name: "status counts: GROUP BY status", Baseline: true, Overview: true,
			run: naive("SELECT status, COUNT(*) FROM t_event_record GROUP BY status")},
		{Name: "sent per minute: GROUP BY minute of update_time", Baseline: true, Overview: true,
			run: naive("SELECT DATE_FORMAT(update_time, '%Y-%m-%d %H:%i') AS minute, COUNT(*) FROM t_event_record " +
				"WHERE status = 'SUCCESS' AND update_time >= UTC_TIMESTAMP(3) - INTERVAL 1 HOUR GROUP BY minute ORDER BY minute")},
	}, nil
}

// MeasureConsole runs every console call (and the baseline's statements) once per round,
// rounds times, each round starting one call further, on a pool of its own, and returns
// each call's times; then the overview's (the sum of the overview's calls in each round) and
// the baseline's.
func (t *ConsoleTable) MeasureConsole(ctx context.Context, env Env, rounds int) ([]ConsoleTiming, error) {
	db, err := env.open()
	if err != nil {
		return nil, err
	}
	defer db.Close()
	calls, err := t.consoleCalls(db)
	if err != nil {
		return nil, err
	}
	out := make([]ConsoleTiming, len(calls))
	for i, c := range calls {
		out[i].ConsoleCall = c
	}
	overview, baseline := ConsoleTiming{ConsoleCall: ConsoleCall{Name: "overview (the four calls above)", Overview: true}},
		ConsoleTiming{ConsoleCall: ConsoleCall{Name: "baseline overview (the two statements above)", Baseline: true, Overview: true}}
	// One round first, untimed: the pool's connections and the statements' pages.
	for i := range out {
		if _, err := out[i].run(ctx); err != nil {
			return nil, fmt.Errorf("%s: %w", out[i].Name, err)
		}
	}
	for r := range rounds {
		var ov, bl time.Duration
		for j := range out {
			i := (j + r) % len(out)
			start := time.Now()
			n, err := out[i].run(ctx)
			d := time.Since(start)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", out[i].Name, err)
			}
			out[i].Sorted, out[i].Rows = append(out[i].Sorted, d), n
			switch {
			case out[i].Overview && out[i].Baseline:
				bl += d
			case out[i].Overview:
				ov += d
			}
		}
		overview.Sorted, baseline.Sorted = append(overview.Sorted, ov), append(baseline.Sorted, bl)
	}
	for i := range out {
		slices.Sort(out[i].Sorted)
	}
	slices.Sort(overview.Sorted)
	slices.Sort(baseline.Sorted)
	// The overview's rows first, then its total; then the other pages; the baseline last.
	var res []ConsoleTiming
	for _, keep := range []func(ConsoleTiming) bool{
		func(c ConsoleTiming) bool { return c.Overview && !c.Baseline },
		nil,
		func(c ConsoleTiming) bool { return !c.Overview },
		func(c ConsoleTiming) bool { return c.Baseline },
	} {
		if keep == nil {
			res = append(res, overview)
			continue
		}
		for _, c := range out {
			if keep(c) {
				res = append(res, c)
			}
		}
	}
	return append(res, baseline), nil
}

// Overview returns the overview's calls on t (Stats with sent per minute and the SKIPPED
// count, the first pages of dead letters, of blocked keys and of the group's rejected
// messages) as one function, on a pool of its own that close closes: what
// BenchmarkConsoleOverview runs per op.
func (t *ConsoleTable) Overview(env Env) (run func(context.Context) error, close func(), err error) {
	db, err := env.open()
	if err != nil {
		return nil, nil, err
	}
	calls, err := t.consoleCalls(db)
	if err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	run = func(ctx context.Context) error {
		for _, c := range calls {
			if c.Overview && !c.Baseline {
				if _, err := c.run(ctx); err != nil {
					return fmt.Errorf("%s: %w", c.Name, err)
				}
			}
		}
		return nil
	}
	return run, func() { _ = db.Close() }, nil
}
