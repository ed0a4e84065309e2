package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/go-outbox/outbox/internal/mysqldialect"
)

// The check of a table against what the store needs of it, for Check (so for the
// publisher's Start) and CreateSchema: one read of its columns and one of its indexes, and
// one error that names every problem once, with the statement that fixes each.

// tableShape is a table's columns and indexes as information_schema describes them.
type tableShape struct {
	columns map[string]string // column -> its type (lower case)
	indexes map[string]string // index -> its columns in order, comma-separated (lower case)
}

// readShape reads the table's shape; a table that does not exist has no columns.
func (s *MySQLStore) readShape(ctx context.Context) (tableShape, error) {
	sh := tableShape{columns: map[string]string{}}
	rows, err := s.db.QueryContext(ctx, `SELECT LOWER(column_name), LOWER(column_type) FROM information_schema.columns
	WHERE table_schema = DATABASE() AND table_name = ?`, s.table)
	if err != nil {
		return sh, s.wrap("check the table: read its columns", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			return sh, s.wrap("check the table: read its columns", err)
		}
		sh.columns[name] = typ
	}
	if err := rows.Err(); err != nil {
		return sh, s.wrap("check the table: read its columns", err)
	}
	if len(sh.columns) == 0 {
		return sh, nil
	}
	sh.indexes, err = s.indexColumns(ctx)
	return sh, err
}

// tableFix is one thing a table lacks, and the statement that adds it ("" when it takes
// more than one statement: the text says what to do).
type tableFix struct {
	lacks, fix string
}

// requiredIndexes are the indexes every store's statements are written for, and their
// columns: the claims' scan, the reclaim's and the retention's, and the event id's.
var requiredIndexes = []struct{ name, cols, add string }{
	{"idx_status_next_retry", "status,next_retry_time", "ADD INDEX idx_status_next_retry (status, next_retry_time)"},
	{"idx_status_claimed_at", "status,claimed_at", "ADD INDEX idx_status_claimed_at (status, claimed_at)"},
}

// shapeFixes returns what the table of sh lacks for the store, each once, in the order to
// fix it: columns (the topic column before the failure history, which goes after it), then
// indexes, then what ordered claims need.
func (s *MySQLStore) shapeFixes(sh tableShape) []tableFix {
	var fixes []tableFix
	table := mysqldialect.Quote(s.table)
	var older []string // columns of earlier versions, docs/upgrading.md adds them
	for _, col := range mysqldialect.OutboxColumns() {
		if _, ok := sh.columns[col]; ok {
			continue
		}
		switch col {
		case "topic":
			fixes = append(fixes, tableFix{"a topic column", mysqldialect.AddTopicColumn(s.table)})
		case mysqldialect.FailuresColumn:
			fixes = append(fixes, tableFix{"a " + col + " column (the failure history)", mysqldialect.AddFailuresColumn(s.table)})
		case "event_id", "reclaim_count", "trace_parent", "trace_state":
			older = append(older, col)
		default:
			fixes = append(fixes, tableFix{"a " + col + " column (it is not an outbox table: create one with CreateSchema or schema.sql)", ""})
		}
	}
	if len(older) > 0 {
		fixes = slices.Insert(fixes, 0, tableFix{"the " + strings.Join(older, ", ") + " columns of later versions (add them as docs/upgrading.md says)", ""})
	}
	for _, ix := range requiredIndexes {
		switch cols, ok := sh.indexes[ix.name]; {
		case !ok:
			fixes = append(fixes, tableFix{"an index " + ix.name + " (" + strings.ReplaceAll(ix.cols, ",", ", ") + ")",
				"ALTER TABLE " + table + " " + ix.add + ", ALGORITHM=INPLACE, LOCK=NONE"})
		case cols != ix.cols:
			fixes = append(fixes, tableFix{"an index " + ix.name + " on (" + strings.ReplaceAll(ix.cols, ",", ", ") + "), not (" + strings.ReplaceAll(cols, ",", ", ") + ")",
				"ALTER TABLE " + table + " DROP INDEX " + ix.name + ", " + ix.add + ", ALGORITHM=INPLACE, LOCK=NONE"})
		}
	}
	if _, ok := sh.columns["event_id"]; ok && s.partitionIDs == 0 && sh.indexes["uk_event_id"] != "event_id" {
		// A partitioned table has idx_event_id instead: its check says so.
		fixes = append(fixes, tableFix{"a unique key uk_event_id (event_id)", "ALTER TABLE " + table + " ADD UNIQUE KEY uk_event_id (event_id)"})
	}
	if s.ordering != Unordered {
		if !strings.Contains(sh.columns["status"], "'skipped'") {
			fixes = append(fixes, tableFix{"a status column that allows 'SKIPPED' (key order)", strings.ReplaceAll(alterSkipped, "t_event_record", table)})
		}
		switch cols, ok := sh.indexes[orderIndex]; {
		case !ok:
			alter := alterAddOrderIndex
			if _, old := sh.indexes["idx_biz_no"]; old {
				alter = alterOrderIndex
			}
			fixes = append(fixes, tableFix{"an index idx_biz_no_status (biz_no, status, id) (key order)", strings.ReplaceAll(alter, "t_event_record", table)})
		case cols != "biz_no,status,id":
			fixes = append(fixes, tableFix{fmt.Sprintf("an index idx_biz_no_status on (biz_no, status, id), not (%s) (key order)", strings.ReplaceAll(cols, ",", ", ")),
				strings.ReplaceAll(alterRedoOrderIndex, "t_event_record", table)})
		}
	}
	return fixes
}

// checkTable reports whether the table can serve the store: it exists, with every column
// and index the store's statements need (and, in key order, those ordered claims need),
// partitioned as [MySQLConfig.PartitionIDs] says, and, withRelay, with the relay's
// checkpoint table when [MySQLConfig.RelayTable] names one. What it lacks is one error
// wrapping [ErrInvalidConfig] ([ErrNoTable] for a missing table) that names each problem
// once and the statements that fix them. An error reading the table's definition is
// returned as it is.
func (s *MySQLStore) checkTable(ctx context.Context, withRelay bool) error {
	sh, err := s.readShape(ctx)
	if err != nil {
		return err
	}
	if len(sh.columns) == 0 {
		return fmt.Errorf("%w: table %s does not exist: create it with CreateSchema, or schema.sql (docs/getting-started.md)", ErrNoTable, s.table)
	}
	var problems []string
	var statements []string
	for _, f := range s.shapeFixes(sh) {
		problems = append(problems, f.lacks)
		if f.fix != "" {
			statements = append(statements, f.fix+";")
		}
	}
	var others []error // the partitions' and the relay's refusals, each a sentence of its own
	if s.partitionIDs > 0 {
		if err := s.checkPartitions(ctx); errors.Is(err, ErrInvalidConfig) {
			others = append(others, err)
		} else if err != nil {
			return err
		}
	}
	if withRelay {
		if err := s.checkRelay(ctx); errors.Is(err, ErrInvalidConfig) {
			others = append(others, err)
		} else if err != nil {
			return err
		}
	}
	if len(problems) == 0 {
		return joinRefusals(others)
	}
	msg := fmt.Sprintf("table %s cannot serve the store: it lacks %s", s.table, strings.Join(problems, ", and "))
	if len(statements) > 0 {
		msg += "; run: " + strings.Join(statements, " ")
	}
	return joinRefusals(append([]error{fmt.Errorf("%w: %s (see docs/upgrading.md)", ErrInvalidConfig, msg)}, others...))
}
