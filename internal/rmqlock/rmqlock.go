// Package rmqlock speaks the few RocketMQ remoting requests the inbox's consumer needs and
// the Go client does not expose: the route of a topic from a name server, the locking and
// unlocking of message queues at a broker on behalf of a consumer's client id (the orderly
// consumer), and a consumer group's heartbeat ahead of its consumer's (the start).
//
// A [Client] makes them as the consumer it serves makes its own: signed with the
// consumer's credentials when it has them (the broker's ACL), over TLS when the consumer
// uses it, and with the Go client's protocol version and language.
//
// Each call opens a connection of its own, sends its requests and reads their responses:
// the calls are rare (a start, a rebalance, a shutdown), and no connection outlives a
// call.
//
// The wire format of a request or response: a 4-byte big-endian total length (of all that
// follows it), a 4-byte header length whose high byte is the header's serialization (0,
// JSON), the JSON header {code, language, version, opaque, flag, extFields, remark}, and
// the body.
package rmqlock

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
)

// Request codes.
const (
	codeGetRouteInfoByTopic = 105
	codeLockBatchMQ         = 41
	codeUnlockBatchMQ       = 42
	codeHeartBeat           = 34
	codeUnregisterClient    = 35
)

// Response codes.
const (
	codeSuccess = 0
	// codeNoPermission is a broker's answer to a request its ACL refuses: credentials
	// missing, wrong, or without the permission the request needs.
	codeNoPermission = 16
)

// protocolVersion and language are what the Go client (rocketmq-client-go v2) puts in every
// request header: the broker reads the version as the client's release, and decides by it
// how some requests are encoded and checked. A test reads the client's source for it.
const (
	protocolVersion = 317
	language        = "GO"
)

// Client makes requests for one consumer: signed with Credentials when AccessKey is set,
// and over TLS when TLS is. Its zero value makes plain, unsigned requests.
type Client struct {
	// Credentials are the consumer's ACL credentials, as it gives them to its push consumer.
	Credentials primitive.Credentials
	// TLS connects over TLS without verifying the server's certificate, as the Go client
	// does with its UseTls option: the keeper reaches the brokers the consumer reaches, as
	// the consumer reaches them.
	TLS bool
}

// maxFrame bounds a response's length.
const maxFrame = 16 << 20

// Queue is a message queue, as the broker names it.
type Queue struct {
	Topic      string `json:"topic"`
	BrokerName string `json:"brokerName"`
	QueueID    int    `json:"queueId"`
}

func (q Queue) String() string { return fmt.Sprintf("%s@%s#%d", q.Topic, q.BrokerName, q.QueueID) }

// Sort sorts qs by topic, broker name and queue id.
func Sort(qs []Queue) {
	sort.Slice(qs, func(i, j int) bool {
		a, b := qs[i], qs[j]
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		if a.BrokerName != b.BrokerName {
			return a.BrokerName < b.BrokerName
		}
		return a.QueueID < b.QueueID
	})
}

type header struct {
	Code      int               `json:"code"`
	Language  string            `json:"language"`
	Version   int               `json:"version"`
	Opaque    int32             `json:"opaque"`
	Flag      int               `json:"flag"`
	Remark    string            `json:"remark,omitempty"`
	ExtFields map[string]string `json:"extFields,omitempty"`
}

// ErrResponse is the error of a request the server answered with a failure code; the
// error is a [*ResponseError].
var ErrResponse = errors.New("rmqlock: the server refused the request")

// ResponseError is a server's refusal: its response code and remark.
type ResponseError struct {
	Addr    string
	Request int
	Code    int
	Remark  string
}

func (e *ResponseError) Error() string {
	return fmt.Sprintf("rmqlock: request %d to %s refused: code %d: %s", e.Request, e.Addr, e.Code, e.Remark)
}

// Is makes a ResponseError match [ErrResponse].
func (e *ResponseError) Is(target error) bool { return target == ErrResponse }

// Denied reports whether err is a refusal by the server's ACL.
func Denied(err error) bool {
	var re *ResponseError
	return errors.As(err, &re) && re.Code == codeNoPermission
}

// Call sends one request of code, with the header's ext fields and body, to addr on a
// connection of its own, and returns its response's body: for a request this package has
// no function for (the tests create topics with it).
func (cl Client) Call(ctx context.Context, addr string, code int, ext map[string]string, body []byte) ([]byte, error) {
	return cl.call(ctx, addr, code, ext, body)
}

// call sends one request to addr, on a connection of its own, and returns its response's
// body.
func (cl Client) call(ctx context.Context, addr string, code int, ext map[string]string, body []byte) ([]byte, error) {
	conn, err := cl.dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	defer conn.close()
	return conn.call(code, ext, body)
}

// conn is a connection to a name server or a broker, for requests one after another.
type conn struct {
	net.Conn
	addr   string
	creds  primitive.Credentials
	stop   func() bool
	opaque int32 // the last request's id on this connection
}

// dial connects to addr; the connection's calls end with ctx (at its deadline, or within
// 5 s without one).
func (cl Client) dial(ctx context.Context, addr string) (*conn, error) {
	var c net.Conn
	var err error
	if cl.TLS {
		d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // as the Go client's UseTls; see Client.TLS
		c, err = d.DialContext(ctx, "tcp", addr)
	} else {
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("rmqlock: connect to %s: %w", addr, err)
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(5 * time.Second)
	}
	_ = c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	return &conn{Conn: c, addr: addr, creds: cl.Credentials, stop: stop}, nil
}

// sign adds to ext the fields of a request signed with creds, as the broker's ACL checks
// them: the HMAC-SHA1, keyed by the secret, of every field's value in the order of the
// fields' names, followed by the body.
func sign(creds primitive.Credentials, ext map[string]string, body []byte) map[string]string {
	if creds.AccessKey == "" {
		return ext
	}
	out := make(map[string]string, len(ext)+3)
	maps.Copy(out, ext)
	out["AccessKey"] = creds.AccessKey
	if creds.SecurityToken != "" {
		out["SecurityToken"] = creds.SecurityToken
	}
	mac := hmac.New(sha1.New, []byte(creds.SecretKey))
	for _, k := range slices.Sorted(maps.Keys(out)) {
		mac.Write([]byte(out[k]))
	}
	mac.Write(body)
	out["Signature"] = base64.StdEncoding.EncodeToString(mac.Sum(nil))
	return out
}

func (c *conn) close() {
	c.stop()
	_ = c.Close()
}

// call sends one request on c and returns its response's body.
func (c *conn) call(code int, ext map[string]string, body []byte) ([]byte, error) {
	addr := c.addr
	c.opaque++
	id := c.opaque
	h, err := json.Marshal(header{Code: code, Language: language, Version: protocolVersion, Opaque: id,
		ExtFields: sign(c.creds, ext, body)})
	if err != nil {
		return nil, fmt.Errorf("rmqlock: encode the request header: %w", err)
	}
	frame := make([]byte, 8, 8+len(h)+len(body))
	binary.BigEndian.PutUint32(frame[0:4], uint32(4+len(h)+len(body)))
	binary.BigEndian.PutUint32(frame[4:8], uint32(len(h))) // high byte 0: JSON
	frame = append(append(frame, h...), body...)
	if _, err := c.Write(frame); err != nil {
		return nil, fmt.Errorf("rmqlock: send request %d to %s: %w", code, addr, err)
	}
	for {
		var lens [8]byte
		if _, err := io.ReadFull(c, lens[:]); err != nil {
			return nil, fmt.Errorf("rmqlock: read the response to request %d from %s: %w", code, addr, err)
		}
		total := binary.BigEndian.Uint32(lens[0:4])
		hl := binary.BigEndian.Uint32(lens[4:8]) & 0xffffff
		if lens[4] != 0 {
			return nil, fmt.Errorf("rmqlock: response from %s: %w: header serialized with type %d, not JSON", addr, ErrResponse, lens[4])
		}
		if total > maxFrame || hl+4 > total {
			return nil, fmt.Errorf("rmqlock: response from %s: %w: bad frame lengths %d/%d", addr, ErrResponse, total, hl)
		}
		rest := make([]byte, total-4)
		if _, err := io.ReadFull(c, rest); err != nil {
			return nil, fmt.Errorf("rmqlock: read the response to request %d from %s: %w", code, addr, err)
		}
		var rh header
		if err := json.Unmarshal(rest[:hl], &rh); err != nil {
			return nil, fmt.Errorf("rmqlock: decode the response header from %s: %w", addr, err)
		}
		if rh.Flag&1 == 0 || rh.Opaque != id {
			continue // a request of the server's, or another call's answer: not ours
		}
		if rh.Code != codeSuccess {
			return nil, &ResponseError{Addr: addr, Request: code, Code: rh.Code, Remark: rh.Remark}
		}
		return rest[hl:], nil
	}
}

// Route returns the address of the master of each broker that has queues of topic, by
// broker name, as a name server of nameServers tells it (the first that answers).
func (cl Client) Route(ctx context.Context, nameServers []string, topic string) (map[string]string, error) {
	var errs []error
	for _, ns := range nameServers {
		body, err := cl.call(ctx, ns, codeGetRouteInfoByTopic, map[string]string{"topic": topic}, nil)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var route struct {
			BrokerDatas []struct {
				BrokerName  string            `json:"brokerName"`
				BrokerAddrs map[string]string `json:"brokerAddrs"`
			} `json:"brokerDatas"`
		}
		if err := unmarshal(body, &route); err != nil {
			errs = append(errs, fmt.Errorf("rmqlock: decode the route of %s from %s: %w", topic, ns, err))
			continue
		}
		out := map[string]string{}
		for _, b := range route.BrokerDatas {
			if a := b.BrokerAddrs["0"]; a != "" {
				out[b.BrokerName] = a
			}
		}
		return out, nil
	}
	return nil, errors.Join(errs...)
}

type batchBody struct {
	ConsumerGroup  string  `json:"consumerGroup"`
	ClientID       string  `json:"clientId"`
	OnlyThisBroker bool    `json:"onlyThisBroker"`
	MQSet          []Queue `json:"mqSet"`
}

// Lock asks the broker at addr to lock qs (queues of that broker) for clientID in group,
// and returns those it holds for clientID: the ones free or already clientID's. A queue
// another client holds, and whose lock has not expired, is not returned.
func (cl Client) Lock(ctx context.Context, addr, group, clientID string, qs []Queue) ([]Queue, error) {
	body, err := json.Marshal(batchBody{ConsumerGroup: group, ClientID: clientID, MQSet: qs})
	if err != nil {
		return nil, fmt.Errorf("rmqlock: encode the lock request: %w", err)
	}
	resp, err := cl.call(ctx, addr, codeLockBatchMQ, nil, body)
	if err != nil {
		return nil, err
	}
	var out struct {
		LockOKMQSet []Queue `json:"lockOKMQSet"`
	}
	if len(bytes.TrimSpace(resp)) == 0 {
		return nil, nil
	}
	if err := unmarshal(resp, &out); err != nil {
		return nil, fmt.Errorf("rmqlock: decode the lock response from %s: %w", addr, err)
	}
	return out.LockOKMQSet, nil
}

// Unlock asks the broker at addr to release the locks clientID holds in group on qs. The
// broker releases only the locks that are clientID's: a queue another client holds stays
// theirs.
func (cl Client) Unlock(ctx context.Context, addr, group, clientID string, qs []Queue) error {
	body, err := json.Marshal(batchBody{ConsumerGroup: group, ClientID: clientID, MQSet: qs})
	if err != nil {
		return fmt.Errorf("rmqlock: encode the unlock request: %w", err)
	}
	_, err = cl.call(ctx, addr, codeUnlockBatchMQ, nil, body)
	return err
}

// Member is a consumer of a group as a heartbeat describes it to a broker (the heartbeat's
// consumer data).
type Member struct {
	ClientID         string
	Group            string
	ConsumeType      string // CONSUME_PASSIVELY: a push consumer
	MessageModel     string // CLUSTERING or BROADCASTING
	ConsumeFromWhere string // CONSUME_FROM_FIRST_OFFSET, ...
	UnitMode         bool
	// Subscriptions are the member's topics, each with its tag expression: "*", or
	// "TAG_A || TAG_B".
	Subscriptions map[string]string
}

type subscriptionData struct {
	ClassFilterMode bool     `json:"classFilterMode"`
	Topic           string   `json:"topic"`
	SubString       string   `json:"subString"`
	Tags            []string `json:"tagsSet"`
	Codes           []int32  `json:"codeSet"`
	SubVersion      int64    `json:"subVersion"`
	ExpressionType  string   `json:"expressionType"`
}

type consumerData struct {
	GroupName         string             `json:"groupName"`
	ConsumeType       string             `json:"consumeType"`
	MessageModel      string             `json:"messageModel"`
	ConsumeFromWhere  string             `json:"consumeFromWhere"`
	SubscriptionDatas []subscriptionData `json:"subscriptionDataSet"`
	UnitMode          bool               `json:"unitMode"`
}

type heartbeatData struct {
	ClientID      string         `json:"clientID"`
	ProducerDatas []struct{}     `json:"producerDataSet"`
	ConsumerDatas []consumerData `json:"consumerDataSet"`
}

// subscription is a topic's subscription data for expr, as the Go client builds it: the
// tags of expr and their hash codes (a Java String.hashCode of the tag's bytes), none for
// "*".
func subscription(topic, expr string, version int64) subscriptionData {
	sd := subscriptionData{Topic: topic, SubString: expr, SubVersion: version, ExpressionType: "TAG",
		Tags: []string{}, Codes: []int32{}}
	if strings.TrimSpace(expr) == "" || expr == "*" {
		sd.SubString = "*"
		return sd
	}
	for _, tag := range strings.Split(expr, "||") {
		tag = strings.TrimSpace(tag)
		if tag == "" || slices.Contains(sd.Tags, tag) {
			continue
		}
		var h int32
		for _, b := range []byte(tag) {
			h = 31*h + int32(b)
		}
		sd.Tags = append(sd.Tags, tag)
		if !slices.Contains(sd.Codes, h) {
			sd.Codes = append(sd.Codes, h)
		}
	}
	return sd
}

// HeartbeatAndLeave sends the broker at addr a heartbeat of m and then, on the same
// connection, unregisters m. At the heartbeat the broker does what it does at any consumer's:
// it makes the group's subscription group if the broker creates them, and the group's retry
// topic (%RETRY%group) if it has none, which it registers at the name servers before it
// answers; it also counts m among the group's members, until the unregistering, which
// the broker has done when it answers. Both are requests a consumer makes itself, signed as
// its own are.
func (cl Client) HeartbeatAndLeave(ctx context.Context, addr string, m Member) error {
	version := time.Now().UnixNano()
	cd := consumerData{GroupName: m.Group, ConsumeType: m.ConsumeType, MessageModel: m.MessageModel,
		ConsumeFromWhere: m.ConsumeFromWhere, UnitMode: m.UnitMode, SubscriptionDatas: []subscriptionData{}}
	topics := make([]string, 0, len(m.Subscriptions))
	for topic := range m.Subscriptions {
		topics = append(topics, topic)
	}
	sort.Strings(topics)
	for _, topic := range topics {
		cd.SubscriptionDatas = append(cd.SubscriptionDatas, subscription(topic, m.Subscriptions[topic], version))
	}
	body, err := json.Marshal(heartbeatData{ClientID: m.ClientID, ProducerDatas: []struct{}{}, ConsumerDatas: []consumerData{cd}})
	if err != nil {
		return fmt.Errorf("rmqlock: encode the heartbeat: %w", err)
	}
	conn, err := cl.dial(ctx, addr)
	if err != nil {
		return err
	}
	defer conn.close()
	if _, err := conn.call(codeHeartBeat, nil, body); err != nil {
		return err
	}
	_, err = conn.call(codeUnregisterClient, map[string]string{"clientID": m.ClientID, "consumerGroup": m.Group}, nil)
	return err
}
