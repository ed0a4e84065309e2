package inbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// A clean Close of the inbox consumer is quiet: consumers of a topic a publisher fills at
// a steady rate, closed one after the other (after they have handled deliveries, and while
// they are still starting), log nothing at warn or above, neither the inbox nor the
// RocketMQ client, at the close or in the 32 s after it (the client shuts a consumer down
// with a long-polling pull in flight, which ends by its own timeout 30 s later). Each
// consumer runs in a process of its own, without the race detector: the client's shutdown
// closes a queue's message channel while its pull may still send to it, which -race reports
// (see consumerChildEnv).
func TestConsumerCloseIsQuiet(t *testing.T) {
	bin, err := plainTestBinary()
	require.NoError(t, err)
	r := newConsRig(t, consRigOptions{})
	r.publish(t)
	stop := make(chan struct{})
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			tx, err := r.store.BeginTx(context.Background(), nil)
			if err != nil {
				return
			}
			_, err = tx.InsertEvent(context.Background(), outbox.EventInput{BizNo: fmt.Sprintf("Q-%d", i), EventType: "QUIET", Payload: []byte("{}")})
			if err != nil || tx.Commit() != nil {
				_ = tx.Rollback()
				return
			}
		}
	}()
	defer func() { close(stop); <-loaded }()
	const closes = 5
	procs := make([]*consumerProc, 0, closes)
	for i := range closes {
		p := r.startConsumer(t, bin, childConfig{Name: fmt.Sprintf("c%d", i), Loud: true, Linger: 32 * time.Second})
		procs = append(procs, p)
		if i%3 != 2 {
			n := r.countEffects()
			require.Eventually(t, func() bool { return r.countEffects() > n }, time.Minute, 50*time.Millisecond,
				"consumer %d handles deliveries", i)
		}
		require.NoError(t, p.stdin.Close()) // the consumer closes; the process lingers
	}
	for i, p := range procs {
		select {
		case <-p.exited:
		case <-time.After(2 * time.Minute):
			t.Fatalf("consumer process %d did not exit", i)
		}
		require.NoError(t, p.waitErr(), "consumer process %d's exit", i)
		assert.Empty(t, p.loudRecords(), "consumer process %d logged at warn or above", i)
	}
}
