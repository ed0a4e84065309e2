package main

import (
	"os"
	"testing"
)

// TestMain routes the RocketMQ client's process-wide logger once, as main does, before any
// test starts a producer or consumer: routing it while another test's client logs is a data
// race.
func TestMain(m *testing.M) {
	routeClientLogs(false)
	os.Exit(m.Run())
}
