package outbox

import (
	"errors"
	"fmt"
	"mime"
	"net/url"
	"regexp"
	"strings"

	"github.com/apache/rocketmq-client-go/v2/primitive"
)

// The CloudEvents binary content mode of the RocketMQ binding, as the CloudEvents Java SDK's
// module cloudevents-rocketmq (io.cloudevents.rocketmq: RocketmqConstants,
// RocketmqBinaryMessageReader, RocketmqMessageWriter) reads and writes it, after the draft
// "RocketMQ Transport Binding for CloudEvents" of apache/rocketmq-externals
// (rocketmq-cloudevents-binding/rocketmq-transport-binding.md): every attribute is a user
// property named "CE_" + the attribute's name, except datacontenttype, which is
// CE_contenttype; the event data is the body, as it is.
const (
	ceSpecVersionProperty = "CE_specversion"
	ceIDProperty          = "CE_id"
	ceSourceProperty      = "CE_source"
	ceTypeProperty        = "CE_type"
	ceTimeProperty        = "CE_time"
	ceContentTypeProperty = "CE_contenttype"

	// ceSpecVersion is the CloudEvents version the attributes follow.
	ceSpecVersion = "1.0"
	// ceContentTypeDefault is the datacontenttype unless RocketMQConfig.CloudEventsContentType
	// says otherwise.
	ceContentTypeDefault = "application/json"
	// ceTimeLayout writes CE_time: RFC 3339 in UTC, to the millisecond that the DATETIME(3)
	// create_time holds.
	ceTimeLayout = "2006-01-02T15:04:05.000Z07:00"
	// ceMaxSetting bounds CloudEventsSource and CloudEventsContentType, which every message
	// carries: the broker refuses a message whose properties pass 32 KB as illegal, which
	// would dead-letter every event.
	ceMaxSetting = 1024
	// ceFixedSize estimates the encoded size of the CloudEvents properties apart from the
	// event's id and type and the configured values: names, separators, version and time.
	ceFixedSize = 56 + 12 + len(ceSpecVersion) + len("2006-01-02T15:04:05.000Z")
)

// cloudEvents is what a sender with [RocketMQConfig.CloudEventsSource] adds to every message.
type cloudEvents struct {
	source      string
	contentType string
}

// newCloudEvents validates the CloudEvents settings of cfg. It returns nil, and no error,
// when they are off.
func newCloudEvents(cfg RocketMQConfig) (*cloudEvents, error) {
	if cfg.CloudEventsSource == "" {
		if cfg.CloudEventsContentType != "" {
			return nil, fmt.Errorf("%w: CloudEventsContentType is set but CloudEventsSource is empty: set the source to send CloudEvents", ErrInvalidConfig)
		}
		return nil, nil
	}
	if err := checkURIReference(cfg.CloudEventsSource); err != nil {
		return nil, fmt.Errorf("%w: CloudEventsSource %q is not a URI-reference (RFC 3986), as the CloudEvents source must be: %w", ErrInvalidConfig, cfg.CloudEventsSource, err)
	}
	ct := cfg.CloudEventsContentType
	if ct == "" {
		ct = ceContentTypeDefault
	}
	if err := checkDataContentType(ct); err != nil {
		return nil, fmt.Errorf("%w: CloudEventsContentType %q: %w", ErrInvalidConfig, ct, err)
	}
	return &cloudEvents{source: cfg.CloudEventsSource, contentType: ct}, nil
}

// set adds ev's CloudEvents attributes to msg: its event id as id, its event type as type,
// the configured source and content type, and its create_time as time (left out when the
// event has none, as an event from another Store may).
func (c *cloudEvents) set(msg *primitive.Message, ev *Event) {
	msg.WithProperty(ceSpecVersionProperty, ceSpecVersion)
	msg.WithProperty(ceIDProperty, ev.EventID)
	msg.WithProperty(ceSourceProperty, c.source)
	msg.WithProperty(ceTypeProperty, ev.EventType)
	if !ev.CreateTime.IsZero() {
		msg.WithProperty(ceTimeProperty, ev.CreateTime.UTC().Format(ceTimeLayout))
	}
	msg.WithProperty(ceContentTypeProperty, c.contentType)
}

// size estimates the encoded size of the properties set adds for ev.
func (c *cloudEvents) size(ev *Event) int {
	return ceFixedSize + len(c.source) + len(c.contentType) + len(ev.EventID) + len(ev.EventType)
}

// errNoCloudEventID and errNoCloudEventType are the errors of an event that cannot be a
// CloudEvent, which needs a non-empty id and type. Events written by InsertEvent always
// have both; another Store's may not.
var (
	errNoCloudEventID   = Permanent(errors.New("rocketmq: the event has no event id, and a CloudEvent needs one (CE_id)"))
	errNoCloudEventType = Permanent(errors.New("rocketmq: the event has no event type, and a CloudEvent needs one (CE_type)"))
)

// refuse returns why ev cannot be sent as a CloudEvent, or nil.
func (c *cloudEvents) refuse(ev *Event) error {
	switch {
	case ev.EventID == "":
		return errNoCloudEventID
	case ev.EventType == "":
		return errNoCloudEventType
	}
	return nil
}

// uriSchemeRE is RFC 3986's scheme: a letter, then letters, digits, '+', '-' and '.'.
var uriSchemeRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*$`)

// checkURIReference checks that s is an RFC 3986 URI-reference: a URI ("urn:example:orders",
// "https://example.com/orders") or a relative reference ("/order-service"). It is stricter
// than url.Parse, which lets through characters a URI does not have (spaces, quotes,
// non-ASCII) and which java.net.URI, what the CloudEvents Java SDK reads a source with,
// refuses.
func checkURIReference(s string) error {
	if s == "" {
		return errors.New("it is empty")
	}
	if len(s) > ceMaxSetting {
		return fmt.Errorf("it is %d bytes long, over %d", len(s), ceMaxSetting)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '%':
			if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
				return fmt.Errorf("the %% at byte %d is not followed by two hexadecimal digits", i)
			}
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			strings.IndexByte("-._~:/?#[]@!$&'()*+,;=", c) >= 0:
		default:
			return fmt.Errorf("byte %d, %q, is not allowed in a URI (percent-encode it)", i, c)
		}
	}
	if i := strings.IndexAny(s, ":/?#"); i >= 0 && s[i] == ':' {
		// A colon before any '/', '?' or '#' ends a scheme.
		if !uriSchemeRE.MatchString(s[:i]) {
			return fmt.Errorf("%q before the first ':' is not a scheme (a letter, then letters, digits, '+', '-', '.'); a relative reference has no ':' in its first segment", s[:i])
		}
		if i == len(s)-1 {
			return errors.New("nothing follows the scheme")
		}
	}
	if strings.Count(s, "#") > 1 {
		return errors.New("it has more than one '#'")
	}
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if strings.Count(s, "[") != strings.Count(u.Host, "[") || strings.Count(s, "]") != strings.Count(u.Host, "]") {
		return errors.New("'[' and ']' are allowed only around an IPv6 host")
	}
	return nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// checkDataContentType checks that s is a media type (RFC 2046: type/subtype and
// parameters), as the CloudEvents datacontenttype must be, and not one of the CloudEvents
// event formats: a consumer reads a message whose CE_contenttype starts with
// "application/cloudevents" in structured mode, with the body as the whole event.
func checkDataContentType(s string) error {
	if len(s) > ceMaxSetting {
		return fmt.Errorf("it is %d bytes long, over %d", len(s), ceMaxSetting)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return fmt.Errorf("byte %d, %q, is not printable ASCII", i, s[i])
		}
	}
	if strings.TrimSpace(s) != s {
		return errors.New("it starts or ends with a space")
	}
	mt, _, err := mime.ParseMediaType(s)
	if err != nil {
		return fmt.Errorf("it is not a media type (RFC 2046, e.g. application/json): %w", err)
	}
	if !strings.Contains(mt, "/") {
		return fmt.Errorf("it is not a media type: %q has no subtype (e.g. application/json)", mt)
	}
	if strings.HasPrefix(mt, "application/cloudevents") {
		return errors.New("it is a CloudEvents event format (structured mode): name the payload's own media type")
	}
	return nil
}
