// Command outbox-rebalance measures how long ordered consumption stands still when orderly
// inbox consumers start together, when one joins, when one leaves and while two are
// restarted one after the other, under a steady load, and prints a table. Each case runs
// twice in the same run: "before", with the push consumer allocating queues by the
// client's own strategy (none of the inbox consumer's unlocking of queues at the broker:
// the behaviour of an inbox without it), and "after", with the consumer's.
//
// A writer commits -rate events per second, round robin over -biz-nos biz nos, to an
// outbox table in key order; a publisher sends them to a topic of the run's own on every
// broker given (-brokers, 4 queues each), and orderly inbox consumers of a group of the
// case's own handle them. The table reports, from the case's first step to the time every
// biz no is handled again (and -settle more), the longest gap between two consecutive
// handlings of one biz no (the first counted from the step), the longest time no event at
// all was handled, how many events waited more than 5 s from commit to handling, and the
// events lost, handled out of their biz no's order, or handled twice:
//
//	eval "$(bash scripts/rocketmq.sh start)" && bash scripts/mariadb.sh start
//	go -C tools run ./outbox-rebalance -dsn "$(bash scripts/mariadb.sh dsn)" -namesrv "$OUTBOX_TEST_ROCKETMQ_NAMESRV"
package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	_ "github.com/go-sql-driver/mysql"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
)

type options struct {
	dsn, namesrv string
	brokers      []string
	rate, bizNos int
	settle       time.Duration
	maxWait      time.Duration
	between      time.Duration
}

func main() {
	outbox.RouteRocketMQClientLogs(nil) // the client's routine logs would bury the table
	var o options
	flag.StringVar(&o.dsn, "dsn", "root@tcp(127.0.0.1:3306)/outbox_test?parseTime=true", "MySQL DSN")
	flag.StringVar(&o.namesrv, "namesrv", "127.0.0.1:9876", "RocketMQ name server")
	brokers := flag.String("brokers", "127.0.0.1:10911,127.0.0.1:10921", "broker addresses to create the topic on, comma-separated")
	flag.IntVar(&o.rate, "rate", 100, "events committed per second")
	flag.IntVar(&o.bizNos, "biz-nos", 32, "biz nos the events are spread over")
	flag.DurationVar(&o.settle, "settle", 3*time.Second, "how long a case goes on after every biz no is handled again")
	flag.DurationVar(&o.maxWait, "max-wait", 150*time.Second, "how long a case waits at most for every biz no to be handled again")
	flag.DurationVar(&o.between, "restart-gap", 5*time.Second, "in a rolling restart, the time between the first consumer's new start and the second's stop")
	caseList := flag.String("cases", "start,join,leave,restart", "cases to run")
	modeList := flag.String("modes", "before,after", "before: the client's own allocation strategy (no unlocking); after: the inbox consumer's")
	flag.Parse()
	o.brokers = strings.Split(*brokers, ",")

	db, err := sql.Open("mysql", o.dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	fmt.Printf("a topic of each case's own on %d brokers (%d queues); %d events/s over %d biz nos; %s, %d CPUs\n\n",
		len(o.brokers), 4*len(o.brokers), o.rate, o.bizNos, runtime.GOOS+"/"+runtime.GOARCH, runtime.NumCPU())

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	defer w.Flush()
	fmt.Fprintln(w, "case\tmode\tlongest gap of a biz no\tlongest time nothing handled\tevents > 5 s late (committed after the step)\tevents\tlost\tout of order\thandled twice\t")
	for _, c := range strings.Split(*caseList, ",") {
		for _, m := range strings.Split(*modeList, ",") {
			topic, err := createTopic(ctx, o)
			if err != nil {
				log.Fatal(err)
			}
			res, err := runCase(ctx, db, o, topic, c, m == "before")
			if err != nil {
				log.Fatalf("%s %s: %v", c, m, err)
			}
			fmt.Fprintf(w, "%s\t%s\t%.1f s\t%.1f s\t%d\t%d\t%d\t%d\t%d\t\n", c, m, res.gap.Seconds(), res.idle.Seconds(),
				res.late, res.events, res.lost, res.outOfOrder, res.twice)
			log.Printf("%s %s: longest gap %.1f s", c, m, res.gap.Seconds())
		}
	}
}

func createTopic(ctx context.Context, o options) (string, error) {
	topic := "REBALANCE_" + suffix()
	adm, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver([]string{o.namesrv})))
	if err != nil {
		return "", err
	}
	defer func() { _ = adm.Close() }()
	for _, b := range o.brokers {
		if err := adm.CreateTopic(ctx, admin.WithTopicCreate(topic), admin.WithBrokerAddrCreate(b),
			admin.WithReadQueueNums(4), admin.WithWriteQueueNums(4)); err != nil {
			return "", fmt.Errorf("create topic %s on %s: %w", topic, b, err)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		mqs, err := adm.FetchPublishMessageQueues(ctx, topic)
		if err == nil && len(mqs) >= 4*len(o.brokers) {
			return topic, nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return "", fmt.Errorf("the route of %s did not appear", topic)
}

func suffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// handled is one first handling of an event.
type handled struct {
	n  int
	at time.Time
}

type result struct {
	gap, idle                      time.Duration
	late, events, lost, outOfOrder int
	twice                          int
}

// bench is one case's load, publisher and consumers.
type bench struct {
	o      options
	db     *sql.DB
	store  *outbox.MySQLStore
	in     *inbox.Inbox
	topic  string
	before bool

	mu        sync.Mutex
	committed map[string]time.Time // by event id
	bizNoOf   map[string]string
	nOf       map[string]int
	first     map[string]time.Time // each event's first handling
	byBizNo   map[string][]handled
	calls     int
	all       []time.Time
}

func runCase(ctx context.Context, db *sql.DB, o options, topic, name string, before bool) (result, error) {
	id := suffix()
	table, group := "t_rb_"+id, "cg_rb_"+id
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: table, Ordering: outbox.KeyOrder, Routes: outbox.Routes{Topic: topic}})
	if err != nil {
		return result{}, err
	}
	if err := store.CreateSchema(ctx); err != nil {
		return result{}, err
	}
	in, err := inbox.New(db, inbox.Config{Group: group, Table: "t_rbin_" + id, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return result{}, err
	}
	if err := in.CreateSchema(ctx); err != nil {
		return result{}, err
	}
	defer func() {
		for _, t := range []string{table, "t_rbin_" + id, "t_rbin_" + id + "_rejected"} {
			_, _ = db.Exec("DROP TABLE IF EXISTS `" + t + "`")
		}
	}()
	b := &bench{o: o, db: db, store: store, in: in, topic: topic, before: before, committed: map[string]time.Time{},
		bizNoOf: map[string]string{}, nOf: map[string]int{}, first: map[string]time.Time{}, byBizNo: map[string][]handled{}}

	sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{NameServers: []string{o.namesrv}, GroupName: "pg_rb_" + id})
	if err != nil {
		return result{}, err
	}
	pub, err := outbox.NewPublisher(store, sender, outbox.Config{PollInterval: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return result{}, err
	}
	pctx, stopPub := context.WithCancel(ctx)
	pubDone := make(chan error, 1)
	go func() { pubDone <- pub.Run(pctx) }()
	defer func() {
		stopPub()
		<-pubDone
		_ = pub.Close()
	}()

	var stopLoad atomic.Bool
	loadDone := make(chan error, 1)
	go func() { loadDone <- b.load(ctx, &stopLoad) }()
	stop := func() error {
		if stopLoad.Swap(true) {
			return nil
		}
		return <-loadDone
	}
	defer func() { _ = stop() }()

	var running []*inbox.Consumer
	defer func() {
		for _, c := range running {
			_ = c.Close()
		}
	}()
	startN := func(n int) error { // n consumers at once
		cs := make([]*inbox.Consumer, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { cs[i], errs[i] = b.consumer(ctx) })
		}
		wg.Wait()
		for _, c := range cs {
			if c != nil {
				running = append(running, c)
			}
		}
		return errors.Join(errs...)
	}
	closeOne := func() error {
		c := running[0]
		running = running[1:]
		return c.Close()
	}

	// warm up: the steps before the case's own, run until every biz no is handled
	var setup int
	switch name {
	case "start":
	case "join", "restart":
		setup = 2
	case "leave":
		setup = 3
	default:
		return result{}, fmt.Errorf("unknown case %q", name)
	}
	time.Sleep(time.Second) // a backlog for the start case; the load under way for the others
	if setup > 0 {
		if err := startN(setup); err != nil {
			return result{}, err
		}
		if !b.waitAllHandledAfter(time.Now(), o.maxWait) {
			return result{}, errors.New("the warm-up consumers did not handle every biz no")
		}
		time.Sleep(o.settle)
	}

	t0 := time.Now()
	switch name {
	case "start":
		err = startN(3)
	case "join":
		err = startN(1)
	case "leave":
		err = closeOne()
	case "restart":
		for range 2 {
			if err = closeOne(); err != nil {
				break
			}
			if err = startN(1); err != nil {
				break
			}
			time.Sleep(o.between)
		}
	}
	if err != nil {
		return result{}, err
	}
	last := time.Now()
	b.waitAllHandledAfter(last, o.maxWait)
	time.Sleep(o.settle)
	end := time.Now()
	if err := stop(); err != nil {
		return result{}, err
	}
	b.waitAllHandled(30 * time.Second)
	return b.measure(t0, end), nil
}

// load commits o.rate events per second until stop.
func (b *bench) load(ctx context.Context, stop *atomic.Bool) error {
	tick := time.NewTicker(time.Second / time.Duration(b.o.rate))
	defer tick.Stop()
	for i := 0; !stop.Load(); i++ {
		<-tick.C
		bizNo := fmt.Sprintf("ORD-%03d", i%b.o.bizNos)
		n := i / b.o.bizNos
		tx, err := b.store.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		payload, _ := json.Marshal(map[string]int{"n": n})
		id, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: bizNo, EventType: "ORDER_STEP", Payload: payload})
		if err != nil {
			_ = tx.Rollback()
			return err
		}
		b.mu.Lock() // before the commit: the event may be handled before Commit returns
		b.committed[id], b.bizNoOf[id], b.nOf[id] = time.Now(), bizNo, n
		b.mu.Unlock()
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) consumer(ctx context.Context) (*inbox.Consumer, error) {
	cfg := inbox.ConsumerConfig{NameServers: []string{b.o.namesrv}, Topic: b.topic, Orderly: true, RetryPause: 100 * time.Millisecond}
	if b.before {
		cfg.ConsumerOptions = []consumer.Option{consumer.WithStrategy(consumer.AllocateByAveragely),
			consumer.WithRebalanceLockInterval(20 * time.Second)} // the client's defaults
	}
	c, err := inbox.NewConsumer(b.in, b.handle, cfg)
	if err != nil {
		return nil, err
	}
	return c, c.Start(ctx)
}

func (b *bench) handle(_ context.Context, _ *sql.Tx, msg *inbox.Message) error {
	now := time.Now()
	var p struct{ N int }
	_ = json.Unmarshal(msg.Body, &p)
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.committed[msg.EventID]; !ok {
		return nil // not this case's
	}
	b.calls++
	if _, ok := b.first[msg.EventID]; ok {
		return nil
	}
	b.first[msg.EventID] = now
	b.byBizNo[msg.BizNo] = append(b.byBizNo[msg.BizNo], handled{n: p.N, at: now})
	b.all = append(b.all, now)
	return nil
}

// waitAllHandledAfter waits until every biz no has had an event committed after t handled.
func (b *bench) waitAllHandledAfter(t time.Time, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		b.mu.Lock()
		seen := map[string]bool{}
		for id := range b.first {
			if b.committed[id].After(t) {
				seen[b.bizNoOf[id]] = true
			}
		}
		b.mu.Unlock()
		if len(seen) >= b.o.bizNos {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

// waitAllHandled waits until every event committed is handled.
func (b *bench) waitAllHandled(within time.Duration) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		b.mu.Lock()
		done := len(b.first) >= len(b.committed)
		b.mu.Unlock()
		if done {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (b *bench) measure(t0, end time.Time) result {
	b.mu.Lock()
	defer b.mu.Unlock()
	var r result
	r.events = len(b.committed)
	for id := range b.committed {
		if _, ok := b.first[id]; !ok {
			r.lost++
		}
	}
	r.twice = b.calls - len(b.first)
	for id, at := range b.first {
		if b.committed[id].After(t0) && at.Sub(b.committed[id]) > 5*time.Second {
			r.late++
		}
	}
	for _, hs := range b.byBizNo {
		prev := t0
		for i, h := range hs {
			if i > 0 && h.n < hs[i-1].n {
				r.outOfOrder++
			}
			if h.at.Before(t0) || h.at.After(end) {
				continue
			}
			r.gap = max(r.gap, h.at.Sub(prev))
			prev = h.at
		}
	}
	all := slices.Clone(b.all)
	slices.SortFunc(all, func(x, y time.Time) int { return x.Compare(y) })
	prev := t0
	for _, t := range all {
		if t.Before(t0) || t.After(end) {
			continue
		}
		r.idle = max(r.idle, t.Sub(prev))
		prev = t
	}
	return r
}
