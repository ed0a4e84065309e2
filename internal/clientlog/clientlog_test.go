package clientlog

import (
	"errors"
	"testing"
	"time"
)

func TestOrphanedPull(t *testing.T) {
	const msg = "pull message from broker error"
	timeout := map[string]any{"underlayError": "request timeout"}
	closed := map[string]any{"underlayError": "write tcp 127.0.0.1:1->127.0.0.1:2: use of closed network connection"}
	refused := map[string]any{"underlayError": "dial tcp 127.0.0.1:10911: connect: connection refused"}

	lastShutdown.Store(0)
	now := time.Now()
	if OrphanedPull(msg, timeout, now) {
		t.Error("a pull's timeout with no consumer shut down is a fault")
	}
	ConsumerShutDown()
	now = time.Now()
	for _, c := range []struct {
		name   string
		msg    string
		fields map[string]any
		at     time.Time
		want   bool
	}{
		{"timeout after a shutdown", msg, timeout, now.Add(30 * time.Second), true},
		{"closed connection after a shutdown", msg, closed, now.Add(time.Second), true},
		{"another cause", msg, refused, now.Add(time.Second), false},
		{"another warning", "pull broker timeout", timeout, now.Add(time.Second), false},
		{"long after the shutdown", msg, timeout, now.Add(time.Minute), false},
		{"no cause", msg, nil, now, false},
	} {
		if got := OrphanedPull(c.msg, c.fields, c.at); got != c.want {
			t.Errorf("%s: OrphanedPull = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestInterruptedRebalance(t *testing.T) {
	const addFailed = "do defaultConsumer, add a new mq failed"
	stopped := map[string]any{"underlayError": "service close is not running, please check"}
	lastShutdown.Store(0)
	now := time.Now()
	if !InterruptedRebalance("fetch offset of mq from broker error", stopped, now) {
		t.Error("a call on a client shut down is its shutdown's")
	}
	if InterruptedRebalance(addFailed, nil, now) {
		t.Error("a queue not added with no consumer shut down is a fault")
	}
	if InterruptedRebalance("fetch offset of mq from broker error", map[string]any{"underlayError": "request timeout"}, now) {
		t.Error("a request timeout with no consumer shut down is a fault")
	}
	if !InterruptedRebalance("get consumer list of group from broker error", map[string]any{"underlayError": errors.New(stoppedClient)}, now) {
		t.Error("the cause logged as an error counts as the same text")
	}
	if InterruptedRebalance("do balance in group failed, get consumer id list failed", nil, now) {
		t.Error("members not read with no consumer shut down is a fault")
	}
	ConsumerShutDown()
	now = time.Now()
	if !InterruptedRebalance(addFailed, nil, now.Add(time.Second)) {
		t.Error("a queue not added just after a shutdown is the shutdown's")
	}
	if InterruptedRebalance(addFailed, nil, now.Add(time.Minute)) {
		t.Error("a queue not added long after a shutdown is a fault")
	}
	if InterruptedRebalance("do defaultConsumer, add a new mq failed, because lock failed", nil, now) {
		t.Error("a lock refused is not the shutdown's")
	}
	timeout := map[string]any{"underlayError": errors.New("request timeout")}
	for _, msg := range []string{"get consumer list of group from broker error", "fetch offset of mq from broker error"} {
		if !InterruptedRebalance(msg, timeout, now.Add(time.Second)) {
			t.Errorf("%s: a call left unanswered just after a shutdown is the shutdown's", msg)
		}
		if InterruptedRebalance(msg, timeout, now.Add(time.Minute)) {
			t.Errorf("%s: a request timeout long after a shutdown is a fault", msg)
		}
		if InterruptedRebalance(msg, map[string]any{"underlayError": "connection refused"}, now.Add(time.Second)) {
			t.Errorf("%s: another cause is a fault", msg)
		}
	}
	if !InterruptedRebalance("do balance in group failed, get consumer id list failed", nil, now.Add(time.Second)) {
		t.Error("members not read just after a shutdown are the shutdown's")
	}
}

func TestOrphanedHeartbeat(t *testing.T) {
	const heartbeat = "send heart beat to broker error"
	timeout := map[string]any{"underlayError": "request timeout"}
	lastShutdown.Store(0)
	now := time.Now()
	if OrphanedHeartbeat(heartbeat, timeout, now) {
		t.Error("a heartbeat timed out with no consumer shut down is a fault")
	}
	ConsumerShutDown()
	now = time.Now()
	if !OrphanedHeartbeat(heartbeat, timeout, now.Add(3*time.Second)) {
		t.Error("a heartbeat timed out just after a shutdown is the shutdown's")
	}
	if OrphanedHeartbeat(heartbeat, timeout, now.Add(time.Minute)) {
		t.Error("a heartbeat timed out long after a shutdown is a fault")
	}
	if OrphanedHeartbeat(heartbeat, map[string]any{"underlayError": "connection refused"}, now) {
		t.Error("another cause is a fault")
	}
	if OrphanedHeartbeat("pull message from broker error", timeout, now) {
		t.Error("another warning is not a heartbeat")
	}
	if !ShutdownNoise(heartbeat, timeout, now) {
		t.Error("ShutdownNoise takes the orphaned heartbeat")
	}
}

// ShutdownNoise is either rule.
func TestShutdownNoise(t *testing.T) {
	ConsumerShutDown()
	now := time.Now()
	if !ShutdownNoise("pull message from broker error", map[string]any{"underlayError": "request timeout"}, now) {
		t.Error("an orphaned pull is shutdown noise")
	}
	if !ShutdownNoise("do defaultConsumer, add a new mq failed", nil, now) {
		t.Error("an interrupted rebalance is shutdown noise")
	}
	if ShutdownNoise("send message error", map[string]any{"underlayError": "request timeout"}, now) {
		t.Error("a send's timeout is a fault")
	}
}
