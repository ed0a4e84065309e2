package rmqlock_test

import (
	"context"
	"os"
	"testing"
	"time"

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

	route, err := rmqlock.Route(ctx, []string{"127.0.0.1:1", ns}, topic)
	require.NoError(t, err)
	require.Len(t, route, 1, "the topic is on one broker")
	var broker, addr string
	for broker, addr = range route {
	}
	qs := make([]rmqlock.Queue, 4)
	for i := range qs {
		qs[i] = rmqlock.Queue{Topic: topic, BrokerName: broker, QueueID: i}
	}

	got, err := rmqlock.Lock(ctx, addr, group, "10.0.0.1@a", qs)
	require.NoError(t, err)
	assert.ElementsMatch(t, qs, got, "free queues are granted")
	got, err = rmqlock.Lock(ctx, addr, group, "10.0.0.1@b", qs)
	require.NoError(t, err)
	assert.Empty(t, got, "queues another client holds are not")

	require.NoError(t, rmqlock.Unlock(ctx, addr, group, "10.0.0.1@b", qs))
	got, err = rmqlock.Lock(ctx, addr, group, "10.0.0.1@b", qs)
	require.NoError(t, err)
	assert.Empty(t, got, "an unlock by another client id leaves the locks")

	require.NoError(t, rmqlock.Unlock(ctx, addr, group, "10.0.0.1@a", qs[:2]))
	got, err = rmqlock.Lock(ctx, addr, group, "10.0.0.1@b", qs)
	require.NoError(t, err)
	assert.ElementsMatch(t, qs[:2], got, "the holder's unlock frees its queues for the next")

	_, err = rmqlock.Route(ctx, []string{"127.0.0.1:1"}, topic)
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
	_, err := rmqlock.Route(ctx, []string{ns}, retry)
	require.ErrorIs(t, err, rmqlock.ErrResponse, "a new group has no retry topic")
	route, err := rmqlock.Route(ctx, []string{ns}, topic)
	require.NoError(t, err)
	for _, addr := range route {
		require.NoError(t, rmqlock.HeartbeatAndLeave(ctx, addr, rmqlock.Member{
			ClientID: "10.0.0.1@hb", Group: group, ConsumeType: "CONSUME_PASSIVELY", MessageModel: "CLUSTERING",
			ConsumeFromWhere: "CONSUME_FROM_FIRST_OFFSET", Subscriptions: map[string]string{topic: "A || B", retry: "*"},
		}))
	}
	got, err := rmqlock.Route(ctx, []string{ns}, retry)
	require.NoError(t, err, "the retry topic is routed once the broker has answered")
	assert.Equal(t, route, got, "on the topic's brokers")
}
