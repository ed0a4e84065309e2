package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/relay"
)

// counting is a Sender that counts each event id's sends and may run a hook first.
type counting struct {
	mu    sync.Mutex
	sent  map[string]int
	calls int
	hook  func(call int, evs []outbox.Event)
}

func newCounting() *counting { return &counting{sent: map[string]int{}} }

func (c *counting) Info() outbox.SenderInfo { return outbox.SenderInfo{} }

func (c *counting) Check(context.Context, []string) error { return nil }

func (c *counting) Send(_ context.Context, evs []outbox.Event, _ bool) []error {
	c.mu.Lock()
	c.calls++
	call, hook := c.calls, c.hook
	c.mu.Unlock()
	if hook != nil {
		hook(call, evs)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ev := range evs {
		c.sent[ev.EventID]++
	}
	return make([]error, len(evs))
}

func (c *counting) count(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sent[id]
}

func (c *counting) total() (sends, distinct int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.sent {
		sends += n
	}
	return sends, len(c.sent)
}

// rowID returns the row id of an event id.
func (e *env) rowID(t testing.TB, eventID string) int64 {
	t.Helper()
	var id int64
	require.NoError(t, e.db.QueryRow("SELECT id FROM "+e.table+" WHERE event_id = ?", eventID).Scan(&id))
	return id
}

func (e *env) status(t testing.TB, eventID string) string {
	t.Helper()
	var s string
	require.NoError(t, e.db.QueryRow("SELECT status FROM "+e.table+" WHERE event_id = ?", eventID).Scan(&s))
	return s
}

func (e *env) heartbeat(t testing.TB) time.Time {
	t.Helper()
	var at time.Time
	require.NoError(t, e.db.QueryRow("SELECT heartbeat_at FROM "+e.relayTbl+" WHERE outbox_table = ?", e.table).Scan(&at))
	return at
}

// runRelay runs a relay and returns it with the channel Run's result comes on; the test's
// end closes it.
func runRelay(t *testing.T, dsn string, sender outbox.Sender, cfg relay.Config) (*relay.Relay, <-chan error) {
	t.Helper()
	r, err := relay.New(dsn, sender, cfg)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() { _ = r.Close() })
	return r, done
}

// One outbox row that another session holds locked stalls nothing: the events committed
// meanwhile are sent and marked, the heartbeat goes on, the publishers' claims read the
// checkpoint row and stand by; the held event, sent once, is marked once the row is let
// go, and never sent again.
func TestRelayMarksAroundARowAnotherSessionHolds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, newServer(t), outbox.Unordered)
	locked := e.insert(t, 1, byIndex("locked"))[0]
	holder, err := e.db.Begin()
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Rollback() })
	_, err = holder.Exec("SELECT id FROM "+e.table+" WHERE id = ? FOR UPDATE", e.rowID(t, locked))
	require.NoError(t, err)

	sender := newCounting()
	logs := &recorder{}
	cfg := e.config("relay-1")
	cfg.Logger = slog.New(logs)
	r, _ := start(t, e.dsn, sender, cfg)
	waitLeader(t, r)
	waitFor(t, 20*time.Second, "the held event sent", func() bool { return sender.count(locked) == 1 })
	const held = "another session holds rows of sent events"
	waitFor(t, 10*time.Second, "a warning once the row is still held at the retry", func() bool {
		return len(logs.find(slog.LevelWarn, held)) > 0
	})
	assert.Len(t, logs.find(slog.LevelDebug, held), 1, "the first try's finding, at debug: a commit may still be finishing")
	beat := e.heartbeat(t)

	later := e.insert(t, 20, byIndex("later"))
	waitFor(t, 20*time.Second, "the events committed meanwhile sent and marked", func() bool {
		return e.statuses(t)["SUCCESS"] == len(later)
	})
	for _, id := range later {
		assert.Equal(t, 1, sender.count(id), "event %s", id)
	}
	waitFor(t, 10*time.Second, "the heartbeat", func() bool { return e.heartbeat(t).After(beat) })
	claimCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	cands, err := e.store.Candidates(claimCtx, 10)
	cancel()
	require.NoError(t, err, "a publisher reads the checkpoint row")
	assert.Empty(t, cands, "and stands by")
	_, mode, _ := e.checkpoint(t)
	assert.Equal(t, "relay", mode)
	assert.Equal(t, "WAIT", e.status(t, locked))

	require.NoError(t, holder.Rollback())
	waitFor(t, 20*time.Second, "the held event marked", func() bool { return e.status(t, locked) == "SUCCESS" })
	assert.Equal(t, 1, sender.count(locked), "the held event was sent once")
	assert.Equal(t, int64(1), r.Stats().Terms)
}

// A relay whose marks fail because its account lost UPDATE on the outbox table sends no
// event twice itself: it hands the table to the publishers at once and Run returns the
// cause, naming the grant. The publishers send what it could not mark (counted as resent).
func TestRelayWhoseMarksAreDeniedHandsTheTableBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := newServer(t)
	e := newEnv(t, srv, outbox.Unordered)
	cfg, err := mysql.ParseDSN(e.dsn)
	require.NoError(t, err)
	account := "'relay_marks'@'127.0.0.1'"
	for _, q := range []string{
		"CREATE USER " + account,
		"GRANT REPLICATION SLAVE, BINLOG MONITOR, REPLICATION MASTER ADMIN ON *.* TO " + account,
		fmt.Sprintf("GRANT SELECT, UPDATE ON %s.%s TO %s", cfg.DBName, e.table, account),
		fmt.Sprintf("GRANT SELECT, INSERT, UPDATE ON %s.%s TO %s", cfg.DBName, e.relayTbl, account),
	} {
		_, err := e.db.ExecContext(ctx, q)
		require.NoError(t, err, q)
	}
	cfg.User, cfg.Passwd = "relay_marks", ""

	relayed := newCounting()
	r, done := runRelay(t, cfg.FormatDSN(), relayed, e.config("relay-1"))
	waitLeader(t, r)
	polled := newCounting()
	startPoller(t, e, polled)

	_, err = e.db.ExecContext(ctx, fmt.Sprintf("REVOKE UPDATE ON %s.%s FROM %s", cfg.DBName, e.table, account))
	require.NoError(t, err)
	ids := e.insert(t, 6, byIndex("denied"))
	select {
	case err := <-done:
		require.ErrorIs(t, err, outbox.ErrInvalidConfig)
		assert.Contains(t, err.Error(), "GRANT UPDATE")
	case <-time.After(60 * time.Second):
		sends, _ := relayed.total()
		t.Fatalf("Run did not return; the relay sent %d times", sends)
	}
	_, mode, _ := e.checkpoint(t)
	assert.Equal(t, "polling", mode, "the table was handed to the publishers")
	waitFor(t, 30*time.Second, "the publisher to send every event", func() bool { return e.statuses(t)["SUCCESS"] == len(ids) })
	sends, distinct := relayed.total()
	assert.Equal(t, sends, distinct, "the relay sent no event twice")
	assert.Positive(t, sends)
	assert.Equal(t, int64(sends), r.Stats().Resent, "what the relay sent and could not mark goes again, from the publisher")
	for _, id := range ids {
		assert.Equal(t, 1, polled.count(id), "event %s", id)
	}
}

// Events a relay sent and could not mark before it lost the table (another leader's
// takeover during its send) are sent again by the next leader, and counted: in Stats and
// in outbox.relay.events.resent, as many as the duplicates.
func TestRelayCountsEventsSentAgainAfterAFailover(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	ids := e.insert(t, 5, byIndex("again"))
	sender := newCounting()
	sender.hook = func(call int, _ []outbox.Event) {
		if call == 1 {
			// Another leader takes the table over while the first send is under way.
			_, err := e.db.Exec("UPDATE "+e.relayTbl+" SET epoch = epoch + 1 WHERE outbox_table = ?", e.table)
			assert.NoError(t, err)
		}
	}
	reader := sdkmetric.NewManualReader()
	cfg := e.config("relay-1")
	cfg.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	r, _ := start(t, e.dsn, sender, cfg)
	waitFor(t, 30*time.Second, "every row SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == len(ids) })
	sends, distinct := sender.total()
	require.Equal(t, len(ids), distinct)
	dups := sends - distinct
	require.Positive(t, dups, "the takeover during the send made duplicates")
	assert.Equal(t, int64(dups), r.Stats().Resent)
	assert.Equal(t, int64(dups), sums(t, reader)["outbox.relay.events.resent"])
}

// In key order, a key whose event a polling publisher claimed before the relay took the
// table over (SENDING) sends none of its later events until that one is done; other keys
// go on. One the publisher dead-letters goes on blocking its key (KeyOrder) until a person
// skips it.
func TestRelayWaitsForAKeysEventAPublisherIsSending(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, newServer(t), outbox.KeyOrder)
	first := e.insert(t, 1, func(int) string { return "K" })[0]
	second := e.insert(t, 1, func(int) string { return "K" })[0]
	dead := e.insert(t, 1, func(int) string { return "D" })[0]
	behind := e.insert(t, 1, func(int) string { return "D" })[0]
	other := e.insert(t, 1, func(int) string { return "Z" })[0]
	cands, err := e.store.Candidates(ctx, 10)
	require.NoError(t, err)
	claimed := map[string]outbox.Event{}
	for _, ev := range cands {
		if ev.EventID == first || ev.EventID == dead {
			ok, err := e.store.Claim(ctx, ev, "poller-1")
			require.NoError(t, err)
			require.True(t, ok)
			claimed[ev.EventID] = ev
		}
	}
	require.Len(t, claimed, 2)

	sender := newCounting()
	r, _ := start(t, e.dsn, sender, e.config("relay-1"))
	waitLeader(t, r)
	waitFor(t, 20*time.Second, "the other key's event", func() bool { return sender.count(other) == 1 })
	_, ok, err := e.store.MarkFail(ctx, claimed[dead].ID, "poller-1", 1, "permanent", "refused")
	require.NoError(t, err)
	require.True(t, ok)
	time.Sleep(time.Second) // a few checks of the keys
	assert.Zero(t, sender.count(second), "the key's later event waits while its earlier one is SENDING")
	assert.Zero(t, sender.count(first), "the relay sends no row a publisher holds")
	assert.Zero(t, sender.count(behind), "a dead letter of the publisher's blocks its key")

	n, err := e.store.MarkSuccess(ctx, []int64{claimed[first].ID}, "poller-1")
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	waitFor(t, 20*time.Second, "the key's later event", func() bool { return sender.count(second) == 1 })
	waitFor(t, 10*time.Second, "its row SUCCESS", func() bool { return e.status(t, second) == "SUCCESS" })
	assert.Zero(t, sender.count(first))
	assert.Zero(t, sender.count(behind), "still blocked by its dead letter")

	require.NoError(t, outbox.NewAdmin(e.store).Skip(ctx, claimed[dead].ID))
	waitFor(t, 20*time.Second, "the skipped key's later event", func() bool { return sender.count(behind) == 1 })
}

// A fleet of per-row publishers (Tuning.ClaimPerRow) switches to the relay and back, three
// times, under load: no event is sent twice, as no per-row claim starts after the relay's
// takeover and the takeover waits for those in flight.
func TestRelayTakesOverFromPerRowPublishersSendingNoEventTwice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	sender := newCounting()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range 2 {
		p, err := outbox.NewPublisher(e.store, sender, outbox.Config{InstanceID: fmt.Sprintf("poller-%d", i),
			PollInterval: 5 * time.Millisecond, Logger: slog.New(slog.DiscardHandler), Tuning: outbox.Tuning{ClaimPerRow: true}})
		require.NoError(t, err)
		wg.Go(func() { _ = p.Run(ctx) })
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	w := startWriter(t, e, time.Millisecond)
	var resent int64
	for round := range 3 {
		time.Sleep(700 * time.Millisecond)
		r, stop := start(t, e.dsn, sender, e.config(fmt.Sprintf("relay-%d", round)))
		waitLeader(t, r)
		time.Sleep(700 * time.Millisecond)
		stop()
		resent += r.Stats().Resent
	}
	time.Sleep(500 * time.Millisecond)
	ids := w.finish(t, e)
	waitFor(t, 30*time.Second, "every row SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == len(ids) })
	sends, distinct := sender.total()
	t.Logf("%d events, %d sends", len(ids), sends)
	assert.Equal(t, len(ids), distinct)
	assert.Equal(t, distinct, sends, "no event sent twice")
	assert.Zero(t, resent)
}

// An event the relay sent and finds SUCCESS when it marks it (another publisher sent and
// recorded it meanwhile) is counted as resent.
func TestRelayCountsEventsAnotherPublisherMarked(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	sender := newCounting()
	sender.hook = func(_ int, evs []outbox.Event) {
		for _, ev := range evs {
			if string(ev.Payload) == `{"n":1}` {
				_, err := e.db.Exec("UPDATE "+e.table+" SET status = 'SUCCESS', claim_owner = 'poller-1' WHERE id = ?", ev.ID)
				assert.NoError(t, err)
			}
		}
	}
	r, _ := start(t, e.dsn, sender, e.config("relay-1"))
	waitLeader(t, r)
	ids := e.insert(t, 3, byIndex("marked"))
	waitFor(t, 20*time.Second, "every row SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == len(ids) })
	waitFor(t, 10*time.Second, "the resent count", func() bool { return r.Stats().Resent == 1 })
	var owner string
	require.NoError(t, e.db.QueryRow("SELECT claim_owner FROM "+e.table+" WHERE event_id = ?", ids[1]).Scan(&owner))
	assert.Equal(t, "poller-1", owner)
}

// A failed send whose row another session holds writes nothing and stalls nothing: the
// events committed meanwhile are sent and marked, and the row is looked at again later
// and sent once it is let go.
func TestRelayRetriesAFailedSendWhoseRowIsHeld(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	held := e.insert(t, 1, byIndex("held"))[0]
	holder, err := e.db.Begin()
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Rollback() })
	_, err = holder.Exec("SELECT id FROM "+e.table+" WHERE id = ? FOR UPDATE", e.rowID(t, held))
	require.NoError(t, err)
	var mu sync.Mutex
	sends := map[string]int{}
	sender := outbox.SenderFunc(func(_ context.Context, ev outbox.Event) error {
		mu.Lock()
		defer mu.Unlock()
		sends[ev.EventID]++
		if ev.EventID == held && sends[ev.EventID] == 1 {
			return fmt.Errorf("refused once")
		}
		return nil
	})
	count := func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		return sends[id]
	}
	r, _ := start(t, e.dsn, sender, e.config("relay-1"))
	waitLeader(t, r)
	waitFor(t, 20*time.Second, "the held event's failed send", func() bool { return count(held) == 1 })
	later := e.insert(t, 5, byIndex("later"))
	waitFor(t, 20*time.Second, "the events committed meanwhile", func() bool { return e.statuses(t)["SUCCESS"] == len(later) })
	require.NoError(t, holder.Rollback())
	waitFor(t, 30*time.Second, "the held event sent again and marked", func() bool { return e.status(t, held) == "SUCCESS" })
	assert.Equal(t, 2, count(held))
	var retries int
	require.NoError(t, e.db.QueryRow("SELECT retry_count FROM "+e.table+" WHERE event_id = ?", held).Scan(&retries))
	assert.Zero(t, retries, "nothing was written while the row was held")
	assert.Zero(t, r.Stats().Retried)
}

// A relay whose marks keep failing for another cause (here a trigger refuses them) tries
// them again for FallbackAfter, sending no event twice, then hands the table to the
// publishers, which send what it could not mark; Run goes on.
func TestRelayWhoseMarksKeepFailingHandsTheTableBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, newServer(t), outbox.Unordered)
	_, err := e.db.ExecContext(ctx, "CREATE TRIGGER "+e.table+"_no_mark BEFORE UPDATE ON "+e.table+
		" FOR EACH ROW BEGIN IF OLD.status = 'WAIT' AND NEW.status = 'SUCCESS' THEN "+
		"SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'marks refused'; END IF; END")
	require.NoError(t, err)
	relayed := newCounting()
	r, done := runRelay(t, e.dsn, relayed, e.config("relay-1"))
	waitLeader(t, r)
	polled := newCounting()
	startPoller(t, e, polled)

	ids := e.insert(t, 4, byIndex("refused"))
	waitFor(t, 30*time.Second, "the publisher to send every event", func() bool { return e.statuses(t)["SUCCESS"] == len(ids) })
	sends, distinct := relayed.total()
	assert.Equal(t, sends, distinct, "the relay sent no event twice")
	assert.Positive(t, sends)
	assert.Equal(t, int64(sends), r.Stats().Resent)
	for _, id := range ids {
		assert.Equal(t, 1, polled.count(id), "event %s", id)
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned %v", err)
	default:
	}
}

// startPoller starts a polling publisher of e's table, standing by while the relay leads, and
// stops it when the test ends; a refused start fails the test.
func startPoller(t *testing.T, e *env, sender outbox.Sender) {
	t.Helper()
	p, err := outbox.NewPublisher(e.store, sender, outbox.Config{InstanceID: "poller-1", PollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, p.Start(context.Background()))
	t.Cleanup(func() { assert.NoError(t, p.Close()) })
}
