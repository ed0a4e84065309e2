package outboxtest_test

import (
	"testing"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
	"github.com/go-outbox/outbox/outboxtest"
)

// TestMySQLStoreConformance runs the Store contract against MySQLStore on the test
// database (testsvc: OUTBOX_TEST_MYSQL_DSN), with the example's harness.
func TestMySQLStoreConformance(t *testing.T) {
	db := testsvc.OpenDB(t)
	outboxtest.RunStoreTests(t, func(t *testing.T) outboxtest.Harness {
		return newMySQLHarness(t, db, outbox.Unordered)
	})
}

// TestMySQLStoreConformanceKeyOrder runs it against MySQLStore in key order, in both of its
// modes: the ordered claims keep the same contract, and the key-order cases besides.
func TestMySQLStoreConformanceKeyOrder(t *testing.T) {
	db := testsvc.OpenDB(t)
	for _, o := range []outbox.Ordering{outbox.KeyOrder, outbox.KeyOrderSkipDeadLetters} {
		t.Run(o.String(), func(t *testing.T) {
			outboxtest.RunStoreTests(t, func(t *testing.T) outboxtest.Harness {
				return newMySQLHarness(t, db, o)
			})
		})
	}
}
