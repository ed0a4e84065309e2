package testsvc

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/moby/moby/api/types/container"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

const (
	// RocketMQNameServerEnv names the variable holding the test name server's address, e.g.
	// 127.0.0.1:9876 (bash scripts/rocketmq.sh start prints it).
	RocketMQNameServerEnv = "OUTBOX_TEST_ROCKETMQ_NAMESRV"
	// RocketMQBrokerEnv names the variable holding the broker's address, where tests create
	// their topics. Defaults to 127.0.0.1:10911.
	RocketMQBrokerEnv = "OUTBOX_TEST_ROCKETMQ_BROKER"
	// RocketMQBrokerBEnv names the variable holding the address of a second broker of the
	// same cluster and name server, broker-b, for the tests that need two brokers
	// (OUTBOX_ROCKETMQ_BROKERS=2 bash scripts/rocketmq.sh start prints it). Unset, those
	// tests skip (or fail under OUTBOX_REQUIRE_SERVICES=1).
	RocketMQBrokerBEnv = "OUTBOX_TEST_ROCKETMQ_BROKER_B"
	// RocketMQDockerEnv, set to 1 when RocketMQNameServerEnv is unset, starts the official
	// apache/rocketmq image through testcontainers-go (for laptops with Docker, no Java).
	RocketMQDockerEnv = "OUTBOX_TEST_ROCKETMQ_DOCKER"
)

var rocketmqOnce = sync.OnceValues(findRocketMQ)

// RocketMQNameServer returns the test name server's address, skipping or failing t if there
// is none.
func RocketMQNameServer(t testing.TB) string {
	t.Helper()
	return need(t, rocketmqOnce)
}

func findRocketMQ() (string, error) {
	if addr := os.Getenv(RocketMQNameServerEnv); addr != "" {
		return addr, nil
	}
	if os.Getenv(RocketMQDockerEnv) != "1" {
		return "", fmt.Errorf("no RocketMQ broker: set %s (bash scripts/rocketmq.sh start runs one from Maven Central's jars and prints it), or %s=1 to start one with Docker",
			RocketMQNameServerEnv, RocketMQDockerEnv)
	}
	if !dockerReachable() {
		return "", fmt.Errorf("no RocketMQ broker: %s=1 but no Docker engine is reachable", RocketMQDockerEnv)
	}
	return startRocketMQContainer()
}

// startRocketMQContainer runs a name server and a broker in one container on the host's
// network, so that the broker's advertised 127.0.0.1:10911 is the address clients dial
// (with port mapping the broker would advertise an address inside the container). Host
// networking needs Linux, or Docker Desktop with host networking enabled. The container is
// removed by testcontainers' reaper when the test process exits.
func startRocketMQContainer() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const brokerConf = "brokerClusterName=DefaultCluster\\nbrokerName=broker-a\\nbrokerId=0\\n" +
		"brokerIP1=127.0.0.1\\nlistenPort=10911\\nautoCreateTopicEnable=true\\n" +
		"autoCreateSubscriptionGroup=true\\nflushDiskType=ASYNC_FLUSH\\ntimerWheelEnable=false\\n"
	req := testcontainers.ContainerRequest{
		Image: "apache/rocketmq:5.3.2",
		Env:   map[string]string{"JAVA_OPT_EXT": "-Xms256m -Xmx512m"},
		Cmd: []string{"sh", "-c", "printf '" + brokerConf + "' > /tmp/broker.conf && " +
			"(mqnamesrv > /tmp/namesrv.log 2>&1 &) && exec mqbroker -n 127.0.0.1:9876 -c /tmp/broker.conf"},
		HostConfigModifier: func(hc *container.HostConfig) { hc.NetworkMode = "host" },
		WaitingFor:         wait.ForLog("boot success").WithStartupTimeout(3 * time.Minute),
	}
	if _, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{ContainerRequest: req, Started: true}); err != nil {
		return "", fmt.Errorf("no RocketMQ broker: testcontainers could not start apache/rocketmq: %w", err)
	}
	return "127.0.0.1:9876", nil
}

func brokerAddr() string {
	if a := os.Getenv(RocketMQBrokerEnv); a != "" {
		return a
	}
	return "127.0.0.1:10911"
}

// RocketMQBrokerB returns the second broker's address, skipping or failing t if there is
// none.
func RocketMQBrokerB(t testing.TB) string {
	t.Helper()
	RocketMQNameServer(t)
	addr := os.Getenv(RocketMQBrokerBEnv)
	if addr == "" {
		missing(t, fmt.Errorf("no second broker: set %s (OUTBOX_ROCKETMQ_BROKERS=2 bash scripts/rocketmq.sh start runs broker-b and prints it)", RocketMQBrokerBEnv))
	}
	return addr
}

// NewTopic creates a fresh topic on the test broker and waits until its route can be read
// from the name server, so that producers and consumers can use it at once.
func NewTopic(t testing.TB, prefix string) string {
	t.Helper()
	RocketMQNameServer(t)
	return newTopic(t, prefix, brokerAddr())
}

// NewClusterTopic creates a fresh topic on both brokers, broker-a and broker-b (see
// [RocketMQBrokerB]), and waits until its route names both.
func NewClusterTopic(t testing.TB, prefix string) string {
	t.Helper()
	return newTopic(t, prefix, brokerAddr(), RocketMQBrokerB(t))
}

// NewTopicOnEveryBroker creates a fresh topic on broker-a and, when a second broker is
// configured (see [RocketMQBrokerB]), on broker-b too, and returns it with the number of
// brokers it is on. For tests that want a topic spread over brokers where there are several,
// and run on one broker where there is one.
func NewTopicOnEveryBroker(t testing.TB, prefix string) (topic string, brokers int) {
	t.Helper()
	RocketMQNameServer(t)
	if b := os.Getenv(RocketMQBrokerBEnv); b != "" {
		return newTopic(t, prefix, brokerAddr(), b), 2
	}
	return newTopic(t, prefix, brokerAddr()), 1
}

// NewTopicOnBrokerB creates a fresh topic on broker-b alone.
func NewTopicOnBrokerB(t testing.TB, prefix string) string {
	t.Helper()
	return newTopic(t, prefix, RocketMQBrokerB(t))
}

func newTopic(t testing.TB, prefix string, brokers ...string) string {
	t.Helper()
	ns := RocketMQNameServer(t)
	topic := UniqueTable(prefix)
	adm, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver([]string{ns})))
	if err != nil {
		t.Fatalf("rocketmq admin: %v", err)
	}
	defer adm.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, broker := range brokers {
		if err := adm.CreateTopic(ctx, admin.WithTopicCreate(topic), admin.WithBrokerAddrCreate(broker),
			admin.WithReadQueueNums(4), admin.WithWriteQueueNums(4)); err != nil {
			missing(t, fmt.Errorf("create topic %s on broker %s: %w", topic, broker, err))
		}
	}
	for {
		mqs, err := adm.FetchPublishMessageQueues(ctx, topic)
		names := map[string]bool{}
		for _, mq := range mqs {
			names[mq.BrokerName] = true
		}
		if err == nil && len(names) >= len(brokers) {
			return topic
		}
		select {
		case <-ctx.Done():
			t.Fatalf("topic %s has no route on %d brokers after 60 s (route: %v): %v", topic, len(brokers), names, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// consumerSettle is the least time a test consumer runs before it is shut down: longer than
// the rebalance its own registration starts.
const consumerSettle = 3 * time.Second

// Consumer is a real push consumer that records every message it receives.
type Consumer struct {
	mu   sync.Mutex
	msgs []*primitive.MessageExt
	byID map[string]int // eventId -> deliveries
}

// Consume subscribes a new consumer group to topic from its first offset and records what
// arrives until t ends.
func Consume(t testing.TB, topic string) *Consumer {
	t.Helper()
	ns := RocketMQNameServer(t)
	c := &Consumer{byID: map[string]int{}}
	pc, err := rocketmq.NewPushConsumer(
		consumer.WithNameServer([]string{ns}),
		consumer.WithGroupName(UniqueTable("cg")),
		consumer.WithInstance(UniqueTable("consumer")),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
	)
	if err != nil {
		t.Fatalf("new push consumer: %v", err)
	}
	err = pc.Subscribe(topic, consumer.MessageSelector{}, func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, m := range msgs {
			c.msgs = append(c.msgs, m)
			c.byID[m.GetProperty("eventId")]++
		}
		return consumer.ConsumeSuccess, nil
	})
	if err != nil {
		t.Fatalf("subscribe %s: %v", topic, err)
	}
	if err := pc.Start(); err != nil {
		t.Fatalf("start push consumer: %v", err)
	}
	started := time.Now()
	t.Cleanup(func() {
		// The client races with itself when a push consumer is shut down while the
		// rebalance that its own registration set off is still running (its Shutdown writes
		// the client's state unguarded, which that rebalance reads: rocketmq-client-go,
		// internal/client.go, Shutdown and InvokeSync), and -race reports it. A consumer
		// shut down within a few seconds of its start is let finish that rebalance first.
		time.Sleep(time.Until(started.Add(consumerSettle)))
		_ = pc.Shutdown()
	})
	return c
}

// Messages returns a copy of everything received so far.
func (c *Consumer) Messages() []*primitive.MessageExt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*primitive.MessageExt(nil), c.msgs...)
}

// StoreHosts returns, for every broker address that stored a message received so far, how
// many it stored.
func (c *Consumer) StoreHosts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for _, m := range c.msgs {
		out[m.StoreHost]++
	}
	return out
}

// Deliveries returns, for every eventId received, how many times it arrived.
func (c *Consumer) Deliveries() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.byID)
}

// WaitDistinct waits until n distinct eventIds have arrived, or fails t after timeout.
func (c *Consumer) WaitDistinct(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	waitDistinct(t, n, timeout, func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.byID)
	})
}

// waitDistinct polls distinct until it reaches n, or fails t after timeout.
func waitDistinct(t testing.TB, n int, timeout time.Duration, distinct func() int) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := distinct()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d distinct events arrived within %s", got, n, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rocketmqScript is scripts/rocketmq.sh, found from this file's place in the repository.
func rocketmqScript() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "scripts", "rocketmq.sh")
}

// script runs scripts/rocketmq.sh with args. It acts on the instance the OUTBOX_ROCKETMQ_*
// variables name (the defaults if unset; `start` prints them).
func script(args ...string) ([]byte, error) {
	return exec.Command("bash", append([]string{rocketmqScript()}, args...)...).CombinedOutput()
}

// RocketMQDirEnv names the script's work directory. The tests that stop a broker run only
// when it is set (eval the output of scripts/rocketmq.sh start, as CI does): a broker that
// was started for others is never stopped because its name server was exported.
const RocketMQDirEnv = "OUTBOX_ROCKETMQ_DIR"

// requireScriptInstance skips or fails t unless the test RocketMQ instance was started by
// scripts/rocketmq.sh and named by its OUTBOX_ROCKETMQ_* variables, so that the script can
// stop and start its brokers.
func requireScriptInstance(t testing.TB) {
	t.Helper()
	RocketMQNameServer(t)
	if os.Getenv(RocketMQDirEnv) == "" {
		missing(t, fmt.Errorf("this test stops a broker: eval the output of bash scripts/rocketmq.sh start, which sets %s", RocketMQDirEnv))
	}
	if out, err := script("status"); err != nil {
		missing(t, fmt.Errorf("the brokers were not started by scripts/rocketmq.sh (or not with the OUTBOX_ROCKETMQ_* variables it printed), so this test cannot stop one: %w\n%s", err, out))
	}
}

// StopBroker stops the test broker, broker-a (the name server stays up), and makes sure it
// is started again when t ends, whatever the outcome. Only a broker that
// scripts/rocketmq.sh started can be stopped.
func StopBroker(t testing.TB) {
	t.Helper()
	requireScriptInstance(t)
	t.Cleanup(func() { StartBroker(t) })
	if out, err := script("stop-broker", "broker-a"); err != nil {
		t.Fatalf("stop broker-a: %v\n%s", err, out)
	}
}

// StartBroker starts the test broker again, with the store it had, and waits until it has
// registered with the name server.
func StartBroker(t testing.TB) {
	t.Helper()
	if out, err := script("start"); err != nil {
		t.Fatalf("start broker: %v\n%s", err, out)
	}
}

// KillBrokerB kills broker-b with SIGKILL, a crash: no shutdown hook runs, nothing is
// unregistered from the name server. It is started again when t ends, whatever the
// outcome (see [StartBrokerB]).
func KillBrokerB(t testing.TB) {
	t.Helper()
	RocketMQBrokerB(t)
	requireScriptInstance(t)
	t.Cleanup(func() { StartBrokerB(t) })
	if out, err := script("stop-broker", "broker-b", "--kill"); err != nil {
		t.Fatalf("kill broker-b: %v\n%s", err, out)
	}
}

// StartBrokerB starts broker-b again, with the store it had, and waits until it has
// registered with the name server. Nothing happens if it runs.
func StartBrokerB(t testing.TB) {
	t.Helper()
	if out, err := script("start-broker", "broker-b"); err != nil {
		t.Fatalf("start broker-b: %v\n%s", err, out)
	}
}
