package relay

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/mysqldialect"
)

// errNotLeader ends a term: another relay holds the lock, or took the table over (a higher
// epoch), or the pollers did.
var errNotLeader = errors.New("relay: not the leader")

// lockName is the SQL expression naming the table's leadership lock (GET_LOCK): one per
// database and table.
func (r *Relay) lockName() string { return mysqldialect.LockName(mysqldialect.RelayLock, r.cfg.Table) }

// lead tries once to become the table's leader. As leader it runs terms until it loses the
// leadership or ctx ends, and hands the table back to the pollers when ctx ends.
func (r *Relay) lead(ctx context.Context, info serverInfo) error {
	lock, err := r.db.Conn(ctx)
	if err != nil {
		return err
	}
	var got sql.NullInt64
	if err := lock.QueryRowContext(ctx, "SELECT GET_LOCK("+r.lockName()+", 0)").Scan(&got); err != nil {
		_ = lock.Raw(func(any) error { return driver.ErrBadConn }) // it may hold the lock
		_ = lock.Close()
		return fmt.Errorf("relay: GET_LOCK: %w", err)
	}
	if got.Int64 != 1 {
		_ = lock.Close() // holds nothing: back to the pool, for the next try
		return errNotLeader
	}
	// The lock belongs to the connection's session: the connection is closed, never
	// returned to the pool, so that the lock ends with it.
	defer func() {
		_ = lock.Raw(func(any) error { return driver.ErrBadConn })
		_ = lock.Close()
	}()
	if err := r.lockServerID(ctx, lock); err != nil {
		return err
	}
	epoch, resume, err := r.takeOver(ctx)
	if err != nil {
		return err
	}
	r.counters.terms.Add(1)
	r.m.add(ctx, func(m *metrics) metric.Int64Counter { return m.terms }, 1)
	r.setTerm(epoch, resume)
	defer r.setLeader(epoch, false)
	r.cfg.Logger.InfoContext(ctx, "relay: leading", slog.String("table", r.cfg.Table), slog.Int64("epoch", epoch),
		slog.String("resume_from", resume))
	for {
		t := newTerm(r, info, epoch, lock)
		err := t.run(ctx, resume)
		switch {
		case ctx.Err() != nil:
			r.handBack(epoch)
			return nil
		case errors.Is(err, errPositionLost):
			// Still the leader: read from the current position, after sweeping the table.
			r.counters.handovers.Add(1)
			r.m.add(ctx, func(m *metrics) metric.Int64Counter { return m.lost }, 1)
			r.cfg.Logger.WarnContext(ctx, "relay: the binlog cannot be followed here; sweeping the table and reading on from the current position",
				slog.Any("reason", err))
			resume = ""
			continue
		case errors.Is(err, errMarksFailing):
			r.handBack(epoch)
			r.setLeader(epoch, false)
			r.cfg.Logger.ErrorContext(ctx, "relay: handed the table to the polling publishers: its marks keep failing",
				slog.String("table", r.cfg.Table), slog.Any("error", err), slog.Duration("leads_again_after", r.cfg.FallbackAfter))
			if !errors.Is(err, outbox.ErrInvalidConfig) {
				// The publishers keep the table for FallbackAfter before this relay tries again.
				select {
				case <-ctx.Done():
				case <-time.After(r.cfg.FallbackAfter):
				}
			}
		}
		return err
	}
}

// takeOver makes this relay the table's publisher: a new epoch, and the position to resume
// from ("" when the last publisher was not a relay, or left none).
func (r *Relay) takeOver(ctx context.Context) (epoch int64, resume string, err error) {
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, "", err
	}
	defer tx.Rollback()
	var mode, gtid string
	fallback := r.cfg.FallbackAfter.Milliseconds()
	// The row exists from the first claim of a publisher with RelayTable, or from here
	// (epoch 0, mode polling). FOR UPDATE then waits for the pollers' claims in flight (each
	// reads the row LOCK IN SHARE MODE, or created it): once this commits, no poller claims.
	if _, err := tx.ExecContext(ctx, r.q.insertRow, r.cfg.Table, r.cfg.InstanceID, fallback); err != nil {
		return 0, "", fmt.Errorf("relay: take the table over: %w", err)
	}
	if err := tx.QueryRowContext(ctx, r.q.lockRow, r.cfg.Table).Scan(&epoch, &mode, &gtid); err != nil {
		return 0, "", fmt.Errorf("relay: take the table over: %w", err)
	}
	if mode == "relay" {
		resume = gtid
	}
	if _, err := tx.ExecContext(ctx, r.q.takeRow, r.cfg.InstanceID, resume, fallback, r.cfg.Table); err != nil {
		return 0, "", fmt.Errorf("relay: take the table over: %w", err)
	}
	epoch++
	if err := tx.Commit(); err != nil {
		return 0, "", fmt.Errorf("relay: take the table over: %w", err)
	}
	return epoch, resume, nil
}

// handBack gives the table to the polling publishers, as the leader stops.
func (r *Relay) handBack(epoch int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := r.db.ExecContext(ctx, r.q.giveBack, r.cfg.Table, epoch); err != nil {
		r.cfg.Logger.WarnContext(ctx, "relay: could not hand the table to the pollers; they take it over once the heartbeat is old",
			slog.Any("error", err), slog.Duration("fallback_after", r.cfg.FallbackAfter))
	}
}

// stillLeader checks the lock's connection: the session that took the lock must still hold
// it (a KILLed connection, or a restarted server, has lost it).
func (r *Relay) stillLeader(ctx context.Context, lock *sql.Conn) error {
	var mine sql.NullInt64
	err := lock.QueryRowContext(ctx, "SELECT IS_USED_LOCK("+r.lockName()+") = CONNECTION_ID()").Scan(&mine)
	if err != nil {
		return fmt.Errorf("%w: the lock's connection: %w", errNotLeader, err)
	}
	if mine.Int64 != 1 {
		return fmt.Errorf("%w: the lock is no longer held", errNotLeader)
	}
	return nil
}
