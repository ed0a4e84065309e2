package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
	"github.com/go-outbox/outbox/outboxtest"
)

// startLikeTheREADME starts p in the README's form, and closes it when the test ends.
func startLikeTheREADME(t *testing.T, ctx context.Context, p *outbox.Publisher) error {
	t.Helper()
	if err := p.Start(ctx); err != nil {
		return err
	}
	t.Cleanup(func() { assert.NoError(t, p.Close()) })
	return nil
}

// The README's start form loses no refusal: each comes back from Start, before anything
// runs, and the refused publisher reports itself not running.
func TestStartReportsEachRefusal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	refused := func(t *testing.T, p *outbox.Publisher, err error, sentinel error, says string) {
		t.Helper()
		require.ErrorIs(t, err, sentinel)
		assert.ErrorContains(t, err, says)
		assert.False(t, p.Health().Running, "a refused publisher does not run")
	}

	t.Run("started twice", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		first := newPublisher(t, b.store, newRecorder(), fastConfig("twice-start", &logSink{}))
		require.NoError(t, startLikeTheREADME(t, ctx, first))
		assert.True(t, first.Health().Running, "Running as soon as Start returned")
		err := startLikeTheREADME(t, ctx, first)
		require.ErrorIs(t, err, outbox.ErrAlreadyRunning, "one publisher started twice")
		assert.True(t, first.Health().Running, "the refusal leaves the first running")
		assert.Equal(t, "outbox: already running", outbox.ErrAlreadyRunning.Error(), "the sentinel's message is generic")
	})

	t.Run("key-order table without its index", func(t *testing.T) {
		t.Parallel()
		b := setup(t) // a plain table
		store, err := outbox.NewMySQLStore(b.db, outbox.MySQLConfig{Table: outbox.TableForTest(b.store), Ordering: outbox.KeyOrder})
		require.NoError(t, err)
		p := newPublisher(t, store, newRecorder(), fastConfig("ordered-start", &logSink{}))
		refused(t, p, startLikeTheREADME(t, ctx, p), outbox.ErrInvalidConfig, "idx_biz_no_status")
	})

	t.Run("table not partitioned as configured", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		store, err := outbox.NewMySQLStore(b.db, outbox.MySQLConfig{Table: outbox.TableForTest(b.store), PartitionIDs: 1000})
		require.NoError(t, err)
		p := newPublisher(t, store, newRecorder(), fastConfig("parts-start", &logSink{}))
		refused(t, p, startLikeTheREADME(t, ctx, p), outbox.ErrInvalidConfig, "ALTER TABLE")
	})

	t.Run("missing RelayTable", func(t *testing.T) {
		t.Parallel()
		db := testsvc.OpenDB(t)
		table := testsvc.UniqueTable("t_relayed")
		store := testsvc.NewStore(t, db, outbox.MySQLConfig{Table: table, RelayTable: table + "_missing"})
		p := newPublisher(t, store, newRecorder(), fastConfig("relay-start", &logSink{}))
		refused(t, p, startLikeTheREADME(t, ctx, p), outbox.ErrInvalidConfig, "relay.CreateSchema")
	})

	t.Run("after Close", func(t *testing.T) {
		t.Parallel()
		p := newPublisher(t, setup(t).store, newRecorder(), fastConfig("closed-start", &logSink{}))
		require.NoError(t, p.Close())
		refused(t, p, startLikeTheREADME(t, ctx, p), outbox.ErrClosed, "closed")
		require.ErrorIs(t, p.Run(ctx), outbox.ErrClosed)
	})
}

// Run is Start and a wait: it returns Start's refusal at once, and nil once stopped.
func TestRunIsStartThenWait(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := fastConfig("run-wait", &logSink{})
	first := newPublisher(t, b.store, newRecorder(), cfg)
	ran := make(chan error, 1)
	go func() { ran <- first.Run(context.Background()) }()
	require.Eventually(t, func() bool { return first.Health().Running }, 10*time.Second, time.Millisecond)
	require.ErrorIs(t, first.Run(context.Background()), outbox.ErrAlreadyRunning)
	require.NoError(t, first.Stop(context.Background()))
	select {
	case err := <-ran:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after Stop")
	}
	require.NoError(t, first.Close())
}

// stuckSender blocks every Send until released, ignoring its context (the worst a
// sender can do), and records a Send that ran after its Close.
type stuckSender struct {
	entered  chan struct{} // receives once per Send that started
	release  chan struct{} // closed to let the Sends go
	closed   atomic.Int32
	sent     atomic.Int32
	lateSend atomic.Int32 // Sends that ran after Close
}

func newStuckSender() *stuckSender {
	return &stuckSender{entered: make(chan struct{}, 1000), release: make(chan struct{})}
}

func (s *stuckSender) Send(_ context.Context, evs []outbox.Event, _ bool) []error {
	if s.closed.Load() > 0 {
		s.lateSend.Add(1)
	}
	s.entered <- struct{}{}
	<-s.release
	if s.closed.Load() > 0 {
		s.lateSend.Add(1)
	}
	s.sent.Add(int32(len(evs)))
	return make([]error, len(evs))
}

func (s *stuckSender) Info() outbox.SenderInfo { return outbox.SenderInfo{} }

func (s *stuckSender) Check(context.Context, []string) error { return nil }

func (s *stuckSender) Close() error {
	s.closed.Add(1)
	return nil
}

func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatal(what)
	}
}

// Stop is bounded by its context: a send that never ends leaves Stop returning an error
// that wraps the context's and says what is left SENDING; a later Stop waits for the rest,
// a second Stop is harmless, and Start may be called again after a Stop that returned nil.
func TestStopIsBoundedAndRepeatable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, 3)
	sender := newStuckSender()
	p := newPublisher(t, b.store, sender, fastConfig("stop-bound", &logSink{}))
	require.NoError(t, p.Stop(context.Background()), "Stop before Start")
	require.NoError(t, p.Start(context.Background()))
	waitFor(t, sender.entered, "no send started")

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := p.Stop(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, "events it claimed stay SENDING")
	assert.ErrorIs(t, p.Start(context.Background()), outbox.ErrAlreadyRunning, "still stopping")
	assert.True(t, p.Health().Running, "still stopping")

	close(sender.release)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { assert.NoError(t, p.Stop(context.Background())) })
	}
	wg.Wait()
	assert.False(t, p.Health().Running)
	// The send in flight was recorded; in per-row mode the events after it went back to WAIT.
	assert.Equal(t, 3, b.countStatus(t, outbox.StatusSuccess)+b.countStatus(t, outbox.StatusWait))
	assert.Zero(t, b.countStatus(t, outbox.StatusSending))
	assert.NotZero(t, b.countStatus(t, outbox.StatusSuccess))
	require.NoError(t, p.Stop(context.Background()))

	b.insert(t, 2)
	require.NoError(t, p.Start(context.Background()), "Start again after Stop")
	require.Eventually(t, func() bool { return b.countStatus(t, outbox.StatusSuccess) == 5 }, 20*time.Second, 5*time.Millisecond)
	require.NoError(t, p.Close())
	assert.Equal(t, int32(1), sender.closed.Load())
	assert.Zero(t, sender.lateSend.Load())
}

// Close is bounded by StopTimeout, and never closes the sender under a send: the sender is
// closed once the stuck send has returned.
func TestCloseIsBoundedByStopTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, 1)
	sender := newStuckSender()
	cfg := fastConfig("close-bound", &logSink{})
	cfg.StopTimeout = 200 * time.Millisecond
	p := newPublisher(t, b.store, sender, cfg)
	require.NoError(t, p.Start(context.Background()))
	waitFor(t, sender.entered, "no send started")

	err := p.Close()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, "SENDING")
	assert.Zero(t, sender.closed.Load(), "the sender stays open while a send is in progress")
	assert.ErrorIs(t, p.Start(context.Background()), outbox.ErrClosed)

	close(sender.release)
	require.NoError(t, p.Stop(context.Background()))
	require.NoError(t, p.Close())
	assert.Equal(t, int32(1), sender.closed.Load())
	assert.Zero(t, sender.lateSend.Load())
	assert.Equal(t, 1, b.countStatus(t, outbox.StatusSuccess))
}

// Nothing sends after Close: PublishPending and Reclaim return ErrClosed and send nothing,
// and the events stay WAIT for another instance.
func TestNothingSendsAfterClose(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, 3)
	sender := &closingSender{recorder: newRecorder()}
	p := newPublisher(t, b.store, sender, fastConfig("closed-pp", &logSink{}))
	require.NoError(t, p.Close())
	stats, err := p.PublishPending(context.Background())
	require.ErrorIs(t, err, outbox.ErrClosed)
	assert.Zero(t, stats)
	_, err = p.Reclaim(context.Background())
	require.ErrorIs(t, err, outbox.ErrClosed)
	assert.Zero(t, sender.total(), "nothing sent after Close")
	assert.Equal(t, 3, b.countStatus(t, outbox.StatusWait))
}

// A PublishPending in progress when Close is called finishes its send with the sender
// open; Close closes the sender after it, and no send starts after Close.
func TestCloseWaitsForPublishPending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, 2)
	sender := newStuckSender()
	p := newPublisher(t, b.store, sender, fastConfig("close-pp", &logSink{}))
	round := make(chan error, 1)
	go func() {
		_, err := p.PublishPending(context.Background())
		round <- err
	}()
	waitFor(t, sender.entered, "no send started")
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	require.Eventually(t, func() bool {
		_, err := p.Reclaim(context.Background()) // takes no round, so it does not wait for the send
		return errors.Is(err, outbox.ErrClosed)
	}, 10*time.Second, time.Millisecond, "Close has begun")
	_, err := p.PublishPending(context.Background())
	require.ErrorIs(t, err, outbox.ErrClosed, "no round starts once Close has begun")
	close(sender.release)
	require.NoError(t, <-round)
	require.NoError(t, <-closed)
	assert.Equal(t, int32(1), sender.closed.Load())
	assert.Zero(t, sender.lateSend.Load(), "no send used the closed sender")
	assert.Equal(t, 2, b.countStatus(t, outbox.StatusSuccess)+b.countStatus(t, outbox.StatusWait))
	assert.Zero(t, b.countStatus(t, outbox.StatusSending))
}

// Key order holds on every path that sends, started or not: PublishPending on a store in
// KeyOrder, with no Start, tells the sender keyOrder, so a key's second event is not sent
// after its first was dead-lettered.
func TestPublishPendingKeepsKeyOrderWithoutStart(t *testing.T) {
	t.Parallel()
	b := orderedSetup(t)
	first := b.insertPayload(t, "ORD-KEY", []byte(`"FIRST"`))
	second := b.insertPayload(t, "ORD-KEY", []byte(`"SECOND"`))
	var mu sync.Mutex
	var sent []int64
	var orderAsked []bool
	sender := senderFuncWithOrder(func(_ context.Context, ev outbox.Event) error {
		mu.Lock()
		defer mu.Unlock()
		sent = append(sent, ev.ID)
		if ev.ID == first {
			return outbox.Permanent(errors.New("FIRST is refused for good"))
		}
		return nil
	}, func(keyOrder bool) {
		mu.Lock()
		defer mu.Unlock()
		orderAsked = append(orderAsked, keyOrder)
	})
	p := newPublisher(t, b.store, sender, fastConfig("order-pp", &logSink{}))
	for range 3 {
		_, err := p.PublishPending(context.Background())
		require.NoError(t, err)
	}
	assert.Equal(t, outbox.StatusFail, b.get(t, first).Status)
	assert.Equal(t, outbox.StatusWait, b.get(t, second).Status, "a dead letter blocks its key")
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []int64{first}, sent, "SECOND never sent")
	for _, k := range orderAsked {
		assert.True(t, k, "the sender is told the store's key order")
	}
}

// orderSender is a SenderFunc that also reports the keyOrder each Send was given.
type orderSender struct {
	f     outbox.SenderFunc
	asked func(bool)
}

func senderFuncWithOrder(f func(context.Context, outbox.Event) error, asked func(bool)) *orderSender {
	return &orderSender{f: f, asked: asked}
}

func (s *orderSender) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	s.asked(keyOrder)
	return s.f.Send(ctx, evs, keyOrder)
}

func (s *orderSender) Info() outbox.SenderInfo { return outbox.SenderInfo{} }

func (s *orderSender) Check(context.Context, []string) error { return nil }

// makePoison sets n fresh events SENDING under a dead owner with expired leases, one
// reclaim short of maxReclaims, and returns their ids.
func (b *bundle) makePoison(t *testing.T, n, maxReclaims int) []int64 {
	t.Helper()
	ids := make([]int64, n)
	for i := range n {
		ids[i] = b.insertPayload(t, fmt.Sprintf("POISON-%d", i), []byte(`{}`))
	}
	b.exec(t, "UPDATE {t} SET status = 'SENDING', claim_owner = 'dead', reclaim_count = ?, claimed_at = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 HOUR) WHERE biz_no LIKE 'POISON-%'", maxReclaims-1)
	return ids
}

// OnDeadLetter's calls never overlap: 200 dead letters, 100 by permanent send errors in the
// scan loop and 100 by reclaims in the reclaim loop, reach it one at a time.
func TestOnDeadLetterCallsNeverOverlap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, 100)
	b.makePoison(t, 100, 2)
	var inside, overlaps, calls atomic.Int32
	cfg := fastConfig("dl-overlap", &logSink{})
	cfg.Tuning.MaxReclaims = 2
	cfg.Tuning.BatchSize = 10 // several rounds, interleaved with the reclaims
	cfg.OnDeadLetter = func(context.Context, outbox.Event, error) {
		if inside.Add(1) > 1 {
			overlaps.Add(1)
		}
		time.Sleep(time.Millisecond) // long enough for another caller to come in, if one can
		inside.Add(-1)
		calls.Add(1)
	}
	p := newPublisher(t, b.store, outbox.SenderFunc(func(context.Context, outbox.Event) error {
		return outbox.Permanent(errors.New("refused for good"))
	}), cfg)
	require.NoError(t, p.Start(context.Background()))
	require.Eventually(t, func() bool { return calls.Load() == 200 }, 60*time.Second, 5*time.Millisecond)
	require.NoError(t, p.Close())
	assert.Zero(t, overlaps.Load(), "overlapping OnDeadLetter calls")
	assert.Equal(t, int32(200), calls.Load())
	assert.Equal(t, 200, b.countStatus(t, outbox.StatusFail))
}

// Close called from inside OnDeadLetter returns, on each path that dead-letters: the scan
// loop, the reclaim loop and PublishPending. The publisher then stops, and the sender is
// closed once.
func TestCloseInsideOnDeadLetterReturns(t *testing.T) {
	t.Parallel()
	permanent := func(context.Context, outbox.Event) error { return outbox.Permanent(errors.New("refused for good")) }
	for _, path := range []string{"scan", "reclaim", "PublishPending"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			send := func(context.Context, outbox.Event) error { return nil }
			switch path {
			case "reclaim":
				b.makePoison(t, 1, 2)
			default:
				b.insert(t, 1)
				send = permanent
			}
			sender := &closingSender{recorder: newRecorder()}
			sender.fail = func(ev outbox.Event) error { return send(context.Background(), ev) }
			var p *outbox.Publisher
			returned := make(chan error, 1)
			cfg := fastConfig("dl-close-"+path, &logSink{})
			cfg.Tuning.MaxReclaims = 2
			cfg.OnDeadLetter = func(context.Context, outbox.Event, error) {
				select {
				case returned <- p.Close():
				default: // a later dead letter: the first call is the test
				}
			}
			p = newPublisher(t, b.store, sender, cfg)
			if path == "PublishPending" {
				go func() { _, _ = p.PublishPending(context.Background()) }()
			} else {
				require.NoError(t, p.Start(context.Background()))
			}
			select {
			case err := <-returned:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Fatal("Close called inside OnDeadLetter did not return")
			}
			closed := make(chan error, 1)
			go func() { closed <- p.Close() }()
			select {
			case err := <-closed:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Fatal("Close after the callback did not return")
			}
			assert.False(t, p.Health().Running)
			assert.Equal(t, int32(1), sender.closed.Load())
			assert.ErrorIs(t, p.Start(context.Background()), outbox.ErrClosed)
		})
	}
}

// failingReclaims is a store whose ReclaimExpired does its work and then fails, as a
// store that failed part way through its pages.
type failingReclaims struct{ *outbox.MySQLStore }

var errReclaimPage = errors.New("the second page failed")

func (s failingReclaims) ReclaimExpired(ctx context.Context, lease time.Duration, maxReclaims int) (int64, []outbox.Event, error) {
	n, dead, err := s.MySQLStore.ReclaimExpired(ctx, lease, maxReclaims)
	if err != nil {
		return n, dead, err
	}
	return n, dead, errReclaimPage
}

// A reclaim that fails part way returns what it did return to WAIT, with the error, and
// counts it in the metrics; its dead letters are told.
func TestReclaimAfterAPartialFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.makePoison(t, 1, 2)                              // dead-lettered by the reclaim
	again := b.insertPayload(t, "AGAIN", []byte(`{}`)) // reclaimed
	b.exec(t, "UPDATE {t} SET status = 'SENDING', claim_owner = 'dead', claimed_at = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 HOUR) WHERE id = ?", again)
	reader := sdkmetric.NewManualReader()
	cfg := fastConfig("reclaim-partial", &logSink{})
	cfg.Tuning.MaxReclaims = 2
	cfg.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	var told atomic.Int32
	cfg.OnDeadLetter = func(context.Context, outbox.Event, error) { told.Add(1) }
	p := newPublisher(t, failingReclaims{b.store}, newRecorder(), cfg)
	n, err := p.Reclaim(context.Background())
	require.ErrorIs(t, err, errReclaimPage)
	assert.Equal(t, int64(1), n, "what was requeued before the failure")
	assert.Equal(t, outbox.StatusWait, b.get(t, again).Status)
	assert.Equal(t, int32(1), told.Load())
	got := collect(t, reader)
	assert.Equal(t, 1.0, total(got.values["outbox.events.reclaimed"]))
	assert.Equal(t, 1.0, total(got.values["outbox.events.dead_lettered"]))
}

func total(m map[string]float64) float64 {
	var s float64
	for _, v := range m {
		s += v
	}
	return s
}

// Stop called from inside OnDeadLetter returns, and the publisher stops once the callback
// has returned; a later Stop from elsewhere waits for that, and Start may follow.
func TestStopInsideOnDeadLetterReturns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, 1)
	var p *outbox.Publisher
	returned := make(chan error, 1)
	cfg := fastConfig("dl-stop", &logSink{})
	cfg.OnDeadLetter = func(ctx context.Context, _ outbox.Event, _ error) {
		select {
		case returned <- p.Stop(ctx):
		default:
		}
	}
	p = newPublisher(t, b.store, outbox.SenderFunc(func(context.Context, outbox.Event) error {
		return outbox.Permanent(errors.New("refused for good"))
	}), cfg)
	require.NoError(t, p.Start(context.Background()))
	select {
	case err := <-returned:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Stop called inside OnDeadLetter did not return")
	}
	require.NoError(t, p.Stop(context.Background()))
	assert.False(t, p.Health().Running)
	require.NoError(t, p.Start(context.Background()), "Start again after the stop")
	require.NoError(t, p.Close())
}

// OnDeadLetter hears of a round's dead letters in the order they were dead-lettered, and
// PublishPending returns once it has heard of them all.
func TestOnDeadLetterInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 5)
	var told []int64 // no lock: the calls never overlap, and PublishPending waits for them
	cfg := fastConfig("dl-order", &logSink{})
	cfg.OnDeadLetter = func(_ context.Context, ev outbox.Event, _ error) { told = append(told, ev.ID) }
	p := newPublisher(t, b.store, outbox.SenderFunc(func(context.Context, outbox.Event) error {
		return outbox.Permanent(errors.New("refused for good"))
	}), cfg)
	stats, err := p.PublishPending(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 5, stats.DeadLettered)
	assert.Equal(t, ids, told)
}

// Start refuses what cannot work, in every mode, in one error that names each problem
// once: a table that does not exist (ErrNoTable, unordered too); a table that lacks columns
// and indexes (each with the statement that adds it); and the topics the sender cannot
// send to, beside the table's problems.
func TestStartRefusesWhatCannotWorkInOneError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testsvc.OpenDB(t)
	for _, o := range []outbox.Ordering{outbox.Unordered, outbox.KeyOrder} {
		missing := testsvc.UniqueTable("t_none")
		store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: missing, Ordering: o})
		require.NoError(t, err)
		p := newPublisher(t, store, newRecorder(), fastConfig("no-table", &logSink{}))
		err = p.Start(ctx)
		require.ErrorIs(t, err, outbox.ErrNoTable, "%s", o)
		assert.Equal(t, 1, strings.Count(err.Error(), missing), "%s: named once: %v", o, err)
		assert.False(t, p.Health().Running, "%s", o)
		require.NoError(t, p.Close())
		_, err = store.Check(ctx)
		require.ErrorIs(t, err, outbox.ErrNoTable)
		_, err = store.Candidates(ctx, 1)
		assert.ErrorIs(t, err, outbox.ErrNoTable, "a statement on the missing table says so too")
	}

	// A table of an earlier version, without the topic column and the reclaim's index, in
	// key order without its index either; and a sender that lacks one of the topics.
	b := topicSetup(t, outbox.MySQLConfig{Ordering: outbox.KeyOrder}, "orders", "payments")
	b.exec(t, "ALTER TABLE {t} DROP COLUMN topic, DROP INDEX idx_status_claimed_at, DROP INDEX idx_biz_no_status, ADD INDEX idx_biz_no (biz_no)")
	sender := outboxtest.NewMemorySender(defaultTopic, "orders")
	p := newPublisher(t, b.store, sender, fastConfig("shape", &logSink{}))
	err := p.Start(ctx)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	t.Logf("Start: %v", err)
	for _, problem := range []string{"a topic column", "an index idx_status_claimed_at", "an index idx_biz_no_status", "no topic payments"} {
		assert.Equal(t, 1, strings.Count(err.Error(), problem), "%q named once in: %v", problem, err)
	}
	for _, fix := range []string{"ADD COLUMN topic", "ADD INDEX idx_status_claimed_at", "ADD INDEX idx_biz_no_status"} {
		assert.Equal(t, 1, strings.Count(err.Error(), fix), "%q given once", fix)
	}
	require.NoError(t, p.Close())

	// Every statement the error gives, run as given, makes the table serve the store.
	_, stmts, ok := strings.Cut(err.Error(), "run: ")
	require.True(t, ok)
	stmts, _, _ = strings.Cut(stmts, " (see docs/upgrading.md)")
	for _, stmt := range strings.SplitAfter(stmts, ";") {
		if stmt = strings.TrimSpace(strings.TrimSuffix(stmt, ";")); stmt != "" {
			_, err := b.db.ExecContext(ctx, stmt)
			require.NoError(t, err, stmt)
		}
	}
	_, err = b.store.Check(ctx)
	require.NoError(t, err)
	p = newPublisher(t, b.store, outboxtest.NewMemorySender(), fastConfig("shape-fixed", &logSink{}))
	require.NoError(t, p.Start(ctx))
	require.NoError(t, p.Close())
}
