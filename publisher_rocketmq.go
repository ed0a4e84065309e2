package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/admin"
	rmqerrors "github.com/apache/rocketmq-client-go/v2/errors"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/apache/rocketmq-client-go/v2/rlog"

	"github.com/go-outbox/outbox/internal/clientlog"
)

const (
	// topicDefault is a store's default topic when its [Routes.Topic] is empty.
	topicDefault = "ORDER_EVENT_TOPIC"
	// producerGroupDefault is the sender's producer group unless RocketMQConfig.GroupName says otherwise.
	producerGroupDefault = "outbox_publisher"
	// sendAttemptsDefault is how many times the client tries one send, across brokers.
	sendAttemptsDefault = 3
	// maxBatchBytesDefault is the encoded size one batch send stays under.
	maxBatchBytesDefault = 1 << 20
	// maxBatchMessages bounds the messages of one batch send.
	maxBatchMessages = 1000

	// Message properties set on every event, for consumers to deduplicate and route on.
	PropertyEventID   = "eventId"
	PropertyEventType = "eventType"
	PropertyBizNo     = "bizNo"
)

// The broker's response codes that decide how a failed send is classified (RocketMQ's
// ResponseCode; the client returns them as "CODE: n, DESC: ..." errors).
const (
	codeSystemError         = 1  // SYSTEM_ERROR: mostly the broker's own trouble (see classifySendError)
	codeSystemBusy          = 2  // SYSTEM_BUSY: flow control, a full send queue
	codeMessageIllegal      = 13 // MESSAGE_ILLEGAL: body over maxMessageSize, properties over 32 KB
	codeServiceNotAvailable = 14 // SERVICE_NOT_AVAILABLE: disk full, store shut down, a slave
	codeNoPermission        = 16 // NO_PERMISSION: broker or topic not writable, ACL refusal
	codeTopicNotExist       = 17 // TOPIC_NOT_EXIST: not on this broker, auto-create off
)

// RocketMQConfig configures a [RocketMQSender].
type RocketMQConfig struct {
	// NameServers are the name server addresses, e.g. ["127.0.0.1:9876"]. Required.
	NameServers []string

	// GroupName is the producer group. Defaults to "outbox_publisher".
	GroupName string

	// InstanceName tells apart producers in one process (the client shares one connection
	// per process and instance name, and refuses a second producer of the same group on
	// it). Defaults to a random name per sender.
	InstanceName string

	// SendTimeout bounds one Send, the client's own retries included. Each attempt gets
	// SendTimeout / SendAttempts. Defaults to 3 seconds. A [Publisher] given this sender
	// bounds its sends by it ([SenderInfo.SendTimeout]), so the value is typed once;
	// NewPublisher refuses a [Tuning.SendTimeout] that differs from it. One wait escapes it, in the client: until a topic's route is
	// known, each attempt asks the name server with the client's fixed 6 s timeout, so a
	// name server that accepts connections and never answers holds a send 6 s per attempt.
	SendTimeout time.Duration

	// SendAttempts is how many times the client tries one send before giving up. Between
	// tries it moves to a queue of another broker, which is what carries sends over to the
	// surviving brokers of a cluster when one dies: with 1 there is no failover, and every
	// send that picks the dead broker's queues fails until the client's route refresh (every
	// 30 s) drops it. Defaults to 3.
	SendAttempts int

	// MaxBatchBytes bounds the encoded size of one batch send (the broker refuses a batch over
	// its 4 MiB message limit whole). Defaults to 1 MiB.
	MaxBatchBytes int

	// ProducerOptions are added to the options of the producer the sender builds, after its
	// own (name servers, group, instance name, retries, timeout, queue selector): for
	// credentials (producer.WithCredentials), a namespace, a trace dispatcher and the like.
	// An option that sets the queue selector replaces the one key order needs.
	ProducerOptions []producer.Option

	// CloudEventsSource, if set, makes every message a CloudEvent in binary content mode as
	// well, by the RocketMQ binding of CloudEvents (see docs/cloudevents.md): the user
	// properties CE_specversion ("1.0"), CE_id (the event id), CE_source (this value),
	// CE_type (the event type), CE_time (the event's create_time, RFC 3339 in UTC) and
	// CE_contenttype (CloudEventsContentType), beside the usual ones, which stay. It must be
	// a URI-reference (RFC 3986), e.g. "/order-service" or "urn:example:order-service", of
	// at most 1024 bytes. Defaults to "": no CloudEvents attributes.
	CloudEventsSource string

	// CloudEventsContentType is the CloudEvents datacontenttype of every event: the media
	// type of the payloads (RFC 2046, at most 1024 bytes), never a CloudEvents event format
	// (application/cloudevents...), which marks the structured content mode. Only with
	// CloudEventsSource. Defaults to "application/json".
	CloudEventsContentType string
}

// RocketMQSender is the [Sender] that publishes events to Apache RocketMQ with a synchronous
// send. The message body is the payload; its properties are eventId, eventType and bizNo
// (and traceparent and tracestate, for an event stored with a trace context); its key is
// the biz no (so a lookup by key finds it) and its tag the event type. With
// [RocketMQConfig.CloudEventsSource] the message is also a CloudEvent in binary content mode.
//
// A send succeeds only when the broker answers SEND_OK. A failed send's error says whose
// fault it is, decided from what rocketmq-client-go returns:
//
//	Permanent (dead-lettered at once): the broker refuses the message itself.
//	  - code 13 MESSAGE_ILLEGAL: body over the broker's maxMessageSize, properties over
//	    32 KB, and the like;
//	  - an empty payload, refused by the sender before any send: the broker fails a
//	    message without a body on every attempt; with CloudEvents on, an event without an
//	    event id or type, which a CloudEvent must have.
//	Unavailable (back to WAIT, no retry counted; the publisher pauses and probes): the
//	broker, its route or the way to it is down, and the same send works once it is back.
//	  - no route: "route info not found" (the name server does not answer, or the topic
//	    exists on no broker and the broker does not auto-create it);
//	  - the network: connection refused or reset, dial errors, EOF;
//	  - no answer within the attempt's timeout ("request timeout", a deadline exceeded);
//	    the attempts go to the other brokers of a cluster first, so this is what is left
//	    once none answered;
//	  - code 2 SYSTEM_BUSY, code 14 SERVICE_NOT_AVAILABLE (disk full, store shut down),
//	    code 16 NO_PERMISSION (broker or topic not writable, ACL), code 17 TOPIC_NOT_EXIST,
//	    and code 1 SYSTEM_ERROR when the broker says it is busy or short of in-sync replicas;
//	  - the sender is closed: [ErrClosed].
//	Stored, not confirmed ([ErrUnconfirmed]: sent, never sent again, counted in
//	outbox.events.unconfirmed): a status other than SEND_OK (FLUSH_DISK_TIMEOUT,
//	FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE). The broker has stored the message but not
//	yet flushed it or copied it to a replica; RocketMQ's Java client returns such a result
//	without an exception, and a resend would store it twice and make it no safer.
//	Anything else (retried with backoff, counted against [Config.MaxAttempts]): other codes.
//
// A timeout is not proof that nothing was stored: the broker may have written the message
// and its answer been lost. The next send then delivers it twice; consumers deduplicate on
// eventId.
//
// Close waits for the sends in flight and makes every later Send fail with
// [ErrClosed] without touching the producer, so a publisher still running never
// races the producer's shutdown.
type RocketMQSender struct {
	producer rocketmq.Producer
	names    []string // the name servers, for Check
	timeout  time.Duration
	maxBatch int
	owned    bool
	ce       *cloudEvents // nil: no CloudEvents attributes

	// selector is the queue selector of the producer: it sends a message with a queue set
	// to that queue, one with a sharding key to its key's queue, and others in turn. Nil
	// with a producer the sender did not build (tests), whose own selector chooses.
	selector *keyQueueSelector

	// mu orders the start of every send against Close: a send registers in inflight under
	// mu, and only while closed is false, so once Close has set closed it waits for exactly
	// the sends that started before it.
	mu        sync.Mutex
	closed    bool
	inflight  sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// NewRocketMQSender validates cfg, builds and starts a producer, which
// [RocketMQSender.Close] shuts down. Every error it returns wraps [ErrInvalidConfig]: a
// setting out of range, name servers that are not addresses, and a producer that cannot be
// created or started with these settings (its group already runs on the client instance of
// the same InstanceName in this process), each with the client's error wrapped beside it.
func NewRocketMQSender(cfg RocketMQConfig) (*RocketMQSender, error) {
	s, err := newRocketMQSender(cfg)
	if err != nil {
		return nil, err
	}
	if len(cfg.NameServers) == 0 {
		return nil, fmt.Errorf("%w: NameServers is empty", ErrInvalidConfig)
	}
	addrs, err := primitive.NewNamesrvAddr(cfg.NameServers...)
	if err != nil {
		return nil, fmt.Errorf("%w: NameServers %v: %w", ErrInvalidConfig, cfg.NameServers, err)
	}
	attempts := cmp.Or(cfg.SendAttempts, sendAttemptsDefault)
	group := cmp.Or(cfg.GroupName, producerGroupDefault)
	instance := cmp.Or(cfg.InstanceName, "outbox-"+randomSuffix())
	s.selector = newKeyQueueSelector()
	opts := []producer.Option{
		producer.WithNameServer(addrs),
		producer.WithGroupName(group),
		producer.WithInstanceName(instance),
		producer.WithRetry(attempts - 1),
		producer.WithSendMsgTimeout(s.timeout / time.Duration(attempts)),
		producer.WithQueueSelector(s.selector),
	}
	p, err := rocketmq.NewProducer(append(opts, cfg.ProducerOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("%w: could not create the RocketMQ producer with these settings (ProducerOptions?): %w", ErrInvalidConfig, err)
	}
	if err := p.Start(); err != nil {
		// The one way Start fails is a group already registered on the client instance
		// this producer shares with another (same InstanceName). Such a producer has
		// started nothing of its own, and its Shutdown would unregister the other
		// producer's group from the shared client and shut that client down under it: so
		// it is dropped, not shut down.
		return nil, fmt.Errorf("%w: start the RocketMQ producer of group %q as instance %q (give each sender its own InstanceName): %w",
			ErrInvalidConfig, group, instance, err)
	}
	s.producer, s.owned, s.names = p, true, slices.Clone(cfg.NameServers)
	return s, nil
}

// newRocketMQSender validates cfg and returns a sender without a producer.
func newRocketMQSender(cfg RocketMQConfig) (*RocketMQSender, error) {
	timeout := cmp.Or(cfg.SendTimeout, sendTimeoutDefault)
	attempts := cmp.Or(cfg.SendAttempts, sendAttemptsDefault)
	maxBatch := cmp.Or(cfg.MaxBatchBytes, maxBatchBytesDefault)
	switch {
	case maxBatch < 0 || maxBatch > 4<<20:
		return nil, fmt.Errorf("%w: MaxBatchBytes must be between 1 and 4 MiB (the broker's limit), got %d", ErrInvalidConfig, maxBatch)
	case timeout < minSendTimeout:
		return nil, fmt.Errorf("%w: SendTimeout must be at least %s, got %s", ErrInvalidConfig, minSendTimeout, timeout)
	case attempts < 0:
		return nil, fmt.Errorf("%w: SendAttempts must be positive, got %d", ErrInvalidConfig, attempts)
	}
	ce, err := newCloudEvents(cfg)
	if err != nil {
		return nil, err
	}
	return &RocketMQSender{timeout: timeout, maxBatch: maxBatch, ce: ce}, nil
}

// Info implements [Sender]: the send timeout the producer was built with
// ([RocketMQConfig.SendTimeout]), so the publisher bounds a send as the client does.
func (s *RocketMQSender) Info() SenderInfo {
	return SenderInfo{System: "rocketmq", SendTimeout: s.timeout}
}

// Check implements [Sender]: it asks the name servers for each topic's route, and refuses,
// naming them, the topics that have none where the cluster does not create topics on
// demand (no broker has the autoCreateTopicEnable's topic, TBW102): a send to them would
// wait for a topic that never comes. Where the cluster creates topics, every topic can be
// sent to, and only TBW102's route is read. A name server that does not answer is no
// refusal: the error is returned without [ErrInvalidConfig], and the publisher starts.
func (s *RocketMQSender) Check(ctx context.Context, topics []string) error {
	if len(topics) == 0 || len(s.names) == 0 {
		return nil
	}
	addrs, err := primitive.NewNamesrvAddr(s.names...)
	if err != nil {
		return fmt.Errorf("rocketmq: check topics: %w", err)
	}
	a, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver(addrs)))
	if err != nil {
		return fmt.Errorf("rocketmq: check topics: %w", err)
	}
	defer func() { _ = a.Close() }()
	routed := func(topic string) (bool, error) {
		_, err := a.FetchPublishMessageQueues(ctx, topic)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, rmqerrors.ErrTopicNotExist):
			return false, nil
		}
		return false, fmt.Errorf("rocketmq: check topics: read the route of %s from the name servers: %w", topic, err)
	}
	if ok, err := routed(autoCreateTopic); ok || err != nil {
		return err
	}
	var missing []string
	for _, t := range topics {
		ok, err := routed(t)
		if err != nil {
			return err
		}
		if !ok {
			missing = append(missing, t)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%w: no broker has topic %s, and the cluster does not create topics (autoCreateTopicEnable is off): create it (mqadmin updateTopic -t %s -c <cluster>)",
		ErrInvalidConfig, strings.Join(missing, ", "), missing[0])
}

// autoCreateTopic is the topic whose route a producer sends by when a topic has none: the
// brokers register it when they create topics on demand (autoCreateTopicEnable).
const autoCreateTopic = "TBW102"

// message returns the RocketMQ message for ev. Its eventId property is ev.EventID, the UUID
// stored with the event, never the row id: row ids repeat when the table is recreated or a
// backup restored, and between tables that publish to one topic. An event stored with a
// well-formed W3C trace context also carries it, as the traceparent and tracestate
// properties. In key order the biz no is the sharding key. With CloudEvents on, it carries
// the event's CloudEvents attributes too.
func (s *RocketMQSender) message(ev Event, keyOrder bool) *primitive.Message {
	msg := primitive.NewMessage(ev.Topic, ev.Payload)
	msg.WithProperty(PropertyEventID, ev.EventID)
	msg.WithProperty(PropertyEventType, ev.EventType)
	msg.WithProperty(PropertyBizNo, ev.BizNo)
	if parent, state := traceProperties(&ev); parent != "" {
		msg.WithProperty(PropertyTraceParent, parent)
		if state != "" {
			msg.WithProperty(PropertyTraceState, state)
		}
	}
	if s.ce != nil {
		s.ce.set(msg, &ev)
	}
	msg.WithKeys([]string{ev.BizNo})
	msg.WithTag(ev.EventType)
	if keyOrder {
		msg.WithShardingKey(ev.BizNo)
	}
	return msg
}

// RocketMQMessage returns the topic and the properties a sender built from cfg sends ev
// with ([NewRocketMQSender]): what a consumer of the event will see, for a person to look at
// before requeueing a dead letter. keyOrder is the store's ordering (an ordered store's
// events carry their biz no as the sharding key). It connects to nothing: cfg's NameServers
// are not needed. An event the sender would refuse (no topic, an empty payload) is the
// [Permanent] error its send fails with ([IsPermanent] reports it); a cfg
// NewRocketMQSender would refuse, an error wrapping [ErrInvalidConfig]. The properties include the client's own: KEYS (the
// biz no), TAGS (the event type) and, in key order, SHARDING_KEY.
func RocketMQMessage(cfg RocketMQConfig, ev Event, keyOrder bool) (topic string, properties map[string]string, err error) {
	s, err := newRocketMQSender(cfg)
	if err != nil {
		return "", nil, err
	}
	if err := s.refuse(&ev); err != nil {
		return "", nil, err
	}
	msg := s.message(ev, keyOrder)
	return msg.Topic, msg.GetProperties(), nil
}

// begin registers a send in flight, unless the sender is closed.
func (s *RocketMQSender) begin() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("rocketmq: %w", ErrClosed)
	}
	s.inflight.Add(1)
	return nil
}

// errNoTopic is the error of an event that names no topic: its store routes none.
var errNoTopic = Permanent(errors.New("rocketmq: the event names no topic"))

// errEmptyBody is the error of an event with no payload. RocketMQ's own Java client refuses
// an empty body, and the broker fails a single message without one (5.3.3 answers code 1,
// a NullPointerException), on every attempt.
var errEmptyBody = Permanent(errors.New("rocketmq: the payload is empty; RocketMQ does not accept a message without a body"))

// refuse returns why ev cannot be sent at all (a [Permanent] error), or nil: it names no
// topic, it has no payload, or, with CloudEvents on, no event id or type.
func (s *RocketMQSender) refuse(ev *Event) error {
	if ev.Topic == "" {
		return errNoTopic
	}
	if len(ev.Payload) == 0 {
		return errEmptyBody
	}
	if s.ce != nil {
		return s.ce.refuse(ev)
	}
	return nil
}

// sendOne sends one event alone, with the client's retries across brokers.
func (s *RocketMQSender) sendOne(ctx context.Context, ev Event, keyOrder bool) error {
	if err := s.refuse(&ev); err != nil {
		return err
	}
	res, err := s.producer.SendSync(ctx, s.message(ev, keyOrder))
	return sendOutcome("send", res, err)
}

// Send implements [Sender]. Each event goes to the topic it names ([Event.Topic], as its
// store routed it). One event is sent alone; a batch goes in as few sends as fit under
// MaxBatchBytes, each confirmed as a whole, all within one SendTimeout. The client takes a
// batch of one topic only, so a batch that spans topics goes in sends of each topic, the
// topics side by side. If the broker refuses a batch as illegal (one of its messages is),
// its events are sent one by one, so that only the illegal one fails. Events whose turn
// never comes (the deadline passed, or an earlier send to their topic found it
// unavailable: the broker down, or the topic missing) are not sent, and their errors say
// so: the publisher returns them to WAIT without counting an attempt. Messages of a batch
// carry no client message id: consumers deduplicate on the eventId property, as they
// should anyway.
//
// With keyOrder, every message carries its biz no as sharding key and goes to its key's
// queue of its topic: the FNV-1a hash of the biz no modulo the number of the topic's
// queues, the choice of the client's producer.NewHashQueueSelector, so that an orderly
// consumer (consumer.WithConsumerOrder(true)) receives a key's events in order. A batch is
// sent queue by queue (the queues in parallel), each biz no's events together and in the
// order given, and a biz no stops at its first failure: its answers are successes, then at
// most one failure, then [ErrNotSent]. (A biz no's events of two topics never meet in one
// call: [Dispatch] sends the next topic's once the first's are stored.) What it costs: one
// send per queue present in a batch, and no failover: the client's retries go to the same
// queue, so a biz no whose queue's broker is down waits (Unavailable) until the broker is
// back, also once the route has dropped the broker; a queue missing from the route for 10
// minutes is forgotten, and its biz nos move. Queues added to the topic move biz nos too:
// ordering holds while the topic's queues are stable, as with any RocketMQ ordered messages.
func (s *RocketMQSender) Send(ctx context.Context, evs []Event, keyOrder bool) []error {
	errs := make([]error, len(evs))
	if err := s.begin(); err != nil {
		fill(errs, err)
		return errs
	}
	defer s.inflight.Done()
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	switch {
	case len(evs) == 1:
		errs[0] = s.sendOne(ctx, evs[0], keyOrder)
		return errs
	case keyOrder:
		s.sendInKeyOrder(ctx, evs, errs)
		return errs
	}

	// The positions of the events to send, by topic: an event refused (no topic, no
	// payload) fails alone.
	var order []string
	byTopic := map[string][]int{}
	for i := range evs {
		if err := s.refuse(&evs[i]); err != nil {
			errs[i] = err
			continue
		}
		t := evs[i].Topic
		if _, ok := byTopic[t]; !ok {
			order = append(order, t)
		}
		byTopic[t] = append(byTopic[t], i)
	}
	if len(order) == 1 {
		s.sendTopic(ctx, evs, byTopic[order[0]], errs)
		return errs
	}
	// The client takes a batch of one topic: each topic's events go in their own batches,
	// the topics side by side, and a topic that fails fails its own events alone.
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxParallelQueueSends)
	for _, t := range order {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s.sendTopic(ctx, evs, byTopic[t], errs)
		})
	}
	wg.Wait()
	return errs
}

// sendTopic sends the events of evs at positions todo, all of one topic, in as few batch
// sends as fit under MaxBatchBytes, writing their errors to errs. It stops at a send that
// finds the topic unavailable: the rest of todo is not sent.
func (s *RocketMQSender) sendTopic(ctx context.Context, evs []Event, todo []int, errs []error) {
	var skip error // set once the rest of the topic's events are not to be sent
	for start := 0; start < len(todo); {
		end, size := start, 0
		for end < len(todo) && end-start < maxBatchMessages {
			n := s.messageSize(evs[todo[end]], false)
			if end > start && size+n > s.maxBatch {
				break
			}
			size += n
			end++
		}
		chunk := todo[start:end]
		start = end
		if skip == nil && ctx.Err() != nil {
			skip = errNotSent
		}
		if skip != nil {
			fillAt(errs, chunk, skip)
			continue
		}
		err := s.sendChunk(ctx, evs, chunk)
		if err != nil && IsPermanent(err) && len(chunk) > 1 {
			skip = s.sendOneByOne(ctx, evs, chunk, errs)
			continue
		}
		fillAt(errs, chunk, err)
		if isOutage(err) {
			skip = notSent(err)
		}
	}
}

// sendOneByOne sends the events of evs at positions chunk (a refused batch) one at a time,
// while the batch's deadline lasts and the broker answers, and returns why it stopped early
// (nil if it did not).
func (s *RocketMQSender) sendOneByOne(ctx context.Context, evs []Event, chunk []int, errs []error) error {
	for k, i := range chunk {
		if ctx.Err() != nil {
			fillAt(errs, chunk[k:], errNotSent)
			return errNotSent
		}
		errs[i] = s.sendOne(ctx, evs[i], false)
		if isOutage(errs[i]) {
			skip := notSent(errs[i])
			fillAt(errs, chunk[k+1:], skip)
			return skip
		}
	}
	return nil
}

// sendChunk sends the events of evs at positions chunk as one batch.
func (s *RocketMQSender) sendChunk(ctx context.Context, evs []Event, chunk []int) error {
	msgs := make([]*primitive.Message, len(chunk))
	for k, i := range chunk {
		msgs[k] = s.message(evs[i], false)
	}
	res, err := s.producer.SendSync(ctx, msgs...)
	return sendOutcome("batch send", res, err)
}

// sendOutcome turns SendSync's answer into the sender's error.
func sendOutcome(what string, res *primitive.SendResult, err error) error {
	if err != nil {
		return classifySendError(err)
	}
	if res.Status != primitive.SendOK {
		// The broker stored the message but could not flush it, or copy it to a slave, in
		// time. It is sent, as RocketMQ's own Java client takes it (SendResult, no
		// exception, and no retry unless retryAnotherBrokerWhenNotStoreOK): sending it again
		// would store it twice and make it no safer.
		return fmt.Errorf("rocketmq: %s stored, not confirmed: status %d (%s): %w", what, res.Status, sendStatusName(res.Status), ErrUnconfirmed)
	}
	return nil
}

// messageSize estimates an event's encoded size in a batch: body, properties, and the
// per-message header.
func (s *RocketMQSender) messageSize(ev Event, keyOrder bool) int {
	n := len(ev.Payload) + 2*len(ev.BizNo) + 2*len(ev.EventType) + len(ev.TraceParent) + len(ev.TraceState) + 20 + 128
	if keyOrder {
		n += len(ev.BizNo) + len(primitive.PropertyShardingKey) + 2
	}
	if s.ce != nil {
		n += s.ce.size(&ev)
	}
	return n
}

func fill(errs []error, err error) {
	for i := range errs {
		errs[i] = err
	}
}

// fillAt sets errs[i] to err for every i of at.
func fillAt(errs []error, at []int, err error) {
	for _, i := range at {
		errs[i] = err
	}
}

// Close stops the sender: every Send that starts after it returns an error
// wrapping [ErrClosed] and never reaches the producer; the sends already in flight
// are waited for (each is bounded by SendTimeout, see [RocketMQConfig.SendTimeout]); then
// the producer, which the sender built and owns, is shut down. It is safe to call more than
// once, and from several goroutines: every call returns once the sender is closed.
func (s *RocketMQSender) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.inflight.Wait()
		if s.owned {
			s.closeErr = s.producer.Shutdown()
		}
	})
	return s.closeErr
}

// brokerCodeRE reads the broker's response code and remark from the client's error text
// ("CODE: 13, DESC: ..." from the send path, "CODE: 13  DESC: ..." from its error types).
var brokerCodeRE = regexp.MustCompile(`CODE: (-?\d+),?\s+DESC: ([^\n]*)`)

// classifySendError marks a failed send as [Permanent], [Unavailable] or neither (see
// [RocketMQSender] for the table and why). The client has no error types for most of its
// failures: the send path returns broker refusals as "CODE: n, DESC: ..." text and a
// missing route as "... route info not found", so those are read from the text.
func classifySendError(err error) error {
	wrapped := fmt.Errorf("rocketmq: %w", err)
	if code, desc, ok := brokerCode(err); ok {
		switch {
		case code == codeMessageIllegal:
			return Permanent(wrapped)
		case code == codeSystemBusy, code == codeServiceNotAvailable, code == codeNoPermission,
			code == codeTopicNotExist:
			return Unavailable(wrapped)
		case code == codeSystemError && brokerInTrouble(desc):
			return Unavailable(wrapped)
		}
		return wrapped
	}
	switch {
	case errors.Is(err, rmqerrors.ErrNotRunning), errors.Is(err, rmqerrors.ErrService):
		// The producer is not started, or was shut down under the sender: nothing was sent,
		// and nothing will be through it.
		return fmt.Errorf("rocketmq: %w: the producer is not running: %w", ErrClosed, err)
	case unreachable(err):
		return Unavailable(wrapped)
	}
	return wrapped
}

// brokerCode returns the broker's response code and remark carried by err, if any.
func brokerCode(err error) (code int, desc string, ok bool) {
	var brokerErr primitive.MQBrokerErr
	if errors.As(err, &brokerErr) {
		return int(brokerErr.ResponseCode), brokerErr.ErrorMessage, true
	}
	m := brokerCodeRE.FindStringSubmatch(err.Error())
	if m == nil {
		return 0, "", false
	}
	code, convErr := strconv.Atoi(m[1])
	return code, m[2], convErr == nil
}

// brokerInTrouble reports whether a SYSTEM_ERROR remark is about the broker rather than the
// message: page cache busy ("[PC_SYNCHRONIZED]broker busy"), "create mapped file failed,
// server is busy or broken", "in-sync replicas not enough".
func brokerInTrouble(desc string) bool {
	desc = strings.ToLower(desc)
	return strings.Contains(desc, "busy") || strings.Contains(desc, "in-sync replicas")
}

// unreachable reports whether err says that the broker or the name server could not be
// reached, or did not answer in time.
func unreachable(err error) bool {
	var netErr net.Error
	switch {
	case errors.As(err, &netErr), // dial errors, refused and reset connections, i/o timeouts
		errors.Is(err, rmqerrors.ErrRequestTimeout), // no answer within the attempt's timeout
		errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, rmqerrors.ErrTopicNotExist), errors.Is(err, rmqerrors.ErrRouteNotFound),
		errors.Is(err, rmqerrors.ErrBrokerNotFound), errors.Is(err, rmqerrors.ErrNoNameserver):
		return true
	}
	var remotingErr *primitive.RemotingErr
	return errors.As(err, &remotingErr) || strings.Contains(err.Error(), "route info not found")
}

func sendStatusName(s primitive.SendStatus) string {
	switch s {
	case primitive.SendFlushDiskTimeout:
		return "FLUSH_DISK_TIMEOUT"
	case primitive.SendFlushSlaveTimeout:
		return "FLUSH_SLAVE_TIMEOUT"
	case primitive.SendSlaveNotAvailable:
		return "SLAVE_NOT_AVAILABLE"
	default:
		return "UNKNOWN"
	}
}

// clientLogs is where the RocketMQ client's logs go once [RouteRocketMQClientLogs] has
// installed rlogAdapter as the client's logger.
var clientLogs atomic.Pointer[slog.Logger]

// routeOnce installs rlogAdapter as the client's logger, once: the client reads its logger
// without synchronisation, so it is written once and the destination changed through
// clientLogs from then on.
var routeOnce sync.Once

// RouteRocketMQClientLogs sends the logs of every RocketMQ client in the process (this
// package's senders, and the service's own producers and consumers) to l: the client's
// errors and warnings at their level, its routine chatter (route updates, rebalances, and
// the warning that a consumer's queue was dropped with a delivery in progress, which a
// clean shutdown logs: that message comes again; and the end of the pull an inbox
// consumer's shutdown leaves in flight, which times out up to 30 s after it, and a
// rebalance that shutdown cuts short) at debug. A nil l discards them.
//
// The RocketMQ client has one logger for the whole process, so this is a process-wide
// choice, and it is the caller's: importing this package leaves the client's logger alone
// (its default writes to stderr, at the level of ROCKETMQ_GO_LOG_LEVEL). Call it at start-up,
// before any RocketMQ producer or consumer exists: the client reads its logger without
// synchronisation, so the first call must not race a running client. Later calls only change
// where the logs go, and are safe at any time. Nothing else in this module calls it: making
// a sender, a publisher or a consumer leaves the client's logger as it is.
func RouteRocketMQClientLogs(l *slog.Logger) {
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	clientLogs.Store(l)
	routeOnce.Do(func() { rlog.SetLogger(rlogAdapter{}) })
}

// rlogAdapter routes the RocketMQ client's logs into slog. The client logs routine events
// (route updates, rebalances) at info; those go to debug here.
type rlogAdapter struct{}

func (rlogAdapter) log(level slog.Level, msg string, fields map[string]any) {
	ctx := context.Background()
	l := clientLogs.Load()
	if !l.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, len(fields)+1)
	attrs = append(attrs, slog.String("component", "rocketmq-client"))
	for k, v := range fields {
		attrs = append(attrs, slog.Any(k, v))
	}
	l.LogAttrs(ctx, level, msg, attrs...)
}

func (a rlogAdapter) Debug(msg string, fields map[string]any) { a.log(slog.LevelDebug, msg, fields) }
func (a rlogAdapter) Info(msg string, fields map[string]any)  { a.log(slog.LevelDebug, msg, fields) }
func (a rlogAdapter) Warning(msg string, fields map[string]any) {
	level := slog.LevelWarn
	if routineClientWarnings[msg] || clientlog.ShutdownNoise(msg, fields, time.Now()) {
		level = slog.LevelDebug
	}
	a.log(level, msg, fields)
}

func (a rlogAdapter) Error(msg string, fields map[string]any) {
	level := slog.LevelError
	if clientlog.InterruptedRebalance(msg, fields, time.Now()) {
		level = slog.LevelDebug // the client logs a rebalance's failed calls as errors
	}
	a.log(level, msg, fields)
}
func (a rlogAdapter) Fatal(msg string, fields map[string]any) { a.log(slog.LevelError, msg, fields) }
func (a rlogAdapter) Level(string)                            {}
func (a rlogAdapter) OutputPath(string) error                 { return nil }

// routineClientWarnings are warnings the RocketMQ client logs on a clean shutdown or a
// rebalance, which are routine and need no one: they go to debug.
var routineClientWarnings = map[string]bool{
	// A consumer's queue was dropped (the consumer shut down, or a rebalance gave the queue
	// to another) while a delivery of it was being handled: its result is not recorded, and
	// the message is delivered again, from the queue's stored offset, to whoever has the
	// queue next (an inbox suppresses the duplicate).
	"processQueue is dropped without process consume result.": true,
}

// Besides those, the end of a pull that an inbox consumer's shutdown left in flight: the
// client shuts down with a long-polling pull outstanding, which then times out (up to 30 s
// later) or finds its connection closed, and warns "pull message from broker error". Within
// 35 s of such a shutdown in this process, that warning with that cause goes to debug
// (internal/clientlog); at any other time, or with any other cause, it stays a warning. So
// does a rebalance the shutdown cuts short, which the client logs as warnings and errors: a
// call it makes on the client shut down under it (its error: "service close is not
// running"), and, within 10 s of a shutdown, a call the shutdown left unanswered (a request
// timeout) and what the rebalance then could not do.
