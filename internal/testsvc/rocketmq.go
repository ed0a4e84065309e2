package testsvc

import (
	"context"
	"fmt"
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
	// RocketMQDockerEnv, set to 1 when RocketMQNameServerEnv is unset, starts the official
	// apache/rocketmq image through testcontainers-go (for laptops with Docker, no Java).
	RocketMQDockerEnv = "OUTBOX_TEST_ROCKETMQ_DOCKER"
)

var rocketmqOnce = sync.OnceValues(findRocketMQ)

// RocketMQNameServer returns the test name server's address, skipping or failing t if there
// is none.
func RocketMQNameServer(t testing.TB) string {
	t.Helper()
	addr, err := rocketmqOnce()
	if err != nil {
		missing(t, err)
	}
	return addr
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

// NewTopic creates a fresh topic on the test broker and waits until its route can be read
// from the name server, so that producers and consumers can use it at once.
func NewTopic(t testing.TB, prefix string) string {
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
	if err := adm.CreateTopic(ctx, admin.WithTopicCreate(topic), admin.WithBrokerAddrCreate(brokerAddr()),
		admin.WithReadQueueNums(4), admin.WithWriteQueueNums(4)); err != nil {
		missing(t, fmt.Errorf("create topic %s on broker %s: %w", topic, brokerAddr(), err))
	}
	for {
		mqs, err := adm.FetchPublishMessageQueues(ctx, topic)
		if err == nil && len(mqs) > 0 {
			return topic
		}
		select {
		case <-ctx.Done():
			t.Fatalf("topic %s has no route after 60 s: %v", topic, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

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
	t.Cleanup(func() { _ = pc.Shutdown() })
	return c
}

// Messages returns a copy of everything received so far.
func (c *Consumer) Messages() []*primitive.MessageExt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*primitive.MessageExt(nil), c.msgs...)
}

// Deliveries returns, for every eventId received, how many times it arrived.
func (c *Consumer) Deliveries() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.byID))
	for k, v := range c.byID {
		out[k] = v
	}
	return out
}

// WaitDistinct waits until n distinct eventIds have arrived, or fails t after timeout.
func (c *Consumer) WaitDistinct(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		c.mu.Lock()
		got := len(c.byID)
		c.mu.Unlock()
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

// StopBroker stops the test broker (the name server stays up) and makes sure it is started
// again when t ends, whatever the outcome. Only a broker that scripts/rocketmq.sh started
// can be stopped.
func StopBroker(t testing.TB) {
	t.Helper()
	RocketMQNameServer(t)
	if out, err := exec.Command("bash", rocketmqScript(), "status").CombinedOutput(); err != nil {
		missing(t, fmt.Errorf("the broker was not started by scripts/rocketmq.sh, so this test cannot stop it: %v\n%s", err, out))
	}
	t.Cleanup(func() { StartBroker(t) })
	if out, err := exec.Command("bash", rocketmqScript(), "stop-broker").CombinedOutput(); err != nil {
		t.Fatalf("stop broker: %v\n%s", err, out)
	}
}

// StartBroker starts the test broker again, with the store it had, and waits until it has
// registered with the name server.
func StartBroker(t testing.TB) {
	t.Helper()
	if out, err := exec.Command("bash", rocketmqScript(), "start").CombinedOutput(); err != nil {
		t.Fatalf("start broker: %v\n%s", err, out)
	}
}
