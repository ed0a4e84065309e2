package bench

import (
	"context"
	"fmt"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// lockRetriesMetric is the publisher's counter of the store statements run again after a
// deadlock or a lock wait timeout (docs/operations.md).
const lockRetriesMetric = "outbox.store.lock_retries"

// meters is a publisher's MeterProvider, read on demand: every instrument but the lock-retry
// counter is dropped, so that the metrics cost the measurement next to nothing.
type meters struct {
	provider *sdkmetric.MeterProvider
	reader   *sdkmetric.ManualReader
}

func newMeters() *meters {
	reader := sdkmetric.NewManualReader()
	onlyLockRetries := func(i sdkmetric.Instrument) (sdkmetric.Stream, bool) {
		if i.Name == lockRetriesMetric {
			return sdkmetric.Stream{}, false // the default stream
		}
		return sdkmetric.Stream{Name: i.Name, Aggregation: sdkmetric.AggregationDrop{}}, true
	}
	return &meters{
		provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader), sdkmetric.WithView(onlyLockRetries)),
		reader:   reader,
	}
}

// lockRetries reads the publisher's lock-retry counter. The counter is observed while Run
// runs only: read it before the publisher stops. A counter the publisher does not report is
// an error, not a zero.
func (m *meters) lockRetries(ctx context.Context) (int64, error) {
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(ctx, &rm); err != nil {
		return 0, fmt.Errorf("collect the publisher's metrics: %w", err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name != lockRetriesMetric {
				continue
			}
			sum, ok := mt.Data.(metricdata.Sum[int64])
			if !ok {
				return 0, fmt.Errorf("%s is a %T, not an integer sum", lockRetriesMetric, mt.Data)
			}
			var n int64
			for _, dp := range sum.DataPoints {
				n += dp.Value
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("the publisher reports no %s (is it running?)", lockRetriesMetric)
}

func (m *meters) shutdown() { _ = m.provider.Shutdown(context.Background()) }
