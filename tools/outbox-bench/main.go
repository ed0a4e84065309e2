// Command outbox-bench measures the publisher against real servers and prints a table: for
// each claim mode and number of instances, the rate at which a backlog of pre-inserted events
// drains, the database statements and redo log per event, lock retries and errors surfaced;
// in batch mode also the two baselines (concurrent claims, growing rows), a slow sender, and
// with -namesrv the same drain into a real RocketMQ broker. Every row runs once per round,
// -runs rounds, and reports its median rate and range. Then it prints the time from commit
// to send, with -purge-rows the time from commit to send while a purge of that many old
// SUCCESS rows runs beside a steady load and without it (with -purge-partitions also while
// the same rows leave a partitioned table by one partition drop), and with -backlog the heap
// while a large backlog drains.
//
//	bash scripts/mariadb.sh start && eval "$(bash scripts/rocketmq.sh start)"
//	go -C tools run ./outbox-bench -dsn "$(bash scripts/mariadb.sh dsn)" -namesrv "$OUTBOX_TEST_ROCKETMQ_NAMESRV"
//
// Three more sections, each skippable, measure the steady state rather than a backlog: the
// steady-state rows (-steady-rates, -steady-instances: writers committing one event per
// transaction at a fixed rate, and the publishing statements, claim rounds, redo and
// commit-to-send it costs), the write path (-writepath: orders/s of an order alone, with its
// event, and with each of the outbox table's secondary indexes dropped) and the service view
// (-service-writers: orders/s alone and with the publishers keeping up; -service-references
// adds three relays that are not the library's, reading only, one write per event and the
// lease protocol's two without the library, to read the library's cost against). Their
// statement and redo counts come from the server's global counters: run them against a
// server nothing else uses, with innodb_flush_log_at_trx_commit=1 as in production:
//
//	OUTBOX_MARIADB_DIR=/tmp/bench-mariadb OUTBOX_MARIADB_PORT=3427 \
//	  OUTBOX_MARIADB_ARGS=--innodb-flush-log-at-trx-commit=1 bash scripts/mariadb.sh start
//	go -C tools run ./outbox-bench -dsn 'root@tcp(127.0.0.1:3427)/outbox_test?parseTime=true'
//
// With -ordered-keys it drains a backlog over that many biz nos (event i of biz no i mod N)
// unordered and in key order, side by side; with -routed-topics and -namesrv also in key
// order through the RocketMQ sender, each biz no's events cycling over 1, 4, ... topics
// event by event (routed by event type), to measure what Dispatch's runs of one topic cost:
//
//	go -C tools run ./outbox-bench -dsn "$OUTBOX_TEST_MYSQL_DSN" -namesrv 127.0.0.1:9876 -modes= \
//	  -slow-events=0 -steady-rates= -writepath=false -service-writers=0 -latency-events=0 \
//	  -ordered-keys 1000 -ordered-events 20000 -instances 1,3 -routed-topics 1,4
//
// With -inbox it also measures the consumer's half beside a plain consumer, in the same run:
// statements, redo and messages/s per message of a handler that writes its effect row in a
// transaction of its own, and of the same handler through inbox.Handle, first on the
// database path alone (messages made beforehand), then, with -namesrv, through RocketMQ (a
// topic published beforehand, consumed by a plain push consumer and by inbox.NewConsumer).
// Its counts come from the same global counters: a private server, as above.
//
// With -console N it loads an outbox table of N events with a week's mix (history, the last
// hour's sends, dead letters, blocked keys, a backlog), an inbox's rejected messages and a
// relay's checkpoint row, and times what the operator console's overview and pages run on
// it, unordered and in key order, beside a hand-written console's statements that read the
// whole table; -console-explain also prints the plan of every statement the calls ran:
//
//	go -C tools run ./outbox-bench -modes= -slow-events=0 -steady-rates= -writepath=false \
//	  -service-writers=0 -latency-events=0 -console 1000000 -console-explain
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/tools/internal/bench"
)

func main() {
	// The RocketMQ client logs routine events to stderr at info by default; the bench's
	// output is its table, so the client's logs are discarded (a process-wide choice).
	outbox.RouteRocketMQClientLogs(nil)
	dsn := flag.String("dsn", "root@tcp(127.0.0.1:3306)/outbox_test?parseTime=true", "MySQL DSN")
	namesrv := flag.String("namesrv", "", "RocketMQ name server; empty skips the end-to-end rows")
	topic := flag.String("topic", "ORDER_EVENT_TOPIC", "RocketMQ topic for the end-to-end rows") // the store's Routes.Topic
	events := flag.Int("events", 200_000, "events per drain in batch mode (a sustained backlog: short drains are dominated by ramp-up)")
	perRowEvents := flag.Int("per-row-events", 10_000, "events per drain in per-row mode (it is slower)")
	instanceList := flag.String("instances", "1,3,8", "numbers of publisher instances")
	modeList := flag.String("modes", "per-row,batch", "claim modes to drain with (per-row, batch, and relay: the binlog relay, which needs the server's binlog on); empty skips the drain rows")
	baselines := flag.Bool("baselines", true, "also drain batch mode with concurrent claims and with growing rows, to compare")
	e2eEvents := flag.Int("e2e-events", 100_000, "events per end-to-end drain into RocketMQ")
	slowEvents := flag.Int("slow-events", 20_000, "events per batch-mode drain with a sender that takes 1 ms per event (0 skips them)")
	latencyEvents := flag.Int("latency-events", 2000, "events per latency run (0 skips the latency runs)")
	rate := flag.Int("rate", 200, "commits per second in latency runs")
	batchSize := flag.Int("batch", 0, "Tuning.BatchSize for batch mode (0: the default)")
	runs := flag.Int("runs", 3, "rounds over the drain rows; each row reports the median rate and the range")
	purgeRows := flag.Int("purge-rows", 0, "also measure commit-to-send while a purge of this many old SUCCESS rows runs beside the load, and without it (e.g. 1000000)")
	purgeBatch := flag.Int("purge-batch", 500, "rows per purge DELETE")
	purgePause := flag.Duration("purge-pause", 100*time.Millisecond, "pause between purge DELETEs")
	purgePartitions := flag.Bool("purge-partitions", false, "with -purge-rows: also remove the rows from a partitioned table (MySQLConfig.PartitionIDs) by dropping their partition, beside the same load, and run the load on a partitioned table without a purge")
	backlog := flag.Int("backlog", 0, "also drain a backlog of this many rows with one batch-mode instance, reporting the heap (e.g. 1000000)")
	steadyRates := flag.String("steady-rates", "100,1000,5000", "steady-state rows: commit rates (events/s, one event per transaction); empty skips them")
	steadyInstances := flag.String("steady-instances", "1,3", "steady-state rows: numbers of publisher instances")
	steadyRelay := flag.Bool("steady-relay", false, "steady-state rows: also publish through the binlog relay (the server needs its binlog on)")
	steadyDuration := flag.Duration("steady-duration", 10*time.Second, "steady-state rows: how long the writers commit")
	steadyWriters := flag.Int("steady-writers", 0, "steady-state rows: writer goroutines over all instances (0: 16)")
	orderedKeyList := flag.String("ordered-keys", "", "key-order rows: numbers of biz nos to spread -ordered-events over (e.g. 10000,1), each drained unordered and in key order; empty skips them")
	orderedEvents := flag.Int("ordered-events", 20000, "key-order rows: events per drain")
	routedTopics := flag.String("routed-topics", "", "key-order rows through RocketMQ (needs -namesrv): numbers of topics each biz no's events cycle over, event by event, routed by event type (e.g. 1,4); each drains -ordered-events over each of -ordered-keys in key order; empty skips them")
	routedBrokers := flag.String("routed-brokers", "127.0.0.1:10911", "key-order rows through RocketMQ: the brokers the topics are created on (four queues on each)")
	coalesce := flag.Duration("coalesce-delay", 0, "steady-state rows and service view: the coalescing publishers' Tuning.CoalesceDelay (0: the default)")
	writePath := flag.Bool("writepath", true, "measure the write path: orders/s of an order alone, with its event, and with each outbox index dropped")
	writePathWriters := flag.Int("writepath-writers", 8, "write path: writers")
	writePathDuration := flag.Duration("writepath-duration", 4*time.Second, "write path: how long each variant commits, per round")
	writePathRounds := flag.Int("writepath-rounds", 2, "write path: rounds over all variants; each reports its median")
	writePathPrefill := flag.Int("writepath-prefill", 0, "write path: SUCCESS rows each outbox table holds before the writers start (the history kept until a purge; e.g. 500000)")
	serviceWriters := flag.Int("service-writers", 8, "service view: writers committing an order and its event per transaction (0 skips it)")
	serviceInstances := flag.Int("service-instances", 3, "service view: publisher instances (the writers are spread over them)")
	serviceRuns := flag.Int("service-runs", 3, "service view: rounds (alone, then each way of publishing in each); the table shows each and the medians")
	serviceRelay := flag.Bool("service-relay", false, "service view: also run the binlog relay (a relay in each instance, the publishers standing by) and the reference that reads the binlog and writes nothing; the server needs its binlog on")
	serviceReferences := flag.Bool("service-references", false, "service view: also run the reference relays (reading only; one write per event; two, as the library's lease protocol, without the library), to read the library's cost against")
	serviceWays := flag.String("service-ways", "", "service view: only these ways of publishing, comma-separated ("+strings.Join(bench.ServiceWays, ", ")+"; the reference relays need -service-references, the binlog ones -service-relay); empty: all asked for")
	servicePaired := flag.Bool("service-paired", false, "service view: measure the writers alone again just before each way, and cost each way against that (the table then shows it)")
	serviceDuration := flag.Duration("service-duration", 10*time.Second, "service view: how long the writers commit, alone and then with the publishers")
	inboxRows := flag.Bool("inbox", false, "measure the inbox beside a plain consumer: inbox.Handle on messages made beforehand, and with -namesrv through RocketMQ")
	inboxMessages := flag.Int("inbox-messages", 20000, "inbox: messages per run (each level; through RocketMQ, the topic's)")
	inboxWorkers := flag.Int("inbox-workers", 8, "inbox: goroutines handling messages (through RocketMQ, the push consumer's consume goroutines)")
	inboxRuns := flag.Int("inbox-runs", 3, "inbox: rounds, each running every way of consuming once; the table shows the medians")
	inboxBroker := flag.String("inbox-broker", "127.0.0.1:10911", "inbox: the RocketMQ broker the topic of the RocketMQ rows is created on")
	rolling := flag.Int("rolling", 0, "rolling deploy: publishers under a steady load restarted one after the other, by Close and by kill (no Close: the lease expires), beside a steady run; 0 skips it (e.g. 3)")
	rollingRate := flag.Int("rolling-rate", 200, "rolling deploy: commits per second")
	rollingSettle := flag.Duration("rolling-settle", 3*time.Second, "rolling deploy: steady load before the first restart, between restarts and after the last")
	rollingLease := flag.Duration("rolling-lease", 3*time.Second, "rolling deploy: the publishers' Tuning.Lease (the reclaim interval is a quarter of it)")
	console := flag.Int("console", 0, "console overview: load an outbox table of this many events (e.g. 1000000) and time what the console's overview and pages run on it, beside a hand-written console's statements; 0 skips it")
	consoleRounds := flag.Int("console-rounds", 50, "console overview: rounds, each running every call once")
	consoleExplain := flag.Bool("console-explain", false, "console overview: also print the plan (ANALYZE) of every statement the console's calls run, on the loaded table")
	consoleKeep := flag.Bool("console-keep", false, "console overview: leave the loaded tables in place (their names are printed) to read plans by hand; drop them when done")
	flag.Parse()
	if *runs < 1 {
		log.Fatalf("-runs must be at least 1, got %d", *runs)
	}

	ks := positives("-instances", *instanceList)
	var orderedKeys []int
	if strings.TrimSpace(*orderedKeyList) != "" {
		orderedKeys = positives("-ordered-keys", *orderedKeyList)
	}
	var rates, steadyKs []int
	if strings.TrimSpace(*steadyRates) != "" {
		rates = positives("-steady-rates", *steadyRates)
		steadyKs = positives("-steady-instances", *steadyInstances)
	}
	var modes []bool // per row (Tuning.ClaimPerRow), or batch
	relayDrain := false
	if strings.TrimSpace(*modeList) != "" {
		for _, f := range strings.Split(*modeList, ",") {
			switch strings.TrimSpace(f) {
			case bench.ModeName(true):
				modes = append(modes, true)
			case bench.ModeName(false):
				modes = append(modes, false)
			case "relay":
				relayDrain = true
			default:
				log.Fatalf("-modes: %q is none of %s, %s and relay", f, bench.ModeName(true), bench.ModeName(false))
			}
		}
	}
	ctx := context.Background()
	env := bench.Env{DSN: *dsn}
	host, _ := os.Hostname()
	fmt.Printf("outbox-bench on %s: %d CPUs, %s, %s\n\n", host, runtime.NumCPU(), runtime.Version(), serverVersion(env))

	var rows []drainRow
	for _, perRow := range modes {
		variants := []bench.Drain{{Events: *events, BatchSize: *batchSize}}
		if perRow {
			variants = []bench.Drain{{PerRow: true, Events: *perRowEvents}}
		} else if *baselines {
			variants = append(variants,
				bench.Drain{Events: *events, BatchSize: *batchSize, ConcurrentClaims: true},
				bench.Drain{Events: *events, BatchSize: *batchSize, GrowingRows: true})
		}
		for _, d := range variants {
			for _, k := range ks {
				d.Instances, d.Sender = k, bench.NopSender
				rows = append(rows, drainRow{what: "no-op sender", d: d})
			}
		}
	}
	if relayDrain {
		// The binlog relay in each instance: its sweep drains a backlog committed before it
		// started.
		for _, k := range ks {
			rows = append(rows, drainRow{what: "no-op sender", d: bench.Drain{Relay: true, Instances: k, Events: *events, Sender: bench.NopSender}})
		}
	}
	for _, keys := range orderedKeys {
		// The same events over the same keys, unordered and in key order, side by side.
		for _, o := range []outbox.Ordering{outbox.Unordered, outbox.KeyOrder} {
			for _, k := range ks {
				rows = append(rows, drainRow{what: "no-op sender", d: bench.Drain{Instances: k,
					Events: *orderedEvents, Keys: keys, Ordering: o, Sender: bench.NopSender}})
			}
		}
	}
	if strings.TrimSpace(*routedTopics) != "" {
		if *namesrv == "" {
			log.Fatal("-routed-topics needs -namesrv")
		}
		if len(orderedKeys) == 0 {
			log.Fatal("-routed-topics needs -ordered-keys")
		}
		counts := positives("-routed-topics", *routedTopics)
		names := make([]string, slices.Max(counts))
		for i := range names {
			names[i] = fmt.Sprintf("OUTBOX_BENCH_ROUTED_%d", i)
		}
		if err := bench.CreateTopics(ctx, []string{*namesrv}, words(*routedBrokers), names...); err != nil {
			log.Fatalf("routed topics: %v", err)
		}
		// The rows of each number of keys and instances side by side, one number of topics
		// after the other.
		for _, keys := range orderedKeys {
			for _, k := range ks {
				for _, n := range counts {
					rows = append(rows, drainRow{what: "RocketMQ", d: bench.Drain{Instances: k, Events: *orderedEvents, Keys: keys,
						Ordering: outbox.KeyOrder, Sender: rocketmqSenders(*namesrv), Topics: names[:n]}})
				}
			}
		}
	}
	if *slowEvents > 0 {
		for _, k := range ks {
			rows = append(rows, drainRow{what: "1 ms sender", d: bench.Drain{Instances: k,
				Events: *slowEvents, Sender: bench.SlowSender(time.Millisecond)}})
		}
	}
	if *namesrv != "" {
		for _, perRow := range modes {
			n := *e2eEvents
			if perRow {
				n = *perRowEvents
			}
			for _, k := range []int{1, 3} {
				rows = append(rows, drainRow{what: "RocketMQ", d: bench.Drain{PerRow: perRow, Instances: k, Events: n,
					Sender: rocketmqSenders(*namesrv), Topic: *topic}})
			}
		}
	}
	// Round after round over all rows, so that whatever else the machine is doing spreads
	// over every row alike.
	for run := range *runs {
		for i := range rows {
			res, err := rows[i].d.Run(ctx, env)
			if err != nil {
				log.Fatalf("drain %s %s x%d (run %d): %v", rows[i].what, rows[i].mode(), rows[i].d.Instances, run+1, err)
			}
			rows[i].results = append(rows[i].results, res)
		}
	}
	if len(rows) > 0 {
		w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(w, "drain\tmode\tinstances\tevents\tevents/s (median of %d)\tlowest\thighest\tstatements/event\tredo KB/event\tlock retries\terrors\t\n", *runs)
		for _, r := range rows {
			r.print(w)
		}
		_ = w.Flush()
	}

	if len(rates) > 0 {
		steadyTable(ctx, env, rates, steadyKs, *steadyDuration, *steadyWriters, *coalesce, *steadyRelay)
	}
	if *writePath {
		writePathTable(ctx, env, *writePathWriters, *writePathDuration, max(*writePathRounds, 1), *writePathPrefill)
	}
	if *serviceWriters > 0 {
		serviceTable(ctx, env, *serviceWriters, *serviceInstances, *serviceDuration, *coalesce, max(*serviceRuns, 1), *serviceReferences, *serviceRelay, words(*serviceWays), *servicePaired)
	}

	if *inboxRows {
		if *inboxMessages < 1 || *inboxWorkers < 1 {
			log.Fatalf("-inbox-messages and -inbox-workers must be positive, got %d and %d", *inboxMessages, *inboxWorkers)
		}
		inboxTable(ctx, env, *inboxMessages, *inboxWorkers, max(*inboxRuns, 1), *namesrv, *inboxBroker)
	}

	if *purgeRows > 0 {
		purgeTable(ctx, env, *purgeRows, *purgeBatch, *purgePause, max(*latencyEvents, 1), *rate, *purgePartitions)
	}
	if *latencyEvents > 0 {
		latencyTable(ctx, env, *latencyEvents, *rate)
	}

	if *rolling > 0 {
		rollingTable(ctx, env, bench.Rolling{Instances: *rolling, Rate: *rollingRate, Settle: *rollingSettle, Lease: *rollingLease})
	}

	if *console > 0 {
		consoleTable(ctx, env, *console, max(*consoleRounds, 1), *consoleExplain, *consoleKeep)
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

// positives parses a comma-separated list of positive numbers, or exits naming the flag.
func positives(flagName, list string) []int {
	var out []int
	for _, f := range strings.Split(list, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || k < 1 {
			log.Fatalf("%s: %q is not a positive number", flagName, f)
		}
		out = append(out, k)
	}
	return out
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// drainRow is one row of the drain table: a drain, run once per round.
type drainRow struct {
	what    string
	d       bench.Drain
	results []bench.DrainResult
}

func (r drainRow) mode() string {
	if r.d.Relay {
		return "binlog relay"
	}
	m := bench.ModeName(r.d.PerRow)
	switch {
	case r.d.ConcurrentClaims:
		m += ", concurrent claims"
	case r.d.GrowingRows:
		m += ", growing rows"
	}
	if r.d.Keys > 0 {
		m += fmt.Sprintf(", %d keys", r.d.Keys)
		if r.d.Keys == 1 {
			m = bench.ModeName(r.d.PerRow) + ", one hot key"
		}
	}
	if r.d.Ordering != outbox.Unordered {
		m += ", key order"
	}
	switch n := len(r.d.Topics); {
	case n == 1:
		m += ", 1 topic"
	case n > 1:
		m += fmt.Sprintf(", %d topics", n)
	}
	return m
}

// print writes the row: the median, lowest and highest rate over the runs, and the other
// columns summed over the runs (statements, redo, retries, errors).
func (r drainRow) print(w io.Writer) {
	rates := make([]float64, len(r.results))
	var stmts, redo, retries, errs int64
	for i, res := range r.results {
		rates[i] = res.EventsPerSecond(r.d.Events)
		stmts += res.Statements
		if redo >= 0 && res.RedoBytes >= 0 {
			redo += res.RedoBytes
		} else {
			redo = -1
		}
		retries += res.LockRetries
		errs += res.Errors
	}
	slices.Sort(rates)
	events := float64(r.d.Events * len(r.results))
	redoKB := "-"
	if redo >= 0 {
		redoKB = fmt.Sprintf("%.2f", float64(redo)/1024/events)
	}
	fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%.0f\t%.0f\t%.0f\t%.2f\t%s\t%d\t%d\t\n", r.what, r.mode(), r.d.Instances, r.d.Events,
		median(rates), rates[0], rates[len(rates)-1], float64(stmts)/events, redoKB, retries, errs)
}

// median returns the middle of sorted xs (the mean of the two middle ones for an even count).
func median(xs []float64) float64 {
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// rocketmqSenders makes each instance a RocketMQ sender of its own, which its publisher's
// Close closes.
func rocketmqSenders(namesrv string) bench.SenderFactory {
	return func(i int) (outbox.Sender, error) {
		return outbox.NewRocketMQSender(outbox.RocketMQConfig{
			NameServers:  []string{namesrv},
			InstanceName: fmt.Sprintf("bench-%d-%d", i, time.Now().UnixNano()),
		})
	}
}

// defaultPoll is the latency runs' poll interval: the default Config.PollInterval.
const defaultPoll = 5 * time.Second

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
		{PerRow: true, Instances: 3, Events: min(events, 200), Rate: rate, WakeUp: false, Poll: defaultPoll},
		{PerRow: true, Instances: 3, Events: events, Rate: rate, WakeUp: true, Poll: defaultPoll},
		{Instances: 3, Events: events, Rate: rate, WakeUp: true, Poll: defaultPoll},
	} {
		res, err := l.Run(ctx, env)
		if err != nil {
			log.Fatalf("latency %s: %v", bench.ModeName(l.PerRow), err)
		}
		how := "poll only"
		if l.WakeUp {
			how = "wake on commit"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\t\n", how, bench.ModeName(l.PerRow), l.Instances, l.Poll, len(res.Sorted),
			ms(res.Quantile(0.5)), ms(res.Quantile(0.99)), ms(res.Quantile(1)))
	}
	_ = w.Flush()

}

// purgeTable prints commit-to-send and the writers' throughput under a steady load while a
// purge of rows old SUCCESS rows runs beside it, in batched DELETEs, and then under the
// same load (as many events, at the same rate) without the purge; with partitions, also
// while the same rows leave a partitioned table by the drop of their partition, and on a
// partitioned table without a purge.
func purgeTable(ctx context.Context, env bench.Env, rows, batch int, pause time.Duration, events, rate int, partitions bool) {
	fmt.Println()
	base := bench.Latency{Instances: 3, Events: events, Rate: rate, WakeUp: true, Poll: defaultPoll}
	with := base
	with.PurgeRows, with.PurgeBatch, with.PurgePause = rows, batch, pause
	withRes, err := with.Run(ctx, env)
	if err != nil {
		log.Fatalf("latency beside a purge: %v", err)
	}
	base.Events = len(withRes.Sorted)
	type leg struct {
		name string
		res  bench.LatencyResult
	}
	legs := []leg{{fmt.Sprintf("beside a batched DELETE (%d/%s)", batch, pause), withRes}}
	if partitions {
		dropped := with
		dropped.Partitioned, dropped.Events = true, base.Events
		res, err := dropped.Run(ctx, env)
		if err != nil {
			log.Fatalf("latency beside a partition drop: %v", err)
		}
		legs = append(legs, leg{"beside a partition drop", res})
	}
	baseRes, err := base.Run(ctx, env)
	if err != nil {
		log.Fatalf("latency without a purge: %v", err)
	}
	legs = append(legs, leg{"no purge", baseRes})
	if partitions {
		plain := base
		plain.Partitioned = true
		res, err := plain.Run(ctx, env)
		if err != nil {
			log.Fatalf("latency on a partitioned table: %v", err)
		}
		legs = append(legs, leg{"no purge, partitioned", res})
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "commit to send\tmode\tinstances\trate/s\tevents\tcommits/s\tcommit p99\tcommit max\tp50\tp99\tmax\tremoved\ttook\t")
	for _, r := range legs {
		purged, took := "-", "-"
		if r.res.PurgeElapsed > 0 {
			purged, took = strconv.FormatInt(r.res.Purged, 10), r.res.PurgeElapsed.Round(time.Millisecond).String()
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%.1f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.name, bench.ModeName(base.PerRow), base.Instances, rate, len(r.res.Sorted),
			r.res.CommitRate(), ms(r.res.CommitQuantile(0.99)), ms(r.res.CommitQuantile(1)),
			ms(r.res.Quantile(0.5)), ms(r.res.Quantile(0.99)), ms(r.res.Quantile(1)), purged, took)
	}
	_ = w.Flush()
}

// words splits a comma-separated list into its trimmed, non-empty words.
func words(list string) []string {
	var out []string
	for _, f := range strings.Split(list, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// rollingTable prints the longest pauses of publishing while r's publishers are restarted
// one after the other, by Close and by kill, beside a steady run of the same load.
func rollingTable(ctx context.Context, env bench.Env, r bench.Rolling) {
	fmt.Println()
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "publishers\tinstances\tcommits/s\tlease\trestarts\tevents\tlongest gap between sends\tcommit to send p50\tp99\tmax\tsent twice\tleft SENDING by Close\twarn+ records\t")
	for _, k := range []bench.RestartKind{bench.NoRestart, bench.RestartByClose, bench.RestartByKill} {
		r.Restart = k
		res, err := r.Run(ctx, env)
		if err != nil {
			log.Fatalf("%s: %v", k, err)
		}
		fmt.Fprintf(w, "%s\t%d\t%.0f\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t\n", k, r.Instances, float64(res.Events)/res.LoadElapsed.Seconds(), r.Lease, res.Restarts, res.Events,
			ms(res.MaxGap), ms(res.Quantile(0.5)), ms(res.Quantile(0.99)), ms(res.Quantile(1)), res.Resent, res.LeftSending, res.Loud)
		if res.FirstLoud != "" {
			defer fmt.Printf("%s: first warn+ record: %s\n", k, res.FirstLoud)
		}
	}
	_ = w.Flush()
}
