package mysqldialect_test

import (
	"context"
	"crypto/sha1"
	"database/sql"
	"encoding/hex"
	"os"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/go-outbox/outbox/internal/mysqldialect"
	"github.com/go-outbox/outbox/internal/testsvc"
)

func TestMain(m *testing.M) { os.Exit(testsvc.RunWithLeakCheck(m)) }

// relayLockBefore is the relay's lock name as earlier versions built it, in Go.
func relayLockBefore(db, table string) string {
	name := "outbox-relay:" + db + "." + table
	if len(name) <= 64 {
		return name
	}
	sum := sha1.Sum([]byte(db + "." + table))
	return "outbox-relay:" + hex.EncodeToString(sum[:])
}

// Every lock name the server computes is at most 64 characters, one per lock, database and
// table, including for the longest database and table names; the relay's is the name
// earlier relays took.
func TestLockNamesOnTheServer(t *testing.T) {
	ctx := context.Background()
	admin := testsvc.OpenDB(t)
	short := testsvc.UniqueTable("dialect_db")
	long := (short + "_" + strings.Repeat("x", 64))[:64]
	for _, name := range []string{short, long} {
		if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+mysqldialect.Quote(name)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+mysqldialect.Quote(name)) })
	}
	seen := map[string]string{}
	for _, dbName := range []string{short, long} {
		cfg, err := mysql.ParseDSN(testsvc.MySQLDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		cfg.DBName = dbName
		db, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		for _, table := range []string{"order", "t_event_record", strings.Repeat("t", 40), strings.Repeat("9", 64)} {
			for l, kind := range map[mysqldialect.Lock]string{mysqldialect.ClaimLock: "claim", mysqldialect.PurgeLock: "purge",
				mysqldialect.InboxPurgeLock: "inbox purge", mysqldialect.RelayLock: "relay"} {
				var name string
				if err := db.QueryRowContext(ctx, "SELECT "+mysqldialect.LockName(l, table)).Scan(&name); err != nil {
					t.Fatalf("%s lock of %s.%s: %v", kind, dbName, table, err)
				}
				what := kind + " lock of " + dbName + "." + table
				if len([]rune(name)) > 64 {
					t.Errorf("%s is %q, over 64 characters", what, name)
				}
				if other, ok := seen[name]; ok {
					t.Errorf("%s and %s are both %q", what, other, name)
				}
				seen[name] = what
				if l == mysqldialect.RelayLock && name != relayLockBefore(dbName, table) {
					t.Errorf("%s is %q, earlier relays took %q", what, name, relayLockBefore(dbName, table))
				}
				// And the server takes it.
				var got sql.NullInt64
				if err := db.QueryRowContext(ctx, "SELECT IS_FREE_LOCK("+mysqldialect.LockName(l, table)+")").Scan(&got); err != nil || !got.Valid {
					t.Errorf("IS_FREE_LOCK of %s: %v, %v", what, got, err)
				}
			}
		}
	}
	if len(seen) != 2*4*4 {
		t.Errorf("%d names, want 32", len(seen))
	}
}
