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
