package main

import (
	"os"
	"testing"

	"github.com/go-outbox/outbox"
)

// TestMain routes the RocketMQ client's process-wide logger once, as main does, before any
// test starts a producer or consumer (routing it while another test's client logs is a data
// race): nowhere, to keep the tests' output to their own lines.
func TestMain(m *testing.M) {
	outbox.RouteRocketMQClientLogs(nil)
	os.Exit(m.Run())
}
