package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/go-outbox/outbox/internal/mysqldialect"
)

// The partitioned table ([MySQLConfig.PartitionIDs], docs/retention.md): its CREATE TABLE,
// its check, and the purge's maintenance of it: partitions made ahead of the ids, and whole
// partitions of final, old rows dropped instead of deleted row by row.

const (
	// minPartitionIDs is the smallest MySQLConfig.PartitionIDs: fewer ids a partition would
	// soon reach the servers' limit of partitions.
	minPartitionIDs = 1000
	// partitionsAhead is how many empty partitions the purge keeps above the id the next
	// insert takes, so that inserts never reach the catch-all partition between two runs
	// (and splitting it stays a change of metadata).
	partitionsAhead = 2
	// maxNewPartitions is how many partitions of PartitionIDs ids one run adds at most;
	// when the ids have run further ahead than that (the catch-all partition holds rows),
	// one partition up to the first bound above the highest id takes them.
	maxNewPartitions = 16
	// maxPartitions is the servers' limit of partitions in a table.
	maxPartitions = 8192
	// partitionDDLWait is the session's lock_wait_timeout, in seconds, for the purge's
	// partition statements: how long one waits for the table's open transactions to end
	// (and the table's writers wait behind it) before it gives up until the next run.
	partitionDDLWait = 1
	// catchAllPartition is the last partition's name in the layout CreateSchema writes.
	catchAllPartition = "pmax"
	// errFeatureDisabled is ER_FEATURE_DISABLED (a server built without partitioning), and
	// errOptionPrevents ER_OPTION_PREVENTS_STATEMENT (one started with --skip-partition):
	// how MariaDB refuses a partitioned table without its partition plugin.
	errFeatureDisabled = mysqldialect.ErrFeatureDisabled
	errOptionPrevents  = mysqldialect.ErrOptionPrevents
)

// isNoPartitioning reports the server's refusal of partitioning itself.
func isNoPartitioning(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == errFeatureDisabled ||
		me.Number == errOptionPrevents && strings.Contains(strings.ToLower(me.Message), "partition"))
}

// The lines of schema.sql that a partitioned table has otherwise: a unique key must contain
// the partitioning column (MySQL and MariaDB alike), and a unique key on (event_id, id)
// would hold nothing the primary key does not, so event_id has a plain index.
const (
	uniqueEventIDLine = "    UNIQUE KEY uk_event_id (event_id),"
	eventIDIndexLine  = "    KEY idx_event_id (event_id),"
	engineLine        = ") ENGINE = InnoDB DEFAULT CHARSET = utf8mb4"
)

// partitionedSchema is the CREATE TABLE with idx_event_id in place of uk_event_id and the
// partitions of per ids each: the first partitionsAhead+1 and the catch-all.
func partitionedSchema(schema string, per int64) string {
	schema = strings.TrimSpace(schema)
	if !strings.Contains(schema, uniqueEventIDLine) || !strings.HasSuffix(schema, engineLine) {
		panic("outbox: schema.sql has no line " + uniqueEventIDLine + " or does not end with " + engineLine) // caught by the tests
	}
	return strings.Replace(schema, uniqueEventIDLine, eventIDIndexLine, 1) + "\n" + partitionClause(per, per)
}

// partitionClause partitions a table by RANGE (id) with bounds first, first+per, ... (one
// more than partitionsAhead) and the catch-all.
func partitionClause(first, per int64) string {
	var b strings.Builder
	b.WriteString("PARTITION BY RANGE (id) (")
	for i := range int64(partitionsAhead + 1) {
		bound := first + i*per
		fmt.Fprintf(&b, "PARTITION p%d VALUES LESS THAN (%d), ", bound, bound)
	}
	b.WriteString("PARTITION " + catchAllPartition + " VALUES LESS THAN MAXVALUE)")
	return b.String()
}

// partition is one partition of a RANGE (id) layout: ids from lo (the previous partition's
// bound) to below hi; hi 0 is the catch-all, VALUES LESS THAN MAXVALUE.
type partition struct {
	name   string
	lo, hi int64
	// ahead: a partition the purge would split off the catch-all before it plans, which a
	// dry run (that changes nothing) plans as if it were there: its rows are the
	// catch-all's in its range.
	ahead bool
}

// from is the FROM clause of the partition's rows in table.
func (p partition) from(table string) string {
	if p.ahead {
		return "(SELECT * FROM " + mysqldialect.Quote(table) + " WHERE id >= " + strconv.FormatInt(p.lo, 10) +
			" AND id < " + strconv.FormatInt(p.hi, 10) + ") AS ahead"
	}
	return mysqldialect.Quote(table) + " PARTITION (" + mysqldialect.Quote(p.name) + ")"
}

// partitionLayout is how the table is partitioned, as information_schema says.
type partitionLayout struct {
	exists      bool
	partitioned bool
	method      string // RANGE, LIST, HASH, ...
	expr        string // the partitioning expression, lower case, without quotes or spaces
	subparts    bool
	parts       []partition // in order; the catch-all has hi 0
	bad         string      // a bound that is neither a number nor MAXVALUE
}

// readPartitions reads the table's partitions.
func (s *MySQLStore) readPartitions(ctx context.Context) (partitionLayout, error) {
	var l partitionLayout
	rows, err := s.db.QueryContext(ctx, `SELECT PARTITION_NAME, COALESCE(SUBPARTITION_NAME, ''), COALESCE(PARTITION_METHOD, ''),
	       COALESCE(PARTITION_EXPRESSION, ''), COALESCE(PARTITION_DESCRIPTION, '')
	FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?
	ORDER BY PARTITION_ORDINAL_POSITION, SUBPARTITION_ORDINAL_POSITION`, s.table)
	if err != nil {
		return l, s.wrap("read the partitions", err)
	}
	defer rows.Close()
	lo := int64(math.MinInt64)
	for rows.Next() {
		var name sql.NullString
		var sub, method, expr, desc string
		if err := rows.Scan(&name, &sub, &method, &expr, &desc); err != nil {
			return l, s.wrap("read the partitions", err)
		}
		l.exists = true
		if !name.Valid {
			continue // not partitioned: one row, with NULLs
		}
		l.partitioned = true
		l.method = strings.ToUpper(method)
		l.expr = strings.ToLower(strings.NewReplacer("`", "", " ", "").Replace(expr))
		l.subparts = l.subparts || sub != ""
		p := partition{name: name.String, lo: lo}
		if !strings.EqualFold(desc, "MAXVALUE") {
			hi, err := strconv.ParseInt(desc, 10, 64)
			if err != nil || hi <= 0 {
				l.bad = desc
			}
			p.hi, lo = hi, hi
		}
		l.parts = append(l.parts, p)
	}
	return l, s.wrap("read the partitions", rows.Err())
}

// problem says why the purge cannot maintain the layout, or "" when it can: partitioned by
// RANGE (id), no subpartitions, and the last partition VALUES LESS THAN MAXVALUE.
func (l partitionLayout) problem() string {
	switch {
	case !l.partitioned:
		return "it is not partitioned"
	case l.method != "RANGE" || l.expr != "id":
		return fmt.Sprintf("it is partitioned by %s (%s), not by RANGE (id)", l.method, l.expr)
	case l.subparts:
		return "it has subpartitions"
	case l.bad != "":
		return fmt.Sprintf("a partition's bound %q is not a positive id", l.bad)
	case l.parts[len(l.parts)-1].hi != 0:
		return "its last partition is not VALUES LESS THAN MAXVALUE (an insert above the last bound would fail)"
	}
	return ""
}

// bounded is the partitions before the catch-all.
func (l partitionLayout) bounded() []partition { return l.parts[:len(l.parts)-1] }

// width is the ids per partition the purge adds: per when set, otherwise the last bounded
// partition's.
func (l partitionLayout) width(per int64) int64 {
	if per > 0 {
		return per
	}
	b := l.bounded()
	switch {
	case len(b) == 0:
		return minPartitionIDs
	case len(b) == 1 || b[len(b)-2].hi <= 0:
		return max(b[len(b)-1].hi, minPartitionIDs)
	}
	return max(b[len(b)-1].hi-b[len(b)-2].hi, minPartitionIDs)
}

// checkPartitions reports whether the table is partitioned as [MySQLConfig.PartitionIDs]
// needs, and names the ALTER TABLE that makes it so when it is not.
func (s *MySQLStore) checkPartitions(ctx context.Context) error {
	l, err := s.readPartitions(ctx)
	if err != nil {
		return err
	}
	if !l.exists {
		return fmt.Errorf("%w: check partitions: table %s does not exist (create it with CreateSchema)", ErrInvalidConfig, s.table)
	}
	if l.partitioned {
		if why := l.problem(); why != "" {
			return fmt.Errorf("%w: table %s cannot be maintained by partition: %s (see docs/retention.md)", ErrInvalidConfig, s.table, why)
		}
		return nil
	}
	if disabled, err := s.partitioningDisabled(ctx); err != nil {
		return err
	} else if disabled {
		return fmt.Errorf("%w: table %s is not partitioned, and the server cannot partition tables: %s", ErrInvalidConfig, s.table, noPartitionsHint)
	}
	alter, err := s.partitionAlter(ctx)
	if err != nil {
		return err
	}
	return fmt.Errorf("%w: MySQLConfig.PartitionIDs is set but table %s is not partitioned; run: %s; (a copy of the table: see docs/upgrading.md)",
		ErrInvalidConfig, s.table, alter)
}

// partitioningDisabled reports a MariaDB whose partition plugin is not active. MySQL 8
// partitions InnoDB tables natively and lists no such plugin.
func (s *MySQLStore) partitioningDisabled(ctx context.Context) (bool, error) {
	var status string
	err := s.db.QueryRowContext(ctx, `SELECT PLUGIN_STATUS FROM information_schema.PLUGINS WHERE PLUGIN_NAME = 'partition'`).Scan(&status)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, s.wrap("check partitions: read the partition plugin's status", err)
	}
	return !strings.EqualFold(status, "ACTIVE"), nil
}

// noPartitionsHint names the fixes for a server without partitioning.
const noPartitionsHint = "MariaDB runs without its partition plugin (started with --skip-partition or partition=OFF, " +
	"or built without it): start it with partitioning on, or set MySQLConfig.PartitionIDs to 0 for a table without partitions"

// partitionAlter is the ALTER TABLE that partitions the existing, unpartitioned table: the
// unique key on event_id becomes a plain index (a unique key must contain the partitioning
// column), every row there is goes to the first partition, and the purge adds the rest.
func (s *MySQLStore) partitionAlter(ctx context.Context) (string, error) {
	var maxID int64
	if err := s.db.QueryRowContext(ctx, "SELECT COALESCE(MAX(id), 0) FROM "+mysqldialect.Quote(s.table)).Scan(&maxID); err != nil {
		return "", s.wrap("check partitions: read the highest id", err)
	}
	indexes, err := s.indexColumns(ctx)
	if err != nil {
		return "", err
	}
	var specs []string
	if _, ok := indexes["uk_event_id"]; ok {
		specs = append(specs, "DROP INDEX uk_event_id")
	}
	if _, ok := indexes["idx_event_id"]; !ok {
		specs = append(specs, "ADD INDEX idx_event_id (event_id)")
	}
	// The partitioning comes after the other changes, without a comma (both servers' grammar).
	alter := "ALTER TABLE " + mysqldialect.Quote(s.table) + " "
	if len(specs) > 0 {
		alter += strings.Join(specs, ", ") + " "
	}
	return alter + partitionClause(roundUp(maxID+1, s.partitionIDs), s.partitionIDs), nil
}

// roundUp is the least multiple of per at or above v.
func roundUp(v, per int64) int64 { return (v + per - 1) / per * per }

// partitionPlan is what a partitioned purge does with the partitions whose ids have all
// been handed out and whose newest row is older than the retention.
type partitionPlan struct {
	drop     []partition // every row final and older than the retention: dropped whole
	rows     []int64     // the rows of each partition in drop, as counted
	fallback []partition // old, but holding a WAIT, SENDING or FAIL row or a final row updated since: the batched DELETE
}

// planPartitions looks at each bounded partition, oldest first, while its newest row is
// older than the retention. A partition qualifies only once a row with an id at or above
// its bound exists: the ids below it have all been handed out, so no insert can come later.
func (s *MySQLStore) planPartitions(ctx context.Context, l partitionLayout, age int64) (partitionPlan, error) {
	var plan partitionPlan
	var maxID sql.NullInt64
	if err := s.db.QueryRowContext(ctx, "SELECT MAX(id) FROM "+mysqldialect.Quote(s.table)).Scan(&maxID); err != nil {
		return plan, s.wrap("purge: read the highest id", err)
	}
	for _, p := range l.bounded() {
		if !maxID.Valid || p.hi > maxID.Int64 {
			break
		}
		from := p.from(s.table)
		// Its newest row (the primary key's last entry): younger than the retention, and so
		// is every later partition's.
		var old bool
		err := s.db.QueryRowContext(ctx, "SELECT create_time < "+cutoffSQL+" FROM "+from+" ORDER BY id DESC LIMIT 1", age).Scan(&old)
		switch {
		case errors.Is(err, sql.ErrNoRows): // empty
			plan.drop, plan.rows = append(plan.drop, p), append(plan.rows, 0)
			continue
		case err != nil:
			return plan, s.wrap("purge: read a partition's newest row", err)
		case !old:
			return plan, nil
		}
		open, err := hasOpenRows(ctx, s.db, from)
		if err != nil {
			return plan, s.wrap("purge: look for unsent rows in a partition", err)
		}
		if open {
			plan.fallback = append(plan.fallback, p)
			continue
		}
		// Every row final: are they all older than the retention? No index holds
		// update_time, so this reads the partition once (a read; nothing is written).
		var n int64
		var recent bool
		if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*), COALESCE(MAX(update_time) >= "+cutoffSQL+", FALSE) FROM "+from, age).
			Scan(&n, &recent); err != nil {
			return plan, s.wrap("purge: read a partition's last update", err)
		}
		if recent {
			plan.fallback = append(plan.fallback, p)
			continue
		}
		plan.drop, plan.rows = append(plan.drop, p), append(plan.rows, n)
	}
	return plan, nil
}

// cutoffSQL is the retention's cutoff by the database clock, olderThan in microseconds.
const cutoffSQL = "DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND)"

// hasOpenRows reports whether the partition (from: the table with its PARTITION clause)
// holds a WAIT, SENDING or FAIL row: ranges of idx_status_next_retry. Its error is the
// driver's.
func hasOpenRows(ctx context.Context, q querier, from string) (bool, error) {
	var one int
	err := q.QueryRowContext(ctx, "SELECT 1 FROM "+from+" WHERE status IN ('WAIT', 'SENDING', 'FAIL') LIMIT 1").Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// partitionDDL runs fn on a connection of its own whose statements wait at most
// partitionDDLWait for the table's metadata lock, and closes the connection afterwards
// rather than return a session with that setting (or a table lock) to the pool.
func (s *MySQLStore) partitionDDL(ctx context.Context, op string, fn func(conn *sql.Conn) error) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return s.wrap(op, err)
	}
	defer func() {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		_ = conn.Close()
	}()
	if _, err := conn.ExecContext(ctx, "SET SESSION lock_wait_timeout = "+strconv.Itoa(partitionDDLWait)); err != nil {
		return s.wrap(op, err)
	}
	err = fn(conn)
	if mysqldialect.Is(err, mysqldialect.ErrLockWaitTimeout) {
		return fmt.Errorf("outbox: %s: a transaction on table %s stayed open for more than %d s, so the table's metadata lock could not be had; the next run tries again: %w",
			op, s.table, partitionDDLWait, err)
	}
	return s.wrap(op, err)
}

// boundsAhead returns the bounds of the partitions addPartitionsAhead adds to the layout:
// none when partitionsAhead empty partitions lie above the highest id already.
func (s *MySQLStore) boundsAhead(ctx context.Context, l partitionLayout, per int64) ([]int64, error) {
	var maxID int64
	if err := s.db.QueryRowContext(ctx, "SELECT COALESCE(MAX(id), 0) FROM "+mysqldialect.Quote(s.table)).Scan(&maxID); err != nil {
		return nil, s.wrap("purge: read the highest id", err)
	}
	last := int64(0)
	if b := l.bounded(); len(b) > 0 {
		last = b[len(b)-1].hi
	}
	target := maxID + 1 + partitionsAhead*per
	if last >= target {
		return nil, nil
	}
	var bounds []int64
	next := last + per
	if (target-last+per-1)/per > maxNewPartitions {
		next = roundUp(maxID+1, per)
	}
	for ; len(bounds) == 0 || bounds[len(bounds)-1] < target; next += per {
		bounds = append(bounds, next)
	}
	if len(l.parts)+len(bounds) > maxPartitions {
		return nil, fmt.Errorf("outbox: purge: table %s would have more than %d partitions: raise MySQLConfig.PartitionIDs, or let the retention drop old partitions",
			s.table, maxPartitions)
	}
	return bounds, nil
}

// withAhead is the layout with the partitions of bounds split off its catch-all, marked
// ahead: the layout a purge plans on after addPartitionsAhead, for a dry run to plan on
// without changing the table.
func (l partitionLayout) withAhead(bounds []int64) partitionLayout {
	b := l.bounded()
	parts := slices.Clone(b)
	lo := int64(math.MinInt64)
	if len(b) > 0 {
		lo = b[len(b)-1].hi
	}
	for _, hi := range bounds {
		parts = append(parts, partition{name: "p" + strconv.FormatInt(hi, 10), lo: lo, hi: hi, ahead: true})
		lo = hi
	}
	catchAll := l.parts[len(l.parts)-1]
	catchAll.lo = lo
	l.parts = append(parts, catchAll)
	return l
}

// addPartitionsAhead splits the catch-all partition so that partitionsAhead empty
// partitions lie above the highest id. While the catch-all is empty this changes metadata
// only; when inserts have reached it, its rows move to the new partition that covers them.
// It returns the layout as it now is.
func (s *MySQLStore) addPartitionsAhead(ctx context.Context, l partitionLayout, per int64) (partitionLayout, error) {
	bounds, err := s.boundsAhead(ctx, l, per)
	if err != nil || len(bounds) == 0 {
		return l, err
	}
	catchAll := l.parts[len(l.parts)-1].name
	var b strings.Builder
	b.WriteString("ALTER TABLE " + mysqldialect.Quote(s.table) + " REORGANIZE PARTITION " + mysqldialect.Quote(catchAll) + " INTO (")
	for _, bound := range bounds {
		fmt.Fprintf(&b, "PARTITION p%d VALUES LESS THAN (%d), ", bound, bound)
	}
	b.WriteString("PARTITION " + mysqldialect.Quote(catchAll) + " VALUES LESS THAN MAXVALUE)")
	if s.partitionHook != nil {
		s.partitionHook("reorganize")
	}
	if err := s.partitionDDL(ctx, "purge: add partitions", func(conn *sql.Conn) error {
		_, err := conn.ExecContext(ctx, b.String())
		return err
	}); err != nil {
		return l, err
	}
	return s.readPartitions(ctx)
}

// hasRecentFinalRows reports whether the partition (from: the table with its PARTITION
// clause) holds a SUCCESS or SKIPPED row claimed within the retention (age in
// microseconds): a range of idx_status_claimed_at. A row that a transaction still open
// during the plan inserted, and that was sent (or dead-lettered and skipped) before the
// drop's lock, is such a row: its claim came after its commit. Its error is the driver's.
func hasRecentFinalRows(ctx context.Context, q querier, from string, age int64) (bool, error) {
	var one int
	err := q.QueryRowContext(ctx, "SELECT 1 FROM "+from+" WHERE status IN ('SUCCESS', 'SKIPPED') AND claimed_at >= "+cutoffSQL+" LIMIT 1", age).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// dropPartitions drops the partitions, after checking again, with the table locked, that
// none holds a WAIT, SENDING or FAIL row, nor a sent row claimed within the retention (age,
// in microseconds): LOCK TABLES ... WRITE waits for every transaction on the table to end,
// so a row inserted into one of them by a transaction that was still open when the plan
// was made is seen now, unsent or sent since, and keeps its partition. It returns the
// names it dropped.
func (s *MySQLStore) dropPartitions(ctx context.Context, parts []partition, age int64) ([]string, error) {
	var dropped []string
	err := s.partitionDDL(ctx, "purge: drop partitions", func(conn *sql.Conn) error {
		if s.partitionHook != nil {
			s.partitionHook("lock")
		}
		if _, err := conn.ExecContext(ctx, "LOCK TABLES "+mysqldialect.Quote(s.table)+" WRITE"); err != nil {
			return err
		}
		var names []string
		for _, p := range parts {
			from := mysqldialect.Quote(s.table) + " PARTITION (" + mysqldialect.Quote(p.name) + ")"
			open, err := hasOpenRows(ctx, conn, from)
			if err == nil && !open {
				open, err = hasRecentFinalRows(ctx, conn, from, age)
			}
			if err != nil {
				return err
			}
			if !open {
				names = append(names, p.name)
			}
		}
		if len(names) > 0 {
			if s.partitionHook != nil {
				s.partitionHook("drop")
			}
			quoted := make([]string, len(names))
			for i, n := range names {
				quoted[i] = mysqldialect.Quote(n)
			}
			if _, err := conn.ExecContext(ctx, "ALTER TABLE "+mysqldialect.Quote(s.table)+" DROP PARTITION "+strings.Join(quoted, ", ")); err != nil {
				return err
			}
			dropped = names
		}
		_, err := conn.ExecContext(ctx, "UNLOCK TABLES")
		return err
	})
	return dropped, err
}

// purgePartitioned is [MySQLStore.Purge] on a table partitioned by RANGE (id): under the
// purge lock, whatever opts.Exclusive says, since it changes the table's partitions, it
// adds partitions ahead, drops the old partitions whose rows are all final and older than
// olderThan, and deletes in batches the final, old rows of the old partitions that cannot
// be dropped yet. Rows in partitions whose newest row is younger than olderThan wait for
// their partition's drop.
func (s *MySQLStore) purgePartitioned(ctx context.Context, olderThan time.Duration, opts PurgeOptions, l partitionLayout) (int64, error) {
	age := olderThan.Microseconds()
	if !opts.DryRun {
		release, err := s.takePurgeLock(ctx)
		if err != nil {
			return 0, err
		}
		defer release()
		if l, err = s.addPartitionsAhead(ctx, l, l.width(s.partitionIDs)); err != nil {
			return 0, err
		}
	} else {
		// A dry run changes nothing, but counts what a real run would remove: the rows the
		// real run would first move out of the catch-all into partitions ahead too.
		bounds, err := s.boundsAhead(ctx, l, l.width(s.partitionIDs))
		if err != nil {
			return 0, err
		}
		l = l.withAhead(bounds)
	}
	plan, err := s.planPartitions(ctx, l, age)
	if err != nil {
		return 0, err
	}
	var total int64
	var drop []partition
	for i, p := range plan.drop {
		if opts.Limit > 0 && total+plan.rows[i] > opts.Limit {
			// Dropping it would remove more than the limit allows: its rows go in batches,
			// up to the limit, oldest first, like those of a partition that cannot be dropped.
			plan.fallback = append(slices.Clone(plan.drop[i:]), plan.fallback...)
			break
		}
		drop = append(drop, p)
		total += plan.rows[i]
	}
	if opts.DryRun {
		for _, p := range plan.fallback {
			var n int64
			if err := s.db.QueryRowContext(ctx, s.q.countPurgeableIn, age, age, p.lo, p.hi).Scan(&n); err != nil {
				return 0, s.wrap("count purgeable events", err)
			}
			total += n
		}
		if opts.Limit > 0 {
			total = min(total, opts.Limit)
		}
		return total, nil
	}
	total = 0
	if len(drop) > 0 {
		dropped, err := s.dropPartitions(ctx, drop, age)
		var n int64
		for i, p := range drop {
			if slices.Contains(dropped, p.name) {
				n += plan.rows[i]
			}
		}
		total += n
		if n > 0 && opts.OnBatch != nil {
			opts.OnBatch(n)
		}
		if err != nil {
			return total, err
		}
		for _, p := range drop {
			if !slices.Contains(dropped, p.name) { // a row arrived meanwhile: kept
				plan.fallback = append(plan.fallback, p)
			}
		}
	}
	for _, p := range plan.fallback {
		n, err := s.purgeRange(ctx, age, opts, total, p.lo, p.hi)
		total += n
		if err != nil || opts.Limit > 0 && total >= opts.Limit {
			return total, err
		}
	}
	return total, nil
}
