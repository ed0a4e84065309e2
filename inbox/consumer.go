package inbox

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/clientlog"
	"github.com/go-outbox/outbox/internal/every"
	"github.com/go-outbox/outbox/internal/goid"
	"github.com/go-outbox/outbox/internal/rmqlock"
)

// ConsumerConfig configures a [Consumer].
type ConsumerConfig struct {
	// NameServers are the name server addresses, e.g. ["127.0.0.1:9876"]. Required.
	NameServers []string

	// Topic is the topic consumed. Required.
	Topic string

	// Tags selects the messages of the topic by tag (the event type), as a RocketMQ
	// subscription expression: "ORDER_CREATED || ORDER_PAID". Defaults to "*", every tag.
	Tags string

	// Orderly consumes each queue's messages one after another, in queue order, while the
	// broker grants this consumer the queue: with an outbox in key order
	// ([outbox.MySQLConfig.Ordering]), a biz no's events are handled in the order they
	// were committed. A message whose delivery fails holds its queue (every biz no in it)
	// for RetryPause and is delivered again, until it succeeds or, after
	// [Config.MaxDeliveries] deliveries, is rejected and the queue goes on; with
	// MaxDeliveries = [outbox.RetryForever] it holds the queue until it succeeds, so that
	// no later event of the queue is ever handled before it. Without Orderly, messages are
	// handled in parallel, and a failed one is delivered again through the group's retry
	// topic with RocketMQ's backoff (10 s, 30 s, 1 min, ...) while the others go on.
	//
	// When a rebalance (a consumer of the group starts, stops or joins) moves a queue, the
	// orderly consumer that had it stops handling it, and once its handler in progress on it
	// has returned, unlocks it at the broker; the consumer given the queue locks it as soon
	// as it is free. No two consumers of the group handle one queue at once, and the queue
	// goes on within seconds, not after the broker's lock has expired (a minute: the
	// RocketMQ Go client does not unlock a queue it gives up). Stop and Close unlock every
	// queue the consumer held, once its deliveries have finished. A consumer killed cannot
	// unlock: its queues wait for the broker's lock life. See docs/inbox.md.
	Orderly bool

	// RetryPause is how long an orderly queue waits before delivering a failed message
	// again. Defaults to 1 second.
	RetryPause time.Duration

	// InstanceName tells apart consumers in one process. Defaults to a random name.
	InstanceName string

	// StopTimeout bounds [Consumer.Close], and the shutdown that follows the end of the
	// context given to Start or Run: how long the deliveries in progress are given to
	// finish. Past it their handlers' contexts are cancelled (their transactions roll back,
	// and the messages are delivered again, to the group's next consumer) and the push
	// consumer is shut down. Defaults to 30 seconds. [Consumer.Stop] is bounded by its own
	// context instead.
	StopTimeout time.Duration

	// Credentials are the consumer's ACL credentials (a user of the brokers' ACL 2.0): the
	// push consumer's, and those of the requests the consumer makes of its own (an orderly
	// consumer's queue locks and unlocks, a new group's first heartbeat). The user needs Sub
	// on the group and on Topic. Give them here, not as consumer.WithCredentials in
	// ConsumerOptions, which the consumer cannot read: its own requests would be refused.
	Credentials primitive.Credentials

	// TLS connects to the name servers and brokers over TLS, for the push consumer (as
	// consumer.WithTls(true)) and for the consumer's own requests. Like the RocketMQ Go
	// client, it does not verify the servers' certificates.
	TLS bool

	// ConsumerOptions are added to the options of the push consumer, after the consumer's
	// own (name servers, group, instance, offset, order, credentials, TLS): for a namespace
	// and the like. An orderly consumer's own include the allocation strategy (the client's
	// default, AllocateByAveragely, through which the consumer follows the rebalances) and a
	// lock renewal of 1 s (consumer.WithRebalanceLockInterval): a strategy given here
	// replaces the consumer's, and with it the handing over of queues described at Orderly.
	ConsumerOptions []consumer.Option
}

// Consumer is a RocketMQ push consumer whose every delivery goes through an [Inbox]: a
// message's effect (the [Handler]) happens once in the inbox's consumer group, however
// often the message is delivered, and nothing is acknowledged before the handler's
// transaction has committed. Start starts it in the background (Run starts it and waits
// for its end), Stop stops it, and Close stops it for good:
//
//	c, err := inbox.NewConsumer(in, handle, inbox.ConsumerConfig{NameServers: ns, Topic: "ORDER_EVENT_TOPIC"})
//	if err := c.Start(ctx); err != nil {
//		return err
//	}
//	defer c.Close()
//
// A new group consumes the topic from its first message (ConsumeFromFirstOffset), so that
// events published before its first start are not missed; the inbox suppresses what was
// handled before.
//
// Each start makes a push consumer of its own: the RocketMQ client's cannot be started
// again once shut down. A consumer stopped by Stop may be started again; one closed may not.
type Consumer struct {
	in  *Inbox
	h   Handler
	cfg ConsumerConfig

	mu     sync.Mutex
	run    *run // the run in progress, its shutdown included; nil when none
	closed bool
}

// run is one start of a Consumer: its push consumer, and the deliveries in progress, which
// the shutdown lets finish before it shuts the push consumer down; the deliveries that
// begin after the shutdown started wait for the push consumer to be shut down (drained
// closed) and are left to the group's next consumer.
type run struct {
	push    rocketmq.PushConsumer
	started time.Time
	keeper  *queueKeeper // an orderly run's queue locks; nil when not orderly

	stopOnce  sync.Once
	stop      chan struct{} // closed when Stop or Close asks the run to end
	abortOnce sync.Once
	abort     chan struct{} // closed when the shutdown stops waiting for the deliveries
	handlers  context.Context
	cancel    context.CancelFunc // cancels handlers: every handler's context
	drained   chan struct{}      // closed once the push consumer is shut down
	done      chan struct{}      // closed once the run has ended

	mu       sync.Mutex
	draining bool
	inflight map[int64]int // deliveries in progress, by the goroutine running each
	idle     chan struct{} // closed once draining and no delivery is in progress
}

func newRun(push rocketmq.PushConsumer) *run {
	r := &run{push: push, started: time.Now(), stop: make(chan struct{}), abort: make(chan struct{}),
		drained: make(chan struct{}), done: make(chan struct{}), inflight: map[int64]int{}, idle: make(chan struct{})}
	r.handlers, r.cancel = context.WithCancel(context.Background())
	return r
}

// Defaults of the consumer.
const (
	stopTimeoutDefault = 30 * time.Second
	retryPauseDefault  = time.Second
)

// NewConsumer returns a consumer of cfg.Topic in the inbox's group that hands each message
// to h through in. It connects to nothing until Start.
func NewConsumer(in *Inbox, h Handler, cfg ConsumerConfig) (*Consumer, error) {
	switch {
	case in == nil:
		return nil, fmt.Errorf("%w: the inbox is nil", outbox.ErrInvalidConfig)
	case h == nil:
		return nil, fmt.Errorf("%w: the handler is nil", outbox.ErrInvalidConfig)
	case cfg.Topic == "":
		return nil, fmt.Errorf("%w: Topic is empty", outbox.ErrInvalidConfig)
	case len(cfg.NameServers) == 0:
		return nil, fmt.Errorf("%w: NameServers is empty", outbox.ErrInvalidConfig)
	case cfg.RetryPause < 0:
		return nil, fmt.Errorf("%w: RetryPause must not be negative, got %s", outbox.ErrInvalidConfig, cfg.RetryPause)
	case cfg.StopTimeout < 0:
		return nil, fmt.Errorf("%w: StopTimeout must not be negative, got %s", outbox.ErrInvalidConfig, cfg.StopTimeout)
	}
	if _, err := primitive.NewNamesrvAddr(cfg.NameServers...); err != nil {
		return nil, fmt.Errorf("%w: NameServers %v: %w", outbox.ErrInvalidConfig, cfg.NameServers, err)
	}
	cfg.Tags = cmp.Or(cfg.Tags, "*")
	cfg.RetryPause = cmp.Or(cfg.RetryPause, retryPauseDefault)
	cfg.StopTimeout = cmp.Or(cfg.StopTimeout, stopTimeoutDefault)
	if cfg.InstanceName == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		cfg.InstanceName = "inbox-" + hex.EncodeToString(b[:])
	}
	return &Consumer{in: in, h: h, cfg: cfg}, nil
}

// Start checks the inbox's tables, starts a push consumer and returns: the consumer
// consumes in the background until ctx is cancelled, Stop or Close is called. For a new
// group it first has the topic's brokers create the group's retry topic (by the group's
// heartbeat, sent ahead of the push consumer's), so that the RocketMQ client finds that topic
// at its start instead of warning that it does not exist. It returns its
// refusal: an error wrapping [outbox.ErrClosed] after Close, [outbox.ErrAlreadyRunning]
// while a run (or its shutdown) is in progress, [outbox.ErrInvalidConfig] when a table of
// the inbox is missing or lacks a column (a database that cannot be reached is logged, not
// refused: the deliveries fail and come again until it is back), and the client's error
// when the push consumer cannot start (the topic does not exist, say), naming the topic and
// the group. A consumer whose start failed, or that was stopped, may be started again.
//
// When ctx ends, the consumer stops as Close does: the deliveries in progress are given
// [ConsumerConfig.StopTimeout] to finish.
func (c *Consumer) Start(ctx context.Context) error {
	_, err := c.start(ctx)
	return err
}

// Run is Start that waits: it starts the consumer and returns once it has stopped (ctx
// ended, Stop or Close was called) and its shutdown is over, with nil; or Start's refusal.
// The blocking form for an errgroup:
//
//	g.Go(func() error { return c.Run(ctx) })
func (c *Consumer) Run(ctx context.Context) error {
	r, err := c.start(ctx)
	if err != nil {
		return err
	}
	<-r.done
	return nil
}

// Stop stops the consumer and waits for its shutdown: the deliveries in progress finish
// (their outcome is acknowledged, their handlers not interrupted), the push consumer is
// shut down, and the deliveries that arrived meanwhile are left unhandled, to be delivered
// again to the group's next consumer. If ctx ends first, Stop cancels the contexts of the
// handlers still running (their transactions roll back) and returns an error wrapping
// ctx.Err() that says how many deliveries were in progress: those messages are delivered
// again. The push consumer is then shut down in the background, without waiting for those
// handlers; a later Stop waits for that.
//
// Stop is safe to call more than once, concurrently, and on a consumer that does not run
// (it returns nil). Once it has returned nil, Start may be called again. Called from inside
// a handler, Stop begins the shutdown and returns without waiting: the shutdown waits for
// that handler, which has to return first.
func (c *Consumer) Stop(ctx context.Context) error {
	c.mu.Lock()
	r := c.run
	c.mu.Unlock()
	if r == nil {
		return nil
	}
	r.stopOnce.Do(func() { close(r.stop) })
	if r.runs(int64(goid.ID())) {
		return nil // from inside a handler: the shutdown waits for it, not it for the shutdown
	}
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		n := r.abandon()
		return fmt.Errorf("inbox: stop the consumer of %s in group %s: %w: %d deliveries in progress given up, to be delivered again",
			c.cfg.Topic, c.in.cfg.Group, ctx.Err(), n)
	}
}

// Close stops the consumer as Stop does, bounded by [ConsumerConfig.StopTimeout] (30 s by
// default), and for good: Start and Run then return [outbox.ErrClosed]. It returns Stop's
// error when the deliveries in progress did not finish in time. It is safe to call more than
// once (a later call waits for the shutdown again, as Stop does), and from inside a
// handler, where it does not wait.
func (c *Consumer) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.StopTimeout)
	defer cancel()
	return c.Stop(ctx)
}

// schemaCheckTimeout bounds Start's check of the inbox's tables.
const schemaCheckTimeout = 10 * time.Second

func (c *Consumer) start(ctx context.Context) (*run, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return nil, fmt.Errorf("inbox: start the consumer of %s: %w", c.cfg.Topic, outbox.ErrClosed)
	case c.run != nil:
		return nil, fmt.Errorf("inbox: start the consumer of %s: %w (Stop waits for the run to end)", c.cfg.Topic, outbox.ErrAlreadyRunning)
	}
	cctx, cancel := context.WithTimeout(ctx, schemaCheckTimeout)
	err := c.in.checkSchema(cctx)
	cancel()
	switch {
	case errors.Is(err, outbox.ErrInvalidConfig):
		return nil, err
	case err != nil:
		c.in.log.WarnContext(ctx, "inbox: could not check the inbox's tables; consuming anyway, deliveries fail and come again until the database answers",
			slog.Any("error", err))
	}
	opts := []consumer.Option{
		consumer.WithNameServer(c.cfg.NameServers),
		consumer.WithGroupName(c.in.cfg.Group),
		consumer.WithInstance(c.cfg.InstanceName),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
		consumer.WithConsumerOrder(c.cfg.Orderly),
		consumer.WithSuspendCurrentQueueTimeMillis(c.cfg.RetryPause),
		// So that the inbox, not the client's dead-letter queue, decides when a message is
		// given up: the client would otherwise move a message to %DLQ% after 16 failed
		// deliveries, acknowledged with no effect and no rejected row. Those are deliveries
		// the inbox could not reject either, because the database was down: an orderly
		// consumer retrying every RetryPause would reach 16 within seconds of an outage.
		consumer.WithMaxReconsumeTimes(maxReconsumeTimes),
	}
	if c.cfg.Credentials.AccessKey != "" {
		opts = append(opts, consumer.WithCredentials(c.cfg.Credentials))
	}
	if c.cfg.TLS {
		opts = append(opts, consumer.WithTls(true))
	}
	var keeper *queueKeeper
	if c.cfg.Orderly {
		keeper = newQueueKeeper(c.cfg.NameServers, c.lockClient(), c.in.log)
		opts = append(opts, consumer.WithStrategy(keeper.allocate), consumer.WithRebalanceLockInterval(lockRenewal))
	}
	push, err := rocketmq.NewPushConsumer(append(opts, c.cfg.ConsumerOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("inbox: create the push consumer: %w", err)
	}
	c.ensureRetryTopic(ctx, push)
	r := newRun(push)
	if keeper != nil {
		if rb, ok := push.(interface{ Rebalance() }); ok {
			keeper.rebalance = rb.Rebalance
		}
		r.keeper = keeper
	}
	consume := func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		return c.consume(ctx, r, msgs...)
	}
	err = push.Subscribe(c.cfg.Topic, consumer.MessageSelector{Type: consumer.TAG, Expression: c.cfg.Tags}, consume)
	if err != nil {
		return nil, fmt.Errorf("inbox: subscribe to %s: %w", c.cfg.Topic, err)
	}
	if err := push.Start(); err != nil {
		return nil, fmt.Errorf("inbox: start the consumer of %s in group %s (does the topic exist?): %w", c.cfg.Topic, c.in.cfg.Group, err)
	}
	r.started = time.Now()
	if keeper != nil {
		keeper.start()
	}
	c.run = r
	go c.serve(ctx, r)
	return r, nil
}

// serve waits for the end of a started run, then shuts it down.
func (c *Consumer) serve(ctx context.Context, r *run) {
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if c.in.cfg.Retention > 0 {
		wg.Go(func() { c.retain(rctx) })
	}
	var bound <-chan time.Time // the shutdown's own bound, when ctx ended it
	select {
	case <-ctx.Done():
		t := time.NewTimer(c.cfg.StopTimeout)
		defer t.Stop()
		bound = t.C
	case <-r.stop:
	}
	cancel()
	wg.Wait()
	c.shutdown(r, bound)
	c.mu.Lock()
	c.run = nil
	c.mu.Unlock()
	close(r.done)
}

// shutdownGrace is how long after its start a push consumer is shut down at the earliest:
// the client races with itself when a consumer is shut down while the rebalance its own
// registration set off still runs (rocketmq-client-go, internal/client.go: Shutdown and
// InvokeSync).
const shutdownGrace = 3 * time.Second

// shutdown lets the deliveries in progress finish while the push consumer still runs, so
// that their outcome is acknowledged (an orderly queue stays this consumer's while its
// handler runs), until the run is abandoned (Stop's context ended) or bound fires; then it
// shuts the push consumer down, and releases the deliveries that began meanwhile,
// unhandled. The client stores its offsets at shutdown, one way: one may be lost, and its
// messages come again to the next consumer, as duplicates. A delivery given up on is not
// acknowledged: the offset stored stays below it, and it comes again.
func (c *Consumer) shutdown(r *run, bound <-chan time.Time) {
	time.Sleep(time.Until(r.started.Add(shutdownGrace)))
	// Suspended first, so that no rebalance starts while the consumer shuts down: the
	// client's periodic rebalance, and the one it makes when the broker says the group's
	// members changed, skip a suspended consumer, where one running at Shutdown would fail
	// its calls on the client shut down under it. It also pulls no more; the deliveries in
	// progress finish as before.
	r.push.Suspend()
	r.mu.Lock()
	r.draining = true
	if len(r.inflight) == 0 {
		close(r.idle)
	}
	r.mu.Unlock()
	select {
	case <-r.idle:
	case <-r.abort:
	case <-bound:
		n := r.abandon()
		c.in.log.Warn("inbox: the consumer's context ended and deliveries in progress did not finish within StopTimeout; "+
			"their handlers' contexts are cancelled and the messages will be delivered again",
			slog.String("topic", c.cfg.Topic), slog.Int("deliveries", n), slog.Duration("stop_timeout", c.cfg.StopTimeout))
	}
	if r.keeper != nil {
		// The client unlocks its queues at the broker when it is shut down, and stores their
		// offsets after that: the offsets are stored first, so that the next owner of a queue
		// starts after the messages handled here.
		r.keeper.halt()
		if p, ok := r.push.(interface{ PersistConsumerOffset() error }); ok {
			_ = p.PersistConsumerOffset()
		}
	}
	clientlog.ConsumerShutDown() // the pull it leaves in flight ends quietly
	_ = r.push.Shutdown()
	if r.keeper != nil {
		r.keeper.releaseAll()
	}
	close(r.drained)
	r.cancel() // no handler runs any more but those given up on, whose contexts are cancelled
}

// abandon stops the shutdown's wait for the deliveries in progress and cancels their
// handlers' contexts; it returns how many there were.
func (r *run) abandon() int {
	r.abortOnce.Do(func() {
		close(r.abort)
		r.cancel()
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, k := range r.inflight {
		n += k
	}
	return n
}

// enter counts a delivery in on goroutine g, unless the run is shutting down.
func (r *run) enter(g int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.draining {
		return false
	}
	r.inflight[g]++
	return true
}

// exit counts out a delivery that enter counted in.
func (r *run) exit(g int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inflight[g]--; r.inflight[g] == 0 {
		delete(r.inflight, g)
	}
	if r.draining && len(r.inflight) == 0 {
		close(r.idle)
	}
}

// runs reports whether goroutine g is running a delivery of r: a Stop or Close called from
// a handler.
func (r *run) runs(g int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inflight[g] > 0
}

// retain purges the inbox rows older than Config.Retention every RetentionInterval, the
// first time at once, until ctx is done. A purge another instance is running is theirs to
// do: the next interval tries again, quietly.
func (c *Consumer) retain(ctx context.Context) {
	every.Loop(ctx, func() time.Duration {
		start := time.Now()
		n, err := c.in.Purge(ctx, c.in.cfg.Retention, retentionPause)
		switch {
		case errors.Is(err, outbox.ErrPurgeBusy):
			c.in.log.DebugContext(ctx, "inbox: another instance purges the inbox table; trying again next interval")
		case err != nil && ctx.Err() == nil:
			c.in.log.WarnContext(ctx, "inbox: retention purge failed; trying again next interval",
				slog.Any("error", err), slog.Int64("deleted", n))
		case n > 0:
			c.in.log.InfoContext(ctx, "inbox: retention purged old inbox rows", slog.Int64("deleted", n),
				slog.Duration("older_than", c.in.cfg.Retention), slog.Duration("took", time.Since(start)))
		}
		return c.in.cfg.RetentionInterval
	})
}

// retentionPause is the pause between two retention DELETEs.
const retentionPause = 100 * time.Millisecond

// maxReconsumeTimes is the client's MaxReconsumeTimes: never reached in practice (the
// broker's retry delays stop growing at 2 hours, so it is thousands of years away).
const maxReconsumeTimes = math.MaxInt32 / 2

// lockClient makes the consumer's own requests to the name servers and brokers, signed and
// over TLS as the push consumer's.
func (c *Consumer) lockClient() rmqlock.Client {
	return rmqlock.Client{Credentials: c.cfg.Credentials, TLS: c.cfg.TLS}
}

// consume is r's push consumer's callback: each message through the inbox, and the batch
// acknowledged only once every message of it is handled, a duplicate or rejected. The
// handlers' context is cancelled when the run gives up on them.
func (c *Consumer) consume(ctx context.Context, r *run, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
	g := int64(goid.ID())
	if !r.enter(g) {
		// Shutting down: once the push consumer is shut down, the queue this came from is
		// dropped, and whatever this returns is ignored; the message is not acknowledged.
		<-r.drained
		return c.again(ctx), nil
	}
	defer r.exit(g)
	if r.keeper != nil {
		if octx, ok := primitive.GetOrderlyCtx(ctx); ok {
			if !r.keeper.enter(octx.MQ) {
				// A rebalance has given the queue to another consumer, and the client has not
				// dropped it yet: handled here, it could be handled there at the same time.
				// The client counts the refusal as a delivery, which it is not.
				for _, m := range msgs {
					m.ReconsumeTimes--
				}
				octx.SuspendCurrentQueueTimeMillis = int(refusedPause / time.Millisecond)
				return consumer.SuspendCurrentQueueAMoment, nil
			}
			defer r.keeper.exit(octx.MQ)
		}
	}
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(r.handlers, cancel)()
	for _, m := range msgs {
		msg := messageOf(m)
		if _, err := c.in.Handle(hctx, msg, c.h); err != nil {
			return c.again(ctx), nil
		}
	}
	return consumer.ConsumeSuccess, nil
}

// refusedPause is how long the client waits after a delivery of a queue given up is
// refused; the client drops the queue meanwhile.
const refusedPause = 100 * time.Millisecond

// again is the answer that has a delivery come again.
func (c *Consumer) again(ctx context.Context) consumer.ConsumeResult {
	if !c.cfg.Orderly {
		return consumer.ConsumeRetryLater
	}
	// The client pauses the queue for the time in the call's orderly context, which it
	// leaves at none whatever the options say: without it the message would come again at
	// once, in a busy loop.
	if octx, ok := primitive.GetOrderlyCtx(ctx); ok {
		octx.SuspendCurrentQueueTimeMillis = int(c.cfg.RetryPause / time.Millisecond)
	}
	return consumer.SuspendCurrentQueueAMoment
}

// messageOf is the Message of a delivery.
func messageOf(m *primitive.MessageExt) *Message {
	props := make(map[string]string, len(m.GetProperties()))
	for k, v := range m.GetProperties() {
		props[k] = v
	}
	return &Message{
		EventID:    m.GetProperty(outbox.PropertyEventID),
		EventType:  m.GetProperty(outbox.PropertyEventType),
		BizNo:      m.GetProperty(outbox.PropertyBizNo),
		Body:       m.Body,
		Properties: props,
		Topic:      m.Topic,
		MsgID:      m.MsgId,
		Deliveries: int(m.ReconsumeTimes) + 1,
		BornAt:     time.UnixMilli(m.BornTimestamp),
	}
}
