package outboxtest_test

import (
	"os"
	"testing"

	"github.com/go-outbox/outbox/internal/testsvc"
)

func TestMain(m *testing.M) {
	os.Exit(testsvc.RunWithLeakCheck(m))
}
