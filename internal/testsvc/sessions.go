package testsvc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// MySQLUser creates a user of t's own on the shared test server (no password, every
// privilege on the test database) and drops it when t ends. A pool opened as that user
// ([OpenDBAs]) has sessions that no other test has, so a test can find and KILL exactly
// them ([UserSessions], [KillSession]) while the server goes on serving everyone else.
func MySQLUser(t testing.TB) string {
	t.Helper()
	admin := OpenDB(t)
	cfg, err := mysql.ParseDSN(MySQLDSN(t))
	if err != nil {
		t.Fatalf("parse %s: %v", MySQLDSNEnv, err)
	}
	user := UniqueTable("outbox_u")
	account := "'" + user + "'@'%'"
	ctx := context.Background()
	if _, err := admin.ExecContext(ctx, "CREATE USER "+account+" IDENTIFIED BY ''"); err != nil {
		t.Fatalf("create user %s: %v", account, err)
	}
	t.Cleanup(func() {
		if _, err := admin.ExecContext(ctx, "DROP USER IF EXISTS "+account); err != nil {
			t.Errorf("drop user %s: %v", account, err)
		}
	})
	if _, err := admin.ExecContext(ctx, "GRANT ALL PRIVILEGES ON `"+cfg.DBName+"`.* TO "+account); err != nil {
		t.Fatalf("grant %s on %s: %v", account, cfg.DBName, err)
	}
	return user
}

// OpenDBAs opens a new connection pool on the test database as user (made by [MySQLUser]),
// and closes it when t ends.
func OpenDBAs(t testing.TB, user string, params ...string) *sql.DB {
	t.Helper()
	dsn := MySQLDSN(t)
	return openDB(t, dsn, MySQLDSNEnv+"="+dsn+" as "+user, user, params...)
}

// Session is one row of information_schema.PROCESSLIST.
type Session struct {
	ID      int64
	Command string // Sleep when idle, Query while a statement runs
	State   string
	Info    string // the statement running, if any
}

// Busy reports whether the session is running a statement.
func (s Session) Busy() bool { return s.Command != "Sleep" }

// UserSessions lists the sessions of user on the server admin is connected to.
func UserSessions(ctx context.Context, admin *sql.DB, user string) ([]Session, error) {
	rows, err := admin.QueryContext(ctx, "SELECT ID, COMMAND, COALESCE(STATE, ''), COALESCE(INFO, '') "+
		"FROM information_schema.PROCESSLIST WHERE USER = ?", user)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Session
	for rows.Next() {
		var s Session
		if err := rows.Scan(&s.ID, &s.Command, &s.State, &s.Info); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// KillSession ends session id from another session (admin's): the whole connection, or with
// query set only the statement it runs (KILL QUERY; the connection lives on). A session that
// has already gone is not an error.
func KillSession(ctx context.Context, admin *sql.DB, id int64, query bool) error {
	stmt := "KILL CONNECTION "
	if query {
		stmt = "KILL QUERY "
	}
	_, err := admin.ExecContext(ctx, stmt+strconv.FormatInt(id, 10))
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 1094 { // ER_NO_SUCH_THREAD
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s%d: %w", stmt, id, err)
	}
	return nil
}

// WaitSession waits until a session of user runs a statement that match accepts, and
// returns it, or fails t after timeout.
func WaitSession(t testing.TB, admin *sql.DB, user string, timeout time.Duration, match func(Session) bool) Session {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ss, err := UserSessions(context.Background(), admin, user)
		if err != nil {
			t.Fatalf("list the sessions of %s: %v", user, err)
		}
		for _, s := range ss {
			if match(s) {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no session of %s matched within %s; its sessions: %+v", user, timeout, ss)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
