package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-outbox/outbox/internal/mysqldialect"
)

// relayGate lets a store's publishers stand by while a binlog relay (module
// github.com/go-outbox/outbox/relay) publishes the table, and take the table over when the
// relay's heartbeat is older than the relay says it may be ([MySQLConfig.RelayTable]).
//
// The relay's checkpoint row has the table's publishing epoch and mode. Each batch claim
// reads it LOCK IN SHARE MODE inside its own transaction (creating it, mode polling, if no
// relay ever made it); each per-row claim joins it at mode polling in its one UPDATE, which
// holds the same shared lock until it commits. So a relay taking the table over (which
// locks the row FOR UPDATE) waits for the claims in flight, and no claim starts after it:
// from then on the relay alone sends the table's events. A takeover by the
// publishers adds one to the epoch too, so that the relay's next write, fenced on its
// epoch, changes nothing and tells it it no longer leads.
type relayGate struct {
	table              string
	read, take, create string
	// stats reads the row for MySQLStore.Stats, without a lock.
	stats string
	// claim and orderedClaim are the per-row claims (MySQLStore.Claim) fenced on the row:
	// they change nothing unless it says the publishers poll.
	claim        string
	orderedClaim [2]string
	// leadsUntil is when (this process's monotonic clock, since the store was made) the
	// last read that found a relay leading stops counting: until then a claim claims
	// nothing without reading the row again. Claiming nothing is always safe; claiming
	// is what needs the row's lock.
	leadsUntil atomic.Int64
}

// relayLeadsFor is how long a claim that found a relay leading spares the claims after it
// the read: at a steady commit rate the publishers wake for every commit, and each would
// otherwise be a transaction on the server that the relay exists to spare. It delays a
// takeover from a silent relay by as much, on top of the relay's FallbackAfter.
const relayLeadsFor = time.Second

func newRelayGate(outboxTable, relayTable string, q mysqlQueries, oq orderQueries) *relayGate {
	relayTable = mysqldialect.Quote(relayTable)
	// The checkpoint row's columns share no name with the outbox table's, so the claims'
	// unqualified columns stay the outbox table's.
	join := " JOIN " + relayTable + " relay_gate ON relay_gate.outbox_table = '" + outboxTable + "' AND relay_gate.mode = 'polling'\n\tSET "
	gate := func(claim string) string { return strings.Replace(claim, "\n\tSET ", join, 1) }
	return &relayGate{
		claim:        gate(q.claim),
		orderedClaim: [2]string{gate(oq.claim[0]), gate(oq.claim[1])},
		table:        outboxTable,
		read: "SELECT epoch, mode = 'relay', " +
			"heartbeat_at >= UTC_TIMESTAMP(3) - INTERVAL fallback_after_ms * 1000 MICROSECOND FROM " + relayTable +
			" WHERE outbox_table = ? LOCK IN SHARE MODE",
		take: "UPDATE " + relayTable + " SET mode = 'polling', epoch = epoch + 1, leader = ?, updated_at = UTC_TIMESTAMP(3) " +
			"WHERE outbox_table = ? AND epoch = ? AND mode = 'relay'",
		stats: "SELECT mode, leader, epoch, gtid, TIMESTAMPDIFF(MICROSECOND, heartbeat_at, UTC_TIMESTAMP(3)), " +
			"mode = 'relay' AND heartbeat_at >= UTC_TIMESTAMP(3) - INTERVAL fallback_after_ms * 1000 MICROSECOND FROM " + relayTable +
			" WHERE outbox_table = ?",
		create: "INSERT IGNORE INTO " + relayTable + " (outbox_table, epoch, mode, leader, fallback_after_ms, heartbeat_at, updated_at) " +
			"VALUES (?, 0, 'polling', ?, 0, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3))",
	}
}

// relayLeads reports whether a relay publishes the table now, in q's transaction (or on its
// own with a pooled q). A relay whose heartbeat is too old is deposed: owner's publishers
// take the table over.
func (s *MySQLStore) relayLeads(ctx context.Context, q querier, owner string) (bool, error) {
	g := s.relay
	if g == nil {
		return false, nil
	}
	now := int64(time.Since(s.born))
	if now < g.leadsUntil.Load() {
		return true, nil
	}
	var (
		epoch       int64
		relay, live bool
	)
	err := q.QueryRowContext(ctx, g.read, g.table).Scan(&epoch, &relay, &live)
	if errors.Is(err, sql.ErrNoRows) {
		// No relay ever took the table. The claim creates the row (mode polling), and holds
		// it locked until it commits, so that a relay's first takeover waits for it as it
		// waits for every later claim. If a relay made the row first, it is read again.
		if _, err := q.ExecContext(ctx, g.create, g.table, owner); err != nil {
			return false, s.wrap("create the relay's checkpoint row", err)
		}
		err = q.QueryRowContext(ctx, g.read, g.table).Scan(&epoch, &relay, &live)
	}
	switch {
	case err != nil:
		if mysqldialect.Is(err, mysqldialect.ErrNoSuchTable) {
			return false, fmt.Errorf("%w: MySQLConfig.RelayTable: %w (create it with relay.CreateSchema)", ErrInvalidConfig, err)
		}
		return false, s.wrap("read the relay's checkpoint row", err)
	case !relay:
		return false, nil
	case live:
		g.leadsUntil.Store(now + int64(relayLeadsFor))
		return true, nil
	}
	if _, err := q.ExecContext(ctx, g.take, owner, g.table, epoch); err != nil {
		return false, s.wrap("take the table over from a silent relay", err)
	}
	return false, nil
}

// relayLeadsCached reports whether a claim found a relay leading less than relayLeadsFor ago.
func (s *MySQLStore) relayLeadsCached() bool {
	return s.relay != nil && int64(time.Since(s.born)) < s.relay.leadsUntil.Load()
}

// checkRelay reports a RelayTable that cannot be read.
func (s *MySQLStore) checkRelay(ctx context.Context) error {
	if s.relay == nil {
		return nil
	}
	s.relay.leadsUntil.Store(0) // read the row
	_, err := s.relayLeads(ctx, s.db, "")
	if errors.Is(err, ErrInvalidConfig) {
		return err
	}
	return nil
}
