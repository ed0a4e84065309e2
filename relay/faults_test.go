package relay_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
	"github.com/go-outbox/outbox/relay"
)

// childEnv makes the test binary a relay process (see runChild), so that a leader can be
// killed for real: SIGKILL, no deferred code, no hand-back.
const childEnv = "OUTBOX_RELAY_TEST_CHILD"

// runChild runs one relay until it is killed: it prints "LEADING" once it leads.
func runChild() int {
	sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{NameServers: []string{os.Getenv("OUTBOX_CHILD_NAMESRV")},
		GroupName: "relay-child-" + os.Getenv("OUTBOX_CHILD_ID")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	r, err := relay.New(os.Getenv("OUTBOX_CHILD_DSN"), sender, relay.Config{Table: os.Getenv("OUTBOX_CHILD_TABLE"),
		CheckpointTable: os.Getenv("OUTBOX_CHILD_CP"), InstanceID: os.Getenv("OUTBOX_CHILD_ID"), Routes: outbox.Routes{Topic: os.Getenv("OUTBOX_CHILD_TOPIC")},
		CheckpointInterval: 200 * time.Millisecond, FallbackAfter: 5 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	go func() {
		for !r.Health().Leader {
			time.Sleep(20 * time.Millisecond)
		}
		fmt.Println("LEADING")
	}()
	if err := r.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return 0
}

// startChild starts a relay process; the returned channel is closed once it leads.
func startChild(t *testing.T, e *env, id, topic string) (*exec.Cmd, <-chan struct{}) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "OUTBOX_CHILD_ID="+id, "OUTBOX_CHILD_DSN="+e.dsn,
		"OUTBOX_CHILD_TABLE="+e.table, "OUTBOX_CHILD_CP="+e.relayTbl, "OUTBOX_CHILD_TOPIC="+topic,
		"OUTBOX_CHILD_NAMESRV="+testsvc.RocketMQNameServer(t))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	leading := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "LEADING" {
				close(leading)
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, leading
}

// writer commits events, one per transaction, until stop is called; it keeps every event
// id whose commit succeeded, and retries through database failures.
type writer struct {
	mu   sync.Mutex
	ids  []string
	stop func()
	done chan struct{}
}

func startWriter(t *testing.T, e *env, pause time.Duration) *writer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &writer{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for i := 0; ctx.Err() == nil; i++ {
			id, err := insertOne(ctx, e, fmt.Sprintf("w-%d", i))
			if err == nil {
				w.mu.Lock()
				w.ids = append(w.ids, id)
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(pause):
			}
		}
	}()
	t.Cleanup(func() { w.stop(); <-w.done })
	return w
}

func insertOne(ctx context.Context, e *env, biz string) (string, error) {
	tx, err := e.store.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	id, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: biz, EventType: "ORDER_CREATED", Payload: []byte(`{}`)})
	if err != nil {
		_ = tx.Rollback()
		return "", err
	}
	return id, tx.Commit()
}

// finish stops the writer and returns the ids committed, adding those whose commit failed
// but which the table has (a commit of unknown outcome that did commit).
func (w *writer) finish(t *testing.T, e *env) []string {
	t.Helper()
	w.stop()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := map[string]bool{}
	for _, id := range w.ids {
		seen[id] = true
	}
	all := append([]string(nil), w.ids...)
	for _, id := range testsvc.EventIDs(t, e.db, e.table) {
		if !seen[id] {
			all = append(all, id)
		}
	}
	return all
}

// requireEachDelivered checks that every id arrived, and returns how many duplicates came.
func requireEachDelivered(t *testing.T, c *testsvc.Consumer, ids []string) int {
	t.Helper()
	c.WaitDistinct(t, len(ids), 120*time.Second)
	deliveries := c.Deliveries()
	dups := 0
	for _, id := range ids {
		require.GreaterOrEqual(t, deliveries[id], 1, "event %s lost", id)
		dups += deliveries[id] - 1
	}
	return dups
}

// A leader killed with SIGKILL (nothing handed back, its lock ended by the server when its
// connection dropped) is replaced by a standby process, which resends from the checkpoint:
// nothing committed is lost, duplicates are few, and every row ends SUCCESS.
func TestLeaderKilledWithSIGKILLIsReplaced(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	topic := testsvc.NewTopic(t, "relay-kill")
	e.routeTo(t, topic)
	c := testsvc.Consume(t, topic)
	a, aLeads := startChild(t, e, "relay-a", topic)
	select {
	case <-aLeads:
	case <-time.After(30 * time.Second):
		t.Fatal("the first relay process never led")
	}
	_, bLeads := startChild(t, e, "relay-b", topic)
	w := startWriter(t, e, 2*time.Millisecond)
	time.Sleep(1500 * time.Millisecond)
	require.NoError(t, a.Process.Signal(syscall.SIGKILL))
	select {
	case <-bLeads:
	case <-time.After(30 * time.Second):
		t.Fatal("the standby never took over")
	}
	time.Sleep(time.Second)
	ids := w.finish(t, e)
	dups := requireEachDelivered(t, c, ids)
	t.Logf("%d events, %d duplicates after the leader was killed", len(ids), dups)
	assert.LessOrEqual(t, dups, 400)
	waitFor(t, 20*time.Second, "every row SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == len(ids) })
	_, mode, _ := e.checkpoint(t)
	assert.Equal(t, "relay", mode)
}

// The database restarted, then crashed, under load: the relay loses its lock and its binlog
// stream, leads again once the server is back, and sends everything committed.
func TestRelayRidesOutADatabaseRestartAndCrash(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	e := newEnv(t, srv, outbox.Unordered)
	topic := testsvc.NewTopic(t, "relay-db")
	e.routeTo(t, topic)
	c := testsvc.Consume(t, topic)
	r, _ := start(t, e.dsn, rocketSender(t), e.config("relay-1"))
	waitLeader(t, r)
	w := startWriter(t, e, 3*time.Millisecond)
	time.Sleep(time.Second)
	srv.Restart(t)
	time.Sleep(2 * time.Second)
	srv.Kill(t)
	srv.Start(t)
	time.Sleep(2 * time.Second)
	ids := w.finish(t, e)
	dups := requireEachDelivered(t, c, ids)
	t.Logf("%d events, %d duplicates, %d terms", len(ids), dups, r.Stats().Terms)
	assert.GreaterOrEqual(t, r.Stats().Terms, int64(2), "the relay led again after the restart")
	waitFor(t, 30*time.Second, "every row SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == len(ids) })
}

// outageEnv lets a longer outage be run by hand: OUTBOX_TEST_RELAY_OUTAGE=10m.
const outageEnv = "OUTBOX_TEST_RELAY_OUTAGE"

// While the broker is down, the relay keeps its leadership and its heartbeat (the pollers
// do not take over), spends no attempt and dead-letters nothing; once the broker is back,
// everything committed meanwhile is sent. Not parallel: it stops broker-a, which the other
// tests' topics live on.
func TestRelayRidesOutABrokerOutage(t *testing.T) {
	outage := 20 * time.Second
	if v := os.Getenv(outageEnv); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err)
		outage = d
	}
	e := newEnv(t, newServer(t), outbox.Unordered)
	topic := testsvc.NewTopic(t, "relay-outage")
	e.routeTo(t, topic)
	c := testsvc.Consume(t, topic)
	sender := rocketSender(t)
	r, _ := start(t, e.dsn, sender, e.config("relay-1"))
	waitLeader(t, r)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	p, err := outbox.NewPublisher(e.store, sender, outbox.Config{InstanceID: "poller", PollInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	wg.Go(func() { _ = p.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	first := e.insert(t, 20, byIndex("before"))
	c.WaitDistinct(t, len(first), 60*time.Second)
	epoch, _, _ := e.checkpoint(t)

	testsvc.StopBroker(t)
	during := e.insert(t, 50, byIndex("during"))
	time.Sleep(outage)
	var failed, retried int
	require.NoError(t, e.db.QueryRow("SELECT COUNT(*) FROM "+e.table+" WHERE status = 'FAIL'").Scan(&failed))
	require.NoError(t, e.db.QueryRow("SELECT COUNT(*) FROM "+e.table+" WHERE retry_count > 0").Scan(&retried))
	assert.Zero(t, failed, "an outage dead-letters nothing")
	assert.Zero(t, retried, "an outage spends no attempt")
	after, mode, _ := e.checkpoint(t)
	assert.Equal(t, epoch, after, "nobody took the table over")
	assert.Equal(t, "relay", mode)
	var sending int
	require.NoError(t, e.db.QueryRow("SELECT COUNT(*) FROM "+e.table+" WHERE status = 'SENDING'").Scan(&sending))
	assert.Zero(t, sending, "the poller claimed nothing")

	testsvc.StartBroker(t)
	dups := requireEachDelivered(t, c, append(first, during...))
	t.Logf("%d duplicates", dups)
	waitFor(t, 30*time.Second, "every row SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == 70 })
	assert.Zero(t, r.Stats().DeadLettered)
}

// refusing is a sender that refuses for good every event whose payload says so, and passes
// the others on.
type refusing struct{ outbox.Sender }

func (s refusing) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	stopped := map[string]bool{}
	return passOn(ctx, s.Sender, evs, keyOrder, func(ev outbox.Event) error {
		switch {
		case keyOrder && stopped[ev.BizNo]:
			return fmt.Errorf("%w: an earlier event of the key failed", outbox.ErrNotSent)
		case strings.Contains(string(ev.Payload), "refuse"):
			stopped[ev.BizNo] = true
			return outbox.Permanent(errors.New("the broker refuses this message"))
		}
		return nil
	})
}

// passOn answers each event of evs that fail refuses with its error, and passes the others
// on to next in one call.
func passOn(ctx context.Context, next outbox.Sender, evs []outbox.Event, keyOrder bool, fail func(outbox.Event) error) []error {
	errs := make([]error, len(evs))
	var pass []outbox.Event
	var at []int
	for i, ev := range evs {
		if errs[i] = fail(ev); errs[i] == nil {
			pass = append(pass, ev)
			at = append(at, i)
		}
	}
	if len(pass) > 0 {
		for j, err := range next.Send(ctx, pass, keyOrder) {
			errs[at[j]] = err
		}
	}
	return errs
}

// In key order, a message the broker refuses for good is dead-lettered (FAIL, OnDeadLetter
// once) and blocks its key: the key's later events wait, the other keys go on; once a person
// skips the dead letter, the relay sends the key's later events, in order.
func TestRelayDeadLettersARefusedMessageAndBlocksItsKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.KeyOrder)
	topic := testsvc.NewTopic(t, "relay-refused")
	e.routeTo(t, topic)
	c := testsvc.Consume(t, topic)
	var dead atomic.Int64
	cfg := e.config("relay-1")
	cfg.OnDeadLetter = func(_ context.Context, ev outbox.Event, cause error) {
		if ev.Status == outbox.StatusFail && outbox.IsPermanent(cause) {
			dead.Add(1)
		}
	}
	r, _ := start(t, e.dsn, refusing{rocketSender(t)}, cfg)
	waitLeader(t, r)
	ins := func(biz, payload string) (string, int64) {
		tx, err := e.store.BeginTx(context.Background(), nil)
		require.NoError(t, err)
		id, err := tx.InsertEvent(context.Background(), outbox.EventInput{BizNo: biz, EventType: "T", Payload: []byte(payload)})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		var row int64
		require.NoError(t, e.db.QueryRow("SELECT id FROM "+e.table+" WHERE event_id = ?", id).Scan(&row))
		return id, row
	}
	k1, _ := ins("K", "one")
	_, bad := ins("K", "refuse")
	k3, _ := ins("K", "three")
	l1, _ := ins("L", "one")
	c.WaitDistinct(t, 2, 30*time.Second)
	waitFor(t, 10*time.Second, "the dead letter", func() bool { return dead.Load() == 1 })
	time.Sleep(time.Second)
	got := c.Deliveries()
	assert.Equal(t, 1, got[k1])
	assert.Equal(t, 1, got[l1])
	assert.Zero(t, got[k3], "the key's later event waits behind its dead letter")
	assert.Equal(t, map[string]int{"SUCCESS": 2, "FAIL": 1, "WAIT": 1}, e.statuses(t))

	require.NoError(t, outbox.NewAdmin(e.store).Skip(context.Background(), bad))
	waitFor(t, 20*time.Second, "the key's later event", func() bool { return c.Deliveries()[k3] == 1 })
	assert.Equal(t, int64(1), dead.Load())
	waitFor(t, 10*time.Second, "every row done", func() bool {
		s := e.statuses(t)
		return s["SUCCESS"] == 3 && s["SKIPPED"] == 1
	})
}

// A panic in OnDeadLetter is logged at error with the event's ids, and the relay goes on: the
// next dead letter's call runs, and the other events are sent.
func TestRelayOnDeadLetterPanicIsLoggedAndTheRelayGoesOn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	topic := testsvc.NewTopic(t, "relay-panic")
	e.routeTo(t, topic)
	c := testsvc.Consume(t, topic)
	logs := &recorder{}
	var calls atomic.Int64
	cfg := e.config("relay-1")
	cfg.Logger = slog.New(logs)
	cfg.OnDeadLetter = func(context.Context, outbox.Event, error) {
		calls.Add(1)
		panic("the service's alert failed")
	}
	r, _ := start(t, e.dsn, refusing{rocketSender(t)}, cfg)
	waitLeader(t, r)
	in := func(biz, payload string) outbox.EventInput {
		return outbox.EventInput{BizNo: biz, EventType: "T", Payload: []byte(payload)}
	}
	e.insertDelayed(t, in("P-1", "refuse"), in("P-2", "refuse"))
	good := e.insertDelayed(t, in("P-3", "good"))
	waitFor(t, 30*time.Second, "both dead letters' calls", func() bool { return calls.Load() == 2 })
	c.WaitDistinct(t, 1, 30*time.Second)
	assert.Equal(t, 1, c.Deliveries()[good[0]], "the other event is sent")
	waitFor(t, 10*time.Second, "both panics logged", func() bool { return len(logs.find(slog.LevelError, "panic in OnDeadLetter")) == 2 })
	assert.True(t, r.Health().Leader, "the relay leads on")
}

// In key order, events of one biz no committed by concurrent transactions, the later id
// first, reach an orderly consumer in commit order: the binlog's order, which polling by id
// cannot give.
func TestRelayDeliversAKeysEventsInCommitOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.KeyOrder)
	topic := testsvc.NewTopic(t, "relay-order")
	e.routeTo(t, topic)
	c := testsvc.ConsumeOrderly(t, topic)
	r, _ := start(t, e.dsn, rocketSender(t), e.config("relay-1"))
	waitLeader(t, r)

	const keys = 40
	var mu sync.Mutex
	rank := map[string]int64{} // eventId -> commit order
	var seq atomic.Int64
	var wg sync.WaitGroup
	for k := range keys {
		wg.Go(func() {
			biz := fmt.Sprintf("K-%d", k)
			for round := range 3 {
				ctx := context.Background()
				// Two transactions of the key: the first takes the lower id, the second
				// commits first.
				tx1, err := e.store.BeginTx(ctx, nil)
				require.NoError(t, err)
				id1, err := tx1.InsertEvent(ctx, outbox.EventInput{BizNo: biz, EventType: "T", Payload: fmt.Appendf(nil, "%d-1", round)})
				require.NoError(t, err)
				tx2, err := e.store.BeginTx(ctx, nil)
				require.NoError(t, err)
				id2, err := tx2.InsertEvent(ctx, outbox.EventInput{BizNo: biz, EventType: "T", Payload: fmt.Appendf(nil, "%d-2", round)})
				require.NoError(t, err)
				// The commit and its rank under one lock: ranks follow commit order.
				mu.Lock()
				require.NoError(t, tx2.Commit())
				rank[id2] = seq.Add(1)
				require.NoError(t, tx1.Commit())
				rank[id1] = seq.Add(1)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	c.WaitDistinct(t, keys*6, 60*time.Second)
	inv := c.Inversions(func(id string) int64 {
		mu.Lock()
		defer mu.Unlock()
		return rank[id]
	})
	assert.Empty(t, inv, "every key's events arrive in commit order")
}

// A running fleet switches from polling to the relay and back, under load, without losing
// an event: the relay takes the table from the pollers (waiting for their claims in
// flight), and hands it back when it closes.
func TestFleetSwitchesBetweenPollingAndTheRelay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	topic := testsvc.NewTopic(t, "relay-switch")
	e.routeTo(t, topic)
	c := testsvc.Consume(t, topic)
	sender := rocketSender(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range 2 {
		p, err := outbox.NewPublisher(e.store, sender, outbox.Config{InstanceID: fmt.Sprintf("poller-%d", i),
			PollInterval: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		wg.Go(func() { _ = p.Run(ctx) })
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	w := startWriter(t, e, 2*time.Millisecond)
	for round := range 2 {
		time.Sleep(time.Second)
		r, stop := start(t, e.dsn, sender, e.config(fmt.Sprintf("relay-%d", round)))
		waitLeader(t, r)
		time.Sleep(time.Second)
		stop()
	}
	time.Sleep(time.Second)
	ids := w.finish(t, e)
	dups := requireEachDelivered(t, c, ids)
	t.Logf("%d events, %d duplicates over four switches", len(ids), dups)
	waitFor(t, 20*time.Second, "every row SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == len(ids) })
	var byRelay, byPollers int
	require.NoError(t, e.db.QueryRow("SELECT COUNT(*) FROM "+e.table+" WHERE claim_owner LIKE 'relay-%'").Scan(&byRelay))
	require.NoError(t, e.db.QueryRow("SELECT COUNT(*) FROM "+e.table+" WHERE claim_owner LIKE 'poller-%'").Scan(&byPollers))
	assert.Positive(t, byRelay)
	assert.Positive(t, byPollers)
}

// TestMain runs the test binary as a relay process when childEnv is set, and otherwise
// fails the run when goroutines started by the tests (a binlog syncer left open, say)
// outlive them.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	os.Exit(testsvc.RunWithLeakCheck(m))
}

// A binlog connection killed on the server (its dump thread) is reopened from the position
// the sender had delivered: nothing lost, nothing sent twice, no new term.
func TestRelayReopensAKilledBinlogStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	var mu sync.Mutex
	sent := map[string]int{}
	sender := outbox.SenderFunc(func(_ context.Context, ev outbox.Event) error {
		mu.Lock()
		sent[ev.EventID]++
		mu.Unlock()
		return nil
	})
	r, _ := start(t, e.dsn, sender, e.config("relay-1"))
	waitLeader(t, r)
	w := startWriter(t, e, 2*time.Millisecond)
	for range 3 {
		time.Sleep(700 * time.Millisecond)
		var dumps []int64
		waitFor(t, 10*time.Second, "the relay's binlog connection", func() bool {
			dumps = dumps[:0]
			rows, err := e.db.Query("SELECT id FROM information_schema.processlist WHERE command = 'Binlog Dump'")
			require.NoError(t, err)
			defer rows.Close()
			for rows.Next() {
				var id int64
				require.NoError(t, rows.Scan(&id))
				dumps = append(dumps, id)
			}
			return len(dumps) == 1
		})
		_, err := e.db.Exec(fmt.Sprintf("KILL %d", dumps[0]))
		require.NoError(t, err)
	}
	time.Sleep(500 * time.Millisecond)
	ids := w.finish(t, e)
	waitFor(t, 20*time.Second, "every event sent", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(sent) == len(ids)
	})
	mu.Lock()
	for _, id := range ids {
		assert.Equal(t, 1, sent[id], "event %s", id)
	}
	mu.Unlock()
	assert.Equal(t, int64(1), r.Stats().Terms, "the stream was reopened within the term")
	waitFor(t, 10*time.Second, "every row SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == len(ids) })
}

// A dead letter an operator requeues (FAIL -> WAIT, seen in the binlog) is sent by the
// relay; so is a row a poller released for a retry before the relay took over.
func TestRelaySendsARequeuedDeadLetter(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	var mu sync.Mutex
	refused := map[string]bool{}
	sent := map[string]int{}
	sender := outbox.SenderFunc(func(_ context.Context, ev outbox.Event) error {
		mu.Lock()
		defer mu.Unlock()
		if string(ev.Payload) == "refuse-once" && !refused[ev.EventID] {
			refused[ev.EventID] = true
			return outbox.Permanent(errors.New("refused once"))
		}
		sent[ev.EventID]++
		return nil
	})
	r, _ := start(t, e.dsn, sender, e.config("relay-1"))
	waitLeader(t, r)
	tx, err := e.store.BeginTx(context.Background(), nil)
	require.NoError(t, err)
	bad, err := tx.InsertEvent(context.Background(), outbox.EventInput{BizNo: "B", EventType: "T", Payload: []byte("refuse-once")})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	waitFor(t, 30*time.Second, "the dead letter", func() bool { return e.statuses(t)["FAIL"] == 1 })
	var id int64
	require.NoError(t, e.db.QueryRow("SELECT id FROM "+e.table+" WHERE event_id = ?", bad).Scan(&id))
	require.NoError(t, outbox.NewAdmin(e.store).Requeue(context.Background(), id))
	// As long as the other tests' servers and relays, which run beside it, allow.
	waitFor(t, 30*time.Second, "the requeued event sent", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return sent[bad] >= 1
	})
	waitFor(t, 30*time.Second, "its row SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == 1 })
	assert.Equal(t, int64(1), r.Stats().DeadLettered)
	mu.Lock()
	assert.Equal(t, 1, sent[bad], "sent once after the requeue (terms: %d)", r.Stats().Terms)
	mu.Unlock()
}

// partlyAway is a sender whose queue for the biz nos in away is unavailable (its broker
// down) while the others' are served, as one of two brokers away looks in key order.
type partlyAway struct {
	outbox.Sender
	mu   sync.Mutex
	away map[string]bool
}

func (s *partlyAway) setAway(keys ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.away = map[string]bool{}
	for _, k := range keys {
		s.away[k] = true
	}
}

func (s *partlyAway) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	s.mu.Lock()
	away := maps.Clone(s.away)
	s.mu.Unlock()
	return passOn(ctx, s.Sender, evs, keyOrder, func(ev outbox.Event) error {
		if away[ev.BizNo] {
			return outbox.Unavailable(errors.New("dial tcp 127.0.0.1:10921: connect: connection refused"))
		}
		return nil
	})
}

// In key order, a queue away while the others are served (one of two brokers down) spends
// no attempt of its keys, in the same batches as sends that succeed: its keys wait, the
// others go on, and once it is back its keys' events are sent, in order.
func TestRelayKeyOrderSpendsNoAttemptOnAPartialOutage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.KeyOrder)
	topic := testsvc.NewTopic(t, "relay-partial")
	e.routeTo(t, topic)
	c := testsvc.ConsumeOrderly(t, topic)
	sender := &partlyAway{Sender: rocketSender(t)}
	sender.setAway("AWAY")
	r, _ := start(t, e.dsn, sender, e.config("relay-1"))
	waitLeader(t, r)
	var here, away []string
	rank := map[string]int64{}
	for i := range 5 {
		tx, err := e.store.BeginTx(context.Background(), nil)
		require.NoError(t, err)
		id, err := tx.InsertEvent(context.Background(), outbox.EventInput{BizNo: "HERE", EventType: "T", Payload: fmt.Appendf(nil, `{"n":%d}`, i)})
		require.NoError(t, err)
		here = append(here, id)
		rank[id] = int64(i)
		id, err = tx.InsertEvent(context.Background(), outbox.EventInput{BizNo: "AWAY", EventType: "T", Payload: fmt.Appendf(nil, `{"n":%d}`, i)})
		require.NoError(t, err)
		away = append(away, id)
		rank[id] = int64(i)
		require.NoError(t, tx.Commit())
	}
	c.WaitDistinct(t, len(here), 30*time.Second)
	time.Sleep(2 * time.Second) // several rounds of the away key's sends failing
	var retried int
	require.NoError(t, e.db.QueryRow("SELECT COUNT(*) FROM "+e.table+" WHERE retry_count > 0").Scan(&retried))
	assert.Zero(t, retried, "a queue away spends no attempt")
	assert.Equal(t, map[string]int{"SUCCESS": 5, "WAIT": 5}, e.statuses(t))
	var wait int64
	require.NoError(t, e.db.QueryRow("SELECT TIMESTAMPDIFF(MICROSECOND, update_time, next_retry_time) FROM "+e.table+
		" WHERE event_id = ?", away[0]).Scan(&wait))
	assert.Equal(t, time.Second.Microseconds(), wait, "tried again a second after each release")

	sender.setAway()
	c.WaitDistinct(t, len(here)+len(away), 30*time.Second)
	assert.Empty(t, c.Inversions(func(id string) int64 { return rank[id] }), "each key's events in order")
	assert.Zero(t, r.Stats().DeadLettered)
}
