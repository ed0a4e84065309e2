package main

import (
	"context"
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
		if !strings.HasPrefix(name, "outbox_") && !strings.HasPrefix(name, "inbox_") {
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

// The example serves the publishers' and the inbox's metrics on /metrics: after a run of 20
// orders, the page counts 20 events sent and 20 messages handled, and an empty backlog.
func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	o := testOptions(t, db, testsvc.MySQLDSN(t))
	o.orders, o.instances = 20, 1
	ms, err := startMetrics("127.0.0.1:0")
	require.NoError(t, err)
	defer ms.close()
	assert.True(t, strings.HasPrefix(ms.url, "http://127.0.0.1:"), ms.url)
	o.meter = ms.provider
	require.NoError(t, run(context.Background(), o))

	got, page := scrape(t, ms.url)
	t.Logf("/metrics:\n%s", page)
	routed := "event_type=ORDER_CREATED,topic=" + o.topic
	assert.Equal(t, map[string]float64{routed: 20}, got["outbox_events_sent_total"])
	assert.Equal(t, map[string]float64{routed: 20}, got["outbox_commit_to_send_duration_seconds_count"])
	var handled float64
	for labels, v := range got["inbox_messages_total"] {
		if strings.Contains(labels, "outcome=handled") {
			handled += v
		}
	}
	assert.Equal(t, 20.0, handled, "inbox_messages_total{outcome=handled}: %v", got["inbox_messages_total"])
}

// A metrics address that is not a loopback one is refused: the page tells whoever can read it
// how the service is doing.
func TestMetricsOnLoopbackOnly(t *testing.T) {
	_, err := startMetrics("0.0.0.0:9464")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "loopback")
}
