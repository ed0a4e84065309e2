package bench

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-outbox/outbox"
)

// Reference is a relay that is not the library's: the service view runs it to show what
// cheaper protocols would cost the writers, so that the library's cost can be read against
// them. Neither is a relay anyone should run: they keep no lease, retry nothing and assume
// the table's ids have no gaps (true of the benchmark's writers, which never roll back).
type Reference int

const (
	// NoReference is the library's publishers.
	NoReference Reference = iota
	// ReadOnly reads every committed event once, in id order, and writes nothing: the
	// least a relay polling this table can do, whatever it records. No relay that marks
	// what it sent costs the writers less.
	ReadOnly
	// OneWrite marks each event once: it locks the next committed WAIT rows (FOR UPDATE SKIP
	// LOCKED), sends them while it holds the locks, and sets them SUCCESS in the same
	// transaction. One row write per event, where the library's lease protocol makes two
	// (WAIT -> SENDING before the send, SENDING -> SUCCESS after it).
	OneWrite
	// TwoWrites is the lease protocol at its barest: it locks the next committed WAIT rows
	// and sets them SENDING, commits, sends, and sets them SUCCESS in the next round's
	// transaction, before that round's read. Two row writes per event, as the library's
	// publishers, without the rest of the library (no claim session, no steady read, no
	// coalescing, metrics or logging).
	TwoWrites
)

func (r Reference) String() string {
	switch r {
	case ReadOnly:
		return "reading only (reference)"
	case OneWrite:
		return "one write per event (reference)"
	case TwoWrites:
		return "two writes per event (reference)"
	}
	return "library"
}

// referenceBatch is the most rows a reference round takes.
const referenceBatch = 1000

// runReference runs the reference relay kind on table through db until ctx ends, one round
// every gap, handing what it reads to s. A round reads the ids it has not seen below the
// highest it has (a transaction that committed after a later one) and the next ones above
// it, by primary key; it assumes the benchmark's short transactions, which leave few such
// gaps, and none for good.
func runReference(ctx context.Context, db *sql.DB, table string, kind Reference, gap time.Duration, s outbox.BatchSender) error {
	// floor: every id up to it has been read; seen: the ids above it that have been; high:
	// the highest read.
	var floor, high int64
	seen := map[int64]bool{}
	cols := "SELECT id, event_id, biz_no, event_type, payload FROM `" + table + "` FORCE INDEX (PRIMARY) WHERE "
	mark := "UPDATE `" + table + "` SET status = '%s', claim_owner = 'reference', claimed_at = UTC_TIMESTAMP(3) WHERE id IN (%s)"
	var sending []string // TwoWrites: the ids the last round sent, to be set SUCCESS
	t := time.NewTicker(gap)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		var missing []string
		for id := floor + 1; id < high && len(missing) < referenceBatch; id++ {
			if !seen[id] {
				missing = append(missing, strconv.FormatInt(id, 10))
			}
		}
		where := "id > ?"
		if len(missing) > 0 {
			where = "(id IN (" + strings.Join(missing, ",") + ") OR id > ?)"
		}
		query := cols + where
		if kind != ReadOnly {
			query += " AND status = 'WAIT'"
		}
		query += " ORDER BY id LIMIT " + strconv.Itoa(referenceBatch)
		var q querier = db
		var tx *sql.Tx
		if kind != ReadOnly {
			query += " FOR UPDATE SKIP LOCKED"
			var err error
			if tx, err = db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted}); err != nil {
				return referenceErr(ctx, err)
			}
			q = tx
		}
		var err error
		if len(sending) > 0 {
			if _, err = tx.ExecContext(ctx, fmt.Sprintf(mark, "SUCCESS", strings.Join(sending, ","))); err == nil {
				sending = nil
			}
		}
		var evs []outbox.Event
		if err == nil {
			evs, err = readEvents(ctx, q, query, high)
		}
		ids := make([]string, len(evs))
		for i, ev := range evs {
			ids[i] = strconv.FormatInt(ev.ID, 10)
		}
		switch {
		case err != nil || len(evs) == 0:
		case kind == OneWrite:
			s.SendBatch(ctx, evs)
			_, err = tx.ExecContext(ctx, fmt.Sprintf(mark, "SUCCESS", strings.Join(ids, ",")))
		case kind == TwoWrites:
			_, err = tx.ExecContext(ctx, fmt.Sprintf(mark, "SENDING", strings.Join(ids, ",")))
		}
		if tx != nil {
			if err == nil {
				err = tx.Commit()
			} else {
				_ = tx.Rollback()
			}
		}
		if err != nil {
			return referenceErr(ctx, err)
		}
		switch {
		case len(evs) == 0:
		case kind == ReadOnly:
			s.SendBatch(ctx, evs)
		case kind == TwoWrites:
			s.SendBatch(ctx, evs)
			sending = ids
		}
		for _, ev := range evs {
			seen[ev.ID] = true
			high = max(high, ev.ID)
		}
		for seen[floor+1] {
			delete(seen, floor+1)
			floor++
		}
	}
}

type querier interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}

// readEvents runs query (one argument: arg) on q and returns the events it reads.
func readEvents(ctx context.Context, q querier, query string, arg int64) ([]outbox.Event, error) {
	rows, err := q.QueryContext(ctx, query, arg)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var evs []outbox.Event
	for rows.Next() {
		var ev outbox.Event
		if err := rows.Scan(&ev.ID, &ev.EventID, &ev.BizNo, &ev.EventType, &ev.Payload); err != nil {
			return nil, err
		}
		evs = append(evs, ev)
	}
	return evs, rows.Err()
}

// referenceErr is nil when ctx ended (the relay was stopped), err otherwise.
func referenceErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("reference relay: %w", err)
}
