package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// switchSender is a broker that can be taken down: while down, every send fails with fail()
// (outbox.Unavailable by default); up, it records the event.
type switchSender struct {
	*recorder
	down     atomic.Bool
	attempts atomic.Int64
	fail     func(ev outbox.Event) error
}

func newSwitchSender() *switchSender {
	return &switchSender{recorder: newRecorder(), fail: func(outbox.Event) error {
		return outbox.Unavailable(fmt.Errorf("dial tcp 127.0.0.1:10911: connect: connection refused"))
	}}
}

func (s *switchSender) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	return outbox.SenderFunc(s.sendOne).Send(ctx, evs, keyOrder)
}

// sendOne counts one attempt per event.
func (s *switchSender) sendOne(ctx context.Context, ev outbox.Event) error {
	s.attempts.Add(1)
	if s.down.Load() {
		return s.fail(ev)
	}
	return s.recorder.sendOne(ctx, ev)
}

// runPublisher runs p until the test ends, and fails the test if Run returns an error.
func runPublisher(t *testing.T, p *outbox.Publisher) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			assert.NoError(t, <-done)
		})
	}
	t.Cleanup(stop)
	return stop
}

// retried counts the rows of the bundle's table with a retry counted.
func (b *bundle) retried(t testing.TB) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow("SELECT COUNT(*) FROM `"+outbox.TableForTest(b.store)+"` WHERE retry_count > 0").Scan(&n))
	return n
}

// While the broker is unavailable the publisher spends no retry and sends no flood: it
// stops claiming and probes one event at a time. Events committed during the outage wait;
// when the broker is back all of them go, each once, none dead-lettered.
func TestBrokerOutageSpendsNoRetries(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"Unavailable", "SenderClosed"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			sender := newSwitchSender()
			if name == "SenderClosed" {
				sender.fail = func(outbox.Event) error { return fmt.Errorf("rocketmq: %w", outbox.ErrClosed) }
			}
			sender.down.Store(true)
			ids := b.insert(t, 50)
			logs := &logSink{}
			cfg := fastConfig("p", logs)
			cfg.MaxAttempts = 1 // the first counted failure would dead-letter
			cfg.Tuning.MaxProbeDelay = 100 * time.Millisecond
			p := newPublisher(t, b.store, sender, cfg)
			stop := runPublisher(t, p)

			require.Eventually(t, func() bool { return p.Health().BrokerUnavailable }, 10*time.Second, 5*time.Millisecond)
			require.Eventually(t, func() bool { return logs.count(slog.LevelWarn, "broker still unavailable") >= 3 },
				10*time.Second, 10*time.Millisecond, "it probes again and again")
			ids = append(ids, b.insert(t, 50)...) // committed during the outage
			time.Sleep(300 * time.Millisecond)
			tried := sender.attempts.Load()
			assert.Less(t, tried, int64(len(ids)), "probes send one event each, not every event every round")
			// The first failure starts the outage; each later attempt is one probe, which
			// warns once (one more may be in flight).
			assert.LessOrEqual(t, tried, int64(logs.count(slog.LevelWarn, "broker still unavailable")+2))
			assert.Zero(t, b.countStatus(t, outbox.StatusFail))
			assert.Zero(t, b.retried(t), "an outage spends no retry")
			assert.LessOrEqual(t, b.countStatus(t, outbox.StatusSending), 1, "probed events go back to WAIT (one probe may be in flight)")
			assert.Equal(t, 1, logs.count(slog.LevelError, "broker unavailable"), "the outage is an error once, not per event")

			sender.down.Store(false)
			require.Eventually(t, func() bool { return b.countStatus(t, outbox.StatusSuccess) == len(ids) },
				20*time.Second, 10*time.Millisecond)
			assert.False(t, p.Health().BrokerUnavailable)
			stop()
			for _, id := range ids {
				assert.Equal(t, 1, sender.count(id), "event %d", id)
				assert.Equal(t, 0, b.get(t, id).RetryCount)
			}
			assert.Equal(t, 1, logs.count(slog.LevelWarn, "broker reachable again"))
			t.Logf("%d send attempts for %d events across the outage", sender.attempts.Load(), len(ids))
		})
	}
}

// A send that fails as unavailable while other events of the same round got through is the
// message's own failure: it spends a retry, and the publisher does not stop claiming.
func TestUnavailableWhileOthersAreSentCountsARetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 5)
	bad := ids[4] // last in the round, after the others were sent
	sender := newSwitchSender()
	sender.recorder.fail = func(ev outbox.Event) error {
		if ev.ID == bad {
			return outbox.Unavailable(errors.New("route info not found"))
		}
		return nil
	}
	p := newPublisher(t, b.store, sender, fastConfig("p", &logSink{}))
	stats, err := p.PublishPending(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 4, stats.Sent)
	assert.Equal(t, 1, stats.Retried)
	assert.Zero(t, stats.Unavailable)
	assert.False(t, p.Health().BrokerUnavailable)
	got := b.get(t, bad)
	assert.Equal(t, outbox.StatusWait, got.Status)
	assert.Equal(t, 1, got.RetryCount)
}

// claimOutcomeUnknown is a store whose claims commit and then report an error, as a claim
// whose connection dropped during COMMIT does.
type claimOutcomeUnknown struct {
	outbox.Store
	lies atomic.Int64 // claims left to report as failed
}

var errCommitUnknown = errors.New("invalid connection (the COMMIT may or may not have happened)")

func (s *claimOutcomeUnknown) ClaimDue(ctx context.Context, req outbox.ClaimRequest) (outbox.ClaimResult, error) {
	res, err := s.Store.ClaimDue(ctx, req)
	if err == nil && len(res.Events) > 0 && s.lies.Add(-1) >= 0 {
		return outbox.ClaimResult{}, errCommitUnknown
	}
	return res, err
}

func (s *claimOutcomeUnknown) Claim(ctx context.Context, ev outbox.Event, owner string) (bool, error) {
	won, err := s.Store.Claim(ctx, ev, owner)
	if err == nil && won && s.lies.Add(-1) >= 0 {
		return false, errCommitUnknown
	}
	return won, err
}

// A claim that committed but reported an error leaves rows SENDING under the instance,
// which does not know it holds them. The publisher releases its own rows before its next
// claim, so they are sent at once rather than after the lease, and each only once.
func TestClaimWithUnknownOutcomeIsReleasedBeforeTheNextClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 3)
	store := &claimOutcomeUnknown{Store: b.store}
	store.lies.Store(1)
	logs := &logSink{}
	rec := newRecorder()
	cfg := fastConfig("p", logs)
	cfg.Tuning.Lease = time.Hour // no reclaim could rescue them in this test
	cfg.Tuning.SendTimeout = time.Second
	p := newPublisher(t, store, rec, cfg)

	stats, err := p.PublishPending(context.Background())
	if !testPerRow {
		require.ErrorIs(t, err, errCommitUnknown)
		assert.Zero(t, stats.Sent)
		assert.Equal(t, len(ids), b.countStatus(t, outbox.StatusSending), "the claim did happen")
	} else {
		require.NoError(t, err, "per row, a failed claim is one candidate's error, not the round's")
		assert.Equal(t, 1, stats.Errors)
		assert.Equal(t, len(ids)-1, stats.Sent)
		assert.Equal(t, 1, b.countStatus(t, outbox.StatusSending), "the claim did happen")
	}

	require.Eventually(t, func() bool {
		_, err := p.PublishPending(context.Background())
		require.NoError(t, err)
		return b.countStatus(t, outbox.StatusSuccess) == len(ids)
	}, 10*time.Second, 10*time.Millisecond)
	for _, id := range ids {
		assert.Equal(t, 1, rec.count(id))
		got := b.get(t, id)
		assert.Equal(t, 0, got.RetryCount)
		assert.Equal(t, 0, got.ReclaimCount)
	}
	assert.Equal(t, 1, logs.count(slog.LevelWarn, "claim whose outcome was unknown"))
}

// ackFailures is a store whose success writes fail a number of times first: a
// MarkSuccess, a MarkSuccessBatch, or a claim that carries successes (the claim fails whole,
// as one whose connection is lost does).
type ackFailures struct {
	outbox.Store
	failures atomic.Int64
	calls    atomic.Int64
}

var errAckLost = errors.New("driver: bad connection")

func (s *ackFailures) ClaimDue(ctx context.Context, req outbox.ClaimRequest) (outbox.ClaimResult, error) {
	if len(req.Succeeded) > 0 {
		s.calls.Add(1)
		if s.failures.Add(-1) >= 0 {
			return outbox.ClaimResult{}, errAckLost
		}
	}
	return s.Store.ClaimDue(ctx, req)
}

func (s *ackFailures) MarkSuccess(ctx context.Context, ids []int64, owner string) (int64, error) {
	s.calls.Add(1)
	if s.failures.Add(-1) >= 0 {
		return 0, errAckLost
	}
	return s.Store.MarkSuccess(ctx, ids, owner)
}

// Acknowledgements that fail are kept and written before the next claim: the rows never
// wait for the lease while their owner is alive, and no event is sent twice. In Run a
// batch's successes ride the next claim; when that claim fails they are written on their
// own, round after round, until the store takes them.
func TestFailedAcknowledgementsAreRetriedNotResent(t *testing.T) {
	t.Parallel()
	for _, failures := range []int64{2, 7} { // recovered at once; still failing after the first retries
		t.Run(fmt.Sprintf("failures=%d", failures), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ids := b.insert(t, 4)
			store := &ackFailures{Store: b.store}
			store.failures.Store(failures)
			logs := &logSink{}
			rec := newRecorder()
			cfg := fastConfig("p", logs)
			cfg.Tuning.Lease = time.Hour
			cfg.Tuning.ClaimPerRow = false // one success write per round
			p := newPublisher(t, store, rec, cfg)
			stop := runPublisher(t, p)

			require.Eventually(t, func() bool { return b.countStatus(t, outbox.StatusSuccess) == len(ids) },
				20*time.Second, 10*time.Millisecond)
			stop() // the log line follows the write it reports
			for _, id := range ids {
				assert.Equal(t, 1, rec.count(id), "sent once: the outcome was kept, not the event resent")
			}
			assert.Equal(t, failures+1, store.calls.Load(), "the same write, tried until it took")
			assert.Equal(t, 1, logs.count(slog.LevelInfo, "recorded an outcome that had failed"))
			assert.Equal(t, 1, logs.count(slog.LevelError, "could not claim due events"), "the claim that carried them")
		})
	}
}

// When Run returns, no row is left SENDING under the instance's id, even one it did not
// know it held; another instance's rows are never touched.
func TestRunReleasesItsRowsWhenItReturns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 3)
	b.exec(t, "UPDATE {t} SET status = 'SENDING', claim_owner = 'p', claimed_at = UTC_TIMESTAMP(3) WHERE id = ?", ids[0])
	b.exec(t, "UPDATE {t} SET status = 'SENDING', claim_owner = 'other', claimed_at = UTC_TIMESTAMP(3) WHERE id = ?", ids[1])
	rec := newRecorder()
	p := newPublisher(t, b.store, rec, fastConfig("p", &logSink{}))
	stop := runPublisher(t, p)
	require.Eventually(t, func() bool { return rec.count(ids[2]) == 1 }, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, outbox.StatusSending, b.get(t, ids[0]).Status)
	stop()

	got := b.get(t, ids[0])
	assert.Equal(t, outbox.StatusWait, got.Status)
	assert.Empty(t, got.ClaimOwner)
	assert.Equal(t, 0, got.ReclaimCount)
	got = b.get(t, ids[1])
	assert.Equal(t, outbox.StatusSending, got.Status)
	assert.Equal(t, "other", got.ClaimOwner)
}

// Backoff limits: MaxBackoff caps any delay, NoRetries dead-letters at the first failure,
// RetryForever never does.
func TestRetryLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	failing := outbox.SenderFunc(func(context.Context, outbox.Event) error { return errBroker })

	t.Run("MaxBackoffCapsTheDelay", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insert(t, 1)[0]
		cfg := fastConfig("p", &logSink{})
		cfg.Backoff = func(int) time.Duration { return 10 * time.Hour }
		cfg.Tuning.MaxBackoff = 30 * time.Second
		_, err := newPublisher(t, b.store, failing, cfg).PublishPending(ctx)
		require.NoError(t, err)
		assert.InDelta(t, 30, b.secondsFromNow(t, id, "next_retry_time"), 1)
	})
	t.Run("NoRetries", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insert(t, 1)[0]
		cfg := fastConfig("p", &logSink{})
		cfg.MaxAttempts = 1
		stats, err := newPublisher(t, b.store, failing, cfg).PublishPending(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, stats.DeadLettered)
		assert.Equal(t, outbox.StatusFail, b.get(t, id).Status)
	})
	t.Run("RetryForever", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insert(t, 1)[0]
		b.exec(t, "UPDATE {t} SET retry_count = 1000000 WHERE id = ?", id)
		cfg := fastConfig("p", &logSink{})
		cfg.MaxAttempts = outbox.RetryForever
		stats, err := newPublisher(t, b.store, failing, cfg).PublishPending(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, stats.Retried)
		got := b.get(t, id)
		assert.Equal(t, outbox.StatusWait, got.Status)
		assert.Equal(t, 1000001, got.RetryCount)
		assert.InDelta(t, time.Hour.Seconds(), b.secondsFromNow(t, id, "next_retry_time"), 1, "the default MaxBackoff")
	})
}

func TestDefaultBackoffNeverOverflows(t *testing.T) {
	t.Parallel()
	assert.Equal(t, 5*time.Second, outbox.DefaultBackoff(1))
	assert.Equal(t, 45*time.Second, outbox.DefaultBackoff(3))
	prev := time.Duration(0)
	for _, n := range []int{1, 10, 1000, 100_000, 1 << 20, 1 << 30, 1 << 40, 1<<62 + 7} {
		d := outbox.DefaultBackoff(n)
		assert.GreaterOrEqual(t, d, prev, "n=%d", n)
		prev = d
	}
	assert.Zero(t, outbox.DefaultBackoff(0))
	assert.Zero(t, outbox.DefaultBackoff(-5))
}

// An event reclaimed for the MaxReclaims-th time is dead-lettered by the reclaim, and
// OnDeadLetter hears of it.
func TestReclaimDeadLettersAPoisonEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 2)
	b.exec(t, "UPDATE {t} SET status = 'SENDING', claim_owner = 'dead', reclaim_count = 1, claimed_at = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 MINUTE) WHERE id IN (?, ?)", ids[0], ids[1])
	b.exec(t, "UPDATE {t} SET reclaim_count = 0 WHERE id = ?", ids[1])
	var told []outbox.Event
	logs := &logSink{}
	cfg := fastConfig("p", logs)
	cfg.Tuning.MaxReclaims = 2
	cfg.OnDeadLetter = func(_ context.Context, ev outbox.Event, cause error) {
		told = append(told, ev)
		assert.ErrorContains(t, cause, "reclaimed 2 times")
	}
	n, err := newPublisher(t, b.store, newRecorder(), cfg).Reclaim(context.Background())
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
	require.Len(t, told, 1)
	assert.Equal(t, ids[0], told[0].ID)
	assert.Equal(t, outbox.StatusFail, b.get(t, ids[0]).Status)
	assert.Equal(t, outbox.StatusWait, b.get(t, ids[1]).Status)
	assert.Equal(t, 1, logs.count(slog.LevelError, "dead-lettered"))
}

// When a probe gets through, the events that waited out the outage go at once, not after
// the poll interval.
func TestOutageEndsWithoutWaitingForThePoll(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 5)
	sender := newSwitchSender()
	sender.down.Store(true)
	cfg := fastConfig("p", &logSink{})
	cfg.PollInterval = time.Hour
	cfg.Tuning.MaxProbeDelay = 50 * time.Millisecond
	p := newPublisher(t, b.store, sender, cfg)
	runPublisher(t, p)
	require.Eventually(t, func() bool { return p.Health().BrokerUnavailable }, 10*time.Second, 5*time.Millisecond)

	sender.down.Store(false)
	require.Eventually(t, func() bool { return b.countStatus(t, outbox.StatusSuccess) == len(ids) },
		10*time.Second, 10*time.Millisecond, "sent at once after the probe, with an hour's poll interval")
	for _, id := range ids {
		assert.Equal(t, 1, sender.count(id))
	}
}

// A claim cut short (by a reclaimed event, which goes alone, or by MaxClaimBytes) leaves
// due events behind: the next round takes them at once, not after the poll interval.
func TestClaimCutShortIsFollowedAtOnce(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"ReclaimedEvents", "MaxClaimBytes"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ids := b.insert(t, 10)
			cfg := fastConfig("p", &logSink{})
			cfg.Tuning.ClaimPerRow = false // cut-short claims are the batch claim's
			cfg.PollInterval = time.Hour
			if name == "ReclaimedEvents" {
				for _, id := range ids[:5] {
					b.exec(t, "UPDATE {t} SET reclaim_count = 1 WHERE id = ?", id)
				}
			} else {
				cfg.Tuning.MaxClaimBytes = 1 // one event per claim
			}
			rec := newRecorder()
			runPublisher(t, newPublisher(t, b.store, rec, cfg))
			require.Eventually(t, func() bool { return b.countStatus(t, outbox.StatusSuccess) == len(ids) },
				10*time.Second, 10*time.Millisecond, "with an hour's poll interval")
			for _, id := range ids {
				assert.Equal(t, 1, rec.count(id))
			}
		})
	}
}

// An event the broker stored without confirming it flushed or replicated in time
// (ErrUnconfirmed: RocketMQ's FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE)
// counts as sent: SUCCESS, no attempt spent, never sent again, counted in
// outbox.events.unconfirmed and logged at warn; in key order its biz no goes on in the same
// round. A fault alone dead-letters nothing, even with MaxAttempts 1.
func TestUnconfirmedSendCountsAsSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testsvc.OpenDB(t)
	b := &bundle{db: db, store: testsvc.NewStore(t, db, outbox.MySQLConfig{Ordering: outbox.KeyOrder})}
	first := b.insertInput(t, outbox.EventInput{BizNo: "ORD-1", EventType: "ORDER_CREATED", Payload: []byte("{}")})
	second := b.insertInput(t, outbox.EventInput{BizNo: "ORD-1", EventType: "ORDER_PAID", Payload: []byte("{}")})
	var mu sync.Mutex
	calls := map[int64]int{}
	sender := outbox.SenderFunc(func(_ context.Context, ev outbox.Event) error {
		mu.Lock()
		defer mu.Unlock()
		calls[ev.ID]++
		if ev.ID == first {
			return fmt.Errorf("rocketmq: send stored, not confirmed: status 2 (FLUSH_SLAVE_TIMEOUT): %w", outbox.ErrUnconfirmed)
		}
		return nil
	})
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(ctx) })
	logs := &logSink{}
	cfg := fastConfig("unconfirmed", logs)
	cfg.MaxAttempts, cfg.MeterProvider = 1, provider
	p := newPublisher(t, b.store, sender, cfg)
	sent := 0
	for range 3 {
		stats, err := p.PublishPending(ctx)
		require.NoError(t, err)
		assert.Zero(t, stats.Retried+stats.DeadLettered, "%+v", stats)
		sent += stats.Sent
	}
	assert.Equal(t, 2, sent)
	for _, id := range []int64{first, second} {
		ev := b.get(t, id)
		assert.Equal(t, outbox.StatusSuccess, ev.Status, "event %d", id)
		assert.Zero(t, ev.RetryCount, "event %d: no attempt spent", id)
	}
	assert.Equal(t, map[int64]int{first: 1, second: 1}, calls, "each sent once")
	assert.Equal(t, 1, logs.count(slog.LevelWarn, "did not confirm it flushed or replicated in time"))
	c := collect(t, reader)
	assert.Equal(t, map[string]float64{"event_type=ORDER_CREATED,topic=ORDER_EVENT_TOPIC": 1}, c.values["outbox.events.unconfirmed"])
	total := 0.0
	for _, v := range c.values["outbox.events.sent"] {
		total += v
	}
	assert.Equal(t, 2.0, total, "counted in the sent events too")
}

// In key order, a send that finds its biz no's queue unavailable while other events of the
// round were sent to the same topic (one of two brokers away) spends no attempt: the event
// goes back to WAIT due a second later by the database's clock, with an "unavailable"
// failure in its history, and its biz no's later event waits behind it; the other biz no's
// events are sent. In both claim modes, through PublishPending (Run's rounds decide alike:
// TestKeyOrderSurvivesABrokerAwayLongerThanItsRetries).
func TestKeyOrderUnavailableQueueWhileOthersAreSentCountsNothing(t *testing.T) {
	t.Parallel()
	b := orderedSetup(t)
	ids := b.insertKeys(t, []string{"HERE", "AWAY"}, 2)
	sender := newSwitchSender()
	sender.recorder.fail = func(ev outbox.Event) error {
		if ev.BizNo == "AWAY" {
			return outbox.Unavailable(errors.New("the topic=T route info not found"))
		}
		return nil
	}
	p := newPublisher(t, b.store, sender, fastConfig("p", &logSink{}))
	for range 2 { // per-row rounds take one event of a biz no a round
		_, err := p.PublishPending(context.Background())
		require.NoError(t, err)
	}
	assert.False(t, p.Health().BrokerUnavailable, "a queue away is no outage")
	for _, id := range ids["HERE"] {
		assert.Equal(t, outbox.StatusSuccess, b.get(t, id).Status)
	}
	first := b.get(t, ids["AWAY"][0])
	assert.Equal(t, outbox.StatusWait, first.Status)
	assert.Zero(t, first.RetryCount, "no attempt spent")
	if assert.NotEmpty(t, first.Failures) {
		assert.Equal(t, "unavailable", first.Failures[len(first.Failures)-1].Class)
	}
	var wait int64
	require.NoError(t, b.db.QueryRow("SELECT TIMESTAMPDIFF(MICROSECOND, update_time, next_retry_time) FROM `"+outbox.TableForTest(b.store)+
		"` WHERE id = ?", first.ID).Scan(&wait))
	assert.Equal(t, time.Second.Microseconds(), wait, "due a second after its release")
	later := b.get(t, ids["AWAY"][1])
	assert.Equal(t, outbox.StatusWait, later.Status)
	assert.Zero(t, later.RetryCount)
	assert.Empty(t, later.Failures, "never tried")
}
