package outbox

import (
	"cmp"
	"fmt"
	"sync"
	"time"
)

// The claim at a steady rate, and its scan floor.
//
// A claim moves each row it takes out of the WAIT range of idx_status_next_retry (status
// changes), which leaves a delete-marked entry at the front of that range until InnoDB's
// purge removes it, typically a fraction of a second later; and the writers keep adding
// entries at its end. A locking read of that index (the backlog claim, lockDue) checks every
// entry it passes for an implicit lock, and on pages that recent transactions changed that
// means looking up the entry's row, and often its older versions, in the clustered index.
// Measured on MariaDB 10.11 with eight writers and three publishers (about 4,500 events/s):
// about 2,700 page accesses and 1.5 ms for a claim that took 10 to 25 rows, most of what
// publishing cost the database.
//
// So while the claims keep up (the last one took less than it was allowed), a claim
// (lockDueSteady) reads the ids of the due rows with a plain read, which mostly needs no
// lookups, then locks those rows by primary key, skipping the ones another claim holds; and
// it starts its read at a floor, so that it does not pass the entries of the rows earlier
// claims took at all.
//
// The floor: a claim that left nothing due behind it (it took fewer rows than it was
// allowed, and committed) lets the next claim start at its read time (the database clock)
// less floorSlack. A row it cannot have seen was committed after its read, and was due
// (next_retry_time, set by the INSERT to the database's time, or later for an event written
// with a delay, never earlier: a NotBefore the database clock has passed is the insert's
// time) no earlier than floorSlack before that commit, unless its transaction ran longer
// than that:
//
//   - A Tx (BeginTx, WrapTx) whose first InsertEvent began more than floorSlack before its
//     Commit returned reports when that insert began: the next claim reaches back that far
//     (by the process clock, plus floorLateMargin) as well. Notify, called for transactions
//     committed outside a Tx's Commit, makes the next claim read from the start.
//   - Everything else the floor cannot see coming also makes the next claim read from the
//     start: a claim that failed or whose outcome is unknown (its rows stay WAIT), one that
//     found as many due rows as it was allowed or stopped early (a backlog, MaxBytes, a
//     reclaimed row), a reclaim in this store (reclaimed rows keep their old
//     next_retry_time).
//   - And whatever no store of this process hears of (an event inserted by another program,
//     another instance's claim rolled back, a row reclaimed by another process or made due
//     by hand, the database's clock stepped back): a claim
//     reads from the start at least every fullScanEvery. Such a row waits that long at most
//     for a claim, instead of none; nothing is left behind for good.
//
// Only the unordered batch claim does this: ordered claims read each key's head through
// idx_biz_no_status, and per-row mode is the article's loop. MySQLConfig.ScanFromStart turns
// it off.
const (
	floorSlack      = 10 * time.Millisecond
	floorLateMargin = 50 * time.Millisecond
	fullScanEvery   = 250 * time.Millisecond
)

// scanFloor is a store's floor state. Its zero value scans from the start.
type scanFloor struct {
	mu sync.Mutex
	// at is the floor (database time, UTC); zero: none yet.
	at time.Time
	// full: the next claim scans from the start (sticky until a claim begins).
	full bool
	// lateFrom is the earliest start (process clock) of an insert of a transaction that
	// committed late, not yet taken by a claim; zero: none.
	lateFrom time.Time
	// fullAt is when the last claim from the start began (process clock).
	fullAt time.Time
	// every is how often a claim reads from the start at least; zero: fullScanEvery.
	every time.Duration
}

// floorScan is what one claim reads from: from the start, or from a floor.
type floorScan struct {
	full     bool
	at       time.Time     // the floor
	lookback time.Duration // and, if positive, no later than this before the claim's read
}

// begin takes the scan for a claim starting at now (process clock).
func (f *scanFloor) begin(now time.Time) floorScan {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.full || f.at.IsZero() || now.Sub(f.fullAt) >= cmp.Or(f.every, fullScanEvery) {
		f.fromStartLocked(now)
		return floorScan{full: true}
	}
	sc := floorScan{at: f.at}
	if !f.lateFrom.IsZero() {
		sc.lookback = now.Sub(f.lateFrom) + floorSlack + floorLateMargin
		f.lateFrom = time.Time{}
	}
	return sc
}

// fromStart records a claim that reads from the start at now (process clock) without a
// floor: a backlog claim.
func (f *scanFloor) fromStart(now time.Time) {
	f.mu.Lock()
	f.fromStartLocked(now)
	f.mu.Unlock()
}

func (f *scanFloor) fromStartLocked(now time.Time) {
	f.full, f.lateFrom, f.fullAt = false, time.Time{}, now
}

// done records a claim that committed having read at readAt (database time; zero if it read
// no row, which leaves the floor where it was). complete: it took every row it read, fewer
// than it was allowed to.
func (f *scanFloor) done(readAt time.Time, complete bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !complete {
		f.full = true
		return
	}
	if at := readAt.Add(-floorSlack); at.After(f.at) {
		f.at = at
	}
}

// reset makes the next claim scan from the start.
func (f *scanFloor) reset() {
	f.mu.Lock()
	f.full = true
	f.mu.Unlock()
}

// late records a transaction that committed more than floorSlack after its first insert
// started (at insertAt, process clock).
func (f *scanFloor) late(insertAt time.Time) {
	f.mu.Lock()
	if f.lateFrom.IsZero() || insertAt.Before(f.lateFrom) {
		f.lateFrom = insertAt
	}
	f.mu.Unlock()
}

// cond is the claim's extra WHERE condition for sc, "" from the start.
func (sc floorScan) cond() string {
	if sc.full {
		return ""
	}
	at := "'" + sc.at.UTC().Format("2006-01-02 15:04:05.000") + "'"
	if sc.lookback > 0 {
		at = fmt.Sprintf("LEAST(%s, DATE_SUB(UTC_TIMESTAMP(3), INTERVAL %d MICROSECOND))", at, sc.lookback.Microseconds())
	}
	return " AND next_retry_time >= " + at
}
