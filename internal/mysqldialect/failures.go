package mysqldialect

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"
)

// FailuresColumn is the outbox table's failure history: one JSON object per failed attempt,
// one a line, the latest ten (schema.sql says why it is made so).
const FailuresColumn = "failures"

// FailuresDDL is the history column's definition, as schema.sql has it and as the ALTER that
// adds it to an older table writes it.
const FailuresDDL = "failures TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL"

// AddFailuresColumn is the statement that adds the history column to table (checked by
// [CheckTable]), last: an instant change on MariaDB 10.3+ and MySQL 8.0.12+.
func AddFailuresColumn(table string) string {
	return "ALTER TABLE " + Quote(table) + " ADD COLUMN " + FailuresDDL
}

// Bounds of the history.
const (
	// MaxFailures is how many failures a row keeps: the latest.
	MaxFailures = 10
	// MaxFailureMessage is the most characters of a failure's message the history keeps.
	MaxFailureMessage = 512
	// failuresReset is the longest history, in bytes, that a failure is appended to; a
	// longer value (never written by the library: ten entries of the longest messages,
	// escaped, stay under 40,000 bytes) was written by something else and is replaced, so
	// that the appended value always fits the TEXT column (65,535 bytes) and no failure ever
	// fails to be recorded because of what the column held.
	failuresReset = 40000
)

// FailureClass strings, as the history records them (outbox.Failure.Class).
const (
	ClassRetryable   = "retryable"   // a send failed; retried after the backoff (or, the last attempt, dead-lettered)
	ClassPermanent   = "permanent"   // a send failed with an error marked Permanent: dead-lettered at once
	ClassUnavailable = "unavailable" // the broker was unavailable: no attempt counted
	ClassReclaimed   = "reclaimed"   // the lease expired with no outcome recorded
)

// newline separates the entries. A newline in the statement's text, not '\n': a backslash
// in a literal is an escape only without NO_BACKSLASH_ESCAPES.
const newline = "'\n'"

// AppendFailure is the assignment that appends one failure to the history column col (a
// column reference: "failures", or "t.failures" in a statement with an alias) and keeps the
// latest MaxFailures: instance, class and message are SQL expressions (a column, a literal,
// a placeholder). The time is the database clock's, UTC_TIMESTAMP(3); the message is cut to
// MaxFailureMessage characters (the server counts characters, so UTF-8 is never split);
// JSON_OBJECT escapes what JSON must (quotes, backslashes, newlines, control characters), so
// an entry never holds a newline of its own. One expression: the statement that records
// the failure records its history, with no read before it. Put it first in the SET list, so
// that a column it reads (claim_owner) has the row's value before the statement.
func AppendFailure(col, instance, class, message string) string {
	entry := "JSON_OBJECT('at', CAST(UTC_TIMESTAMP(3) AS CHAR), 'instance', " + instance +
		", 'class', " + class + ", 'message', LEFT(" + message + ", " + itoa(MaxFailureMessage) + "))"
	// The newline goes before the entry: a value that does not end with one (written by
	// hand, say) keeps its last line to itself. Then the last MaxFailures lines.
	return col + " = SUBSTRING_INDEX(CONCAT(IF(LENGTH(" + col + ") < " + itoa(failuresReset) + ", " + col + ", ''), " +
		newline + ", " + entry + "), " + newline + ", -" + itoa(MaxFailures) + ")"
}

func itoa(n int) string { return strconv.Itoa(n) }

// cut returns s cut to MaxFailureMessage characters.
func cut(s string) string {
	n := 0
	for i := range s {
		if n == MaxFailureMessage {
			return s[:i]
		}
		n++
	}
	return s
}

// Failure is one entry of the history, as outbox.Failure has it (the two convert).
type Failure struct {
	At       time.Time
	Instance string
	Class    string
	Message  string
}

// failureLine is an entry as JSON_OBJECT writes it.
type failureLine struct {
	At       *string `json:"at"`
	Instance string  `json:"instance"`
	Class    string  `json:"class"`
	Message  string  `json:"message"`
}

// ParseFailures reads the history column's value, oldest first. It never fails: a line that
// is not an entry (a value written by hand, or cut) is returned with its text (its first
// MaxFailureMessage characters, invalid UTF-8 replaced) as the Message and nothing else, an entry whose time cannot be read with the zero time, and empty lines
// are skipped. At most MaxFailures entries, the latest.
func ParseFailures(v string) []Failure {
	if v == "" {
		return nil
	}
	var out []Failure
	for line := range strings.SplitSeq(v, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		var l failureLine
		if err := json.Unmarshal([]byte(line), &l); err != nil || l.At == nil {
			out = append(out, Failure{Message: cut(strings.ToValidUTF8(line, "\uFFFD"))})
			continue
		}
		f := Failure{Instance: l.Instance, Class: l.Class, Message: l.Message}
		if t, err := time.ParseInLocation("2006-01-02 15:04:05.999999999", *l.At, time.UTC); err == nil {
			f.At = t
		}
		out = append(out, f)
	}
	if len(out) > MaxFailures {
		out = out[len(out)-MaxFailures:]
	}
	return out
}
