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
// other protocols, or the library's own without the rest of the library, cost the writers,
// so that the library's cost can be read against them. None is a relay anyone should run:
// they retry nothing, and they wait for every id to be committed in the end (true of the
// benchmark's writers, which never roll back).
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
	// BinlogOnly reads the outbox table's inserts from the binary log and sends each
	// transaction's events, writing nothing (MariaDB only): the least a relay that reads
	// the binlog can cost, whatever it records. The binlog relay (Drain.Relay) writes one
	// UPDATE per batch on top of it.
	BinlogOnly
)

func (r Reference) String() string {
	switch r {
	case ReadOnly:
		return "reading only (reference)"
	case OneWrite:
		return "one write per event (reference)"
	case TwoWrites:
		return "two writes per event (reference)"
	case BinlogOnly:
		return "binlog, writes nothing (reference)"
	}
	return "library"
}

// referenceBatch is the most rows a reference round takes.
const referenceBatch = 1000

// runReference runs the reference relay kind on table through db until ctx ends, one round
// every gap, handing what it reads to s. Any error ends it (and so the measurement): a
// reference retries nothing.
func runReference(ctx context.Context, db *sql.DB, table string, kind Reference, gap time.Duration, s outbox.Sender) error {
	var (
		read    readSet
		sending []string // TwoWrites: the ids the last round sent, set SUCCESS by the next
	)
	mark := "UPDATE `" + table + "` SET status = '%s', claim_owner = 'reference', claimed_at = UTC_TIMESTAMP(3) WHERE id IN (%s)"
	t := time.NewTicker(gap)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		query := read.query(table, kind)
		if kind == ReadOnly {
			evs, err := readEvents(ctx, db, query, read.high)
			if err != nil {
				return referenceErr(ctx, err)
			}
			if len(evs) > 0 {
				s.Send(ctx, evs, false)
			}
			read.add(evs)
			continue
		}
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return referenceErr(ctx, err)
		}
		if len(sending) > 0 {
			_, err = tx.ExecContext(ctx, fmt.Sprintf(mark, "SUCCESS", strings.Join(sending, ",")))
		}
		var evs []outbox.Event
		if err == nil {
			evs, err = readEvents(ctx, tx, query, read.high)
		}
		ids := idStrings(evs)
		if err == nil && len(evs) > 0 {
			if kind == OneWrite {
				s.Send(ctx, evs, false) // holding the rows' locks
				_, err = tx.ExecContext(ctx, fmt.Sprintf(mark, "SUCCESS", strings.Join(ids, ",")))
			} else {
				_, err = tx.ExecContext(ctx, fmt.Sprintf(mark, "SENDING", strings.Join(ids, ",")))
			}
		}
		if err == nil {
			err = tx.Commit()
		} else {
			_ = tx.Rollback()
		}
		if err != nil {
			return referenceErr(ctx, err)
		}
		sending = nil
		if kind == TwoWrites && len(evs) > 0 {
			s.Send(ctx, evs, false) // after the commit: the rows are SENDING, ours
			sending = ids
		}
		read.add(evs)
	}
}

// readSet is what a reference relay has read: every id up to floor, the ids in seen above
// it, none above high. The ids it has not read below high are transactions that committed
// after later ones; the benchmark's transactions are short, so there are few, and none for
// good (its writers never roll back).
type readSet struct {
	floor, high int64
	seen        map[int64]bool
}

// query is the round's SELECT for a relay of kind on table, one argument (high): the ids not
// read below high, and the next ones above it, by primary key; a relay that writes locks
// them and takes only WAIT rows.
func (r *readSet) query(table string, kind Reference) string {
	var missing []string
	for id := r.floor + 1; id < r.high && len(missing) < referenceBatch; id++ {
		if !r.seen[id] {
			missing = append(missing, strconv.FormatInt(id, 10))
		}
	}
	where := "id > ?"
	if len(missing) > 0 {
		where = "(id IN (" + strings.Join(missing, ",") + ") OR id > ?)"
	}
	q := "SELECT id, event_id, biz_no, event_type, payload FROM `" + table + "` FORCE INDEX (PRIMARY) WHERE " + where
	if kind != ReadOnly {
		q += " AND status = 'WAIT'"
	}
	q += " ORDER BY id LIMIT " + strconv.Itoa(referenceBatch)
	if kind != ReadOnly {
		q += " FOR UPDATE SKIP LOCKED"
	}
	return q
}

// add records evs as read.
func (r *readSet) add(evs []outbox.Event) {
	if r.seen == nil {
		r.seen = map[int64]bool{}
	}
	for _, ev := range evs {
		r.seen[ev.ID] = true
		r.high = max(r.high, ev.ID)
	}
	for r.seen[r.floor+1] {
		delete(r.seen, r.floor+1)
		r.floor++
	}
}

func idStrings(evs []outbox.Event) []string {
	ids := make([]string, len(evs))
	for i, ev := range evs {
		ids[i] = strconv.FormatInt(ev.ID, 10)
	}
	return ids
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
