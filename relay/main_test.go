package relay

import (
	"os"
	"testing"

	"github.com/go-outbox/outbox/internal/testsvc"
)

// TestMain fails the run when goroutines started by the tests (a binlog syncer left
// open, say) outlive them.
func TestMain(m *testing.M) {
	os.Exit(testsvc.RunWithLeakCheck(m))
}
