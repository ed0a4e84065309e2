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

	"github.com/apache/rocketmq-client-go/v2/rlog"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// insertLoad commits small transactions of events into the bundle's table until stop is
// closed, and returns how many it inserted once it has stopped.
func insertLoad(t *testing.T, b *bundle, stop <-chan struct{}) func() int {
	t.Helper()
	var n atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx := context.Background()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			tx, err := b.store.BeginTx(ctx, nil)
			if err != nil {
				t.Errorf("begin: %v", err)
				return
			}
			for j := range 5 {
				if _, err := outbox.InsertForTest(ctx, tx, outbox.EventInput{
					BizNo: fmt.Sprintf("Q-%d-%d", i, j), EventType: "QUIET", Payload: []byte(`{}`),
				}); err != nil {
					_ = tx.Rollback()
					t.Errorf("insert: %v", err)
					return
				}
			}
			if err := tx.Commit(); err != nil {
				t.Errorf("commit: %v", err)
				return
			}
			n.Add(5)
		}
	}()
	return func() int { <-done; return int(n.Load()) }
}

// A clean Close is quiet: a publisher that sends to the real broker under a steady insert
// load, closed many times (after it has run a while, and while it is still starting), logs
// nothing at warn or above, neither itself nor the RocketMQ client, and leaves no row
// SENDING. Not parallel: the RocketMQ client's log route is process-wide.
func TestCloseIsQuiet(t *testing.T) {
	b := setup(t)
	topic := testsvc.NewTopic(t, "OUTBOX_QUIET")
	b.routeTo(topic)
	logs := &logSink{}
	outbox.RouteRocketMQClientLogs(slog.New(logs))
	defer outbox.RouteRocketMQClientLogs(slog.New(slog.DiscardHandler))
	stop := make(chan struct{})
	inserted := insertLoad(t, b, stop)
	stopLoad := sync.OnceFunc(func() { close(stop) })
	defer func() { stopLoad(); inserted() }() // before the cleanups close the database
	const closes = 30
	for i := range closes {
		sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
			NameServers: []string{testsvc.RocketMQNameServer(t)},
			GroupName:   testsvc.UniqueTable("pg"),
			// The default's 3 s an attempt: an attempt that times out on a loaded machine is
			// retried with a warning of the client's that has nothing to do with Close.
			SendTimeout: 9 * time.Second,
		})
		require.NoError(t, err)
		cfg := fastConfig(fmt.Sprintf("quiet-%d", i), logs)
		cfg.Tuning.SendTimeout = 0     // the sender's
		cfg.Tuning.Lease = time.Minute // a row left SENDING stays so until the end of the test
		p := newPublisher(t, b.store, sender, cfg)
		if i%4 == 3 {
			// Close while the publisher starts.
			var wg sync.WaitGroup
			wg.Go(func() {
				err := p.Start(context.Background())
				if err != nil {
					assert.ErrorIs(t, err, outbox.ErrClosed)
				}
			})
			time.Sleep(time.Duration(i) * time.Millisecond)
			require.NoError(t, p.Close())
			wg.Wait()
		} else {
			require.NoError(t, p.Start(context.Background()))
			time.Sleep(time.Duration(100+20*i) * time.Millisecond)
			require.NoError(t, p.Close())
		}
		assert.Zero(t, b.countStatus(t, outbox.StatusSending), "close %d left rows SENDING", i)
		if w := logs.atLeast(slog.LevelWarn); len(w) > 0 {
			t.Errorf("close %d (of %d) logged at warn or above: %q", i, closes, w)
			break
		}
	}
	stopLoad()
	n := inserted()
	t.Logf("%d events inserted; %d sent", n, b.countStatus(t, outbox.StatusSuccess))
	assert.Greater(t, b.countStatus(t, outbox.StatusSuccess), 0, "the publishers sent under load")
}

// checkFails is a store whose Check fails as an unreachable database does.
type checkFails struct{ outbox.Store }

func (s checkFails) Check(context.Context) (outbox.StoreInfo, error) {
	return outbox.StoreInfo{}, errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
}

// The control of TestCloseIsQuiet: real faults still warn. A table that cannot be checked
// is a warning at Start, and a broker nothing listens on is an error, each however the
// publisher is closed afterwards.
func TestCloseIsQuietButFaultsStillWarn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	logs := &logSink{}
	p := newPublisher(t, checkFails{b.store}, newRecorder(), fastConfig("quiet-check", logs))
	require.NoError(t, p.Start(context.Background()))
	require.NoError(t, p.Close())
	assert.Equal(t, 1, logs.count(slog.LevelWarn, "could not check the table"))

	b.insert(t, 3)
	down, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
		NameServers: []string{"127.0.0.1:1"}, // nothing listens there
		GroupName:   testsvc.UniqueTable("pg"),
		SendTimeout: 300 * time.Millisecond,
	})
	require.NoError(t, err)
	logs = &logSink{}
	cfg := fastConfig("quiet-down", logs)
	cfg.Tuning.SendTimeout = 0 // the sender's
	p = newPublisher(t, b.store, down, cfg)
	require.NoError(t, p.Start(context.Background()))
	require.Eventually(t, func() bool { return logs.count(slog.LevelError, "broker unavailable") > 0 },
		time.Minute, 20*time.Millisecond, "the broker's outage is an error")
	require.NoError(t, p.Close())
	assert.Zero(t, b.countStatus(t, outbox.StatusSending), "the close released what it held")
}

// The RocketMQ client's warning that a consumer's queue was dropped with a delivery in
// progress, which a clean shutdown of a consumer logs (the message comes again), is routed
// at debug, and so is an error of a rebalance whose client was shut down under it (the
// client gives its cause as an error value); the client's other warnings and errors keep
// their level. Not parallel: the route is process-wide.
func TestRouteRocketMQClientLogsLowersShutdownNoise(t *testing.T) {
	logs := &logSink{}
	outbox.RouteRocketMQClientLogs(slog.New(logs))
	t.Cleanup(func() { outbox.RouteRocketMQClientLogs(slog.New(slog.DiscardHandler)) })
	rlog.Warning("processQueue is dropped without process consume result.", map[string]any{"MessageQueue": "q"})
	rlog.Warning("start retrying to send, ", map[string]any{"lastBroker": "broker-a"})
	const members = "get consumer list of group from broker error"
	rlog.Error(members, map[string]any{"underlayError": errors.New("service close is not running, please check")})
	rlog.Error(members, map[string]any{"underlayError": errors.New("dial tcp 127.0.0.1:10911: connect: connection refused")})
	assert.Equal(t, 1, logs.count(slog.LevelDebug, "processQueue is dropped"))
	assert.Equal(t, 1, logs.count(slog.LevelWarn, "start retrying to send"))
	assert.Equal(t, 1, logs.count(slog.LevelError, members), "a broker that refuses the call is an error")
	assert.Len(t, logs.atLeast(slog.LevelWarn), 2)
}
