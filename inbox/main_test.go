package inbox_test

import (
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/go-outbox/outbox"
)

func TestMain(m *testing.M) {
	// The consumers the tests start stay quiet: the RocketMQ client's logger writes to stderr
	// unless routed.
	outbox.RouteRocketMQClientLogs(slog.New(slog.DiscardHandler))
	// Goroutines that exist before any test (the RocketMQ client starts a cache janitor at
	// package init) are the process's, not the tests'.
	before := goleak.IgnoreCurrent()
	code := m.Run()
	if code == 0 {
		if err := findLeaks(15*time.Second, append(rocketmqClientLifetimes, before)...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: goroutines outlived the tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// rocketmqClientLifetimes are goroutines of the RocketMQ client that outlive a proper
// Shutdown, each for a reason in the client's own code (rocketmq-client-go v2):
//   - the reader of the name-server connection every consumer opens (internal/namesrv.go,
//     NewNamesrv): nothing ever closes that connection;
//   - the push consumer's statistics goroutines, which sleep until the next minute, hour or
//     month before they first look at their close signal (consumer/statistics.go);
//   - the push consumer's expired-message cleaner, which sleeps ConsumeTimeout (15 min)
//     first (consumer/push_consumer.go, Start);
//   - long-poll pulls in flight at Shutdown, whose responses never complete.
var rocketmqClientLifetimes = []goleak.Option{
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/internal/remote.(*remotingClient).receiveResponse"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*statsItemSet).init.func4"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*statsItemSet).init.func5"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*statsItemSet).init.func6"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*pushConsumer).Start.func1.2"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*pushConsumer).pullMessage"),
}

// findLeaks reports goroutines still running after wait: the RocketMQ client's background
// goroutines sleep up to 10 s before they first look at their shutdown signal, so they are
// waited for, not ignored, and a consumer that is never shut down is still reported.
func findLeaks(wait time.Duration, opts ...goleak.Option) error {
	deadline := time.Now().Add(wait)
	for {
		err := goleak.Find(opts...)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
}
