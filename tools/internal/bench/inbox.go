package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
)

// Consumer is a way of consuming: the same handler (one effect row per message, written in
// the transaction it is given) alone or through the inbox.
type Consumer int

const (
	// PlainConsumer runs the handler in a transaction of its own, with no deduplication:
	// BEGIN, the effect's INSERT, COMMIT. The least a consumer that writes an effect can do.
	PlainConsumer Consumer = iota + 1
	// InboxConsumer runs the handler through inbox.Handle with the inbox's defaults (the
	// session's isolation level, as the plain consumer's).
	InboxConsumer
	// InboxReadCommittedTx runs it through inbox.Handle with Config.TxOptions at READ
	// COMMITTED: the driver sends SET TRANSACTION ISOLATION LEVEL before every BEGIN.
	InboxReadCommittedTx
	// InboxReadCommittedSession runs it through inbox.Handle with the defaults on a pool
	// whose sessions are at READ COMMITTED (set once per connection, through the DSN): the
	// same isolation as InboxReadCommittedTx without a statement per message to set it.
	InboxReadCommittedSession
)

// Consumers are the ways of consuming, in the order the tables show them.
var Consumers = []Consumer{PlainConsumer, InboxConsumer, InboxReadCommittedTx, InboxReadCommittedSession}

func (c Consumer) String() string {
	switch c {
	case PlainConsumer:
		return "plain"
	case InboxConsumer:
		return "inbox"
	case InboxReadCommittedTx:
		return "inbox, READ COMMITTED per tx"
	case InboxReadCommittedSession:
		return "inbox, READ COMMITTED per session"
	}
	return fmt.Sprintf("Consumer(%d)", int(c))
}

// effectsDDL is the handler's business table: a points row per order event, as the
// order-service example's points service writes. No unique key on the event id: the plain
// consumer does not deduplicate, and the table is the same for every way of consuming.
const effectsDDL = "CREATE TABLE `%s` (id BIGINT NOT NULL AUTO_INCREMENT, event_id CHAR(36) NOT NULL, " +
	"biz_no VARCHAR(64) NOT NULL, user_id BIGINT NOT NULL, points INT NOT NULL, created_at DATETIME(3) NOT NULL, " +
	"PRIMARY KEY (id)) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4"

// Consume is one consumption measurement: Messages messages, each handled once by Workers
// goroutines the Consumer way. Without a Topic, on the database path alone: the handler
// is called (alone, or through inbox.Handle) on messages made beforehand, as the broker's
// client would hand them over. With a Topic, through RocketMQ: a push consumer (the plain
// one, or inbox.NewConsumer) of a fresh group consumes the topic's messages from its
// first, Workers being its consume goroutines.
type Consume struct {
	Consumer Consumer
	Messages int // the database path's messages; with a Topic, the topic's
	Workers  int
	Topic    *Topic
}

// ConsumeResult is what a consumption measured. The statement counts are the server's
// own (Questions and Com_*) from just before the first message to the last effect
// committed, less the harness's reads of them: on a server nothing else uses, they are the
// consumer's.
type ConsumeResult struct {
	Messages int
	// Elapsed is from the start (the first message handed to a worker; through RocketMQ,
	// the consumer's start) to the last effect committed.
	Elapsed time.Duration
	// Flowing is, through RocketMQ, from the first effect committed to the last: the rate
	// once the consumer has its queues. Zero on the database path.
	Flowing    time.Duration
	PerMessage PerEvent
	// Effects and Distinct are the effect rows written and their distinct event ids.
	Effects, Distinct int
	// Errors counts the deliveries not handled: failed (the handler's transaction rolled
	// back, to be delivered again), rejected, or, through the inbox, duplicates.
	Errors int64
}

// Rate is the messages per second over Elapsed.
func (r ConsumeResult) Rate() float64 { return float64(r.Messages) / r.Elapsed.Seconds() }

// FlowingRate is the messages per second once the first effect committed; 0 on the
// database path.
func (r ConsumeResult) FlowingRate() float64 {
	if r.Flowing <= 0 || r.Messages < 2 {
		return 0
	}
	return float64(r.Messages-1) / r.Flowing.Seconds()
}

// consumerSetup is a way of consuming, ready to take messages: its pool, its effect table
// and (for the inbox) its inbox table.
type consumerSetup struct {
	kind    Consumer
	db      *sql.DB
	effects string
	insert  string
	in      *inbox.Inbox
	// handled counts the inbox's deliveries by outcome (its inbox.messages counter).
	reader *sdkmetric.ManualReader
	meters *sdkmetric.MeterProvider
	close  func()
}

// openConsumerPool returns the consumer's pool: statements with arguments are interpolated
// by the client (one statement on the wire, as the inbox's own INSERT is), and, for
// InboxReadCommittedSession, every session starts at READ COMMITTED.
func openConsumerPool(ctx context.Context, env Env, kind Consumer, workers int) (*sql.DB, error) {
	cfg, err := mysql.ParseDSN(env.DSN)
	if err != nil {
		return nil, fmt.Errorf("parse DSN: %w", err)
	}
	cfg.ParseTime, cfg.InterpolateParams = true, true
	if kind == InboxReadCommittedSession {
		v, err := ServerVersion(ctx, env)
		if err != nil {
			return nil, err
		}
		// MariaDB before 11.1 and MySQL before 5.7.20 know tx_isolation only; MySQL 8 knows
		// transaction_isolation only.
		name := "transaction_isolation"
		if strings.Contains(v, "MariaDB") {
			name = "tx_isolation"
		}
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		cfg.Params[name] = "'READ-COMMITTED'"
	}
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return nil, err
	}
	db.SetMaxIdleConns(max(workers, 16))
	return db, nil
}

func newConsumerSetup(ctx context.Context, env Env, kind Consumer, workers int, group string) (*consumerSetup, error) {
	db, err := openConsumerPool(ctx, env, kind, workers)
	if err != nil {
		return nil, err
	}
	s := &consumerSetup{kind: kind, db: db}
	var drops []string
	s.close = func() {
		for _, t := range drops {
			_, _ = db.Exec("DROP TABLE IF EXISTS `" + t + "`")
		}
		if s.meters != nil {
			_ = s.meters.Shutdown(context.Background())
		}
		_ = db.Close()
	}
	seq := tableSeq.Add(1)
	stamp := time.Now().UnixNano() % 1e9
	s.effects = fmt.Sprintf("bench_effects_%d_%d", stamp, seq)
	if _, err := db.ExecContext(ctx, fmt.Sprintf(effectsDDL, s.effects)); err != nil {
		s.close()
		return nil, fmt.Errorf("create the effect table: %w", err)
	}
	drops = append(drops, s.effects)
	s.insert = "INSERT INTO `" + s.effects + "` (event_id, biz_no, user_id, points, created_at) VALUES (?, ?, ?, ?, UTC_TIMESTAMP(3))"
	if kind == PlainConsumer {
		return s, nil
	}
	table := fmt.Sprintf("bench_inbox_%d_%d", stamp, seq)
	drops = append(drops, table, table+"_rejected")
	s.reader = sdkmetric.NewManualReader()
	onlyMessages := func(i sdkmetric.Instrument) (sdkmetric.Stream, bool) {
		if i.Name == inboxMessagesMetric {
			return sdkmetric.Stream{}, false
		}
		return sdkmetric.Stream{Name: i.Name, Aggregation: sdkmetric.AggregationDrop{}}, true
	}
	s.meters = sdkmetric.NewMeterProvider(sdkmetric.WithReader(s.reader), sdkmetric.WithView(onlyMessages))
	cfg := inbox.Config{Group: group, Table: table, MeterProvider: s.meters, Logger: slog.New(slog.DiscardHandler)}
	if kind == InboxReadCommittedTx {
		cfg.TxOptions = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	if s.in, err = inbox.New(db, cfg); err == nil {
		err = s.in.CreateSchema(ctx)
	}
	if err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// effect is the handler: the message's effect row, in tx.
func (s *consumerSetup) effect(ctx context.Context, tx *sql.Tx, msg *inbox.Message) error {
	_, err := tx.ExecContext(ctx, s.insert, msg.EventID, msg.BizNo, 1042, 130)
	return err
}

// handle handles one message: in a transaction of its own (plain), or through the inbox.
func (s *consumerSetup) handle(ctx context.Context, msg *inbox.Message) error {
	if s.in != nil {
		o, err := s.in.Handle(ctx, msg, s.effect)
		if err == nil && o != inbox.Handled {
			err = fmt.Errorf("event %s: %s", msg.EventID, o)
		}
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := s.effect(ctx, tx, msg); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// inboxMessagesMetric is the inbox's counter of deliveries by outcome.
const inboxMessagesMetric = "inbox.messages"

// outcomes reads the inbox's inbox.messages counter: deliveries by outcome.
func (s *consumerSetup) outcomes(ctx context.Context) (map[string]int64, error) {
	var rm metricdata.ResourceMetrics
	if err := s.reader.Collect(ctx, &rm); err != nil {
		return nil, fmt.Errorf("collect the inbox's metrics: %w", err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name != inboxMessagesMetric {
				continue
			}
			sum, ok := mt.Data.(metricdata.Sum[int64])
			if !ok {
				return nil, fmt.Errorf("%s is a %T, not an integer sum", inboxMessagesMetric, mt.Data)
			}
			for _, dp := range sum.DataPoints {
				o, _ := dp.Attributes.Value("outcome")
				out[o.AsString()] += dp.Value
			}
		}
	}
	return out, nil
}

// count returns the effect rows and their distinct event ids.
func (s *consumerSetup) count(ctx context.Context) (rows, distinct int, err error) {
	err = s.db.QueryRowContext(ctx, "SELECT COUNT(*), COUNT(DISTINCT event_id) FROM `"+s.effects+"`").Scan(&rows, &distinct)
	return rows, distinct, err
}

// benchEvent is event i of a run: an order-created event as the outbox writes it.
func benchEvent(i int) (outbox.Event, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return outbox.Event{}, err
	}
	return outbox.Event{EventID: id.String(), BizNo: fmt.Sprintf("ORD-%010d", i), EventType: "ORDER_CREATED", Payload: eventPayload}, nil
}

// Run measures the consumption once.
func (c Consume) Run(ctx context.Context, env Env) (ConsumeResult, error) {
	var res ConsumeResult
	if c.Workers <= 0 {
		return res, fmt.Errorf("consume: workers (%d) must be positive", c.Workers)
	}
	if c.Topic != nil {
		return c.runBroker(ctx, env)
	}
	if c.Messages <= 0 {
		return res, fmt.Errorf("consume: messages (%d) must be positive", c.Messages)
	}
	res.Messages = c.Messages
	msgs := make([]*inbox.Message, c.Messages)
	for i := range msgs {
		ev, err := benchEvent(i)
		if err != nil {
			return res, err
		}
		msgs[i] = &inbox.Message{EventID: ev.EventID, EventType: ev.EventType, BizNo: ev.BizNo, Body: ev.Payload,
			Properties: map[string]string{outbox.PropertyEventID: ev.EventID, outbox.PropertyEventType: ev.EventType, outbox.PropertyBizNo: ev.BizNo},
			Topic:      "BENCH_TOPIC", MsgID: fmt.Sprintf("%032X", i), Deliveries: 1, BornAt: time.Now()}
	}
	harness, err := env.open()
	if err != nil {
		return res, err
	}
	defer harness.Close()
	s, err := newConsumerSetup(ctx, env, c.Consumer, c.Workers, fmt.Sprintf("bench_inbox_%d", runSeq.Add(1)))
	if err != nil {
		return res, err
	}
	defer s.close()
	// Each worker's connection is open before the counters are read: a pool's first
	// statement on a session at READ COMMITTED per session is the SET the DSN asks for.
	if err := warm(ctx, s.db, c.Workers); err != nil {
		return res, err
	}
	c0, err := readCounters(ctx, harness)
	if err != nil {
		return res, err
	}
	var next atomic.Int64
	var failed atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for range c.Workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(msgs) {
					return
				}
				if err := s.handle(ctx, msgs[i]); err != nil {
					failed.Add(1)
					once.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	c1, err := readCounters(ctx, harness)
	if err != nil {
		return res, err
	}
	if firstErr != nil {
		return res, fmt.Errorf("consume %s: %d messages failed, the first: %w", c.Consumer, failed.Load(), firstErr)
	}
	res.PerMessage = c1.sub(c0).per(c.Messages)
	if res.Effects, res.Distinct, err = s.count(ctx); err != nil {
		return res, err
	}
	return res, nil
}

// warm opens n connections in db and leaves them idle.
func warm(ctx context.Context, db *sql.DB, n int) error {
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range n {
		c, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		if err := c.PingContext(ctx); err != nil {
			_ = c.Close()
			return err
		}
		conns = append(conns, c)
	}
	return nil
}

// Topic is a fresh RocketMQ topic holding Messages order events, published once, which
// every consumption of it reads from the first, each in a group of its own.
type Topic struct {
	NameServers []string
	Broker      string // the broker the topic is on
	Name        string
	Messages    int
	// Published is how long the publishing took.
	Published time.Duration
}

// NewTopic creates a topic of four queues on broker and publishes messages events to it
// through the library's RocketMQ sender, in batches, as the publisher sends them.
func NewTopic(ctx context.Context, nameServers []string, broker string, messages int) (*Topic, error) {
	if messages <= 0 {
		return nil, fmt.Errorf("topic: messages (%d) must be positive", messages)
	}
	t := &Topic{NameServers: nameServers, Broker: broker, Messages: messages,
		Name: fmt.Sprintf("BENCH_INBOX_%d_%d", time.Now().UnixNano()%1e9, runSeq.Add(1))}
	adm, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver(nameServers)))
	if err != nil {
		return nil, fmt.Errorf("rocketmq admin: %w", err)
	}
	defer adm.Close()
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := adm.CreateTopic(cctx, admin.WithTopicCreate(t.Name), admin.WithBrokerAddrCreate(broker),
		admin.WithReadQueueNums(4), admin.WithWriteQueueNums(4)); err != nil {
		return nil, fmt.Errorf("create topic %s on %s: %w", t.Name, broker, err)
	}
	for {
		mqs, err := adm.FetchPublishMessageQueues(cctx, t.Name)
		if err == nil && len(mqs) > 0 {
			break
		}
		select {
		case <-cctx.Done():
			t.Delete()
			return nil, fmt.Errorf("topic %s has no route after a minute: %w", t.Name, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{NameServers: nameServers,
		InstanceName: fmt.Sprintf("bench-inbox-producer-%d", time.Now().UnixNano())})
	if err != nil {
		t.Delete()
		return nil, err
	}
	defer sender.Close()
	start := time.Now()
	const batch = 256
	for done := 0; done < messages; done += batch {
		evs := make([]outbox.Event, min(batch, messages-done))
		for i := range evs {
			if evs[i], err = benchEvent(done + i); err != nil {
				t.Delete()
				return nil, err
			}
			evs[i].Topic = t.Name
		}
		for _, err := range sender.Send(ctx, evs, false) {
			if err != nil {
				t.Delete()
				return nil, fmt.Errorf("publish to %s: %w", t.Name, err)
			}
		}
	}
	t.Published = time.Since(start)
	return t, nil
}

// Delete deletes the topic from its broker and the name servers, as far as it can.
func (t *Topic) Delete() {
	adm, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver(t.NameServers)))
	if err != nil {
		return
	}
	defer adm.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = adm.DeleteTopic(ctx, admin.WithTopicDelete(t.Name), admin.WithBrokerAddrDelete(t.Broker), admin.WithNameSrvAddr(t.NameServers))
}

// consumerSettle is the least time a push consumer runs before it is shut down: the client
// races with itself when a consumer is shut down while the rebalance its registration set
// off still runs (the inbox's Consumer waits as long).
const consumerSettle = 3 * time.Second

// runBroker consumes c.Topic's messages with a fresh group's push consumer.
func (c Consume) runBroker(ctx context.Context, env Env) (ConsumeResult, error) {
	res := ConsumeResult{Messages: c.Topic.Messages}
	harness, err := env.open()
	if err != nil {
		return res, err
	}
	defer harness.Close()
	group := fmt.Sprintf("bench_inbox_%s_%d_%d", strings.NewReplacer(" ", "", ",", "_").Replace(c.Consumer.String()),
		time.Now().UnixNano()%1e9, runSeq.Add(1))
	s, err := newConsumerSetup(ctx, env, c.Consumer, c.Workers, group)
	if err != nil {
		return res, err
	}
	defer s.close()
	if err := warm(ctx, s.db, c.Workers); err != nil {
		return res, err
	}
	instance := fmt.Sprintf("%s-%d", group, time.Now().UnixNano())
	opts := []consumer.Option{consumer.WithConsumeGoroutineNums(c.Workers)}

	// progress returns the effects committed so far and the deliveries that failed.
	var progress func() (int64, int64, error)
	var stop func()
	c0, err := readCounters(ctx, harness)
	if err != nil {
		return res, err
	}
	start := time.Now()
	if s.in != nil {
		ic, err := inbox.NewConsumer(s.in, s.effect, inbox.ConsumerConfig{NameServers: c.Topic.NameServers, Topic: c.Topic.Name,
			InstanceName: instance, ConsumerOptions: opts})
		if err != nil {
			return res, err
		}
		runErr := make(chan error, 1)
		go func() { runErr <- ic.Run(context.Background()) }()
		stop = func() {
			_ = ic.Close()
			<-runErr
		}
		progress = func() (int64, int64, error) {
			select {
			case err := <-runErr:
				runErr <- err
				if err == nil {
					err = errors.New("the inbox consumer stopped")
				}
				return 0, 0, err
			default:
			}
			o, err := s.outcomes(ctx)
			return o[inbox.Handled.String()], o[inbox.Failed.String()] + o[inbox.Rejected.String()] + o[inbox.Duplicate.String()], err
		}
	} else {
		var handled, failed atomic.Int64
		push, err := rocketmq.NewPushConsumer(append([]consumer.Option{
			consumer.WithNameServer(c.Topic.NameServers),
			consumer.WithGroupName(group),
			consumer.WithInstance(instance),
			consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
		}, opts...)...)
		if err != nil {
			return res, err
		}
		err = push.Subscribe(c.Topic.Name, consumer.MessageSelector{Type: consumer.TAG, Expression: "*"},
			func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
				for _, m := range msgs {
					msg := &inbox.Message{EventID: m.GetProperty(outbox.PropertyEventID), BizNo: m.GetProperty(outbox.PropertyBizNo)}
					if err := s.handle(ctx, msg); err != nil {
						failed.Add(1)
						return consumer.ConsumeRetryLater, nil
					}
					handled.Add(1)
				}
				return consumer.ConsumeSuccess, nil
			})
		if err != nil {
			return res, err
		}
		if err := push.Start(); err != nil {
			return res, fmt.Errorf("start the push consumer: %w", err)
		}
		stop = func() {
			time.Sleep(time.Until(start.Add(consumerSettle)))
			_ = push.Shutdown()
		}
		progress = func() (int64, int64, error) { return handled.Load(), failed.Load(), nil }
	}
	var first time.Time
	deadline := start.Add(2*time.Minute + time.Duration(c.Topic.Messages)*time.Millisecond*10)
	for {
		n, failed, err := progress()
		if err != nil {
			stop()
			return res, err
		}
		now := time.Now()
		if n > 0 && first.IsZero() {
			first = now
		}
		if n >= int64(c.Topic.Messages) {
			res.Elapsed, res.Flowing = now.Sub(start), now.Sub(first)
			break
		}
		if now.After(deadline) {
			stop()
			return res, fmt.Errorf("consume %s: %d of %d effects committed after %s (%d deliveries not handled)",
				c.Consumer, n, c.Topic.Messages, now.Sub(start).Round(time.Second), failed)
		}
		time.Sleep(2 * time.Millisecond)
	}
	c1, err := readCounters(ctx, harness)
	if err != nil {
		stop()
		return res, err
	}
	_, failed, err := progress()
	stop()
	if err != nil {
		return res, err
	}
	res.Errors = failed
	res.PerMessage = c1.sub(c0).per(c.Topic.Messages)
	if res.Effects, res.Distinct, err = s.count(ctx); err != nil {
		return res, err
	}
	return res, nil
}
