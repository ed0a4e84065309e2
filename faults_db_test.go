package outbox_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// The tests in this file take the database away from running publishers: the server
// restarts or crashes, their connections are killed, their claim turn is refused. The
// publishers must log it, reconnect by themselves and lose nothing.

// getLockSession finds the session waiting in GET_LOCK for b's claim turn.
func getLockSession(t *testing.T, b *bundle) int64 {
	t.Helper()
	var id int64
	require.Eventually(t, func() bool {
		err := b.db.QueryRow("SELECT ID FROM information_schema.PROCESSLIST "+
			"WHERE INFO LIKE 'SELECT GET_LOCK(%' AND INFO LIKE CONCAT('%', ?, '%')", outbox.TableForTest(b.store)).Scan(&id)
		if errors.Is(err, sql.ErrNoRows) {
			return false
		}
		require.NoError(t, err)
		return true
	}, 10*time.Second, 10*time.Millisecond, "the claim waits for its turn")
	return id
}

// sessionExists reports whether session id is still connected.
func sessionExists(t *testing.T, db *sql.DB, id int64) bool {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?", id).Scan(&n))
	return n > 0
}

// A claim whose wait for its turn is killed (KILL QUERY: MariaDB's GET_LOCK then returns
// NULL) goes ahead without the turn and claims the due events; the session it waited on is
// closed rather than returned to the pool, since a failed GET_LOCK may have left it holding
// the lock; and the store's next claims skip the turns for a while.
func TestMySQLStoreBatchClaimGoesAheadWhenItsTurnWaitIsKilled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	outbox.SetClaimTurnWaitForTest(b.store, time.Minute)
	ids := b.insert(t, 3)
	release := holdClaimTurn(t, b)

	done := claimInBackground(context.Background(), b.store, "owner-a")
	waiting := getLockSession(t, b)
	require.NoError(t, testsvc.KillSession(context.Background(), b.db, waiting, true))
	var r claimResult
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the claim did not go on after its GET_LOCK wait was killed")
	}
	require.NoError(t, r.err)
	require.Len(t, r.evs, 3, "the claim went on without its turn")
	for _, id := range ids {
		got := b.get(t, id)
		assert.Equal(t, outbox.StatusSending, got.Status)
		assert.Equal(t, "owner-a", got.ClaimOwner)
	}
	require.Eventually(t, func() bool { return !sessionExists(t, b.db, waiting) }, 10*time.Second, 20*time.Millisecond,
		"the connection whose GET_LOCK failed was closed, not kept in the pool")

	// The turn is still held: a claim that asked for it would wait a minute.
	b.insert(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r = <-claimInBackground(ctx, b.store, "owner-a")
	require.NoError(t, r.err)
	assert.Len(t, r.evs, 2)
	release()
	assert.True(t, claimTurnFree(t, b.db, b.store))
}

// A claim whose session is killed while it waits for its turn fails with the connection's
// error (it cannot claim on a dead connection), claims nothing, and the next claim works
// on a fresh connection.
func TestMySQLStoreBatchClaimFailsWhenItsConnectionIsKilledInTheTurnWait(t *testing.T) {
	t.Parallel()
	b := setup(t)
	outbox.SetClaimTurnWaitForTest(b.store, time.Minute)
	ids := b.insert(t, 3)
	release := holdClaimTurn(t, b)

	done := claimInBackground(context.Background(), b.store, "owner-a")
	require.NoError(t, testsvc.KillSession(context.Background(), b.db, getLockSession(t, b), false))
	r := <-done
	require.Error(t, r.err, "a dead connection is the claim's error")
	assert.Empty(t, r.evs)
	for _, id := range ids {
		assert.Equal(t, outbox.StatusWait, b.get(t, id).Status)
	}

	release()
	r = <-claimInBackground(context.Background(), b.store, "owner-a")
	require.NoError(t, r.err)
	assert.Len(t, r.evs, 3)
	assert.True(t, claimTurnFree(t, b.db, b.store))
}

// faultyConnector opens connections to the test server that pass every call on to the
// driver, except where a hook steps in: as a proxy would that refuses a statement, or a
// network that drops the connection after the server did the work, so that the client never
// learns the outcome. It counts the connections closed.
type faultyConnector struct {
	driver.Connector
	// beforeQuery, if it returns an error, answers a query with it instead of the server.
	beforeQuery func(query string) error
	// beforeExec, if it returns an error, closes the connection and reports the error
	// before a statement reaches the server.
	beforeExec func(query string) error
	// afterExec, if it returns an error, replaces the result of a statement the server has
	// run (and, outside a transaction, committed) with it, and closes the connection.
	afterExec func(query string) error
	// afterCommit, if it returns an error, replaces the result of a commit the server has
	// made with it, and closes the connection. opts are the transaction's.
	afterCommit func(opts driver.TxOptions) error
	closeds     atomic.Int64
}

func (c *faultyConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &faultyConn{Conn: conn, c: c}, nil
}

// openFaulty opens a pool on the shared test database through c.
func openFaulty(t *testing.T, c *faultyConnector) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(testsvc.MySQLDSN(t))
	require.NoError(t, err)
	cfg.ParseTime = true
	c.Connector, err = mysql.NewConnector(cfg)
	require.NoError(t, err)
	db := sql.OpenDB(c)
	db.SetMaxIdleConns(8)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

type faultyConn struct {
	driver.Conn
	c *faultyConnector
}

// lost closes the connection and reports err in place of the outcome.
func (f *faultyConn) lost(err error) error {
	_ = f.Conn.Close()
	return err
}

func (f *faultyConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if f.c.beforeQuery != nil {
		if err := f.c.beforeQuery(query); err != nil {
			return nil, err
		}
	}
	return f.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
}

func (f *faultyConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if f.c.beforeExec != nil {
		if err := f.c.beforeExec(query); err != nil {
			return nil, f.lost(err)
		}
	}
	res, err := f.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
	if err == nil && f.c.afterExec != nil {
		if err := f.c.afterExec(query); err != nil {
			return nil, f.lost(err)
		}
	}
	return res, err
}

func (f *faultyConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	tx, err := f.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &faultyTx{Tx: tx, conn: f, opts: opts}, nil
}

// PrepareContext serves the statements with arguments (the driver prepares them).
func (f *faultyConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	st, err := f.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return &faultyStmt{Stmt: st, conn: f, query: query}, nil
}

func (f *faultyConn) ResetSession(ctx context.Context) error {
	return f.Conn.(driver.SessionResetter).ResetSession(ctx)
}

func (f *faultyConn) IsValid() bool { return f.Conn.(driver.Validator).IsValid() }

func (f *faultyConn) CheckNamedValue(nv *driver.NamedValue) error {
	return f.Conn.(driver.NamedValueChecker).CheckNamedValue(nv)
}

func (f *faultyConn) Close() error {
	f.c.closeds.Add(1)
	return f.Conn.Close()
}

type faultyStmt struct {
	driver.Stmt
	conn  *faultyConn
	query string
}

func (st *faultyStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	if st.conn.c.beforeExec != nil {
		if err := st.conn.c.beforeExec(st.query); err != nil {
			return nil, st.conn.lost(err)
		}
	}
	res, err := st.Stmt.(driver.StmtExecContext).ExecContext(ctx, args)
	if err == nil && st.conn.c.afterExec != nil {
		if err := st.conn.c.afterExec(st.query); err != nil {
			return nil, st.conn.lost(err)
		}
	}
	return res, err
}

func (st *faultyStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if st.conn.c.beforeQuery != nil {
		if err := st.conn.c.beforeQuery(st.query); err != nil {
			return nil, err
		}
	}
	return st.Stmt.(driver.StmtQueryContext).QueryContext(ctx, args)
}

func (st *faultyStmt) CheckNamedValue(nv *driver.NamedValue) error {
	return st.Stmt.(driver.NamedValueChecker).CheckNamedValue(nv)
}

type faultyTx struct {
	driver.Tx
	conn *faultyConn
	opts driver.TxOptions
}

func (t *faultyTx) Commit() error {
	err := t.Tx.Commit()
	if err == nil && t.conn.c.afterCommit != nil {
		if err := t.conn.c.afterCommit(t.opts); err != nil {
			return t.conn.lost(err)
		}
	}
	return err
}

// A GET_LOCK the server (or a proxy) refuses with an error is no reason to claim nothing:
// the claim goes ahead without the turn and closes its connection afterwards, and the
// store's next claims do not ask for the turn for a while. An error that says the
// connection is gone still fails the claim: nothing can be claimed on it.
func TestMySQLStoreBatchClaimGoesAheadWhenGetLockIsRefused(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		refusal error
		goesOn  bool
	}{
		{"killed wait (MySQL 8)", &mysql.MySQLError{Number: 1317, Message: "Query execution was interrupted"}, true},
		{"proxy forbids it", &mysql.MySQLError{Number: 1305, Message: "FUNCTION GET_LOCK does not exist"}, true},
		{"connection killed", &mysql.MySQLError{Number: 1927, Message: "Connection was killed"}, false},
		{"server shutting down", &mysql.MySQLError{Number: 1053, Message: "Server shutdown in progress"}, false},
		{"connection lost", mysql.ErrInvalidConn, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var refused atomic.Int64
			refuser := &faultyConnector{beforeQuery: func(query string) error {
				if strings.HasPrefix(query, "SELECT GET_LOCK(") {
					refused.Add(1)
					return c.refusal
				}
				return nil
			}}
			db := openFaulty(t, refuser)
			store := testsvc.NewStoreOn(t, db, outbox.TableForTest(b.store))
			b.insert(t, 3)

			evs, _, err := claimDue(context.Background(), store, "owner-a", 10, 1<<20)
			assert.EqualValues(t, 1, refused.Load())
			if !c.goesOn {
				require.Error(t, err)
				assert.Empty(t, evs)
				assert.Zero(t, b.countStatus(t, outbox.StatusSending), "nothing claimed")
				return
			}
			require.NoError(t, err)
			assert.Len(t, evs, 3, "claimed without the turn")
			assert.EqualValues(t, 1, refuser.closeds.Load(), "the connection whose GET_LOCK failed was closed")

			b.insert(t, 2)
			evs, _, err = claimDue(context.Background(), store, "owner-a", 10, 1<<20)
			require.NoError(t, err)
			assert.Len(t, evs, 2)
			assert.EqualValues(t, 1, refused.Load(), "turns are paused after a refusal")
			assert.EqualValues(t, 1, refuser.closeds.Load(), "a claim without a turn keeps its connection")
		})
	}
}

// lostOnce returns a hook that reports a lost connection the first time match accepts its
// argument, and nothing otherwise.
func lostOnce[T any](match func(T) bool) (hook func(T) error, fired *atomic.Bool) {
	fired = new(atomic.Bool)
	return func(v T) error {
		if match(v) && fired.CompareAndSwap(false, true) {
			return mysql.ErrInvalidConn
		}
		return nil
	}, fired
}

// runUnknownOutcome inserts five events, runs a publisher (with the default ten-minute
// lease) on a pool through c, and returns once the hook has fired, with the bundle, the
// sender and the function that stops the publisher.
func runUnknownOutcome(t *testing.T, c *faultyConnector, fired *atomic.Bool, storeCfg outbox.MySQLConfig) (*bundle, *recorder, []int64, func()) {
	t.Helper()
	b := setup(t)
	ids := b.insert(t, 5)
	storeCfg.Table = outbox.TableForTest(b.store)
	store, err := outbox.NewMySQLStore(openFaulty(t, c), storeCfg)
	require.NoError(t, err)
	rec := newRecorder()
	cfg := fastConfig("unknown-outcome", &logSink{})
	cfg.Tuning.Lease = 10 * time.Minute // the default
	p := newPublisher(t, store, rec, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = p.Run(ctx) })
	stop := func() { cancel(); wg.Wait() }
	t.Cleanup(stop)
	require.Eventually(t, fired.Load, 30*time.Second, 5*time.Millisecond)
	return b, rec, ids, stop
}

// A claim whose commit reached the server but whose answer never came back (the connection
// dropped during COMMIT) leaves rows SENDING that the publisher does not know it holds.
// They must not sit SENDING for the whole lease (ten minutes) while the publisher runs: it
// sends them, or releases them to be claimed again (issue 8, part 4). A batch claim commits
// with a COMMIT statement on the store's claim session, or with its own transaction's
// commit without one.
func TestClaimWithUnknownCommitOutcomeLeavesNothingSending(t *testing.T) {
	t.Parallel()
	type variant struct {
		name  string
		cfg   outbox.MySQLConfig
		fault func(c *faultyConnector) *atomic.Bool
	}
	variants := []variant{{name: "claim session", fault: func(c *faultyConnector) (fired *atomic.Bool) {
		c.afterExec, fired = lostOnce(func(q string) bool { return q == "COMMIT" })
		return fired
	}}, {name: "own transaction", cfg: outbox.MySQLConfig{PooledClaims: true}, fault: func(c *faultyConnector) (fired *atomic.Bool) {
		c.afterCommit, fired = lostOnce(func(o driver.TxOptions) bool { return o.Isolation == driver.IsolationLevel(sql.LevelReadCommitted) })
		return fired
	}}}
	if testPerRow {
		variants = []variant{{name: "per row", fault: func(c *faultyConnector) (fired *atomic.Bool) {
			c.afterExec, fired = lostOnce(func(q string) bool { return strings.Contains(q, "status = 'SENDING', claim_owner = ?") })
			return fired
		}}}
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			c := &faultyConnector{}
			fired := v.fault(c)
			b, rec, ids, stop := runUnknownOutcome(t, c, fired, v.cfg)
			if !assert.Eventually(t, func() bool { return b.countStatus(t, outbox.StatusSuccess) == len(ids) }, 60*time.Second, 20*time.Millisecond,
				"the claimed rows are sent (or released and sent) well before their ten-minute lease ends") {
				t.Fatalf("after a minute: %d SENDING, %d WAIT", b.countStatus(t, outbox.StatusSending), b.countStatus(t, outbox.StatusWait))
			}
			stop()
			for _, id := range ids {
				assert.Positive(t, rec.count(id), "event %d sent", id)
			}
		})
	}
}

// An acknowledgement (the UPDATE to SUCCESS, on its own or in the next claim's UPDATE) that
// fails with its connection is retried, so the event does not sit SENDING for its lease and
// is not sent again after it (issue 8, part 4).
func TestFailedAcknowledgementIsRetried(t *testing.T) {
	t.Parallel()
	c := &faultyConnector{}
	var fired *atomic.Bool
	c.beforeExec, fired = lostOnce(func(q string) bool {
		return strings.Contains(q, "status IN ('SENDING', 'SUCCESS') AND claim_owner = ?")
	})
	b, rec, ids, stop := runUnknownOutcome(t, c, fired, outbox.MySQLConfig{})
	require.Eventually(t, func() bool { return b.countStatus(t, outbox.StatusSuccess) == len(ids) }, 60*time.Second, 20*time.Millisecond,
		"acknowledged well before the ten-minute lease ends")
	stop()
	for _, id := range ids {
		assert.Equal(t, 1, rec.count(id), "event %d sent once", id)
	}
}

// dbFaultRun is the harness of the tests in which the database goes away under running
// publishers: publishers with connection pools of their own and a recording sender each,
// writers committing events all the while on another pool, and the publishers' logs.
type dbFaultRun struct {
	t      *testing.T
	table  string
	check  *sql.DB // the writers' pool; final checks
	writer *outbox.MySQLStore
	logs   *logSink
	rec    *recorder
	pubs   []*faultPublisher

	mu        sync.Mutex
	committed []int64 // ids whose transaction's Commit returned nil

	writeErrs []string
	stopWrite context.CancelFunc
	writers   sync.WaitGroup
	stopPub   context.CancelFunc
	running   sync.WaitGroup
}

// faultPublisher is one publisher of a dbFaultRun, with the times of its sends.
type faultPublisher struct {
	rec   *recorder
	mu    sync.Mutex
	times []time.Time
}

func (f *faultPublisher) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	return outbox.SenderFunc(f.sendOne).Send(ctx, evs, keyOrder)
}

func (f *faultPublisher) Info() outbox.SenderInfo { return outbox.SenderInfo{} }

func (f *faultPublisher) Check(context.Context, []string) error { return nil }

func (f *faultPublisher) sendOne(ctx context.Context, ev outbox.Event) error {
	if err := f.rec.sendOne(ctx, ev); err != nil {
		return err
	}
	f.mu.Lock()
	f.times = append(f.times, time.Now())
	f.mu.Unlock()
	return nil
}

// firstSendAfter returns the time of the publisher's first send after t, if any.
func (f *faultPublisher) firstSendAfter(t time.Time) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i, _ := slices.BinarySearchFunc(f.times, t, func(a, b time.Time) int { return a.Compare(b) })
	if i == len(f.times) {
		return time.Time{}, false
	}
	return f.times[i], true
}

// newDBFaultRun starts n publishers on store's table, each on the pool openPool returns,
// and two writers on store itself.
func newDBFaultRun(t *testing.T, store *outbox.MySQLStore, db *sql.DB, n int, openPool func() *sql.DB) *dbFaultRun {
	r := &dbFaultRun{t: t, table: outbox.TableForTest(store), check: db, writer: store, logs: &logSink{}, rec: newRecorder()}
	pubCtx, stopPub := context.WithCancel(context.Background())
	r.stopPub = stopPub
	t.Cleanup(r.stopPublishers)
	for i := range n {
		cfg := fastConfig(fmt.Sprintf("fault-pub-%d", i), r.logs)
		cfg.PollInterval = 20 * time.Millisecond
		cfg.Tuning.ReclaimInterval = 200 * time.Millisecond
		fp := &faultPublisher{rec: r.rec}
		p := newPublisher(t, testsvc.NewStoreOn(t, openPool(), r.table), fp, cfg)
		r.pubs = append(r.pubs, fp)
		r.running.Go(func() {
			if err := p.Run(pubCtx); err != nil {
				t.Errorf("publisher %d: Run: %v", i, err)
			}
		})
	}
	writeCtx, stopWrite := context.WithCancel(context.Background())
	r.stopWrite = stopWrite
	t.Cleanup(r.stopWriters)
	for w := range 2 {
		r.writers.Go(func() { r.write(writeCtx, w) })
	}
	return r
}

// write commits small transactions of one to five events until ctx ends, and goes on after
// every error: the database may be away.
func (r *dbFaultRun) write(ctx context.Context, w int) {
	for n := 0; ctx.Err() == nil; n++ {
		ids, err := r.commit(ctx, w, n)
		if err != nil && ctx.Err() != nil {
			return
		}
		if err != nil {
			r.mu.Lock()
			r.writeErrs = append(r.writeErrs, err.Error())
			r.mu.Unlock()
			sleepCtx(ctx, 20*time.Millisecond)
			continue
		}
		r.mu.Lock()
		r.committed = append(r.committed, ids...)
		r.mu.Unlock()
		sleepCtx(ctx, 2*time.Millisecond)
	}
}

func (r *dbFaultRun) commit(ctx context.Context, w, n int) ([]int64, error) {
	tx, err := r.writer.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback() }()
	ids := make([]int64, 1+n%5)
	for i := range ids {
		ids[i], err = outbox.InsertForTest(ctx, tx, outbox.EventInput{
			BizNo: fmt.Sprintf("W%d-%d-%d", w, n, i), EventType: "FAULT", Payload: fmt.Appendf(nil, `{"w":%d,"n":%d}`, w, n),
		})
		if err != nil {
			return nil, err
		}
	}
	return ids, tx.Commit()
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (r *dbFaultRun) stopWriters() {
	r.stopWrite()
	r.writers.Wait()
}

func (r *dbFaultRun) stopPublishers() {
	r.stopPub()
	r.running.Wait()
}

func (r *dbFaultRun) committedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.committed)
}

// waitSends waits until the publishers have sent n more events.
func (r *dbFaultRun) waitSends(n int) {
	r.t.Helper()
	target := r.rec.total() + n
	require.Eventually(r.t, func() bool { return r.rec.total() >= target }, 2*time.Minute, 10*time.Millisecond,
		"the publishers send %d more events", n)
}

// resumed waits until every publisher, the same Run as before the fault, has sent again
// since up, and returns how long after up the first and the last of them did.
func (r *dbFaultRun) resumed(fault string, up time.Time) (first, last time.Duration) {
	r.t.Helper()
	require.Eventually(r.t, func() bool {
		for _, p := range r.pubs {
			if _, ok := p.firstSendAfter(up); !ok {
				return false
			}
		}
		return true
	}, 2*time.Minute, 10*time.Millisecond, "every publisher resumes after the %s without a restart", fault)
	for i, p := range r.pubs {
		at, _ := p.firstSendAfter(up)
		d := at.Sub(up)
		if i == 0 || d < first {
			first = d
		}
		last = max(last, d)
	}
	return first.Round(time.Millisecond), last.Round(time.Millisecond)
}

// recovered waits until every publisher has sent again since up (when the database
// answered again), and logs how long that took.
func (r *dbFaultRun) recovered(fault string, down, up time.Time) {
	r.t.Helper()
	first, last := r.resumed(fault, up)
	r.t.Logf("%s: database away %s; first send %s after it answered again, every publisher sending again after %s",
		fault, up.Sub(down).Round(time.Millisecond), first, last)
}

// finish stops the writers, waits until every row is SUCCESS, stops the publishers and
// checks that nothing was lost: every committed event is in the table, SUCCESS, and was
// sent at least once; no row is FAIL or left SENDING. The publishers must have logged a
// database error.
func (r *dbFaultRun) finish() {
	t := r.t
	t.Helper()
	r.stopWriters()
	var status map[string]int
	// Rows a publisher claimed or sent just as its connection went (a COMMIT or an
	// acknowledgement whose outcome it never learned) stay SENDING until they are released
	// or their lease (10 s) is reclaimed; then they are sent again.
	require.Eventually(t, func() bool {
		status = r.statusCounts()
		return status[string(outbox.StatusSuccess)] == status["total"]
	}, 2*time.Minute, 50*time.Millisecond, "every row ends SUCCESS")
	r.stopPublishers()

	status = r.statusCounts()
	assert.Zero(t, status[string(outbox.StatusFail)], "no dead letter")
	assert.Zero(t, status[string(outbox.StatusSending)], "no row left SENDING")
	assert.Zero(t, status[string(outbox.StatusWait)], "no row left WAIT")

	rows, err := r.check.Query("SELECT id FROM `" + r.table + "`")
	require.NoError(t, err)
	inTable := map[int64]bool{}
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		inTable[id] = true
	}
	require.NoError(t, rows.Err())
	require.NoError(t, rows.Close())
	r.mu.Lock()
	committed, writeErrs := slices.Clone(r.committed), slices.Clone(r.writeErrs)
	r.mu.Unlock()
	for _, id := range committed {
		if !inTable[id] {
			t.Errorf("event %d was committed and is not in the table", id)
		}
	}
	var unsent, dup int
	for id := range inTable {
		switch n := r.rec.count(id); {
		case n == 0:
			unsent++
		case n > 1:
			dup++
		}
	}
	assert.Zero(t, unsent, "every event in the table was sent")
	errs := r.logs.atLeast(slog.LevelError)
	require.NotEmpty(t, errs, "the publishers logged the database's errors")
	t.Logf("%d events committed (%d more rows whose commit outcome the writer never learned), %d sends, %d events sent more than once; %d error logs:\n  %s\n%d failed writes:\n  %s",
		len(committed), len(inTable)-len(committed), r.rec.total(), dup, len(errs), strings.Join(tally(errs), "\n  "),
		len(writeErrs), strings.Join(tally(writeErrs), "\n  "))
}

// statusCounts counts the table's rows by status, and all of them as "total".
func (r *dbFaultRun) statusCounts() map[string]int {
	r.t.Helper()
	rows, err := r.check.Query("SELECT status, COUNT(*) FROM `" + r.table + "` GROUP BY status")
	require.NoError(r.t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		require.NoError(r.t, rows.Scan(&s, &n))
		out[s] = n
		out["total"] += n
	}
	require.NoError(r.t, rows.Err())
	return out
}

// tally counts the distinct messages, in order of first appearance, with newlines
// flattened.
func tally(msgs []string) []string {
	var order []string
	n := map[string]int{}
	for _, m := range msgs {
		m = strings.ReplaceAll(m, "\n", " | ")
		if n[m] == 0 {
			order = append(order, m)
		}
		n[m]++
	}
	for i, m := range order {
		order[i] = fmt.Sprintf("%d× %s", n[m], m)
	}
	return order
}

// The database server restarts under three running publishers and two writers: once
// cleanly, once by a crash (SIGKILL) with two seconds down. The publishers log the errors,
// reconnect by themselves (the same Run, no restart), and every committed event is sent and
// SUCCESS; none is FAIL or left SENDING.
func TestPublishersSurviveDatabaseRestarts(t *testing.T) {
	t.Parallel()
	srv := testsvc.PrivateMySQL(t)
	db := srv.OpenDB(t)
	store := testsvc.NewStore(t, db, outbox.MySQLConfig{})
	r := newDBFaultRun(t, store, db, 3, func() *sql.DB { return srv.OpenDB(t) })
	r.waitSends(200)

	down := time.Now()
	srv.Restart(t)
	r.recovered("clean restart", down, time.Now())
	before := r.committedCount()
	r.waitSends(200)

	down = time.Now()
	srv.Kill(t)
	time.Sleep(2 * time.Second) // down: the writers and publishers keep trying
	srv.Start(t)
	r.recovered("crash and restart", down, time.Now())
	require.Eventually(t, func() bool { return r.committedCount() > before+200 }, 2*time.Minute, 10*time.Millisecond,
		"the writers commit again")
	r.finish()
	assert.Positive(t, claimFailuresLogged(r.logs), "the failed claims were logged")
}

// claimFailuresLogged counts the errors a publisher logs when a round's claim (or, per row,
// its candidate SELECT or one claim) fails.
func claimFailuresLogged(logs *logSink) int {
	return logs.count(slog.LevelError, "outbox: could not claim") + logs.count(slog.LevelError, "outbox: could not select candidates")
}

// The publishers' connections are killed from another session, over and over, while they
// work: whole connections (KILL CONNECTION: idle ones, ones inside a claim's transaction,
// ones waiting for the claim turn) and running statements (KILL QUERY). The publishers run
// as a user of their own, so that exactly their sessions are killed on the shared server.
// They log the errors, reconnect, and lose nothing.
func TestPublishersSurviveKilledConnections(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	store := testsvc.NewStore(t, db, outbox.MySQLConfig{})
	user := testsvc.MySQLUser(t)
	r := newDBFaultRun(t, store, db, 3, func() *sql.DB { return testsvc.OpenDBAs(t, user) })
	r.waitSends(200)

	ctx := context.Background()
	var killedConns, killedQueries, busy, rounds int
	var recoveries []time.Duration
	deadline := time.Now().Add(2 * time.Minute)
	// Kill until each kind has hit often, and some kills have caught statements running.
	for killedConns < 30 || killedQueries < 30 || busy < 10 || len(r.logs.atLeast(slog.LevelError)) == 0 {
		require.True(t, time.Now().Before(deadline),
			"kills for 2 minutes: %d connections, %d queries, %d while running, no error logged", killedConns, killedQueries, busy)
		sessions, err := testsvc.UserSessions(ctx, db, user)
		require.NoError(t, err)
		rounds++
		switch rounds % 3 {
		case 0: // KILL QUERY on every statement running, or every session if none is
			victims := slices.DeleteFunc(slices.Clone(sessions), func(s testsvc.Session) bool { return !s.Busy() })
			if len(victims) == 0 {
				victims = sessions
			}
			for _, s := range victims {
				require.NoError(t, testsvc.KillSession(ctx, db, s.ID, true))
				killedQueries++
				if s.Busy() {
					busy++
				}
			}
		case 1: // KILL CONNECTION on one session, a busy one if any
			if len(sessions) == 0 {
				break
			}
			s := sessions[mrand.IntN(len(sessions))]
			for _, c := range sessions {
				if c.Busy() {
					s = c
				}
			}
			require.NoError(t, testsvc.KillSession(ctx, db, s.ID, false))
			killedConns++
			if s.Busy() {
				busy++
			}
		case 2: // KILL CONNECTION on every session of the publishers
			at := time.Now()
			for _, s := range sessions {
				require.NoError(t, testsvc.KillSession(ctx, db, s.ID, false))
				killedConns++
				if s.Busy() {
					busy++
				}
			}
			if len(sessions) > 0 && len(recoveries) < 10 {
				// How long until a publisher sends again after all its connections went.
				require.Eventually(t, func() bool {
					for _, p := range r.pubs {
						if _, ok := p.firstSendAfter(at); ok {
							return true
						}
					}
					return false
				}, time.Minute, time.Millisecond)
				var first time.Duration = -1
				for _, p := range r.pubs {
					if ts, ok := p.firstSendAfter(at); ok && (first < 0 || ts.Sub(at) < first) {
						first = ts.Sub(at)
					}
				}
				recoveries = append(recoveries, first)
			}
		}
		time.Sleep(time.Duration(20+mrand.IntN(40)) * time.Millisecond)
	}
	t.Logf("killed %d connections and %d queries (%d while running a statement) in %d rounds; first send after all connections were killed: %v",
		killedConns, killedQueries, busy, rounds, roundAll(recoveries))
	_, last := r.resumed("kills", time.Now())
	t.Logf("every publisher sending again %s after the last kill", last)
	r.finish()
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}
