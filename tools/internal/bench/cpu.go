package bench

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuSample is the CPU time used so far by this process (the writers, and the publishers or
// relays running in it) and by the database server, when the server runs on this machine
// and says where its pid file is; serverOK is false otherwise.
type cpuSample struct {
	self, server time.Duration
	serverOK     bool
}

// userHZ is the unit of /proc/<pid>/stat's times on Linux (USER_HZ, 100 on every common
// architecture).
const userHZ = 100

// sampleCPU reads the CPU times. The server's pid comes from @@pid_file (MariaDB and MySQL
// both have it); a server elsewhere, or a pid file this user cannot read, leaves it unknown.
func sampleCPU(ctx context.Context, db *sql.DB) cpuSample {
	var ru syscall.Rusage
	var s cpuSample
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	var pidFile string
	if err := db.QueryRowContext(ctx, "SELECT @@pid_file").Scan(&pidFile); err != nil {
		return s
	}
	s.server, s.serverOK = processCPU(pidFile)
	return s
}

// processCPU reads the user and system time of the process whose pid is in pidFile.
func processCPU(pidFile string) (time.Duration, bool) {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%s/stat", strings.TrimSpace(string(b))))
	if err != nil {
		return 0, false
	}
	// The command name (field 2) is in parentheses and may hold spaces: count from its end.
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 { // fields 3.. from the state; utime and stime are fields 14 and 15
		return 0, false
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(ut+st) * time.Second / userHZ, true
}

// CPUUse is the CPU time used while the writers committed, per order: by this process (the
// writers, and whatever publishes in it) and by the server. Negative where unknown.
type CPUUse struct {
	Self, Server time.Duration
}

// cpuPerOrder turns two samples around a writing window into the CPU per order committed.
func cpuPerOrder(c0, c1 cpuSample, orders int) CPUUse {
	u := CPUUse{Self: -1, Server: -1}
	if orders <= 0 {
		return u
	}
	u.Self = (c1.self - c0.self) / time.Duration(orders)
	if c0.serverOK && c1.serverOK {
		u.Server = (c1.server - c0.server) / time.Duration(orders)
	}
	return u
}
