package outbox

import (
	"cmp"
	"errors"
	"fmt"
	"time"
)

// ErrInvalidInput is wrapped by every error for an administrative request that cannot be
// run as asked (an unknown status, a negative limit, an empty id range): nothing was read
// or changed.
var ErrInvalidInput = errors.New("outbox: invalid input")

// ErrNotDeadLetter is wrapped by the error of [Admin.Requeue] and [Admin.Skip] for an event
// that is not a dead letter (FAIL): only those can be requeued or skipped, and nothing was
// changed.
var ErrNotDeadLetter = errors.New("outbox: the event is not a dead letter (FAIL)")

// ErrPurgeBusy is returned by [MySQLStore.Purge] with [PurgeOptions.Exclusive] when another
// session is purging the same table: this purge did nothing, and the other one does the work.
var ErrPurgeBusy = errors.New("outbox: another purge of this table is running")

// Limits of the administrative operations, as the field docs give them.
const (
	// listLimitDefault is how many rows Admin.List and Admin.Blocked return when asked for 0.
	listLimitDefault = 100
	// listLimitMax is the most rows one List or Blocked returns: a page for a person or a
	// script, never the table.
	listLimitMax = 10000
	// requeueBatchDefault is how many rows one requeue statement changes at most.
	requeueBatchDefault = 500
	// purgeBatchDefault is how many rows one purge DELETE removes at most.
	purgeBatchDefault = 500
	// purgePauseDefault is the pause between two purge DELETEs.
	purgePauseDefault = 100 * time.Millisecond
	// maxAdminBatch bounds a batch: a statement with more ids holds its row locks longer
	// than a publisher's claim should wait for them.
	maxAdminBatch = 10000
)

// Admin is what a person (or a script) runs against a [MySQLStore]'s table: reading
// events, returning dead letters to WAIT, skipping them, and finding the keys they hold
// back. Its calls run short autocommit statements on the store's pool; they are safe for
// concurrent use and beside running publishers, and a call that makes events due wakes the
// publishers of this process that use the store (see [MySQLStore.Notify]). Purging and the
// table's statistics are the store's own ([MySQLStore.Purge], [MySQLStore.Stats]): a
// publisher runs them too.
//
// Everywhere here, id is the row's AUTO_INCREMENT id ([Event.ID]) and event_id the UUID
// consumers see ([Event.EventID]).
type Admin struct {
	s *MySQLStore
}

// NewAdmin returns the operator's calls on store's table. It panics if store is nil.
func NewAdmin(store *MySQLStore) *Admin {
	if store == nil {
		panic("outbox: NewAdmin: nil store")
	}
	return &Admin{s: store}
}

// Filter selects events for [Admin.List] and [Admin.RequeueFailed]. Zero fields select
// everything; set fields are ANDed.
type Filter struct {
	// Status keeps events in this status only; "" keeps all.
	Status Status
	// IDs keeps these rows only, when not empty (at most 10000).
	IDs []int64
	// EventType and BizNo keep events with exactly this type or business key.
	EventType string
	BizNo     string
	// MinID and MaxID bound the row id, both inclusive; 0 means no bound.
	MinID, MaxID int64
	// CreatedSince and CreatedUntil bound create_time (UTC, by the database clock):
	// CreatedSince inclusive, CreatedUntil exclusive. The zero time means no bound.
	CreatedSince, CreatedUntil time.Time
	// Limit is how many rows List returns at most, newest id first: 0 means 100, and it is
	// at most 10000. It also bounds how many rows a requeue changes in all when set; 0 there
	// means every matching row.
	Limit int
}

// validate reports what makes f unusable, wrapping ErrInvalidInput.
func (f Filter) validate() error {
	switch f.Status {
	case "", StatusWait, StatusSending, StatusSuccess, StatusFail, StatusSkipped:
	default:
		return fmt.Errorf("%w: unknown status %q (want WAIT, SENDING, SUCCESS, FAIL or SKIPPED)", ErrInvalidInput, string(f.Status))
	}
	if len(f.IDs) > maxAdminBatch {
		return fmt.Errorf("%w: at most %d ids at once, got %d", ErrInvalidInput, maxAdminBatch, len(f.IDs))
	}
	for _, id := range f.IDs {
		if id <= 0 {
			return fmt.Errorf("%w: ids are positive, got %d", ErrInvalidInput, id)
		}
	}
	if f.MinID < 0 || f.MaxID < 0 {
		return fmt.Errorf("%w: ids are positive, got range %d..%d", ErrInvalidInput, f.MinID, f.MaxID)
	}
	if f.MaxID != 0 && f.MinID > f.MaxID {
		return fmt.Errorf("%w: id range %d..%d is empty", ErrInvalidInput, f.MinID, f.MaxID)
	}
	if !f.CreatedSince.IsZero() && !f.CreatedUntil.IsZero() && !f.CreatedSince.Before(f.CreatedUntil) {
		return fmt.Errorf("%w: created-since %s is not before created-until %s", ErrInvalidInput,
			f.CreatedSince.UTC().Format(time.RFC3339), f.CreatedUntil.UTC().Format(time.RFC3339))
	}
	if f.Limit < 0 || f.Limit > listLimitMax {
		return fmt.Errorf("%w: limit must be between 0 and %d, got %d", ErrInvalidInput, listLimitMax, f.Limit)
	}
	if len(f.EventType) > 4*maxKeyLen || len(f.BizNo) > 4*maxKeyLen {
		return fmt.Errorf("%w: event type and biz no are at most %d characters", ErrInvalidInput, maxKeyLen)
	}
	return nil
}

// ListedEvent is an event as [Admin.List] returns it: every column but the payload, whose
// length PayloadSize gives.
type ListedEvent struct {
	Event
	PayloadSize int
}

// RequeueOptions tunes [Admin.RequeueFailed].
type RequeueOptions struct {
	// BatchRows is how many rows one statement changes at most: 0 means 500, and it is at
	// most 10000.
	BatchRows int
	// DryRun only counts the FAIL events the filter selects (at most Filter.Limit, when
	// set) and changes nothing: what the same call without DryRun would requeue now, for a
	// person to confirm first. OnBatch is not called.
	DryRun bool
	// OnBatch, if set, is called after each statement with the ids it was given and how
	// many of them it returned to WAIT (fewer when a row stopped being FAIL meanwhile),
	// e.g. to log it.
	OnBatch func(ids []int64, requeued int64)
}

// PurgeOptions tunes [MySQLStore.Purge]. A purge deletes in small batches with a pause
// between them so that it never holds many row locks, never fills the redo log in one
// statement, and leaves replicas and the publishers' claims room between its statements.
type PurgeOptions struct {
	// BatchRows is how many rows one DELETE removes at most: 0 means 500, and it is at most
	// 10000.
	BatchRows int
	// Pause is the wait between two DELETEs: 0 means 100 ms; a negative Pause means none.
	Pause time.Duration
	// Limit stops the purge once it has deleted this many rows; 0 means no limit.
	Limit int64
	// Exclusive makes the purge hold a named lock (GET_LOCK, one per database and table)
	// while it runs, and return [ErrPurgeBusy] at once if another session holds it, so that
	// several instances purging on a timer never purge side by side.
	Exclusive bool
	// DryRun only counts the rows the purge would delete now (at most Limit, when set),
	// through the same index, and deletes nothing: for a person to confirm first. It takes
	// no lock (Exclusive does not apply) and calls no OnBatch.
	DryRun bool
	// OnBatch, if set, is called after each DELETE with the rows it removed.
	OnBatch func(deleted int64)
}

func (o PurgeOptions) withDefaults() (PurgeOptions, error) {
	o.BatchRows = cmp.Or(o.BatchRows, purgeBatchDefault)
	if o.BatchRows < 0 || o.BatchRows > maxAdminBatch {
		return o, fmt.Errorf("%w: purge batch must be between 1 and %d rows, got %d", ErrInvalidInput, maxAdminBatch, o.BatchRows)
	}
	if o.Pause == 0 {
		o.Pause = purgePauseDefault
	}
	if o.Limit < 0 {
		return o, fmt.Errorf("%w: purge limit must be positive, got %d", ErrInvalidInput, o.Limit)
	}
	return o, nil
}
