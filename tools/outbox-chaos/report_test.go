package main

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/go-outbox/outbox"
)

// TestMain checks for leaked goroutines, ignoring those already running before the tests
// (the RocketMQ client's packages start a cache janitor when they are loaded).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, goleak.IgnoreCurrent()) }

const lease = 30 * time.Second

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// fake builds an analysis input: rows 1..n with biz nos b1..bn, all committed.
type fake struct{ in analysisInput }

func newFake(n int) *fake {
	f := &fake{in: analysisInput{Lease: lease, Killed: map[string]time.Time{}}}
	for i := 1; i <= n; i++ {
		biz := fmt.Sprintf("b%d", i)
		f.in.Writers.Committed = append(f.in.Writers.Committed, commit{BizNo: biz, At: at(0)})
		f.in.Rows = append(f.in.Rows, row{ID: int64(i), EventID: fmt.Sprint(i), BizNo: biz, Status: "SUCCESS"})
	}
	return f
}

// deliver records a delivery of row id's event, stored at store.
func (f *fake) deliver(id int64, store string, born time.Duration) *fake {
	biz := fmt.Sprintf("b%d", id)
	f.in.Deliveries = append(f.in.Deliveries, delivery{BizNo: biz, EventID: fmt.Sprint(id), Store: store,
		Born: at(born), Received: at(born + 100*time.Millisecond), BodyOK: true})
	return f
}

// log appends an outcome record for row id.
func (f *fake) log(d time.Duration, inst, kind string, id int64) *fake {
	f.in.Records = append(f.in.Records, record{At: at(d), Instance: inst, Kind: kind, ID: id})
	return f
}

// sentOnce gives row id the records and delivery of a clean send by inst at d.
func (f *fake) sentOnce(id int64, inst string, d time.Duration) *fake {
	return f.log(d, inst, kindClaim, id).log(d+time.Millisecond, inst, kindSent, id).
		log(d+2*time.Millisecond, inst, kindAck, id).deliver(id, fmt.Sprintf("q/%d", id), d)
}

func TestCleanRunPasses(t *testing.T) {
	f := newFake(3)
	for id := int64(1); id <= 3; id++ {
		f.sentOnce(id, "p01", time.Duration(id)*time.Second)
	}
	f.deliver(2, "q/2", 2*time.Second) // the consumer got the same stored message again
	r := analyze(f.in)
	assert.Equal(t, 3, r.Committed)
	assert.Equal(t, 3, r.Delivered)
	assert.Zero(t, r.Lost)
	assert.Zero(t, r.DuplicateCopies, "a redelivery of one stored message is not a duplicate send")
	assert.Equal(t, 1, r.Redeliveries)
	assert.Empty(t, r.failed())
	assert.Equal(t, 3, r.Sends[kindSent])
}

func TestLostAndDeadLetteredFail(t *testing.T) {
	f := newFake(4)
	f.sentOnce(1, "p01", time.Second)
	f.in.Rows[1].Status, f.in.Rows[1].LastError = "FAIL", "rocketmq: connection refused"
	f.in.Rows[2].Status = "SENDING"
	f.in.Rows[3].Status = "SUCCESS" // SUCCESS, but never received: the worst kind of loss
	r := analyze(f.in)
	assert.Equal(t, 3, r.Lost)
	assert.Equal(t, map[string]int{"FAIL": 1, "SENDING": 1, "SUCCESS": 1}, r.LostByState)
	assert.Equal(t, 1, r.DeadLetters)
	assert.Equal(t, map[string]int{"rocketmq: connection refused": 1}, r.DeadReasons)
	assert.Equal(t, 1, r.Sending)
	failed := strings.Join(r.failed(), "; ")
	assert.Contains(t, failed, "3 events lost")
	assert.Contains(t, failed, "1 dead letters")
	assert.Contains(t, failed, "1 rows left SENDING")
}

func TestCommitsWithUnknownOutcomeAreCheckedInTheTable(t *testing.T) {
	f := newFake(1)
	f.sentOnce(1, "p01", time.Second)
	// x1's Commit failed but the row exists: committed. x2's failed and it does not: rolled
	// back. y1 failed before Commit and (wrongly) exists.
	f.in.Writers.Unknown = []string{"x1", "x2"}
	f.in.Writers.Aborted = []string{"y1"}
	f.in.Rows = append(f.in.Rows, row{ID: 2, BizNo: "x1", Status: "SUCCESS"}, row{ID: 3, BizNo: "y1", Status: "SUCCESS"})
	f.in.Deliveries = append(f.in.Deliveries, delivery{BizNo: "y1", EventID: "3", Store: "q/3", BodyOK: true})
	r := analyze(f.in)
	assert.Equal(t, 2, r.Committed, "Commit nil, plus the unknown outcome found in the table")
	assert.Equal(t, 1, r.UnknownFound)
	assert.Equal(t, 1, r.UnknownMissing)
	assert.Equal(t, 1, r.AbortedPresent)
	assert.Equal(t, 1, r.Lost, "x1 was committed and never delivered")
	assert.Equal(t, []string{"x1"}, r.LostSample)
}

func TestDuplicateAfterKillIsExplained(t *testing.T) {
	f := newFake(1)
	// p01 claims and sends, and is killed before its acknowledgement; after the lease p02
	// claims the reclaimed row and sends it again.
	f.log(0, "p01", kindClaim, 1).log(10*time.Millisecond, "p01", kindSent, 1).deliver(1, "q/1", 0)
	f.in.Killed["p01"] = at(time.Second)
	f.log(lease+5*time.Second, "p02", kindClaim, 1).log(lease+5*time.Second+time.Millisecond, "p02", kindSent, 1).
		log(lease+5*time.Second+2*time.Millisecond, "p02", kindAck, 1).deliver(1, "q/2", lease+5*time.Second)
	r := analyze(f.in)
	assert.Equal(t, 1, r.DuplicateCopies)
	assert.Empty(t, r.Unexplained)
	assert.Equal(t, map[string]int{causeKill: 1}, r.Causes)
	assert.Empty(t, r.Overlaps)
	assert.Empty(t, r.failed())
}

func TestKillBeforeTheSendOutcomeExplainsADuplicate(t *testing.T) {
	f := newFake(1)
	// Killed after the claim, with no outcome logged: the send may have happened.
	f.log(0, "p01", kindClaim, 1).deliver(1, "q/p01", 0)
	f.in.Killed["p01"] = at(time.Second)
	f.sentOnce(1, "p02", lease+time.Second)
	r := analyze(f.in)
	assert.Empty(t, r.Unexplained)
	assert.Equal(t, map[string]int{causeKill: 1}, r.Causes)
}

func TestKillAfterTheAcknowledgementExplainsNothing(t *testing.T) {
	f := newFake(1)
	f.sentOnce(1, "p01", 0)
	f.in.Killed["p01"] = at(time.Second)
	f.sentOnce(1, "p02", lease+time.Second) // a second send nothing accounts for
	f.in.Deliveries[1].Store = "q/other"
	r := analyze(f.in)
	require.Len(t, r.Unexplained, 1)
	assert.Equal(t, "b1", r.Unexplained[0].BizNo)
	assert.Equal(t, 2, r.Unexplained[0].Copies)
	assert.Contains(t, strings.Join(r.failed(), "; "), "1 unexplained duplicates")
	var out bytes.Buffer
	r.print(&out)
	assert.Contains(t, out.String(), "unexplained duplicate b1 (row 1): 2 copies")
}

func TestKillAfterAFailedSendExplainsNothing(t *testing.T) {
	f := newFake(1)
	// p01's send provably stored nothing; then it was killed. Two copies from p02 and p03
	// are not explained by that kill.
	f.log(0, "p01", kindClaim, 1).log(time.Millisecond, "p01", kindFailed, 1)
	f.in.Killed["p01"] = at(time.Second)
	f.sentOnce(1, "p02", lease+time.Second)
	f.sentOnce(1, "p03", 2*lease+time.Second)
	f.in.Deliveries[1].Store = "q/other"
	r := analyze(f.in)
	assert.Len(t, r.Unexplained, 1)
}

func TestUnknownSendOutcomeExplainsADuplicate(t *testing.T) {
	f := newFake(1)
	f.log(0, "p01", kindClaim, 1).log(3*time.Second, "p01", kindUnknown, 1).
		log(3*time.Second+time.Millisecond, "p01", kindRelease, 1).deliver(1, "q/1", time.Second)
	f.log(8*time.Second, "p01", kindClaim, 1).log(8*time.Second, "p01", kindSent, 1).
		log(8*time.Second+time.Millisecond, "p01", kindAck, 1).deliver(1, "q/2", 8*time.Second)
	r := analyze(f.in)
	assert.Empty(t, r.Unexplained)
	assert.Equal(t, map[string]int{causeUnknownSend: 1}, r.Causes)
	assert.Empty(t, r.Overlaps, "a claim after the instance's own release is no overlap")
}

func TestClientRetryWithinOneSendExplainsADuplicate(t *testing.T) {
	f := newFake(1)
	f.sentOnce(1, "p01", 0)
	f.deliver(1, "q/2", 0)
	f.in.Deliveries[0].UniqKey, f.in.Deliveries[1].UniqKey = "U1", "U1"
	r := analyze(f.in)
	assert.Empty(t, r.Unexplained)
	assert.Equal(t, map[string]int{causeClientRetry: 1}, r.Causes)
}

func TestFailedAcknowledgementExplainsADuplicate(t *testing.T) {
	f := newFake(1)
	// The database was down: p01's acknowledgement failed, the row stayed SENDING, and p02
	// reclaimed it after the lease.
	f.log(0, "p01", kindClaim, 1).log(time.Millisecond, "p01", kindSent, 1).
		log(5*time.Second, "p01", kindAckError, 1).deliver(1, "q/1", 0)
	f.sentOnce(1, "p02", lease+10*time.Second)
	f.in.Deliveries[1].Store = "q/2"
	r := analyze(f.in)
	assert.Empty(t, r.Unexplained)
	assert.Equal(t, map[string]int{causeAck: 1}, r.Causes)
	assert.Empty(t, r.Overlaps)
}

func TestTwoLiveClaimsAreNeverExplained(t *testing.T) {
	f := newFake(1)
	// p02 claims the row 100 ms after p01, while p01's claim is live; both send. p01's
	// acknowledgement then finds the row taken: lost within the lease, which explains nothing.
	f.log(0, "p01", kindClaim, 1).log(100*time.Millisecond, "p02", kindClaim, 1).
		log(200*time.Millisecond, "p01", kindSent, 1).log(210*time.Millisecond, "p02", kindSent, 1).
		log(300*time.Millisecond, "p02", kindAck, 1).log(310*time.Millisecond, "p01", kindAckLost, 1).
		deliver(1, "q/1", 200*time.Millisecond).deliver(1, "q/2", 210*time.Millisecond)
	r := analyze(f.in)
	require.Len(t, r.Overlaps, 1)
	assert.Equal(t, "p01", r.Overlaps[0].First.Instance)
	assert.Equal(t, "p02", r.Overlaps[0].Then.Instance)
	assert.Equal(t, "b1", r.Overlaps[0].BizNo)
	assert.Len(t, r.Unexplained, 1)
	failed := strings.Join(r.failed(), "; ")
	assert.Contains(t, failed, "1 claims taken while another was live")
}

func TestAClaimOfAKilledPublisherStaysLiveForTheLease(t *testing.T) {
	f := newFake(1)
	f.log(0, "p01", kindClaim, 1)
	f.in.Killed["p01"] = at(time.Second)
	f.sentOnce(1, "p02", 10*time.Second) // taken 10 s into a 30 s lease: a second live claim
	r := analyze(f.in)
	assert.Len(t, r.Overlaps, 1)

	f = newFake(1)
	f.log(0, "p01", kindClaim, 1)
	f.in.Killed["p01"] = at(time.Second)
	f.sentOnce(1, "p02", lease-time.Second) // within the tolerance of the lease's end
	r = analyze(f.in)
	assert.Empty(t, r.Overlaps)
}

func TestEventIDsMustBeConsistent(t *testing.T) {
	f := newFake(2)
	f.sentOnce(1, "p01", 0).sentOnce(2, "p01", 0)
	f.deliver(1, "q/1", 0)
	f.in.Deliveries[2].EventID = "another" // the same stored message, a different eventId
	r := analyze(f.in)
	assert.Equal(t, 1, r.EventIDMismatch)

	f = newFake(2)
	f.sentOnce(1, "p01", 0).sentOnce(2, "p01", 0)
	f.in.Deliveries[1].EventID = f.in.Deliveries[0].EventID // two events, one eventId
	r = analyze(f.in)
	assert.Equal(t, 1, r.EventIDMismatch)
	assert.Contains(t, strings.Join(r.failed(), "; "), "inconsistent eventIds")
}

func TestRecoveryTimes(t *testing.T) {
	f := newFake(4)
	// A broker outage from 10 s to 40 s: the first send after it at 42 s, and the first
	// message born after it received at 43.1 s.
	f.sentOnce(1, "p01", 5*time.Second)
	f.sentOnce(2, "p02", 42*time.Second)
	f.in.Deliveries[1].Received = at(43100 * time.Millisecond)
	// p01 killed at 60 s holding row 3 (claimed at 59 s, no outcome); p05 started at
	// 60.2 s, sends at 61 s; p02 acknowledges row 3 at 91 s.
	f.log(59*time.Second, "p01", kindClaim, 3)
	f.in.Killed["p01"] = at(60 * time.Second)
	f.sentOnce(4, "p05", 61*time.Second)
	f.sentOnce(3, "p02", 91*time.Second)
	// The database down from 100 s to 110 s; a writer commits at 110.5 s.
	f.in.Writers.Committed = append(f.in.Writers.Committed, commit{BizNo: "late", At: at(110500 * time.Millisecond)})
	f.in.Faults = []fault{
		{Kind: faultBroker, Target: "broker-a", Start: at(10 * time.Second), End: at(40 * time.Second)},
		{Kind: faultKill, Target: "p01", Start: at(60 * time.Second), End: at(60200 * time.Millisecond), Replacement: "p05"},
		{Kind: faultDB, Target: "database", Start: at(100 * time.Second), End: at(110 * time.Second)},
	}
	r := analyze(f.in)
	require.Len(t, r.Faults, 3)
	broker, kill, db := r.Faults[0], r.Faults[1], r.Faults[2]
	assert.Equal(t, 2*time.Second+time.Millisecond, broker.FirstSend)
	assert.Equal(t, 3100*time.Millisecond, broker.FirstDelivery)
	assert.Equal(t, 801*time.Millisecond, kill.FirstSend, "the new publisher's first send")
	assert.Equal(t, 1, kill.InFlight)
	assert.Equal(t, 31*time.Second+2*time.Millisecond, kill.InFlightDone, "row 3 acknowledged by another")
	assert.Equal(t, 500*time.Millisecond, db.FirstCommit)
	assert.Equal(t, time.Duration(-1), db.FirstSend, "nothing was sent after the database came back")

	var out bytes.Buffer
	r.print(&out)
	assert.Contains(t, out.String(), "it held 1 rows, all SUCCESS 31.0s after the kill")
	assert.Contains(t, out.String(), "restart database")
}

// effect records an effect of row id's event by consumer at d.
func (f *fake) effect(id int64, consumer string, d time.Duration) *fake {
	f.in.CheckEffects = true
	f.in.Effects = append(f.in.Effects, effect{EventID: fmt.Sprint(id), BizNo: fmt.Sprintf("b%d", id), Consumer: consumer,
		Born: at(d - 10*time.Millisecond), At: at(d)})
	return f
}

// inboxLog appends a consumer's record of kind for row id's event at d.
func (f *fake) inboxLog(d time.Duration, consumer, kind string, id int64) *fake {
	f.in.CheckEffects = true
	f.in.InboxRecords = append(f.in.InboxRecords, record{At: at(d), Instance: consumer, Kind: kind,
		BizNo: fmt.Sprintf("b%d", id), Detail: fmt.Sprint(id)})
	return f
}

// handledOnce gives row id's event a clean handling by consumer at d: the handler, its
// effect, the inbox's count.
func (f *fake) handledOnce(id int64, consumer string, d time.Duration) *fake {
	return f.inboxLog(d, consumer, kindHandle, id).effect(id, consumer, d).
		inboxLog(d+60*time.Millisecond, consumer, kindInboxPrefix+"handled", id)
}

func TestEffectsExactlyOncePass(t *testing.T) {
	f := newFake(3)
	for id := int64(1); id <= 3; id++ {
		f.sentOnce(id, "p01", time.Duration(id)*time.Second).handledOnce(id, "c01", time.Duration(id)*time.Second)
	}
	// Event 2 delivered again (a rebalance): the inbox suppressed it.
	f.inboxLog(5*time.Second, "c02", kindInboxPrefix+"duplicate", 2)
	r := analyze(f.in)
	assert.Empty(t, r.failed())
	assert.Equal(t, 3, r.EffectsOnce)
	assert.Zero(t, r.EffectsLost)
	assert.Zero(t, r.EffectsDoubled)
	assert.Equal(t, map[string]int{"handled": 3, "duplicate": 1}, r.InboxOutcomes)
	assert.Equal(t, 3, r.HandlersBegun)
	var out bytes.Buffer
	r.print(&out)
	assert.Contains(t, out.String(), "effects: 3 committed, lost 0, doubled 0; 3 effect rows, by consumer: c01 3")
	assert.Regexp(t, `duplicates suppressed \(inbox\)\s+1\s`, out.String())
	assert.Regexp(t, `handlers rolled back\s+0\s`, out.String())
}

func TestEffectsLostOrDoubledFail(t *testing.T) {
	f := newFake(4)
	for id := int64(1); id <= 4; id++ {
		f.sentOnce(id, "p01", time.Duration(id)*time.Second)
	}
	f.handledOnce(1, "c01", time.Second)
	// Event 2: no effect. Event 3: two effects (a doubled effect, which the inbox exists to
	// prevent). Event 4: once. And an effect of no event of the run.
	f.handledOnce(3, "c01", 3*time.Second).handledOnce(3, "c02", 4*time.Second)
	f.handledOnce(4, "c02", 4*time.Second)
	f.in.Effects = append(f.in.Effects, effect{EventID: "stranger", BizNo: "b9", Consumer: "c02", At: at(time.Second)})
	r := analyze(f.in)
	assert.Equal(t, 2, r.EffectsOnce)
	assert.Equal(t, 1, r.EffectsLost)
	assert.Equal(t, []string{"b2"}, r.EffectsLostEx)
	assert.Equal(t, 1, r.EffectsDoubled)
	assert.Equal(t, []string{"b3 (2)"}, r.EffectsDoubledEx)
	assert.Equal(t, 1, r.EffectsStray)
	failed := strings.Join(r.failed(), "; ")
	assert.Contains(t, failed, "1 committed events without an effect")
	assert.Contains(t, failed, "1 committed events whose effect happened more than once")
	assert.Contains(t, failed, "1 effect rows of no committed event")
	var out bytes.Buffer
	r.print(&out)
	assert.Contains(t, out.String(), "effects: 4 committed, lost 1, doubled 1")
	assert.Contains(t, out.String(), "effects doubled (rows), e.g.: b3 (2)")

	// An effect naming another biz no than its event's is not that event's effect.
	f = newFake(1)
	f.sentOnce(1, "p01", 0).handledOnce(1, "c01", 0)
	f.in.Effects[0].BizNo = "b7"
	r = analyze(f.in)
	assert.Equal(t, 1, r.EffectsLost)
	assert.Equal(t, 1, r.EffectsStray)
}

func TestRejectedByTheInboxFails(t *testing.T) {
	f := newFake(1)
	f.sentOnce(1, "p01", 0).handledOnce(1, "c01", 0)
	f.in.InboxRejected = 1
	assert.Contains(t, strings.Join(analyze(f.in).failed(), "; "), "1 messages rejected by the inbox")

	f.in.InboxRejected = 0
	f.inboxLog(time.Second, "c01", kindInboxPrefix+"rejected", 1)
	assert.Contains(t, strings.Join(analyze(f.in).failed(), "; "), "rejected by the inbox (1 rejections counted)")
}

func TestWithoutConsumersNoEffectIsChecked(t *testing.T) {
	f := newFake(1)
	f.sentOnce(1, "p01", 0)
	r := analyze(f.in)
	assert.False(t, r.CheckEffects)
	assert.Empty(t, r.failed())
	var out bytes.Buffer
	r.print(&out)
	assert.NotContains(t, out.String(), "effects")
}

func TestConsumerKillInAHandler(t *testing.T) {
	f := newFake(4)
	for id := int64(1); id <= 4; id++ {
		f.sentOnce(id, "p01", 0)
	}
	f.handledOnce(1, "c01", time.Second)
	// c01 is killed at 10 s: in the handler of event 2 (begun at 9.98 s, no outcome, no
	// effect); event 3's handler committed just before the kill, and the kill came before its
	// count; event 4's handler failed earlier (the database) and closed.
	f.inboxLog(9980*time.Millisecond, "c01", kindHandle, 2)
	f.inboxLog(9900*time.Millisecond, "c01", kindHandle, 3).effect(3, "c01", 9900*time.Millisecond)
	f.inboxLog(5*time.Second, "c01", kindHandle, 4).inboxLog(5*time.Second, "c01", kindInboxPrefix+"failed", 4)
	// c03 replaces it at 10.1 s; after the rebalance c02 handles event 2 at 25 s and c03
	// handles event 4 at 26 s; event 3 comes again to c03, a duplicate.
	f.handledOnce(2, "c02", 25*time.Second).handledOnce(4, "c03", 26*time.Second)
	f.inboxLog(27*time.Second, "c03", kindInboxPrefix+"duplicate", 3)
	f.in.Faults = []fault{{Kind: faultKillConsumer, Target: "c01", Start: at(10 * time.Second),
		End: at(10100 * time.Millisecond), Replacement: "c03"}}
	r := analyze(f.in)
	assert.Empty(t, r.failed())
	require.Len(t, r.Faults, 1)
	k := r.Faults[0]
	assert.Equal(t, 1, k.InHandler, "event 2 only")
	assert.Equal(t, 15*time.Second, k.InHandlerDone)
	assert.Equal(t, 14900*time.Millisecond, k.FirstEffect)
	assert.Equal(t, 15900*time.Millisecond, k.NewFirstEffect)
	assert.Equal(t, 4, r.EffectsOnce)
	assert.Equal(t, 6, r.HandlersBegun)
	var out bytes.Buffer
	r.print(&out)
	assert.Contains(t, out.String(), "new c03 (its first effect 15.9s); it was in 1 handlers (rolled back), their effects done by another 15.0s after the kill")
	assert.Contains(t, out.String(), "kill consumer")
	assert.Regexp(t, `handlers rolled back\s+2\s`, out.String(), "events 2 and 4")

	// Nobody handled event 2 after the kill.
	f.in.Effects = slices.DeleteFunc(f.in.Effects, func(e effect) bool { return e.EventID == "2" })
	r = analyze(f.in)
	assert.Equal(t, time.Duration(-1), r.Faults[0].InHandlerDone)
	assert.Equal(t, 1, r.EffectsLost)
}

func TestDatabaseRestartCountsTheConsumersFailures(t *testing.T) {
	f := newFake(3)
	f.sentOnce(1, "p01", 0).sentOnce(2, "p01", 0).sentOnce(3, "p01", 0)
	f.handledOnce(1, "c01", time.Second)
	f.inboxLog(11*time.Second, "c01", kindInboxPrefix+"failed", 2).inboxLog(12*time.Second, "c02", kindInboxPrefix+"failed", 2)
	f.inboxLog(40*time.Second, "c01", kindInboxPrefix+"failed", 2) // long after: not this outage's
	// Event 2, born before the outage, has its effect at 45 s (after its redelivery); event
	// 3, born after it, at 30 s: the first effect of a message born after the fault.
	f.handledOnce(2, "c02", 45*time.Second).handledOnce(3, "c01", 30*time.Second)
	f.in.Effects[1].Born = at(9 * time.Second)
	f.in.Faults = []fault{{Kind: faultDB, Target: "database", Start: at(10 * time.Second), End: at(20 * time.Second)}}
	r := analyze(f.in)
	assert.Equal(t, 2, r.Faults[0].InboxFailed)
	assert.Equal(t, 10*time.Second, r.Faults[0].FirstEffect)
	var out bytes.Buffer
	r.print(&out)
	assert.Contains(t, out.String(), "2 deliveries failed in the consumers (redelivered)")
}

func TestRecordsSurviveTheRoundTrip(t *testing.T) {
	recs := []record{
		{At: t0, Instance: "p01", Kind: kindClaim, ID: 7, BizNo: "b7"},
		{At: t0.Add(time.Nanosecond), Instance: "p01", Kind: kindUnknown, ID: 7, BizNo: "b7", Detail: "multi\tline\nerror"},
	}
	var buf bytes.Buffer
	for _, r := range recs {
		buf.WriteString(formatRecord(r))
	}
	buf.WriteString("garbage\n1\tp01\n")
	got, bad, err := parseRecords(&buf)
	require.NoError(t, err)
	assert.Equal(t, 2, bad)
	require.Len(t, got, 2)
	assert.True(t, got[0].At.Equal(recs[0].At))
	assert.Equal(t, "b7", got[1].BizNo)
	assert.Equal(t, "multi line error", got[1].Detail)
	assert.Equal(t, kindUnknown, got[1].Kind)
}

func TestSendOutcome(t *testing.T) {
	for _, c := range []struct {
		err     error
		retried bool
		want    string
	}{
		{nil, false, kindSent},
		{nil, true, kindSentRetried},
		{errors.New("rocketmq: dial tcp 127.0.0.1:10941: connect: connection refused"), false, kindFailed},
		{errors.New("rocketmq: dial tcp 127.0.0.1:10941: connect: connection refused"), true, kindUnknown},
		{errors.New("rocketmq: the topic=T route info not found"), false, kindFailed},
		{errors.New("rocketmq: CODE: 14, DESC: broker busy"), false, kindFailed},
		{outbox.Permanent(errors.New("rocketmq: CODE: 13, DESC: message illegal")), false, kindFailed},
		{fmt.Errorf("x: %w", outbox.ErrClosed), false, kindFailed},
		{errors.New("not sent: the batch's send timeout passed before its turn"), false, kindFailed},
		{errors.New("rocketmq: send not confirmed: status 1 (FLUSH_DISK_TIMEOUT)"), false, kindUnknown},
		{errors.New("rocketmq: request timeout"), false, kindUnknown},
		{errors.New("rocketmq: context deadline exceeded"), false, kindUnknown},
		{errors.New("rocketmq: EOF"), false, kindUnknown},
	} {
		assert.Equal(t, c.want, sendOutcome(c.err, c.retried), "%v (client retried: %v)", c.err, c.retried)
	}
}

func TestShortFormKeepsExplicitFlags(t *testing.T) {
	o, err := parseOptions([]string{"-short", "-events", "5000"})
	require.NoError(t, err)
	assert.Equal(t, 5000, o.events, "an explicit flag wins over -short")
	assert.Equal(t, 2*time.Minute, o.duration)
	assert.Equal(t, o.duration+o.drainTimeout+15*time.Minute, o.deadline)
	assert.Equal(t, "kill,kill-consumer,broker,db", o.faults, "consumer kills are among the default faults")
	assert.Equal(t, 2, o.consumers)
	_, err = parseOptions([]string{"-faults", "kill-consumer,db"})
	assert.NoError(t, err)

	for _, bad := range [][]string{
		{"-events", "0"},
		{"-gap-min", "10s", "-gap-max", "5s"},
		{"-faults", "kill,flood"},
		{"-consumers", "0"},
		{"-consumer-hold", "-1s"},
		{"-claim-mode", "sometimes"},
		{"-kill-when", "later"},
		{"-external", "-dsn", "x"},
		{"-dsn", "x"},
		{"extra"},
	} {
		_, err := parseOptions(bad)
		assert.Error(t, err, "%v", bad)
	}
}
