// Package rmqlock speaks the few RocketMQ remoting requests the inbox's consumer needs and
// the Go client does not expose: the route of a topic from a name server, the locking and
// unlocking of message queues at a broker on behalf of a consumer's client id (the orderly
// consumer), and a consumer group's heartbeat ahead of its consumer's (the start).
//
// Each call opens a TCP connection of its own, sends its requests and reads their
// responses: the calls are rare (a start, a rebalance, a shutdown), and no connection
// outlives a call.
//
// The wire format of a request or response: a 4-byte big-endian total length (of all that
// follows it), a 4-byte header length whose high byte is the header's serialization (0,
// JSON), the JSON header {code, language, version, opaque, flag, extFields, remark}, and
// the body.
package rmqlock

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
)

// Request codes.
const (
	codeGetRouteInfoByTopic = 105
	codeLockBatchMQ         = 41
	codeUnlockBatchMQ       = 42
	codeHeartBeat           = 34
	codeUnregisterClient    = 35
)

// codeSuccess is the response code of a request that succeeded.
const codeSuccess = 0

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

// ErrResponse is the error of a request the server answered with a failure code.
var ErrResponse = errors.New("rmqlock: the server refused the request")

// call sends one request to addr, on a connection of its own, and returns its response's
// body.
func call(ctx context.Context, addr string, code int, ext map[string]string, body []byte) ([]byte, error) {
	conn, err := dial(ctx, addr)
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
	stop   func() bool
	opaque int32 // the last request's id on this connection
}

// dial connects to addr; the connection's calls end with ctx (at its deadline, or within
// 5 s without one).
func dial(ctx context.Context, addr string) (*conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rmqlock: connect to %s: %w", addr, err)
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(5 * time.Second)
	}
	_ = c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	return &conn{Conn: c, addr: addr, stop: stop}, nil
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
	h, err := json.Marshal(header{Code: code, Language: "GO", Version: 317, Opaque: id, ExtFields: ext})
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
			return nil, fmt.Errorf("rmqlock: request %d to %s: %w: code %d: %s", code, addr, ErrResponse, rh.Code, rh.Remark)
		}
		return rest[hl:], nil
	}
}

// bareKey matches a JSON object key written as a bare number, as the name server writes
// the keys of a broker's addresses ({0:"127.0.0.1:10911"}).
var bareKey = regexp.MustCompile(`([{,])(-?[0-9]+):`)

// Route returns the address of the master of each broker that has queues of topic, by
// broker name, as a name server of nameServers tells it (the first that answers).
func Route(ctx context.Context, nameServers []string, topic string) (map[string]string, error) {
	var errs []error
	for _, ns := range nameServers {
		body, err := call(ctx, ns, codeGetRouteInfoByTopic, map[string]string{"topic": topic}, nil)
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
		if err := json.Unmarshal(bareKey.ReplaceAll(body, []byte(`$1"$2":`)), &route); err != nil {
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
func Lock(ctx context.Context, addr, group, clientID string, qs []Queue) ([]Queue, error) {
	body, err := json.Marshal(batchBody{ConsumerGroup: group, ClientID: clientID, MQSet: qs})
	if err != nil {
		return nil, fmt.Errorf("rmqlock: encode the lock request: %w", err)
	}
	resp, err := call(ctx, addr, codeLockBatchMQ, nil, body)
	if err != nil {
		return nil, err
	}
	var out struct {
		LockOKMQSet []Queue `json:"lockOKMQSet"`
	}
	if len(bytes.TrimSpace(resp)) == 0 {
		return nil, nil
	}
	if err := json.Unmarshal(resp, &out); err != nil {
		return nil, fmt.Errorf("rmqlock: decode the lock response from %s: %w", addr, err)
	}
	return out.LockOKMQSet, nil
}

// Unlock asks the broker at addr to release the locks clientID holds in group on qs. The
// broker releases only the locks that are clientID's: a queue another client holds stays
// theirs.
func Unlock(ctx context.Context, addr, group, clientID string, qs []Queue) error {
	body, err := json.Marshal(batchBody{ConsumerGroup: group, ClientID: clientID, MQSet: qs})
	if err != nil {
		return fmt.Errorf("rmqlock: encode the unlock request: %w", err)
	}
	_, err = call(ctx, addr, codeUnlockBatchMQ, nil, body)
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
// the broker has done when it answers. Both are requests a consumer makes itself; a broker
// that checks credentials (ACL) refuses them, unsigned.
func HeartbeatAndLeave(ctx context.Context, addr string, m Member) error {
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
	conn, err := dial(ctx, addr)
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
