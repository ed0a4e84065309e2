package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// linesOf returns the lines whose "store" attribute is store ("" for none), at level and
// above.
func linesOf(s *lineSink, store string, level slog.Level) []line {
	var out []line
	for _, l := range s.all() {
		if l.attrs["store"] == store && l.level >= level {
			out = append(out, l)
		}
	}
	return out
}

// A store name is a metric label: a bounded, configured name. Each bad one is refused by
// NewPublisher, naming the field and what is wrong; SharedSender needs a name.
func TestStoreNameMustBeABoundedLabel(t *testing.T) {
	t.Parallel()
	store := nopStore{}
	for _, c := range []struct {
		name, want string
	}{
		{"shard 1", "not a bounded label"},
		{" shard", "not a bounded label"},
		{"tenant/eu", "not a bounded label"},
		{"tenant:eu", "not a bounded label"},
		{"münchen", "not a bounded label"},
		{"shard\n1", "not a bounded label"},
		{"-shard", "not a bounded label"},
		{".", "not a bounded label"},
		{"{tenant}", "not a bounded label"},
		{strings.Repeat("s", 65), "65 bytes long, at most 64"},
		{"root:secret@tcp(db-eu-1.internal:3306)/orders?parseTime=true", "not a bounded label"},
	} {
		_, err := outbox.NewPublisher(store, newRecorder(), outbox.Config{StoreName: c.name})
		require.ErrorIs(t, err, outbox.ErrInvalidConfig, "%q", c.name)
		assert.ErrorContains(t, err, "StoreName", "%q", c.name)
		assert.ErrorContains(t, err, c.want, "%q", c.name)
	}
	_, err := outbox.NewPublisher(store, newRecorder(), outbox.Config{SharedSender: true})
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	assert.ErrorContains(t, err, "SharedSender needs StoreName")

	for _, name := range []string{"shard-03", "tenant_eu.1", "0", strings.Repeat("s", 64)} {
		p, err := outbox.NewPublisher(store, newRecorder(), outbox.Config{StoreName: name, SharedSender: true})
		require.NoError(t, err, "%q", name)
		assert.Equal(t, name, p.Health().StoreName)
	}
	p, err := outbox.NewPublisher(store, newRecorder(), outbox.Config{})
	require.NoError(t, err)
	assert.Empty(t, p.Health().StoreName, "unnamed by default")
}

// The library keeps no list of the store names in use: publishers of two stores under one
// name, with one Logger and one MeterProvider, both start, and their records carry the same
// store attribute. Keeping the names apart is the service's.
func TestStoreNameIsTheServicesToKeepApart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := testsvc.NewStore(t, b.db, outbox.MySQLConfig{})
	logs := newLineSink()
	logger := slog.New(logs)
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	for i, store := range []*outbox.MySQLStore{b.store, other} {
		c := fastConfig(fmt.Sprintf("named-%d", i), nil)
		c.StoreName, c.Logger, c.MeterProvider = "shard-0", logger, provider
		p := newPublisher(t, store, newRecorder(), c)
		require.NoError(t, p.Start(context.Background()), "publisher %d", i)
		t.Cleanup(func() { assert.NoError(t, p.Close()) })
		assert.True(t, p.Health().Running)
	}
	started := 0
	for _, r := range linesOf(logs, "shard-0", slog.LevelDebug) {
		if r.msg == "outbox publisher started" {
			started++
		}
	}
	assert.Equal(t, 2, started, "both publishers' records say store=shard-0")
}

// A sender that one publisher owns and another uses without SharedSender: both start,
// nothing checks it, and the owner's Close closes the sender under the other. Its sends
// then fail with ErrClosed, which it treats as a broker outage: it pauses, counts no
// attempt and dead-letters nothing; the events wait in WAIT.
func TestASenderClosedUnderAnotherPublisherLosesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sender := &closingSender{recorder: newRecorder()}
	owner := newPublisher(t, b.store, sender, fastConfig("owner", &logSink{}))
	user := newPublisher(t, b.store, sender, fastConfig("user", &logSink{}))
	ctx := context.Background()
	require.NoError(t, owner.Start(ctx))
	require.NoError(t, user.Start(ctx), "a sender another publisher owns is not refused")
	t.Cleanup(func() { assert.NoError(t, user.Close()) })
	require.NoError(t, owner.Close())
	require.Equal(t, int32(1), sender.closed.Load(), "the owner closed the sender under the other")

	ids := b.insert(t, 3)
	require.Eventually(t, func() bool { return user.Health().BrokerUnavailable }, time.Minute, 5*time.Millisecond,
		"ErrClosed is an outage")
	for _, id := range ids {
		ev := b.get(t, id)
		assert.Equal(t, outbox.StatusWait, ev.Status, "event %d", id)
		assert.Zero(t, ev.RetryCount, "event %d: no attempt counted", id)
	}
}

// Publishers that set SharedSender leave their sender open when they close; the one that
// owns the sender closes it.
func TestSharedSenderIsClosedByItsMaker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := testsvc.NewStore(t, b.db, outbox.MySQLConfig{})
	sender := &closingSender{recorder: newRecorder()}
	logs := newLineSink()
	cfg := func(id, name string, shared bool) outbox.Config {
		c := fastConfig(id, nil)
		c.Logger = slog.New(logs)
		c.StoreName, c.SharedSender = name, shared
		return c
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := newPublisher(t, b.store, sender, cfg("a", "shard-a", true))
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	require.Eventually(t, func() bool { return a.Health().Running }, time.Minute, time.Millisecond)

	shared := newPublisher(t, other, sender, cfg("b", "shard-b", true))
	go func() { done <- shared.Run(ctx) }()
	require.Eventually(t, func() bool { return shared.Health().Running }, time.Minute, time.Millisecond)
	b.insert(t, 3)
	require.Eventually(t, func() bool { return sender.total() == 3 }, time.Minute, time.Millisecond)

	require.NoError(t, a.Close())
	require.NoError(t, <-done)
	assert.Zero(t, sender.closed.Load(), "a publisher of a shared sender leaves it open")
	require.NoError(t, shared.Close())
	require.NoError(t, <-done)
	assert.Zero(t, sender.closed.Load())

	// Each record of a named publisher says its store.
	started := map[string]int{}
	for _, name := range []string{"shard-a", "shard-b"} {
		for _, r := range linesOf(logs, name, slog.LevelDebug) {
			if r.msg == "outbox publisher started" {
				started[r.attrs["store"]]++
			}
		}
	}
	assert.Equal(t, map[string]int{"shard-a": 1, "shard-b": 1}, started)
	assert.Empty(t, linesOf(logs, "", slog.LevelDebug), "no record of a named publisher without its store")

	// The sender's own publisher, alone, owns and closes it.
	alone := newPublisher(t, b.store, sender, cfg("c", "shard-a", false))
	require.NoError(t, alone.Close())
	assert.Equal(t, int32(1), sender.closed.Load())
}

// Every measurement of a named publisher carries its store's name, on every instrument it
// records, through sends, a retry, a permanent refusal, an outage, a reclaim and the gauges.
func TestMetricsCarryTheStoreName(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 4)
	// Claimed an hour ago by an instance that died: reclaimed.
	b.exec(t, "UPDATE {t} SET status = 'SENDING', claim_owner = 'dead', claimed_at = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 HOUR) WHERE id = ?", ids[3])
	var down atomic.Bool
	down.Store(true)
	rec := newRecorder()
	rec.fail = func(ev outbox.Event) error {
		switch {
		case down.Load():
			return outbox.Unavailable(errors.New("broker away"))
		case ev.ID == ids[1] && ev.RetryCount == 0:
			return errors.New("refused this once")
		case ev.ID == ids[2]:
			return outbox.Permanent(errors.New("refused for good"))
		}
		return nil
	}
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(ctx) })
	cfg := fastConfig("labelled", &logSink{})
	cfg.StoreName = "tenant-eu"
	cfg.MeterProvider = provider
	tp, spans := newTracing(t)
	cfg.TracerProvider = tp
	cfg.Backoff = func(int) time.Duration { return 10 * time.Millisecond }
	cfg.Tuning.MaxProbeDelay = 20 * time.Millisecond
	p := newPublisher(t, b.store, rec, cfg)
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, p.Run(runCtx)) })
	defer func() { cancel(); wg.Wait() }()
	require.Eventually(t, func() bool { return p.Health().BrokerUnavailable }, time.Minute, time.Millisecond)
	down.Store(false)
	require.Eventually(t, func() bool {
		return b.countStatus(t, outbox.StatusSuccess) == 3 && b.countStatus(t, outbox.StatusFail) == 1
	}, time.Minute, 10*time.Millisecond)

	c := collect(t, reader)
	seen := map[string]bool{}
	check := func(kind string, byName map[string]map[string]float64) {
		for name, points := range byName {
			seen[name] = true
			for key := range points {
				assert.Contains(t, strings.Split(key, ","), "store=tenant-eu", "%s %s {%s}", kind, name, key)
			}
		}
	}
	check("value", c.values)
	counts := map[string]map[string]float64{}
	for name, points := range c.counts {
		counts[name] = map[string]float64{}
		for key, n := range points {
			counts[name][key] = float64(n)
		}
	}
	check("histogram", counts)
	for _, name := range []string{
		"outbox.events.sent", "outbox.events.retried", "outbox.events.dead_lettered", "outbox.events.reclaimed",
		"outbox.broker.outages", "outbox.broker.unavailable", "outbox.store.lock_retries", "outbox.send.duration",
		"outbox.commit_to_send.duration", "outbox.table.backlog", "outbox.table.oldest_due_age", "outbox.table.sending",
		"outbox.table.oldest_claim_age", "outbox.table.sending_past_half_lease", "outbox.table.failed",
	} {
		assert.True(t, seen[name], "%s was recorded", name)
	}
	assert.Equal(t, map[string]float64{"event_type=ORDER_CREATED,store=tenant-eu,topic=ORDER_EVENT_TOPIC": 3}, c.values["outbox.events.sent"])
	assert.Equal(t, map[string]float64{"event_type=ORDER_CREATED,store=tenant-eu": 1}, c.values["outbox.table.failed"])

	// And every send span.
	ended := spans.Ended()
	require.NotEmpty(t, ended)
	for _, span := range ended {
		assert.Contains(t, span.Attributes(), attribute.String("outbox.store", "tenant-eu"), span.Name())
	}
}

// Two databases, one shared RocketMQ sender, and one of the databases stopped mid-run and
// started again, while a writer commits to each: the other database's publisher goes on
// sending throughout, the stopped one's Health names its store with the error, and every
// event committed to either database arrives at a real consumer (lost 0 on both).
func TestManyDatabasesOneStopped(t *testing.T) {
	t.Parallel()
	manyDatabases(t, false)
}

// The same, with the database SIGKILLed (a crash) instead of stopped: InnoDB recovers it at
// its start, and nothing committed is lost either.
func TestManyDatabasesOneCrashed(t *testing.T) {
	t.Parallel()
	manyDatabases(t, true)
}

// manyDatabases runs two databases through one shared sender, and stops (or, with crash,
// kills) the second one's server mid-run; see TestManyDatabasesOneStopped.
func manyDatabases(t *testing.T, crash bool) {
	topic := testsvc.NewTopic(t, "OUTBOX_MANY")
	consumer := testsvc.Consume(t, topic)
	srv := testsvc.PrivateMySQL(t)
	dbs := map[string]*sql.DB{"orders-a": testsvc.OpenDB(t), "orders-b": srv.OpenDB(t)}
	sender := newFastRocketMQSender(t)
	logs := newLineSink()

	type shard struct {
		name      string
		store     *outbox.MySQLStore
		pub       *outbox.Publisher
		mu        sync.Mutex
		committed []string // event ids whose transaction's Commit returned nil
		writeErrs int
	}
	var shards []*shard
	pubCtx, stopPubs := context.WithCancel(context.Background())
	writeCtx, stopWrites := context.WithCancel(context.Background())
	var running, writers sync.WaitGroup
	t.Cleanup(func() { stopWrites(); writers.Wait(); stopPubs(); running.Wait() })
	for _, name := range []string{"orders-a", "orders-b"} {
		s := &shard{name: name, store: testsvc.NewStore(t, dbs[name], outbox.MySQLConfig{Routes: outbox.Routes{Topic: topic}})}
		cfg := fastConfig("many-"+name, nil)
		cfg.Logger = slog.New(logs)
		cfg.PollInterval = 20 * time.Millisecond
		cfg.Tuning.ReclaimInterval = 200 * time.Millisecond
		cfg.StoreName, cfg.SharedSender = name, true
		s.pub = newPublisher(t, s.store, sender, cfg)
		shards = append(shards, s)
		running.Go(func() { assert.NoError(t, s.pub.Run(pubCtx)) })
		writers.Go(func() {
			for n := 0; writeCtx.Err() == nil; n++ {
				id, err := insertOne(writeCtx, s.store, fmt.Sprintf("%s-%d", name, n))
				s.mu.Lock()
				if err == nil {
					s.committed = append(s.committed, id)
				} else {
					s.writeErrs++
				}
				s.mu.Unlock()
				sleepCtx(writeCtx, 5*time.Millisecond)
			}
		})
	}
	a, b := shards[0], shards[1]
	// arrived counts the distinct events of a store (by the biz no's prefix) at the consumer.
	arrived := func(s *shard) int {
		seen := map[string]bool{}
		for _, m := range consumer.Messages() {
			if strings.HasPrefix(m.GetProperty(outbox.PropertyBizNo), s.name+"-") {
				seen[m.GetProperty(outbox.PropertyEventID)] = true
			}
		}
		return len(seen)
	}
	require.Eventually(t, func() bool { return arrived(a) >= 100 && arrived(b) >= 100 }, 2*time.Minute, 20*time.Millisecond,
		"both stores' events arrive")

	if crash {
		srv.Kill(t)
	} else {
		srv.Stop(t)
	}
	down := time.Now()
	before := arrived(a)
	require.Eventually(t, func() bool {
		h := b.pub.Health()
		return h.LastError != "" && h.LastErrorAt.After(down)
	}, 2*time.Minute, 10*time.Millisecond, "the stopped database's publisher reports the error")
	require.Eventually(t, func() bool { return arrived(a) >= before+200 }, 2*time.Minute, 10*time.Millisecond,
		"the other store's publisher goes on sending while the database is down")
	hb, ha := b.pub.Health(), a.pub.Health()
	assert.Equal(t, "orders-b", hb.StoreName)
	assert.True(t, hb.Running)
	assert.NotEmpty(t, hb.LastError)
	assert.Equal(t, "orders-a", ha.StoreName)
	assert.Empty(t, ha.LastError, "the other store's publisher has no error")
	assert.True(t, ha.LastRoundOK.After(down), "the other store's rounds reach their database")
	assert.NotEmpty(t, linesOf(logs, "orders-b", slog.LevelError), "the stopped database's errors are logged under its store")
	srv.Start(t)
	up := time.Now()
	bBefore := arrived(b)
	t.Logf("orders-b down %s; orders-a sent %d events meanwhile", up.Sub(down).Round(time.Millisecond), arrived(a)-before)

	require.Eventually(t, func() bool { return arrived(b) >= bBefore+100 && b.pub.Health().LastRoundOK.After(up) }, 2*time.Minute,
		20*time.Millisecond, "the stopped database's publisher sends again, the same Run")
	stopWrites()
	writers.Wait()

	// Every event in each table arrives: the committed ones, and those whose commit outcome
	// the writer never learned.
	for _, s := range shards {
		inTable := testsvc.EventIDs(t, dbs[s.name], outbox.TableForTest(s.store))
		want := map[string]bool{}
		for _, id := range inTable {
			want[id] = true
		}
		s.mu.Lock()
		for _, id := range s.committed {
			assert.True(t, want[id], "%s: committed event %s is in the table", s.name, id)
		}
		committed, writeErrs := len(s.committed), s.writeErrs
		s.mu.Unlock()
		require.Eventually(t, func() bool {
			got := consumer.Deliveries()
			for id := range want {
				if got[id] == 0 {
					return false
				}
			}
			return true
		}, 3*time.Minute, 50*time.Millisecond, "%s: every event arrives", s.name)
		got := consumer.Deliveries()
		lost, dup := 0, 0
		for id := range want {
			switch {
			case got[id] == 0:
				lost++
			case got[id] > 1:
				dup++
			}
		}
		assert.Zero(t, lost, "%s: lost", s.name)
		t.Logf("%s: %d events in the table (%d committed, %d failed writes), lost %d, %d delivered more than once",
			s.name, len(want), committed, writeErrs, lost, dup)
	}
	assert.Empty(t, linesOf(logs, "", slog.LevelDebug), "every record names its store")

	// One publisher closes; the shared sender stays open for the other.
	require.NoError(t, a.pub.Close())
	id, err := insertOne(context.Background(), b.store, "orders-b-after")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return consumer.Deliveries()[id] > 0 }, time.Minute, 10*time.Millisecond,
		"the shared sender is still open after one publisher's Close")
	require.NoError(t, b.pub.Close())
	require.NoError(t, sender.Close())
}

// insertOne commits one event with bizNo through store and returns its event id.
func insertOne(ctx context.Context, store *outbox.MySQLStore, bizNo string) (string, error) {
	tx, err := store.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer func() { _ = tx.Rollback() }()
	id, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: bizNo, EventType: "MANY", Payload: []byte(`{}`)})
	if err != nil {
		return "", err
	}
	return id, tx.Commit()
}
