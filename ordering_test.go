package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// keyNames returns n biz nos: prefix-0, prefix-1, ...
func keyNames(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// keyOrderSender is a Sender that checks key order as a broker's orderly consumer would see
// it: per biz no, no two sends at once, and no event delivered after a later one (a repeat of
// an event already delivered is allowed). fail decides a send's error before it is delivered.
type keyOrderSender struct {
	mu         sync.Mutex
	inFlight   map[string]int
	delivered  map[string][]int64 // per key, in delivery order (repeats included)
	concurrent int                // sends of a key that began while another of the key was in flight
	inversions []string
	fail       func(ev outbox.Event) error
}

func newKeyOrderSender(fail func(ev outbox.Event) error) *keyOrderSender {
	return &keyOrderSender{inFlight: map[string]int{}, delivered: map[string][]int64{}, fail: fail}
}

func (s *keyOrderSender) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	return outbox.SenderFunc(s.sendOne).Send(ctx, evs, keyOrder)
}

func (s *keyOrderSender) Info() outbox.SenderInfo { return outbox.SenderInfo{} }

func (s *keyOrderSender) Check(context.Context, []string) error { return nil }

func (s *keyOrderSender) sendOne(_ context.Context, ev outbox.Event) error {
	s.mu.Lock()
	if s.inFlight[ev.BizNo] > 0 {
		s.concurrent++
	}
	s.inFlight[ev.BizNo]++
	s.mu.Unlock()
	time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond) // let sends overlap, if they can
	var err error
	if s.fail != nil {
		err = s.fail(ev)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inFlight[ev.BizNo]--
	if err != nil {
		return err
	}
	seen := s.delivered[ev.BizNo]
	if !slices.Contains(seen, ev.ID) && len(seen) > 0 && slices.Max(seen) > ev.ID {
		s.inversions = append(s.inversions, fmt.Sprintf("%s: event %d after %d", ev.BizNo, ev.ID, slices.Max(seen)))
	}
	s.delivered[ev.BizNo] = append(seen, ev.ID)
	return nil
}

// firstDeliveries returns key's events in the order of their first delivery.
func (s *keyOrderSender) firstDeliveries(key string) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int64
	for _, id := range s.delivered[key] {
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

var errFlaky = errors.New("flaky send")

// Three publishers in key order, one send in ten failing: every key's events are delivered
// in id order, never two of a key at once, and all end SUCCESS.
func TestKeyOrderThreePublishers(t *testing.T) {
	t.Parallel()
	for _, ordering := range []outbox.Ordering{outbox.KeyOrder, outbox.KeyOrderSkipDeadLetters} {
		t.Run(ordering.String(), func(t *testing.T) {
			t.Parallel()
			b := orderedSetup(t)
			keys := b.insertKeys(t, keyNames("ORD", 100), 5)
			table := outbox.TableForTest(b.store)
			var rmu sync.Mutex
			rng := rand.New(rand.NewPCG(11, 30))
			sender := newKeyOrderSender(func(outbox.Event) error {
				rmu.Lock()
				defer rmu.Unlock()
				if rng.IntN(10) == 0 {
					return errFlaky
				}
				return nil
			})
			for i := range 3 {
				cfg := fastConfig(fmt.Sprintf("ordered-%d", i), &logSink{})
				cfg.MaxAttempts = outbox.RetryForever
				cfg.Backoff = func(int) time.Duration { return 5 * time.Millisecond }
				store, err := outbox.NewMySQLStore(testsvc.OpenDB(t), outbox.MySQLConfig{Table: table, Ordering: ordering})
				require.NoError(t, err)
				runPublisher(t, newPublisher(t, store, sender, cfg))
			}
			total := 0
			for _, ids := range keys {
				total += len(ids)
			}
			require.Eventually(t, func() bool { return b.countStatus(t, outbox.StatusSuccess) == total }, 60*time.Second, 20*time.Millisecond)
			sender.mu.Lock()
			assert.Zero(t, sender.concurrent, "two sends of one key at once")
			assert.Empty(t, sender.inversions)
			sender.mu.Unlock()
			for key, ids := range keys {
				assert.Equal(t, ids, sender.firstDeliveries(key), key)
			}
		})
	}
}

// A dead letter blocks its key in KeyOrder until a person skips (or requeues) it; the other
// keys go on. In KeyOrderSkipDeadLetters the key goes on without it.
func TestKeyOrderDeadLetter(t *testing.T) {
	t.Parallel()
	for _, ordering := range []outbox.Ordering{outbox.KeyOrder, outbox.KeyOrderSkipDeadLetters} {
		t.Run(ordering.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := orderedSetupWith(t, ordering)
			keys := b.insertKeys(t, keyNames("DL", 3), 3)
			poison := keys["DL-0"][0]
			sender := newKeyOrderSender(func(ev outbox.Event) error {
				if ev.ID == poison {
					return outbox.Permanent(errors.New("refused"))
				}
				return nil
			})
			cfg := fastConfig("dead-letter", &logSink{})
			runPublisher(t, newPublisher(t, b.store, sender, cfg))

			others := slices.Concat(keys["DL-1"], keys["DL-2"])
			require.Eventually(t, func() bool {
				for _, id := range others {
					if b.get(t, id).Status != outbox.StatusSuccess {
						return false
					}
				}
				return b.get(t, poison).Status == outbox.StatusFail
			}, 20*time.Second, 10*time.Millisecond)
			behind := keys["DL-0"][1:]
			if ordering == outbox.KeyOrderSkipDeadLetters {
				require.Eventually(t, func() bool {
					return b.get(t, behind[0]).Status == outbox.StatusSuccess && b.get(t, behind[1]).Status == outbox.StatusSuccess
				}, 20*time.Second, 10*time.Millisecond)
				assert.Equal(t, behind, sender.firstDeliveries("DL-0"))
				return
			}
			time.Sleep(300 * time.Millisecond) // sixty polls: the key stays blocked
			for _, id := range behind {
				assert.Equal(t, outbox.StatusWait, b.get(t, id).Status, "blocked behind the dead letter")
			}
			require.NoError(t, b.admin().Skip(ctx, poison))
			require.Eventually(t, func() bool {
				return b.get(t, behind[0]).Status == outbox.StatusSuccess && b.get(t, behind[1]).Status == outbox.StatusSuccess
			}, 20*time.Second, 10*time.Millisecond)
			assert.Equal(t, outbox.StatusSkipped, b.get(t, poison).Status)
			assert.Equal(t, behind, sender.firstDeliveries("DL-0"))
		})
	}
}

// The publisher asks its sender for key order exactly when the store claims in key order.
func TestKeyOrderFollowsTheStore(t *testing.T) {
	t.Parallel()
	for _, ordering := range []outbox.Ordering{outbox.Unordered, outbox.KeyOrder, outbox.KeyOrderSkipDeadLetters} {
		t.Run(ordering.String(), func(t *testing.T) {
			t.Parallel()
			b := orderedSetupWith(t, ordering)
			b.insertKeys(t, keyNames("F", 3), 2)
			var mu sync.Mutex
			var asked []bool
			sender := &keyOrderProbe{asked: func(k bool) { mu.Lock(); asked = append(asked, k); mu.Unlock() }}
			runPublisher(t, newPublisher(t, b.store, sender, fastConfig("follows", &logSink{})))
			require.Eventually(t, func() bool { return b.countStatus(t, outbox.StatusSuccess) == 6 }, 20*time.Second, 5*time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			require.NotEmpty(t, asked)
			for _, k := range asked {
				assert.Equal(t, ordering != outbox.Unordered, k)
			}
		})
	}
}

// keyOrderProbe is a Sender that accepts everything and reports each call's keyOrder.
type keyOrderProbe struct{ asked func(bool) }

func (s *keyOrderProbe) Send(_ context.Context, evs []outbox.Event, keyOrder bool) []error {
	s.asked(keyOrder)
	return make([]error, len(evs))
}

func (s *keyOrderProbe) Info() outbox.SenderInfo { return outbox.SenderInfo{} }

func (s *keyOrderProbe) Check(context.Context, []string) error { return nil }

// An unknown Ordering is refused when the store is made.
func TestKeyOrderRefusesAnUnknownOrdering(t *testing.T) {
	t.Parallel()
	_, err := outbox.NewMySQLStore(testsvc.OpenDB(t), outbox.MySQLConfig{Ordering: outbox.Ordering(7)})
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	assert.ErrorContains(t, err, "unknown Ordering 7")
}

// A publisher in key order on a table as schema.sql makes it, without idx_biz_no_status,
// refuses to run, with the error naming the index. (A Run that starts all the same returns
// when ctx ends, and fails the test, rather than hang it.)
func TestKeyOrderRunRefusesATableWithoutTheIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := fastConfig("refuse-run", &logSink{})
	store, err := outbox.NewMySQLStore(b.db, outbox.MySQLConfig{Table: outbox.TableForTest(b.store), Ordering: outbox.KeyOrder})
	require.NoError(t, err)
	p := newPublisher(t, store, newRecorder(), cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = p.Run(ctx)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	assert.ErrorContains(t, err, "idx_biz_no_status")
}
