package clientlog

import (
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
