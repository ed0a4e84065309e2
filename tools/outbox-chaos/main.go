// Command outbox-chaos runs the outbox and the inbox under faults and checks their
// guarantee: concurrent writers commit events while several publisher processes (this
// binary, `outbox-chaos publish`) send them to a real RocketMQ broker, a real push consumer
// records every delivery, and inbox consumer processes (`outbox-chaos consume`, one consumer
// group, package inbox) write one effect row per event in the inbox's transaction;
// meanwhile, at random (seeded), it SIGKILLs a publisher or a consumer and starts a new
// one, restarts a broker, and restarts the database. It stops by itself, waits for the
// outbox to drain and the effects to catch up, and prints: events committed, delivered,
// lost, duplicates (each explained by the publishers' outcome logs), dead letters, rows left
// SENDING, each committed event's effect rows (lost: none, doubled: more than one), the
// duplicates the inbox suppressed, and the time to recover after each fault. It exits
// non-zero if anything was lost, dead-lettered or left SENDING, a duplicate has no
// explanation, or an effect was lost, doubled or rejected.
//
// By default it runs its own MariaDB and RocketMQ on ports of their own, through
// scripts/mariadb.sh and scripts/rocketmq.sh, and stops them at the end; -external uses
// services you run, with a restart command for each.
//
// With -relay, each publisher process also runs a binlog relay (package relay) beside its
// publisher, on the run's own MariaDB with the binlog on; the publishers stand by while a
// relay leads (MySQLConfig.RelayTable). The faults then are: SIGKILL of the relay leader's
// process or of a consumer, a broker restart, a database restart and a database crash (the
// relays must elect a leader again and resume), and a binlog purge while the leader is
// down (the next leader cannot resume from its checkpoint: it sweeps the table). The
// verdict is the same; a duplicate a relay resent from its checkpoint or its sweep after a
// failover (same eventId) is explained, and counted in a row of its own, as are the rows
// the relays and the publishers sent and the relays' terms of leadership.
//
//	bash scripts/chaos.sh -short     # CI: a few thousand events, one fault of each kind
//	bash scripts/chaos.sh            # 100,000 events, 10 minutes of random faults
//	bash scripts/chaos.sh -short -relay   # CI: the same, in relay mode
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/relay"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "publish" {
		os.Exit(runPublisher(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "consume" {
		os.Exit(runConsumer(os.Args[2:]))
	}
	// The run's consumer would log the RocketMQ client's routine events to stderr at info;
	// the run reports what it received itself, so the client's logs are discarded here.
	// (Each publisher process routes its own into its log file: runPublisher calls it again.)
	outbox.RouteRocketMQClientLogs(nil)
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "run" {
		args = args[1:]
	}
	os.Exit(runChaos(args))
}

// options are the chaos run's flags.
type options struct {
	short                       bool
	events, writers, publishers int
	consumers, brokers, payload int
	consumerHold                time.Duration
	seed                        int64
	duration, deadline          time.Duration
	drainTimeout, recoverWait   time.Duration
	gapMin, gapMax              time.Duration
	outageMin, outageMax        time.Duration
	lease, reclaim, poll        time.Duration
	faults, killWhen, claimMode string
	keep                        bool
	workdir                     string
	relay                       bool
	relayFallback               time.Duration

	// managed services
	scripts, dbDir, mqDir              string
	dbPort, namesrvPort, brokerPort    int
	topic                              string
	external                           bool
	dsn, namesrv, dbRestart, brokerCmd string
	dbCrash                            string
}

func parseOptions(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("outbox-chaos", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: outbox-chaos [run] [flags]   (outbox-chaos publish|consume ... are the processes it starts)\n\n")
		fs.PrintDefaults()
	}
	fs.BoolVar(&o.short, "short", false, "the CI form: 3000 events over 2m, exactly one fault of each kind, short outages (flags given explicitly still win)")
	fs.IntVar(&o.consumers, "consumers", 2, "inbox consumer processes (one consumer group), each writing an effect row per event")
	fs.DurationVar(&o.consumerHold, "consumer-hold", 50*time.Millisecond, "how long a consumer's handler works after writing its effect, before the commit (a kill then catches effects written, not committed)")
	fs.IntVar(&o.events, "events", 100_000, "events to commit (at least; writers go on at the same pace until the faults end)")
	fs.IntVar(&o.writers, "writers", 4, "concurrent writers, each committing one event per transaction")
	fs.IntVar(&o.publishers, "publishers", 4, "publisher processes")
	fs.IntVar(&o.brokers, "brokers", 1, "brokers of the managed RocketMQ (broker-a, broker-b, …); a broker fault restarts one of them")
	fs.IntVar(&o.payload, "payload", 256, "payload bytes per event")
	fs.Int64Var(&o.seed, "seed", 0, "seed of the fault schedule (0: from the clock; the header prints it)")
	fs.DurationVar(&o.duration, "duration", 10*time.Minute, "how long writes are spread over and faults are injected")
	fs.DurationVar(&o.deadline, "deadline", 0, "hard deadline for the whole run (0: duration + drain-timeout + 15m)")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", 5*time.Minute, "after the faults, how long to wait for the outbox to drain")
	fs.DurationVar(&o.recoverWait, "recover-timeout", 3*time.Minute, "after a fault, how long to wait for a delivery before the next fault")
	fs.DurationVar(&o.gapMin, "gap-min", 15*time.Second, "shortest pause before a fault")
	fs.DurationVar(&o.gapMax, "gap-max", 60*time.Second, "longest pause before a fault")
	fs.DurationVar(&o.outageMin, "outage-min", 5*time.Second, "shortest time a service stays stopped")
	fs.DurationVar(&o.outageMax, "outage-max", 30*time.Second, "longest time a service stays stopped")
	fs.DurationVar(&o.lease, "lease", 30*time.Second, "publishers' Tuning.Lease (short, so that a killed publisher's rows come back quickly)")
	fs.DurationVar(&o.reclaim, "reclaim", 5*time.Second, "publishers' Tuning.ReclaimInterval")
	fs.StringVar(&o.claimMode, "claim-mode", claimBatch, "publishers' claims: batch, or per-row (Tuning.ClaimPerRow)")
	fs.DurationVar(&o.poll, "poll", 0, "publishers' Config.PollInterval (0: the library's default)")
	fs.StringVar(&o.faults, "faults", "", "kinds of fault to inject: kill (a publisher), kill-leader (the relay leader's process), kill-consumer, broker, db (a restart), db-crash, purge (the binlog, while the relay leader is down) (default: "+
		strings.Join(pollingFaults, ",")+"; with -relay: "+strings.Join(relayFaults, ",")+")")
	fs.BoolVar(&o.relay, "relay", false, "relay mode: each publisher process also runs a binlog relay, the database runs with the binlog on, and the faults are the relay's")
	fs.DurationVar(&o.relayFallback, "relay-fallback", 30*time.Second, "relay mode: the relays' FallbackAfter (how old the leader's heartbeat is before the publishers take over)")
	fs.StringVar(&o.killWhen, "kill-when", "in-flight", "in-flight: SIGKILL the chosen publisher as soon as it holds claimed rows, the chosen consumer as soon as it is in a handler (waiting up to 10 s; at the default poll a publisher is idle most of the time); any: at once")
	fs.BoolVar(&o.keep, "keep", false, "keep the services running and the table at the end")
	fs.StringVar(&o.workdir, "workdir", "/tmp/outbox-chaos-run", "where each run's logs go (a directory per run)")
	fs.StringVar(&o.scripts, "scripts", "scripts", "the repository's scripts directory")
	fs.StringVar(&o.dbDir, "mariadb-dir", "/tmp/outbox-chaos-mariadb", "managed MariaDB's directory (OUTBOX_MARIADB_DIR)")
	fs.IntVar(&o.dbPort, "mariadb-port", 3307, "managed MariaDB's port")
	fs.StringVar(&o.mqDir, "rocketmq-dir", "/tmp/outbox-chaos-rocketmq", "managed RocketMQ's directory (OUTBOX_ROCKETMQ_DIR)")
	fs.IntVar(&o.namesrvPort, "namesrv-port", 9886, "managed RocketMQ name server's port")
	fs.IntVar(&o.brokerPort, "broker-port", 10941, "managed RocketMQ broker's port (it also uses port-2 and port+1)")
	fs.BoolVar(&o.external, "external", false, "use services you run: -dsn, -namesrv, -topic, and -db-restart / -broker-restart commands")
	fs.StringVar(&o.dsn, "dsn", "", "external: MySQL DSN")
	fs.StringVar(&o.namesrv, "namesrv", "", "external: RocketMQ name server(s), comma separated")
	fs.StringVar(&o.topic, "topic", "", "external: an existing topic (managed: a new one per run)")
	fs.StringVar(&o.dbRestart, "db-restart", "", "external: bash command that restarts the database and returns once it answers")
	fs.StringVar(&o.dbCrash, "db-crash", "", "external: bash command that kills the database server (SIGKILL), starts it again and returns once it answers")
	fs.StringVar(&o.brokerCmd, "broker-restart", "", "external: bash command that restarts the broker named {broker} and returns once it serves")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if o.short {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		def := func(name string, apply func()) {
			if !set[name] {
				apply()
			}
		}
		def("events", func() { o.events = 3000 })
		def("duration", func() { o.duration = 2 * time.Minute })
		def("gap-min", func() { o.gapMin = 5 * time.Second })
		def("gap-max", func() { o.gapMax = 15 * time.Second })
		def("outage-min", func() { o.outageMin = 5 * time.Second })
		def("outage-max", func() { o.outageMax = 10 * time.Second })
		def("drain-timeout", func() { o.drainTimeout = 4 * time.Minute })
	}
	if o.deadline == 0 {
		o.deadline = o.duration + o.drainTimeout + 15*time.Minute
	}
	switch {
	case o.events < 1 || o.writers < 1 || o.publishers < 1 || o.consumers < 1 || o.brokers < 1:
		return nil, errors.New("-events, -writers, -publishers, -consumers and -brokers must be at least 1")
	case o.consumerHold < 0:
		return nil, errors.New("-consumer-hold must not be negative")
	case o.gapMin <= 0 || o.gapMax < o.gapMin || o.outageMin < 0 || o.outageMax < o.outageMin:
		return nil, errors.New("-gap-min/-gap-max and -outage-min/-outage-max must be ordered ranges, gaps positive")
	case o.external && (o.dsn == "" || o.namesrv == "" || o.topic == ""):
		return nil, errors.New("-external needs -dsn, -namesrv and -topic")
	case o.killWhen != "in-flight" && o.killWhen != "any":
		return nil, fmt.Errorf("-kill-when: %q is neither in-flight nor any", o.killWhen)
	case !o.external && (o.dsn != "" || o.namesrv != ""):
		return nil, errors.New("-dsn and -namesrv are for -external; the managed services pick their own")
	}
	if _, err := claimMode(o.claimMode); err != nil {
		return nil, fmt.Errorf("-claim-mode: %w", err)
	}
	if o.faults == "" {
		o.faults = strings.Join(map[bool][]string{false: pollingFaults, true: relayFaults}[o.relay], ",")
	}
	for _, k := range strings.Split(o.faults, ",") {
		if !slices.Contains(faultKinds, k) {
			return nil, fmt.Errorf("-faults: unknown kind %q (%s)", k, strings.Join(faultKinds, ", "))
		}
		if !o.relay && (k == faultKillLeader || k == faultPurge) {
			return nil, fmt.Errorf("-faults: %s needs -relay", k)
		}
	}
	if o.seed == 0 {
		o.seed = time.Now().UnixNano() % 1_000_000
	}
	return o, nil
}

// chaos is one run.
type chaos struct {
	o       *options
	logf    func(format string, args ...any)
	svc     services
	store   *outbox.MySQLStore
	db      *sql.DB
	table   string
	relayCP string // relay mode: the relays' checkpoint table
	effects string // the effects table
	inbox   string // the inbox table (and inbox + "_rejected")
	group   string // the inbox consumers' group
	tag     string
	rec     *recorder
	pubs    *procs
	cons    *procs
	brokers []string

	mu     sync.Mutex
	faults []fault
	broken []string // problems that fail the run on their own
}

func runChaos(args []string) int {
	o, err := parseOptions(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "outbox-chaos:", err)
		return 2
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	stamp := time.Now().Format("20060102150405")
	dir := filepath.Join(o.workdir, stamp)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		logf("%v", err)
		return 2
	}
	c := &chaos{o: o, logf: logf, table: "chaos_" + stamp, effects: "chaos_" + stamp + "_effects",
		inbox: "chaos_" + stamp + "_inbox", group: "outbox_chaos_" + stamp + "_inbox", tag: "c" + stamp}
	if o.relay {
		c.relayCP = "chaos_" + stamp + "_relay"
	}
	if o.external {
		c.svc = &external{sh: shell{logPath: filepath.Join(dir, "services.log")}, dsn: o.dsn, namesrv: o.namesrv,
			dbRestart: o.dbRestart, brokerRestart: o.brokerCmd, dbCrash: o.dbCrash}
	} else {
		if _, err := os.Stat(filepath.Join(o.scripts, "rocketmq.sh")); err != nil {
			logf("no %s/rocketmq.sh: run from the repository's root (or pass -scripts): %v", o.scripts, err)
			return 2
		}
		o.topic = "OUTBOX_CHAOS_" + stamp
		c.svc = newManaged(o, filepath.Join(dir, "services.log"))
	}
	for i := range o.brokers {
		c.brokers = append(c.brokers, "broker-"+string(rune('a'+i)))
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.deadline)
	defer cancel()

	mode := ""
	if o.relay {
		mode = fmt.Sprintf(", each with a binlog relay (FallbackAfter %s)", o.relayFallback)
	}
	fmt.Printf("outbox chaos run %s, seed %d: %d events by %d writers over %s, %d publisher processes (%s claims)%s, %d inbox consumer processes, %d broker(s), faults %s%s\n",
		stamp, o.seed, o.events, o.writers, o.duration, o.publishers, o.claimMode, mode, o.consumers, o.brokers, o.faults,
		map[bool]string{true: " (short: one fault of each kind)"}[o.short])
	logf("logs in %s", dir)
	code := c.run(ctx, dir)
	if !o.keep {
		tctx, tcancel := context.WithTimeout(context.Background(), 5*time.Minute)
		if c.db != nil {
			for _, t := range []string{c.table, c.effects, c.inbox, c.inbox + "_rejected", c.relayCP} {
				if t == "" {
					continue
				}
				if _, err := c.db.ExecContext(tctx, "DROP TABLE IF EXISTS `"+t+"`"); err != nil {
					logf("drop table %s: %v", t, err)
				}
			}
		}
		logf("stopping the services")
		if err := c.svc.teardown(tctx); err != nil {
			logf("teardown: %v", err)
		}
		tcancel()
	}
	if c.db != nil {
		_ = c.db.Close()
	}
	return code
}

func (c *chaos) run(ctx context.Context, dir string) int {
	o := c.o
	logf := c.logf
	logf("starting the services")
	dsn, namesrv, err := c.svc.setup(ctx)
	if err != nil {
		logf("services: %v", err)
		return 2
	}
	fmt.Printf("services: MariaDB %s; RocketMQ name server %s, topic %s; tables %s, %s (effects), %s (inbox); inbox group %s; logs in %s\n",
		dsn, namesrv, o.topic, c.table, c.effects, c.inbox, c.group, dir)
	c.db, err = sql.Open("mysql", dsn)
	if err != nil {
		logf("%v", err)
		return 2
	}
	c.db.SetMaxOpenConns(o.writers + 4)
	c.store, err = outbox.NewMySQLStore(c.db, outbox.MySQLConfig{Table: c.table, RelayTable: c.relayCP, Routes: outbox.Routes{Topic: o.topic}})
	if err == nil {
		err = c.store.CreateSchema(ctx)
	}
	if err == nil && o.relay {
		err = relay.CreateSchema(ctx, c.db, relay.Config{Table: c.table, CheckpointTable: c.relayCP})
	}
	if err == nil {
		err = c.createInboxSchema(ctx)
	}
	if err != nil {
		logf("schema: %v", err)
		return 2
	}

	c.rec, err = startRecorder(strings.Split(namesrv, ","), o.topic, "outbox_chaos_"+strings.TrimPrefix(c.tag, "c"), c.tag)
	if err != nil {
		logf("consumer: %v", err)
		return 2
	}
	exe, err := os.Executable()
	if err != nil {
		logf("%v", err)
		return 2
	}
	c.pubs = &procs{exe: exe, dir: dir, logf: logf, kind: "publisher", prefix: "p", args: func(name string) []string {
		po := publishOptions{dsn: dsn, table: c.table, namesrv: namesrv, topic: o.topic, instance: name, dir: dir,
			claimMode: o.claimMode, lease: o.lease, reclaim: o.reclaim, poll: o.poll}
		if o.relay {
			n, _ := strconv.Atoi(strings.TrimPrefix(name, "p"))
			po.relayTable, po.serverID, po.fallback = c.relayCP, relayServerID(n), o.relayFallback
		}
		return po.args()
	}}
	c.cons = &procs{exe: exe, dir: dir, logf: logf, kind: "consumer", prefix: "c", args: func(name string) []string {
		return consumeOptions{dsn: dsn, namesrv: namesrv, topic: o.topic, group: c.group, inboxTable: c.inbox,
			effects: c.effects, tag: c.tag, instance: name, dir: dir, hold: o.consumerHold}.args()
	}}
	for i := range o.consumers + o.publishers {
		ps := c.cons
		if i >= o.consumers {
			ps = c.pubs
		}
		if _, err := ps.start(); err != nil {
			logf("%s: %v", ps.kind, err)
			c.pubs.stopAll(30 * time.Second)
			c.cons.stopAll(30 * time.Second)
			c.rec.shutdown()
			return 2
		}
	}

	// Writers and faults, side by side; the writers go on until the faults have ended.
	faultsDone := make(chan struct{})
	w := &writers{store: c.store, tag: c.tag, n: o.writers, events: o.events, spread: o.duration,
		payload: o.payload, done: faultsDone, logf: logf}
	var results writerResults
	var wg sync.WaitGroup
	begin := time.Now()
	wg.Go(func() { results = w.run(ctx) })
	wg.Go(func() { defer close(faultsDone); c.faultLoop(ctx) })
	progressDone := make(chan struct{})
	go c.progress(ctx, w, progressDone)
	wg.Wait()
	writesTook := time.Since(begin)
	logf("writers done: %d committed in %s", w.committed.Load(), writesTook.Round(time.Second))

	// Drain: nothing WAIT or SENDING, every SUCCESS row received, and its effect written.
	drainStart := time.Now()
	drained := c.waitDrained(ctx, o.drainTimeout)
	close(progressDone)
	drainTook := time.Since(drainStart)
	sleepFor(ctx, 5*time.Second) // late copies

	actx, acancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer acancel()
	rows, rowsErr := c.readRows(actx)
	var cp checkpointRow
	if o.relay {
		if cp, err = readCheckpoint(actx, c.db, c.relayCP, c.table); err != nil {
			logf("read the checkpoint row: %v", err)
		}
	}
	logf("stopping the publishers")
	c.pubs.stopAll(30 * time.Second)
	sendingAfter, err := c.countStatus(actx, "SENDING")
	if err != nil {
		logf("count SENDING: %v", err)
	}
	sleepFor(actx, 3*time.Second)
	logf("stopping the consumers")
	c.cons.stopAll(30 * time.Second)
	c.rec.shutdown()
	deliveries := c.rec.snapshot()
	effects, effectsErr := c.readEffects(actx)
	rejected, rejectedErr := c.countRejected(actx)

	recs, bad, err := readOutcomeLogs(dir, "*.outcomes")
	if err != nil {
		logf("outcome logs: %v", err)
	}
	inboxRecs, inboxBad, err := readOutcomeLogs(dir, "*.inbox")
	if err != nil {
		logf("consumers' records: %v", err)
	}
	for _, err := range []error{rowsErr, effectsErr, rejectedErr} {
		if err != nil {
			logf("read the tables: %v", err)
			return 2
		}
	}
	c.mu.Lock()
	faults := slices.Clone(c.faults)
	broken := slices.Clone(c.broken)
	c.mu.Unlock()
	r := analyze(analysisInput{
		Writers: results, Rows: rows, Deliveries: ownDeliveries(deliveries, c.tag), Records: recs, BadLines: bad + inboxBad,
		Killed: c.pubs.killedAt(), Lease: o.lease, Begin: begin, Faults: faults, SendingAfterStop: sendingAfter,
		CheckEffects: true, Effects: effects, InboxRecords: inboxRecs, InboxRejected: rejected,
		Relay: o.relay, Checkpoint: cp, FaultKinds: strings.Split(o.faults, ","),
	})
	r.Foreign += len(deliveries) - len(ownDeliveries(deliveries, c.tag))

	fmt.Printf("writes took %s; drain after the faults took %s%s\n", writesTook.Round(time.Second), drainTook.Round(time.Second),
		map[bool]string{false: " (NOT DRAINED: gave up)", true: ""}[drained])
	if len(results.Errors) > 0 {
		fmt.Printf("writer errors (each retried under a new biz no): %s\n", countList(results.Errors))
	}
	fmt.Println()
	r.print(os.Stdout)

	failures := r.failed()
	failures = append(failures, broken...)
	if !drained {
		failures = append(failures, "the outbox did not drain within -drain-timeout")
	}
	if ctx.Err() != nil {
		failures = append(failures, "stopped early: "+context.Cause(ctx).Error())
	}
	if n := c.pubs.unexpectedExits(); n > 0 {
		failures = append(failures, fmt.Sprintf("%d publisher processes exited on their own (see their .out files)", n))
	}
	if n := c.cons.unexpectedExits(); n > 0 {
		failures = append(failures, fmt.Sprintf("%d consumer processes exited on their own (see their .out files)", n))
	}
	if len(failures) > 0 {
		fmt.Printf("\nRESULT: FAIL: %s\n", strings.Join(failures, "; "))
		return 1
	}
	fmt.Println("\nRESULT: PASS")
	return 0
}

// ownDeliveries keeps the deliveries of this run's events.
func ownDeliveries(ds []delivery, tag string) []delivery {
	out := ds[:0:0]
	for _, d := range ds {
		if strings.HasPrefix(d.BizNo, tag+"-") {
			out = append(out, d)
		}
	}
	return out
}

// faultLoop injects faults until the duration has passed (-short: exactly one of each kind),
// waiting after each one until a message born after it was delivered.
func (c *chaos) faultLoop(ctx context.Context) {
	o := c.o
	rng := rand.New(rand.NewPCG(uint64(o.seed), 0x6f7574626f78))
	var kinds []string
	for _, k := range faultKinds {
		if !strings.Contains(","+o.faults+",", ","+k+",") {
			continue
		}
		if (k == faultDB && !c.svc.canRestartDB()) || (k == faultBroker && !c.svc.canRestartBroker()) || (k == faultDBCrash && !c.svc.canCrashDB()) {
			c.logf("no restart command for %s faults: none will be injected", k)
			continue
		}
		kinds = append(kinds, k)
	}
	if len(kinds) == 0 {
		return
	}
	order := rng.Perm(len(kinds)) // the first faults are one of each kind
	start := time.Now()
	for i := 0; ; i++ {
		if o.short && i >= len(kinds) {
			return
		}
		gap := between(rng, o.gapMin, o.gapMax)
		if !o.short && time.Since(start)+gap >= o.duration {
			return
		}
		if !sleepFor(ctx, gap) {
			return
		}
		kind := kinds[rng.IntN(len(kinds))]
		if i < len(kinds) {
			kind = kinds[order[i]]
		}
		f := c.inject(ctx, kind, rng)
		c.mu.Lock()
		c.faults = append(c.faults, f)
		if f.Err != "" {
			c.broken = append(c.broken, fmt.Sprintf("fault %d (%s) could not be undone", len(c.faults), describe(f)))
		}
		c.mu.Unlock()
		if f.Err != "" {
			c.logf("fault %s failed, no more faults: %s", describe(f), f.Err)
			return
		}
		c.waitRecovered(ctx, f)
	}
}

func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

func (c *chaos) inject(ctx context.Context, kind string, rng *rand.Rand) fault {
	f := fault{Kind: kind}
	switch kind {
	case faultKill:
		names := c.pubs.liveNames()
		if len(names) == 0 {
			f.Start, f.End, f.Err = time.Now(), time.Now(), "no publisher is running"
			return f
		}
		f.Target = names[rng.IntN(len(names))]
		how := ""
		if c.o.killWhen == "in-flight" {
			how = " (it holds no claimed rows: killed anyway after 10 s)"
			if c.pubs.waitHolding(ctx, f.Target, 10*time.Second) {
				how = " while it holds claimed rows"
			}
		}
		f.Start = time.Now()
		if err := c.pubs.kill(f.Target); err != nil {
			f.Err = err.Error()
		}
		c.logf("fault: SIGKILL publisher %s%s", f.Target, how)
		p, err := c.pubs.start()
		f.End = time.Now()
		if err != nil {
			f.Err = err.Error()
		} else {
			f.Replacement = p.name
			c.logf("started publisher %s in its place", p.name)
		}
	case faultKillConsumer:
		names := c.cons.liveNames()
		if len(names) == 0 {
			f.Start, f.End, f.Err = time.Now(), time.Now(), "no consumer is running"
			return f
		}
		f.Target = names[rng.IntN(len(names))]
		how := ""
		if c.o.killWhen == "in-flight" {
			how = " (it is in no handler: killed anyway after 10 s)"
			if c.cons.waitHandling(ctx, f.Target, 10*time.Second) {
				how = " while it is in a handler"
			}
		}
		f.Start = time.Now()
		if err := c.cons.kill(f.Target); err != nil {
			f.Err = err.Error()
		}
		c.logf("fault: SIGKILL consumer %s%s", f.Target, how)
		p, err := c.cons.start()
		f.End = time.Now()
		if err != nil {
			f.Err = err.Error()
		} else {
			f.Replacement = p.name
			c.logf("started consumer %s in its place", p.name)
		}
	case faultBroker:
		f.Target = c.brokers[rng.IntN(len(c.brokers))]
		down := between(rng, c.o.outageMin, c.o.outageMax)
		c.logf("fault: restart %s (down for %s)", f.Target, down.Round(time.Second))
		f.Start = time.Now()
		if err := c.svc.restartBroker(ctx, f.Target, down); err != nil {
			f.Err = err.Error()
		}
		f.End = time.Now()
		c.logf("%s serves again after %s", f.Target, f.End.Sub(f.Start).Round(100*time.Millisecond))
	case faultDB, faultDBCrash:
		f.Target = "database"
		down := between(rng, c.o.outageMin, c.o.outageMax)
		how := ""
		if c.o.killWhen == "in-flight" {
			how = c.pauseConsumers(ctx)
		}
		restart, what := c.svc.restartDB, "restart"
		if kind == faultDBCrash {
			restart, what = c.svc.crashDB, "crash (SIGKILL)"
		}
		c.logf("fault: %s the database%s (down for %s)", what, how, down.Round(time.Second))
		f.Start = time.Now()
		if err := restart(ctx, down); err != nil {
			f.Err = err.Error()
		}
		f.End = time.Now()
		c.logf("the database answers again after %s", f.End.Sub(f.Start).Round(100*time.Millisecond))
	case faultKillLeader:
		c.killLeader(ctx, &f)
	case faultPurge:
		c.purgeWhileLeaderDown(ctx, &f)
	}
	return f
}

// consumerPause is how long the consumers are paused before a database restart.
const consumerPause = 3 * time.Second

// pauseConsumers makes the database restart strike while the consumers' handlers run: it
// pauses the consumer processes (SIGSTOP) for consumerPause, so that messages queue up for
// them, resumes them (SIGCONT), and waits (up to 2 s) until one of them is in a handler. It
// returns how the restart strikes, for the log.
func (c *chaos) pauseConsumers(ctx context.Context) string {
	pause, resume := pauseSignals()
	names := c.cons.liveNames()
	if pause == nil || len(names) == 0 {
		return ""
	}
	c.logf("pausing the consumers for %s, so that messages queue up for them", consumerPause)
	c.cons.signalAll(pause)
	sleepFor(ctx, consumerPause)
	c.cons.signalAll(resume)
	if c.cons.waitHandling(ctx, names[0], 2*time.Second) {
		return " as the consumers, resumed, work through the queue"
	}
	return " (the consumers, resumed, were in no handler)"
}

// waitRecovered waits until a message born after the fault's end was delivered, and a
// consumer wrote the effect of one.
func (c *chaos) waitRecovered(ctx context.Context, f fault) {
	deadline := time.Now().Add(c.o.recoverWait)
	delivered, effected := false, false
	for time.Now().Before(deadline) {
		if at, ok := c.rec.firstBornAfter(f.End); ok && !delivered {
			delivered = true
			c.logf("first delivery %s after the fault's end", at.Sub(f.End).Round(100*time.Millisecond))
		}
		if !effected {
			if ok, err := c.effectAfter(ctx, f.End); err == nil && ok {
				effected = true
				c.logf("first effect of a message born after the fault's end within %s of it", time.Since(f.End).Round(100*time.Millisecond))
			}
		}
		if delivered && effected {
			return
		}
		if !sleepFor(ctx, 250*time.Millisecond) {
			return
		}
	}
	c.logf("no delivery or no effect within %s of the fault's end; going on", c.o.recoverWait)
}

// progress logs the run's state every 30 s.
func (c *chaos) progress(ctx context.Context, w *writers, done <-chan struct{}) {
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-done:
			return
		case <-t.C:
		}
		counts, err := c.statusCounts(ctx)
		state := countList(counts)
		if err != nil {
			state = "database: " + firstLine(err.Error())
		}
		effects := "?"
		if n, err := c.effectsDistinct(ctx); err == nil {
			effects = fmt.Sprint(n)
		}
		c.logf("committed %d, received %d distinct, effects of %s; rows: %s", w.committed.Load(), c.rec.distinctCount(), effects, state)
	}
}

// waitDrained waits until no row is WAIT or SENDING, every SUCCESS row was received, and
// every SUCCESS row's event has its effect (or was rejected by the inbox: the run fails then).
func (c *chaos) waitDrained(ctx context.Context, timeout time.Duration) bool {
	c.logf("waiting for the outbox to drain and the effects to catch up (at most %s)", timeout)
	deadline := time.Now().Add(timeout)
	last := time.Now()
	for {
		counts, err := c.statusCounts(ctx)
		var effects, rejected int
		if err == nil {
			effects, err = c.effectsDistinct(ctx)
		}
		if err == nil {
			rejected, err = c.countRejected(ctx)
		}
		state := fmt.Sprintf("%s; received %d distinct; effects of %d events, %d rejected", countList(counts), c.rec.distinctCount(), effects, rejected)
		if err == nil && counts["WAIT"] == 0 && counts["SENDING"] == 0 && c.rec.distinctCount() >= counts["SUCCESS"] &&
			effects+rejected >= counts["SUCCESS"] {
			c.logf("drained: %s", state)
			return true
		}
		if time.Now().After(deadline) {
			c.logf("not drained after %s: %s", timeout, state)
			return false
		}
		if time.Since(last) > 15*time.Second {
			last = time.Now()
			c.logf("draining: %s", state)
		}
		if !sleepFor(ctx, time.Second) {
			return false
		}
	}
}

func (c *chaos) statusCounts(ctx context.Context) (map[string]int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rows, err := c.db.QueryContext(ctx, "SELECT status, COUNT(*) FROM `"+c.table+"` GROUP BY status")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	counts := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			return nil, err
		}
		counts[s] = n
	}
	return counts, rows.Err()
}

func (c *chaos) countStatus(ctx context.Context, status string) (int, error) {
	var n int
	err := c.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+c.table+"` WHERE status = ?", status).Scan(&n)
	return n, err
}

func (c *chaos) readRows(ctx context.Context) ([]row, error) {
	rows, err := c.db.QueryContext(ctx, "SELECT id, event_id, biz_no, status, retry_count, claim_owner, COALESCE(last_error, '') FROM `"+c.table+"`")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.ID, &r.EventID, &r.BizNo, &r.Status, &r.Retries, &r.Owner, &r.LastError); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// createInboxSchema creates the inbox's tables and the effects table.
func (c *chaos) createInboxSchema(ctx context.Context) error {
	in, err := inbox.New(c.db, inbox.Config{Group: c.group, Table: c.inbox})
	if err != nil {
		return err
	}
	if err := in.CreateSchema(ctx); err != nil {
		return err
	}
	_, err = c.db.ExecContext(ctx, effectsSchema(c.effects))
	return err
}

// effectsDistinct counts the events with an effect.
func (c *chaos) effectsDistinct(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var n int
	err := c.db.QueryRowContext(ctx, "SELECT COUNT(DISTINCT event_id) FROM `"+c.effects+"`").Scan(&n)
	return n, err
}

// effectAfter reports whether a handler wrote the effect of a message born at or after t.
func (c *chaos) effectAfter(ctx context.Context, t time.Time) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var ok bool
	err := c.db.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM `"+c.effects+"` WHERE effect_at >= ? AND born_at >= ?)",
		t.Truncate(time.Millisecond), t.Truncate(time.Millisecond)).Scan(&ok)
	return ok, err
}

// countRejected counts the messages the inbox's group rejected.
func (c *chaos) countRejected(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var n int
	err := c.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+c.inbox+"_rejected` WHERE consumer_group = ?", c.group).Scan(&n)
	return n, err
}

func (c *chaos) readEffects(ctx context.Context) ([]effect, error) {
	rows, err := c.db.QueryContext(ctx, "SELECT event_id, biz_no, consumer, born_at, effect_at FROM `"+c.effects+"`")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []effect
	for rows.Next() {
		var e effect
		if err := rows.Scan(&e.EventID, &e.BizNo, &e.Consumer, &e.Born, &e.At); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// readOutcomeLogs reads every record file in dir that matches pattern: the publishers'
// outcome logs (*.outcomes), or the consumers' records (*.inbox).
func readOutcomeLogs(dir, pattern string) ([]record, int, error) {
	files, err := filepath.Glob(filepath.Join(dir, pattern))
	if err != nil {
		return nil, 0, err
	}
	var all []record
	bad := 0
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, 0, err
		}
		recs, b, err := parseRecords(f)
		_ = f.Close()
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", name, err)
		}
		all = append(all, recs...)
		bad += b
	}
	return all, bad, nil
}
