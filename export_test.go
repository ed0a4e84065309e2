package outbox

import (
	"context"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
)

// ScanQueriesForTest returns the candidate and reclaim statements as the store runs them, so
// that the tests EXPLAIN the real text.
func ScanQueriesForTest(s *MySQLStore) (candidates, reclaim string) {
	return s.q.candidates, s.q.expired
}

// ClaimLockNameForTest returns the SQL expression that names s's claim lock, for tests that
// hold the lock themselves or check that it is free.
func ClaimLockNameForTest(s *MySQLStore) string { return claimLockName(s.table) }

// SetClaimTurnWaitForTest sets how long s's batch claims wait for their turn. Call it before
// s is used.
func SetClaimTurnWaitForTest(s *MySQLStore, d time.Duration) { s.claimTurnWait = d }

// SetFullScanEveryForTest sets how often s's steady claims read from the start of the due
// rows at least (fullScanEvery). Call it before s is used.
func SetFullScanEveryForTest(s *MySQLStore, d time.Duration) { s.floor.every = d }

// ConfigForTest returns p's configuration with its defaults filled in, as p runs with it.
func ConfigForTest(p *Publisher) Config { return p.cfg }

// SetPurgeHookForTest makes s call hook(true) once an exclusive purge holds the table's
// purge lock and hook(false) just before it lets go. Call it before s is used.
func SetPurgeHookForTest(s *MySQLStore, hook func(holding bool)) { s.purgeHook = hook }

// PurgeQueryForTest returns the statement that finds old SUCCESS rows, so that the tests
// EXPLAIN the real text.
func PurgeQueryForTest(s *MySQLStore) string { return s.q.purgeCandidates }

// RunRoundForTest runs one round as Run does, leaving its successes to the next claim.
func RunRoundForTest(p *Publisher, ctx context.Context) (RoundStats, error) {
	stats, _, err := p.round(ctx, true)
	return stats, err
}

// UnackedForTest returns the ids of the events sent whose success is not yet recorded.
func UnackedForTest(p *Publisher) []int64 {
	p.roundMu.Lock()
	defer p.roundMu.Unlock()
	ids := make([]int64, len(p.unacked))
	for i, ev := range p.unacked {
		ids[i] = ev.ID
	}
	return ids
}

// FlushAcksForTest records the successes no claim has carried, as Run does after ackDelay.
func FlushAcksForTest(p *Publisher, ctx context.Context) { p.flushAcks(ctx) }

// StopForTest does what Run does once its loops have ended.
func StopForTest(p *Publisher, ctx context.Context) { p.stop(ctx) }

// ClaimSessionOpenForTest reports whether s keeps a claim session open.
func ClaimSessionOpenForTest(s *MySQLStore) bool {
	s.session.mu.Lock()
	defer s.session.mu.Unlock()
	return s.session.conn != nil
}

// WrapProducerForTest puts wrap(the sender's producer) in its place, for tests that inject
// failures between the sender and a real producer it built. Call it before s is used.
func WrapProducerForTest(s *RocketMQSender, wrap func(rocketmq.Producer) rocketmq.Producer) {
	s.producer = wrap(s.producer)
}

// TableForTest returns the name of s's table.
func TableForTest(s *MySQLStore) string { return s.table }
