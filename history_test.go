package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// deadLetterLog collects OnDeadLetter's events.
type deadLetterLog struct {
	mu  sync.Mutex
	evs []outbox.Event
}

func (d *deadLetterLog) add(_ context.Context, ev outbox.Event, _ error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.evs = append(d.evs, ev)
}

func (d *deadLetterLog) all() []outbox.Event {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]outbox.Event(nil), d.evs...)
}

// assertHistory checks fs against the classes wanted, oldest first, each of instance, at
// database times between from and to, in order.
func assertHistory(t *testing.T, fs []outbox.Failure, instance string, from, to time.Time, classes ...string) {
	t.Helper()
	require.Len(t, fs, len(classes), "history %+v", fs)
	for i, f := range fs {
		assert.Equal(t, classes[i], f.Class, "entry %d", i)
		assert.Equal(t, instance, f.Instance, "entry %d", i)
		assert.False(t, f.At.Before(from), "entry %d at %v, before %v", i, f.At, from)
		assert.False(t, f.At.After(to), "entry %d at %v, after %v", i, f.At, to)
		assert.Equal(t, time.UTC, f.At.Location())
		if i > 0 {
			assert.False(t, f.At.Before(fs[i-1].At), "entry %d before entry %d", i, i-1)
		}
	}
}

// Three retries and a dead letter leave four entries of the publisher's instance, by the
// database clock, oldest first: what OnDeadLetter gets and Admin's Get, GetByEventID and
// List read. A requeue keeps them, and the next failure follows them.
func TestFailureHistoryOfRetriesThenADeadLetter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 1)[0]
	dead := &deadLetterLog{}
	cfg := fastConfig("history-p", &logSink{})
	cfg.OnDeadLetter = dead.add
	attempt := 0
	p := newPublisher(t, b.store, outbox.SenderFunc(func(context.Context, outbox.Event) error {
		attempt++
		if attempt == 5 {
			return outbox.Permanent(errors.New("refused for good"))
		}
		return fmt.Errorf("attempt %d: %w", attempt, errBroker)
	}), cfg)
	ctx := context.Background()
	from := b.dbNow(t)
	for range 4 {
		_, err := p.PublishPending(ctx)
		require.NoError(t, err)
		b.makeDue(t, id)
	}
	to := b.dbNow(t)
	got := b.get(t, id)
	require.Equal(t, outbox.StatusFail, got.Status)
	assertHistory(t, got.Failures, "history-p", from, to, "retryable", "retryable", "retryable", "retryable")
	for i, f := range got.Failures {
		assert.Equal(t, fmt.Sprintf("attempt %d: %s", i+1, errBroker), f.Message)
	}
	require.Len(t, dead.all(), 1)
	assert.Equal(t, got.Failures, dead.all()[0].Failures, "OnDeadLetter gets the history, the final failure last")

	byEventID, err := b.admin().GetByEventID(ctx, got.EventID)
	require.NoError(t, err)
	assert.Equal(t, got.Failures, byEventID.Failures)
	listed, err := b.admin().List(ctx, outbox.Filter{IDs: []int64{id}})
	require.NoError(t, err)
	require.Len(t, listed, 1)
	assert.Equal(t, got.Failures, listed[0].Failures)

	require.NoError(t, b.admin().Requeue(ctx, id))
	requeued := b.get(t, id)
	assert.Equal(t, outbox.StatusWait, requeued.Status)
	assert.Equal(t, got.Failures, requeued.Failures, "a requeue keeps the history")
	_, err = p.PublishPending(ctx)
	require.NoError(t, err)
	after := b.get(t, id)
	assertHistory(t, after.Failures, "history-p", from, b.dbNow(t), "retryable", "retryable", "retryable", "retryable", "permanent")
	assert.Equal(t, "permanent: refused for good", after.Failures[4].Message)
	require.Len(t, dead.all(), 2)
	assert.Equal(t, after.Failures, dead.all()[1].Failures)
}

// With RetryForever, fifteen failures keep the latest ten.
func TestFailureHistoryKeepsTheLatestTen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 1)[0]
	cfg := fastConfig("history-ten", &logSink{})
	cfg.MaxAttempts = outbox.RetryForever
	attempt := 0
	p := newPublisher(t, b.store, outbox.SenderFunc(func(context.Context, outbox.Event) error {
		attempt++
		return fmt.Errorf("failure %d", attempt)
	}), cfg)
	for range 15 {
		_, err := p.PublishPending(context.Background())
		require.NoError(t, err)
		b.makeDue(t, id)
	}
	got := b.get(t, id)
	assert.Equal(t, 15, got.RetryCount)
	require.Len(t, got.Failures, 10)
	for i, f := range got.Failures {
		assert.Equal(t, fmt.Sprintf("failure %d", i+6), f.Message)
	}
	var lines int
	require.NoError(t, b.db.QueryRow("SELECT LENGTH(failures) - LENGTH(REPLACE(failures, '\n', '')) FROM `"+
		outbox.TableForTest(b.store)+"` WHERE id = ?", id).Scan(&lines))
	assert.Equal(t, 9, lines, "the column holds ten lines")
}

// A reclaim is recorded under the owner that lost the lease, and a poison event's dead
// letter (past MaxReclaims) gets the history of its reclaims in OnDeadLetter.
func TestFailureHistoryRecordsAReclaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 1)[0]
	dead := &deadLetterLog{}
	cfg := fastConfig("history-reclaimer", &logSink{})
	cfg.OnDeadLetter = dead.add
	cfg.Tuning.MaxReclaims = 2
	p := newPublisher(t, b.store, newRecorder(), cfg)
	ctx := context.Background()
	from := b.dbNow(t)
	for i, owner := range []string{"crashed-1", "crashed-2"} {
		evs, _, err := claimDue(ctx, b.store, owner, 10, 1<<20)
		require.NoError(t, err)
		require.Len(t, evs, 1)
		b.ageClaim(t, id, time.Hour)
		_, err = p.Reclaim(ctx)
		require.NoError(t, err)
		got := b.get(t, id)
		require.Len(t, got.Failures, i+1)
		f := got.Failures[i]
		assert.Equal(t, "reclaimed", f.Class)
		assert.Equal(t, owner, f.Instance, "the owner that lost the lease")
		assert.NotEmpty(t, f.Message)
		assert.False(t, f.At.Before(from))
	}
	got := b.get(t, id)
	assert.Equal(t, outbox.StatusFail, got.Status, "the second reclaim reaches MaxReclaims")
	require.Len(t, dead.all(), 1)
	assert.Equal(t, got.Failures, dead.all()[0].Failures)
	assert.Equal(t, got.LastError, got.Failures[1].Message, "the poison event's reason is its last entry")
}

// A release because the broker was unavailable is an "unavailable" entry (no attempt
// counted); a release of an event never tried (ErrNotSent) adds none.
func TestFailureHistoryOfAnUnavailableBrokerAndOfAnEventNeverTried(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		err     error
		classes []string
	}{
		{"unavailable", outbox.Unavailable(errors.New("no route to broker")), []string{"unavailable"}},
		{"not sent", fmt.Errorf("%w: timed out before its turn", outbox.ErrNotSent), nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := setup(t)
			id := b.insert(t, 1)[0]
			p := newPublisher(t, b.store, outbox.SenderFunc(func(context.Context, outbox.Event) error { return c.err }),
				fastConfig("history-u", &logSink{}))
			from := b.dbNow(t)
			_, err := p.PublishPending(context.Background())
			require.NoError(t, err)
			got := b.get(t, id)
			assert.Equal(t, outbox.StatusWait, got.Status)
			assert.Zero(t, got.RetryCount)
			if c.classes == nil {
				assert.Empty(t, got.Failures)
				return
			}
			assertHistory(t, got.Failures, "history-u", from, b.dbNow(t), c.classes...)
			assert.Contains(t, got.Failures[0].Message, "no route to broker")
		})
	}
}

// The happy path writes no history: every event sent at its first attempt keeps NULL.
func TestHappyPathWritesNoFailureHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, 200)
	p := newPublisher(t, b.store, newRecorder(), fastConfig("history-happy", &logSink{}))
	for b.countStatus(t, outbox.StatusSuccess) < 200 {
		_, err := p.PublishPending(context.Background())
		require.NoError(t, err)
	}
	var notNull int
	require.NoError(t, b.db.QueryRow("SELECT COUNT(*) FROM `"+outbox.TableForTest(b.store)+"` WHERE failures IS NOT NULL").Scan(&notNull))
	assert.Zero(t, notNull, "no row has a history")
	listed, err := b.admin().List(context.Background(), outbox.Filter{Limit: 200})
	require.NoError(t, err)
	for _, ev := range listed {
		require.Empty(t, ev.Failures)
	}
}

// A message with newlines, quotes, backslashes, control characters and any Unicode comes
// back as it was; a long one is cut to 512 characters, never inside a character; invalid
// UTF-8 is replaced, not refused.
func TestFailureMessagesSurviveEscapingAndTruncation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	long := strings.Repeat("é😀中", 300) // 900 characters, 2,700 bytes
	messages := []string{
		"first line\nsecond line\r\n\tindented",
		`double " single ' backslash \ and \n not a newline`,
		"unicode é 中文 😀 \u0001 \u007f \u2028 end",
		"{\"at\": \"2000-01-01 00:00:00.000\", \"class\": \"forged\"}\nforged line",
		long,
		"bad \xff\xfe utf-8",
	}
	ctx := context.Background()
	id := b.insert(t, 1)[0]
	for i, m := range messages {
		evs, _, err := claimDue(ctx, b.store, "history-m", 1, 1<<20)
		require.NoError(t, err)
		require.Len(t, evs, 1, "message %d", i)
		ok, err := b.store.ReleaseForRetry(ctx, id, "history-m", i+1, 0, "retryable", m)
		require.NoError(t, err)
		require.True(t, ok)
		b.makeDue(t, id)
	}
	got := b.get(t, id).Failures
	require.Len(t, got, len(messages))
	for i, m := range messages[:4] {
		assert.Equal(t, m, got[i].Message, "message %d", i)
		assert.Equal(t, "retryable", got[i].Class, "the forged line is the message, not an entry")
	}
	assert.Equal(t, string([]rune(long)[:512]), got[4].Message, "cut to 512 characters")
	assert.True(t, utf8.ValidString(got[4].Message))
	assert.Equal(t, "bad ? utf-8", got[5].Message)
}

// A history written by hand that is not the library's (not JSON, a bad time, too long for
// an append) breaks no read: Admin returns what it can, lines it cannot read as their text,
// and the next failure is recorded all the same.
func TestCorruptFailureHistoryDoesNotBreakReads(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ids := b.insert(t, 2)
	corrupt := "not json at all\n{\"at\": 5}\n{\"at\": \"yesterday\", \"instance\": \"i\", \"class\": \"retryable\", \"message\": \"m\"}\n" +
		"{\"at\": \"2026-01-02 03:04:05.678\", \"instance\": \"i\", \"class\": \"permanent\", \"message\": \"ok\"}\n{\"at\": \"2026-01-02"
	b.exec(t, "UPDATE {t} SET failures = ? WHERE id = ?", corrupt, ids[0])
	b.exec(t, "UPDATE {t} SET failures = ? WHERE id = ?", strings.Repeat("x", 50000), ids[1])

	got := b.get(t, ids[0]).Failures
	require.Len(t, got, 5)
	assert.Equal(t, outbox.Failure{Message: "not json at all"}, got[0])
	assert.Equal(t, outbox.Failure{Message: `{"at": 5}`}, got[1])
	assert.Equal(t, outbox.Failure{Instance: "i", Class: "retryable", Message: "m"}, got[2], "a bad time is the zero time")
	assert.Equal(t, outbox.Failure{At: time.Date(2026, 1, 2, 3, 4, 5, 678e6, time.UTC), Instance: "i", Class: "permanent", Message: "ok"}, got[3])
	assert.Equal(t, outbox.Failure{Message: `{"at": "2026-01-02`}, got[4], "a cut line is its text")
	long := b.get(t, ids[1]).Failures
	require.Len(t, long, 1)
	assert.Len(t, []rune(long[0].Message), 512, "an unreadable line comes back cut")
	_, err := b.admin().List(ctx, outbox.Filter{})
	require.NoError(t, err)

	// The next failure of each is recorded: after the corrupt lines, and in place of the
	// value too long to append to.
	p := newPublisher(t, b.store, outbox.SenderFunc(func(context.Context, outbox.Event) error { return errBroker }),
		fastConfig("history-c", &logSink{}))
	stats, err := p.PublishPending(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, stats.Retried)
	got = b.get(t, ids[0]).Failures
	require.Len(t, got, 6)
	assert.Equal(t, "retryable", got[5].Class)
	assert.Equal(t, "history-c", got[5].Instance)
	long = b.get(t, ids[1]).Failures
	require.Len(t, long, 1, "the value too long to append to is replaced")
	assert.Equal(t, errBroker.Error(), long[0].Message)
}

// A table made before the history (no failures column) is refused by Check, CreateSchema and
// Start with the ALTER that adds the column; once it has run (instant), failures are
// recorded.
func TestTableWithoutTheFailuresColumnIsRefusedWithItsAlter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := b.insert(t, 1)[0]
	b.exec(t, "ALTER TABLE {t} DROP COLUMN failures")
	alter := "ALTER TABLE `" + outbox.TableForTest(b.store) + "` ADD COLUMN failures TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL"

	_, err := b.store.Check(ctx)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "lacks a failures column")
	assert.Contains(t, err.Error(), alter)
	err = b.store.CreateSchema(ctx)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	assert.Contains(t, err.Error(), alter)
	p := newPublisher(t, b.store, outbox.SenderFunc(func(context.Context, outbox.Event) error { return errBroker }),
		fastConfig("history-old", &logSink{}))
	err = p.Start(ctx)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	assert.Contains(t, err.Error(), alter)
	require.NoError(t, p.Close())

	b.exec(t, alter+", ALGORITHM=INSTANT")
	_, err = b.store.Check(ctx)
	require.NoError(t, err)
	require.NoError(t, b.store.CreateSchema(ctx))
	assert.Empty(t, b.get(t, id).Failures, "the rows of before the ALTER have no history")
	p = newPublisher(t, b.store, outbox.SenderFunc(func(context.Context, outbox.Event) error { return errBroker }),
		fastConfig("history-old", &logSink{}))
	_, err = p.PublishPending(ctx)
	require.NoError(t, err)
	require.Len(t, b.get(t, id).Failures, 1)
}
