package outbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// In key order, through a backlog, a round of Run claims the next batch while it sends its
// own (roundState.ahead): the claim and the send, of different biz nos, overlap. These tests
// hold the batch claimed ahead to the rules of any claimed batch.

// aheadSender answers each Send with answer(call, evs), and records each call's events.
type aheadSender struct {
	mu     sync.Mutex
	calls  [][]outbox.Event
	answer func(call int, evs []outbox.Event) error
}

func (s *aheadSender) Send(_ context.Context, evs []outbox.Event, _ bool) []error {
	s.mu.Lock()
	call := len(s.calls)
	s.calls = append(s.calls, evs)
	s.mu.Unlock()
	errs := make([]error, len(evs))
	if s.answer != nil {
		if err := s.answer(call, evs); err != nil {
			for i := range errs {
				errs[i] = err
			}
		}
	}
	return errs
}

func (s *aheadSender) Info() outbox.SenderInfo               { return outbox.SenderInfo{} }
func (s *aheadSender) Check(context.Context, []string) error { return nil }

func (s *aheadSender) sent() [][]outbox.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]outbox.Event(nil), s.calls...)
}

// aheadSetup is an ordered table of keys x per events (the keys interleaved) and a batch-mode publisher on it that
// claims limit events a round.
func aheadSetup(t *testing.T, keys, per, limit int, s outbox.Sender) (*bundle, map[string][]int64, *outbox.Publisher) {
	t.Helper()
	if testPerRow {
		t.Skip("a batch-mode round")
	}
	b := orderedSetup(t)
	names := make([]string, keys)
	for i := range names {
		names[i] = string(rune('A'+i/26)) + string(rune('A'+i%26))
	}
	ids := b.insertKeys(t, names, per)
	cfg := fastConfig("p", &logSink{})
	cfg.Tuning.BatchSize = limit
	p := newPublisher(t, b.store, s, cfg)
	outbox.SetClaimLimitForTest(p, limit)
	require.NoError(t, outbox.CheckForTest(p, context.Background()))
	return b, ids, p
}

// The next batch is claimed while the round's batch is sent, and sent by the next round,
// before any other claim: no event of a biz no in flight is in it, and every biz no's
// events go out once, in id order.
func TestKeyOrderClaimsTheNextBatchWhileSending(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var (
		b     *bundle
		first int
		saw   = make(chan int, 1) // the SENDING rows the first Send saw once the next batch was claimed
	)
	s := &aheadSender{answer: func(call int, evs []outbox.Event) error {
		if call == 0 {
			first = len(evs)
			n := 0
			deadline := time.Now().Add(10 * time.Second)
			for n <= first && time.Now().Before(deadline) {
				n = b.countStatus(t, outbox.StatusSending)
				time.Sleep(2 * time.Millisecond)
			}
			saw <- n
		}
		return nil
	}}
	b, ids, p := aheadSetup(t, 40, 5, 20, s)

	stats, err := outbox.RunRoundForTest(p, ctx)
	require.NoError(t, err)
	assert.Equal(t, 20, stats.Claimed)
	assert.Greater(t, <-saw, first, "the next batch was claimed during the first send")
	aheadIDs := b.countStatus(t, outbox.StatusSending) - len(outbox.UnackedForTest(p))
	assert.Equal(t, 20, aheadIDs, "a batch held ahead, besides the one sent and not yet recorded")

	for range 15 {
		_, err := outbox.RunRoundForTest(p, ctx)
		require.NoError(t, err)
	}
	outbox.FlushAcksForTest(p, ctx)
	calls := s.sent()
	require.GreaterOrEqual(t, len(calls), 3)
	firstKeys := byKey(calls[0])
	for k := range byKey(calls[1]) {
		assert.NotContains(t, firstKeys, k, "the batch claimed ahead holds no biz no of the batch in flight")
	}
	sent := map[string][]int64{}
	for _, evs := range calls {
		for _, ev := range evs {
			sent[ev.BizNo] = append(sent[ev.BizNo], ev.ID)
		}
	}
	assert.Equal(t, ids, sent, "each biz no's events once, in id order")
	assert.Equal(t, 200, b.countStatus(t, outbox.StatusSuccess))
}

// A batch claimed ahead is put back unsent, no attempt counted, when the send beside it
// finds the broker unavailable: the publisher then probes with one event at a time.
func TestKeyOrderBatchAheadReleasedWhenTheBrokerIsDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	down := outbox.Unavailable(errors.New("broker down"))
	s := &aheadSender{answer: func(int, []outbox.Event) error { return down }}
	b, _, p := aheadSetup(t, 40, 5, 20, s)

	stats, err := outbox.RunRoundForTest(p, ctx)
	require.NoError(t, err)
	assert.Equal(t, 20, stats.Unavailable, "the batch sent")
	assert.Equal(t, 20, stats.Released, "the batch claimed ahead, not tried")
	assert.Zero(t, b.countStatus(t, outbox.StatusSending), "nothing held")
	assert.Len(t, s.sent(), 1, "one Send")
	assert.Zero(t, b.retried(t), "no attempt counted")
}

// The stop puts a batch claimed ahead back, as every row the instance holds.
func TestKeyOrderBatchAheadReleasedByTheStop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, _, p := aheadSetup(t, 40, 5, 20, &aheadSender{})
	_, err := outbox.RunRoundForTest(p, ctx)
	require.NoError(t, err)
	require.Equal(t, 40, b.countStatus(t, outbox.StatusSending), "the batch sent, not yet recorded, and the batch ahead")
	outbox.StopForTest(p, ctx)
	assert.Zero(t, b.countStatus(t, outbox.StatusSending))
	assert.Equal(t, 20, b.countStatus(t, outbox.StatusSuccess), "the sent batch recorded")
	assert.Equal(t, 180, b.countStatus(t, outbox.StatusWait), "the batch ahead back, with the rest")
}
