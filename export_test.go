package outbox

import (
	"context"
	"database/sql"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/go-outbox/outbox/internal/mysqldialect"
)

// ScanQueriesForTest returns the candidate and reclaim statements as the store runs them, so
// that the tests EXPLAIN the real text.
func ScanQueriesForTest(s *MySQLStore) (candidates, reclaim string) {
	return s.q.candidates, s.q.expired
}

// ClaimLockNameForTest returns the SQL expression that names s's claim lock, for tests that
// hold the lock themselves or check that it is free.
func ClaimLockNameForTest(s *MySQLStore) string {
	return mysqldialect.LockName(mysqldialect.ClaimLock, s.table)
}

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
	p.rounds.mu.Lock()
	defer p.rounds.mu.Unlock()
	ids := make([]int64, len(p.rounds.unacked))
	for i, ev := range p.rounds.unacked {
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

// InsertForTest is Tx.InsertEvent returning the row id, for tests that address rows by id.
func InsertForTest(ctx context.Context, tx *Tx, ev EventInput) (int64, error) {
	return tx.insert(ctx, ev)
}

// TableForTest is the store's table name.
func TableForTest(s *MySQLStore) string { return s.table }

// LockRetriesForTest is how many statements s ran again after a lock conflict.
func LockRetriesForTest(s *MySQLStore) int64 { return s.lockRetryCount() }

// MessageForTest is the RocketMQ message s sends for ev.
func MessageForTest(s *RocketMQSender, ev Event, keyOrder bool) *primitive.Message {
	return s.message(ev, keyOrder)
}

// NewRocketMQSenderWithProducerForTest is NewRocketMQSender with a producer the test made (a
// fake, or a real one it wraps), which the sender uses and never shuts down. Its queue
// selector is the producer's own.
func NewRocketMQSenderWithProducerForTest(cfg RocketMQConfig, p rocketmq.Producer) (*RocketMQSender, error) {
	s, err := newRocketMQSender(cfg)
	if err != nil {
		return nil, err
	}
	s.producer = p
	return s, nil
}

// WithOrderingForTest returns a store on s's table, s's twin but claiming in o, for tests that
// claim one table under several orderings. It shares s's claim floor and notifications
// with nothing: a store of its own.
func WithOrderingForTest(s Store, o Ordering) *MySQLStore {
	m := s.(*MySQLStore)
	t, err := NewMySQLStore(m.db, MySQLConfig{Table: m.table, Ordering: o, ConcurrentClaims: m.concurrentClaims, PooledClaims: m.pooledClaims, ScanFromStart: m.scanFromStart})
	if err != nil {
		panic(err)
	}
	t.claimTurnWait = m.claimTurnWait
	return t
}

// OnDBForTest returns a store on s's table made as s was, on the pool db: another
// instance's store.
func OnDBForTest(s Store, db *sql.DB) *MySQLStore {
	m := s.(*MySQLStore)
	t, err := NewMySQLStore(db, MySQLConfig{Table: m.table, Ordering: m.ordering, ConcurrentClaims: m.concurrentClaims,
		PooledClaims: m.pooledClaims, ScanFromStart: m.scanFromStart, Routes: m.routes.config(), PartitionIDs: m.partitionIDs, MaxPayloadBytes: m.maxPayload})
	if err != nil {
		panic(err)
	}
	t.claimTurnWait = m.claimTurnWait
	return t
}

// WithRoutesForTest returns a store on s's table, as s was made but for its routes: the
// events inserted through it go where r says.
func WithRoutesForTest(s Store, r Routes) *MySQLStore {
	m := s.(*MySQLStore)
	t, err := NewMySQLStore(m.db, MySQLConfig{Table: m.table, Ordering: m.ordering, ConcurrentClaims: m.concurrentClaims,
		PooledClaims: m.pooledClaims, ScanFromStart: m.scanFromStart, Routes: r, PartitionIDs: m.partitionIDs, MaxPayloadBytes: m.maxPayload})
	if err != nil {
		panic(err)
	}
	t.claimTurnWait = m.claimTurnWait
	return t
}

// SetClaimLimitForTest sets the size of p's next batch claim, which otherwise starts small
// and grows while batches send quickly.
func SetClaimLimitForTest(p *Publisher, n int) { p.limit.Store(int64(n)) }

// SetPartitionHookForTest makes s call hook before each partition statement of a purge:
// "reorganize" (adding partitions ahead), "lock" (LOCK TABLES before a drop) and "drop".
// Call it before s is used.
func SetPartitionHookForTest(s *MySQLStore, hook func(step string)) { s.partitionHook = hook }

// CheckForTest asks p's store how it claims, as Start and PublishPending do before the
// first round, so that rounds run by RunRoundForTest claim and send in the store's order.
func CheckForTest(p *Publisher, ctx context.Context) error { return p.check(ctx) }
