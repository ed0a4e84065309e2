package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// services starts, restarts and stops the database and the broker(s) the run uses.
type services interface {
	// setup makes the services ready and returns the DSN and name server address.
	setup(ctx context.Context) (dsn, namesrv string, err error)
	// restartDB stops the database, waits down, and starts it again; it returns once the
	// database answers. ok false: this kind of fault cannot be injected.
	canRestartDB() bool
	restartDB(ctx context.Context, down time.Duration) error
	// crashDB SIGKILLs the database server, as a crash would, waits down, and starts it
	// again (through crash recovery); it returns once the database answers.
	canCrashDB() bool
	crashDB(ctx context.Context, down time.Duration) error
	canRestartBroker() bool
	restartBroker(ctx context.Context, broker string, down time.Duration) error
	// teardown stops what setup started (managed services only).
	teardown(ctx context.Context) error
}

// shell runs a command line with bash, its output appended to the run's service log; the
// error carries the output's tail.
type shell struct {
	logPath string
	env     []string
}

func (s shell) run(ctx context.Context, what string, argv ...string) (string, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), s.env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	err := cmd.Run()
	if f, ferr := os.OpenFile(s.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644); ferr == nil {
		fmt.Fprintf(f, "==== %s %s: %s (%s, %v)\n%s", start.Format(time.TimeOnly), what, strings.Join(argv, " "),
			time.Since(start).Round(time.Millisecond), err, out.String())
		_ = f.Close()
	}
	if err != nil {
		return out.String(), fmt.Errorf("%s: %w\n%s", what, err, tail(out.String(), 15))
	}
	return out.String(), nil
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// managed are the run's own MariaDB and RocketMQ, started with the repository's scripts on
// ports of their own, so that restarting them never disturbs anything else on the machine.
type managed struct {
	scripts  string // the scripts directory
	mariadb  shell
	rocketmq shell
	dbPort   int
	database string
	brokers  int
}

func newManaged(o *options, logPath string) *managed {
	m := &managed{scripts: o.scripts, dbPort: o.dbPort, database: "outbox_chaos", brokers: o.brokers}
	// Every variable the scripts read is set here, so that none is inherited from the
	// environment (a CI run exports those of its own services, and the chaos run's must
	// differ in every port).
	m.mariadb = shell{logPath: logPath, env: []string{
		"OUTBOX_MARIADB_DIR=" + o.dbDir,
		"OUTBOX_MARIADB_PORT=" + strconv.Itoa(o.dbPort),
		"OUTBOX_MARIADB_DATABASE=" + m.database,
		"OUTBOX_MARIADB_ARGS=" + map[bool]string{true: mariadbBinlogArgs}[o.relay],
	}}
	m.rocketmq = shell{logPath: logPath, env: []string{
		"OUTBOX_ROCKETMQ_DIR=" + o.mqDir,
		"OUTBOX_ROCKETMQ_NAMESRV_PORT=" + strconv.Itoa(o.namesrvPort),
		"OUTBOX_ROCKETMQ_BROKER_PORT=" + strconv.Itoa(o.brokerPort),
		"OUTBOX_ROCKETMQ_BROKER_B_PORT=" + strconv.Itoa(o.brokerPort+10),
		"OUTBOX_ROCKETMQ_BROKERS=" + strconv.Itoa(o.brokers),
		"OUTBOX_ROCKETMQ_TOPICS=" + o.topic,
	}}
	return m
}

func (m *managed) script(name string) string { return filepath.Join(m.scripts, name) }

func (m *managed) setup(ctx context.Context) (string, string, error) {
	// A server left running by an earlier run (-keep) is stopped first, so that it starts
	// with this run's options (the binlog on in relay mode, off otherwise).
	if _, err := m.mariadb.run(ctx, "stop mariadb", "bash", m.script("mariadb.sh"), "stop"); err != nil {
		return "", "", err
	}
	if _, err := m.mariadb.run(ctx, "start mariadb", "bash", m.script("mariadb.sh"), "start"); err != nil {
		return "", "", err
	}
	out, err := m.rocketmq.run(ctx, "start rocketmq", "bash", m.script("rocketmq.sh"), "start")
	if err != nil {
		return "", "", err
	}
	// The script prints `export OUTBOX_TEST_ROCKETMQ_NAMESRV=host:port`.
	var namesrv string
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "export OUTBOX_TEST_ROCKETMQ_NAMESRV="); ok {
			namesrv = v
		}
	}
	if namesrv == "" {
		return "", "", fmt.Errorf("scripts/rocketmq.sh start printed no name server address:\n%s", tail(out, 10))
	}
	dsn := fmt.Sprintf("root@tcp(127.0.0.1:%d)/%s?parseTime=true&timeout=5s", m.dbPort, m.database)
	return dsn, namesrv, nil
}

func (m *managed) canRestartDB() bool     { return true }
func (m *managed) canCrashDB() bool       { return true }
func (m *managed) canRestartBroker() bool { return true }

func (m *managed) restartDB(ctx context.Context, down time.Duration) error {
	if _, err := m.mariadb.run(ctx, "stop mariadb", "bash", m.script("mariadb.sh"), "stop"); err != nil {
		return err
	}
	sleepFor(ctx, down)
	_, err := m.mariadb.run(context.WithoutCancel(ctx), "start mariadb", "bash", m.script("mariadb.sh"), "start")
	return err
}

func (m *managed) crashDB(ctx context.Context, down time.Duration) error {
	if _, err := m.mariadb.run(ctx, "kill mariadb", "bash", m.script("mariadb.sh"), "kill"); err != nil {
		return err
	}
	sleepFor(ctx, down)
	_, err := m.mariadb.run(context.WithoutCancel(ctx), "start mariadb", "bash", m.script("mariadb.sh"), "start")
	return err
}

// restartBroker stops one broker with the script's stop-broker, waits down, and runs start,
// which starts whatever is not running and returns once the broker has registered with the
// name server and the topic has a route. With one broker, stop-broker takes no name; with
// several (OUTBOX_ROCKETMQ_BROKERS), it is given the broker's name.
func (m *managed) restartBroker(ctx context.Context, broker string, down time.Duration) error {
	argv := []string{"bash", m.script("rocketmq.sh"), "stop-broker"}
	if m.brokers > 1 {
		argv = append(argv, broker)
	}
	if _, err := m.rocketmq.run(ctx, "stop "+broker, argv...); err != nil {
		return err
	}
	sleepFor(ctx, down)
	_, err := m.rocketmq.run(context.WithoutCancel(ctx), "start "+broker, "bash", m.script("rocketmq.sh"), "start")
	return err
}

func (m *managed) teardown(ctx context.Context) error {
	_, err1 := m.rocketmq.run(ctx, "stop rocketmq", "bash", m.script("rocketmq.sh"), "stop", "--clean")
	_, err2 := m.mariadb.run(ctx, "stop mariadb", "bash", m.script("mariadb.sh"), "stop")
	if err1 != nil {
		return err1
	}
	return err2
}

// external are services someone else runs; a restart is a command line per service, run
// with bash (for the broker, {broker} in it is replaced by the broker's name).
type external struct {
	sh                       shell
	dsn, namesrv             string
	dbRestart, brokerRestart string
	dbCrash                  string
}

func (e *external) setup(context.Context) (string, string, error) { return e.dsn, e.namesrv, nil }
func (e *external) canRestartDB() bool                            { return e.dbRestart != "" }
func (e *external) canRestartBroker() bool                        { return e.brokerRestart != "" }
func (e *external) canCrashDB() bool                              { return e.dbCrash != "" }

func (e *external) crashDB(ctx context.Context, _ time.Duration) error {
	_, err := e.sh.run(context.WithoutCancel(ctx), "crash database", "bash", "-c", e.dbCrash)
	return err
}

func (e *external) restartDB(ctx context.Context, _ time.Duration) error {
	_, err := e.sh.run(context.WithoutCancel(ctx), "restart database", "bash", "-c", e.dbRestart)
	return err
}

func (e *external) restartBroker(ctx context.Context, broker string, _ time.Duration) error {
	_, err := e.sh.run(context.WithoutCancel(ctx), "restart "+broker, "bash", "-c", strings.ReplaceAll(e.brokerRestart, "{broker}", broker))
	return err
}

func (e *external) teardown(context.Context) error { return nil }
