package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// The index lines of schema.sql: the unordered one, and what an ordered table has instead.
const (
	bizNoIndexLine   = "KEY idx_biz_no (biz_no)"
	orderedIndexLine = "KEY " + orderIndex + " (biz_no, status, id)"
)

// orderedSchema is the CREATE TABLE with idx_biz_no_status in place of idx_biz_no.
func orderedSchema(schema string) string {
	if !strings.Contains(schema, bizNoIndexLine) {
		panic("outbox: schema.sql has no line " + bizNoIndexLine) // caught by the tests
	}
	return strings.Replace(schema, bizNoIndexLine, orderedIndexLine, 1)
}

// The statements that make an existing table fit for ordered claims; CheckOrdering names
// the ones a table needs, with its name in place of t_event_record.
const (
	// Appending a member to an ENUM changes no row: instant on MariaDB 10.3+ and MySQL 8.
	alterSkipped = "ALTER TABLE t_event_record MODIFY status ENUM('WAIT', 'SENDING', 'SUCCESS', 'FAIL', 'SKIPPED') NOT NULL DEFAULT 'WAIT'"
	// An online index build: the table takes writes while it runs.
	alterOrderIndex = "ALTER TABLE t_event_record DROP INDEX idx_biz_no, ADD INDEX idx_biz_no_status (biz_no, status, id), ALGORITHM=INPLACE, LOCK=NONE"
	// For a table without idx_biz_no (dropped, or never made).
	alterAddOrderIndex = "ALTER TABLE t_event_record ADD INDEX idx_biz_no_status (biz_no, status, id), ALGORITHM=INPLACE, LOCK=NONE"
	// For a table with an index of that name on other columns.
	alterRedoOrderIndex = "ALTER TABLE t_event_record DROP INDEX idx_biz_no_status, ADD INDEX idx_biz_no_status (biz_no, status, id), ALGORITHM=INPLACE, LOCK=NONE"
)

// checkOrdering reports whether the table can serve ordered claims: it must have the index
// idx_biz_no_status (biz_no, status, id), which the ordered claim names (FORCE INDEX), and
// a status column that allows SKIPPED. The error wraps [ErrInvalidConfig] and names the
// ALTER TABLE statements that make it so; docs/ordering.md explains them. An error reading
// the table's definition is returned as it is.
func (s *MySQLStore) checkOrdering(ctx context.Context) error {
	indexes, err := s.indexColumns(ctx)
	if err != nil {
		return err
	}
	if len(indexes) == 0 {
		return fmt.Errorf("%w: check ordering: table %s does not exist (create it with CreateSchema, MySQLConfig.Ordering set)", ErrInvalidConfig, s.table)
	}
	skipped, err := s.hasSkipped(ctx)
	if err != nil {
		return err
	}
	var (
		lacks []string
		fixes []string
	)
	if !skipped {
		lacks = append(lacks, "its status column does not allow 'SKIPPED'")
		fixes = append(fixes, alterSkipped)
	}
	switch cols, ok := indexes[orderIndex]; {
	case !ok:
		lacks = append(lacks, "it has no index idx_biz_no_status (biz_no, status, id)")
		if _, old := indexes["idx_biz_no"]; old {
			fixes = append(fixes, alterOrderIndex)
		} else {
			fixes = append(fixes, alterAddOrderIndex)
		}
	case cols != "biz_no,status,id":
		lacks = append(lacks, fmt.Sprintf("its index idx_biz_no_status is on (%s), not (biz_no, status, id)", strings.ReplaceAll(cols, ",", ", ")))
		fixes = append(fixes, alterRedoOrderIndex)
	}
	if len(lacks) == 0 {
		return nil
	}
	r := strings.NewReplacer("t_event_record", "`"+s.table+"`")
	for i := range fixes {
		fixes[i] = r.Replace(fixes[i]) + ";"
	}
	return fmt.Errorf("%w: table %s cannot serve ordered claims: %s; run: %s (see docs/ordering.md)",
		ErrInvalidConfig, s.table, strings.Join(lacks, ", and "), strings.Join(fixes, " "))
}

// indexColumns reads the table's indexes: name -> columns in order, comma-separated.
func (s *MySQLStore) indexColumns(ctx context.Context) (map[string]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT INDEX_NAME, GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX SEPARATOR ',')
	FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?
	GROUP BY INDEX_NAME`, s.table)
	if err != nil {
		return nil, s.wrap("check ordering: read the indexes", err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name, cols string
		if err := rows.Scan(&name, &cols); err != nil {
			return nil, s.wrap("check ordering: read the indexes", err)
		}
		out[name] = strings.ToLower(cols)
	}
	return out, s.wrap("check ordering: read the indexes", rows.Err())
}

// hasSkipped reports whether the status column allows SKIPPED (a table made before it does
// not; in non-strict SQL modes writing it there would store ” instead of failing).
func (s *MySQLStore) hasSkipped(ctx context.Context) (bool, error) {
	var typ string
	err := s.db.QueryRowContext(ctx, `SELECT COLUMN_TYPE FROM information_schema.COLUMNS
	WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = 'status'`, s.table).Scan(&typ)
	if errors.Is(err, sql.ErrNoRows) {
		return false, fmt.Errorf("outbox: table %s does not exist or has no status column", s.table)
	}
	if err != nil {
		return false, s.wrap("read the status column's type", err)
	}
	return strings.Contains(typ, "'SKIPPED'"), nil
}

// Skip marks a dead letter (FAIL) SKIPPED: a person decided it is never to be sent. SKIPPED
// is final and counts as done for ordering, so under [KeyOrder] the events of its biz no
// behind it go on, and this process's publishers are woken; [Admin.Requeue] is the other way
// to unblock a key (the event is sent after all). Only a FAIL event changes: an event in any
// other status is refused with an error wrapping [ErrNotDeadLetter], a missing id with
// [ErrNotFound]. A table whose status column does not allow SKIPPED yet is refused with the
// ALTER TABLE to run.
func (a *Admin) Skip(ctx context.Context, id int64) error {
	if id <= 0 {
		return fmt.Errorf("%w: ids are positive, got %d", ErrInvalidInput, id)
	}
	s := a.s
	ok, err := s.hasSkipped(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("outbox: skip: table %s's status column does not allow 'SKIPPED'; run: %s; (see the README's \"Per-key ordering\")",
			s.table, strings.ReplaceAll(alterSkipped, "t_event_record", "`"+s.table+"`"))
	}
	if err := a.deadLetterOnly(ctx, "skip", s.oq.skip, id); err != nil {
		return err
	}
	s.Notify()
	return nil
}

// BlockedKey is a dead letter with events of its biz no waiting behind it, as
// [Admin.Blocked] lists it. Under [KeyOrder] those events are held back until a person
// requeues or skips the dead letter.
type BlockedKey struct {
	// ListedEvent is the dead letter (FAIL), without its payload.
	ListedEvent
	// Waiting is how many WAIT events of its biz no have a larger id.
	Waiting int64
}

// Blocked lists dead letters (FAIL) that have WAIT events of the same biz no after them,
// oldest id first, with how many wait behind each: under [KeyOrder], the keys that stand
// still until a person requeues ([Admin.Requeue]) or skips ([Admin.Skip]) their dead
// letter. At most limit of them: 0 means 100, and limit is at most 10000.
// It reads every FAIL row and, for each, on an ordered table, one range of
// idx_biz_no_status that holds only the key's WAIT events, never a SUCCESS row; on an
// unordered table (idx_biz_no) it reads every event of each dead letter's biz no.
func (a *Admin) Blocked(ctx context.Context, limit int) ([]BlockedKey, error) {
	if limit < 0 || limit > listLimitMax {
		return nil, fmt.Errorf("%w: limit must be between 0 and %d, got %d", ErrInvalidInput, listLimitMax, limit)
	}
	s := a.s
	rows, err := s.db.QueryContext(ctx, s.oq.blocked, cmp.Or(limit, listLimitDefault))
	if err != nil {
		return nil, s.wrap("list blocked keys", err)
	}
	defer rows.Close()
	var out []BlockedKey
	for rows.Next() {
		var b BlockedKey
		if err := scanListed(rows, &b.ListedEvent, &b.Waiting); err != nil {
			return nil, s.wrap("list blocked keys", err)
		}
		out = append(out, b)
	}
	return out, s.wrap("list blocked keys", rows.Err())
}
