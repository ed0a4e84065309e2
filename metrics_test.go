package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/go-outbox/outbox"
)

// collected is one collection from a ManualReader, flattened: every counter and gauge value
// and every histogram's count, by instrument name and then by attribute set (written
// "k=v,k=v", sorted; "" for none).
type collected struct {
	values map[string]map[string]float64
	counts map[string]map[string]uint64
	maxima map[string]map[string]float64
}

func attrKey(set attribute.Set) string {
	var parts []string
	for _, kv := range set.ToSlice() {
		parts = append(parts, string(kv.Key)+"="+kv.Value.String())
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func collect(t *testing.T, r *sdkmetric.ManualReader) collected {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	c := collected{values: map[string]map[string]float64{}, counts: map[string]map[string]uint64{}, maxima: map[string]map[string]float64{}}
	put := func(name, key string, v float64) {
		if c.values[name] == nil {
			c.values[name] = map[string]float64{}
		}
		c.values[name][key] = v
	}
	for _, sm := range rm.ScopeMetrics {
		assert.Equal(t, "github.com/go-outbox/outbox", sm.Scope.Name)
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					put(m.Name, attrKey(dp.Attributes), float64(dp.Value))
				}
			case metricdata.Gauge[int64]:
				for _, dp := range d.DataPoints {
					put(m.Name, attrKey(dp.Attributes), float64(dp.Value))
				}
			case metricdata.Gauge[float64]:
				for _, dp := range d.DataPoints {
					put(m.Name, attrKey(dp.Attributes), dp.Value)
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					if c.counts[m.Name] == nil {
						c.counts[m.Name] = map[string]uint64{}
						c.maxima[m.Name] = map[string]float64{}
					}
					c.counts[m.Name][attrKey(dp.Attributes)] = dp.Count
					if v, ok := dp.Max.Value(); ok {
						c.maxima[m.Name][attrKey(dp.Attributes)] = v
					}
				}
			default:
				t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return c
}

// statsCounter is the MySQL store with its Stats calls counted.
type statsCounter struct {
	*outbox.MySQLStore
	calls atomic.Int64
}

func (s *statsCounter) Stats(ctx context.Context, opts outbox.StatsOptions) (outbox.TableStats, error) {
	s.calls.Add(1)
	return s.MySQLStore.Stats(ctx, opts)
}

// noStatsStore is a store whose Stats is unsupported, counting the calls.
type noStatsStore struct {
	outbox.Store
	calls atomic.Int64
}

func (s *noStatsStore) Stats(context.Context, outbox.StatsOptions) (outbox.TableStats, error) {
	s.calls.Add(1)
	return outbox.TableStats{}, errors.ErrUnsupported
}

// A known sequence through a running publisher, then every instrument checked exactly:
// three events sent, one retried once and then sent, one refused for good, one reclaimed
// from a dead instance and sent, one poison event dead-lettered by the reclaim.
func TestMetricsKnownSequence(t *testing.T) {
	t.Parallel()
	b := setup(t)
	store := &statsCounter{MySQLStore: b.store}
	ctx := context.Background()

	insert := func(eventType string) int64 {
		tx, err := b.store.BeginTx(ctx, nil)
		require.NoError(t, err)
		id, err := outbox.InsertForTest(ctx, tx, outbox.EventInput{BizNo: "ORD-" + eventType, EventType: eventType, Payload: []byte("{}")})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		return id
	}
	for range 3 {
		insert("ORDER_CREATED")
	}
	insert("ORDER_SHIPPED") // fails once, then goes
	insert("ORDER_PAID")    // refused for good
	// Claimed an hour ago by an instance that died; created an hour ago too, so that its
	// commit-to-send latency, by the database clock, is over an hour.
	reclaimed := insert("ORDER_CANCELLED")
	b.exec(t, "UPDATE {t} SET status = 'SENDING', claim_owner = 'dead', claimed_at = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 HOUR), "+
		"create_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 HOUR) WHERE id = ?", reclaimed)
	// Reclaimed for the last time: dead-lettered by the reclaim.
	poison := insert("ORDER_POISON")
	b.exec(t, "UPDATE {t} SET status = 'SENDING', claim_owner = 'dead', claimed_at = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 HOUR), "+
		"reclaim_count = 2 WHERE id = ?", poison)

	rec := newRecorder()
	rec.fail = func(ev outbox.Event) error {
		switch {
		case ev.EventType == "ORDER_SHIPPED" && ev.RetryCount == 0:
			return errors.New("broker said no, this once")
		case ev.EventType == "ORDER_PAID":
			return outbox.Permanent(errors.New("message refused"))
		}
		return nil
	}
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(ctx) })
	logs := &logSink{}
	cfg := fastConfig("order-1", logs)
	cfg.MeterProvider = provider
	cfg.Backoff = func(int) time.Duration { return 10 * time.Millisecond }
	cfg.Tuning.StatsInterval = time.Hour // one read, at the first collection
	p := newPublisher(t, store, rec, cfg)

	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, p.Run(runCtx)) })
	defer func() { cancel(); wg.Wait() }()
	require.Eventually(t, func() bool {
		return b.countStatus(t, outbox.StatusSuccess) == 5 && b.countStatus(t, outbox.StatusFail) == 2
	}, time.Minute, 10*time.Millisecond)

	c := collect(t, reader)
	assert.Equal(t, map[string]float64{
		"event_type=ORDER_CREATED,topic=ORDER_EVENT_TOPIC": 3, "event_type=ORDER_SHIPPED,topic=ORDER_EVENT_TOPIC": 1, "event_type=ORDER_CANCELLED,topic=ORDER_EVENT_TOPIC": 1,
	}, c.values["outbox.events.sent"])
	assert.Equal(t, map[string]float64{"event_type=ORDER_SHIPPED,topic=ORDER_EVENT_TOPIC": 1}, c.values["outbox.events.retried"])
	assert.Equal(t, map[string]float64{
		"event_type=ORDER_PAID,reason=permanent,topic=ORDER_EVENT_TOPIC": 1, "event_type=ORDER_POISON,reason=reclaims,topic=ORDER_EVENT_TOPIC": 1,
	}, c.values["outbox.events.dead_lettered"])
	assert.Equal(t, map[string]float64{"": 1}, c.values["outbox.events.reclaimed"])
	assert.Nil(t, c.values["outbox.claims.lost"], "one instance loses no claim")
	assert.Nil(t, c.values["outbox.leases.lost"])
	assert.Nil(t, c.values["outbox.broker.outages"])
	assert.Equal(t, map[string]float64{"": 0}, c.values["outbox.broker.unavailable"])
	assert.Equal(t, map[string]float64{"": float64(outbox.LockRetriesForTest(b.store))}, c.values["outbox.store.lock_retries"])
	// One record per send call. Per row, seven calls of one event each: five accepted, two
	// refused. In batches, three: the first claim's five events (two refused: the call
	// failed), then the reclaimed event (a reclaimed event is claimed alone) and the retry.
	calls := map[string]uint64{"outcome=sent": 2, "outcome=failed": 1}
	if testPerRow {
		calls = map[string]uint64{"outcome=sent": 5, "outcome=failed": 2}
	}
	assert.Equal(t, calls, c.counts["outbox.send.duration"])
	assert.Equal(t, map[string]uint64{
		"event_type=ORDER_CREATED,topic=ORDER_EVENT_TOPIC": 3, "event_type=ORDER_SHIPPED,topic=ORDER_EVENT_TOPIC": 1, "event_type=ORDER_CANCELLED,topic=ORDER_EVENT_TOPIC": 1,
	}, c.counts["outbox.commit_to_send.duration"])
	lag := c.maxima["outbox.commit_to_send.duration"]["event_type=ORDER_CANCELLED,topic=ORDER_EVENT_TOPIC"]
	assert.GreaterOrEqual(t, lag, 3600.0, "committed an hour ago by the database clock")
	assert.Less(t, lag, 3660.0)
	assert.Less(t, c.maxima["outbox.commit_to_send.duration"]["event_type=ORDER_CREATED,topic=ORDER_EVENT_TOPIC"], 60.0)

	// The table as it now stands: nothing due or SENDING, two dead letters.
	assert.Equal(t, map[string]float64{"": 0}, c.values["outbox.table.backlog"])
	assert.Equal(t, map[string]float64{"": 0}, c.values["outbox.table.oldest_due_age"])
	assert.Equal(t, map[string]float64{"": 0}, c.values["outbox.table.sending"])
	assert.Equal(t, map[string]float64{"": 0}, c.values["outbox.table.oldest_claim_age"])
	assert.Equal(t, map[string]float64{"": 0}, c.values["outbox.table.sending_past_half_lease"])
	assert.Equal(t, map[string]float64{"event_type=ORDER_PAID": 1, "event_type=ORDER_POISON": 1}, c.values["outbox.table.failed"])
	assert.Equal(t, int64(1), store.calls.Load())

	for name := range c.values {
		assert.Contains(t, instruments, name)
	}
	for name := range c.counts {
		assert.Contains(t, instruments, name)
	}

	// Collections within StatsInterval read the table no more.
	for range 5 {
		collect(t, reader)
	}
	assert.Equal(t, int64(1), store.calls.Load(), "one Stats call per StatsInterval, however often the gauges are collected")
}

// The gauges report the table as Stats reads it, at most once per StatsInterval, and only
// while Run runs.
func TestMetricsTableGauges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	store := &statsCounter{MySQLStore: b.store}
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(ctx) })
	cfg := fastConfig("order-1", &logSink{})
	cfg.MeterProvider = provider
	cfg.PollInterval, cfg.Tuning.ReclaimInterval = time.Hour, time.Hour // one round, one reclaim, at the start
	cfg.Tuning.Lease = 10 * time.Minute
	cfg.Tuning.StatsInterval = 50 * time.Millisecond
	p := newPublisher(t, store, newRecorder(), cfg)

	c := collect(t, reader)
	assert.Nil(t, c.values["outbox.table.backlog"], "no gauges before Run")
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, p.Run(runCtx)) })
	require.Eventually(t, func() bool { return !p.Health().LastRoundOK.IsZero() }, time.Minute, 5*time.Millisecond)

	// Written behind the publisher's back (no commit through the store wakes it): it claims
	// nothing more for an hour.
	var rows []rawRow
	rows = append(rows, rawRow{status: "WAIT", eventType: "A", dueIn: -120})
	rows = append(rows, repeatRow(rawRow{status: "WAIT", eventType: "A", dueIn: -1}, 3)...)
	rows = append(rows, rawRow{status: "WAIT", eventType: "A", dueIn: 600})
	rows = append(rows, rawRow{status: "SENDING", eventType: "A", dueIn: -400, claimedIn: -400})
	rows = append(rows, rawRow{status: "SENDING", eventType: "A", dueIn: -2, claimedIn: -2})
	rows = append(rows, repeatRow(rawRow{status: "FAIL", eventType: "ORDER_PAID", dueIn: -60, claimedIn: -60}, 2)...)
	rows = append(rows, repeatRow(rawRow{status: "SUCCESS", eventType: "A", dueIn: -60, claimedIn: -60}, 5)...)
	b.insertRaw(t, rows)
	time.Sleep(60 * time.Millisecond) // past StatsInterval: the next collection reads again

	c = collect(t, reader)
	assert.Equal(t, map[string]float64{"": 4}, c.values["outbox.table.backlog"])
	assert.Equal(t, map[string]float64{"": 2}, c.values["outbox.table.sending"])
	assert.Equal(t, map[string]float64{"": 1}, c.values["outbox.table.sending_past_half_lease"])
	assert.Equal(t, map[string]float64{"event_type=ORDER_PAID": 2}, c.values["outbox.table.failed"])
	assert.GreaterOrEqual(t, c.values["outbox.table.oldest_due_age"][""], 120.0)
	assert.Less(t, c.values["outbox.table.oldest_due_age"][""], 180.0)
	assert.GreaterOrEqual(t, c.values["outbox.table.oldest_claim_age"][""], 400.0)
	assert.Less(t, c.values["outbox.table.oldest_claim_age"][""], 460.0)

	cancel()
	wg.Wait()
	calls := store.calls.Load()
	time.Sleep(60 * time.Millisecond)
	c = collect(t, reader)
	assert.Nil(t, c.values["outbox.table.backlog"], "no gauges once Run has returned")
	assert.Equal(t, calls, store.calls.Load(), "no Stats call once Run has returned")
}

// A store whose Stats is unsupported (errors.ErrUnsupported) has no table gauges, one that
// counts no lock retries no lock-retry counter, and a publisher without a MeterProvider
// records nothing anywhere.
func TestMetricsOptional(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(ctx) })
	cfg := fastConfig("order-1", &logSink{})
	cfg.MeterProvider = provider
	store := &noStatsStore{Store: b.store} // a Store, and nothing more
	p := newPublisher(t, store, newRecorder(), cfg)
	b.insert(t, 2)
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, p.Run(runCtx)) })
	require.Eventually(t, func() bool { return b.countStatus(t, outbox.StatusSuccess) == 2 }, time.Minute, 10*time.Millisecond)
	c := collect(t, reader)
	cancel()
	wg.Wait()
	assert.Equal(t, map[string]float64{"event_type=ORDER_CREATED,topic=ORDER_EVENT_TOPIC": 2}, c.values["outbox.events.sent"])
	assert.Nil(t, c.values["outbox.table.backlog"])
	assert.Nil(t, c.values["outbox.store.lock_retries"])
	assert.Equal(t, map[string]float64{"": 0}, c.values["outbox.broker.unavailable"])
	assert.Equal(t, int64(1), store.calls.Load(), "the gauges asked the store, which cannot tell")

	_, err := outbox.NewPublisher(b.store, newRecorder(), outbox.Config{Tuning: outbox.Tuning{StatsInterval: -time.Second}})
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	require.ErrorContains(t, err, "StatsInterval")
}

// instruments are the publisher's instruments by name, with the name Prometheus gives each
// (the OpenTelemetry Prometheus exporter's translation).
var instruments = map[string]string{
	"outbox.events.sent":                   "outbox_events_sent_total",
	"outbox.events.retried":                "outbox_events_retried_total",
	"outbox.events.unconfirmed":            "outbox_events_unconfirmed_total",
	"outbox.events.dead_lettered":          "outbox_events_dead_lettered_total",
	"outbox.events.reclaimed":              "outbox_events_reclaimed_total",
	"outbox.claims.lost":                   "outbox_claims_lost_total",
	"outbox.leases.lost":                   "outbox_leases_lost_total",
	"outbox.store.lock_retries":            "outbox_store_lock_retries_total",
	"outbox.broker.outages":                "outbox_broker_outages_total",
	"outbox.broker.unavailable":            "outbox_broker_unavailable",
	"outbox.send.duration":                 "outbox_send_duration_seconds",
	"outbox.commit_to_send.duration":       "outbox_commit_to_send_duration_seconds",
	"outbox.table.backlog":                 "outbox_table_backlog",
	"outbox.table.oldest_due_age":          "outbox_table_oldest_due_age_seconds",
	"outbox.table.sending":                 "outbox_table_sending",
	"outbox.table.oldest_claim_age":        "outbox_table_oldest_claim_age_seconds",
	"outbox.table.sending_past_half_lease": "outbox_table_sending_past_half_lease",
	"outbox.table.failed":                  "outbox_table_failed",
}

// docs/operations.md lists every instrument, and the dashboard has a panel for each. Every
// series selector of the dashboard keeps to the chosen jobs and stores, and the store
// variable's All also matches an unnamed publisher's series, which have no store label.
func TestMetricsDocumentedAndOnTheDashboard(t *testing.T) {
	readme, err := os.ReadFile("docs/operations.md")
	require.NoError(t, err)
	raw, err := os.ReadFile("dashboards/outbox.json")
	require.NoError(t, err)
	var dash struct {
		Templating struct {
			List []struct {
				Name       string          `json:"name"`
				Type       string          `json:"type"`
				Definition string          `json:"definition"`
				Query      json.RawMessage `json:"query"` // a string or an object, by type
				Multi      bool            `json:"multi"`
				IncludeAll bool            `json:"includeAll"`
				AllValue   string          `json:"allValue"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash), "the dashboard is valid JSON")
	var exprs []string
	selector := regexp.MustCompile(`outbox_[a-z_]+(\{[^}]*\})?`)
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			exprs = append(exprs, target.Expr)
			sels := selector.FindAllString(target.Expr, -1)
			assert.NotEmpty(t, sels, "panel %q: %s reads no outbox series", p.Title, target.Expr)
			for _, sel := range sels {
				assert.Contains(t, sel, `job=~"$job"`, "panel %q: %s", p.Title, target.Expr)
				assert.Contains(t, sel, `store=~"$store"`, "panel %q: %s", p.Title, target.Expr)
			}
		}
	}
	require.NotEmpty(t, exprs, "the dashboard has queries")
	all := strings.Join(exprs, "\n")
	for name, prom := range instruments {
		assert.Contains(t, string(readme), "`"+name+"` (`"+prom+"`)", "docs/operations.md lists %s", name)
		assert.Contains(t, all, prom, "the dashboard shows %s", name)
	}

	found := false
	for _, v := range dash.Templating.List {
		if v.Name != "store" {
			continue
		}
		found = true
		assert.Equal(t, "query", v.Type)
		assert.True(t, v.Multi, "several stores may be chosen")
		assert.True(t, v.IncludeAll, "the store variable has All")
		allValue, err := regexp.Compile("^(?:" + v.AllValue + ")$")
		require.NoError(t, err, "All is a regular expression")
		assert.True(t, allValue.MatchString(""), "All (%q) matches the series of an unnamed store, which have no store label", v.AllValue)
		assert.True(t, allValue.MatchString("shard-0"), "All (%q) matches a named store", v.AllValue)
		var query struct {
			Query string `json:"query"`
		}
		require.NoError(t, json.Unmarshal(v.Query, &query))
		assert.Equal(t, v.Definition, query.Query)
		m := regexp.MustCompile(`^label_values\((outbox_[a-z_]+)(\{[^}]*\})?, store\)$`).FindStringSubmatch(query.Query)
		require.NotNil(t, m, "the store variable lists the store label's values: %s", query.Query)
		known := false
		for _, prom := range instruments {
			known = known || m[1] == prom
		}
		assert.True(t, known, "the store variable reads an outbox metric: %s", m[1])
	}
	assert.True(t, found, "the dashboard has a store variable")
}
