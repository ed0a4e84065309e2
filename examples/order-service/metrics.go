package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// metricsServer serves the publishers' and the inbox's metrics at /metrics in Prometheus's
// text format: they record them through the OpenTelemetry API on a MeterProvider of the
// example's own, whose Prometheus exporter writes to a registry of its own. Nothing is
// registered globally.
type metricsServer struct {
	provider *sdkmetric.MeterProvider
	url      string // of the /metrics page
	srv      *http.Server
	done     chan struct{}
}

// startMetrics listens on addr, which must be a loopback address: the page says how the
// service is doing to whoever can read it. The provider's metrics go to readers too.
func startMetrics(addr string, readers ...sdkmetric.Reader) (*metricsServer, error) {
	if err := checkLoopback(addr); err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("metrics exporter: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-metrics-addr: %w", err)
	}
	opts := []sdkmetric.Option{sdkmetric.WithReader(exporter)}
	for _, r := range readers {
		opts = append(opts, sdkmetric.WithReader(r))
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	m := &metricsServer{
		provider: sdkmetric.NewMeterProvider(opts...),
		url:      "http://" + ln.Addr().String() + "/metrics",
		srv:      &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second},
		done:     make(chan struct{}),
	}
	go func() {
		defer close(m.done)
		_ = m.srv.Serve(ln)
	}()
	return m, nil
}

// close stops the server and the provider.
func (m *metricsServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = m.srv.Shutdown(ctx)
	<-m.done
	_ = m.provider.Shutdown(ctx)
}

// checkLoopback accepts host:port where host is a loopback address or localhost.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-metrics-addr %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return errors.New("-metrics-addr must be a loopback address, e.g. 127.0.0.1:9464, got " + addr)
	}
	return nil
}
