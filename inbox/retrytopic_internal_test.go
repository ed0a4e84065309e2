package inbox

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeRemoting is a name server and broker in one, on 127.0.0.1, that speaks RocketMQ's
// remoting protocol (JSON headers): the route of a topic names it as the one broker; the
// retry topic has a route when retryExists; a heartbeat is answered with heartbeatCode. It
// records the codes of the requests it was sent, and the heartbeats' bodies.
type fakeRemoting struct {
	ln            net.Listener
	retryExists   bool
	heartbeatCode int
	wg            sync.WaitGroup

	mu         sync.Mutex
	codes      []int
	heartbeats []string
}

func newFakeRemoting(t *testing.T, retryExists bool, heartbeatCode int) *fakeRemoting {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &fakeRemoting{ln: ln, retryExists: retryExists, heartbeatCode: heartbeatCode}
	var conns sync.Map
	f.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Store(c, true)
			f.wg.Go(func() {
				defer conns.Delete(c)
				defer c.Close()
				f.serve(c)
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		conns.Range(func(c, _ any) bool { _ = c.(net.Conn).Close(); return true })
		f.wg.Wait()
	})
	return f
}

func (f *fakeRemoting) addr() string { return f.ln.Addr().String() }

type fakeHeader struct {
	Code      int               `json:"code"`
	Opaque    int32             `json:"opaque"`
	Flag      int               `json:"flag"`
	Remark    string            `json:"remark,omitempty"`
	ExtFields map[string]string `json:"extFields,omitempty"`
}

func (f *fakeRemoting) serve(c net.Conn) {
	for {
		var lens [8]byte
		if _, err := io.ReadFull(c, lens[:]); err != nil {
			return
		}
		total, hl := binary.BigEndian.Uint32(lens[0:4]), binary.BigEndian.Uint32(lens[4:8])&0xffffff
		rest := make([]byte, total-4)
		if _, err := io.ReadFull(c, rest); err != nil {
			return
		}
		var req fakeHeader
		if err := json.Unmarshal(rest[:hl], &req); err != nil {
			return
		}
		f.mu.Lock()
		f.codes = append(f.codes, req.Code)
		if req.Code == 34 {
			f.heartbeats = append(f.heartbeats, string(rest[hl:]))
		}
		f.mu.Unlock()
		resp, body := fakeHeader{Opaque: req.Opaque, Flag: 1}, []byte(nil)
		switch req.Code {
		case 105: // the route of a topic
			if strings.HasPrefix(req.ExtFields["topic"], "%RETRY%") && !f.retryExists {
				resp.Code, resp.Remark = 17, "No topic route info in name server for the topic"
				break
			}
			body = fmt.Appendf(nil, `{"brokerDatas":[{"brokerName":"broker-x","brokerAddrs":{0:%q}}],"queueDatas":[]}`, f.addr())
		case 34: // a heartbeat
			resp.Code, resp.Remark = f.heartbeatCode, "refused"
		}
		h, _ := json.Marshal(resp)
		frame := binary.BigEndian.AppendUint32(nil, uint32(4+len(h)+len(body)))
		frame = binary.BigEndian.AppendUint32(frame, uint32(len(h)))
		if _, err := c.Write(append(append(frame, h...), body...)); err != nil {
			return
		}
	}
}

func (f *fakeRemoting) requests() ([]int, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.codes...), append([]string(nil), f.heartbeats...)
}

// syncBuffer is a buffer safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func fakeConsumer(ns, topic string, logs io.Writer) *Consumer {
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return &Consumer{in: &Inbox{cfg: Config{Group: "cg_points"}, log: log},
		cfg: ConsumerConfig{NameServers: []string{ns}, Topic: topic, Tags: "ORDER_PAID || ORDER_CREATED", InstanceName: "inbox-1"}}
}

// Before the push consumer of a new group starts, its brokers are sent the group's
// heartbeat: the consumer's group and subscriptions (its topic and tags, and the retry
// topic), under a client id of its own, which then leaves the group.
func TestEnsureRetryTopicSendsTheGroupsHeartbeat(t *testing.T) {
	f := newFakeRemoting(t, false, 0)
	var logs syncBuffer
	c := fakeConsumer(f.addr(), "ORDER_EVENT", &logs)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond) // the fake never shows the retry topic
	defer cancel()
	c.ensureRetryTopic(ctx, nil)
	codes, heartbeats := f.requests()
	require.GreaterOrEqual(t, len(codes), 5, "requests: %v", codes)
	assert.Equal(t, []int{105, 105, 34, 35, 105}, codes[:5], "the retry topic's route, the topic's, heartbeat, unregister, the retry topic's route")
	require.Len(t, heartbeats, 1)
	var hb struct {
		ClientID      string `json:"clientID"`
		ConsumerDatas []struct {
			GroupName        string `json:"groupName"`
			ConsumeType      string `json:"consumeType"`
			MessageModel     string `json:"messageModel"`
			ConsumeFromWhere string `json:"consumeFromWhere"`
			Subscriptions    []struct {
				Topic     string   `json:"topic"`
				SubString string   `json:"subString"`
				Tags      []string `json:"tagsSet"`
				Codes     []int32  `json:"codeSet"`
			} `json:"subscriptionDataSet"`
		} `json:"consumerDataSet"`
	}
	require.NoError(t, json.Unmarshal([]byte(heartbeats[0]), &hb))
	assert.Equal(t, "inbox-retry-topic@inbox-1", hb.ClientID)
	require.Len(t, hb.ConsumerDatas, 1)
	cd := hb.ConsumerDatas[0]
	assert.Equal(t, "cg_points", cd.GroupName)
	assert.Equal(t, "CONSUME_PASSIVELY", cd.ConsumeType)
	assert.Equal(t, "CLUSTERING", cd.MessageModel)
	assert.Equal(t, "CONSUME_FROM_FIRST_OFFSET", cd.ConsumeFromWhere)
	require.Len(t, cd.Subscriptions, 2)
	assert.Equal(t, "%RETRY%cg_points", cd.Subscriptions[0].Topic)
	assert.Equal(t, "*", cd.Subscriptions[0].SubString)
	assert.Empty(t, cd.Subscriptions[0].Tags)
	assert.Equal(t, "ORDER_EVENT", cd.Subscriptions[1].Topic)
	assert.Equal(t, []string{"ORDER_PAID", "ORDER_CREATED"}, cd.Subscriptions[1].Tags)
	assert.Equal(t, []int32{javaHash("ORDER_PAID"), javaHash("ORDER_CREATED")}, cd.Subscriptions[1].Codes)
	assert.Contains(t, logs.String(), "the name servers do not know the group's retry topic after the group's heartbeat")
	assert.NotContains(t, logs.String(), "level=WARN")
}

// javaHash is Java's String.hashCode of an ASCII s.
func javaHash(s string) int32 {
	var h int32
	for _, b := range []byte(s) {
		h = 31*h + int32(b)
	}
	return h
}

// A broker that refuses the heartbeat (one that checks credentials refuses it unsigned)
// leaves the start as it was, said at debug: nothing more is sent.
func TestEnsureRetryTopicRefusedFallsBack(t *testing.T) {
	f := newFakeRemoting(t, false, 16) // NO_PERMISSION
	var logs syncBuffer
	c := fakeConsumer(f.addr(), "ORDER_EVENT", &logs)
	c.ensureRetryTopic(context.Background(), nil)
	codes, _ := f.requests()
	assert.Equal(t, []int{105, 105, 34}, codes, "the routes, and the heartbeat refused")
	assert.Contains(t, logs.String(), "level=DEBUG msg=\"inbox: could not send a broker the group's heartbeat ahead of the consumer's")
	assert.Contains(t, logs.String(), "code 16: refused")
	assert.NotContains(t, logs.String(), "level=WARN")
}

// A group whose retry topic exists costs the start one route request.
func TestEnsureRetryTopicOfAGroupThatRanBefore(t *testing.T) {
	f := newFakeRemoting(t, true, 0)
	var logs syncBuffer
	fakeConsumer(f.addr(), "ORDER_EVENT", &logs).ensureRetryTopic(context.Background(), nil)
	codes, _ := f.requests()
	assert.Equal(t, []int{105}, codes)
	assert.Empty(t, logs.String())
}

// A name server that cannot be reached leaves the start to the client, which reports it.
func TestEnsureRetryTopicWithoutANameServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	var logs syncBuffer
	fakeConsumer(addr, "ORDER_EVENT", &logs).ensureRetryTopic(context.Background(), nil)
	assert.Contains(t, logs.String(), "could not read the topic's route")
	assert.NotContains(t, logs.String(), "level=WARN")
}
