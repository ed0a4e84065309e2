package inbox

import (
	"log/slog"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/assert"

	"github.com/go-outbox/outbox/internal/rmqlock"
)

// The keeper follows the rebalances through the allocation strategy: a queue a rebalance
// takes from the consumer is refused until one gives it back, and is to be unlocked once no
// handler runs on it; a queue given is to be locked until a delivery shows the client has it.
func TestQueueKeeperFollowsTheRebalances(t *testing.T) {
	k := newQueueKeeper(nil, rmqlock.Client{}, slog.New(slog.DiscardHandler))
	var mqs []*primitive.MessageQueue
	for i := range 4 {
		mqs = append(mqs, &primitive.MessageQueue{Topic: "T", BrokerName: "broker-a", QueueId: i})
	}
	assert.Len(t, k.allocate("g", "10.0.0.1@a", mqs, []string{"10.0.0.1@a"}), 4, "alone, every queue")
	assert.Len(t, k.pending, 4)

	assert.True(t, k.enter(*mqs[3]), "a queue held is handled")
	assert.NotContains(t, k.pending, queueOf(*mqs[3]), "a delivery shows the client holds the queue")

	mine := k.allocate("g", "10.0.0.1@a", mqs, []string{"10.0.0.1@a", "10.0.0.1@b"})
	assert.Equal(t, []*primitive.MessageQueue{mqs[0], mqs[1]}, mine, "the client's default allocation")
	assert.False(t, k.enter(*mqs[2]), "a queue given up is refused")
	assert.True(t, k.enter(*mqs[0]), "a queue kept is handled")
	assert.Contains(t, k.given, queueOf(*mqs[3]))
	assert.Equal(t, 1, k.inflight[queueOf(*mqs[3])], "the handler that ran when the queue was given up still runs")
	k.exit(*mqs[3])
	assert.NotContains(t, k.inflight, queueOf(*mqs[3]))

	k.allocate("g", "10.0.0.1@a", mqs, []string{"10.0.0.1@a"})
	assert.True(t, k.enter(*mqs[2]), "a queue given back is handled again")
	assert.Empty(t, k.given)
	assert.Equal(t, "10.0.0.1@a", k.clientID)
	assert.Len(t, k.all["T"], 4)
}
