// Package clientlog tells routine log records of the RocketMQ client from faults, for the
// root package's route of the client's logs (outbox.RouteRocketMQClientLogs), with what
// only the packages that drive the client know: when one of their consumers was shut down.
package clientlog

import (
	"strings"
	"sync/atomic"
	"time"
)

// orphanedPull is how long after a push consumer's shutdown its last pull may still end:
// the client leaves a long-polling pull in flight when it shuts down, and that pull ends by
// its own timeout (30 s in the client), with a "request timeout" warning, or at once with a
// closed connection.
const orphanedPull = 35 * time.Second

// lastShutdown is when a push consumer of this process was last shut down (Unix ns; 0: never).
var lastShutdown atomic.Int64

// ConsumerShutDown records that a push consumer of this process is being shut down now.
func ConsumerShutDown() { lastShutdown.Store(time.Now().UnixNano()) }

// ShutdownNoise reports whether a warning of the client, logged at now, is a push
// consumer's shutdown at work rather than a fault: an orphaned pull ([OrphanedPull]), an
// interrupted rebalance ([InterruptedRebalance]) or an orphaned heartbeat
// ([OrphanedHeartbeat]).
func ShutdownNoise(msg string, fields map[string]any, now time.Time) bool {
	return OrphanedPull(msg, fields, now) || InterruptedRebalance(msg, fields, now) || OrphanedHeartbeat(msg, fields, now)
}

// heartbeatAtShutdown is how long after a push consumer's shutdown a heartbeat the client
// had in flight may still end: each waits 3 s for the broker's answer.
const heartbeatAtShutdown = 10 * time.Second

// OrphanedHeartbeat reports whether a warning of the client is a heartbeat the client sent
// just before a push consumer's shutdown closed its connections: one that timed out or
// found its connection closed, within heartbeatAtShutdown of a shutdown of this process. A
// heartbeat that fails so at any other time, or with any other error, is a fault.
func OrphanedHeartbeat(msg string, fields map[string]any, now time.Time) bool {
	if msg != "send heart beat to broker error" || !sinceShutdown(now, heartbeatAtShutdown) {
		return false
	}
	cause := causeOf(fields)
	return cause == "request timeout" || strings.Contains(cause, "use of closed network connection")
}

// sinceShutdown reports whether a push consumer of this process was shut down at most d
// before now.
func sinceShutdown(now time.Time, d time.Duration) bool {
	at := lastShutdown.Load()
	return at != 0 && now.Sub(time.Unix(0, at)) <= d
}

// OrphanedPull reports whether a warning of the client is the end of a pull that a push
// consumer's shutdown left in flight: a pull that timed out or found its connection closed,
// within the time such a pull may take after a shutdown of this process. A pull that fails
// so with no consumer shut down, or with any other error, is a fault.
func OrphanedPull(msg string, fields map[string]any, now time.Time) bool {
	if msg != "pull message from broker error" || !sinceShutdown(now, orphanedPull) {
		return false
	}
	cause := causeOf(fields)
	return cause == "request timeout" || strings.Contains(cause, "use of closed network connection")
}

// stoppedClient is the client's error for a call on a client already shut down.
const stoppedClient = "service close is not running"

// rebalanceAtShutdown is how long after a push consumer's shutdown began a rebalance of its
// may still be under way.
const rebalanceAtShutdown = 10 * time.Second

// InterruptedRebalance reports whether a warning or an error of the client is a rebalance
// cut short by a push consumer's shutdown: a call the rebalance made on the client shut
// down under it (its error says the client is not running); within rebalanceAtShutdown of
// a shutdown of this process, one of its calls to the broker that the shutdown left
// unanswered (a request timeout), and what the rebalance then could not do (add a queue,
// read the group's members). The same records at any other time, or with any other cause,
// are faults.
func InterruptedRebalance(msg string, fields map[string]any, now time.Time) bool {
	cause := causeOf(fields)
	if strings.Contains(cause, stoppedClient) {
		return true
	}
	if !sinceShutdown(now, rebalanceAtShutdown) {
		return false
	}
	switch msg {
	case "do defaultConsumer, add a new mq failed", "do balance in group failed, get consumer id list failed":
		return true
	case "get consumer list of group from broker error", "fetch offset of mq from broker error":
		return cause == "request timeout"
	}
	return false
}

// causeOf is a record's underlying error as text: the client logs it as a string at some
// places and as an error at others.
func causeOf(fields map[string]any) string {
	switch c := fields["underlayError"].(type) {
	case string:
		return c
	case error:
		return c.Error()
	}
	return ""
}
