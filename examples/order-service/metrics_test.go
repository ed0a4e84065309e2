package main

import (
	"context"
	"io"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// scrape reads a /metrics page: every sample's value by metric name and then by its labels
// (written "k=v,k=v", sorted, without the otel_scope_ labels every sample carries);
// histograms by their _count.
func scrape(t *testing.T, url string) (map[string]map[string]float64, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	require.NoError(t, err)
	out := map[string]map[string]float64{}
	for name, f := range families {
		if !strings.HasPrefix(name, "outbox_") {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				if !strings.HasPrefix(l.GetName(), "otel_scope_") {
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
			}
			sort.Strings(labels)
			key := strings.Join(labels, ",")
			var v float64
			n := name
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				v = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				v = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				v, n = float64(m.GetHistogram().GetSampleCount()), name+"_count"
			default:
				t.Fatalf("%s: unexpected type %s", name, f.GetType())
			}
			if out[n] == nil {
				out[n] = map[string]float64{}
			}
			out[n][key] = v
		}
	}
	return out, string(body)
}

// The example serves /metrics; after a known sequence every value is as it should be:
// 20 orders sent through the real broker, two of them reported failed once (their
// acknowledgement lost) and retried, an event left SENDING by a dead instance reclaimed and
// sent, and a poison event dead-lettered by its last reclaim.
func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	o := testOptions(t, &out)
	o.orders, o.instances, o.duplicate = 20, 1, 2
	o.metricsAddr = "127.0.0.1:0"
	ctx := context.Background()
	db := testsvc.OpenDB(t)

	exampleDB, err := openDB(o.dsn)
	require.NoError(t, err)
	defer exampleDB.Close()
	store, err := prepareTables(ctx, exampleDB, o)
	require.NoError(t, err)
	seed := func(bizNo string) int64 {
		tx, err := store.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer tx.Rollback() //nolint:errcheck
		eventID, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: bizNo, EventType: "ORDER_CREATED", Payload: []byte("seeded")})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		var id int64 // the row's id, which the UPDATE below names
		require.NoError(t, db.QueryRow("SELECT id FROM `"+o.table+"` WHERE event_id = ?", eventID).Scan(&id))
		return id
	}
	// Claimed an hour ago by an instance that died: reclaimed at the start and sent (the
	// points service rejects its body, which is not JSON). Its retry count is 1, so that the
	// first instance's lost acknowledgements, which are those of first sends, are all the
	// orders'.
	reclaimed := seed("SEED-reclaimed")
	// Reclaimed twice already: the third reclaim (MaxReclaims) dead-letters it.
	poison := seed("SEED-poison")
	for _, q := range []string{
		"UPDATE `" + o.table + "` SET status = 'SENDING', claim_owner = 'dead', claimed_at = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 HOUR), " +
			"retry_count = IF(id = ?, 1, 0), reclaim_count = IF(id = ?, 2, 0) WHERE id IN (?, ?)",
	} {
		_, err := db.Exec(q, reclaimed, poison, reclaimed, poison)
		require.NoError(t, err)
	}

	var got map[string]map[string]float64
	var page string
	o.metricsReady = func(url string) {
		assert.True(t, strings.HasPrefix(url, "http://127.0.0.1:"), url)
		require.Eventually(t, func() bool {
			var n int
			require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM `"+o.table+"` WHERE (id = ? AND status = 'SUCCESS') OR (id = ? AND status = 'FAIL')",
				reclaimed, poison).Scan(&n))
			return n == 2
		}, time.Minute, 20*time.Millisecond)
		got, page = scrape(t, url)
	}
	sum, err := run(ctx, o)
	t.Logf("run:\n%s", out.String())
	require.NoError(t, err)
	forget(t, db, sum.prefix)
	require.NotNil(t, got, "the page was scraped")
	t.Logf("/metrics:\n%s", page)

	// The event counters name the event's topic, the sender's one (docs/routing.md).
	created := "event_type=ORDER_CREATED"
	routed := created + ",topic=" + o.topic
	want := map[string]map[string]float64{
		"outbox_events_sent_total":                     {routed: 21},
		"outbox_events_retried_total":                  {routed: 2},
		"outbox_events_dead_lettered_total":            {created + ",reason=reclaims,topic=" + o.topic: 1},
		"outbox_events_reclaimed_total":                {"": 1},
		"outbox_broker_unavailable":                    {"": 0},
		"outbox_store_lock_retries_total":              {"": 0},
		"outbox_commit_to_send_duration_seconds_count": {routed: 21},
		"outbox_table_backlog":                         {"": 0},
		"outbox_table_oldest_due_age_seconds":          {"": 0},
		"outbox_table_sending":                         {"": 0},
		"outbox_table_oldest_claim_age_seconds":        {"": 0},
		"outbox_table_sending_past_half_lease":         {"": 0},
		"outbox_table_failed":                          {created: 1},
	}
	// A send's duration is recorded once per Send call, which carries a batch of events, and
	// how the events fall into batches varies from run to run: the calls are bounded, not
	// counted. The two lost acknowledgements fail one batch or two; the reclaimed event,
	// claimed alone, and the two retries succeed in at least two more; and every call
	// carried at least one of the 23 sends.
	calls := got["outbox_send_duration_seconds_count"]
	delete(got, "outbox_send_duration_seconds_count")
	outcomes := slices.Sorted(maps.Keys(calls))
	assert.Equal(t, []string{"outcome=failed", "outcome=sent"}, outcomes)
	assert.True(t, calls["outcome=failed"] >= 1 && calls["outcome=failed"] <= 2, "failed calls: %v", calls)
	assert.GreaterOrEqual(t, calls["outcome=sent"], 2.0, "sent calls")
	assert.LessOrEqual(t, calls["outcome=failed"]+calls["outcome=sent"], 23.0, "calls")
	assert.Equal(t, want, got)
}
