package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/apache/rocketmq-client-go/v2/rlog"
)

const (
	// TopicDefault is the topic events go to unless [RocketMQConfig.Topic] says otherwise.
	TopicDefault = "ORDER_EVENT_TOPIC"
	// ProducerGroupDefault is the producer group of a sender that builds its own producer.
	ProducerGroupDefault = "outbox_publisher"
	// SendAttemptsDefault is how many times the client tries one send, across brokers.
	SendAttemptsDefault = 3
	// MaxBatchBytesDefault is the encoded size one batch send stays under.
	MaxBatchBytesDefault = 1 << 20
	// maxBatchMessages bounds the messages of one batch send.
	maxBatchMessages = 1000

	// Message properties set on every event, for consumers to deduplicate and route on.
	PropertyEventID   = "eventId"
	PropertyEventType = "eventType"
	PropertyBizNo     = "bizNo"

	// RocketMQ's response code for a message the broker will never accept (too large, bad
	// properties): retrying cannot help.
	codeMessageIllegal = 13
)

// topicRE is the broker's rule for topic names.
var topicRE = regexp.MustCompile(`^[%|a-zA-Z0-9_-]{1,127}$`)

// RocketMQConfig configures a [RocketMQSender].
type RocketMQConfig struct {
	// NameServers are the name server addresses, e.g. ["127.0.0.1:9876"]. Required unless
	// Producer is set.
	NameServers []string

	// Topic is where events are sent. Defaults to "ORDER_EVENT_TOPIC".
	Topic string

	// GroupName is the producer group. Defaults to "outbox_publisher".
	GroupName string

	// InstanceName tells apart producers in one process (the client shares one connection
	// per process and instance name). Defaults to a random name per sender.
	InstanceName string

	// SendTimeout bounds one Send, the client's own retries included; keep it equal to the
	// publisher's [Config.SendTimeout]. Each attempt gets SendTimeout / SendAttempts.
	// Defaults to 3 seconds.
	SendTimeout time.Duration

	// SendAttempts is how many times the client tries one send before giving up (it moves
	// to another broker between tries). Defaults to 3.
	SendAttempts int

	// MaxBatchBytes bounds the encoded size of one batch send (the broker refuses a batch over
	// its 4 MiB message limit whole). Defaults to 1 MiB.
	MaxBatchBytes int

	// Producer, if set, is a started producer the caller built and owns: the sender uses it
	// and never shuts it down, and the fields above but Topic are ignored.
	Producer rocketmq.Producer

	// Logger receives the RocketMQ client's own logs: its errors and warnings at their level,
	// its chatter at debug. The client's logger is process-wide, so the last sender made
	// with a Logger decides where they go. Until then they are discarded: importing this
	// package stops the client from writing to stderr on its own.
	Logger *slog.Logger
}

// RocketMQSender is the [Sender] that publishes events to Apache RocketMQ with a synchronous
// send. The message body is the payload; its properties are eventId, eventType and bizNo;
// its key is the biz no (so a lookup by key finds it) and its tag the event type.
//
// A send succeeds only when the broker answers SEND_OK. A message the broker will never
// accept (code 13: too large, illegal properties) fails with a [Permanent] error, which
// dead-letters the event at once; anything else (a timeout, a busy broker, no route yet) is
// retried with the publisher's backoff.
type RocketMQSender struct {
	producer  rocketmq.Producer
	topic     string
	timeout   time.Duration
	maxBatch  int
	owned     bool
	closeOnce sync.Once
	closeErr  error
}

// NewRocketMQSender validates cfg and, unless cfg.Producer is set, builds and starts a
// producer of its own, which [RocketMQSender.Close] shuts down.
func NewRocketMQSender(cfg RocketMQConfig) (*RocketMQSender, error) {
	topic := cmp.Or(cfg.Topic, TopicDefault)
	if !topicRE.MatchString(topic) {
		return nil, fmt.Errorf("%w: topic %q must be 1 to 127 letters, digits, '_', '-', '%%' or '|'", ErrInvalidConfig, topic)
	}
	timeout := cmp.Or(cfg.SendTimeout, SendTimeoutDefault)
	attempts := cmp.Or(cfg.SendAttempts, SendAttemptsDefault)
	maxBatch := cmp.Or(cfg.MaxBatchBytes, MaxBatchBytesDefault)
	switch {
	case maxBatch < 0 || maxBatch > 4<<20:
		return nil, fmt.Errorf("%w: MaxBatchBytes must be between 1 and 4 MiB (the broker's limit), got %d", ErrInvalidConfig, maxBatch)
	case timeout < 0:
		return nil, fmt.Errorf("%w: SendTimeout must be positive, got %s", ErrInvalidConfig, timeout)
	case attempts < 0:
		return nil, fmt.Errorf("%w: SendAttempts must be positive, got %d", ErrInvalidConfig, attempts)
	}
	if cfg.Logger != nil {
		clientLogs.Store(cfg.Logger)
	}

	s := &RocketMQSender{producer: cfg.Producer, topic: topic, timeout: timeout, maxBatch: maxBatch}
	if s.producer != nil {
		return s, nil
	}
	if len(cfg.NameServers) == 0 {
		return nil, fmt.Errorf("%w: NameServers is empty and no Producer is given", ErrInvalidConfig)
	}
	addrs, err := primitive.NewNamesrvAddr(cfg.NameServers...)
	if err != nil {
		return nil, fmt.Errorf("%w: NameServers %v: %v", ErrInvalidConfig, cfg.NameServers, err)
	}
	p, err := rocketmq.NewProducer(
		producer.WithNameServer(addrs),
		producer.WithGroupName(cmp.Or(cfg.GroupName, ProducerGroupDefault)),
		producer.WithInstanceName(cmp.Or(cfg.InstanceName, "outbox-"+randomSuffix())),
		producer.WithRetry(attempts-1),
		producer.WithSendMsgTimeout(timeout/time.Duration(attempts)),
	)
	if err != nil {
		return nil, fmt.Errorf("outbox: could not create RocketMQ producer: %w", err)
	}
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("outbox: could not start RocketMQ producer: %w", err)
	}
	s.producer, s.owned = p, true
	return s, nil
}

// Topic is where the sender sends.
func (s *RocketMQSender) Topic() string { return s.topic }

// Message returns the RocketMQ message for ev. Its eventId property is ev.EventID, the UUID
// stored with the event, never the row id: row ids repeat when the table is recreated or a
// backup restored, and between tables that publish to one topic.
func (s *RocketMQSender) Message(ev Event) *primitive.Message {
	msg := primitive.NewMessage(s.topic, ev.Payload)
	msg.WithProperty(PropertyEventID, ev.EventID)
	msg.WithProperty(PropertyEventType, ev.EventType)
	msg.WithProperty(PropertyBizNo, ev.BizNo)
	msg.WithKeys([]string{ev.BizNo})
	msg.WithTag(ev.EventType)
	return msg
}

// Send implements [Sender].
func (s *RocketMQSender) Send(ctx context.Context, ev Event) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	res, err := s.producer.SendSync(ctx, s.Message(ev))
	if err != nil {
		return classifySendError(err)
	}
	if res.Status != primitive.SendOK {
		return fmt.Errorf("rocketmq: send not confirmed: status %d (%s)", res.Status, sendStatusName(res.Status))
	}
	return nil
}

// SendBatch implements [BatchSender]: the events go in as few sends as fit under
// MaxBatchBytes, each confirmed as a whole. If the broker refuses a batch as illegal (one of
// its messages is), its events are sent one by one, so that only the illegal one is
// dead-lettered. Messages of a batch carry no client message id: consumers deduplicate on the
// eventId property, as they should anyway.
func (s *RocketMQSender) SendBatch(ctx context.Context, evs []Event) []error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	errs := make([]error, len(evs))
	for start := 0; start < len(evs); {
		end, size := start, 0
		for end < len(evs) && end-start < maxBatchMessages {
			n := messageSize(evs[end])
			if end > start && size+n > s.maxBatch {
				break
			}
			size += n
			end++
		}
		chunk := evs[start:end]
		if ctx.Err() != nil {
			fill(errs[start:end], errNotSent)
		} else if err := s.sendChunk(ctx, chunk); err != nil && IsPermanent(err) && len(chunk) > 1 {
			for i, ev := range chunk {
				errs[start+i] = s.Send(ctx, ev)
			}
		} else {
			fill(errs[start:end], err)
		}
		start = end
	}
	return errs
}

func (s *RocketMQSender) sendChunk(ctx context.Context, evs []Event) error {
	msgs := make([]*primitive.Message, len(evs))
	for i, ev := range evs {
		msgs[i] = s.Message(ev)
	}
	res, err := s.producer.SendSync(ctx, msgs...)
	if err != nil {
		return classifySendError(err)
	}
	if res.Status != primitive.SendOK {
		return fmt.Errorf("rocketmq: batch send not confirmed: status %d (%s)", res.Status, sendStatusName(res.Status))
	}
	return nil
}

// messageSize estimates an event's encoded size in a batch: body, properties, and the
// per-message header.
func messageSize(ev Event) int {
	return len(ev.Payload) + 2*len(ev.BizNo) + 2*len(ev.EventType) + 20 + 128
}

func fill(errs []error, err error) {
	for i := range errs {
		errs[i] = err
	}
}

// Close shuts down the producer if the sender built it. It is safe to call more than once.
func (s *RocketMQSender) Close() error {
	if !s.owned {
		return nil
	}
	s.closeOnce.Do(func() { s.closeErr = s.producer.Shutdown() })
	return s.closeErr
}

var brokerCodeRE = regexp.MustCompile(`CODE: (\d+)`)

// classifySendError marks the errors no retry can fix as [Permanent]. The client returns
// broker refusals as plain errors of the form "CODE: n, DESC: ...".
func classifySendError(err error) error {
	err = fmt.Errorf("rocketmq: %w", err)
	var brokerErr primitive.MQBrokerErr
	code := -1
	if errors.As(err, &brokerErr) {
		code = int(brokerErr.ResponseCode)
	} else if m := brokerCodeRE.FindStringSubmatch(err.Error()); m != nil {
		code, _ = strconv.Atoi(m[1])
	}
	if code == codeMessageIllegal {
		return Permanent(err)
	}
	return err
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

// clientLogs is where the RocketMQ client's logs go.
var clientLogs atomic.Pointer[slog.Logger]

// The client's logger is a global that it reads without synchronisation, so it is set once,
// here, before any client can exist; senders change where it goes through clientLogs.
func init() {
	clientLogs.Store(slog.New(slog.DiscardHandler))
	rlog.SetLogger(rlogAdapter{})
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

func (a rlogAdapter) Debug(msg string, fields map[string]any)   { a.log(slog.LevelDebug, msg, fields) }
func (a rlogAdapter) Info(msg string, fields map[string]any)    { a.log(slog.LevelDebug, msg, fields) }
func (a rlogAdapter) Warning(msg string, fields map[string]any) { a.log(slog.LevelWarn, msg, fields) }
func (a rlogAdapter) Error(msg string, fields map[string]any)   { a.log(slog.LevelError, msg, fields) }
func (a rlogAdapter) Fatal(msg string, fields map[string]any)   { a.log(slog.LevelError, msg, fields) }
func (a rlogAdapter) Level(string)                              {}
func (a rlogAdapter) OutputPath(string) error                   { return nil }
