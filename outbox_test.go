package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

var errBroker = errors.New("broker unavailable")

func TestInsertEventRollbackLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tx, err := b.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	id, err := outbox.InsertForTest(ctx, tx, outbox.EventInput{BizNo: "ORD-1", EventType: "ORDER_CREATED", Payload: []byte("{}")})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())

	_, err = b.admin().Get(ctx, id)
	require.ErrorIs(t, err, outbox.ErrNotFound)
	evs, err := b.store.Candidates(ctx, 10)
	require.NoError(t, err)
	assert.Empty(t, evs)
}

// An event is invisible to publishers (on their own pools) until its transaction commits,
// and it commits together with the business row written in the same transaction.
func TestInsertEventCommitMakesItPublishable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	orders := testsvc.UniqueTable("orders")
	b.exec(t, "CREATE TABLE `"+orders+"` (order_no VARCHAR(64) PRIMARY KEY)")
	t.Cleanup(func() { b.exec(t, "DROP TABLE `"+orders+"`") })

	other, err := outbox.NewMySQLStore(testsvc.OpenDB(t), outbox.MySQLConfig{Table: outbox.TableForTest(b.store)})
	require.NoError(t, err)

	tx, err := b.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, "INSERT INTO `"+orders+"` (order_no) VALUES ('ORD-9')")
	require.NoError(t, err)
	id, err := outbox.InsertForTest(ctx, tx, outbox.EventInput{BizNo: "ORD-9", EventType: "ORDER_CREATED", Payload: []byte(`{"n":9}`)})
	require.NoError(t, err)

	evs, err := other.Candidates(ctx, 10)
	require.NoError(t, err)
	assert.Empty(t, evs, "uncommitted events are not candidates")

	require.NoError(t, tx.Commit())
	evs, err = other.Candidates(ctx, 10)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	assert.Equal(t, id, evs[0].ID)
	assert.Equal(t, "ORD-9", evs[0].BizNo)
	assert.Equal(t, []byte(`{"n":9}`), evs[0].Payload)
	got := b.get(t, id)
	assert.Equal(t, outbox.StatusWait, got.Status)
	assert.InDelta(t, 0, b.secondsFromNow(t, id, "next_retry_time"), 1, "due at the database's now")
}

// WrapTx writes the event in a transaction the caller began itself.
func TestWrapTxUsesCallersTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	sqlTx, err := b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	id, err := outbox.InsertForTest(ctx, b.store.WrapTx(sqlTx), outbox.EventInput{BizNo: "ORD-2", EventType: "ORDER_PAID", Payload: []byte("{}")})
	require.NoError(t, err)
	require.NoError(t, sqlTx.Rollback())
	_, err = b.admin().Get(ctx, id)
	require.ErrorIs(t, err, outbox.ErrNotFound, "rolled back with the caller's transaction")

	sqlTx, err = b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	id, err = outbox.InsertForTest(ctx, b.store.WrapTx(sqlTx), outbox.EventInput{BizNo: "ORD-2", EventType: "ORDER_PAID", Payload: []byte("{}")})
	require.NoError(t, err)
	require.NoError(t, sqlTx.Commit())
	got := b.get(t, id)
	assert.Equal(t, "ORDER_PAID", got.EventType)
}

func TestInsertEventRefusesInvalidInput(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	store := testsvc.NewStore(t, db, outbox.MySQLConfig{MaxPayloadBytes: 1024})
	valid := outbox.EventInput{BizNo: "ORD-1", EventType: "ORDER_CREATED", Payload: []byte("x")}
	cases := []struct {
		name   string
		mutate func(*outbox.EventInput)
		want   string
		is     error
	}{
		{"EmptyBizNo", func(e *outbox.EventInput) { e.BizNo = "" }, "BizNo is empty", outbox.ErrInvalidEvent},
		{"EmptyEventType", func(e *outbox.EventInput) { e.EventType = "" }, "EventType is empty", outbox.ErrInvalidEvent},
		{"LongBizNo", func(e *outbox.EventInput) { e.BizNo = strings.Repeat("9", 65) }, "BizNo is 65 characters, at most 64", outbox.ErrInvalidEvent},
		{"LongEventType", func(e *outbox.EventInput) { e.EventType = strings.Repeat("E", 65) }, "EventType is 65 characters", outbox.ErrInvalidEvent},
		{"ControlCharInBizNo", func(e *outbox.EventInput) { e.BizNo = "ORD\x011" }, "control character", outbox.ErrInvalidEvent},
		{"NewlineInEventType", func(e *outbox.EventInput) { e.EventType = "ORDER\nCREATED" }, "control character", outbox.ErrInvalidEvent},
		{"InvalidUTF8", func(e *outbox.EventInput) { e.BizNo = "ORD-\xff" }, "not valid UTF-8", outbox.ErrInvalidEvent},
		{"PayloadOverLimit", func(e *outbox.EventInput) { e.Payload = make([]byte, 1025) }, "1025 bytes, the limit is 1024", outbox.ErrPayloadTooLarge},
	}
	ctx := context.Background()
	tx, err := store.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := valid
			c.mutate(&in)
			_, err := tx.InsertEvent(ctx, in)
			require.ErrorIs(t, err, c.is)
			assert.Contains(t, err.Error(), c.want)
		})
	}
	// Limits are inclusive, and a refused event wrote nothing into the transaction.
	atLimit := valid
	atLimit.Payload, atLimit.BizNo = make([]byte, 1024), strings.Repeat("9", 64)
	_, err = tx.InsertEvent(ctx, atLimit)
	require.NoError(t, err)
	var n int
	require.NoError(t, tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+outbox.TableForTest(store)+"`").Scan(&n))
	assert.Equal(t, 1, n)
}

func TestNewMySQLStoreRejectsBadConfig(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	cases := []struct {
		name string
		cfg  outbox.MySQLConfig
		want string
	}{
		{"TableWithQuote", outbox.MySQLConfig{Table: "t`; DROP TABLE x"}, "table name"},
		{"TableWithDot", outbox.MySQLConfig{Table: "db.t_event"}, "table name"},
		{"TableNotASCII", outbox.MySQLConfig{Table: "évents"}, "table name"},
		{"TableTooLong", outbox.MySQLConfig{Table: strings.Repeat("t", 65)}, "table name"},
		{"NegativePayloadLimit", outbox.MySQLConfig{MaxPayloadBytes: -1}, "MaxPayloadBytes"},
		{"PayloadLimitOverColumn", outbox.MySQLConfig{MaxPayloadBytes: 1 << 24}, "MaxPayloadBytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := outbox.NewMySQLStore(db, c.cfg)
			require.ErrorIs(t, err, outbox.ErrInvalidConfig)
			assert.Contains(t, err.Error(), c.want)
		})
	}
	t.Run("NilDB", func(t *testing.T) {
		_, err := outbox.NewMySQLStore(nil, outbox.MySQLConfig{})
		require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	})
	t.Run("Defaults", func(t *testing.T) {
		s, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{})
		require.NoError(t, err)
		assert.Equal(t, "t_event_record", outbox.TableForTest(s))
	})
}

func TestNewPublisherRejectsBadConfig(t *testing.T) {
	t.Parallel()
	store, _ := outbox.NewMySQLStore(testsvc.OpenDB(t), outbox.MySQLConfig{})
	sender := newRecorder()
	cases := []struct {
		name string
		cfg  outbox.Config
		want string
	}{
		{"NegativeBatchSize", outbox.Config{Tuning: outbox.Tuning{BatchSize: -1}}, "Tuning.BatchSize must be positive"},
		{"NegativePollInterval", outbox.Config{PollInterval: -time.Second}, "PollInterval must be positive"},
		{"NegativeReclaimInterval", outbox.Config{Tuning: outbox.Tuning{ReclaimInterval: -time.Second}}, "Tuning.ReclaimInterval must be positive"},
		{"NegativeLease", outbox.Config{Tuning: outbox.Tuning{Lease: -time.Minute}}, "Tuning.Lease must be positive"},
		{"NegativeMaxAttempts", outbox.Config{MaxAttempts: -2}, "MaxAttempts must be positive, got -2"},
		{"NegativeMaxBackoff", outbox.Config{Tuning: outbox.Tuning{MaxBackoff: -time.Second}}, "Tuning.MaxBackoff must be positive"},
		{"MaxBackoffOverAYear", outbox.Config{Tuning: outbox.Tuning{MaxBackoff: 400 * 24 * time.Hour}}, "Tuning.MaxBackoff must be at most"},
		{"NegativeMaxReclaims", outbox.Config{Tuning: outbox.Tuning{MaxReclaims: -1}}, "Tuning.MaxReclaims must be positive"},
		{"NegativeMaxClaimBytes", outbox.Config{Tuning: outbox.Tuning{MaxClaimBytes: -1}}, "Tuning.MaxClaimBytes must be positive"},
		{"NegativeMaxProbeDelay", outbox.Config{Tuning: outbox.Tuning{MaxProbeDelay: -time.Second}}, "Tuning.MaxProbeDelay must be positive"},
		{"NegativeCoalesceDelay", outbox.Config{Tuning: outbox.Tuning{CoalesceDelay: -time.Millisecond}}, "Tuning.CoalesceDelay must be positive"},
		{"CoalesceDelayOverASecond", outbox.Config{Tuning: outbox.Tuning{CoalesceDelay: 2 * time.Second}}, "Tuning.CoalesceDelay must be at most 1s"},
		{"NegativeSendTimeout", outbox.Config{Tuning: outbox.Tuning{SendTimeout: -time.Second}}, "Tuning.SendTimeout must be positive"},
		{"SendTimeoutTooShort", outbox.Config{Tuning: outbox.Tuning{SendTimeout: time.Millisecond}}, "Tuning.SendTimeout must be at least 10ms, got 1ms"},
		{"NegativeStoreTimeout", outbox.Config{Tuning: outbox.Tuning{StoreTimeout: -time.Second}}, "Tuning.StoreTimeout must be positive"},
		{"LeaseUnderASecond", outbox.Config{Tuning: outbox.Tuning{Lease: 500 * time.Millisecond, SendTimeout: time.Millisecond}}, "Tuning.Lease must be at least 1s"},
		{"InstanceIDTooLong", outbox.Config{InstanceID: strings.Repeat("é", 65)}, "InstanceID is 65 characters, at most 64"},
		{"InstanceIDWithSpaces", outbox.Config{InstanceID: " order-1 "}, "without surrounding spaces"},
		{"InstanceIDInvalidUTF8", outbox.Config{InstanceID: "order-\xff"}, "valid UTF-8"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := outbox.NewPublisher(store, sender, c.cfg)
			require.ErrorIs(t, err, outbox.ErrInvalidConfig)
			assert.Contains(t, err.Error(), c.want)
		})
	}
	t.Run("NilStore", func(t *testing.T) {
		_, err := outbox.NewPublisher(nil, sender, outbox.Config{})
		require.ErrorIs(t, err, outbox.ErrInvalidConfig)
		assert.Contains(t, err.Error(), "store is nil")
	})
	t.Run("NilSender", func(t *testing.T) {
		_, err := outbox.NewPublisher(store, nil, outbox.Config{})
		require.ErrorIs(t, err, outbox.ErrInvalidConfig)
		assert.Contains(t, err.Error(), "sender is nil")
	})
	t.Run("SendTimeoutExactlyATenthIsAccepted", func(t *testing.T) {
		_, err := outbox.NewPublisher(store, sender, outbox.Config{Tuning: outbox.Tuning{Lease: 10 * time.Second, SendTimeout: time.Second}})
		require.NoError(t, err)
	})
}

func TestDefaultInstanceID(t *testing.T) {
	t.Parallel()
	a, b := outbox.DefaultInstanceID(), outbox.DefaultInstanceID()
	assert.NotEqual(t, a, b, "two publishers in one process still differ")
	parts := strings.Split(a, "-")
	require.GreaterOrEqual(t, len(parts), 3)
	assert.Len(t, parts[len(parts)-1], 6, "a 6-hex-digit random suffix")
	assert.LessOrEqual(t, len(a), 128)

	store, _ := outbox.NewMySQLStore(testsvc.OpenDB(t), outbox.MySQLConfig{})
	p := newPublisher(t, store, newRecorder(), outbox.Config{})
	assert.NotEmpty(t, p.Health().InstanceID)
	p = newPublisher(t, store, newRecorder(), outbox.Config{InstanceID: "order-8083-a1b2c3"})
	assert.Equal(t, "order-8083-a1b2c3", p.Health().InstanceID)
}

func TestDefaultBackoff(t *testing.T) {
	t.Parallel()
	for n, want := range map[int]time.Duration{1: 5 * time.Second, 2: 20 * time.Second, 3: 45 * time.Second, 4: 80 * time.Second} {
		assert.Equal(t, want, outbox.DefaultBackoff(n), "retry %d", n)
	}
}

// RetryPolicy is the rule the publisher and the relay share: a dead letter at MaxAttempts
// or for a permanent error, never with RetryForever; else a retry after the backoff, kept
// between zero and MaxBackoff; zero fields take the publisher's defaults.
func TestRetryPolicy(t *testing.T) {
	t.Parallel()
	retry := errors.New("a failure to retry")
	huge := func(int) time.Duration { return 1000 * time.Hour }
	for _, c := range []struct {
		policy  outbox.RetryPolicy
		attempt int
		cause   error
		delay   time.Duration
		dead    bool
	}{
		{outbox.RetryPolicy{}, 1, retry, 5 * time.Second, false},
		{outbox.RetryPolicy{}, 3, retry, 45 * time.Second, false},
		{outbox.RetryPolicy{}, 4, retry, 0, true},
		{outbox.RetryPolicy{}, 1, outbox.Permanent(retry), 0, true},
		{outbox.RetryPolicy{MaxAttempts: 1}, 1, retry, 0, true},
		{outbox.RetryPolicy{MaxAttempts: outbox.RetryForever}, 1 << 30, retry, time.Hour, false},
		{outbox.RetryPolicy{Backoff: huge}, 1, retry, time.Hour, false},
		{outbox.RetryPolicy{Backoff: huge, MaxBackoff: 2 * time.Second}, 2, retry, 2 * time.Second, false},
		{outbox.RetryPolicy{Backoff: func(int) time.Duration { return -time.Second }}, 1, retry, 0, false},
	} {
		delay, dead := c.policy.Next(c.attempt, c.cause)
		assert.Equal(t, c.dead, dead, "%+v attempt %d", c.policy.MaxAttempts, c.attempt)
		assert.Equal(t, c.delay, delay, "%+v attempt %d", c.policy.MaxAttempts, c.attempt)
	}
}

func TestPermanentErrors(t *testing.T) {
	t.Parallel()
	assert.Nil(t, outbox.Permanent(nil))
	err := fmt.Errorf("send: %w", outbox.Permanent(errBroker))
	assert.True(t, outbox.IsPermanent(err))
	assert.ErrorIs(t, err, errBroker)
	assert.False(t, outbox.IsPermanent(errBroker))
}

func TestPublishPendingSendsEachEventOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 5)
	logs := &logSink{}
	rec := newRecorder()
	p := newPublisher(t, b.store, rec, fastConfig("order-8083-a1b2c3", logs))

	stats, err := p.PublishPending(context.Background())
	require.NoError(t, err)
	assert.Equal(t, outbox.RoundStats{Candidates: 5, Claimed: 5, Sent: 5}, stats)
	for i, id := range ids {
		assert.Equal(t, 1, rec.count(id))
		got := b.get(t, id)
		assert.Equal(t, outbox.StatusSuccess, got.Status)
		assert.Equal(t, "order-8083-a1b2c3", got.ClaimOwner)
		assert.Equal(t, fmt.Sprintf("ORD-%d", i), rec.evs[i].BizNo)
		assert.Equal(t, fmt.Appendf(nil, `{"order":%d}`, i), rec.evs[i].Payload)
	}
	if testPerRow {
		assert.Equal(t, 5, logs.count(slog.LevelInfo, "event sent"), "one info line per send")
	} else {
		assert.Equal(t, 1, logs.count(slog.LevelInfo, "events sent"), "one info line per batch")
	}
	assert.Empty(t, logs.atLeast(slog.LevelWarn))

	stats, err = p.PublishPending(context.Background())
	require.NoError(t, err)
	assert.Equal(t, outbox.RoundStats{}, stats, "nothing left to send")
}

func TestPublishPendingRespectsBatchSize(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, 25)
	cfg := fastConfig("p", &logSink{})
	cfg.Tuning.BatchSize = 20
	p := newPublisher(t, b.store, newRecorder(), cfg)
	stats, err := p.PublishPending(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 20, stats.Sent)
	assert.Equal(t, 5, b.countStatus(t, outbox.StatusWait))
}

// The article's backoff by the database clock: 5 s, 20 s, 45 s after the 1st, 2nd, 3rd failed
// attempt, then the 4th failure dead-letters the event with retry_count 4, logs at error and
// calls OnDeadLetter once.
func TestFailedSendBacksOffThenDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 1)[0]
	logs := &logSink{}
	var deadMu sync.Mutex
	var dead []outbox.Event
	cfg := fastConfig("p", logs)
	cfg.Backoff = nil // the article's
	cfg.OnDeadLetter = func(_ context.Context, ev outbox.Event, cause error) {
		deadMu.Lock()
		defer deadMu.Unlock()
		assert.ErrorIs(t, cause, errBroker)
		dead = append(dead, ev)
	}
	attempts := 0
	sender := outbox.SenderFunc(func(context.Context, outbox.Event) error { attempts++; return errBroker })
	p := newPublisher(t, b.store, sender, cfg)
	ctx := context.Background()

	for n, wantDelay := range []float64{5, 20, 45} {
		stats, err := p.PublishPending(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, stats.Retried)
		got := b.get(t, id)
		assert.Equal(t, outbox.StatusWait, got.Status)
		assert.Equal(t, n+1, got.RetryCount)
		assert.Empty(t, got.ClaimOwner)
		assert.Equal(t, errBroker.Error(), got.LastError)
		assert.InDelta(t, wantDelay, b.secondsFromNow(t, id, "next_retry_time"), 1, "retry %d", n+1)

		stats, err = p.PublishPending(ctx)
		require.NoError(t, err)
		assert.Zero(t, stats.Candidates, "not due before its backoff has passed")
		b.makeDue(t, id)
	}
	stats, err := p.PublishPending(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, stats.DeadLettered)
	got := b.get(t, id)
	assert.Equal(t, outbox.StatusFail, got.Status)
	assert.Equal(t, 4, got.RetryCount)
	assert.Equal(t, 4, attempts, "the first send and three retries")
	require.Len(t, dead, 1)
	assert.Equal(t, outbox.StatusFail, dead[0].Status)
	assert.Equal(t, 4, dead[0].RetryCount)
	assert.Equal(t, 3, logs.count(slog.LevelWarn, "will retry"))
	assert.Equal(t, 1, logs.count(slog.LevelError, "dead-lettered"))

	// A dead letter is never picked up again by itself; a person can requeue it.
	b.makeDue(t, id)
	stats, err = p.PublishPending(ctx)
	require.NoError(t, err)
	assert.Zero(t, stats.Candidates)
	require.NoError(t, b.admin().Requeue(ctx, id))
	p2 := newPublisher(t, b.store, newRecorder(), fastConfig("p2", logs))
	stats, err = p2.PublishPending(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, stats.Sent)
	assert.Len(t, dead, 1, "the callback ran once")
}

func TestCustomBackoffAndMaxRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 1)[0]
	cfg := fastConfig("p", &logSink{})
	cfg.MaxAttempts = 2
	cfg.Backoff = func(int) time.Duration { return 2 * time.Minute }
	p := newPublisher(t, b.store, outbox.SenderFunc(func(context.Context, outbox.Event) error { return errBroker }), cfg)
	_, err := p.PublishPending(context.Background())
	require.NoError(t, err)
	assert.InDelta(t, 120, b.secondsFromNow(t, id, "next_retry_time"), 1)
	b.makeDue(t, id)
	_, err = p.PublishPending(context.Background())
	require.NoError(t, err)
	got := b.get(t, id)
	assert.Equal(t, outbox.StatusFail, got.Status)
	assert.Equal(t, 2, got.RetryCount)
}

func TestPermanentErrorDeadLettersAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 1)[0]
	var calls atomic.Int32
	cfg := fastConfig("p", &logSink{})
	cfg.OnDeadLetter = func(context.Context, outbox.Event, error) { calls.Add(1) }
	p := newPublisher(t, b.store, outbox.SenderFunc(func(context.Context, outbox.Event) error {
		return outbox.Permanent(errors.New("message body too large"))
	}), cfg)
	stats, err := p.PublishPending(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, stats.DeadLettered)
	got := b.get(t, id)
	assert.Equal(t, outbox.StatusFail, got.Status)
	assert.Equal(t, 1, got.RetryCount)
	assert.Contains(t, got.LastError, "message body too large")
	assert.Equal(t, int32(1), calls.Load())
}

// One event's panic, or a store error on one event's outcome, is logged and the round goes on.
func TestOneEventNeverAbortsTheRound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 4)
	logs := &logSink{}
	rec := newRecorder()
	rec.fail = func(ev outbox.Event) error {
		switch ev.ID {
		case ids[1]:
			panic("sender bug")
		case ids[2]:
			return errBroker
		}
		return nil
	}
	store := &hookStore{Store: b.store, beforeRelease: func(_ context.Context, id int64) error {
		if id == ids[2] {
			return errors.New("connection reset")
		}
		return nil
	}}
	p := newPublisher(t, store, rec, fastConfig("p", logs))
	stats, err := p.PublishPending(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 4, stats.Claimed, "every claim was won, recorded or not")
	assert.Equal(t, 2, stats.Sent)
	assert.Equal(t, 1, stats.Retried, "a panic in the sender is a failed attempt")
	assert.Equal(t, 1, stats.Errors)
	assert.Equal(t, outbox.StatusSuccess, b.get(t, ids[0]).Status)
	panicked := b.get(t, ids[1])
	assert.Equal(t, outbox.StatusWait, panicked.Status)
	assert.Contains(t, panicked.LastError, "sender bug")
	assert.Equal(t, outbox.StatusSending, b.get(t, ids[2]).Status, "unrecorded: left for the reclaim")
	assert.Equal(t, outbox.StatusSuccess, b.get(t, ids[3]).Status)
	assert.Equal(t, 1, logs.count(slog.LevelError, "could not record retry"))
}

// A failed claim is logged, and the next round claims and sends as usual.
func TestClaimErrorIsLoggedAndTheNextRoundRecovers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, 3)
	logs := &logSink{}
	var fail atomic.Bool
	fail.Store(true)
	store := &hookStore{Store: b.store, beforeClaim: func(context.Context, outbox.Event) error {
		if fail.Load() {
			return errors.New("connection reset")
		}
		return nil
	}}
	p := newPublisher(t, store, newRecorder(), fastConfig("p", logs))
	stats, err := p.PublishPending(context.Background())
	assert.Zero(t, stats.Sent)
	if testPerRow {
		require.NoError(t, err, "per row, a claim error is one event's")
		assert.Equal(t, 3, stats.Errors)
		assert.Zero(t, stats.Claimed)
	} else {
		require.ErrorContains(t, err, "connection reset", "a batch claim error is the round's")
	}
	assert.Positive(t, logs.count(slog.LevelError, "claim"))
	assert.Equal(t, 3, b.countStatus(t, outbox.StatusWait), "nothing was claimed")

	fail.Store(false)
	stats, err = p.PublishPending(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 3, stats.Sent)
}

// A panic in the store, in the claim or in recording an outcome, is caught and logged.
func TestStorePanicIsCaught(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 3)
	logs := &logSink{}
	var claimPanics atomic.Bool
	claimPanics.Store(true)
	store := &hookStore{
		Store: b.store,
		beforeClaim: func(context.Context, outbox.Event) error {
			if claimPanics.Load() {
				panic("store bug in claim")
			}
			return nil
		},
		beforeRelease: func(_ context.Context, id int64) error {
			if id == ids[0] {
				panic("store bug in release")
			}
			return nil
		},
	}
	rec := newRecorder()
	rec.fail = func(ev outbox.Event) error {
		if ev.ID == ids[0] || ev.ID == ids[1] {
			return errBroker
		}
		return nil
	}
	p := newPublisher(t, store, rec, fastConfig("p", logs))
	stats, _ := p.PublishPending(context.Background())
	assert.Positive(t, stats.Errors)
	assert.Zero(t, rec.total())

	claimPanics.Store(false)
	stats, err := p.PublishPending(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, stats.Errors, "the release that panicked")
	assert.Equal(t, 1, stats.Retried)
	assert.Equal(t, 1, stats.Sent)
	assert.Equal(t, outbox.StatusSending, b.get(t, ids[0]).Status)
	assert.Equal(t, outbox.StatusWait, b.get(t, ids[1]).Status)
	assert.Equal(t, outbox.StatusSuccess, b.get(t, ids[2]).Status)
	assert.Positive(t, logs.count(slog.LevelError, "panic"))
}

// A claim lost to another instance is normal: a debug line, nothing louder.
func TestLostClaimIsQuiet(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 3)
	logs := &logSink{}
	rival := newPublisher(t, b.store, newRecorder(), fastConfig("rival", &logSink{}))
	store := &hookStore{Store: b.store, afterCandidates: func(ctx context.Context, _ []outbox.Event) {
		// Between our SELECT and our claims, the rival takes everything.
		_, err := rival.PublishPending(ctx)
		assert.NoError(t, err)
	}}
	rec := newRecorder()
	p := newPublisher(t, store, rec, fastConfig("p", logs))
	stats, err := p.PublishPending(context.Background())
	require.NoError(t, err)
	if testPerRow {
		assert.Equal(t, outbox.RoundStats{Candidates: 3, Lost: 3}, stats)
		assert.Equal(t, 3, logs.count(slog.LevelDebug, "taken by another instance"))
	} else {
		// A batch claim skips rows others hold or have taken: there is no conflict at all.
		assert.Equal(t, outbox.RoundStats{}, stats)
	}
	assert.Zero(t, rec.total())
	assert.Empty(t, logs.atLeast(slog.LevelInfo))
	for _, id := range ids {
		assert.Equal(t, "rival", b.get(t, id).ClaimOwner)
	}
}

// blockingSender blocks every send until released, ignoring its context, as a client stuck
// in the network would.
type blockingSender struct {
	entered chan outbox.Event
	release chan error
}

func newBlockingSender() *blockingSender {
	return &blockingSender{entered: make(chan outbox.Event, 16), release: make(chan error, 16)}
}

func (s *blockingSender) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	return outbox.SenderFunc(s.sendOne).Send(ctx, evs, keyOrder)
}

func (s *blockingSender) Info() outbox.SenderInfo { return outbox.SenderInfo{} }

func (s *blockingSender) Check(context.Context, []string) error { return nil }

func (s *blockingSender) sendOne(_ context.Context, ev outbox.Event) error {
	s.entered <- ev
	return <-s.release
}

// SPEC 5.4 / Q1: A's send blocks past its lease; the row is reclaimed and sent by B; A's late
// success affects 0 rows and the row keeps B's state. Then the same with a late failure.
func TestLateOutcomeAfterReclaimKeepsNewOwnersState(t *testing.T) {
	t.Parallel()
	for _, late := range []error{nil, errBroker} {
		t.Run(fmt.Sprintf("late=%v", late), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			id := b.insert(t, 1)[0]
			logsA := &logSink{}
			slow := newBlockingSender()
			a := newPublisher(t, b.store, slow, fastConfig("A", logsA))
			recB := newRecorder()
			bPub := newPublisher(t, b.store, recB, fastConfig("B", &logSink{}))

			done := make(chan outbox.RoundStats)
			go func() {
				stats, err := a.PublishPending(context.Background())
				assert.NoError(t, err)
				done <- stats
			}()
			<-slow.entered
			b.ageClaim(t, id, 11*time.Second) // the lease (10 s) has run out

			n, err := bPub.Reclaim(context.Background())
			require.NoError(t, err)
			require.Equal(t, int64(1), n)
			stats, err := bPub.PublishPending(context.Background())
			require.NoError(t, err)
			require.Equal(t, 1, stats.Sent)

			slow.release <- late
			statsA := <-done
			assert.Equal(t, 1, statsA.LeaseLost)
			got := b.get(t, id)
			assert.Equal(t, outbox.StatusSuccess, got.Status)
			assert.Equal(t, "B", got.ClaimOwner)
			assert.Equal(t, 0, got.RetryCount, "A's late failure counted nothing")
			assert.Equal(t, 1, recB.count(id))
			assert.Equal(t, 1, logsA.count(slog.LevelWarn, "lease"))
		})
	}
}

// Batch mode never claims more than it can send within SendTimeout: events whose turn has not
// come when the batch's send deadline passes are released unsent (no retry counted), and the
// next claim is smaller.
func TestBatchClaimShrinksToWhatCanBeSentInTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, 40)
	cfg := fastConfig("p", &logSink{})
	cfg.Tuning.ClaimPerRow = false // this test is about the batch claim, in either run
	cfg.Tuning.BatchSize = 32
	cfg.Tuning.SendTimeout = 200 * time.Millisecond
	slow := outbox.SenderFunc(func(context.Context, outbox.Event) error {
		time.Sleep(20 * time.Millisecond)
		return nil
	})
	p := newPublisher(t, b.store, slow, cfg)
	first, err := p.PublishPending(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 32, first.Candidates)
	assert.Positive(t, first.Released, "the send deadline came before every event's turn")
	assert.Equal(t, first.Candidates, first.Sent+first.Released)
	assert.Zero(t, b.countStatus(t, outbox.StatusSending))
	var retried int
	require.NoError(t, b.db.QueryRow("SELECT COUNT(*) FROM `"+outbox.TableForTest(b.store)+"` WHERE retry_count > 0").Scan(&retried))
	assert.Zero(t, retried, "a release for lack of time is not a failed attempt")

	second, err := p.PublishPending(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 16, second.Candidates, "the claim halved")
}

// SendTimeout bounds a send that honours its context; the timeout is a failed attempt.
func TestSendTimeoutBoundsTheSend(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 1)[0]
	cfg := fastConfig("p", &logSink{})
	cfg.Tuning.SendTimeout = 50 * time.Millisecond
	p := newPublisher(t, b.store, outbox.SenderFunc(func(ctx context.Context, _ outbox.Event) error {
		<-ctx.Done()
		return ctx.Err()
	}), cfg)
	stats, err := p.PublishPending(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, stats.Retried)
	got := b.get(t, id)
	assert.Equal(t, 1, got.RetryCount)
	assert.Contains(t, got.LastError, "deadline exceeded")
}

func TestReclaimLogsAtWarn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 2)
	logs := &logSink{}
	p := newPublisher(t, b.store, newRecorder(), fastConfig("p", logs))
	n, err := p.Reclaim(context.Background())
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.Empty(t, logs.atLeast(slog.LevelWarn), "nothing reclaimed, nothing said")

	for _, id := range ids {
		b.exec(t, "UPDATE {t} SET status = 'SENDING', claim_owner = 'dead', claimed_at = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 MINUTE) WHERE id = ?", id)
	}
	n, err = p.Reclaim(context.Background())
	require.NoError(t, err)
	assert.Equal(t, int64(2), n)
	assert.Equal(t, 1, logs.count(slog.LevelWarn, "reclaimed"))
}

// Instances whose connections have different session time zones agree on every lease and
// retry time: they all use the database's UTC clock.
func TestSessionTimeZonesDoNotSkewLeases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	east := testsvc.NewStoreOn(t, testsvc.OpenDB(t, "time_zone='+08:00'"), outbox.TableForTest(b.store))
	west := testsvc.NewStoreOn(t, testsvc.OpenDB(t, "time_zone='-07:00'"), outbox.TableForTest(b.store))
	ids := b.insert(t, 2)

	// East claims and is sending; west's reclaim with a 10-minute lease must not see it as old.
	slow := newBlockingSender()
	pEast := newPublisher(t, east, slow, fastConfig("east", &logSink{}))
	pWest := newPublisher(t, west, newRecorder(), fastConfig("west", &logSink{}))
	cfg := fastConfig("west-reclaim", &logSink{})
	cfg.Tuning.Lease = 10 * time.Minute
	reclaimer := newPublisher(t, west, newRecorder(), cfg)

	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = pEast.PublishPending(context.Background())
	}()
	<-slow.entered
	n, err := reclaimer.Reclaim(context.Background())
	require.NoError(t, err)
	assert.Zero(t, n, "a lease taken a moment ago in +08:00 is not 15 hours old in -07:00")

	// East fails the first send: retry in 5 s by the database clock, so west must not see it
	// as due, and east's 2nd candidate is untouched.
	slow.release <- errBroker
	<-slow.entered
	slow.release <- nil
	<-done
	stats, err := pWest.PublishPending(context.Background())
	require.NoError(t, err)
	assert.Zero(t, stats.Candidates, "a retry 5 s ahead in +08:00 is not due in -07:00")
	assert.InDelta(t, 5, b.secondsFromNow(t, ids[0], "next_retry_time"), 1)
}

// Run, cancelled while a send is in flight, lets the send finish and records it.
func TestRunShutdownFinishesInFlightSend(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 1)[0]
	slow := newBlockingSender()
	p := newPublisher(t, b.store, slow, fastConfig("p", &logSink{}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	<-slow.entered
	cancel()
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) before the in-flight send finished", err)
	case <-time.After(50 * time.Millisecond):
	}
	slow.release <- nil
	require.NoError(t, <-done)
	assert.Equal(t, outbox.StatusSuccess, b.get(t, id).Status)
}

// Run, cancelled between a claim and its send, puts the row back to WAIT as it was.
func TestRunShutdownReleasesClaimedUnsentEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 3)
	ctx, cancel := context.WithCancel(context.Background())
	store := &hookStore{Store: b.store, afterClaim: func(_ context.Context, _ outbox.Event, won bool) {
		if won {
			cancel()
		}
	}}
	rec := newRecorder()
	p := newPublisher(t, store, rec, fastConfig("p", &logSink{}))
	require.NoError(t, p.Run(ctx))
	assert.Zero(t, rec.total())
	for _, id := range ids {
		got := b.get(t, id)
		assert.Equal(t, outbox.StatusWait, got.Status)
		assert.Empty(t, got.ClaimOwner)
		assert.Zero(t, got.RetryCount, "a shutdown is not a failed attempt")
	}
	evs, err := b.store.Candidates(context.Background(), 10)
	require.NoError(t, err)
	assert.Len(t, evs, 3, "due again at once, not after a lease")
}

func TestRunTwiceIsAnError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	store, started := signalRounds(b.store)
	p := newPublisher(t, store, newRecorder(), fastConfig("p", &logSink{}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	<-started
	require.ErrorIs(t, p.Run(ctx), outbox.ErrAlreadyRunning)
	cancel()
	require.NoError(t, <-done)
	// Stopped, it may run again.
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	require.NoError(t, p.Run(ctx2))
}

// roundClock records when each round's claim started and when each failure was written.
type roundClock struct {
	mu       sync.Mutex
	starts   []time.Time
	releases []time.Time
}

func (c *roundClock) stamp(list *[]time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	*list = append(*list, time.Now())
}

// Fixed delay: a round that did not drain cleanly (here every send fails) is followed by the
// next no sooner than PollInterval after its last write, and rounds never overlap. (A lower
// bound only: sleeping is never shorter than asked.)
func TestRunIsFixedDelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, 2)
	clock := &roundClock{}
	var inSend atomic.Int32
	var overlapped atomic.Bool
	sender := outbox.SenderFunc(func(context.Context, outbox.Event) error {
		if inSend.Add(1) > 1 {
			overlapped.Store(true)
		}
		defer inSend.Add(-1)
		return errBroker
	})
	store := &hookStore{
		Store:           b.store,
		afterCandidates: func(context.Context, []outbox.Event) { clock.stamp(&clock.starts) },
	}
	cfg := fastConfig("p", &logSink{})
	cfg.Tuning.BatchSize = 2
	cfg.MaxAttempts = 1001
	cfg.Backoff = func(int) time.Duration { return 0 } // due again at once: only the poll delay spaces rounds
	cfg.PollInterval = 100 * time.Millisecond
	p := newPublisher(t, &releaseClock{hookStore: store, clock: clock}, sender, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	require.Eventually(t, func() bool {
		clock.mu.Lock()
		defer clock.mu.Unlock()
		return len(clock.starts) >= 4
	}, 10*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)

	assert.False(t, overlapped.Load(), "rounds never overlap")
	clock.mu.Lock()
	defer clock.mu.Unlock()
	// Round k ends with its 2nd release, at releases[2k+1]; round k+1 starts at starts[k+1].
	for k := 0; k < 3; k++ {
		gap := clock.starts[k+1].Sub(clock.releases[2*k+1])
		assert.GreaterOrEqual(t, gap, cfg.PollInterval, "round %d started %s after round %d ended", k+2, gap, k+1)
	}
}

// releaseClock stamps every release for TestRunIsFixedDelay.
type releaseClock struct {
	*hookStore
	clock *roundClock
}

func (r *releaseClock) ReleaseForRetry(ctx context.Context, id int64, owner string, n int, d time.Duration, class, reason string) (bool, error) {
	ok, err := r.hookStore.ReleaseForRetry(ctx, id, owner, n, d, class, reason)
	r.clock.stamp(&r.clock.releases)
	return ok, err
}

// A round that claimed all it could and sent it all is followed at once by the next, so a
// backlog drains without waiting out the poll interval (an hour here).
func TestRunDrainsBacklogWithoutWaiting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, 50)
	cfg := fastConfig("p", &logSink{})
	cfg.Tuning.BatchSize = 10
	cfg.PollInterval = time.Hour
	p := newPublisher(t, b.store, newRecorder(), cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	require.Eventually(t, func() bool { return b.countStatus(t, outbox.StatusSuccess) == 50 }, 30*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
}

// An event committed through the store's Tx wakes the publisher of this process: it is sent
// long before the poll interval (an hour here) would have found it.
func TestCommitWakesThePublisher(t *testing.T) {
	t.Parallel()
	b := setup(t)
	store, started := signalRounds(b.store)
	cfg := fastConfig("p", &logSink{})
	cfg.PollInterval = time.Hour
	rec := newRecorder()
	p := newPublisher(t, &notifyingStore{hookStore: store, n: b.store}, rec, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	<-started // the first round found nothing; the next would be an hour away
	id := b.insert(t, 1)[0]
	require.Eventually(t, func() bool { return rec.count(id) == 1 }, 30*time.Second, time.Millisecond)
	cancel()
	require.NoError(t, <-done)
}

// notifyingStore passes the store's commit notifications through a hookStore.
type notifyingStore struct {
	*hookStore
	n outbox.Store
}

func (s *notifyingStore) Subscribe() (<-chan struct{}, func()) { return s.n.Subscribe() }

// Three publishers, each with its own connection pool, drain 10,000 events (and eight drain
// 5,000): each sent exactly once, every row SUCCESS with its sender's id in claim_owner, and
// no error or warning reaching the user's logger (lock conflicts are retried inside).
func TestPublishersDrainEventsExactlyOnce(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ instances, events int }{{3, 10_000}, {8, 5_000}} {
		t.Run(fmt.Sprintf("instances=%d", c.instances), func(t *testing.T) {
			drainExactlyOnce(t, c.instances, c.events)
		})
	}
}

func drainExactlyOnce(t *testing.T, instances, events int) {
	b := setup(t)
	b.insert(t, events)

	recs := make([]*recorder, instances)
	logs := make([]*logSink, instances)
	stores := make([]*outbox.MySQLStore, instances)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	start := time.Now()
	for i := range instances {
		recs[i] = newRecorder()
		stores[i] = testsvc.NewStoreOn(t, testsvc.OpenDB(t), outbox.TableForTest(b.store))
		logs[i] = &logSink{}
		cfg := fastConfig(fmt.Sprintf("order-%d", i), logs[i])
		cfg.PollInterval = time.Millisecond
		p := newPublisher(t, stores[i], recs[i], cfg)
		wg.Go(func() { assert.NoError(t, p.Run(ctx)) })
	}
	require.Eventually(t, func() bool { return b.countStatus(t, outbox.StatusSuccess) == events }, 5*time.Minute, 50*time.Millisecond)
	cancel()
	wg.Wait()
	var retries int64
	for i, l := range logs {
		assert.Empty(t, l.atLeast(slog.LevelWarn), "instance %d logged warnings or errors", i)
		retries += outbox.LockRetriesForTest(stores[i])
	}
	t.Logf("%d publishers (%s) drained %d events in %s; lock conflicts retried inside: %d",
		instances, claimModeName(), events, time.Since(start).Round(time.Millisecond), retries)

	owners := map[string]int{}
	rows, err := b.db.Query("SELECT id, claim_owner FROM `" + outbox.TableForTest(b.store) + "`")
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var id int64
		var owner string
		require.NoError(t, rows.Scan(&id, &owner))
		owners[owner]++
		total := 0
		for i, r := range recs {
			n := r.count(id)
			total += n
			if n > 0 {
				assert.Equal(t, fmt.Sprintf("order-%d", i), owner, "event %d: claim_owner is its sender", id)
			}
		}
		require.Equal(t, 1, total, "event %d sent %d times", id, total)
	}
	require.NoError(t, rows.Err())
	t.Logf("events per instance: %v", owners)
	assert.GreaterOrEqual(t, len(owners), 2, "the instances shared the work")
}

// EXPLAIN the two scans on a table of 10,000+ rows, most of them SUCCESS: both use their
// composite index (a range or ref scan), never a full table scan.
func TestScanQueriesUseTheirIndexes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const total = 12_000
	values := strings.TrimSuffix(strings.Repeat("(?, ?, 'ORDER_CREATED', '{}', ?, 0, ?, ?, ?, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3)),", 1000), ",")
	for chunk := range total / 1000 {
		args := make([]any, 0, 6000)
		for i := range 1000 {
			n := chunk*1000 + i
			status, claimed, owner := "SUCCESS", time.Now().UTC().Add(-time.Hour), "x"
			switch {
			case n%40 == 0:
				status, claimed, owner = "WAIT", time.Unix(0, 0).UTC(), ""
			case n%40 == 1:
				status, claimed = "SENDING", time.Now().UTC()
			}
			args = append(args, uuid.Must(uuid.NewV7()).String(), fmt.Sprint("ORD-", n), status, time.Now().UTC().Add(-time.Duration(n)*time.Second), owner, claimed)
		}
		b.exec(t, "INSERT INTO {t} (event_id, biz_no, event_type, payload, status, retry_count, next_retry_time, claim_owner, claimed_at, create_time, update_time) VALUES "+values, args...)
	}
	b.exec(t, "ANALYZE TABLE {t}")

	explain := func(query string, args ...any) (typ, key string, rowsEst int64) {
		rows, err := b.db.Query("EXPLAIN "+query, args...)
		require.NoError(t, err)
		defer rows.Close()
		cols, err := rows.Columns()
		require.NoError(t, err)
		require.True(t, rows.Next())
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		require.NoError(t, rows.Scan(ptrs...))
		for i, c := range cols {
			s := fmt.Sprintf("%s", vals[i])
			switch strings.ToLower(c) {
			case "type":
				typ = s
			case "key":
				key = s
			case "rows":
				_, _ = fmt.Sscan(s, &rowsEst)
			}
		}
		return typ, key, rowsEst
	}
	candidates, reclaim := outbox.ScanQueriesForTest(b.store)
	typ, key, est := explain(candidates, 20)
	t.Logf("candidate scan on %d rows: type=%s key=%s rows=%d", total, typ, key, est)
	assert.Equal(t, "idx_status_next_retry", key)
	assert.Contains(t, []string{"range", "ref"}, typ)
	assert.Less(t, est, int64(total/4))

	typ, key, est = explain(reclaim, (10 * time.Minute).Microseconds(), 500)
	t.Logf("reclaim scan on %d rows: type=%s key=%s rows=%d", total, typ, key, est)
	assert.Equal(t, "idx_status_claimed_at", key)
	assert.Contains(t, []string{"range", "ref"}, typ)
	assert.Less(t, est, int64(total/4))
}
