// Package eventrules holds the rules an event must keep to be written to an outbox, and
// the broker's rules for topic names: what the MySQL store checks in InsertEvent, and the
// test kit's in-memory store in its Insert, so that both refuse the same events.
//
// The sentinels live here so that the rules can wrap them; package outbox exports them
// (outbox.ErrInvalidEvent is ErrInvalidEvent).
package eventrules

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

var (
	// ErrInvalidEvent is wrapped by every error for an event that cannot be written.
	ErrInvalidEvent = errors.New("outbox: invalid event")
	// ErrPayloadTooLarge is the error for a payload over the store's limit.
	ErrPayloadTooLarge = fmt.Errorf("%w: payload too large", ErrInvalidEvent)
)

// MaxKeyLen is the most characters of a biz no or an event type.
const MaxKeyLen = 64

// MaxDue is the latest time next_retry_time, a DATETIME(3), holds.
var MaxDue = time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC)

// Check checks an event's biz no, event type and due time. Its topic is the store's to
// check (its set of topics), and then its payload ([Payload]).
func Check(bizNo, eventType string, delay time.Duration, notBefore time.Time) error {
	if err := key("BizNo", bizNo); err != nil {
		return err
	}
	if err := key("EventType", eventType); err != nil {
		return err
	}
	switch {
	case strings.Contains(eventType, "||"):
		return fmt.Errorf("%w: EventType %q contains \"||\", which separates tags in a RocketMQ subscription: no consumer could subscribe to it", ErrInvalidEvent, eventType)
	case eventType == "*":
		return fmt.Errorf("%w: EventType \"*\" is RocketMQ's subscription to every tag: no consumer could subscribe to it alone", ErrInvalidEvent)
	case delay < 0:
		return fmt.Errorf("%w: Delay is negative (%s): an event is due at once at the earliest", ErrInvalidEvent, delay)
	case delay > 0 && !notBefore.IsZero():
		return fmt.Errorf("%w: both Delay (%s) and NotBefore (%s) are set: give one", ErrInvalidEvent, delay, notBefore.Format(time.RFC3339Nano))
	case !notBefore.IsZero() && CeilMilli(notBefore.UTC()).After(MaxDue):
		return fmt.Errorf("%w: NotBefore %s is later than %s, the latest time next_retry_time (DATETIME(3)) holds",
			ErrInvalidEvent, notBefore.UTC().Format(time.RFC3339Nano), MaxDue.Format("2006-01-02 15:04:05.000 UTC"))
	}
	return nil
}

// Payload checks a payload of n bytes against limit, the store's most payload bytes.
func Payload(n, limit int) error {
	switch {
	case n == 0:
		return fmt.Errorf("%w: the payload is empty: RocketMQ does not take a message without a body, so the event could never be sent", ErrInvalidEvent)
	case n > limit:
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrPayloadTooLarge, n, limit)
	}
	return nil
}

// key checks a biz no or event type: required, at most MaxKeyLen characters, printable
// UTF-8 without spaces. They become the message's key, tag and properties: control
// characters separate the properties, RocketMQ splits a message's keys on spaces (a biz no
// "A B" would be found by a lookup of "A" and of "B", never of "A B"), and a subscription
// trims the spaces around a tag.
func key(name, v string) error {
	switch {
	case v == "":
		return fmt.Errorf("%w: %s is empty", ErrInvalidEvent, name)
	case !utf8.ValidString(v):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidEvent, name)
	case utf8.RuneCountInString(v) > MaxKeyLen:
		return fmt.Errorf("%w: %s is %d characters, at most %d", ErrInvalidEvent, name, utf8.RuneCountInString(v), MaxKeyLen)
	case strings.IndexFunc(v, unicode.IsControl) >= 0:
		return fmt.Errorf("%w: %s %q contains a control character", ErrInvalidEvent, name, v)
	case strings.IndexFunc(v, unicode.IsSpace) >= 0:
		return fmt.Errorf("%w: %s %q contains a space: RocketMQ splits message keys on spaces and trims them around tags", ErrInvalidEvent, name, v)
	}
	return nil
}

// CeilMilli rounds t up to the millisecond: the column's precision, never earlier than asked.
func CeilMilli(t time.Time) time.Time {
	if r := t.Truncate(time.Millisecond); r.Before(t) {
		return r.Add(time.Millisecond)
	}
	return t
}

// TopicRE is the broker's rule for topic names (its TopicValidator).
var TopicRE = regexp.MustCompile(`^[%|a-zA-Z0-9_-]{1,127}$`)

// systemTopics are the broker's own topics (its TopicValidator): a send to one is refused
// with NO_PERMISSION, which would look like an outage that never ends.
var systemTopics = map[string]bool{
	"TBW102": true, "SCHEDULE_TOPIC_XXXX": true, "BenchmarkTest": true, "RMQ_SYS_TRANS_HALF_TOPIC": true,
	"RMQ_SYS_TRACE_TOPIC": true, "RMQ_SYS_TRANS_OP_HALF_TOPIC": true, "TRANS_CHECK_MAX_TIME_TOPIC": true,
	"SELF_TEST_TOPIC": true, "OFFSET_MOVED_EVENT": true,
}

// SystemTopic reports a topic of the broker's own: a name in systemTopics, or one with the
// prefix of its system topics or of consumer groups' retry and dead-letter topics.
func SystemTopic(topic string) bool {
	return systemTopics[topic] || strings.HasPrefix(topic, "rmq_sys_") ||
		strings.HasPrefix(topic, "%RETRY%") || strings.HasPrefix(topic, "%DLQ%")
}

// TopicName checks a topic name by the broker's rules: 1 to 127 letters, digits, '_', '-',
// '%' or '|', and not one of its own topics. The error says why, for the caller to wrap.
func TopicName(topic string) error {
	if !TopicRE.MatchString(topic) {
		return fmt.Errorf("%.140q must be 1 to 127 letters, digits, '_', '-', '%%' or '|'", topic)
	}
	if SystemTopic(topic) {
		return fmt.Errorf("%q is one of RocketMQ's own topics, which the broker refuses to take messages for", topic)
	}
	return nil
}
