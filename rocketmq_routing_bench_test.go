package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// routedDrainEvents is how many events each drain of BenchmarkRoutedDrain sends, over
// routedDrainKeys biz nos.
const (
	routedDrainEvents = 20_000
	routedDrainKeys   = 1_000
)

// BenchmarkRoutedDrain drains a backlog in key order through one batch-mode publisher (Run)
// into the real broker: 1,000 biz nos of 20 events each, the biz nos interleaved (event i is of
// biz no i mod 1,000), each biz no's events of four event types in turn. Routed to one
// topic, and by type to four topics, so that each biz no switches topics at every event
// (Dispatch sends a biz no's next topic only once its earlier events are stored). The two
// run side by side in one process, on the same table layout and broker, three rounds of
// each in turn. Reports events/s, the events per Send call, per send to the broker, and the
// time spent sending, in Dispatch, per 1,000 events (a full claimed batch).
//
//	go test -run '^$' -bench BenchmarkRoutedDrain -benchtime 2x .
func BenchmarkRoutedDrain(b *testing.B) {
	topics := make([]string, 4)
	for i := range topics {
		topics[i] = testsvc.NewTopic(b, fmt.Sprintf("OUTBOX_BENCH_RT%d", i))
	}
	// The rows alternate, three rounds of each, so that a change in the shared machine's
	// load falls on both alike (-count would run one row's rounds, then the other's).
	for _, n := range []int{1, 4, 1, 4, 1, 4} {
		b.Run(fmt.Sprintf("topics=%d", n), func(b *testing.B) {
			byType := map[string]string{}
			for i := range 4 {
				byType[fmt.Sprintf("EVENT_%d", i)] = topics[i%n]
			}
			var brokerSends atomic.Int64 // the producer's sends: one per queue of a step, at the least
			count := func(ctx context.Context, req, reply any, next primitive.Invoker) error {
				brokerSends.Add(1)
				return next(ctx, req, reply)
			}
			sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
				NameServers: []string{testsvc.RocketMQNameServer(b)}, GroupName: testsvc.UniqueTable("pg"), SendTimeout: 10 * time.Second,
				ProducerOptions: []producer.Option{producer.WithInterceptor(count)},
			})
			require.NoError(b, err)
			b.Cleanup(func() { _ = sender.Close() })
			counted := &sendCounter{Sender: sender}
			db := testsvc.OpenDB(b)
			ctx := context.Background()
			var sent, sends, toBroker int
			var took, sending time.Duration
			for b.Loop() {
				b.StopTimer()
				store := testsvc.NewStore(b, db, outbox.MySQLConfig{Ordering: outbox.KeyOrder,
					Routes: outbox.Routes{Topic: topics[0], Topics: topics[1:n], ByType: byType}})
				insertSpread(b, store, routedDrainEvents, routedDrainKeys)
				cfg := outbox.Config{InstanceID: testsvc.UniqueTable("bench"), PollInterval: time.Millisecond}
				cfg.Tuning.SendTimeout = 10 * time.Second
				timed := &dispatchTimer{Sender: counted}
				p, err := outbox.NewPublisher(store, timed, cfg)
				require.NoError(b, err)
				counted.calls.Store(0)
				brokerSends.Store(0)
				runCtx, stop := context.WithCancel(ctx)
				b.StartTimer()
				start := time.Now()
				done := make(chan error, 1)
				go func() { done <- p.Run(runCtx) }()
				for timed.stored.Load() < routedDrainEvents {
					require.Zero(b, timed.failed.Load(), "a clean drain")
					time.Sleep(time.Millisecond)
				}
				took += time.Since(start)
				b.StopTimer()
				stop()
				require.NoError(b, <-done)
				require.NoError(b, p.Close())
				sent += routedDrainEvents
				sends += int(counted.calls.Load())
				toBroker += int(brokerSends.Load())
				sending += timed.took()
				b.StartTimer()
			}
			b.ReportMetric(float64(sent)/took.Seconds(), "events/s")
			b.ReportMetric(float64(sent)/float64(sends), "events/Send")
			b.ReportMetric(float64(sent)/float64(toBroker), "events/brokersend")
			b.ReportMetric(float64(sending.Microseconds())/float64(sent), "ms-sending/1000events")
		})
	}
}

// insertSpread commits n events over keys biz nos, event i of biz no i mod keys, 500 per
// transaction; a biz no's events are of four event types in turn, EVENT_0 to EVENT_3.
func insertSpread(b *testing.B, store *outbox.MySQLStore, n, keys int) {
	ctx := context.Background()
	for done := 0; done < n; {
		tx, err := store.BeginTx(ctx, nil)
		require.NoError(b, err)
		for i := 0; i < 500 && done < n; i++ {
			_, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: fmt.Sprintf("ORD-%d", done%keys), EventType: fmt.Sprintf("EVENT_%d", (done/keys)%4),
				Payload: fmt.Appendf(nil, `{"order":%d,"amount":12.5,"currency":"EUR"}`, done)})
			require.NoError(b, err)
			done++
		}
		require.NoError(b, tx.Commit())
	}
}

// dispatchTimer sums the time its sender spends in the Send calls of a publisher's rounds
// (each claimed batch's Dispatch, step after step), and counts the events stored and failed.
type dispatchTimer struct {
	outbox.Sender
	mu             sync.Mutex
	total          time.Duration
	stored, failed atomic.Int64
}

func (d *dispatchTimer) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	start := time.Now()
	errs := d.Sender.Send(ctx, evs, keyOrder)
	d.mu.Lock()
	d.total += time.Since(start)
	d.mu.Unlock()
	for _, err := range errs {
		if err == nil {
			d.stored.Add(1)
		} else {
			d.failed.Add(1)
		}
	}
	return errs
}

func (d *dispatchTimer) took() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.total
}

// sendCounter counts the Send calls its sender is given. Without a Close method of its own, the
// publishers given it leave its sender open.
type sendCounter struct {
	outbox.Sender
	calls atomic.Int64
}

func (c *sendCounter) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	c.calls.Add(1)
	return c.Sender.Send(ctx, evs, keyOrder)
}
