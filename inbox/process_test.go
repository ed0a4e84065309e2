package inbox_test

import (
	"bufio"
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// The tests here run consumers in processes of their own: the test binary re-runs itself
// with consumerChildEnv set, and TestConsumerChildProcess is then a consumer of the
// configuration that variable holds, until its stdin closes or it is killed. A process can
// be SIGKILLed for real (no deferred code, no clean shutdown), and an orderly consumer can
// run without the race detector: the RocketMQ client's orderly consumer races itself
// (consumer/process_queue.go: takeMessages reads the message cache without the lock that
// putMessage writes it under; apache/rocketmq-client-go#1213), which -race reports in any
// test that runs one.
const consumerChildEnv = "INBOX_TEST_CONSUMER_CHILD"

// childConfig is what a consumer process consumes, and how its handler behaves. The
// handler writes the effect row as the rig's does (handled_by = Name) and announces each
// call on stdout: "CALL <event id> <deliveries> <the message's RETRY_TOPIC property, the
// topic it was sent back from, or ->".
type childConfig struct {
	DSN        string
	NameServer string
	Topic      string
	Group      string
	InboxTable string
	Effects    string
	Name       string

	Orderly       bool
	RetryPause    time.Duration
	MaxDeliveries int
	// FailEvent's every delivery fails, after its effect is written.
	FailEvent string
	// FailOnceEvent's first delivery fails, after its effect is written.
	FailOnceEvent string
	// BlockBizNo's handler announces "BLOCKED <event id>" after writing its effect, and
	// then never returns.
	BlockBizNo string
	// Runs, when set, is a table (see createRunsTable) the handler records its run in, in
	// its transaction: the biz no, Name, and when the run began and ended; each run lasts
	// at least Pause.
	Runs  string
	Pause time.Duration
	// ClientStrategy has the push consumer allocate queues with the client's own strategy
	// instead of the consumer's, and renew its locks at the client's default interval: none
	// of the consumer's handing over of queues.
	ClientStrategy bool
	// Loud has the process announce every record at warn or above, of the inbox and of
	// the RocketMQ client (routed by outbox.RouteRocketMQClientLogs): "LOUD <message>".
	Loud bool
	// Credentials are the consumer's (ConsumerConfig.Credentials); with InOptionsOnly,
	// given as consumer.WithCredentials among ConsumerOptions instead.
	Credentials   primitive.Credentials
	InOptionsOnly bool
	// TLS is ConsumerConfig.TLS.
	TLS bool
	// Linger keeps the process that long after its consumer has closed, still announcing
	// what it logs, before it exits.
	Linger time.Duration
}

// loudHandler announces, through say, every record at warn or above with its attributes.
type loudHandler struct {
	say func(format string, args ...any)
}

func (h loudHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h loudHandler) Handle(_ context.Context, r slog.Record) error {
	s := r.Message
	r.Attrs(func(a slog.Attr) bool { s += " " + a.String(); return true })
	h.say("LOUD %s", strings.ReplaceAll(s, "\n", " "))
	return nil
}
func (h loudHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h loudHandler) WithGroup(string) slog.Handler      { return h }

// TestConsumerChildProcess is the consumer process; it skips unless run as one.
func TestConsumerChildProcess(t *testing.T) {
	raw := os.Getenv(consumerChildEnv)
	if raw == "" {
		t.Skip("the consumer process of the tests in process_test.go: runs only as their child")
	}
	os.Exit(runConsumerChild(raw))
}

func runConsumerChild(raw string) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "consumer process:", err)
		return 2
	}
	var cfg childConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		return fail(err)
	}
	db, err := sql.Open("mysql", cfg.DSN)
	if err != nil {
		return fail(err)
	}
	defer db.Close()
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	logger := slog.New(slog.DiscardHandler)
	if cfg.Loud {
		logger = slog.New(loudHandler{say: say})
		outbox.RouteRocketMQClientLogs(logger)
	}
	in, err := inbox.New(db, inbox.Config{Group: cfg.Group, Table: cfg.InboxTable, MaxDeliveries: cfg.MaxDeliveries,
		Logger: logger})
	if err != nil {
		return fail(err)
	}
	q := "INSERT INTO `" + cfg.Effects + "` (event_id, biz_no, deliveries, handled_by) VALUES (?, ?, ?, ?)"
	h := func(ctx context.Context, tx *sql.Tx, msg *inbox.Message) error {
		say("CALL %s %d %s", msg.EventID, msg.Deliveries, cmp.Or(msg.Properties["RETRY_TOPIC"], "-"))
		if _, err := tx.ExecContext(ctx, q, msg.EventID, msg.BizNo, msg.Deliveries, cfg.Name); err != nil {
			return err
		}
		if cfg.Runs != "" {
			start := time.Now()
			time.Sleep(cfg.Pause)
			if _, err := tx.ExecContext(ctx, "INSERT INTO `"+cfg.Runs+"` (biz_no, handled_by, started, ended) VALUES (?, ?, ?, ?)",
				msg.BizNo, cfg.Name, start.UnixMicro(), time.Now().UnixMicro()); err != nil {
				return err
			}
		}
		switch {
		case msg.EventID == cfg.FailEvent:
			return errors.New("this event fails every delivery")
		case msg.EventID == cfg.FailOnceEvent && msg.Deliveries == 1:
			return errors.New("this event's first delivery fails")
		case msg.BizNo == cfg.BlockBizNo && cfg.BlockBizNo != "":
			say("BLOCKED %s", msg.EventID)
			time.Sleep(time.Hour) // until the process is killed
		}
		return nil
	}
	ccfg := inbox.ConsumerConfig{NameServers: []string{cfg.NameServer}, Topic: cfg.Topic,
		Orderly: cfg.Orderly, RetryPause: cfg.RetryPause, TLS: cfg.TLS}
	if cfg.ClientStrategy {
		ccfg.ConsumerOptions = []consumer.Option{consumer.WithStrategy(consumer.AllocateByAveragely),
			consumer.WithRebalanceLockInterval(20 * time.Second)}
	}
	if cfg.InOptionsOnly {
		ccfg.ConsumerOptions = append(ccfg.ConsumerOptions, consumer.WithCredentials(cfg.Credentials))
	} else {
		ccfg.Credentials = cfg.Credentials
	}
	c, err := inbox.NewConsumer(in, h, ccfg)
	if err != nil {
		return fail(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	say("RUNNING")
	_, _ = io.Copy(io.Discard, os.Stdin) // until the test closes stdin
	_ = c.Close()
	// ErrClosed: the Close came before the start was done (a consumer closed as it starts).
	if err := <-done; err != nil && !errors.Is(err, outbox.ErrClosed) {
		return fail(err)
	}
	say("CLOSED")
	time.Sleep(cfg.Linger)
	return 0
}

// call is a handler call a consumer process announced.
type call struct {
	EventID    string
	Deliveries int
	RetryTopic string    // the topic the message was sent back from; empty on a first delivery
	At         time.Time // when the test read the announcement
}

// consumerProc is a consumer process.
type consumerProc struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	blocked chan string // the event id of each BLOCKED line
	exited  chan struct{}

	mu    sync.Mutex
	calls []call
	loud  []string // what the process logged at warn or above (childConfig.Loud)
	err   error    // Wait's
}

// startConsumer starts a consumer process of cfg (the rig's topic, group and tables filled
// in) from bin, and stops it when t ends if it still runs.
func (r *consRig) startConsumer(t *testing.T, bin string, cfg childConfig) *consumerProc {
	t.Helper()
	cfg.NameServer, cfg.Topic, cfg.Group, cfg.Credentials = r.ns, r.topic, r.group, r.creds
	cfg.InboxTable, cfg.Effects = r.inTable, r.effects
	if cfg.DSN == "" {
		cfg.DSN = testsvc.MySQLDSN(t)
	}
	raw, err := json.Marshal(cfg)
	require.NoError(t, err)
	p := &consumerProc{blocked: make(chan string, 16), exited: make(chan struct{})}
	p.cmd = exec.Command(bin, "-test.run=^TestConsumerChildProcess$")
	p.cmd.Env = append(os.Environ(), consumerChildEnv+"="+string(raw))
	p.cmd.Stderr = os.Stderr
	p.stdin, err = p.cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := p.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, p.cmd.Start())
	running := make(chan struct{})
	go func() {
		defer close(p.exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			word, rest, _ := strings.Cut(sc.Text(), " ")
			switch word {
			case "RUNNING":
				close(running)
			case "BLOCKED":
				p.blocked <- rest
			case "LOUD":
				p.mu.Lock()
				p.loud = append(p.loud, rest)
				p.mu.Unlock()
			case "CALL":
				f := append(strings.Fields(rest), "", "", "")
				deliveries, _ := strconv.Atoi(f[1])
				c := call{EventID: f[0], Deliveries: deliveries, At: time.Now()}
				if f[2] != "-" {
					c.RetryTopic = f[2]
				}
				p.mu.Lock()
				p.calls = append(p.calls, c)
				p.mu.Unlock()
			}
		}
		err := p.cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
	}()
	select {
	case <-running:
	case <-p.exited:
		t.Fatalf("consumer process %s exited before it ran: %v", cfg.Name, p.waitErr())
	case <-time.After(time.Minute):
		_ = p.cmd.Process.Kill()
		t.Fatalf("consumer process %s did not start within a minute", cfg.Name)
	}
	t.Cleanup(func() {
		select {
		case <-p.exited:
			return
		default:
		}
		_ = p.stdin.Close() // the consumer closes and the process exits
		select {
		case <-p.exited:
		case <-time.After(time.Minute):
			_ = p.cmd.Process.Kill()
			<-p.exited
			t.Errorf("consumer process %s did not stop within a minute of its stdin closing", cfg.Name)
		}
	})
	return p
}

func (p *consumerProc) waitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// stop closes the process's consumer and waits for the process to exit.
func (p *consumerProc) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, p.stdin.Close())
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		t.Fatal("the consumer process did not stop within a minute")
	}
	require.NoError(t, p.waitErr(), "the consumer process's exit")
}

// kill SIGKILLs the process and waits until it is dead.
func (p *consumerProc) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	<-p.exited
	var exitErr *exec.ExitError
	require.ErrorAs(t, p.waitErr(), &exitErr)
	require.Equal(t, syscall.SIGKILL, exitErr.Sys().(syscall.WaitStatus).Signal())
}

// loudRecords is every record at warn or above the process announced, in order.
func (p *consumerProc) loudRecords() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.loud...)
}

// handlerCalls is every handler call the process announced, in order.
func (p *consumerProc) handlerCalls() []call {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]call(nil), p.calls...)
}

// plainTestBinary builds this package's test binary without the race detector, once per
// test process: for the orderly consumers (see consumerChildEnv). It is built under a name
// of this process's own, in a directory where the binaries of test processes that have
// ended are removed.
var plainTestBinary = sync.OnceValues(func() (string, error) {
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("inbox-test-%d", os.Getuid()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	old, _ := filepath.Glob(filepath.Join(dir, "inbox.test.*"))
	for _, f := range old {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Ext(f), "."))
		if err == nil && errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			_ = os.Remove(f)
		}
	}
	bin := filepath.Join(dir, fmt.Sprintf("inbox.test.%d", os.Getpid()))
	goCmd, err := exec.LookPath("go")
	if err != nil {
		goCmd = "go"
	}
	build := exec.Command(goCmd, "test", "-c", "-o", bin, ".")
	build.Dir = filepath.Dir(file)
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go test -c (without -race): %w\n%s", err, out)
	}
	return bin, nil
})

func plainBinary(t *testing.T) string {
	t.Helper()
	bin, err := plainTestBinary()
	require.NoError(t, err)
	return bin
}

// A consumer process is SIGKILLed in the middle of a handler, its effect written and its
// transaction open. The transaction never commits; a second consumer of the group, started
// afterwards, is delivered the message again and its effect happens once. The events the
// first process had handled, and whose acknowledgement may not have reached the broker, are
// suppressed.
func TestConsumerProcessKilledMidHandler(t *testing.T) {
	t.Parallel()
	r := newConsRig(t, consRigOptions{})
	r.publish(t)
	victim := r.startConsumer(t, os.Args[0], childConfig{Name: "victim", BlockBizNo: "MARKER"})
	ok := r.insert(t, "ORD-A", 10)
	marker := r.insertOne(t, "MARKER", `{"marker":true}`)
	ok = append(ok, r.insert(t, "ORD-B", 10)...)
	select {
	case id := <-victim.blocked:
		require.Equal(t, marker, id)
	case <-time.After(45 * time.Second):
		t.Fatal("the marker's handler never ran")
	}
	r.waitEffects(t, len(ok), 45*time.Second) // the others are handled around it
	victim.kill(t)
	for _, e := range r.effectRows(t) {
		require.NotEqual(t, marker, e.EventID, "the killed handler's effect was never committed")
	}

	r.consume(t, r.effectHandler("survivor", nil), inbox.ConsumerConfig{})
	r.waitEffects(t, len(ok)+1, 45*time.Second)
	byID := r.checkLedger(t)
	require.Len(t, byID[marker], 1)
	assert.Equal(t, "survivor", byID[marker][0].HandledBy, "the marker redelivered to the survivor")
	for _, id := range ok {
		assert.Equal(t, "victim", byID[id][0].HandledBy)
	}
	calls := victim.handlerCalls()
	assert.Len(t, calls, len(ok)+1, "the victim ran the handler once for each event")
	t.Logf("outcomes in the survivor %v", r.outcomes(t))
}

// Orderly: a store in key order, several events per biz no committed in order, and an
// orderly consumer (in a process of its own, see consumerChildEnv). Each biz no's effects
// happen in commit order. One event fails every delivery: with MaxDeliveries 3 it holds its
// queue for three deliveries, is then rejected, and its queue (its own biz no's later events
// included) goes on.
func TestConsumerOrderlyHandlesEachKeyInOrder(t *testing.T) {
	t.Parallel()
	bin := plainBinary(t)
	r := newConsRig(t, consRigOptions{ordering: outbox.KeyOrder, maxDeliveries: 3})
	const keys, per = 6, 8
	var poison string
	for i := range per {
		for k := range keys {
			id := r.insertOne(t, fmt.Sprintf("KEY-%d", k), fmt.Sprintf(`{"n":%d}`, i))
			if k == 2 && i == 3 {
				poison = id
			}
		}
	}
	r.publish(t)
	p := r.startConsumer(t, bin, childConfig{Name: "orderly", Orderly: true, RetryPause: 100 * time.Millisecond,
		MaxDeliveries: 3, FailEvent: poison})
	r.waitEffects(t, keys*per-1, 50*time.Second)
	require.Eventually(t, func() bool {
		rej, err := r.in.Rejected(context.Background(), 0, 10)
		return err == nil && len(rej) == 1
	}, 20*time.Second, 100*time.Millisecond, "the failing event is rejected")
	p.stop(t)

	r.checkLedger(t, poison)
	want := map[string][]string{} // each biz no's events in commit order
	for _, ev := range r.committed(t) {
		if ev.EventID != poison {
			want[ev.BizNo] = append(want[ev.BizNo], ev.EventID)
		}
	}
	got := map[string][]string{}
	for _, e := range r.effectRows(t) {
		got[e.BizNo] = append(got[e.BizNo], e.EventID)
	}
	assert.Equal(t, want, got, "each biz no's effects in commit order")

	rej, err := r.in.Rejected(context.Background(), 0, 10)
	require.NoError(t, err)
	require.Len(t, rej, 1)
	assert.Equal(t, poison, rej[0].Message.EventID)
	assert.Equal(t, "max_deliveries", rej[0].ReasonClass)
	assert.Equal(t, 3, rej[0].Message.Deliveries)

	// The failing event held its queue: its biz no's earlier events were first delivered
	// before its first delivery, its later ones after its third.
	first := map[string]int{}
	var poisonAt []int
	for i, c := range p.handlerCalls() {
		if c.EventID == poison {
			poisonAt = append(poisonAt, i)
			assert.Equal(t, len(poisonAt), c.Deliveries, "the failing event's deliveries are counted")
		}
		if _, ok := first[c.EventID]; !ok {
			first[c.EventID] = i
		}
	}
	require.Len(t, poisonAt, 3, "three deliveries of the failing event")
	key2 := append([]string(nil), want["KEY-2"]...)
	for i, id := range key2 {
		if i < 3 {
			assert.Less(t, first[id], poisonAt[0], "KEY-2's event %d before the failing one", i)
		} else {
			assert.Greater(t, first[id], poisonAt[2], "KEY-2's event %d after the failing one's last delivery", i)
		}
	}
}

// An orderly consumer whose database goes away for several seconds: its queues' head
// messages fail delivery after delivery, every RetryPause (many more times than the
// client's own limit of 16 before it moves a message to its dead-letter queue). None is
// acknowledged without its effect: once the database is back, every effect happens once,
// each biz no's in commit order, and nothing is rejected.
func TestConsumerOrderlyDatabaseOutageRestart(t *testing.T) {
	t.Parallel()
	bin := plainBinary(t)
	srv := testsvc.PrivateMySQL(t)
	r := newConsRig(t, consRigOptions{ordering: outbox.KeyOrder, inDB: srv.OpenDB(t)})
	r.publish(t)
	r.startConsumer(t, bin, childConfig{Name: "orderly", DSN: srv.DSN(), Orderly: true, RetryPause: 50 * time.Millisecond})
	const keys = 4
	insertRound := func(round int) {
		for k := range keys {
			r.insertOne(t, fmt.Sprintf("KEY-%d", k), fmt.Sprintf(`{"round":%d}`, round))
		}
	}
	for round := range 3 {
		insertRound(round)
	}
	r.waitEffects(t, 3*keys, 45*time.Second)

	srv.Stop(t)
	for round := 3; round < 6; round++ {
		insertRound(round)
	}
	// Long enough for the queues' head messages to fail far more than 16 deliveries of
	// 50 ms: the fault's length, not an assertion.
	time.Sleep(4 * time.Second)
	srv.Start(t)
	for round := 6; round < 8; round++ {
		insertRound(round)
	}

	r.waitEffects(t, 8*keys, 45*time.Second)
	r.checkLedger(t)
	want, got := map[string][]string{}, map[string][]string{}
	for _, ev := range r.committed(t) {
		want[ev.BizNo] = append(want[ev.BizNo], ev.EventID)
	}
	for _, e := range r.effectRows(t) {
		got[e.BizNo] = append(got[e.BizNo], e.EventID)
	}
	assert.Equal(t, want, got, "each biz no's effects in commit order")
	rej, err := r.in.Rejected(context.Background(), 0, 10)
	require.NoError(t, err)
	assert.Empty(t, rej, "an outage rejects nothing")
}
