package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/go-outbox/outbox"
)

// delivery is one message as the consumer received it.
type delivery struct {
	BizNo    string
	EventID  string
	UniqKey  string // the client's message id, shared by the tries of one SendSync call (single messages only)
	Store    string // broker/queue/offset: one stored message, however often it is delivered
	Born     time.Time
	Received time.Time
	BodyOK   bool // the body names the same biz no as the property
}

// recorder is a real push consumer that records every message of the run's topic.
type recorder struct {
	pc rocketmq.PushConsumer

	tag string // the run's biz no prefix

	mu         sync.Mutex
	deliveries []delivery
	distinct   map[string]struct{} // biz nos of this run received
}

func startRecorder(namesrv []string, topic, group, tag string) (*recorder, error) {
	r := &recorder{tag: tag, distinct: map[string]struct{}{}}
	pc, err := rocketmq.NewPushConsumer(
		consumer.WithNameServer(namesrv),
		consumer.WithGroupName(group),
		consumer.WithInstance(group),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
	)
	if err != nil {
		return nil, fmt.Errorf("new push consumer: %w", err)
	}
	err = pc.Subscribe(topic, consumer.MessageSelector{}, func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		r.record(msgs)
		return consumer.ConsumeSuccess, nil
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", topic, err)
	}
	if err := pc.Start(); err != nil {
		return nil, fmt.Errorf("start push consumer: %w", err)
	}
	r.pc = pc
	return r, nil
}

func (r *recorder) record(msgs []*primitive.MessageExt) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		biz := m.GetProperty(outbox.PropertyBizNo)
		store := m.OffsetMsgId
		if m.Queue != nil {
			store = fmt.Sprintf("%s/%d/%d", m.Queue.BrokerName, m.Queue.QueueId, m.QueueOffset)
		}
		r.deliveries = append(r.deliveries, delivery{
			BizNo:    biz,
			EventID:  m.GetProperty(outbox.PropertyEventID),
			UniqKey:  m.GetProperty(primitive.PropertyUniqueClientMessageIdKeyIndex),
			Store:    store,
			Born:     time.UnixMilli(m.BornTimestamp),
			Received: now,
			BodyOK:   bytes.Contains(m.Body, []byte(`"bizNo":"`+biz+`"`)),
		})
		if strings.HasPrefix(biz, r.tag+"-") {
			r.distinct[biz] = struct{}{}
		}
	}
}

// distinctCount counts the distinct biz nos of this run received so far.
func (r *recorder) distinctCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.distinct)
}

// firstBornAfter returns when the first message born at or after t was received.
func (r *recorder) firstBornAfter(t time.Time) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var first time.Time
	for _, d := range r.deliveries {
		if !d.Born.Before(t.Truncate(time.Millisecond)) && (first.IsZero() || d.Received.Before(first)) {
			first = d.Received
		}
	}
	return first, !first.IsZero()
}

// snapshot returns a copy of every delivery so far.
func (r *recorder) snapshot() []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivery(nil), r.deliveries...)
}

func (r *recorder) shutdown() {
	if r.pc != nil {
		_ = r.pc.Shutdown()
	}
}
