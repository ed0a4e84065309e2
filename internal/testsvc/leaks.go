package testsvc

import (
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/go-outbox/outbox"
)

// RunWithLeakCheck is a test package's TestMain body: it silences the RocketMQ client's
// logger for the tests (importing the library leaves it alone; tests that read the client's
// logs route them to a sink of their own), runs the tests, and fails the run if goroutines
// started by them outlive them (see [FindLeaks]). It returns the exit code.
func RunWithLeakCheck(m *testing.M) int {
	outbox.RouteRocketMQClientLogs(slog.New(slog.DiscardHandler))
	// Goroutines that exist before any test (the RocketMQ client starts a cache janitor at
	// package init) are the process's, not the tests'.
	before := goleak.IgnoreCurrent()
	code := m.Run()
	if code == 0 {
		if err := FindLeaks(15*time.Second, append(RocketMQClientLifetimes, before)...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: goroutines outlived the tests:", err)
			code = 1
		}
	}
	return code
}

// RocketMQClientLifetimes are goroutines of the RocketMQ client that outlive a proper
// Shutdown, each for a reason in the client's own code (rocketmq-client-go v2, read there):
//   - the reader of the name-server connection every producer, consumer and admin opens
//     (internal/namesrv.go, NewNamesrv): nothing ever closes that connection. Broker
//     connections are closed by Shutdown; a producer never shut down still shows its
//     heartbeat and route goroutines, which are not ignored;
//   - the push consumer's statistics goroutines, which sleep until the next minute, hour or
//     month before they first look at their close signal (consumer/statistics.go);
//   - the push consumer's expired-message cleaner, which sleeps ConsumeTimeout (15 min)
//     first (consumer/push_consumer.go, Start);
//   - long-poll pulls in flight at Shutdown, whose responses never complete.
var RocketMQClientLifetimes = []goleak.Option{
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/internal/remote.(*remotingClient).receiveResponse"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*statsItemSet).init.func4"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*statsItemSet).init.func5"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*statsItemSet).init.func6"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*pushConsumer).Start.func1.2"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*pushConsumer).pullMessage"),
}

// FindLeaks reports goroutines still running after wait. The RocketMQ client's background
// goroutines sleep up to 10 s before they first look at their shutdown signal
// (internal/client.go, rmqClient.Start), so a client that was shut down properly still has
// goroutines for a while: they are waited for, not ignored, so a producer or consumer that
// is never shut down is still reported.
func FindLeaks(wait time.Duration, opts ...goleak.Option) error {
	deadline := time.Now().Add(wait)
	for {
		err := goleak.Find(opts...)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
}
