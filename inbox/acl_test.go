package inbox_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// aclHandover is how soon, with the brokers' ACL 2.0 on, a queue moved by a rebalance goes
// on at the consumer given it; without the keeper's locks and unlocks (refused unsigned)
// it would wait for the broker's lock to expire, 60 s.
const aclHandover = 5 * time.Second

// produceSteadily commits an event for each of bizNos biz nos every 100 ms until t ends.
func (r *consRig) produceSteadily(t *testing.T, bizNos int) {
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; !stop.Load(); i++ {
			for k := range bizNos {
				r.insertOne(t, fmt.Sprintf("ORD-%02d", k), fmt.Sprintf(`{"n":%d}`, i))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { stop.Store(true); <-done })
}

// handledSince is the biz nos by (anyone, for "") has handled since at, and when it had
// first handled that many.
func (r *consRig) handledSince(t *testing.T, runs, by string, at time.Time) (map[string]bool, time.Duration) {
	seen := map[string]bool{}
	var last time.Duration
	for _, x := range r.runs(t, runs) {
		if (by == "" || x.by == by) && x.start > at.UnixMicro() && !seen[x.bizNo] {
			seen[x.bizNo] = true
			last = time.UnixMicro(x.start).Sub(at)
		}
	}
	return seen, last
}

// With the brokers' ACL 2.0 on, orderly consumers (processes of their own) given the
// user's credentials hand queues over as they do without ACL: the consumer's own lock and
// unlock requests are signed with the credentials. When B joins, the queues A gives it go
// on at B within 3*aclHandover of B's process start, and then every biz no goes on within
// aclHandover; when A closes, every biz no goes on at B within aclHandover.
// B connects over TLS. No two consumers handle one biz no at once.
func TestOrderlyConsumersWithACLHandQueuesOver(t *testing.T) {
	t.Parallel()
	const bizNos = 8
	bin := plainBinary(t)
	r := newConsRig(t, consRigOptions{ordering: outbox.KeyOrder, acl: true})
	runs := r.createRunsTable(t)
	r.publish(t)
	cfg := func(name string) childConfig {
		return childConfig{Name: name, Orderly: true, RetryPause: 100 * time.Millisecond, Runs: runs}
	}
	r.produceSteadily(t, bizNos)
	a := r.startConsumer(t, bin, cfg("A"))
	start := time.Now()
	require.Eventually(t, func() bool { s, _ := r.handledSince(t, runs, "A", start); return len(s) == bizNos },
		60*time.Second, 100*time.Millisecond, "A, alone, handles every biz no")

	joined := time.Now()
	b := cfg("B")
	b.TLS = true // its push consumer's requests and its own go over TLS
	r.startConsumer(t, bin, b)
	require.Eventually(t, func() bool { s, _ := r.handledSince(t, runs, "B", joined); return len(s) > 0 },
		3*aclHandover, 50*time.Millisecond, "B, its process started, is given queues and locks them")
	mark := time.Now()
	require.Eventually(t, func() bool { s, _ := r.handledSince(t, runs, "", mark); return len(s) == bizNos },
		aclHandover, 50*time.Millisecond, "every biz no goes on after B joined")
	_, tookB := r.handledSince(t, runs, "B", joined)

	a.stop(t)
	left := time.Now()
	require.Eventually(t, func() bool { s, _ := r.handledSince(t, runs, "B", left); return len(s) == bizNos },
		aclHandover, 50*time.Millisecond, "B handles every biz no after A closed")
	_, tookAll := r.handledSince(t, runs, "B", left)
	t.Logf("B handled its queues' biz nos %s after it was started; every biz no %s after A closed", tookB, tookAll)
	assert.Zero(t, overlaps(r.runs(t, runs)), "runs of two consumers on one biz no at once")
}

// An orderly consumer given its credentials only among ConsumerOptions (the push consumer
// has them; the consumer's own lock requests cannot) is told at warn that the brokers' ACL
// refuses its locks, with what to do, not only at debug, and once a minute, not at every
// try.
func TestOrderlyConsumerRefusedByACLWarns(t *testing.T) {
	t.Parallel()
	bin := plainBinary(t)
	r := newConsRig(t, consRigOptions{ordering: outbox.KeyOrder, acl: true})
	r.publish(t)
	r.produceSteadily(t, 4)
	p := r.startConsumer(t, bin, childConfig{Name: "A", Orderly: true, InOptionsOnly: true, Loud: true})
	warned := func() int {
		n := 0
		for _, l := range p.loudRecords() {
			if strings.Contains(l, "inbox: the broker's ACL refused to lock the consumer's queues") &&
				strings.Contains(l, "grant the user Sub on the group and the topic") &&
				strings.Contains(l, "set ConsumerConfig.Credentials") {
				n++
			}
		}
		return n
	}
	require.Eventually(t, func() bool { return warned() > 0 }, 30*time.Second, 100*time.Millisecond,
		"a warning names the refusal and what to do")
	time.Sleep(3 * time.Second) // the consumer tries to lock every second meanwhile
	assert.Equal(t, 1, warned(), "at most one warning a minute")
}
