// Package outboxtest is what tests of code that uses package outbox need: senders and a
// store in memory for a service's own tests, and the conformance suite of [outbox.Store].
//
// # Senders and a store for a service's tests
//
// [MemorySender] is an [outbox.Sender] that records, in memory, every event a real
// [outbox.Publisher] sends, and lets the test wait for them and assert on them: the
// service's transaction runs against its real database, and no broker is needed.
// [FaultySender] wraps it (or any sender) and makes chosen sends fail as a broker does:
// refused for good, failed the first n tries, sent with the answer lost, the broker down,
// a send blocked until released. [MemoryStore] is an [outbox.Store] in memory, for a unit
// test that runs a real publisher with no database at all: it keeps the Store contract (it
// passes [RunStoreTests] in each ordering), and its Insert stands for the business
// transaction. docs/testing.md shows each use; package inboxtest
// (github.com/go-outbox/outbox/inbox/inboxtest) is the consumer's side.
//
// The senders live here, beside the conformance suite, as net/http/httptest holds both a
// test server and a response recorder: one package of test helpers for package outbox,
// under the name Go's convention gives it, whichever side of the Store interface the test
// is on. They add no dependency the suite does not have, and the inbox's side, which needs
// package inbox, is a package of its own, so that a test of the publishing side alone does
// not import it.
//
// # The Store conformance suite
//
// [RunStoreTests] is the contract every store keeps, so that an [outbox.Publisher] over it
// delivers every committed event at least once and never lets an instance that lost its
// lease overwrite what another wrote. A store for another database runs it in its own
// tests; [outbox.MySQLStore] runs it in this module's.
//
// The store's test hands [RunStoreTests] a function that makes a [Harness] for each case:
// the store over a table of its own, and the few things the suite does to rows that the
// Store interface cannot (write events as business code does, read a row back, move a
// row's times into the past so that no case waits out a lease or a backoff):
//
//	func TestStoreConformance(t *testing.T) {
//		outboxtest.RunStoreTests(t, func(t *testing.T) outboxtest.Harness {
//			return newHarness(t) // a store over a fresh, empty table
//		})
//	}
//
// The cases run in parallel, each against a harness of its own, and take a few seconds
// against a local database. A store made with [outbox.KeyOrder] (or
// [outbox.KeyOrderSkipDeadLetters]) passes the same cases, and the key-order ones besides;
// run the suite once for each ordering the store supports. Cases of optional behaviour
// are skipped, with the reason, for a store that declines it: a nil channel from
// [outbox.Store.Subscribe], [errors.ErrUnsupported] from Purge or Stats.
//
// The package's Example is the harness for [outbox.MySQLStore], as this module's own test
// runs it.
package outboxtest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// Harness is what the suite needs besides the store itself: a way to write events as
// business code does, to read a row back, and a few changes to rows that the Store
// interface cannot make. RunStoreTests asks for a new Harness for each case, and runs the
// cases in parallel, so each harness must have a store of its own over an empty table (or
// whatever the store keeps its events in) that no other case touches.
//
// Every time a harness reads or writes is by the store's own clock (for MySQLStore, the
// database's UTC_TIMESTAMP(3)), never by the test process's. A method that cannot do what
// it must fails the test (t.Fatal).
type Harness interface {
	// Store returns the store under test, the same one at every call.
	Store() outbox.Store

	// Ordering returns the ordering the store was made with (for MySQLStore,
	// [outbox.MySQLConfig.Ordering]): what [outbox.Store.Check] must report, and what the
	// key-order cases hold the claims to.
	Ordering() outbox.Ordering

	// Insert writes evs in one transaction through the store's own business path, as a
	// service does (for MySQLStore: BeginTx, Tx.InsertEvent for each event, Tx.Commit), and
	// returns their row ids ([outbox.Event.ID]) in the order of evs. The events are WAIT and
	// due at once.
	Insert(t testing.TB, evs ...outbox.EventInput) []int64

	// Get returns the row with the given id as it stands, every field of [outbox.Event]
	// filled as its doc says (ClaimOwner empty and ClaimedAt zero while nobody holds the
	// lease, LastError empty for none, Failures the failure history, oldest first), or ok
	// false if there is no such row.
	Get(t testing.TB, id int64) (ev outbox.Event, ok bool)

	// Now returns the store's clock now, comparable with the times Get returns.
	Now(t testing.TB) time.Time

	// SetNextRetry makes the row due d from the store's now (d < 0: in the past; zero: due
	// now), whatever its status, and changes nothing else.
	SetNextRetry(t testing.TB, id int64, d time.Duration)

	// Backdate moves every time of the row d into the past (its create, update and
	// next-retry times, and the time of its last claim if it had one), as if all that
	// happened to it had happened d earlier: a lease taken d ago, an event sent or
	// dead-lettered d ago. It changes nothing else.
	Backdate(t testing.TB, id int64, d time.Duration)

	// Skip marks the row, a dead letter (FAIL), SKIPPED and records that as its last update,
	// as a person's decision never to send it does (for MySQLStore, the operators' Skip):
	// the one state the Store interface cannot reach.
	Skip(t testing.TB, id int64)
}

// TopicHarness is a [Harness] whose store takes events that name a topic
// ([outbox.EventInput.Topic]): Topics returns topics its Insert accepts besides its default
// (for MySQLStore, [outbox.Routes.Topics]), at least one. The suite's topic case runs only
// for such a harness, and is skipped, with the reason, for a plain Harness, whose store
// need take no topic but its default.
type TopicHarness interface {
	Harness
	Topics() []string
}

// RunStoreTests runs every case of the Store contract as a subtest of t, each in parallel
// with the others on a harness newHarness makes for it.
func RunStoreTests(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Helper()
	groups := [][]storeCase{claimCases, faultCases, upkeepCases, keyOrderCases, topicCases, historyCases}
	for _, cases := range groups {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				h := newHarness(t)
				require.NotNil(t, h, "newHarness returned nil")
				c.run(t, &fixture{Harness: h, t: t, s: h.Store(), ctx: t.Context()})
			})
		}
	}
}

// storeCase is one case of the contract.
type storeCase struct {
	name string
	run  func(t *testing.T, f *fixture)
}

// The owners the cases claim as. They differ in nothing but their names, as two instances
// of one service do.
const (
	owner = "owner-a"
	other = "owner-b"
)

// fixture is a case's harness with the steps the cases share.
type fixture struct {
	Harness
	t   *testing.T
	s   outbox.Store
	ctx context.Context
}

// keySeq numbers the biz nos the fixtures write, so that no two events share a key unless a
// case says so (under key order, a shared key would hold one behind the other).
var keySeq atomic.Int64

// newKey returns a biz no no other event of the process has.
func newKey() string { return fmt.Sprintf("ORD-%d", keySeq.Add(1)) }

// insert commits n events in one transaction, each of its own biz no, and returns their ids.
func (f *fixture) insert(n int) []int64 {
	f.t.Helper()
	evs := make([]outbox.EventInput, n)
	for i := range evs {
		evs[i] = outbox.EventInput{BizNo: newKey(), EventType: "ORDER_CREATED", Payload: fmt.Appendf(nil, `{"order":%d}`, i)}
	}
	return f.insertEvents(evs...)
}

// insertEvents commits evs in one transaction and returns their ids.
func (f *fixture) insertEvents(evs ...outbox.EventInput) []int64 {
	f.t.Helper()
	ids := f.Insert(f.t, evs...)
	require.Len(f.t, ids, len(evs), "Insert returns an id for each event")
	return ids
}

// get reads a row that must exist.
func (f *fixture) get(id int64) outbox.Event {
	f.t.Helper()
	ev, ok := f.Get(f.t, id)
	require.True(f.t, ok, "event %d does not exist", id)
	return ev
}

// exists reports whether the row is still there.
func (f *fixture) exists(id int64) bool {
	f.t.Helper()
	_, ok := f.Get(f.t, id)
	return ok
}

// fromNow returns how far t is from the store's now (negative: in the past).
func (f *fixture) fromNow(t time.Time) time.Duration {
	f.t.Helper()
	return t.Sub(f.Now(f.t))
}

// claim claims the row for who with a per-row claim, which must win.
func (f *fixture) claim(id int64, who string) outbox.Event {
	f.t.Helper()
	ev := f.get(id)
	won, err := f.s.Claim(f.ctx, ev, who)
	require.NoError(f.t, err)
	require.True(f.t, won, "claim of event %d (%s) for %s", id, ev.Status, who)
	return ev
}

// claimDue is a batch claim of up to limit events and maxBytes payload bytes for who,
// recording no success.
func (f *fixture) claimDue(who string, limit, maxBytes int) ([]outbox.Event, bool) {
	f.t.Helper()
	res, err := f.s.ClaimDue(f.ctx, outbox.ClaimRequest{Owner: who, Limit: limit, MaxBytes: maxBytes})
	require.NoError(f.t, err)
	return res.Events, res.More
}

// succeed claims the row and records its success: a sent event.
func (f *fixture) succeed(id int64) {
	f.t.Helper()
	f.claim(id, "sender")
	n, err := f.s.MarkSuccess(f.ctx, []int64{id}, "sender")
	require.NoError(f.t, err)
	require.Equal(f.t, int64(1), n)
}

// deadLetter claims the row and dead-letters it.
func (f *fixture) deadLetter(id int64) {
	f.t.Helper()
	f.claim(id, "sender")
	_, ok, err := f.s.MarkFail(f.ctx, id, "sender", 4, "permanent", "refused")
	require.NoError(f.t, err)
	require.True(f.t, ok)
}

// reclaim has the row claimed by an instance that dies, and reclaimed, times times. Every
// other lease must be younger than a minute.
func (f *fixture) reclaim(id int64, times int) {
	f.t.Helper()
	for range times {
		f.claim(id, "crashed")
		f.Backdate(f.t, id, time.Hour)
		n, _, err := f.s.ReclaimExpired(f.ctx, time.Minute, outbox.RetryForever)
		require.NoError(f.t, err)
		require.Equal(f.t, int64(1), n, "the expired lease of event %d is reclaimed", id)
	}
}

func idsOf(evs []outbox.Event) []int64 {
	ids := make([]int64, len(evs))
	for i, ev := range evs {
		ids[i] = ev.ID
	}
	return ids
}
