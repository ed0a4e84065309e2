// Command outbox-bench measures the publisher against real servers and prints a table: for
// each claim mode and number of instances, the rate at which a backlog of pre-inserted events
// drains, the database statements per event, lock retries and errors surfaced; then the time
// from commit to send; then, with -namesrv, the same drain into a real RocketMQ broker.
//
//	bash scripts/mariadb.sh start && eval "$(bash scripts/rocketmq.sh start)"
//	go run ./cmd/outbox-bench -dsn "$(bash scripts/mariadb.sh dsn)" -namesrv "$OUTBOX_TEST_ROCKETMQ_NAMESRV"
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/bench"
)

func main() {
	dsn := flag.String("dsn", "root@tcp(127.0.0.1:3306)/outbox_test?parseTime=true", "MySQL DSN")
	namesrv := flag.String("namesrv", "", "RocketMQ name server; empty skips the end-to-end rows")
	topic := flag.String("topic", outbox.TopicDefault, "RocketMQ topic for the end-to-end rows")
	events := flag.Int("events", 200_000, "events per drain in batch mode (a sustained backlog: short drains are dominated by ramp-up)")
	perRowEvents := flag.Int("per-row-events", 10_000, "events per drain in per-row mode (it is slower)")
	instanceList := flag.String("instances", "1,3,8", "numbers of publisher instances")
	modeList := flag.String("modes", "per-row,batch", "claim modes to drain with")
	baselines := flag.Bool("baselines", true, "also drain batch mode with concurrent claims and with growing rows, to compare")
	e2eEvents := flag.Int("e2e-events", 100_000, "events per end-to-end drain into RocketMQ")
	slowEvents := flag.Int("slow-events", 20_000, "events per batch-mode drain with a sender that takes 1 ms per event (0 skips them)")
	latencyEvents := flag.Int("latency-events", 2000, "events per latency run (0 skips the latency runs)")
	rate := flag.Int("rate", 200, "commits per second in latency runs")
	batchSize := flag.Int("batch", 0, "BatchSize for batch mode (0: the default)")
	backlog := flag.Int("backlog", 0, "also drain a backlog of this many rows with one batch-mode instance, reporting the heap (e.g. 1000000)")
	flag.Parse()

	var ks []int
	for _, f := range strings.Split(*instanceList, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || k < 1 {
			log.Fatalf("-instances: %q is not a positive number", f)
		}
		ks = append(ks, k)
	}
	var modes []outbox.ClaimMode
	for _, f := range strings.Split(*modeList, ",") {
		switch strings.TrimSpace(f) {
		case outbox.ClaimPerRow.String():
			modes = append(modes, outbox.ClaimPerRow)
		case outbox.ClaimBatch.String():
			modes = append(modes, outbox.ClaimBatch)
		default:
			log.Fatalf("-modes: %q is neither %s nor %s", f, outbox.ClaimPerRow, outbox.ClaimBatch)
		}
	}
	ctx := context.Background()
	env := bench.Env{DSN: *dsn}
	host, _ := os.Hostname()
	fmt.Printf("outbox-bench on %s: %d CPUs, %s, %s\n\n", host, runtime.NumCPU(), runtime.Version(), serverVersion(env))

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "drain\tmode\tinstances\tevents\tseconds\tevents/s\tstatements/event\tredo KB/event\tlock retries\terrors\t")
	for _, mode := range modes {
		variants := []bench.Drain{{Mode: mode, Events: *events, BatchSize: *batchSize}}
		if mode == outbox.ClaimPerRow {
			variants = []bench.Drain{{Mode: mode, Events: *perRowEvents}}
		} else if *baselines {
			variants = append(variants,
				bench.Drain{Mode: mode, Events: *events, BatchSize: *batchSize, ConcurrentClaims: true},
				bench.Drain{Mode: mode, Events: *events, BatchSize: *batchSize, GrowingRows: true})
		}
		for _, d := range variants {
			for _, k := range ks {
				d.Instances, d.Sender = k, bench.NopSender
				drainRow(ctx, w, env, "no-op sender", d)
			}
		}
	}
	if *slowEvents > 0 {
		for _, k := range ks {
			drainRow(ctx, w, env, "1 ms sender", bench.Drain{Mode: outbox.ClaimBatch, Instances: k, Events: *slowEvents, Sender: bench.SlowSender(time.Millisecond)})
		}
	}
	if *namesrv != "" {
		for _, mode := range modes {
			n := *e2eEvents
			if mode == outbox.ClaimPerRow {
				n = *perRowEvents
			}
			for _, k := range []int{1, 3} {
				drainRow(ctx, w, env, "RocketMQ", bench.Drain{Mode: mode, Instances: k, Events: n, Sender: rocketmqSenders(*namesrv, *topic)})
			}
		}
	}
	_ = w.Flush()

	if *latencyEvents > 0 {
		latencyTable(ctx, env, *latencyEvents, *rate)
	}

	if *backlog > 0 {
		res, err := bench.Backlog{Events: *backlog}.Run(ctx, env)
		if err != nil {
			log.Fatalf("backlog: %v", err)
		}
		fmt.Printf("\nbacklog of %d rows, 1 batch-mode instance: drained in %.1f s (%.0f events/s); heap in use %.1f MiB at start, at most %.1f MiB while draining\n",
			*backlog, res.Elapsed.Seconds(), float64(*backlog)/res.Elapsed.Seconds(), mib(res.HeapStart), mib(res.HeapMax))
	}
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

func drainRow(ctx context.Context, w *tabwriter.Writer, env bench.Env, what string, d bench.Drain) {
	mode := d.Mode.String()
	switch {
	case d.ConcurrentClaims:
		mode += ", concurrent claims"
	case d.GrowingRows:
		mode += ", growing rows"
	}
	res, err := d.Run(ctx, env)
	if err != nil {
		log.Fatalf("drain %s %s x%d: %v", what, mode, d.Instances, err)
	}
	redo := "-"
	if res.RedoBytes >= 0 {
		redo = fmt.Sprintf("%.2f", float64(res.RedoBytes)/1024/float64(d.Events))
	}
	fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%.2f\t%.0f\t%.2f\t%s\t%d\t%d\t\n", what, mode, d.Instances, d.Events,
		res.Elapsed.Seconds(), res.EventsPerSecond(d.Events), float64(res.Statements)/float64(d.Events), redo, res.LockRetries, res.Errors)
}

func rocketmqSenders(namesrv, topic string) bench.SenderFactory {
	return func(i int) (outbox.Sender, func(), error) {
		s, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
			NameServers:  []string{namesrv},
			Topic:        topic,
			InstanceName: fmt.Sprintf("bench-%d-%d", i, time.Now().UnixNano()),
		})
		if err != nil {
			return nil, nil, err
		}
		return s, func() { _ = s.Close() }, nil
	}
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000)
}

func serverVersion(env bench.Env) string {
	v, err := bench.ServerVersion(context.Background(), env)
	if err != nil {
		return "server version unknown: " + err.Error()
	}
	return v
}

// latencyTable prints the commit-to-send table: polling alone, then the wake-up in each mode.
func latencyTable(ctx context.Context, env bench.Env, events, rate int) {
	fmt.Println()
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "commit to send\tmode\tinstances\tpoll\tevents\tp50\tp99\tmax\t")
	for _, l := range []bench.Latency{
		{Mode: outbox.ClaimPerRow, Instances: 3, Events: min(events, 200), Rate: rate, WakeUp: false, Poll: outbox.PollIntervalDefault},
		{Mode: outbox.ClaimPerRow, Instances: 3, Events: events, Rate: rate, WakeUp: true, Poll: outbox.PollIntervalDefault},
		{Mode: outbox.ClaimBatch, Instances: 3, Events: events, Rate: rate, WakeUp: true, Poll: outbox.PollIntervalDefault},
	} {
		res, err := l.Run(ctx, env)
		if err != nil {
			log.Fatalf("latency %s: %v", l.Mode, err)
		}
		how := "poll only"
		if l.WakeUp {
			how = "wake on commit"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\t\n", how, l.Mode, l.Instances, l.Poll, len(res.Sorted),
			ms(res.Quantile(0.5)), ms(res.Quantile(0.99)), ms(res.Quantile(1)))
	}
	_ = w.Flush()

}
