package rmqlock_test

import (
	"context"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox/internal/rmqlock"
	"github.com/go-outbox/outbox/internal/testsvc"
)

func TestMain(m *testing.M) { os.Exit(testsvc.RunWithLeakCheck(m)) }

// The broker grants a queue's lock to one client id of a group at a time; an unlock by
// another client id leaves it, an unlock by the holder frees it for the next.
func TestLockAndUnlockAtTheBroker(t *testing.T) {
	ns := testsvc.RocketMQNameServer(t)
	topic := testsvc.NewTopic(t, "RMQLOCK")
	group := testsvc.UniqueTable("cg_lock")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cl rmqlock.Client

	route, err := cl.Route(ctx, []string{"127.0.0.1:1", ns}, topic)
	require.NoError(t, err)
	require.Len(t, route, 1, "the topic is on one broker")
	var broker, addr string
	for broker, addr = range route {
	}
	qs := make([]rmqlock.Queue, 4)
	for i := range qs {
		qs[i] = rmqlock.Queue{Topic: topic, BrokerName: broker, QueueID: i}
	}

	got, err := cl.Lock(ctx, addr, group, "10.0.0.1@a", qs)
	require.NoError(t, err)
	assert.ElementsMatch(t, qs, got, "free queues are granted")
	got, err = cl.Lock(ctx, addr, group, "10.0.0.1@b", qs)
	require.NoError(t, err)
	assert.Empty(t, got, "queues another client holds are not")

	require.NoError(t, cl.Unlock(ctx, addr, group, "10.0.0.1@b", qs))
	got, err = cl.Lock(ctx, addr, group, "10.0.0.1@b", qs)
	require.NoError(t, err)
	assert.Empty(t, got, "an unlock by another client id leaves the locks")

	require.NoError(t, cl.Unlock(ctx, addr, group, "10.0.0.1@a", qs[:2]))
	got, err = cl.Lock(ctx, addr, group, "10.0.0.1@b", qs)
	require.NoError(t, err)
	assert.ElementsMatch(t, qs[:2], got, "the holder's unlock frees its queues for the next")

	_, err = cl.Route(ctx, []string{"127.0.0.1:1"}, topic)
	assert.Error(t, err)
}

// A heartbeat of a new group makes the broker create the group's retry topic, which the
// name server routes as soon as the broker has answered; the member then leaves the group.
func TestHeartbeatAndLeaveCreatesTheRetryTopic(t *testing.T) {
	ns := testsvc.RocketMQNameServer(t)
	topic := testsvc.NewTopic(t, "RMQHB")
	group := testsvc.UniqueTable("cg_hb")
	retry := "%RETRY%" + group
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cl rmqlock.Client
	_, err := cl.Route(ctx, []string{ns}, retry)
	require.ErrorIs(t, err, rmqlock.ErrResponse, "a new group has no retry topic")
	route, err := cl.Route(ctx, []string{ns}, topic)
	require.NoError(t, err)
	for _, addr := range route {
		require.NoError(t, cl.HeartbeatAndLeave(ctx, addr, rmqlock.Member{
			ClientID: "10.0.0.1@hb", Group: group, ConsumeType: "CONSUME_PASSIVELY", MessageModel: "CLUSTERING",
			ConsumeFromWhere: "CONSUME_FROM_FIRST_OFFSET", Subscriptions: map[string]string{topic: "A || B", retry: "*"},
		}))
	}
	got, err := cl.Route(ctx, []string{ns}, retry)
	require.NoError(t, err, "the retry topic is routed once the broker has answered")
	assert.Equal(t, route, got, "on the topic's brokers")
}

// A broker with ACL 2.0 on refuses an unsigned request, and one signed with a wrong
// secret, as its ACL's (Denied); signed with a user's credentials, the lock, the unlock and
// the heartbeat are granted.
func TestSignedRequestsPassTheBrokersACL(t *testing.T) {
	acl := testsvc.RocketMQACL(t)
	topic := acl.NewTopic(t, "RMQACL")
	group := testsvc.UniqueTable("cg_acl")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	user := acl.User
	signed := rmqlock.Client{Credentials: user}

	route, err := signed.Route(ctx, []string{acl.NameServer}, topic)
	require.NoError(t, err)
	require.Len(t, route, 1)
	var broker, addr string
	for broker, addr = range route {
	}
	qs := []rmqlock.Queue{{Topic: topic, BrokerName: broker, QueueID: 0}, {Topic: topic, BrokerName: broker, QueueID: 1}}

	for name, cl := range map[string]rmqlock.Client{
		"unsigned":     {},
		"wrong secret": {Credentials: primitive.Credentials{AccessKey: user.AccessKey, SecretKey: user.SecretKey + "x"}},
		"unknown user": {Credentials: primitive.Credentials{AccessKey: "nobody", SecretKey: user.SecretKey}},
	} {
		_, err := cl.Lock(ctx, addr, group, "10.0.0.1@a", qs)
		require.Error(t, err, name)
		assert.True(t, rmqlock.Denied(err), "%s: refused by the ACL: %v", name, err)
		assert.ErrorIs(t, err, rmqlock.ErrResponse, name)
	}

	got, err := signed.Lock(ctx, addr, group, "10.0.0.1@a", qs)
	require.NoError(t, err)
	assert.ElementsMatch(t, qs, got, "signed, the lock is granted")
	got, err = signed.Lock(ctx, addr, group, "10.0.0.1@b", qs)
	require.NoError(t, err)
	assert.Empty(t, got, "and held for its client id")
	require.NoError(t, signed.Unlock(ctx, addr, group, "10.0.0.1@a", qs))
	got, err = signed.Lock(ctx, addr, group, "10.0.0.1@b", qs)
	require.NoError(t, err)
	assert.ElementsMatch(t, qs, got, "the signed unlock released it")

	require.NoError(t, signed.HeartbeatAndLeave(ctx, addr, rmqlock.Member{
		ClientID: "10.0.0.1@hb", Group: group, ConsumeType: "CONSUME_PASSIVELY", MessageModel: "CLUSTERING",
		ConsumeFromWhere: "CONSUME_FROM_FIRST_OFFSET", Subscriptions: map[string]string{topic: "*"},
	}), "a signed heartbeat is accepted")
}

// Over TLS (the servers accept it beside plain connections), the requests are answered as
// over plain TCP.
func TestRequestsOverTLS(t *testing.T) {
	ns := testsvc.RocketMQNameServer(t)
	topic := testsvc.NewTopic(t, "RMQTLS")
	group := testsvc.UniqueTable("cg_tls")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := rmqlock.Client{TLS: true}
	route, err := cl.Route(ctx, []string{ns}, topic)
	require.NoError(t, err)
	require.Len(t, route, 1)
	for broker, addr := range route {
		qs := []rmqlock.Queue{{Topic: topic, BrokerName: broker, QueueID: 0}}
		got, err := cl.Lock(ctx, addr, group, "10.0.0.1@tls", qs)
		require.NoError(t, err)
		assert.Equal(t, qs, got)
		require.NoError(t, cl.Unlock(ctx, addr, group, "10.0.0.1@tls", qs))
	}
}

// A client with TLS opens its connections with a TLS handshake; one without sends the
// request's frame at once. Told apart by the first byte a listener reads: 0x16, a TLS
// handshake record, or the frame's length, which starts with 0 for any request this small.
func TestTLSIsWhatTheClientSpeaks(t *testing.T) {
	for _, tc := range []struct {
		cl   rmqlock.Client
		want byte
	}{{rmqlock.Client{TLS: true}, 0x16}, {rmqlock.Client{}, 0}} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		first := make(chan byte, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				close(first)
				return
			}
			defer c.Close()
			var b [1]byte
			if _, err := io.ReadFull(c, b[:]); err == nil {
				first <- b[0]
			}
			close(first)
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = tc.cl.Route(ctx, []string{ln.Addr().String()}, "T")
		cancel()
		assert.Error(t, err, "the listener never answers")
		assert.Equal(t, tc.want, <-first, "TLS %v", tc.cl.TLS)
		require.NoError(t, ln.Close())
	}
}
