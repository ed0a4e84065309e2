package mysqldialect

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
)

func TestCheckTable(t *testing.T) {
	for _, name := range []string{"t_event_record", "order", "select", "0outbox", "123", "_", strings.Repeat("a", 64)} {
		if err := CheckTable(name); err != nil {
			t.Errorf("CheckTable(%q) = %v, want nil", name, err)
		}
	}
	for name, want := range map[string]string{
		"":                      "table name is empty",
		strings.Repeat("a", 65): `is 65 characters long, at most 64`,
		"a-b":                   `table name "a-b" has '-'`,
		"a b":                   `has ' '`,
		"a`b":                   "has '`'",
		"a.b":                   `has '.'`,
		"tablé":                 `has 'é'`,
		"a'b":                   `has '\''`,
	} {
		err := CheckTable(name)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckTable(%q) = %v, want an error with %q", name, err, want)
		}
	}
}

func TestQuote(t *testing.T) {
	for in, want := range map[string]string{
		"order":  "`order`",
		"0t":     "`0t`",
		"a`b":    "`a``b`",
		"``":     "``````",
		"t_name": "`t_name`",
	} {
		if got := Quote(in); got != want {
			t.Errorf("Quote(%q) = %s, want %s", in, got, want)
		}
	}
	if got := stringLiteral("it's"); got != "'it''s'" {
		t.Errorf("stringLiteral = %s", got)
	}
}

// The lock names are the ones earlier versions built, expression for expression, so that
// instances of both exclude each other during an upgrade (the relay's is checked against
// the server by TestLockNamesOnTheServer).
func TestLockNamesAreTheEarlierOnes(t *testing.T) {
	const table = "t_ev"
	for l, want := range map[Lock]string{
		ClaimLock:      fmt.Sprintf("CONCAT('outbox-claim:', SHA1(CONCAT(COALESCE(DATABASE(), ''), '.', '%s')))", table),
		PurgeLock:      fmt.Sprintf("CONCAT('outbox-purge:', SHA1(CONCAT(COALESCE(DATABASE(), ''), '.', '%s')))", table),
		InboxPurgeLock: "CONCAT('outbox-inbox-purge:', SHA1(CONCAT(COALESCE(DATABASE(), ''), '.', 't_ev')))",
	} {
		if got := LockName(l, table); got != want {
			t.Errorf("LockName(%d) =\n%s, want\n%s", l, got, want)
		}
	}
	relay := LockName(RelayLock, table)
	for _, part := range []string{"'outbox-relay:'", "LENGTH(", "<= 64", "SHA1("} {
		if !strings.Contains(relay, part) {
			t.Errorf("LockName(RelayLock) = %s, lacks %s", relay, part)
		}
	}
}

func TestErrorNumbers(t *testing.T) {
	deadlock := fmt.Errorf("claim: %w", &mysql.MySQLError{Number: ErrLockDeadlock, Message: "Deadlock found"})
	timeout := &mysql.MySQLError{Number: ErrLockWaitTimeout}
	missing := &mysql.MySQLError{Number: ErrNoSuchTable}
	plain := errors.New("1213")
	switch {
	case Number(deadlock) != 1213, Number(timeout) != 1205, Number(plain) != 0, Number(nil) != 0:
		t.Error("Number reads the wrong number")
	case !IsLockConflict(deadlock), !IsLockConflict(timeout), IsLockConflict(missing), IsLockConflict(plain):
		t.Error("IsLockConflict is wrong")
	case !Is(missing, ErrBadField, ErrNoSuchTable), Is(missing, ErrBadField), Is(plain), Is(nil, 0):
		t.Error("Is is wrong")
	}
}
