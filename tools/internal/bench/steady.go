package bench

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-outbox/outbox"
)

// ordersDDL is the business table of the write-path and service runs: an order row, with the
// unique order number a real order table has.
const ordersDDL = "CREATE TABLE `%s` (id BIGINT NOT NULL AUTO_INCREMENT, order_no VARCHAR(64) NOT NULL, " +
	"user_id BIGINT NOT NULL, amount DECIMAL(12,2) NOT NULL, created_at DATETIME(3) NOT NULL, " +
	"PRIMARY KEY (id), UNIQUE KEY uk_order_no (order_no)) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4"

// eventPayload is the body of every event the writers commit: an order-created message of
// the example's size.
var eventPayload = []byte(`{"orderNo":"ORD-0000000000","userId":1042,"amount":"129.90","currency":"EUR","items":3,"createdAt":"2026-01-01T00:00:00.000Z"}`)

// FlushSetting returns the server's innodb_flush_log_at_trx_commit: 1 (the production
// default) syncs the redo log at every commit, which is what a commit costs a service.
func FlushSetting(ctx context.Context, env Env) (int, error) {
	db, err := env.open()
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var v int
	err = db.QueryRowContext(ctx, "SELECT @@GLOBAL.innodb_flush_log_at_trx_commit").Scan(&v)
	return v, err
}

// BinlogSettings are the server's binary log settings: whether it logs, and how.
type BinlogSettings struct {
	On         bool   // log_bin
	Format     string // binlog_format: ROW, MIXED or STATEMENT
	RowImage   string // binlog_row_image: FULL, NOBLOB or MINIMAL (MariaDB 10.11 also FULL_NODUP)
	SyncBinlog int    // sync_binlog: 1 syncs the binary log at every commit (group)
}

// ReadBinlogSettings returns the server's binary log settings.
func ReadBinlogSettings(ctx context.Context, env Env) (BinlogSettings, error) {
	var b BinlogSettings
	db, err := env.open()
	if err != nil {
		return b, err
	}
	defer db.Close()
	err = db.QueryRowContext(ctx, "SELECT @@GLOBAL.log_bin, @@GLOBAL.binlog_format, @@GLOBAL.binlog_row_image, @@GLOBAL.sync_binlog").
		Scan(&b.On, &b.Format, &b.RowImage, &b.SyncBinlog)
	return b, err
}

// String names the settings as the server's variables: "log_bin OFF", or "log_bin ON,
// binlog_format=ROW, binlog_row_image=FULL, sync_binlog=1".
func (b BinlogSettings) String() string {
	if !b.On {
		return "log_bin OFF"
	}
	return fmt.Sprintf("log_bin ON, binlog_format=%s, binlog_row_image=%s, sync_binlog=%d", b.Format, b.RowImage, b.SyncBinlog)
}

// workload is what the writers commit: per transaction an order row (if orders is a table
// name), an event (if event), or both.
type workload struct {
	orders  string
	event   bool
	rate    int // transactions per second over all writers; 0: as fast as they can
	writers int
	dur     time.Duration
}

// writeResult is what the writers did.
type writeResult struct {
	committed int
	elapsed   time.Duration
}

// commitTimes records, for each event (by event id), the moment just before its
// transaction's commit.
type commitTimes struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (c *commitTimes) add(id string, at time.Time) {
	c.mu.Lock()
	c.at[id] = at
	c.mu.Unlock()
}

var runSeq atomic.Int64

// write runs w.writers goroutines committing transactions for w.dur, writer i through
// stores[i%len(stores)] (as an instance's order API commits through its own store, and so
// wakes its own publishers only). With w.rate > 0 the transactions are paced over all
// writers; a writer that falls behind lowers the achieved rate, which the result shows.
func write(ctx context.Context, stores []*outbox.MySQLStore, w workload, times *commitTimes) (writeResult, error) {
	var res writeResult
	prefix := fmt.Sprintf("B%d-%d-", time.Now().UnixNano()%1e9, runSeq.Add(1))
	insertOrder := ""
	if w.orders != "" {
		insertOrder = "INSERT INTO `" + w.orders + "` (order_no, user_id, amount, created_at) VALUES (?, ?, ?, UTC_TIMESTAMP(3))"
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var tokens chan struct{}
	start := time.Now()
	end := start.Add(w.dur)
	if w.rate > 0 {
		tokens = make(chan struct{}, 2*w.writers)
		go func() {
			defer close(tokens)
			period := time.Second / time.Duration(w.rate)
			next := start
			for {
				now := time.Now()
				if !now.Before(end) {
					return
				}
				for ; !next.After(now); next = next.Add(period) {
					select {
					case tokens <- struct{}{}:
					case <-ctx.Done():
						return
					default: // the writers are behind: this transaction is not committed
					}
				}
				time.Sleep(next.Sub(now))
			}
		}()
	}
	var committed atomic.Int64
	errc := make(chan error, w.writers)
	var wg sync.WaitGroup
	for i := range w.writers {
		store := stores[i%len(stores)]
		wg.Go(func() {
			for n := 0; ; n++ {
				if tokens != nil {
					if _, ok := <-tokens; !ok {
						return
					}
				} else if !time.Now().Before(end) {
					return
				}
				no := fmt.Sprintf("%s%d-%d", prefix, i, n)
				if err := commitOrder(ctx, store, insertOrder, no, w.event, times); err != nil {
					errc <- err
					cancel()
					return
				}
				committed.Add(1)
			}
		})
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	res.committed = int(committed.Load())
	close(errc)
	if err := <-errc; err != nil {
		return res, err
	}
	return res, nil
}

// commitOrder commits one transaction: the order row (if insertOrder is set), its event (if
// event), committed through Tx.Commit so that the store's publishers wake up.
func commitOrder(ctx context.Context, store *outbox.MySQLStore, insertOrder, no string, event bool, times *commitTimes) error {
	tx, err := store.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if insertOrder != "" {
		if _, err := tx.ExecContext(ctx, insertOrder, no, 1042, "129.90"); err != nil {
			_ = tx.Rollback()
			return fmt.Errorf("insert order: %w", err)
		}
	}
	var id string
	if event {
		if id, err = tx.InsertEvent(ctx, outbox.EventInput{BizNo: no, EventType: "ORDER_CREATED", Payload: eventPayload}); err != nil {
			_ = tx.Rollback()
			return fmt.Errorf("insert event: %w", err)
		}
	}
	at := time.Now()
	if err := tx.Commit(); err != nil {
		return err
	}
	if event && times != nil {
		times.add(id, at)
	}
	return nil
}

// recorder is the publishers' sender: it notes when each event (by event id) was first sent
// and how many batches (non-empty claims) there were.
type recorder struct {
	mu      sync.Mutex
	sentAt  map[string]time.Time
	batches atomic.Int64
}

func (r *recorder) Send(_ context.Context, evs []outbox.Event, _ bool) []error {
	now := time.Now()
	r.batches.Add(1)
	r.mu.Lock()
	for _, ev := range evs {
		if _, ok := r.sentAt[ev.EventID]; !ok {
			r.sentAt[ev.EventID] = now
		}
	}
	r.mu.Unlock()
	return make([]error, len(evs))
}

func (r *recorder) Info() outbox.SenderInfo { return outbox.SenderInfo{} }

func (r *recorder) Check(context.Context, []string) error { return nil }

func (r *recorder) sent() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.sentAt)
}

func (r *recorder) senders(int) (outbox.Sender, error) { return r, nil }

// latencies returns the commit-to-send time of every committed event, sorted; an event
// never sent is an error.
func latencies(times *commitTimes, r *recorder) ([]time.Duration, error) {
	times.mu.Lock()
	defer times.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]time.Duration, 0, len(times.at))
	for id, c := range times.at {
		s, ok := r.sentAt[id]
		if !ok {
			return nil, fmt.Errorf("event %s committed and never sent", id)
		}
		out = append(out, s.Sub(c))
	}
	slices.Sort(out)
	return out, nil
}

// waitSent waits until n events were sent and, if marked (the relay records what it sent),
// no row of t is pending (so that the acknowledgements are in), and returns how many
// pending-row polls it ran.
func waitSent(ctx context.Context, t *table, r *recorder, n int, limit time.Duration, marked bool) (int64, error) {
	deadline := time.Now().Add(limit)
	for r.sent() < n {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%d of %d committed events sent within %s", r.sent(), n, limit)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if !marked {
		return 0, nil
	}
	var polls int64
	for {
		left, err := t.pending(ctx)
		polls++
		if err != nil {
			return polls, err
		}
		if left == 0 {
			return polls, nil
		}
		if time.Now().After(deadline) {
			return polls, fmt.Errorf("%d rows still pending after %s", left, limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// storesOn returns a store on table for each pool.
func storesOn(dbs []*sql.DB, table string) ([]*outbox.MySQLStore, error) {
	out := make([]*outbox.MySQLStore, len(dbs))
	for i, db := range dbs {
		s, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: table})
		if err != nil {
			return nil, err
		}
		out[i] = s
	}
	return out, nil
}

// calibrate commits n transactions of w's kind (as fast as the writers go) into a fresh
// outbox table through stores on the pools dbs, with no publisher, and returns what one
// transaction cost the server: the writers' own statements and redo, which a measurement
// with publishers subtracts to leave the publishing cost.
func calibrate(ctx context.Context, env Env, harness *sql.DB, dbs []*sql.DB, w workload, n int) (PerEvent, error) {
	t, err := newTable(ctx, env)
	if err != nil {
		return PerEvent{}, err
	}
	defer t.drop()
	stores, err := storesOn(dbs, t.name)
	if err != nil {
		return PerEvent{}, err
	}
	// Counting transactions, not time: a short run at full speed, n transactions exactly.
	var done atomic.Int64
	c0, err := readCounters(ctx, harness)
	if err != nil {
		return PerEvent{}, err
	}
	var wg sync.WaitGroup
	errc := make(chan error, w.writers)
	prefix := fmt.Sprintf("C%d-%d-", time.Now().UnixNano()%1e9, runSeq.Add(1))
	insertOrder := ""
	if w.orders != "" {
		insertOrder = "INSERT INTO `" + w.orders + "` (order_no, user_id, amount, created_at) VALUES (?, ?, ?, UTC_TIMESTAMP(3))"
	}
	for i := range w.writers {
		store := stores[i%len(stores)]
		wg.Go(func() {
			for {
				k := done.Add(1)
				if k > int64(n) {
					return
				}
				if err := commitOrder(ctx, store, insertOrder, fmt.Sprintf("%s%d", prefix, k), w.event, nil); err != nil {
					errc <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return PerEvent{}, fmt.Errorf("calibrate the writers: %w", err)
	}
	c1, err := readCounters(ctx, harness)
	if err != nil {
		return PerEvent{}, err
	}
	return c1.sub(c0).per(n), nil
}

// Steady is one steady-state measurement: writers commit one event per transaction at a
// fixed rate for a fixed time, spread over Instances instances; an instance is its writers
// and its publisher sharing one store (one pool), so a commit wakes the publisher of its own
// instance only, as in separate services.
type Steady struct {
	Rate      int           // events (transactions) per second, over all instances
	Instances int           // publisher instances
	Duration  time.Duration // how long the writers commit
	Writers   int           // writer goroutines over all instances; 0: 16 (enough for 5,000/s at flush=1 here)
	Poll      time.Duration // 0: the default Config.PollInterval, 5 s
	Eager     bool          // publish as before coalescing (see Drain.Eager)
	// CoalesceDelay is the publishers' Tuning.CoalesceDelay when not Eager; 0: the default.
	CoalesceDelay time.Duration
	// Relay publishes through the binlog relay instead (see Drain.Relay).
	Relay bool
}

// SteadyResult is what a steady-state run measured. The statement counts are the server's
// own (SHOW GLOBAL STATUS: Questions and Com_*) over the window from just before the first
// commit until every event was sent and acknowledged, less the writers' statements (measured
// by a calibration run of the same writers alone, per transaction, times the transactions
// committed) and less the harness's own reads of the counters and of the pending rows.
type SteadyResult struct {
	Committed int           // events committed (= transactions)
	Elapsed   time.Duration // the writers' time
	Batches   int64         // non-empty claims (the sender's Send calls)

	Writer     PerEvent           // one writer transaction alone (the calibration)
	Statements float64            // publishing statements over the run
	Com        map[string]float64 // the same by kind (select, update, commit, ...)
	// RedoBytes and BinlogBytes are the publishing's redo and binary log over the run: the
	// run's less the writers' calibrated part, so the noise can leave them a little below
	// zero when the publishing writes (almost) nothing; NaN if unknown. BinlogBytes is 0 with
	// the binary log off, and unknown where the server has no Binlog_bytes_written (MySQL).
	RedoBytes   float64
	BinlogBytes float64
	Rounds      float64         // claim transactions: the publishing COMMITs (empty ones too)
	Latency     []time.Duration // commit to send, sorted
	Errors      int64           // the publishers' error-level log records
	FirstError  string          // the first of them, "" if none
	// AloneRate is, with Service.Paired, the writers' orders per second alone measured just
	// before this run (fresh tables, nobody publishing); 0 otherwise.
	AloneRate float64
	// CPU is the CPU used per order while the writers committed (publishing included);
	// AloneCPU the same for the writers alone just before (Service.Paired).
	CPU, AloneCPU CPUUse
}

// Rate is the achieved commit rate.
func (r SteadyResult) Rate() float64 { return float64(r.Committed) / r.Elapsed.Seconds() }

// StatementsPerEvent is the publishing statements per committed event.
func (r SteadyResult) StatementsPerEvent() float64 { return r.Statements / float64(r.Committed) }

// RedoPerEvent is the publishing redo bytes per committed event; NaN if unknown.
func (r SteadyResult) RedoPerEvent() float64 { return perEventBytes(r.RedoBytes, r.Committed) }

// BinlogPerEvent is the publishing binary log bytes per committed event; NaN if unknown.
func (r SteadyResult) BinlogPerEvent() float64 { return perEventBytes(r.BinlogBytes, r.Committed) }

// perEventBytes divides bytes over events: NaN if unknown (or no events).
func perEventBytes(bytes float64, events int) float64 {
	if events <= 0 {
		return math.NaN()
	}
	return bytes / float64(events)
}

// RoundsPerSecond is the claim transactions per second of the writers' time.
func (r SteadyResult) RoundsPerSecond() float64 { return r.Rounds / r.Elapsed.Seconds() }

// EventsPerRound is the events per claim transaction.
func (r SteadyResult) EventsPerRound() float64 {
	if r.Rounds <= 0 {
		return 0
	}
	return float64(r.Committed) / r.Rounds
}

// Quantile returns the q-quantile of the commit-to-send latency.
func (r SteadyResult) Quantile(q float64) time.Duration {
	return LatencyResult{Sorted: r.Latency}.Quantile(q)
}

// pollInterval is the publishers' poll interval unless a run says otherwise: 5 s, the
// default Config.PollInterval.
const pollInterval = 5 * time.Second

// calibrationTxs is how many transactions a calibration commits.
const calibrationTxs = 400

// Run runs the steady state once.
func (s Steady) Run(ctx context.Context, env Env) (SteadyResult, error) {
	var res SteadyResult
	if s.Rate <= 0 || s.Instances <= 0 || s.Duration <= 0 {
		return res, fmt.Errorf("steady: rate (%d), instances (%d) and duration (%s) must be positive", s.Rate, s.Instances, s.Duration)
	}
	writers := s.Writers
	if writers <= 0 {
		writers = 16
	}
	poll := s.Poll
	if poll <= 0 {
		poll = pollInterval
	}
	w := workload{event: true, rate: s.Rate, writers: writers, dur: s.Duration}
	m, err := measure(ctx, env, s.Instances, w, poll, Drain{Eager: s.Eager, CoalesceDelay: s.CoalesceDelay, Relay: s.Relay})
	if err != nil {
		return res, err
	}
	return m, nil
}

// measure runs workload w through instances instances with their publishers running (poll
// as their poll interval), and counts what the publishing cost the server.
func measure(ctx context.Context, env Env, instances int, w workload, poll time.Duration, how Drain) (SteadyResult, error) {
	var res SteadyResult
	t, err := newTable(ctx, env)
	if err != nil {
		return res, err
	}
	defer t.drop()
	rec := &recorder{sentAt: map[string]time.Time{}}
	errs := &errorCounter{}
	ins, err := startInstances(env, t.name, Drain{Instances: instances, Eager: how.Eager, CoalesceDelay: how.CoalesceDelay, Reference: how.Reference, Relay: how.Relay}, poll, rec.senders, errs)
	if err != nil {
		for _, in := range ins {
			in.close()
		}
		return res, err
	}
	dbs := make([]*sql.DB, len(ins))
	stores := make([]*outbox.MySQLStore, len(ins))
	for i, in := range ins {
		dbs[i], stores[i] = in.db, in.store
	}
	cal, err := calibrate(ctx, env, t.db, dbs, w, calibrationTxs)
	if err != nil {
		for _, in := range ins {
			in.close()
		}
		return res, err
	}
	res.Writer = cal
	stop := run(ins)
	defer stop()
	if how.Relay {
		if err := waitLeader(ctx, ins); err != nil {
			return res, err
		}
	}
	time.Sleep(200 * time.Millisecond) // the publishers' start-up (a first empty claim) is not the steady state
	c0, err := readCounters(ctx, t.db)
	if err != nil {
		return res, err
	}
	times := &commitTimes{at: map[string]time.Time{}}
	cpu0 := sampleCPU(ctx, t.db)
	wr, err := write(ctx, stores, w, times)
	if err != nil {
		return res, err
	}
	res.CPU = cpuPerOrder(cpu0, sampleCPU(ctx, t.db), wr.committed)
	res.Committed, res.Elapsed = wr.committed, wr.elapsed
	polls, err := waitSent(ctx, t, rec, wr.committed, time.Minute+2*poll, how.Reference != ReadOnly && how.Reference != BinlogOnly)
	if err != nil {
		return res, err
	}
	c1, err := readCounters(ctx, t.db)
	if err != nil {
		return res, err
	}
	d := c1.sub(c0)
	d.Questions -= polls // the harness's pending-row counts
	d.Com["select"] -= polls
	res.Statements, res.Com, res.RedoBytes, res.BinlogBytes = d.minus(cal, wr.committed)
	res.Rounds = res.Com["commit"]
	switch {
	case how.Reference == ReadOnly:
		res.Rounds = res.Com["select"] // a round is one read, in no transaction
	case how.Reference == BinlogOnly:
		res.Rounds = 0 // it reads no table
	case how.Relay:
		res.Rounds = res.Com["update_multi"] // a relay's round is its fenced UPDATE of the sent events
	}
	res.Batches = rec.batches.Load()
	if res.Latency, err = latencies(times, rec); err != nil {
		return res, err
	}
	res.Errors, res.FirstError = errs.n.Load(), errs.First()
	return res, nil
}

// Service is the service's view: Writers writers commit an order and its event per
// transaction for Duration, spread over Instances instances, first with no publisher running
// (alone), then with the instances' publishers keeping up.
type Service struct {
	Writers   int
	Instances int
	Duration  time.Duration
	// CoalesceDelay is the coalescing publishers' Tuning.CoalesceDelay; 0: the default.
	CoalesceDelay time.Duration
	// Rotate starts the ways of publishing this many places further down their list (eager,
	// coalescing, then the references), wrapping around: rounds that rotate by their number
	// spread over every way alike whatever drifts during a round.
	Rotate int
	// References also runs the reference relays (ReadOnly, OneWrite, TwoWrites), beside the
	// library's publishers, each a round every CoalesceDelay.
	References bool
	// Relay also runs the binlog relay (a relay in each instance, its publishers standing
	// by) and the BinlogOnly reference; the server needs its binlog on.
	Relay bool
	// Ways, if not empty, keeps only the ways of publishing named (see ServiceWays).
	Ways []string
	// Paired measures the writers alone again just before each way of publishing, and
	// costs each way against that measurement instead of the round's first: what drifts
	// during a round (the server's buffers, the machine's neighbours) then weighs on both
	// sides of a cost alike.
	Paired bool
}

// ServiceWays are the names Service.Ways takes, in the order a round runs them (before
// Rotate): eager and coalescing publishers, the reference relays (with References), the
// binlog relay and the reference that reads the binlog and writes nothing (with Relay).
var ServiceWays = []string{"eager", "coalescing", "readonly", "onewrite", "twowrites", "relay", "binlog"}

// ServiceResult is what a service run measured.
type ServiceResult struct {
	Alone writeResult
	// Eager and Coalescing are the runs with the publishers keeping up: publishing as before
	// coalescing (see Drain.Eager), and as the library does by default. Each is counted as a
	// steady-state run (the writers' statements calibrated on order-and-event transactions).
	Eager, Coalescing SteadyResult
	// ReadOnly, OneWrite and TwoWrites are the reference relays' runs (see Reference), when
	// asked for.
	ReadOnly, OneWrite, TwoWrites SteadyResult
	// Relay and BinlogOnly are the binlog relay's run and the reference that reads the
	// binlog and writes nothing, when asked for.
	Relay, BinlogOnly SteadyResult
}

// AloneRate is the orders per second without the publishers.
func (r ServiceResult) AloneRate() float64 {
	return float64(r.Alone.committed) / r.Alone.elapsed.Seconds()
}

// AloneOrders is the orders committed without the publishers.
func (r ServiceResult) AloneOrders() int { return r.Alone.committed }

// CostPercent is what publishing as in p took from the writers' throughput, in percent:
// against the writers alone just before p (Service.Paired), or else the round's first.
func (r ServiceResult) CostPercent(p SteadyResult) float64 {
	if p.AloneRate > 0 {
		return 100 * (1 - p.Rate()/p.AloneRate)
	}
	return 100 * (1 - p.Rate()/r.AloneRate())
}

// Run runs the writers alone, then with eager publishers, then with coalescing ones, then
// (if s.References) with each reference relay.
func (s Service) Run(ctx context.Context, env Env) (ServiceResult, error) {
	var res ServiceResult
	if s.Writers <= 0 || s.Instances <= 0 || s.Duration <= 0 {
		return res, fmt.Errorf("service: writers (%d), instances (%d) and duration (%s) must be positive", s.Writers, s.Instances, s.Duration)
	}
	for _, name := range s.Ways {
		if !slices.Contains(ServiceWays, name) {
			return res, fmt.Errorf("service: unknown way %q (one of %s)", name, strings.Join(ServiceWays, ", "))
		}
	}
	// Alone: the same pools and stores, nobody publishing.
	alone, err := newTable(ctx, env)
	if err != nil {
		return res, err
	}
	defer alone.drop()
	orders, dropOrders, err := newOrders(ctx, alone.db)
	if err != nil {
		return res, err
	}
	defer dropOrders()
	var dbs []*sql.DB
	defer func() {
		for _, db := range dbs {
			_ = db.Close()
		}
	}()
	for range s.Instances {
		db, err := env.open()
		if err != nil {
			return res, err
		}
		dbs = append(dbs, db)
	}
	stores, err := storesOn(dbs, alone.name)
	if err != nil {
		return res, err
	}
	w := workload{orders: orders, event: true, writers: s.Writers, dur: s.Duration}
	if res.Alone, err = write(ctx, stores, w, nil); err != nil {
		return res, err
	}
	// With the publishers, eager and coalescing (and the references), in the order Rotate
	// says: a fresh orders table each, so that every run starts alike.
	type publishing struct {
		name string
		how  Drain
		res  *SteadyResult
	}
	runs := []publishing{{"eager", Drain{Eager: true}, &res.Eager}, {"coalescing", Drain{CoalesceDelay: s.CoalesceDelay}, &res.Coalescing}}
	if s.References {
		runs = append(runs,
			publishing{"readonly", Drain{CoalesceDelay: s.CoalesceDelay, Reference: ReadOnly}, &res.ReadOnly},
			publishing{"onewrite", Drain{CoalesceDelay: s.CoalesceDelay, Reference: OneWrite}, &res.OneWrite},
			publishing{"twowrites", Drain{CoalesceDelay: s.CoalesceDelay, Reference: TwoWrites}, &res.TwoWrites})
	}
	if s.Relay {
		runs = append(runs,
			publishing{"relay", Drain{Relay: true}, &res.Relay},
			publishing{"binlog", Drain{Reference: BinlogOnly}, &res.BinlogOnly})
	}
	if len(s.Ways) > 0 {
		runs = slices.DeleteFunc(runs, func(p publishing) bool { return !slices.Contains(s.Ways, p.name) })
		if len(runs) == 0 {
			return res, fmt.Errorf("service: none of the ways %s runs here (the reference relays need References, the binlog ones Relay)", strings.Join(s.Ways, ", "))
		}
	}
	k := (s.Rotate%len(runs) + len(runs)) % len(runs)
	runs = slices.Concat(runs[k:], runs[:k])
	for _, run := range runs {
		var before float64
		var beforeCPU CPUUse
		if s.Paired {
			if before, beforeCPU, err = s.aloneAgain(ctx, env, dbs, w); err != nil {
				return res, err
			}
		}
		table, drop, err := newOrders(ctx, alone.db)
		if err != nil {
			return res, err
		}
		defer drop()
		w.orders = table
		if *run.res, err = measure(ctx, env, s.Instances, w, pollInterval, run.how); err != nil {
			return res, err
		}
		run.res.AloneRate, run.res.AloneCPU = before, beforeCPU
	}
	return res, nil
}

// aloneAgain measures the writers alone on fresh tables (outbox and orders) through the
// instances' pools, and returns their orders per second and the CPU per order.
func (s Service) aloneAgain(ctx context.Context, env Env, dbs []*sql.DB, w workload) (float64, CPUUse, error) {
	none := CPUUse{Self: -1, Server: -1}
	t, err := newTable(ctx, env)
	if err != nil {
		return 0, none, err
	}
	defer t.drop()
	orders, drop, err := newOrders(ctx, t.db)
	if err != nil {
		return 0, none, err
	}
	defer drop()
	stores, err := storesOn(dbs, t.name)
	if err != nil {
		return 0, none, err
	}
	w.orders = orders
	c0 := sampleCPU(ctx, t.db)
	r, err := write(ctx, stores, w, nil)
	if err != nil {
		return 0, none, err
	}
	return float64(r.committed) / r.elapsed.Seconds(), cpuPerOrder(c0, sampleCPU(ctx, t.db), r.committed), nil
}

// newOrders creates a fresh orders table and returns its name and a function that drops it.
func newOrders(ctx context.Context, db *sql.DB) (string, func(), error) {
	name := fmt.Sprintf("bench_orders_%d_%d", time.Now().UnixNano()%1e9, tableSeq.Add(1))
	if _, err := db.ExecContext(ctx, fmt.Sprintf(ordersDDL, name)); err != nil {
		return "", nil, fmt.Errorf("create orders table: %w", err)
	}
	return name, func() { _, _ = db.Exec("DROP TABLE IF EXISTS `" + name + "`") }, nil
}

// WritePath measures what the event's INSERT costs the business transaction: Writers
// writers commit for Duration, through one pool, an order alone, then an order and its
// event, then an order and its event with each of the outbox table's secondary indexes
// dropped in turn (on a fresh copy of the table; schema.sql is not changed).
type WritePath struct {
	Writers  int
	Duration time.Duration
	Rounds   int // rounds over all variants, so that the machine's noise spreads over each alike; 0: 1
	// Prefill, when positive, fills each variant's outbox table with this many SUCCESS
	// rows sent a day ago before it measures: the history a table keeps until it is
	// purged, which the indexes must be maintained beside.
	Prefill int
}

// WriteVariant is one row of the write-path measurement: one result per round.
type WriteVariant struct {
	Name   string // "order alone", "order + event", "order + event, no idx_biz_no", ...
	Rounds []WriteRound
}

// WriteRound is one round of a write-path variant.
type WriteRound struct {
	Committed int
	Elapsed   time.Duration
	RedoBytes int64 // redo log written during the run; -1 if unknown
}

// Rate is the orders per second.
func (r WriteRound) Rate() float64 { return float64(r.Committed) / r.Elapsed.Seconds() }

// Rates returns the rate of each round, sorted.
func (v WriteVariant) Rates() []float64 {
	out := make([]float64, len(v.Rounds))
	for i, r := range v.Rounds {
		out[i] = r.Rate()
	}
	slices.Sort(out)
	return out
}

// Rate is the median rate over the rounds.
func (v WriteVariant) Rate() float64 {
	rs := v.Rates()
	if n := len(rs); n%2 == 0 {
		return (rs[n/2-1] + rs[n/2]) / 2
	}
	return rs[len(rs)/2]
}

// Committed is the orders committed over all rounds.
func (v WriteVariant) Committed() int {
	n := 0
	for _, r := range v.Rounds {
		n += r.Committed
	}
	return n
}

// RedoPerOrder is the redo bytes per order over all rounds; -1 if unknown.
func (v WriteVariant) RedoPerOrder() float64 {
	var redo int64
	for _, r := range v.Rounds {
		if r.RedoBytes < 0 {
			return -1
		}
		redo += r.RedoBytes
	}
	return float64(redo) / float64(v.Committed())
}

// SecondaryIndexes are the outbox table's secondary indexes, each dropped in turn.
var SecondaryIndexes = []string{"idx_biz_no", "idx_status_claimed_at", "idx_status_next_retry", "uk_event_id"}

// Run measures every variant once, in order.
func (p WritePath) Run(ctx context.Context, env Env) ([]WriteVariant, error) {
	if p.Writers <= 0 || p.Duration <= 0 {
		return nil, fmt.Errorf("write path: writers (%d) and duration (%s) must be positive", p.Writers, p.Duration)
	}
	type variant struct {
		name  string
		event bool
		drop  string
	}
	vs := []variant{{name: "order alone"}, {name: "order + event", event: true}}
	for _, ix := range SecondaryIndexes {
		vs = append(vs, variant{name: "order + event, no " + ix, event: true, drop: ix})
	}
	out := make([]WriteVariant, len(vs))
	for i, v := range vs {
		out[i].Name = v.name
	}
	for range max(p.Rounds, 1) {
		for i, v := range vs {
			r, err := p.one(ctx, env, v.event, v.drop)
			if err != nil {
				return out, fmt.Errorf("write path %q: %w", v.name, err)
			}
			out[i].Rounds = append(out[i].Rounds, r)
		}
	}
	return out, nil
}

func (p WritePath) one(ctx context.Context, env Env, event bool, dropIndex string) (WriteRound, error) {
	v := WriteRound{RedoBytes: -1}
	t, err := newTable(ctx, env)
	if err != nil {
		return v, err
	}
	defer t.drop()
	if dropIndex != "" {
		if _, err := t.db.ExecContext(ctx, "ALTER TABLE `"+t.name+"` DROP INDEX `"+dropIndex+"`"); err != nil {
			return v, err
		}
	}
	if p.Prefill > 0 && event {
		if err := t.fillSent(ctx, p.Prefill, 24*time.Hour); err != nil {
			return v, err
		}
	}
	orders, dropOrders, err := newOrders(ctx, t.db)
	if err != nil {
		return v, err
	}
	defer dropOrders()
	lsn0 := redoLSN(ctx, t.db)
	r, err := write(ctx, []*outbox.MySQLStore{t.store}, workload{orders: orders, event: event, writers: p.Writers, dur: p.Duration}, nil)
	if err != nil {
		return v, err
	}
	if lsn1 := redoLSN(ctx, t.db); lsn0 >= 0 && lsn1 >= 0 {
		v.RedoBytes = lsn1 - lsn0
	}
	v.Committed, v.Elapsed = r.committed, r.elapsed
	return v, nil
}
