package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/go-outbox/outbox"
)

// CreateTopics creates (or updates) the topics names, four queues each, on every broker of
// brokers, as scripts/rocketmq.sh topic does, and waits until each has a route. The topics
// are kept: a later run reuses them.
func CreateTopics(ctx context.Context, nameServers, brokers []string, names ...string) error {
	adm, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver(nameServers)))
	if err != nil {
		return fmt.Errorf("rocketmq admin: %w", err)
	}
	defer adm.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, name := range names {
		for _, broker := range brokers {
			if err := adm.CreateTopic(ctx, admin.WithTopicCreate(name), admin.WithBrokerAddrCreate(broker),
				admin.WithReadQueueNums(4), admin.WithWriteQueueNums(4)); err != nil {
				return fmt.Errorf("create topic %s on %s: %w", name, broker, err)
			}
		}
		for {
			mqs, err := adm.FetchPublishMessageQueues(ctx, name)
			if err == nil && len(mqs) > 0 {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("topic %s has no route after a minute: %w", name, err)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

// RoutedTopics returns the store routes of a drain whose events cycle over topics by event
// type: a biz no's event j is of type EventType(j), routed to topics[j mod len(topics)].
func RoutedTopics(topics []string) outbox.Routes {
	r := outbox.Routes{Topic: topics[0], Topics: topics[1:], ByType: map[string]string{}}
	for i, t := range topics {
		r.ByType[EventType(i)] = t
	}
	return r
}

// EventType is the event type of a drain's events that go to its (j mod n)th topic.
func EventType(j int) string { return fmt.Sprintf("EVENT_%d", j) }
