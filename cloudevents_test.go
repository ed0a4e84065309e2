package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"mime"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// The CloudEvents properties, as the CloudEvents Java SDK's RocketMQ module names them
// (docs/cloudevents.md).
var ceProperties = []string{"CE_contenttype", "CE_id", "CE_source", "CE_specversion", "CE_time", "CE_type"}

// ceSender is a sender with CloudEvents on, whose producer is fp.
func ceSender(t *testing.T, fp *fakeProducer, source, contentType string) *outbox.RocketMQSender {
	t.Helper()
	s, err := outbox.NewRocketMQSenderWithProducerForTest(outbox.RocketMQConfig{
		CloudEventsSource: source, CloudEventsContentType: contentType}, fp)
	require.NoError(t, err)
	return s
}

func TestCloudEventsRejectsBadSettings(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, source, contentType, want string
	}{
		{"ContentTypeWithoutSource", "", "application/json", "CloudEventsContentType is set but CloudEventsSource is empty"},
		{"SourceSpace", "order service", "", "byte 5, ' ', is not allowed"},
		{"SourceOnlySpace", " ", "", "is not allowed in a URI"},
		{"SourceNonASCII", "/commandes/é", "", "is not allowed in a URI"},
		{"SourceControl", "/orders\x01", "", "is not allowed in a URI"},
		{"SourceQuote", `/orders"x`, "", "is not allowed in a URI"},
		{"SourceAngle", "<urn:x>", "", "is not allowed in a URI"},
		{"SourceBadEscape", "/orders%zz", "", "not followed by two hexadecimal digits"},
		{"SourceCutEscape", "/orders%2", "", "not followed by two hexadecimal digits"},
		{"SourceBadScheme", "1orders:x", "", "is not a scheme"},
		{"SourceColonInFirstSegment", "order_service:v1", "", "is not a scheme"},
		{"SourceSchemeOnly", "urn:", "", "nothing follows the scheme"},
		{"SourceTwoFragments", "/a#b#c", "", "more than one '#'"},
		{"SourceBracketsInPath", "/a[1]", "", "only around an IPv6 host"},
		{"SourceBadIPv6", "http://[::1/x", "", "CloudEventsSource"},
		{"SourceBadPort", "http://host:port/x", "", "CloudEventsSource"},
		{"SourceTooLong", "/" + strings.Repeat("a", 1024), "", "over 1024"},
		{"ContentTypeNoSubtype", "/s", "json", "has no subtype"},
		{"ContentTypeEmptySubtype", "/s", "application/", "not a media type"},
		{"ContentTypeEmptyType", "/s", "/json", "not a media type"},
		{"ContentTypeBadParameter", "/s", "application/json; charset", "not a media type"},
		{"ContentTypeSpaces", "/s", " application/json", "starts or ends with a space"},
		{"ContentTypeControl", "/s", "text/plain\x02", "not printable ASCII"},
		{"ContentTypeNonASCII", "/s", "text/plain; x=é", "not printable ASCII"},
		{"ContentTypeStructured", "/s", "application/cloudevents+json", "CloudEvents event format"},
		{"ContentTypeStructuredUpper", "/s", "Application/CloudEvents+JSON; charset=utf-8", "CloudEvents event format"},
		{"ContentTypeBatch", "/s", "application/cloudevents-batch+json", "CloudEvents event format"},
		{"ContentTypeTooLong", "/s", "text/plain; x=" + strings.Repeat("a", 1024), "over 1024"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{NameServers: []string{"127.0.0.1:9876"},
				CloudEventsSource: c.source, CloudEventsContentType: c.contentType})
			require.ErrorIs(t, err, outbox.ErrInvalidConfig)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

// Every message of a sender with CloudEvents on carries the six CloudEvents properties
// beside its own, whichever way it is sent: alone, in a batch, in key order. The source and
// the content type go as configured, byte for byte.
func TestCloudEventsPropertiesOnEveryPath(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 12, 1, 14, 39, 30, 7_000_000, time.UTC)
	evs := func(n int) []outbox.Event {
		out := make([]outbox.Event, n)
		for i := range out {
			out[i] = outbox.Event{Topic: "T", ID: int64(i + 1), EventID: fmt.Sprintf("event-%d", i+1), BizNo: fmt.Sprintf("ORD-%d", i%2),
				EventType: "ORDER_CREATED", Payload: []byte("{}"), CreateTime: created}
		}
		return out
	}
	for _, source := range []string{"/order-service", "urn:example:order-service", "https://example.com/orders?region=eu#x",
		"order-service", "//example.com/orders", "http://[::1]:8080/o", "/%E2%82%ACuro", "mailto:orders@example.com", "./a/../b;v=1"} {
		t.Run(source, func(t *testing.T) {
			fp := &fakeProducer{res: &primitive.SendResult{Status: primitive.SendOK}}
			s := ceSender(t, fp, source, "")
			require.NoError(t, sendAlone(context.Background(), s, evs(1)[0]))
			assert.Equal(t, []error{nil, nil, nil}, s.Send(context.Background(), evs(3), false))
			assert.Equal(t, []error{nil, nil, nil}, s.Send(context.Background(), evs(3), true))
			require.Len(t, fp.msgs, 7)
			for i, m := range fp.msgs {
				ev := append(evs(1), append(evs(3), evs(3)...)...)[i]
				props := m.GetProperties()
				assert.Equal(t, ceProperties, ceNames(props), "message %d", i)
				assert.Equal(t, "1.0", props["CE_specversion"])
				assert.Equal(t, ev.EventID, props["CE_id"])
				assert.Equal(t, source, props["CE_source"])
				assert.Equal(t, "ORDER_CREATED", props["CE_type"])
				assert.Equal(t, "2026-12-01T14:39:30.007Z", props["CE_time"])
				assert.Equal(t, "application/json", props["CE_contenttype"], "the default")
				assert.Equal(t, ev.EventID, props[outbox.PropertyEventID], "the sender's own properties stay")
				assert.Equal(t, "ORDER_CREATED", props[outbox.PropertyEventType])
				assert.Equal(t, ev.BizNo, props[outbox.PropertyBizNo])
				assert.Equal(t, ev.BizNo, m.GetKeys())
				assert.Equal(t, "ORDER_CREATED", m.GetTags())
			}
		})
	}

	t.Run("ContentTypeAndZone", func(t *testing.T) {
		fp := &fakeProducer{res: &primitive.SendResult{Status: primitive.SendOK}}
		s := ceSender(t, fp, "/s", `text/plain; charset="utf-8"`)
		ev := evs(1)[0]
		ev.CreateTime = time.Date(2026, 12, 1, 16, 39, 30, 0, time.FixedZone("EET", 2*3600))
		require.NoError(t, sendAlone(context.Background(), s, ev))
		assert.Equal(t, `text/plain; charset="utf-8"`, fp.msgs[0].GetProperty("CE_contenttype"))
		assert.Equal(t, "2026-12-01T14:39:30.000Z", fp.msgs[0].GetProperty("CE_time"), "UTC, to the millisecond")
	})
	t.Run("NoCreateTime", func(t *testing.T) {
		fp := &fakeProducer{res: &primitive.SendResult{Status: primitive.SendOK}}
		s := ceSender(t, fp, "/s", "")
		ev := evs(1)[0]
		ev.CreateTime = time.Time{} // an event from a Store that does not date its events
		require.NoError(t, sendAlone(context.Background(), s, ev))
		assert.NotContains(t, fp.msgs[0].GetProperties(), "CE_time", "time is optional: left out, not made up")
		assert.Equal(t, ev.EventID, fp.msgs[0].GetProperty("CE_id"))
	})
	t.Run("Off", func(t *testing.T) {
		fp := &fakeProducer{res: &primitive.SendResult{Status: primitive.SendOK}}
		s, err := outbox.NewRocketMQSenderWithProducerForTest(outbox.RocketMQConfig{}, fp)
		require.NoError(t, err)
		assert.Equal(t, []error{nil, nil}, s.Send(context.Background(), evs(2), false))
		for _, m := range fp.msgs {
			assert.Empty(t, ceNames(m.GetProperties()), "no CloudEvents properties by default")
		}
	})
}

// ceNames returns the sorted names of the CE_ properties among props.
func ceNames(props map[string]string) []string {
	var names []string
	for k := range props {
		if strings.HasPrefix(k, "CE_") {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	return names
}

// With CloudEvents on, an event without an event id or type (which a CloudEvent must have;
// InsertEvent never writes one, another Store might) is refused as Permanent before it
// reaches the producer, as an empty payload is: alone in a batch, and in key order with the
// rest of its biz no after it not sent. Without CloudEvents such an event is sent as before.
func TestCloudEventsRefusesAnEventWithoutIDOrType(t *testing.T) {
	t.Parallel()
	evs := func() []outbox.Event {
		return []outbox.Event{
			{Topic: "T", ID: 1, EventID: "e1", BizNo: "A", EventType: "T", Payload: []byte("1")},
			{Topic: "T", ID: 2, EventID: "", BizNo: "A", EventType: "T", Payload: []byte("2")},
			{Topic: "T", ID: 3, EventID: "e3", BizNo: "A", EventType: "T", Payload: []byte("3")},
			{Topic: "T", ID: 4, EventID: "e4", BizNo: "B", EventType: "", Payload: []byte("4")},
			{Topic: "T", ID: 5, EventID: "e5", BizNo: "C", EventType: "T", Payload: []byte("5")},
		}
	}
	fp := &fakeProducer{res: &primitive.SendResult{Status: primitive.SendOK}}
	s := ceSender(t, fp, "/s", "")

	err := sendAlone(context.Background(), s, evs()[1])
	assert.True(t, outbox.IsPermanent(err), "%v", err)
	assert.ErrorContains(t, err, "no event id")
	err = sendAlone(context.Background(), s, evs()[3])
	assert.True(t, outbox.IsPermanent(err), "%v", err)
	assert.ErrorContains(t, err, "no event type")
	assert.Empty(t, fp.msgs, "nothing reached the producer")

	errs := s.Send(context.Background(), evs(), false)
	assert.NoError(t, errs[0])
	assert.ErrorContains(t, errs[1], "no event id")
	assert.NoError(t, errs[2])
	assert.ErrorContains(t, errs[3], "no event type")
	assert.NoError(t, errs[4])
	assert.Equal(t, []string{"e1", "e3", "e5"}, sentIDs(fp), "the rest of the batch is sent")

	fp.msgs = nil
	errs = s.Send(context.Background(), evs(), true)
	assert.NoError(t, errs[0], "A's earlier event goes")
	assert.True(t, outbox.IsPermanent(errs[1]), "%v", errs[1])
	assert.ErrorIs(t, errs[2], outbox.ErrNotSent, "A's later event waits behind the refused one")
	assert.False(t, outbox.IsPermanent(errs[2]))
	assert.True(t, outbox.IsPermanent(errs[3]), "%v", errs[3])
	assert.NoError(t, errs[4])
	assert.Equal(t, []string{"e1", "e5"}, sentIDs(fp))

	plain := &fakeProducer{res: &primitive.SendResult{Status: primitive.SendOK}}
	off, err := outbox.NewRocketMQSenderWithProducerForTest(outbox.RocketMQConfig{}, plain)
	require.NoError(t, err)
	assert.Equal(t, []error{nil, nil, nil, nil, nil}, off.Send(context.Background(), evs(), false), "unchanged without CloudEvents")
}

func sentIDs(fp *fakeProducer) []string {
	var ids []string
	for _, m := range fp.msgs {
		ids = append(ids, m.GetProperty("CE_id"))
	}
	return ids
}

// boundCloudEvent is a CloudEvent as a consumer written to the RocketMQ binding reads it
// from a message in binary content mode.
type boundCloudEvent struct {
	attrs map[string]string // every attribute but data, by its CloudEvents name
	data  []byte
}

// readBinaryCloudEvent reads m as the binding's binary content mode has a consumer do: a
// CE_contenttype starting with application/cloudevents would mean the structured mode, so
// it must not; CE_specversion says it is a CloudEvent, and must be 1.0; CE_contenttype is
// datacontenttype, every other CE_x property is attribute x; the body is the data. The
// required attributes (id, source, type) must be there, source a URI-reference, time (if
// present) RFC 3339, datacontenttype a media type.
func readBinaryCloudEvent(m *primitive.MessageExt) (boundCloudEvent, error) {
	ev := boundCloudEvent{attrs: map[string]string{}, data: m.Body}
	for k, v := range m.GetProperties() {
		switch {
		case k == "CE_contenttype":
			ev.attrs["datacontenttype"] = v
		case strings.HasPrefix(k, "CE_"):
			ev.attrs[k[len("CE_"):]] = v
		}
	}
	if strings.HasPrefix(ev.attrs["datacontenttype"], "application/cloudevents") {
		return ev, errors.New("structured content mode")
	}
	if ev.attrs["specversion"] != "1.0" {
		return ev, fmt.Errorf("specversion %q, not 1.0", ev.attrs["specversion"])
	}
	for _, name := range []string{"id", "source", "type"} {
		if ev.attrs[name] == "" {
			return ev, fmt.Errorf("no %s", name)
		}
	}
	if _, err := url.Parse(ev.attrs["source"]); err != nil {
		return ev, fmt.Errorf("source: %w", err)
	}
	if v, ok := ev.attrs["time"]; ok {
		if _, err := time.Parse(time.RFC3339Nano, v); err != nil {
			return ev, fmt.Errorf("time: %w", err)
		}
	}
	if v, ok := ev.attrs["datacontenttype"]; ok {
		if _, _, err := mime.ParseMediaType(v); err != nil {
			return ev, fmt.Errorf("datacontenttype: %w", err)
		}
	}
	return ev, nil
}

// ceSetup inserts n events and publishes them through a real broker, on a fresh topic, with
// CloudEvents on; before, if not nil, runs once the topic exists. It returns the topic, the
// sender's source and content type, the events as stored, by event id, and the sender.
func ceSetup(t *testing.T, n int, before func(topic string)) (topic, source, contentType string, events map[string]outbox.Event, sender *outbox.RocketMQSender) {
	t.Helper()
	b := setup(t)
	topic = testsvc.NewTopic(t, "OUTBOX_CE")
	b.routeTo(topic)
	if before != nil {
		before(topic)
	}
	source, contentType = "/outbox-test/"+strings.ToLower(topic), "application/json; charset=utf-8"
	ids := b.insert(t, n)
	sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
		NameServers: []string{testsvc.RocketMQNameServer(t)}, GroupName: testsvc.UniqueTable("pg"),
		SendTimeout:       fastConfig("", nil).Tuning.SendTimeout,
		CloudEventsSource: source, CloudEventsContentType: contentType,
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, sender.Close()) })
	p := newPublisher(t, b.store, sender, fastConfig("ce", &logSink{}))
	stats, err := p.PublishPending(context.Background())
	require.NoError(t, err)
	require.Equal(t, n, stats.Sent)
	events = map[string]outbox.Event{}
	for _, id := range ids {
		ev := b.get(t, id)
		events[ev.EventID] = ev
	}
	return topic, source, contentType, events, sender
}

// Events published with CloudEvents on arrive at a real consumer as CloudEvents in binary
// content mode that a consumer written to the binding reads: id the event id, type the
// event type, the configured source and content type, time the create_time the database
// holds (to the millisecond), the payload as data; the eventId, eventType and bizNo
// properties, key and tag as without CloudEvents. The publisher sends them as its claim mode
// does (a batch, or one by one); then they are sent again in key order, batches queue by
// queue, as in a key-ordered table.
func TestCloudEventsOnARealBroker(t *testing.T) {
	t.Parallel()
	const n = 20
	var consumer *testsvc.Consumer
	_, source, contentType, events, sender := ceSetup(t, n, func(topic string) { consumer = testsvc.Consume(t, topic) })
	consumer.WaitDistinct(t, n, time.Minute)
	again := slices.SortedFunc(maps.Values(events), func(a, b outbox.Event) int { return int(a.ID - b.ID) })
	for i, err := range sender.Send(context.Background(), again, true) {
		require.NoError(t, err, "key-ordered send of event %d", again[i].ID)
	}
	require.Eventually(t, func() bool { return len(consumer.Messages()) >= 2*n }, time.Minute, 50*time.Millisecond,
		"the key-ordered sends arrive")

	for _, m := range consumer.Messages() {
		ev, ok := events[m.GetProperty(outbox.PropertyEventID)]
		require.True(t, ok, "eventId %q is no event's", m.GetProperty(outbox.PropertyEventID))
		ce, err := readBinaryCloudEvent(m)
		require.NoError(t, err, "message of event %s", ev.EventID)
		assert.Equal(t, ev.EventID, ce.attrs["id"])
		assert.Equal(t, ev.EventType, ce.attrs["type"])
		assert.Equal(t, source, ce.attrs["source"])
		assert.Equal(t, contentType, ce.attrs["datacontenttype"])
		at, err := time.Parse(time.RFC3339Nano, ce.attrs["time"])
		require.NoError(t, err)
		assert.True(t, ev.CreateTime.Equal(at), "time %s is create_time %s", ce.attrs["time"], ev.CreateTime)
		assert.Equal(t, ev.Payload, ce.data)
		assert.ElementsMatch(t, []string{"datacontenttype", "id", "source", "specversion", "time", "type"}, slices.Collect(maps.Keys(ce.attrs)),
			"no other CE_ property")
		assert.Equal(t, ev.EventType, m.GetProperty(outbox.PropertyEventType))
		assert.Equal(t, ev.BizNo, m.GetProperty(outbox.PropertyBizNo))
		assert.Equal(t, ev.BizNo, m.GetKeys())
		assert.Equal(t, ev.EventType, m.GetTags())
	}
}

// The CloudEvents Java SDK reads the messages from the real broker as CloudEvents with the
// event's attributes and data: its core (cloudevents-core, which checks every attribute as
// it builds the event) under a binary-mode reader written to the RocketMQ binding, since its
// RocketMQ module is not served here (see internal/testsvc/cloudeventsconsumer). Needs Java
// and Maven (CI has both); skipped without them, failed under OUTBOX_REQUIRE_SERVICES=1.
func TestCloudEventsJavaSDKReadsThem(t *testing.T) {
	t.Parallel()
	const n = 10
	testsvc.RequireCloudEventsJava(t)
	topic, source, contentType, events, _ := ceSetup(t, n, nil)
	read := testsvc.ReadCloudEventsWithJava(t, topic, n, 2*time.Minute)
	require.GreaterOrEqual(t, len(read), n)
	t.Logf("the Java SDK read %d messages, e.g. %+v", len(read), read[0])
	seen := map[string]bool{}
	for _, got := range read {
		ev, ok := events[got.EventID]
		require.True(t, ok, "eventId %q is no event's", got.EventID)
		seen[got.EventID] = true
		require.Empty(t, got.Error, "the SDK read event %s", ev.EventID)
		assert.Equal(t, "1.0", got.SpecVersion)
		assert.Equal(t, ev.EventID, got.ID)
		assert.Equal(t, ev.EventType, got.Type)
		assert.Equal(t, source, got.Source)
		assert.Equal(t, contentType, got.DataContentType)
		if assert.NotNil(t, got.TimeMillis, "the SDK read a time") {
			assert.Equal(t, ev.CreateTime.UnixMilli(), *got.TimeMillis, "time is create_time (%s; SDK: %s)", ev.CreateTime, got.Time)
		}
		assert.Equal(t, ev.Payload, got.Data)
		assert.Empty(t, got.Extensions, "no extension attributes")
		assert.Equal(t, ev.EventType, got.EventType, "eventType stays")
		assert.Equal(t, ev.BizNo, got.BizNo, "bizNo stays")
		assert.Len(t, got.CEProperties, len(ceProperties))
	}
	assert.Len(t, seen, n)
}

// A sender with CloudEvents on fails as it does without when no broker can be reached: the
// send is Unavailable, and the publisher leaves the event waiting, no attempt counted.
func TestCloudEventsNoNameServerIsUnavailable(t *testing.T) {
	t.Parallel()
	testsvc.RocketMQNameServer(t)
	b := setup(t)
	id := b.insert(t, 1)[0]
	sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
		NameServers: []string{"127.0.0.1:1"}, // nothing listens there
		GroupName:   testsvc.UniqueTable("pg"),
		SendTimeout: 300 * time.Millisecond,

		CloudEventsSource: "/order-service",
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sender.Close() })
	err = sendAlone(context.Background(), sender, b.get(t, id))
	assert.True(t, outbox.IsUnavailable(err), "unavailable: %v", err)
	assert.False(t, outbox.IsPermanent(err))

	cfg := fastConfig("p", &logSink{})
	cfg.Tuning.SendTimeout = 0 // the sender's
	p := newPublisher(t, b.store, sender, cfg)
	_, err = p.PublishPending(context.Background())
	require.NoError(t, err)
	got := b.get(t, id)
	assert.Equal(t, outbox.StatusWait, got.Status, "not dead-lettered")
	assert.Zero(t, got.RetryCount, "no attempt counted")
}

// Any CloudEvents settings are refused with ErrInvalidConfig or accepted, never a panic; an
// accepted source is a URI url.Parse reads, of characters a URI has, and an accepted content
// type a media type that is no CloudEvents format; both go into every message as they were
// given.
func FuzzCloudEventsSettings(f *testing.F) {
	for _, s := range [][2]string{
		{"", ""}, {"", "application/json"}, {"/order-service", ""}, {"urn:example:a", "text/plain; charset=utf-8"},
		{"https://example.com/a?b=c#d", "application/octet-stream"}, {"http://[::1]:80/", "application/avro"},
		{"a b", ""}, {"%zz", ""}, {"1a:b", ""}, {"x:", ""}, {"/a#b#c", ""}, {"/a[b]", ""},
		{"/s", "json"}, {"/s", "application/cloudevents+json"}, {"/s", " text/plain"}, {"/s", "text/plain; a"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, source, contentType string) {
		fp := &fakeProducer{res: &primitive.SendResult{Status: primitive.SendOK}}
		s, err := outbox.NewRocketMQSenderWithProducerForTest(outbox.RocketMQConfig{CloudEventsSource: source, CloudEventsContentType: contentType}, fp)
		if err != nil {
			require.ErrorIs(t, err, outbox.ErrInvalidConfig)
			return
		}
		require.NoError(t, sendAlone(context.Background(), s, outbox.Event{Topic: "T", ID: 1, EventID: "e", BizNo: "A", EventType: "T", Payload: []byte("x")}))
		require.Len(t, fp.msgs, 1)
		props := fp.msgs[0].GetProperties()
		if source == "" {
			assert.Empty(t, contentType, "a content type alone is refused")
			assert.Empty(t, ceNames(props))
			return
		}
		assert.LessOrEqual(t, len(source), 1024)
		_, err = url.Parse(source)
		assert.NoError(t, err, "an accepted source parses")
		for i := range len(source) {
			c := source[i]
			assert.True(t, c > ' ' && c < 0x7f && !strings.ContainsRune(`"<>\^`+"`{|}", rune(c)), "byte %d %q of an accepted source", i, c)
		}
		assert.Equal(t, source, props["CE_source"])
		if contentType == "" {
			contentType = "application/json"
		}
		mt, _, err := mime.ParseMediaType(contentType)
		require.NoError(t, err, "an accepted content type parses")
		assert.Contains(t, mt, "/")
		assert.False(t, strings.HasPrefix(mt, "application/cloudevents"))
		assert.Equal(t, contentType, props["CE_contenttype"])
	})
}
