package bench

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// tally counts the sends of each event, by event id.
type tally struct {
	mu    sync.Mutex
	sends map[string]int
}

func (c *tally) Send(_ context.Context, evs []outbox.Event, _ bool) []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ev := range evs {
		c.sends[ev.EventID]++
	}
	return make([]error, len(evs))
}

func (c *tally) Info() outbox.SenderInfo { return outbox.SenderInfo{} }

func (c *tally) Check(context.Context, []string) error { return nil }

func (c *tally) sent() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.sends)
}

// TestReferenceRelays checks that each reference relay does what the service view says it
// does: every committed event sent once, in more than one round, including an event
// whose transaction commits after later ones (a gap in the ids the relay has read); the
// references that write leave every row SUCCESS (the two-write one once a round after the
// last has run), the read-only one leaves every row as it was.
func TestReferenceRelays(t *testing.T) {
	env := Env{DSN: testsvc.MySQLDSN(t)}
	for _, kind := range []Reference{ReadOnly, OneWrite, TwoWrites} {
		t.Run(kind.String(), func(t *testing.T) {
			ctx := context.Background()
			tb, err := newTable(ctx, env)
			require.NoError(t, err)
			defer tb.drop()

			// The first id, inserted and not yet committed, then 2,500 committed behind it.
			late, err := tb.store.BeginTx(ctx, nil)
			require.NoError(t, err)
			lateID, err := late.InsertEvent(ctx, outbox.EventInput{BizNo: "late", EventType: "BENCH", Payload: []byte("{}")})
			require.NoError(t, err)
			require.NoError(t, tb.fill(ctx, 2500, 0, 0))

			s := &tally{sends: map[string]int{}}
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- runReference(rctx, tb.db, tb.name, kind, 5*time.Millisecond, s) }()
			defer func() {
				cancel()
				require.NoError(t, <-done)
			}()

			require.Eventually(t, func() bool { return s.sent() == 2500 }, 10*time.Second, 5*time.Millisecond)
			time.Sleep(50 * time.Millisecond) // rounds that find the uncommitted one, and skip it
			s.mu.Lock()
			require.Zero(t, s.sends[lateID], "an uncommitted event is not sent")
			s.mu.Unlock()
			require.NoError(t, late.Commit())
			require.Eventually(t, func() bool { return s.sent() == 2501 }, 10*time.Second, 5*time.Millisecond)
			time.Sleep(50 * time.Millisecond) // rounds after the last: nothing is sent again
			cancel()
			require.NoError(t, <-done)
			done <- nil // for the deferred stop

			s.mu.Lock()
			for id, n := range s.sends {
				require.Equal(t, 1, n, "event %s sent %d times", id, n)
			}
			s.mu.Unlock()
			var waiting, succeeded int
			require.NoError(t, tb.db.QueryRowContext(ctx, "SELECT COALESCE(SUM(status = 'WAIT'), 0), COALESCE(SUM(status = 'SUCCESS'), 0) FROM `"+tb.name+"`").Scan(&waiting, &succeeded))
			if kind == ReadOnly {
				require.Equal(t, []int{2501, 0}, []int{waiting, succeeded}, "reading only: no row changed")
			} else {
				require.Equal(t, []int{0, 2501}, []int{waiting, succeeded}, "every row SUCCESS")
			}
		})
	}
}
