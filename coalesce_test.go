package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// ackCounter is a store that counts how successes are recorded: by a claim (carried in its
// request) or by a statement of their own.
type ackCounter struct {
	outbox.Store
	mu        sync.Mutex
	carried   []int64 // ids a claim was asked to record
	own       []int64 // ids recorded by MarkSuccess or MarkSuccessBatch
	failClaim atomic.Bool
}

var errClaimRefused = errors.New("claim refused by the test")

func (s *ackCounter) ClaimDue(ctx context.Context, req outbox.ClaimRequest) (outbox.ClaimResult, error) {
	if s.failClaim.CompareAndSwap(true, false) {
		return outbox.ClaimResult{}, errClaimRefused
	}
	res, err := s.Store.ClaimDue(ctx, req)
	if err == nil {
		s.mu.Lock()
		s.carried = append(s.carried, req.Succeeded...)
		s.mu.Unlock()
	}
	return res, err
}

func (s *ackCounter) MarkSuccess(ctx context.Context, ids []int64, owner string) (int64, error) {
	s.mu.Lock()
	s.own = append(s.own, ids...)
	s.mu.Unlock()
	return s.Store.MarkSuccess(ctx, ids, owner)
}

func (s *ackCounter) recorded() (carried, own []int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.carried), slices.Clone(s.own)
}

func sorted(ids []int64) []int64 {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	return ids
}

// In Run's rounds a batch's successes are recorded by the next claim, in its transaction:
// a round at a steady rate costs one commit, not two. Whatever no claim carries is recorded
// on its own: after ackDelay, before a claim whose request failed is retried, and when the
// publisher stops (before it releases what it holds, which would send it again).
func TestRunRoundsRecordSuccessesWithTheNextClaim(t *testing.T) {
	t.Parallel()
	if testPerRow {
		t.Skip("per-row rounds record each success at once")
	}
	ctx := context.Background()
	b := setup(t)
	store := &ackCounter{Store: b.store}
	rec := newRecorder()
	p := newPublisher(t, store, rec, fastConfig("acks", &logSink{}))

	first := b.insert(t, 3)
	stats, err := outbox.RunRoundForTest(p, ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, stats.Claimed)
	assert.Zero(t, stats.Sent, "no success recorded yet")
	assert.Equal(t, first, sorted(outbox.UnackedForTest(p)))
	assert.Equal(t, 3, b.countStatus(t, outbox.StatusSending), "sent, and SENDING until the next claim")

	second := b.insert(t, 2)
	stats, err = outbox.RunRoundForTest(p, ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, stats.Sent, "the first round's successes, recorded by this round's claim")
	assert.Equal(t, 2, stats.Claimed)
	carried, own := store.recorded()
	assert.Equal(t, first, sorted(carried))
	assert.Empty(t, own, "no statement of their own")
	for _, id := range first {
		assert.Equal(t, outbox.StatusSuccess, b.get(t, id).Status)
	}

	// No round comes: Run records them on their own after ackDelay.
	outbox.FlushAcksForTest(p, ctx)
	_, own = store.recorded()
	assert.Equal(t, second, sorted(own))
	assert.Empty(t, outbox.UnackedForTest(p))

	// A claim that fails while carrying successes: they are recorded on their own before
	// the publisher releases what it holds and claims again.
	third := b.insert(t, 2)
	_, err = outbox.RunRoundForTest(p, ctx)
	require.NoError(t, err)
	store.failClaim.Store(true)
	_, err = outbox.RunRoundForTest(p, ctx)
	require.ErrorIs(t, err, errClaimRefused)
	_, err = outbox.RunRoundForTest(p, ctx)
	require.NoError(t, err)
	_, own = store.recorded()
	assert.Subset(t, own, third)

	// Stopping with successes unrecorded records them first.
	fourth := b.insert(t, 2)
	_, err = outbox.RunRoundForTest(p, ctx)
	require.NoError(t, err)
	require.Equal(t, fourth, sorted(outbox.UnackedForTest(p)))
	outbox.StopForTest(p, ctx)

	all := slices.Concat(first, second, third, fourth)
	for _, id := range all {
		assert.Equal(t, outbox.StatusSuccess, b.get(t, id).Status, "event %d", id)
		assert.Equal(t, 1, rec.count(id), "event %d sent once", id)
	}
	assert.Equal(t, len(all), b.countStatus(t, outbox.StatusSuccess))
}

// A publisher that sends its last event and then has nothing to do records the success on
// its own within ackDelay (50 ms), not at the next poll.
func TestLastSuccessIsRecordedWithoutAnotherRound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := newRecorder()
	cfg := fastConfig("last-ack", &logSink{})
	cfg.PollInterval = time.Hour
	p := newPublisher(t, b.store, rec, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = p.Run(ctx) })
	defer wg.Wait()
	defer cancel()

	require.Eventually(t, func() bool { return b.countStatus(t, outbox.StatusWait) == 0 }, 10*time.Second, 5*time.Millisecond,
		"the first round ran")
	ids := b.insert(t, 1) // Tx.Commit wakes the publisher
	require.Eventually(t, func() bool { return b.get(t, ids[0]).Status == outbox.StatusSuccess }, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, 1, rec.count(ids[0]))
}

// Run's return records the successes it has not recorded before it releases what it holds:
// nothing sent goes back to WAIT to be sent again.
func TestRunStopsWithEverySuccessRecorded(t *testing.T) {
	t.Parallel()
	for range 5 {
		b := setup(t)
		rec := newRecorder()
		p := newPublisher(t, b.store, rec, fastConfig("stop-acks", &logSink{}))
		ids := b.insert(t, 20)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { _ = p.Run(ctx) })
		require.Eventually(t, func() bool { return rec.total() >= len(ids) }, 10*time.Second, time.Millisecond)
		cancel() // at once: the successes are likely unrecorded still
		wg.Wait()
		assert.Equal(t, len(ids), b.countStatus(t, outbox.StatusSuccess))
		for _, id := range ids {
			assert.Equal(t, 1, rec.count(id), "event %d sent once", id)
		}
	}
}

// statusCounts reads the server's statement counters of the given kinds.
func statusCounts(t *testing.T, db *sql.DB, names ...string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, name := range names {
		var (
			n string
			v int64
		)
		require.NoError(t, db.QueryRow("SHOW GLOBAL STATUS LIKE '"+name+"'").Scan(&n, &v))
		out[name] = v
	}
	return out
}

// On its claim session a batch claim that also records the last round's success costs three
// statements: its SELECT, one UPDATE and a COMMIT; no SET TRANSACTION and no BEGIN each time
// (two statements, once, set the session up). Without it (PooledClaims) every claim is a
// transaction of its own. Counted by a private server's
// own counters, so that no other test's statements enter.
func TestClaimSessionSavesTheTransactionStatements(t *testing.T) {
	t.Parallel()
	srv := testsvc.PrivateMySQL(t)
	db := srv.OpenDB(t)
	counters := srv.OpenDB(t)
	const claims = 20
	for _, noSession := range []bool{false, true} {
		store := testsvc.NewStore(t, db, outbox.MySQLConfig{PooledClaims: noSession})
		b := &bundle{db: db, store: store}
		ids := b.insert(t, claims)
		b.exec(t, "UPDATE {t} SET next_retry_time = DATE_ADD(UTC_TIMESTAMP(3), INTERVAL 1 HOUR)")
		kinds := []string{"Com_begin", "Com_set_option", "Com_commit", "Com_select", "Com_update"}
		before := statusCounts(t, counters, kinds...)
		var acked []int64
		for _, id := range ids {
			b.makeDue(t, id) // one due at a time, as at a steady rate
			res, err := store.ClaimDue(context.Background(), outbox.ClaimRequest{Owner: "session", Limit: 100, MaxBytes: 1 << 20, Succeeded: acked})
			require.NoError(t, err)
			require.Len(t, res.Events, 1)
			assert.Equal(t, int64(len(acked)), res.Succeeded)
			acked = []int64{id}
		}
		after := statusCounts(t, counters, kinds...)
		d := map[string]int64{}
		for _, k := range kinds {
			d[k] = after[k] - before[k]
		}
		// Per claim: its SELECT, one UPDATE that claims the row and records the last
		// success, and the test's own UPDATE that made the row due; the first claim also
		// takes and releases the claim turn (SELECT GET_LOCK, DO RELEASE_LOCK).
		want := map[string]int64{"Com_begin": 0, "Com_set_option": 2, "Com_commit": claims, "Com_select": claims + 1, "Com_update": 2 * claims}
		if noSession {
			want["Com_begin"], want["Com_set_option"] = claims, claims
		}
		assert.Equal(t, want, d)
		assert.Equal(t, claims-1, b.countStatus(t, outbox.StatusSuccess))
	}
}

// The claim session's settings (READ COMMITTED, autocommit off) never reach a connection the
// service gets from the pool: the session is closed, not returned, when idle and when the
// store's last subscribed publisher stops. A pool too small to lend a connection for good keeps no session.
func TestClaimSessionNeverReachesThePool(t *testing.T) {
	t.Parallel()
	if testPerRow {
		t.Skip("the claim session is the batch claim's")
	}
	ctx := context.Background()
	b := setup(t)

	// Idle: closed after two seconds without a claim.
	b.insert(t, 1)
	res, err := b.store.ClaimDue(ctx, outbox.ClaimRequest{Owner: "idle", Limit: 10, MaxBytes: 1 << 20})
	require.NoError(t, err)
	require.Len(t, res.Events, 1)
	assert.True(t, outbox.ClaimSessionOpenForTest(b.store))
	assert.Equal(t, 1, b.db.Stats().InUse, "the session holds its connection")
	require.Eventually(t, func() bool { return !outbox.ClaimSessionOpenForTest(b.store) }, 10*time.Second, 10*time.Millisecond)
	assert.Zero(t, b.db.Stats().InUse)
	assertPoolUntouched(t, b.db)

	// Stopped: closed when Run returns.
	rec := newRecorder()
	cfg := fastConfig("session", &logSink{})
	cfg.PollInterval = time.Hour
	p := newPublisher(t, b.store, rec, cfg)
	ids := b.insert(t, 10)
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = p.Run(runCtx) })
	require.Eventually(t, func() bool { return rec.total() == len(ids) }, 10*time.Second, time.Millisecond)
	cancel()
	wg.Wait()
	assert.False(t, outbox.ClaimSessionOpenForTest(b.store))
	assertPoolUntouched(t, b.db)

	// Another subscriber (a second publisher's run) keeps it past this run's stop; the
	// last one's unsubscribe closes it.
	_, unsubscribe := b.store.Subscribe()
	ids = b.insert(t, 10)
	runCtx, cancel = context.WithCancel(ctx)
	wg.Go(func() { _ = p.Run(runCtx) })
	require.Eventually(t, func() bool { return rec.total() == 2*len(ids) }, 10*time.Second, time.Millisecond)
	cancel()
	wg.Wait()
	assert.True(t, outbox.ClaimSessionOpenForTest(b.store), "another subscriber's claims may still use it")
	unsubscribe()
	assert.False(t, outbox.ClaimSessionOpenForTest(b.store))
	assertPoolUntouched(t, b.db)

	// A small pool.
	small := testsvc.OpenDB(t)
	small.SetMaxOpenConns(3)
	store := testsvc.NewStoreOn(t, small, outbox.TableForTest(b.store))
	b.insert(t, 1)
	res, err = store.ClaimDue(ctx, outbox.ClaimRequest{Owner: "small", Limit: 10, MaxBytes: 1 << 20})
	require.NoError(t, err)
	require.Len(t, res.Events, 1)
	assert.False(t, outbox.ClaimSessionOpenForTest(store))
	assert.Zero(t, small.Stats().InUse)
	assertPoolUntouched(t, small)
}

// assertPoolUntouched takes every connection the pool has open and checks that each is in
// autocommit at the server's default isolation level.
func assertPoolUntouched(t *testing.T, db *sql.DB) {
	t.Helper()
	ctx := context.Background()
	n := db.Stats().OpenConnections
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range n {
		c, err := db.Conn(ctx)
		require.NoError(t, err)
		conns = append(conns, c)
		var autocommit int
		require.NoError(t, c.QueryRowContext(ctx, "SELECT @@SESSION.autocommit").Scan(&autocommit))
		assert.Equal(t, 1, autocommit)
		var session, global string
		q := "SELECT @@SESSION.transaction_isolation, @@GLOBAL.transaction_isolation"
		if err := c.QueryRowContext(ctx, q).Scan(&session, &global); err != nil {
			// MariaDB before 11.1 names it tx_isolation.
			q = "SELECT @@SESSION.tx_isolation, @@GLOBAL.tx_isolation"
			require.NoError(t, c.QueryRowContext(ctx, q).Scan(&session, &global))
		}
		assert.Equal(t, global, session)
	}
}

// claimCounter counts the claims that found events, and the events they found. It is the
// MySQL store otherwise, its wake-up on commit (Notifier) included.
type claimCounter struct {
	*outbox.MySQLStore
	claims, events atomic.Int64
}

func (s *claimCounter) ClaimDue(ctx context.Context, req outbox.ClaimRequest) (outbox.ClaimResult, error) {
	res, err := s.MySQLStore.ClaimDue(ctx, req)
	if n := len(res.Events); err == nil && n > 0 {
		s.claims.Add(1)
		s.events.Add(int64(n))
	}
	return res, err
}

// Under a steady stream of commits, each waking the publisher, rounds carry many events:
// the coalescing window gathers them. Two publishers, each on a table of its own, take the
// same stream at the same time, one with a window and one without
// (Tuning.EagerClaims): the coalescing one claims more events a claim, whatever the load on
// the machine does to both. (How many more is the benchmark's to measure: docs/performance.md,
// "Steady state: coalescing".)
func TestSteadyCommitsAreCoalesced(t *testing.T) {
	t.Parallel()
	if testPerRow {
		t.Skip("per-row rounds claim one event a statement")
	}
	type leg struct {
		b     *bundle
		store *claimCounter
		rec   *recorder
		ids   []int64
	}
	start := func(eager bool) *leg {
		b := setup(t)
		l := &leg{b: b, store: &claimCounter{MySQLStore: b.store}, rec: newRecorder()}
		cfg := fastConfig("coalesce", &logSink{})
		cfg.PollInterval = 5 * time.Second // the default
		cfg.Tuning.EagerClaims = eager
		if !eager {
			// A window well above what a claim takes on a loaded machine, so that the load
			// does not close it (a window closes when events take longer than the target
			// without waiting, as they do when the machine is saturated: then eager rounds
			// carry as many). The default's effect is the benchmark's to measure.
			cfg.Tuning.CoalesceDelay = 100 * time.Millisecond
		}
		runPublisher(t, newPublisher(t, l.store, l.rec, cfg))
		return l
	}
	coalescing, eager := start(false), start(true)

	// One commit a millisecond to each table for two seconds, each through Tx.Commit (which
	// wakes that table's publisher), as a service's order API would: a writer per table.
	ctx := context.Background()
	end := time.Now().Add(2 * time.Second)
	var writers sync.WaitGroup
	for _, l := range []*leg{coalescing, eager} {
		writers.Go(func() {
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for ; time.Now().Before(end); <-tick.C {
				tx, err := l.b.store.BeginTx(ctx, nil)
				if !assert.NoError(t, err) {
					return
				}
				id, err := outbox.InsertForTest(ctx, tx, outbox.EventInput{BizNo: "STEADY", EventType: "ORDER_CREATED", Payload: []byte("{}")})
				if !assert.NoError(t, err) || !assert.NoError(t, tx.Commit()) {
					return
				}
				l.ids = append(l.ids, id)
			}
		})
	}
	writers.Wait()
	perClaim := map[*leg]float64{}
	for _, l := range []*leg{coalescing, eager} {
		require.Eventually(t, func() bool { return l.b.countStatus(t, outbox.StatusSuccess) == len(l.ids) }, 20*time.Second, 10*time.Millisecond)
		for _, id := range l.ids {
			assert.Equal(t, 1, l.rec.count(id))
		}
		claims, events := l.store.claims.Load(), l.store.events.Load()
		require.NotZero(t, claims)
		perClaim[l] = float64(events) / float64(claims)
	}
	t.Logf("events committed one at a time: %d and %d; %.2f events a claim coalescing, %.2f eager",
		len(coalescing.ids), len(eager.ids), perClaim[coalescing], perClaim[eager])
	assert.Greater(t, perClaim[coalescing], perClaim[eager], "events per claim, coalescing against eager")
}
