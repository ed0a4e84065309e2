// Package mysqldialect is the SQL the library's packages (the store, the inbox, the relay)
// write the same way for MySQL 8 and MariaDB: which table names they accept and how a
// name is quoted in a statement, how the named locks (GET_LOCK) of a table are named, which
// server error numbers they act on, and the outbox table's columns. One place, so that a
// table name, a lock or an error means the same to every part of the library.
//
// It is internal to the module github.com/go-outbox/outbox and its nested modules (the
// relay's). It imports nothing of the library: its checks return plain errors, which the
// callers wrap in outbox.ErrInvalidConfig with the setting's name.
package mysqldialect

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// MaxNameLen is the longest table name, in characters: MySQL's and MariaDB's limit for an
// identifier.
const MaxNameLen = 64

// CheckTable reports what is wrong with name as a table name, in words that begin with the
// name ("table name \"a-b\" has '-': ..."), or returns nil. A table name is 1 to 64 ASCII
// letters, digits and underscores; it may begin with a digit and may be a reserved word
// (order, select): every statement quotes it ([Quote]).
func CheckTable(name string) error {
	if name == "" {
		return errors.New("table name is empty: want 1 to 64 ASCII letters, digits and underscores")
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return fmt.Errorf("table name %q has %q: want 1 to %d ASCII letters, digits and underscores", name, c, MaxNameLen)
		}
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("table name %q is %d characters long, at most %d", name, len(name), MaxNameLen)
	}
	return nil
}

// Quote writes name as a quoted identifier, `name`, with a backtick inside doubled: the form
// every statement uses for a table, so that a reserved word or a name that begins with a
// digit is a name.
func Quote(name string) string {
	return "`" + strings.ReplaceAll(name, "`", "``") + "`"
}

// stringLiteral writes s as a string literal that means s whatever the session's sql_mode
// (a backslash is an escape unless NO_BACKSLASH_ESCAPES is set, so s must have none; the
// names written here are checked by CheckTable, which allows none).
func stringLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// Lock is one of the library's named locks (GET_LOCK) of a table.
type Lock int

const (
	// ClaimLock orders the batch claims of an outbox table (outbox.MySQLConfig.ConcurrentClaims).
	ClaimLock Lock = iota
	// PurgeLock is held by an outbox table's exclusive purge (outbox.PurgeOptions.Exclusive).
	PurgeLock
	// InboxPurgeLock is held by an inbox table's purge (inbox.Inbox.Purge).
	InboxPurgeLock
	// RelayLock is the leadership of the relays of an outbox table.
	RelayLock
)

// lockPrefix is each lock's name before its database and table part.
var lockPrefix = [...]string{
	ClaimLock:      "outbox-claim:",
	PurgeLock:      "outbox-purge:",
	InboxPurgeLock: "outbox-inbox-purge:",
	RelayLock:      "outbox-relay:",
}

// LockName is the SQL expression that names lock l of table (checked by [CheckTable]) in
// the session's database, for GET_LOCK, RELEASE_LOCK, IS_USED_LOCK and IS_FREE_LOCK.
//
// Lock names are server-wide, so each names the database and the table, and MySQL 8 takes
// at most 64 characters, so the database and table are hashed: the lock's prefix and the
// SHA-1 (40 hex digits) of "database.table", at most 59 characters. RelayLock keeps the
// form the relay has always used, so that relays of an earlier version exclude the new
// ones during an upgrade: "outbox-relay:database.table" when that is at most 64 bytes,
// the hashed form otherwise (which has no '.', so it is never a short one's name). A
// connection with no database (DATABASE() is NULL) names the empty database.
func LockName(l Lock, table string) string {
	prefix := stringLiteral(lockPrefix[l])
	dbTable := "CONCAT(COALESCE(DATABASE(), ''), '.', " + stringLiteral(table) + ")"
	hashed := "CONCAT(" + prefix + ", SHA1(" + dbTable + "))"
	if l != RelayLock {
		return hashed
	}
	plain := "CONCAT(" + prefix + ", " + dbTable + ")"
	return fmt.Sprintf("IF(LENGTH(%s) <= %d, %s, %s)", plain, MaxNameLen, plain, hashed)
}

// Server error numbers the library acts on. The names are the servers' own (ER_...); the
// comments say what the library makes of each.
const (
	ErrConCount                   = 1040 // ER_CON_COUNT_ERROR: too many connections (a fault)
	ErrDBAccessDenied             = 1044 // ER_DBACCESS_DENIED_ERROR: no access to the database
	ErrAccessDenied               = 1045 // ER_ACCESS_DENIED_ERROR: the account or its password was refused
	ErrServerShutdown             = 1053 // ER_SERVER_SHUTDOWN: the server is stopping (a fault)
	ErrBadField                   = 1054 // ER_BAD_FIELD_ERROR: a column is missing (a table of an earlier version)
	ErrDupEntry                   = 1062 // ER_DUP_ENTRY: a duplicate key
	ErrParse                      = 1064 // ER_PARSE_ERROR: a statement this server version does not know
	ErrNoSuchThread               = 1094 // ER_NO_SUCH_THREAD: KILL of a connection that has ended already
	ErrTableAccessDenied          = 1142 // ER_TABLEACCESS_DENIED_ERROR: a table privilege is missing
	ErrColumnAccessDenied         = 1143 // ER_COLUMNACCESS_DENIED_ERROR: a column privilege is missing
	ErrNoSuchTable                = 1146 // ER_NO_SUCH_TABLE: the table does not exist
	ErrAbortingConnection         = 1152 // ER_ABORTING_CONNECTION (a fault)
	ErrNetReadError               = 1158 // ER_NET_READ_ERROR (a fault)
	ErrNetReadInterrupted         = 1159 // ER_NET_READ_INTERRUPTED (a fault)
	ErrNetErrorOnWrite            = 1160 // ER_NET_ERROR_ON_WRITE (a fault)
	ErrNetWriteInterrupted        = 1161 // ER_NET_WRITE_INTERRUPTED (a fault)
	ErrLockWaitTimeout            = 1205 // ER_LOCK_WAIT_TIMEOUT: rolled back the statement; may be run again
	ErrLockDeadlock               = 1213 // ER_LOCK_DEADLOCK: rolled back the transaction; may be run again
	ErrSpecificAccessDenied       = 1227 // ER_SPECIFIC_ACCESS_DENIED_ERROR: a global privilege is missing
	ErrSourceFatalBinlogRead      = 1236 // ER_MASTER_FATAL_ERROR_READING_BINLOG: the binlog position is gone
	ErrFeatureDisabled            = 1289 // ER_FEATURE_DISABLED: e.g. a server built without partitioning
	ErrOptionPrevents             = 1290 // ER_OPTION_PREVENTS_STATEMENT: read_only, --skip-partition, ...
	ErrBinlogStmtModeAndRowEngine = 1665 // ER_BINLOG_STMT_MODE_AND_ROW_ENGINE: binlog_format=STATEMENT with READ COMMITTED
	ErrReadOnlyMode               = 1836 // ER_READ_ONLY_MODE: read-only (a failover in progress)
	ErrConnectionKilled           = 1927 // ER_CONNECTION_KILLED (MariaDB)
	ErrClientInteractionTimeout   = 4031 // ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8; MariaDB uses 4031 for another error)
	ErrReplicaSameID              = 4052 // ER_SLAVE_SAME_ID (MariaDB): another replica connected with the same server id
)

// Number returns the server's error number of err (a *mysql.MySQLError in its chain), or 0.
func Number(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// Is reports whether err is a server error with one of the numbers.
func Is(err error, numbers ...uint16) bool {
	n := Number(err)
	return n != 0 && slices.Contains(numbers, n)
}

// IsLockConflict reports a deadlock or a lock wait timeout: the server rolled the statement
// (or the transaction) back, and it may simply be run again.
func IsLockConflict(err error) bool { return Is(err, ErrLockDeadlock, ErrLockWaitTimeout) }

// outboxColumns are the outbox table's columns, in schema.sql's order.
var outboxColumns = []string{
	"id", "event_id", "biz_no", "event_type", "payload", "status", "retry_count", "reclaim_count",
	"next_retry_time", "claim_owner", "claimed_at", "last_error", "create_time", "update_time",
	"trace_parent", "trace_state", "topic", FailuresColumn,
}

// OutboxColumns returns the outbox table's columns, in the order schema.sql defines them
// (the root package's tests hold the two to each other).
func OutboxColumns() []string { return slices.Clone(outboxColumns) }

// AddTopicColumn is the ALTER TABLE that adds the topic column to an outbox table made
// before it (table checked by [CheckTable]): after the trace columns, as schema.sql has it,
// with a constant default, so an instant change (no table copy) on MariaDB 10.4+ and
// MySQL 8.0.29+. The store's Check and the relay's name it in their refusal of such a table.
func AddTopicColumn(table string) string {
	return "ALTER TABLE " + Quote(table) + " ADD COLUMN topic VARCHAR(127) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '' AFTER trace_state"
}

// RouteTopic is the SQL expression of an outbox row's topic with its store's routes applied
// to a row that names none (written by a plain INSERT that leaves the topic column out):
// the topic of its event type in byType, else def. It is written with placeholders, and
// returns the values they take, in order, so that a statement built once per table runs
// for any routes. The types are taken in sorted order, so that the text is the same for
// the same routes.
func RouteTopic(byType map[string]string, def string) (string, []any) {
	if len(byType) == 0 {
		return "IF(topic = '', ?, topic)", []any{def}
	}
	var b strings.Builder
	b.WriteString("IF(topic = '', CASE event_type")
	args := make([]any, 0, 2*len(byType)+1)
	for _, typ := range slices.Sorted(maps.Keys(byType)) {
		b.WriteString(" WHEN ? THEN ?")
		args = append(args, typ, byType[typ])
	}
	b.WriteString(" ELSE ? END, topic)")
	return b.String(), append(args, def)
}
