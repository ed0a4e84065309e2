package testsvc

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
)

// OrderlySuspendPause is how long an [OrderlyConsumer]'s queue pauses after its listener
// refused a message, before the message is delivered again.
const OrderlySuspendPause = 100 * time.Millisecond

// Arrival is one delivery of a message to an [OrderlyConsumer].
type Arrival struct {
	EventID string
	Seq     int // this delivery's place among all the consumer's deliveries, from 1
	// Queue is the queue the message came from, StoreHost the broker address that stored it,
	// QueueOffset its place in the queue.
	Queue       primitive.MessageQueue
	StoreHost   string
	QueueOffset int64
	// Refused says the listener refused this delivery (see [OrderlyOptions.RefuseOnce]): the
	// message comes again.
	Refused bool
}

// Inversion is an event that arrived, for the first time, after a later event of its biz no.
type Inversion struct {
	BizNo   string
	EventID string // the event that came late
	After   string // the later event that came before it
	Seq     int    // the late arrival's Seq
}

func (i Inversion) String() string {
	return fmt.Sprintf("biz no %s: %s arrived (#%d) after the later %s", i.BizNo, i.EventID, i.Seq, i.After)
}

// OrderlyOptions tune [ConsumeOrderlyWith].
type OrderlyOptions struct {
	// RefuseOnce lists eventIds whose first delivery the listener refuses with
	// SuspendCurrentQueueAMoment: the queue stops for OrderlySuspendPause and the message
	// comes again, before anything after it in its queue.
	RefuseOnce []string
}

// OrderlyConsumer is a real orderly push consumer (consumer.WithConsumerOrder(true)): each
// queue is consumed by one goroutine at a time, in queue order, while the consumer holds the
// queue's lock on its broker. It records every delivery per biz no (the bizNo property).
//
// The consumer runs in a process of its own, the orderlyconsumer command beside this file,
// built without the race detector: the client's orderly consumer races itself
// (consumer/process_queue.go, takeMessages polls the message cache's size without the lock
// putMessage writes it under; upstream issue apache/rocketmq-client-go#1213, unfixed at the
// version in go.mod), which -race would report in every test that ran one.
type OrderlyConsumer struct {
	mu       sync.Mutex
	seq      int
	arrivals map[string][]Arrival // biz no -> its deliveries, in arrival order
	byID     map[string]int       // eventId -> accepted deliveries
}

// ConsumeOrderly subscribes a new consumer group to topic from its first offset, consuming
// orderly, and records what arrives until t ends.
func ConsumeOrderly(t testing.TB, topic string) *OrderlyConsumer {
	t.Helper()
	return ConsumeOrderlyWith(t, topic, OrderlyOptions{})
}

// ConsumeOrderlyWith is [ConsumeOrderly] with options.
func ConsumeOrderlyWith(t testing.TB, topic string, opts OrderlyOptions) *OrderlyConsumer {
	t.Helper()
	ns := RocketMQNameServer(t)
	bin, err := orderlyConsumerBinary()
	if err != nil {
		t.Fatalf("orderly consumer: %v", err)
	}
	c := &OrderlyConsumer{arrivals: map[string][]Arrival{}, byID: map[string]int{}}
	cmd := exec.Command(bin, "-namesrv", ns, "-topic", topic, "-group", UniqueTable("cg"),
		"-instance", UniqueTable("orderly"), "-pause", OrderlySuspendPause.String(),
		"-refuse-once", strings.Join(opts.RefuseOnce, ","))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatalf("orderly consumer: %v", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("orderly consumer: %v", err)
	}
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start orderly consumer: %v", err)
	}
	ready, done := make(chan bool, 1), make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var d delivery
			if err := json.Unmarshal(sc.Bytes(), &d); err != nil {
				continue
			}
			if d.Ready {
				ready <- true
				continue
			}
			c.record(d)
		}
		ready <- false
	}()
	stop := func() {
		_ = stdin.Close() // the consumer shuts down (no sooner than 3 s after its start) and exits
		kill := time.AfterFunc(time.Minute, func() { _ = cmd.Process.Kill() })
		<-done
		_ = cmd.Wait()
		kill.Stop()
	}
	select {
	case ok := <-ready:
		if !ok {
			stop()
			t.Fatalf("orderly consumer exited before it started: %s", stderr.String())
		}
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		stop()
		t.Fatalf("orderly consumer did not start within a minute: %s", stderr.String())
	}
	t.Cleanup(stop)
	return c
}

// delivery is a line of the orderlyconsumer command's output.
type delivery struct {
	Ready       bool                   `json:"ready"`
	BizNo       string                 `json:"bizNo"`
	EventID     string                 `json:"eventId"`
	Queue       primitive.MessageQueue `json:"queue"`
	StoreHost   string                 `json:"storeHost"`
	QueueOffset int64                  `json:"queueOffset"`
	Refused     bool                   `json:"refused"`
}

func (c *OrderlyConsumer) record(d delivery) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	c.arrivals[d.BizNo] = append(c.arrivals[d.BizNo], Arrival{EventID: d.EventID, Seq: c.seq, Queue: d.Queue,
		StoreHost: d.StoreHost, QueueOffset: d.QueueOffset, Refused: d.Refused})
	if !d.Refused {
		c.byID[d.EventID]++
	}
}

// orderlyConsumerBinary builds the orderlyconsumer command, once per test process.
var orderlyConsumerBinary = sync.OnceValues(func() (string, error) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("outbox-testsvc-%d", os.Getuid()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// Built under a name of this process's own, then renamed over the shared one: several
	// test processes may build at once.
	tmp := filepath.Join(dir, fmt.Sprintf("orderlyconsumer.%d", os.Getpid()))
	goCmd := "go" // the toolchain on PATH, as `go test` ran
	if gr := os.Getenv("GOROOT"); gr != "" {
		goCmd = filepath.Join(gr, "bin", "go")
	}
	build := exec.Command(goCmd, "build", "-o", tmp, "./internal/testsvc/orderlyconsumer")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./internal/testsvc/orderlyconsumer: %w\n%s", err, out)
	}
	bin := filepath.Join(dir, "orderlyconsumer")
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	return bin, nil
})

// lockedBuffer is a bytes.Buffer safe for a writer and a reader at once.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Arrivals returns, per biz no, a copy of its deliveries so far in arrival order.
func (c *OrderlyConsumer) Arrivals() map[string][]Arrival {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string][]Arrival, len(c.arrivals))
	for k, v := range c.arrivals {
		out[k] = append([]Arrival(nil), v...)
	}
	return out
}

// Deliveries returns, for every eventId received and accepted, how many times it was.
func (c *OrderlyConsumer) Deliveries() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.byID)
}

// WaitDistinct waits until n distinct eventIds have been accepted, or fails t after timeout.
func (c *OrderlyConsumer) WaitDistinct(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	waitDistinct(t, n, timeout, func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.byID)
	})
}

// Inversions returns every delivery that came, for the first time, after a later event of
// its biz no had come. rank gives an event's place in its biz no's order (its row id, say);
// an event arriving again after later ones (a repeat: a resend, a refused delivery) is no
// inversion, as long as it had come in order the first time.
func (c *OrderlyConsumer) Inversions(rank func(eventID string) int64) []Inversion {
	var out []Inversion
	for bizNo, arrivals := range c.Arrivals() {
		out = append(out, inversions(bizNo, arrivals, rank)...)
	}
	return out
}

// inversions is Inversions for one biz no's arrivals.
func inversions(bizNo string, arrivals []Arrival, rank func(string) int64) []Inversion {
	var out []Inversion
	seen := map[string]bool{}
	var latest string // the latest event (by rank) that has arrived
	for _, a := range arrivals {
		if seen[a.EventID] {
			continue
		}
		seen[a.EventID] = true
		if latest != "" && rank(a.EventID) < rank(latest) {
			out = append(out, Inversion{BizNo: bizNo, EventID: a.EventID, After: latest, Seq: a.Seq})
			continue
		}
		latest = a.EventID
	}
	return out
}
