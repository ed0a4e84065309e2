// Command orderlyconsumer is the orderly push consumer the tests read through
// testsvc.ConsumeOrderly. It runs in a process of its own because the client's orderly
// consumer has a data race of its own (rocketmq-client-go, consumer/process_queue.go:
// takeMessages polls the message cache's size without the lock that putMessage writes it
// under), which -race reports in any test binary that runs one.
//
// It subscribes a new consumer group to -topic from the first offset, consuming orderly,
// prints one JSON line per delivery on stdout ({"ready":true} first, once started), and shuts
// down when its stdin closes, no sooner than 3 s after its start (the client races its own
// start-up rebalance on Shutdown).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/rlog"
)

// Delivery is one line of output.
type Delivery struct {
	Ready       bool                   `json:"ready,omitempty"`
	BizNo       string                 `json:"bizNo,omitempty"`
	EventID     string                 `json:"eventId,omitempty"`
	Queue       primitive.MessageQueue `json:"queue"`
	StoreHost   string                 `json:"storeHost,omitempty"`
	QueueOffset int64                  `json:"queueOffset,omitempty"`
	Refused     bool                   `json:"refused,omitempty"`
}

func main() {
	ns := flag.String("namesrv", "127.0.0.1:9876", "name server address")
	topic := flag.String("topic", "", "topic to consume")
	group := flag.String("group", "", "consumer group")
	instance := flag.String("instance", "", "client instance name")
	pause := flag.Duration("pause", 100*time.Millisecond, "pause of a queue after a refused delivery")
	refuseOnce := flag.String("refuse-once", "", "comma-separated eventIds whose first delivery is refused")
	flag.Parse()
	if err := run(*ns, *topic, *group, *instance, *pause, *refuseOnce); err != nil {
		fmt.Fprintln(os.Stderr, "orderlyconsumer:", err)
		os.Exit(1)
	}
}

func run(ns, topic, group, instance string, pause time.Duration, refuseOnce string) error {
	rlog.SetLogLevel("error")
	refuse := map[string]bool{}
	for id := range strings.SplitSeq(refuseOnce, ",") {
		if id != "" {
			refuse[id] = true
		}
	}
	var mu sync.Mutex
	out := json.NewEncoder(os.Stdout)
	pc, err := rocketmq.NewPushConsumer(
		consumer.WithNameServer([]string{ns}),
		consumer.WithGroupName(group),
		consumer.WithInstance(instance),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
		consumer.WithConsumerOrder(true),
		// Used when a queue's lock could not be had; a refused delivery's pause is set on
		// each call's orderly context below.
		consumer.WithSuspendCurrentQueueTimeMillis(pause),
	)
	if err != nil {
		return fmt.Errorf("new push consumer: %w", err)
	}
	err = pc.Subscribe(topic, consumer.MessageSelector{}, func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		// The client pauses a queue after SuspendCurrentQueueAMoment for the time in the
		// call's orderly context, which it leaves at -1 (no pause: the message would come
		// again in a busy loop) whatever the consumer's options say.
		if octx, ok := primitive.GetOrderlyCtx(ctx); ok {
			octx.SuspendCurrentQueueTimeMillis = int(pause / time.Millisecond)
		}
		mu.Lock()
		defer mu.Unlock()
		result := consumer.ConsumeSuccess
		for _, m := range msgs {
			d := Delivery{BizNo: m.GetProperty("bizNo"), EventID: m.GetProperty("eventId"), StoreHost: m.StoreHost, QueueOffset: m.QueueOffset}
			if m.Queue != nil {
				d.Queue = *m.Queue
			}
			if refuse[d.EventID] {
				delete(refuse, d.EventID)
				d.Refused = true
				result = consumer.SuspendCurrentQueueAMoment
			}
			if err := out.Encode(d); err != nil {
				return consumer.SuspendCurrentQueueAMoment, err
			}
		}
		return result, nil
	})
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", topic, err)
	}
	if err := pc.Start(); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	started := time.Now()
	mu.Lock()
	err = out.Encode(Delivery{Ready: true})
	mu.Unlock()
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, bufio.NewReader(os.Stdin))
	time.Sleep(time.Until(started.Add(3 * time.Second)))
	return pc.Shutdown()
}
