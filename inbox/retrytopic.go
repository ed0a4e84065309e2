package inbox

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/apache/rocketmq-client-go/v2"

	"github.com/go-outbox/outbox/internal/rmqlock"
)

// retryTopicTimeout bounds Start's making of the group's retry topic.
const retryTopicTimeout = 5 * time.Second

// retryTopicPoll is how often Start reads the retry topic's route while it waits for it.
const retryTopicPoll = 50 * time.Millisecond

// pushMember is what the client's push consumer tells of itself in its heartbeats.
type pushMember interface {
	GetModel() string
	GetcType() string
	GetWhere() string
	IsUnitMode() bool
}

// ensureRetryTopic makes the group's retry topic, %RETRY%group, routable before push
// starts, when the name servers do not know it yet (a new group).
//
// A push consumer in clustering mode subscribes to its group's retry topic, and its start
// reads the route of every topic it subscribes to (rocketmq-client-go: consumer/consumer.go,
// defaultConsumer.start; consumer/push_consumer.go, Start; internal/client.go, Start) before
// its first heartbeat, at which the broker creates the group's retry topic
// (ClientManageProcessor.heartBeat). Without the topic, each read of its route and each
// rebalance until the client's next route refresh (30 s later) logs a warning that it does not
// exist, and the group's redeliveries wait for that refresh. So, before the push consumer
// starts, the broker of each queue of the topic is sent the heartbeat the consumer would send
// (its group and subscriptions, under a client id of its own), and the consumer then leaves
// the group again (it unregisters, on the same connection): the broker creates the retry
// topic and registers it at the name servers before it answers. The member is in the group
// for the milliseconds between the two requests; another consumer of the group that
// rebalances meanwhile counts it, as it would any consumer that joins and leaves. Where this
// cannot be done (a broker whose ACL refuses the consumer's credentials, say), it
// is logged at debug and the consumer starts as it would have: the client warns until its
// route refresh finds the topic. The names are the configured ones: with a namespace given in
// ConsumerOptions, the client's are others, and the topic's bare name has, as a rule, no
// route to send anything to.
func (c *Consumer) ensureRetryTopic(ctx context.Context, push rocketmq.PushConsumer) {
	member := rmqlock.Member{
		ClientID: "inbox-retry-topic@" + c.cfg.InstanceName, Group: c.in.cfg.Group,
		ConsumeType: "CONSUME_PASSIVELY", MessageModel: "CLUSTERING", ConsumeFromWhere: "CONSUME_FROM_FIRST_OFFSET",
	}
	if pm, ok := push.(pushMember); ok {
		if pm.GetModel() != "Clustering" {
			return // no retry topic: a broadcasting consumer's failed deliveries are not sent back
		}
		member.ConsumeType, member.ConsumeFromWhere, member.UnitMode = pm.GetcType(), pm.GetWhere(), pm.IsUnitMode()
	}
	retry := "%RETRY%" + c.in.cfg.Group
	member.Subscriptions = map[string]string{c.cfg.Topic: c.cfg.Tags, retry: "*"}
	ctx, cancel := context.WithTimeout(ctx, retryTopicTimeout)
	defer cancel()
	cl := c.lockClient()
	if route, err := cl.Route(ctx, c.cfg.NameServers, retry); err == nil && len(route) > 0 {
		return // the group has run before
	}
	start := time.Now()
	log := c.in.log.With(slog.String("topic", c.cfg.Topic), slog.String("group", c.in.cfg.Group), slog.String("retry_topic", retry))
	route, err := cl.Route(ctx, c.cfg.NameServers, c.cfg.Topic)
	if err != nil || len(route) == 0 {
		log.DebugContext(ctx, "inbox: could not read the topic's route to have its brokers create the group's retry topic; "+
			"the RocketMQ client warns that the retry topic does not exist until it finds it", slog.Any("error", err))
		return
	}
	sent := 0
	for _, broker := range slices.Sorted(maps.Keys(route)) {
		if err := cl.HeartbeatAndLeave(ctx, route[broker], member); err != nil {
			log.DebugContext(ctx, "inbox: could not send a broker the group's heartbeat ahead of the consumer's; it creates the group's retry topic "+
				"at the consumer's own, and the RocketMQ client warns that the retry topic does not exist until it finds it",
				slog.String("broker", broker), slog.Any("error", err))
			continue
		}
		sent++
	}
	if sent == 0 {
		return
	}
	for {
		if r, err := cl.Route(ctx, c.cfg.NameServers, retry); err == nil && len(r) > 0 {
			log.DebugContext(ctx, "inbox: the brokers created the group's retry topic", slog.Duration("took", time.Since(start)))
			return
		}
		select {
		case <-ctx.Done():
			log.DebugContext(ctx, "inbox: the name servers do not know the group's retry topic after the group's heartbeat; "+
				"the RocketMQ client warns that it does not exist until it finds it", slog.Duration("waited", time.Since(start)))
			return
		case <-time.After(retryTopicPoll):
		}
	}
}
