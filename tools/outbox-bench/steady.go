package main

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"math"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/go-outbox/outbox/tools/internal/bench"
)

// flushNote names the server's innodb_flush_log_at_trx_commit, and says so when it is not
// the production default.
func flushNote(ctx context.Context, env bench.Env) string {
	f, err := bench.FlushSetting(ctx, env)
	switch {
	case err != nil:
		return "innodb_flush_log_at_trx_commit unknown: " + err.Error()
	case f == 1:
		return "innodb_flush_log_at_trx_commit=1 (the production default)"
	}
	return fmt.Sprintf("innodb_flush_log_at_trx_commit=%d (NOT the production default 1: commits are cheaper than in production)", f)
}

// steadyTable prints the steady-state rows: for each rate and number of instances, writers
// committing one event per transaction at that rate, and what publishing them cost, first
// publishing eagerly (as before coalescing: the baseline) and then as the library does.
func steadyTable(ctx context.Context, env bench.Env, rates, ks []int, dur time.Duration, writers int, coalesce time.Duration, relay bool) {
	fmt.Printf("\nsteady state, %s each, batch mode, wake on commit; %s; statements and redo from the server-wide counters (valid on a server nothing else uses)\n",
		dur, flushNote(ctx, env))
	fmt.Printf("eager: every wake-up claims at once, each claim a transaction of its own that locks as it scans (Tuning.EagerClaims, MySQLConfig.PooledClaims, MySQLConfig.ScanFromStart); coalescing: the defaults, Tuning.CoalesceDelay %s\n",
		cmp.Or(coalesce, 7*time.Millisecond)) // the default Tuning.CoalesceDelay
	type row struct {
		s   bench.Steady
		res bench.SteadyResult
	}
	var rows []row
	for _, rate := range rates {
		for _, k := range ks {
			ways := []bench.Steady{{Eager: true}, {}}
			if relay {
				ways = append(ways, bench.Steady{Relay: true})
			}
			for _, s := range ways {
				s.Rate, s.Instances, s.Duration, s.Writers, s.CoalesceDelay = rate, k, dur, writers, coalesce
				res, err := s.Run(ctx, env)
				if err != nil {
					log.Fatalf("steady state %d/s x%d (%s): %v", rate, k, steadyWay(s), err)
				}
				rows = append(rows, row{s, res})
			}
		}
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "steady\tinstances\ttarget/s\tachieved/s\tevents\tstatements/event\tclaim rounds/s\tevents/round\tsends/s\tredo KB/event\tp50\tp99\tmax\terrors\t")
	for _, r := range rows {
		fmt.Fprintf(w, "%s\t%d\t%d\t%.0f\t%d\t%.2f\t%.0f\t%.1f\t%.0f\t%s\t%s\t%s\t%s\t%d\t\n", steadyWay(r.s),
			r.s.Instances, r.s.Rate, r.res.Rate(),
			r.res.Committed, r.res.StatementsPerEvent(), r.res.RoundsPerSecond(), r.res.EventsPerRound(),
			float64(r.res.Batches)/r.res.Elapsed.Seconds(), bench.KB(r.res.RedoPerEvent()),
			ms(r.res.Quantile(0.5)), ms(r.res.Quantile(0.99)), ms(r.res.Quantile(1)), r.res.Errors)
	}
	_ = w.Flush()
	for _, r := range rows {
		if r.res.FirstError != "" {
			fmt.Printf("errors, %d/s x%d %s: %d, the first: %s\n", r.s.Rate, r.s.Instances, steadyWay(r.s), r.res.Errors, r.res.FirstError)
		}
	}
	fmt.Println("publishing statements per event by kind (server Com_* counters):")
	for _, r := range rows {
		fmt.Printf("  %5d/s x%d %-10s %s\n", r.s.Rate, r.s.Instances, steadyWay(r.s)+":", bench.Breakdown(perEvent(r.res.Com, r.res.Committed)))
	}
	if len(rows) > 0 {
		cal := rows[0].res.Writer
		fmt.Printf("a writer transaction alone (subtracted): %.2f statements (%s), %s KB redo\n",
			cal.Questions, bench.Breakdown(cal.Com), bench.KB(known(cal.RedoBytes)))
	}
}

// binlogColumn reads the server's binary log settings and returns their name and the
// formatting of the binary log columns: bench.KB, but "-" with the binary log off (where the
// server counts 0 bytes).
func binlogColumn(ctx context.Context, env bench.Env) (note string, kb func(bytes float64) string) {
	b, err := bench.ReadBinlogSettings(ctx, env)
	if err != nil {
		return "binary log settings unknown: " + err.Error(), bench.KB
	}
	if !b.On {
		return b.String(), func(float64) string { return "-" }
	}
	return b.String(), bench.KB
}

// known turns a calibration's -1 (unknown) into the NaN that bench.KB prints as "-".
func known(bytes float64) float64 {
	if bytes < 0 {
		return math.NaN()
	}
	return bytes
}

// publishing names a row's way of publishing.
func publishing(eager bool) string {
	if eager {
		return "eager"
	}
	return "coalescing"
}

func perEvent(com map[string]float64, events int) map[string]float64 {
	out := make(map[string]float64, len(com))
	for k, v := range com {
		out[k] = v / float64(events)
	}
	return out
}

// writePathTable prints what the event's INSERT, and each of the outbox table's indexes,
// costs the business transaction.
func writePathTable(ctx context.Context, env bench.Env, writers int, dur time.Duration, rounds, prefill int) {
	fmt.Printf("\nwrite path: %d writers, %s per variant per round, %d rounds, one pool, no publisher, outbox tables holding %d sent rows; %s\n",
		writers, dur, rounds, prefill, flushNote(ctx, env))
	vs, err := bench.WritePath{Writers: writers, Duration: dur, Rounds: rounds, Prefill: prefill}.Run(ctx, env)
	if err != nil {
		log.Fatalf("write path: %v", err)
	}
	var alone, full float64
	for _, v := range vs {
		switch v.Name {
		case "order alone":
			alone = v.Rate()
		case "order + event":
			full = v.Rate()
		}
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "write path\torders\torders/s (median of %d)\tlowest\thighest\tvs order alone\tvs order + event\tredo KB/order\t\n", rounds)
	for _, v := range vs {
		redo := "-"
		if r := v.RedoPerOrder(); r >= 0 {
			redo = fmt.Sprintf("%.2f", r/1024)
		}
		rs := v.Rates()
		fmt.Fprintf(w, "%s\t%d\t%.0f\t%.0f\t%.0f\t%+.1f %%\t%+.1f %%\t%s\t\n", v.Name, v.Committed(), v.Rate(), rs[0], rs[len(rs)-1],
			100*(v.Rate()/alone-1), 100*(v.Rate()/full-1), redo)
	}
	_ = w.Flush()
}

// serviceTable prints the service's view: orders/s alone and with the publishers keeping up,
// eager and coalescing, and with the reference relays if references is set.
func serviceTable(ctx context.Context, env bench.Env, writers, instances int, dur, coalesce time.Duration, runs int, references, relay bool, only []string, paired bool) {
	binlogNote, binlogKB := binlogColumn(ctx, env)
	fmt.Printf("\nservice view: %d writers committing an order and its event per transaction, %s each way, spread over %d instances; %s; %s\n",
		writers, dur, instances, flushNote(ctx, env), binlogNote)
	// Round after round (alone, then each way of publishing, each round starting one way
	// further), so that the machine's noise spreads over all alike; each publishing cost is
	// against the same round's alone.
	results := make([]bench.ServiceResult, runs)
	for i := range results {
		res, err := bench.Service{Writers: writers, Instances: instances, Duration: dur, CoalesceDelay: coalesce, References: references, Relay: relay, Rotate: i, Ways: only, Paired: paired}.Run(ctx, env)
		if err != nil {
			log.Fatalf("service view (run %d): %v", i+1, err)
		}
		results[i] = res
	}
	type way struct {
		key, name string
		pick      func(bench.ServiceResult) bench.SteadyResult
	}
	ways := []way{
		{"eager", fmt.Sprintf("%d publishers, %s", instances, publishing(true)), func(r bench.ServiceResult) bench.SteadyResult { return r.Eager }},
		{"coalescing", fmt.Sprintf("%d publishers, %s", instances, publishing(false)), func(r bench.ServiceResult) bench.SteadyResult { return r.Coalescing }},
	}
	if references {
		ways = append(ways,
			way{"readonly", bench.ReadOnly.String(), func(r bench.ServiceResult) bench.SteadyResult { return r.ReadOnly }},
			way{"onewrite", bench.OneWrite.String(), func(r bench.ServiceResult) bench.SteadyResult { return r.OneWrite }},
			way{"twowrites", bench.TwoWrites.String(), func(r bench.ServiceResult) bench.SteadyResult { return r.TwoWrites }})
	}
	if relay {
		ways = append(ways,
			way{"relay", fmt.Sprintf("%d binlog relays (1 leads)", instances), func(r bench.ServiceResult) bench.SteadyResult { return r.Relay }},
			way{"binlog", bench.BinlogOnly.String(), func(r bench.ServiceResult) bench.SteadyResult { return r.BinlogOnly }})
	}
	if len(only) > 0 {
		ways = slices.DeleteFunc(ways, func(w way) bool { return !slices.Contains(only, w.key) })
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	cpuCols, cpuHead := "", ""
	if paired {
		cpuHead = "\tCPU µs/order: process\tserver"
	}
	fmt.Fprintln(w, "service\trun\torders\torders/s\tpublishing cost\tstatements/event\tredo KB/event\tbinlog KB/event\tclaim rounds/s\tevents/round\tp50\tp99\tmax"+cpuHead+"\t")
	for i, res := range results {
		if paired {
			cpuCols = "\t-\t-"
		}
		fmt.Fprintf(w, "alone\t%d\t%d\t%.0f\t-\t-\t-\t-\t-\t-\t-\t-\t-%s\t\n", i+1, res.AloneOrders(), res.AloneRate(), cpuCols)
		for _, way := range ways {
			s := way.pick(res)
			if paired {
				fmt.Fprintf(w, "alone, before it\t%d\t-\t%.0f\t-\t-\t-\t-\t-\t-\t-\t-\t-\t%s\t%s\t\n", i+1, s.AloneRate, micros(s.AloneCPU.Self), micros(s.AloneCPU.Server))
				cpuCols = "\t" + micros(s.CPU.Self) + "\t" + micros(s.CPU.Server)
			}
			fmt.Fprintf(w, "%s\t%d\t%d\t%.0f\t%.1f %%\t%.2f\t%s\t%s\t%.0f\t%.1f\t%s\t%s\t%s%s\t\n", way.name, i+1,
				s.Committed, s.Rate(), res.CostPercent(s), s.StatementsPerEvent(), bench.KB(s.RedoPerEvent()), binlogKB(s.BinlogPerEvent()),
				s.RoundsPerSecond(), s.EventsPerRound(), ms(s.Quantile(0.5)), ms(s.Quantile(0.99)), ms(s.Quantile(1)), cpuCols)
		}
	}
	if runs > 1 {
		med := func(f func(bench.ServiceResult) float64) float64 {
			xs := make([]float64, len(results))
			for i, r := range results {
				xs[i] = f(r)
			}
			slices.Sort(xs)
			return median(xs)
		}
		if paired {
			cpuCols = "\t-\t-"
		}
		fmt.Fprintf(w, "alone\tmedian\t-\t%.0f\t-\t-\t-\t-\t-\t-\t-\t-\t-%s\t\n", med(bench.ServiceResult.AloneRate), cpuCols)
		for _, way := range ways {
			msOf := func(q float64) string {
				return ms(time.Duration(med(func(r bench.ServiceResult) float64 { return float64(way.pick(r).Quantile(q)) })))
			}
			// The median of bytes known in every run; unknown (NaN) in any makes it unknown.
			bytesOf := func(f func(bench.SteadyResult) float64) float64 {
				for _, r := range results {
					if math.IsNaN(f(way.pick(r))) {
						return math.NaN()
					}
				}
				return med(func(r bench.ServiceResult) float64 { return f(way.pick(r)) })
			}
			if paired {
				cpuCols = "\t" + micros(time.Duration(med(func(r bench.ServiceResult) float64 { return float64(way.pick(r).CPU.Self) }))) +
					"\t" + micros(time.Duration(med(func(r bench.ServiceResult) float64 { return float64(way.pick(r).CPU.Server) })))
			}
			fmt.Fprintf(w, "%s\tmedian\t-\t%.0f\t%.1f %%\t%.2f\t%s\t%s\t%.0f\t%.1f\t%s\t%s\t%s%s\t\n", way.name,
				med(func(r bench.ServiceResult) float64 { return way.pick(r).Rate() }),
				med(func(r bench.ServiceResult) float64 { return r.CostPercent(way.pick(r)) }),
				med(func(r bench.ServiceResult) float64 { return way.pick(r).StatementsPerEvent() }),
				bench.KB(bytesOf(bench.SteadyResult.RedoPerEvent)), binlogKB(bytesOf(bench.SteadyResult.BinlogPerEvent)),
				med(func(r bench.ServiceResult) float64 { return way.pick(r).RoundsPerSecond() }),
				med(func(r bench.ServiceResult) float64 { return way.pick(r).EventsPerRound() }),
				msOf(0.5), msOf(0.99), msOf(1), cpuCols)
		}
	}
	_ = w.Flush()
	if paired {
		// What publishing added to the CPU per order, against the writers alone just before:
		// the process's (the publishers' or the relay's own work) and the server's.
		for _, way := range ways {
			over := func(f func(bench.CPUUse) time.Duration) string {
				xs := make([]float64, 0, len(results))
				for _, r := range results {
					p := way.pick(r)
					if f(p.CPU) < 0 || f(p.AloneCPU) < 0 {
						return "unknown"
					}
					xs = append(xs, float64(f(p.CPU)-f(p.AloneCPU)))
				}
				slices.Sort(xs)
				return fmt.Sprintf("%+.0f µs", median(xs)/1e3)
			}
			fmt.Printf("%s: CPU per order over the writers alone (median of rounds): process %s, server %s\n", way.name,
				over(func(u bench.CPUUse) time.Duration { return u.Self }), over(func(u bench.CPUUse) time.Duration { return u.Server }))
		}
	}
	last := results[len(results)-1]
	if cal := last.Coalescing.Writer; cal.Questions > 0 {
		fmt.Printf("an order and its event alone (subtracted from each way, last run): %.2f statements, %s KB redo, %s KB binlog\n",
			cal.Questions, bench.KB(known(cal.RedoBytes)), binlogKB(known(cal.BinlogBytes)))
	}
	for _, way := range ways {
		s := way.pick(last)
		fmt.Printf("%s: statements per event by kind (last run): %s\n", way.name, bench.Breakdown(perEvent(s.Com, s.Committed)))
	}
	for _, way := range ways {
		if s := way.pick(last); s.Errors > 0 {
			fmt.Printf("%s: %d error-level records (last run), the first: %s\n", way.name, s.Errors, s.FirstError)
		}
	}
}

// steadyWay names a steady-state row's way of publishing.
func steadyWay(s bench.Steady) string {
	if s.Relay {
		return "binlog relay"
	}
	return publishing(s.Eager)
}

// micros prints a CPU time per order in microseconds, "-" if unknown.
func micros(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", float64(d)/1e3)
}
