package testsvc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// MySQLServer is a MariaDB server of one test's own, on a free loopback port with its data
// under a temporary directory, for the tests that stop, restart or crash the database: the
// shared test server must never go away under the other tests. scripts/mariadb.sh runs it,
// so the server is the same build and configuration as the shared one.
type MySQLServer struct {
	dir  string
	port int
	args []string // more mariadbd options
}

// privateMySQLStartAttempts bounds the tries on fresh ports: another process may take the
// free port between the probe and the server's bind.
const privateMySQLStartAttempts = 3

// PrivateMySQL starts a MariaDB server for t alone and stops it (and deletes its data) when
// t ends. It needs what scripts/mariadb.sh needs: root and an installed mariadbd. When the
// server cannot start, t is skipped, or fails under OUTBOX_REQUIRE_SERVICES=1. args are
// more mariadbd options (e.g. "--binlog-format=STATEMENT"), for tests of a server set up
// otherwise than the shared one.
func PrivateMySQL(t testing.TB, args ...string) *MySQLServer {
	t.Helper()
	if err := canRunMariaDB(); err != nil {
		missing(t, err)
	}
	var errs []error
	for range privateMySQLStartAttempts {
		s, err := startPrivateMySQL(t, args)
		if err == nil {
			return s
		}
		errs = append(errs, err)
	}
	missing(t, fmt.Errorf("no private MariaDB server: %w", errors.Join(errs...)))
	return nil
}

func canRunMariaDB() error {
	if os.Geteuid() != 0 {
		return errors.New("no private MariaDB server: scripts/mariadb.sh runs mariadbd as the mysql user, which needs root")
	}
	if _, err := exec.LookPath("mariadbd"); err != nil {
		if _, err := os.Stat("/usr/sbin/mariadbd"); err != nil {
			return errors.New("no private MariaDB server: mariadbd is not installed (bash scripts/mariadb.sh start installs it)")
		}
	}
	return nil
}

func startPrivateMySQL(t testing.TB, args []string) (*MySQLServer, error) {
	t.Helper()
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	// Not t.TempDir: its parents are private to root, and mariadbd runs as mysql.
	dir, err := os.MkdirTemp("", "outbox-mariadb-")
	if err != nil {
		return nil, err
	}
	s := &MySQLServer{dir: dir, port: port, args: args}
	if _, err := s.script("start"); err != nil {
		_, _ = s.script("kill")
		_ = os.RemoveAll(dir)
		return nil, err
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("private MariaDB on port %d, the end of its error log:\n%s", s.port, s.logTail(20))
		}
		if _, err := s.script("stop"); err != nil {
			t.Errorf("stop the private MariaDB server: %v", err)
			_, _ = s.script("kill")
		}
		_ = os.RemoveAll(dir)
	})
	return s, nil
}

// freePort returns a loopback port that nothing listened on a moment ago. It is below
// Linux's ephemeral range (32768 and up by default), so that while the server is down for
// a restart no client connection is given its number as a local port.
func freePort() (int, error) {
	var err error
	for range 50 {
		port := 20000 + mrand.IntN(12000)
		var l net.Listener
		if l, err = net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
			_ = l.Close()
			return port, nil
		}
	}
	return 0, fmt.Errorf("no free port: %w", err)
}

// script runs scripts/mariadb.sh cmd for this server.
func (s *MySQLServer) script(cmd string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, "bash", mariadbScript(), cmd)
	c.Env = append(os.Environ(),
		"OUTBOX_MARIADB_DIR="+s.dir,
		"OUTBOX_MARIADB_PORT="+strconv.Itoa(s.port),
		// Small: a test server holds a few thousand rows.
		"OUTBOX_MARIADB_BUFFER_POOL=64M",
		"OUTBOX_MARIADB_LOG_FILE_SIZE=48M",
		"OUTBOX_MARIADB_ARGS="+strings.Join(s.args, " "),
	)
	var stdout, stderr strings.Builder
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		return "", fmt.Errorf("scripts/mariadb.sh %s (port %d): %w\n%s", cmd, s.port, err, stderr.String())
	}
	return strings.TrimSpace(stdout.String()), nil
}

func (s *MySQLServer) logTail(n int) string {
	b, err := os.ReadFile(filepath.Join(s.dir, "error.log"))
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// mariadbScript is scripts/mariadb.sh, found from this file's place in the repository.
func mariadbScript() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "scripts", "mariadb.sh")
}

// DSN is the server's DSN, as root on its test database.
func (s *MySQLServer) DSN() string {
	return fmt.Sprintf("root@tcp(127.0.0.1:%d)/outbox_test?parseTime=true", s.port)
}

// Port is the server's TCP port on 127.0.0.1.
func (s *MySQLServer) Port() int { return s.port }

// OpenDB opens a new connection pool on the server's test database, as [OpenDB] does on the
// shared one, and closes it when t ends.
func (s *MySQLServer) OpenDB(t testing.TB, params ...string) *sql.DB {
	t.Helper()
	return openDB(t, s.DSN(), "the private MariaDB server "+s.DSN(), "", params...)
}

// Restart, Stop, Kill and Start run on the test's goroutine (they fail t on error).

// Restart shuts the server down cleanly (its sessions are dropped, its port closes) and
// starts it again with the same data; it returns once the server answers.
func (s *MySQLServer) Restart(t testing.TB) {
	t.Helper()
	s.run(t, "restart")
}

// Stop shuts the server down cleanly; it stays down until [MySQLServer.Start].
func (s *MySQLServer) Stop(t testing.TB) {
	t.Helper()
	s.run(t, "stop")
}

// Kill ends the server with SIGKILL, as a crash would; it stays down until
// [MySQLServer.Start], which recovers it as InnoDB recovers from a crash.
func (s *MySQLServer) Kill(t testing.TB) {
	t.Helper()
	s.run(t, "kill")
}

// Start starts the stopped or killed server and returns once it answers.
func (s *MySQLServer) Start(t testing.TB) {
	t.Helper()
	s.run(t, "start")
}

func (s *MySQLServer) run(t testing.TB, cmd string) {
	t.Helper()
	if _, err := s.script(cmd); err != nil {
		t.Fatalf("private MariaDB: %v\n%s", err, s.logTail(20))
	}
}
