package bench_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-outbox/outbox/internal/testsvc"
	"github.com/go-outbox/outbox/tools/internal/bench"
)

// BenchmarkDrain drains 5,000 (batch) or 1,000 (per-row) pre-inserted events per op with a
// no-op sender, in each claim mode, with 1, 3 and 8 instances, side by side; batch mode also
// with concurrent claims (MySQLConfig.ConcurrentClaims), the baseline for its claim turns:
//
//	OUTBOX_TEST_MYSQL_DSN=... go -C tools test -run '^$' -bench Drain ./internal/bench
func BenchmarkDrain(b *testing.B) {
	env := bench.Env{DSN: testsvc.MySQLDSN(b)}
	variants := []struct {
		name  string
		drain bench.Drain
	}{
		{"mode=per-row", bench.Drain{PerRow: true, Events: 1000}},
		{"mode=batch", bench.Drain{Events: 5000}},
		{"mode=batch/claims=concurrent", bench.Drain{Events: 5000, ConcurrentClaims: true}},
	}
	for _, v := range variants {
		for _, k := range []int{1, 3, 8} {
			b.Run(fmt.Sprintf("%s/instances=%d", v.name, k), func(b *testing.B) {
				d := v.drain
				d.Instances, d.Sender = k, bench.NopSender
				var total float64
				var stmts int64
				for b.Loop() {
					res, err := d.Run(context.Background(), env)
					if err != nil {
						b.Fatal(err)
					}
					if res.Errors > 0 {
						b.Fatalf("%d errors surfaced", res.Errors)
					}
					total += res.Elapsed.Seconds()
					stmts += res.Statements
				}
				b.ReportMetric(float64(d.Events*b.N)/total, "events/s")
				b.ReportMetric(float64(stmts)/float64(d.Events*b.N), "stmts/event")
			})
		}
	}
}

// BenchmarkCommitToSend measures the time from commit to send with the wake-up on commit.
func BenchmarkCommitToSend(b *testing.B) {
	env := bench.Env{DSN: testsvc.MySQLDSN(b)}
	for _, perRow := range []bool{true, false} {
		b.Run("mode="+bench.ModeName(perRow), func(b *testing.B) {
			for b.Loop() {
				res, err := bench.Latency{PerRow: perRow, Instances: 3, Events: 200, Rate: 200, WakeUp: true,
					Poll: 5 * time.Second}.Run(context.Background(), env) // the default Config.PollInterval
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(res.Quantile(0.5).Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(res.Quantile(0.99).Microseconds())/1000, "p99-ms")
			}
		})
	}
}

// BenchmarkSteady commits events one per transaction at 100, 1,000 and 5,000 events/s for
// 5 s, with 1 and 3 instances, and reports what publishing them cost the server (its own
// statement counters, less the writers' statements) and the commit-to-send latency. The
// counters are global: run it against a server nothing else uses.
//
//	OUTBOX_TEST_MYSQL_DSN=... go -C tools test -run '^$' -bench Steady ./internal/bench
func BenchmarkSteady(b *testing.B) {
	env := bench.Env{DSN: testsvc.MySQLDSN(b)}
	for _, rate := range []int{100, 1000, 5000} {
		for _, k := range []int{1, 3} {
			b.Run(fmt.Sprintf("rate=%d/instances=%d", rate, k), func(b *testing.B) {
				for b.Loop() {
					res, err := bench.Steady{Rate: rate, Instances: k, Duration: 5 * time.Second}.Run(context.Background(), env)
					if err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(res.StatementsPerEvent(), "stmts/event")
					b.ReportMetric(res.EventsPerRound(), "events/round")
					b.ReportMetric(float64(res.Quantile(0.5).Microseconds())/1000, "p50-ms")
					b.ReportMetric(float64(res.Quantile(0.99).Microseconds())/1000, "p99-ms")
				}
			})
		}
	}
}
