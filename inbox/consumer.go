package inbox

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/go-outbox/outbox"
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
	Orderly bool

	// RetryPause is how long an orderly queue waits before delivering a failed message
	// again. Defaults to 1 second.
	RetryPause time.Duration

	// InstanceName tells apart consumers in one process. Defaults to a random name.
	InstanceName string

	// ConsumerOptions are added to the options of the push consumer, after the consumer's
	// own (name servers, group, instance, offset, order): for credentials, a namespace and
	// the like.
	ConsumerOptions []consumer.Option
}

// Consumer is a RocketMQ push consumer whose every delivery goes through an [Inbox]: a
// message's effect (the [Handler]) happens once in the inbox's consumer group, however
// often the message is delivered, and nothing is acknowledged before the handler's
// transaction has committed. Start (or Run, which blocks) starts it; Close stops it:
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
type Consumer struct {
	in  *Inbox
	h   Handler
	cfg ConsumerConfig

	mu      sync.Mutex
	push    rocketmq.PushConsumer
	started time.Time
	stop    chan struct{}
	done    chan struct{}
	closed  bool

	// The deliveries in progress, which the shutdown lets finish before it shuts the push
	// consumer down; the deliveries that begin after it started wait for the push consumer
	// to be shut down (drained closed) and are left to the group's next consumer.
	flightMu sync.Mutex
	draining bool
	inflight sync.WaitGroup
	drained  chan struct{}
}

// NewConsumer returns a consumer of cfg.Topic in the inbox's group that hands each message
// to h through in. It connects to nothing until Run.
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
	}
	if _, err := primitive.NewNamesrvAddr(cfg.NameServers...); err != nil {
		return nil, fmt.Errorf("%w: NameServers %v: %v", outbox.ErrInvalidConfig, cfg.NameServers, err)
	}
	cfg.Tags = cmp.Or(cfg.Tags, "*")
	cfg.RetryPause = cmp.Or(cfg.RetryPause, time.Second)
	if cfg.InstanceName == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		cfg.InstanceName = "inbox-" + hex.EncodeToString(b[:])
	}
	return &Consumer{in: in, h: h, cfg: cfg, stop: make(chan struct{}), drained: make(chan struct{})}, nil
}

// Start starts the consumer and returns: it consumes in the background until ctx is
// cancelled or Close is called. A consumer that cannot start (the topic does not exist,
// say) returns the error at once, and may be started again; one that has run cannot. Use
// Start where the caller must know that consuming began:
//
//	if err := c.Start(ctx); err != nil {
//		return err
//	}
//	defer c.Close()
func (c *Consumer) Start(ctx context.Context) error {
	if err := c.start(); err != nil {
		return err
	}
	go c.serve(ctx)
	return nil
}

// Run is Start that blocks: it starts the consumer and consumes until ctx is cancelled or
// Close is called; then it lets the deliveries in progress finish (their handlers are not
// interrupted: a handler that never returns holds Run and Close), shuts the push consumer
// down, and returns nil. A delivery that arrives once the shutdown has begun is not
// handled: it is delivered again, to this group's next consumer. A consumer that cannot
// start returns the error, as Start does.
func (c *Consumer) Run(ctx context.Context) error {
	if err := c.start(); err != nil {
		return err
	}
	c.serve(ctx)
	return nil
}

// serve waits for the end of a started consumer, then shuts it down.
func (c *Consumer) serve(ctx context.Context) {
	defer close(c.done)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if c.in.cfg.Retention > 0 {
		wg.Go(func() { c.retain(ctx) })
	}
	select {
	case <-ctx.Done():
	case <-c.stop:
	}
	cancel()
	wg.Wait()
	c.shutdown()
}

// retain purges the inbox rows older than Config.Retention every RetentionInterval, the
// first time at once, until ctx is done.
func (c *Consumer) retain(ctx context.Context) {
	for {
		start := time.Now()
		n, err := c.in.Purge(ctx, c.in.cfg.Retention, retentionPause)
		switch {
		case err != nil && ctx.Err() == nil:
			c.in.log.WarnContext(ctx, "inbox: retention purge failed; trying again next interval",
				slog.Any("error", err), slog.Int64("deleted", n))
		case n > 0:
			c.in.log.InfoContext(ctx, "inbox: retention purged old inbox rows", slog.Int64("deleted", n),
				slog.Duration("older_than", c.in.cfg.Retention), slog.Duration("took", time.Since(start)))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(c.in.cfg.RetentionInterval):
		}
	}
}

// retentionPause is the pause between two retention DELETEs.
const retentionPause = 100 * time.Millisecond

func (c *Consumer) start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return fmt.Errorf("%w: the consumer was closed", outbox.ErrClosed)
	case c.push != nil:
		return fmt.Errorf("inbox: the consumer is running or has run: a Consumer runs once")
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
	push, err := rocketmq.NewPushConsumer(append(opts, c.cfg.ConsumerOptions...)...)
	if err != nil {
		return fmt.Errorf("inbox: create the push consumer: %w", err)
	}
	err = push.Subscribe(c.cfg.Topic, consumer.MessageSelector{Type: consumer.TAG, Expression: c.cfg.Tags}, c.consume)
	if err != nil {
		return fmt.Errorf("inbox: subscribe to %s: %w", c.cfg.Topic, err)
	}
	if err := push.Start(); err != nil {
		return fmt.Errorf("inbox: start the consumer of %s in group %s (does the topic exist?): %w", c.cfg.Topic, c.in.cfg.Group, err)
	}
	c.push, c.started, c.done = push, time.Now(), make(chan struct{})
	return nil
}

// maxReconsumeTimes is the client's MaxReconsumeTimes: never reached in practice (the broker's
// retry delays stop growing at 2 hours).
const maxReconsumeTimes = math.MaxInt32 / 2

// consume is the push consumer's callback: each message through the inbox, and the batch
// acknowledged only once every message of it is handled, a duplicate or rejected.
func (c *Consumer) consume(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
	if !c.enter() {
		// Shutting down: once the push consumer is shut down, the queue this came from is
		// dropped, and whatever this returns is ignored; the message is not acknowledged.
		<-c.drained
		return c.again(ctx), nil
	}
	defer c.inflight.Done()
	for _, m := range msgs {
		msg := messageOf(m)
		if _, err := c.in.Handle(ctx, msg, c.h); err != nil {
			return c.again(ctx), nil
		}
	}
	return consumer.ConsumeSuccess, nil
}

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

// enter counts a delivery in, unless the consumer is shutting down.
func (c *Consumer) enter() bool {
	c.flightMu.Lock()
	defer c.flightMu.Unlock()
	if c.draining {
		return false
	}
	c.inflight.Add(1)
	return true
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

// shutdownGrace is how long after its start a consumer is shut down at the earliest: the
// client races with itself when a consumer is shut down while the rebalance its own
// registration set off still runs (rocketmq-client-go, internal/client.go: Shutdown and
// InvokeSync).
const shutdownGrace = 3 * time.Second

// shutdown lets the deliveries in progress finish while the push consumer still runs, so
// that their outcome is acknowledged (an orderly queue stays this consumer's while its
// handler runs), then shuts the push consumer down, and then releases the deliveries that
// began meanwhile, unhandled. (The client stores its offsets at shutdown one way: one may
// be lost, and its messages come again to the next consumer, as duplicates.)
func (c *Consumer) shutdown() {
	c.mu.Lock()
	push, started := c.push, c.started
	c.mu.Unlock()
	time.Sleep(time.Until(started.Add(shutdownGrace)))
	c.flightMu.Lock()
	c.draining = true
	c.flightMu.Unlock()
	c.inflight.Wait()
	_ = push.Shutdown()
	close(c.drained)
}

// Close stops a running Run and waits for it to return, its deliveries in progress finished;
// it is safe to call more than once, and without Run.
func (c *Consumer) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	running, done := c.push != nil, c.done
	c.mu.Unlock()
	close(c.stop)
	if running {
		<-done
	}
	return nil
}
