// Command outboxctl looks at and repairs an outbox table: counts and ages (stats), rows by
// filter (list), one row whole (show), dead letters back to WAIT (requeue), old SUCCESS
// rows deleted (purge), and for per-key ordering the dead letters that hold their biz no's
// later events back (blocked) and dead letters marked never to be sent (skip); and on the
// consumer's side, a group's rejected messages (inbox rejected) and their resend (inbox
// resend).
//
//	outboxctl [global flags] stats|list|show ID|requeue|purge|blocked|skip ID|inbox rejected|inbox resend ID [flags]
//
// As everywhere in the outbox, id is the row's AUTO_INCREMENT id and event_id the UUID
// consumers see (the eventId message property). Where a command takes an event, either
// names it: a value that is a UUID is an event_id, a positive integer an id.
//
// The database and table come from -dsn and -table, or from OUTBOX_DSN and OUTBOX_TABLE.
// A service that publishes several databases (shards, a database per tenant) names each
// with -store NAME=DSN (repeated, or one a line in a -stores file), by the names its
// publishers have in Config.StoreName; -on NAME runs the command against one of them, and
// -on all against each in turn, going on past a database that fails. Output is an aligned
// table, or JSON with --json. Anything that changes rows by filter
// first says how many it would change and changes them only with --yes.
//
// Every command exits with one of these statuses, so that a script or a cron check can tell
// "all clear" from "broken":
//
//	0  done, including when nothing matched, nothing is blocked, or nothing was there to
//	   requeue or purge
//	1  the operation failed: the database cannot be reached or refused a statement, the
//	   table is missing, another purge is running; a command that changed rows before it
//	   failed says on stderr what it changed
//	2  bad input (flags, arguments, DSN, store names): nothing was read or changed
//	3  an event (id or event_id) or rejected message named on the command line does not
//	   exist: nothing was changed
//	4  an event named on the command line is not a dead letter (FAIL), so requeue or skip
//	   refused it: nothing was changed
//	5  blocked --check found a blocked key (it is listed as without --check)
//
// With -on all the status is the worst of the stores' runs, in this order from worst: 2
// (which stops the run), 1, 4, 3, 5, 0.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/go-outbox/outbox"
)

// Exit statuses, as the package doc and globalUsage give them.
const (
	exitOK       = 0 // done, including when nothing matched or nothing is blocked
	exitFail     = 1 // the operation failed
	exitUsage    = 2 // bad input: nothing was read or changed
	exitNotFound = 3 // an event or rejected message named by id or event_id does not exist
	exitRefused  = 4 // a named event is not a dead letter, so requeue or skip refused it
	exitFound    = 5 // blocked --check found a blocked key
)

// worse returns the worse of two exit statuses, for -on all: 2, 1, 4, 3, 5, 0 from worst.
func worse(a, b int) int {
	rank := func(code int) int {
		switch code {
		case exitOK:
			return 0
		case exitFound:
			return 1
		case exitNotFound:
			return 2
		case exitRefused:
			return 3
		case exitFail:
			return 4
		default: // exitUsage
			return 5
		}
	}
	if rank(b) > rank(a) {
		return b
	}
	return a
}

// exitError is an error with the exit status it means, for the command's own verdicts
// (checkFailed's, a partial change, blocked --check's finding).
type exitError struct {
	code  int
	err   error
	quiet bool // nothing to print: the command has said it on stdout
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }

// partial marks err as the failure of a command that had changed rows before it: status 1,
// whatever err wraps (a requeue or skip refused midway has not changed "nothing").
func partial(err error) error { return exitError{code: exitFail, err: err} }

// usageError is bad input: the command exits with exitUsage.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// app is one invocation: its global settings and where it writes.
type app struct {
	dsn, table     string
	routes         outbox.Routes // -default-topic, -topics and -route: the stores' MySQLConfig.Routes
	stores         []namedStore  // -store and -stores, in order
	on             string        // -on: the store to run against, or all
	each           bool          // the command runs against every store (-on all)
	connectTimeout time.Duration
	stdout, stderr io.Writer
	store          *outbox.MySQLStore
	admin          *outbox.Admin
	db             *sql.DB
}

const globalUsage = `Usage: outboxctl [global flags] COMMAND [flags] [args]

Looks at and repairs an outbox table.

Commands:
  stats          counts by status, the oldest due event's age, stale claims, dead letters by type
  list           rows by status, event type, biz no, id range and creation time
  show ID        one row whole, the payload as text (UTF-8) or hex
  requeue        dead letters (FAIL) back to WAIT, by id (or event_id) or by filter
  purge          delete SUCCESS (and SKIPPED) rows older than a duration, in small batches
  blocked        dead letters holding back later events of their biz no (per-key ordering)
  skip ID...     dead letters (FAIL) to SKIPPED: never sent, their biz no's later events go on
  inbox rejected a consumer group's rejected messages (package inbox), oldest first
  inbox resend ID...  rejected messages published again for the group's consumers, then deleted
  serve          the operator console in a browser, over every store given (docs/console.md)

ID is the row's id (a positive integer) or its event_id (the UUID consumers see).

Exit status (every command):
  0  done, including nothing matched, nothing blocked, nothing to requeue or purge
  1  the operation failed: database unreachable, table missing, a statement failed,
     another purge running (a command that changed rows first says what on stderr)
  2  bad input (flags, arguments, DSN, store names): nothing was read or changed
  3  an event (ID) or rejected message named on the command line does not exist
  4  an event named on the command line is not a dead letter (requeue, skip)
  5  blocked --check: some key is blocked
With -on all, the worst of the stores' statuses: 2, 1, 4, 3, 5, 0 from worst.

Several databases: name each with -store NAME=DSN (or list them in a -stores file), and
choose with -on NAME, or -on all for each in turn (ids are per table: not with -on all).

Run 'outboxctl COMMAND --help' for a command's flags.

Global flags:
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet("outboxctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&a.dsn, "dsn", os.Getenv("OUTBOX_DSN"), "MySQL DSN, e.g. user:pass@tcp(127.0.0.1:3306)/app; defaults to $OUTBOX_DSN")
	fs.StringVar(&a.table, "table", cmpOr(os.Getenv("OUTBOX_TABLE"), "t_event_record"), "outbox table; defaults to $OUTBOX_TABLE, else")
	fs.DurationVar(&a.connectTimeout, "connect-timeout", 5*time.Second, "how long to wait for the database to answer")
	// The -store values are read after the flags: the flag package's error would quote the
	// value, password and all.
	var storeFlags []string
	fs.Func("store", "a named database, `NAME=DSN`, NAME as the publishers' Config.StoreName; repeat for each (instead of -dsn)",
		func(s string) error { storeFlags = append(storeFlags, s); return nil })
	storesFile := fs.String("stores", "", "a `FILE` of named databases, one NAME=DSN a line (# comments), as -store")
	fs.StringVar(&a.on, "on", "", "the store to run the command against (`NAME`), or all for each in turn; needed with several stores")
	fs.StringVar(&a.routes.Topic, "default-topic", os.Getenv("OUTBOX_DEFAULT_TOPIC"), "the stores' default `TOPIC` (MySQLConfig.Routes.Topic); defaults to $OUTBOX_DEFAULT_TOPIC, else ORDER_EVENT_TOPIC")
	fs.Func("topics", "the stores' other topics (MySQLConfig.Routes.Topics), comma-separated: the set a requeue may move a dead letter to; defaults to $OUTBOX_TOPICS",
		func(s string) error { a.routes.Topics = splitList(s); return nil })
	a.routes.Topics = splitList(os.Getenv("OUTBOX_TOPICS"))
	fs.Func("route", "an event type's topic, `TYPE=TOPIC` (MySQLConfig.Routes.ByType), for the rows a plain INSERT wrote without a topic; repeat for each",
		func(s string) error {
			typ, topic, ok := strings.Cut(s, "=")
			if !ok || typ == "" || topic == "" {
				return fmt.Errorf("want TYPE=TOPIC, got %q", s)
			}
			if a.routes.ByType == nil {
				a.routes.ByType = map[string]string{}
			}
			a.routes.ByType[typ] = topic
			return nil
		})
	fs.Usage = func() {
		fmt.Fprint(stderr, globalUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return exitUsage
	}
	dsnSet := false
	fs.Visit(func(f *flag.Flag) { dsnSet = dsnSet || f.Name == "dsn" })
	for _, s := range storeFlags {
		if err := a.addStore(s); err != nil {
			fmt.Fprintf(stderr, "outboxctl: -store: %v\n", err)
			return exitUsage
		}
	}
	if *storesFile != "" {
		if err := a.readStores(*storesFile); err != nil {
			fmt.Fprintf(stderr, "outboxctl: %v\n", err)
			return exitUsage
		}
	}
	if fs.Arg(0) == "serve" {
		return a.runServe(ctx, dsnSet, fs.Args()[1:])
	}
	stores, err := a.targets(dsnSet)
	if err != nil {
		fmt.Fprintf(stderr, "outboxctl: %v\n", err)
		return exitUsage
	}
	cmds := map[string]func(context.Context, []string) error{
		"stats":   a.stats,
		"list":    a.list,
		"show":    a.show,
		"requeue": a.requeue,
		"purge":   a.purge,
		"blocked": a.blocked,
		"skip":    a.skip,
		"inbox":   a.inbox,
	}
	name, rest := fs.Arg(0), fs.Args()[1:]
	cmd, ok := cmds[name]
	if !ok {
		fmt.Fprintf(stderr, "outboxctl: unknown command %q (want stats, list, show, requeue, purge, blocked, skip, inbox or serve)\n", name)
		return exitUsage
	}
	if a.on == onAll {
		return a.runEach(ctx, name, cmd, stores, rest)
	}
	a.dsn = stores[0].dsn
	code, _ := a.exec(ctx, name, stores[0].name, cmd, rest)
	return code
}

// exec runs cmd against the database of a.dsn (the store named store, "" for -dsn), closes
// it, reports the error on stderr, and returns the exit status and the error.
func (a *app) exec(ctx context.Context, name, store string, cmd func(context.Context, []string) error, args []string) (int, error) {
	defer func() {
		if a.db != nil {
			_ = a.db.Close()
		}
		a.db, a.store, a.admin = nil, nil, nil
	}()
	err := cmd(ctx, args)
	where := name
	if store != "" {
		where += " on " + store
	}
	code := exitCode(err)
	var ee exitError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK, nil
	case errors.Is(err, errQuiet), errors.As(err, &ee) && ee.quiet:
		return code, err
	}
	fmt.Fprintf(a.stderr, "outboxctl %s: %v\n", where, err)
	return code, err
}

// exitCode is the exit status err means (see the package doc).
func exitCode(err error) int {
	var ee exitError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, errQuiet), errors.As(err, new(usageError)),
		errors.Is(err, outbox.ErrInvalidInput), errors.Is(err, outbox.ErrInvalidConfig):
		return exitUsage
	case errors.Is(err, outbox.ErrNotFound):
		return exitNotFound
	case errors.Is(err, outbox.ErrNotDeadLetter):
		return exitRefused
	default:
		return exitFail
	}
}

// errQuiet is bad input whose message the flag package has printed already.
var errQuiet = errors.New("bad flags")

// parse parses a command's flags, which may come before, between or after its positional
// arguments, and returns those arguments. It turns the flag package's errors into the exits
// run expects.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		err := fs.Parse(args)
		switch {
		case errors.Is(err, flag.ErrHelp):
			return nil, err
		case err != nil:
			return nil, errQuiet
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		if fs.Arg(0) == "--" {
			return append(pos, fs.Args()[1:]...), nil
		}
		pos, args = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
}

// newFlags returns a command's flag set, with its usage line and description.
func (a *app) newFlags(name, usage, about string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	fs.Usage = func() {
		fmt.Fprintf(a.stderr, "Usage: outboxctl [global flags] %s\n\n%s\n\nFlags:\n", usage, about)
		fs.PrintDefaults()
	}
	return fs
}

// open connects to the database and checks that it answers, so that an unreachable or
// misspelt DSN is reported before anything else.
func (a *app) open(ctx context.Context) error {
	if a.dsn == "" {
		return usagef("no database: give -dsn or set OUTBOX_DSN (or name stores with -store NAME=DSN)")
	}
	cfg, err := mysql.ParseDSN(a.dsn)
	if err != nil {
		return usagef("malformed DSN: %v", err)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = a.connectTimeout
	}
	db, err := a.connect(ctx, cfg)
	if err != nil {
		return err
	}
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: a.table, Routes: a.routes})
	if err != nil {
		_ = db.Close()
		return err
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.tables
	WHERE table_schema = DATABASE() AND table_name = ?`, a.table).Scan(&n); err != nil {
		_ = db.Close()
		return fmt.Errorf("cannot look up table %s: %w", a.table, err)
	}
	if n == 0 {
		_ = db.Close()
		return fmt.Errorf("table %s does not exist in database %q (give -table or set OUTBOX_TABLE)", a.table, cfg.DBName)
	}
	a.db, a.store, a.admin = db, store, outbox.NewAdmin(store)
	return nil
}

// connect opens and pings the database of cfg.
func (a *app) connect(ctx context.Context, cfg *mysql.Config) (*sql.DB, error) {
	cfg.ParseTime = true
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, usagef("malformed DSN: %v", err)
	}
	db := sql.OpenDB(conn)
	pctx, cancel := context.WithTimeout(ctx, a.connectTimeout)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("cannot reach the database at %s: %w", cfg.Addr, err)
	}
	return db, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// noArgs rejects positional arguments a command does not take.
func noArgs(pos []string) error {
	if len(pos) > 0 {
		return usagef("unexpected argument %q", strings.Join(pos, " "))
	}
	return nil
}

// splitList splits a comma-separated list, dropping empty entries.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
