package inbox_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox/internal/rmqlock"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// A consumer of a new group, whose retry topic (%RETRY%group) does not exist yet, starts
// without the RocketMQ client's warnings that it does not exist: before, the client looked
// its route up at its start and rebalanced on it before the broker had created it at the
// group's first heartbeat, and warned each time until its route refresh 30 s later (6
// warnings on one broker, 12 on two). The consumer runs in a process of its own, its
// client's logs routed by outbox.RouteRocketMQClientLogs and every record at warn or above
// announced to the test: from its start to past the client's first periodic rebalance (20 s)
// the client announces none. Its deliveries go on as before: the events are handled and
// acknowledged (a second consumer of the group, started afterwards, is delivered none of them
// again), and one whose first delivery fails comes again through the retry topic at
// RocketMQ's first backoff (10 s), not once the client's route refresh has found the topic.
func TestConsumerStartOfANewGroupIsQuiet(t *testing.T) {
	t.Parallel()
	r := newConsRig(t, consRigOptions{}) // no retry topic made beforehand
	retry := "%RETRY%" + r.group
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := rmqlock.Client{}.Route(ctx, []string{testsvc.RocketMQNameServer(t)}, retry)
	require.ErrorIs(t, err, rmqlock.ErrResponse, "the new group's retry topic does not exist yet")

	r.publish(t)
	ok := r.insert(t, "ORD-OK", 5)
	flaky := r.insertOne(t, "FLAKY", `{"flaky":true}`)
	start := time.Now()
	p := r.startConsumer(t, os.Args[0], childConfig{Name: "first", Loud: true, FailOnceEvent: flaky})
	r.waitEffects(t, len(ok), 30*time.Second)
	tries := func() []call {
		var out []call
		for _, c := range p.handlerCalls() {
			if c.EventID == flaky {
				out = append(out, c)
			}
		}
		return out
	}
	assert.Eventually(t, func() bool { return len(tries()) >= 2 }, 25*time.Second, 100*time.Millisecond,
		"the failing event comes again at RocketMQ's first backoff (10 s), not after the client's route refresh")
	time.Sleep(time.Until(start.Add(23 * time.Second))) // past the client's first periodic rebalance
	assert.Empty(t, clientRecords(p.loudRecords()), "the RocketMQ client's warnings and errors from the start of a new group's consumer")
	if t.Failed() {
		return
	}

	got := tries()
	require.Len(t, got, 2, "the failing event's deliveries")
	assert.Equal(t, 1, got[0].Deliveries)
	assert.Empty(t, got[0].RetryTopic, "its first delivery, from the topic")
	assert.Equal(t, 2, got[1].Deliveries)
	assert.Equal(t, r.topic, got[1].RetryTopic, "its second delivery, sent back from the topic through the retry topic")
	assert.Less(t, got[1].At.Sub(got[0].At), 25*time.Second, "the redelivery at RocketMQ's first backoff")
	p.stop(t)
	byID := r.checkLedger(t)
	assert.Equal(t, 2, byID[flaky][0].Deliveries, "the failing event's effect on its second delivery")

	// The group's offsets were acknowledged: its next consumer starts after them, and its
	// start (the retry topic there) is as quiet.
	next := r.startConsumer(t, os.Args[0], childConfig{Name: "next", Loud: true})
	time.Sleep(5 * time.Second)
	assert.Empty(t, next.handlerCalls(), "deliveries to the group's next consumer of events acknowledged")
	assert.Empty(t, clientRecords(next.loudRecords()), "the RocketMQ client's warnings and errors at the start of the group's next consumer")
	next.stop(t)
}

// clientRecords are the records of loud that the RocketMQ client logged.
func clientRecords(loud []string) []string {
	var out []string
	for _, l := range loud {
		if strings.Contains(l, "component=rocketmq-client") {
			out = append(out, l)
		}
	}
	return out
}
