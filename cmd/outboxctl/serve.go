package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/console"
	"github.com/go-outbox/outbox/inbox"
)

// The secrets of serve come from the environment or a file, never from a flag: a flag's
// value is in the process list for every user of the machine to read.
const (
	envToken     = "OUTBOX_CONSOLE_TOKEN"      // the bearer token
	envBasicAuth = "OUTBOX_CONSOLE_BASIC_AUTH" // user:password
)

// serve runs the operator console (package console) over every store given, until ctx ends.
func (a *app) serve(ctx context.Context, stores []namedStore, args []string) error {
	fs := a.newFlags("serve", "serve [--listen ADDR] [--allow-writes] [flags]",
		"Serves the operator console in a browser: each store's overview, its dead letters (requeue\n"+
			"or skip one, or every one a filter selects), its blocked keys, and the rejected messages of\n"+
			"the inbox groups named with --inbox. Every store given (-dsn, or each -store) is shown.\n"+
			"It listens on loopback unless told otherwise; another address needs a token ($"+envToken+"\n"+
			"or --token-file) or basic-auth credentials ($"+envBasicAuth+"=user:password or\n"+
			"--basic-auth-file). Read-only unless --allow-writes. Each action is logged to stderr as a\n"+
			"JSON record: who, what, how many rows. See docs/console.md.")
	listen := fs.String("listen", "127.0.0.1:8080", "the address to listen on, `HOST:PORT`")
	allowWrites := fs.Bool("allow-writes", false, "allow requeue, skip and resend (read-only without it)")
	prefix := fs.String("prefix", "/", "the `PATH` the console is served under, e.g. /outbox/ behind a proxy")
	tokenFile := fs.String("token-file", "", "a `FILE` holding the bearer token (instead of $"+envToken+")")
	basicFile := fs.String("basic-auth-file", "", "a `FILE` holding user:password (instead of $"+envBasicAuth+")")
	lease := fs.Duration("lease", 0, "the publishers' lease (Tuning.Lease), to flag claims held past half of it; 0: not judged")
	relayTable := fs.String("relay-table", "", "the binlog relay's checkpoint table, to show who publishes (e.g. t_outbox_relay)")
	var inboxFlags []string
	fs.Func("inbox", "an inbox's consumer group to show, `[STORE/]GROUP`: its rejected messages; with --namesrv it offers resend; repeat for each",
		func(s string) error { inboxFlags = append(inboxFlags, s); return nil })
	inboxTable := fs.String("inbox-table", "t_inbox", "the inbox table; the rejected messages are in it plus _rejected")
	namesrv := fs.String("namesrv", os.Getenv("OUTBOX_NAMESRV"), "RocketMQ name servers for resend, comma-separated; defaults to $OUTBOX_NAMESRV")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	auth, err := readAuth(*tokenFile, *basicFile)
	if err != nil {
		return err
	}
	host, _, err := net.SplitHostPort(*listen)
	if err != nil {
		return usagef("--listen %q: want HOST:PORT: %v", *listen, err)
	}
	if !loopback(host) && auth == nil {
		return usagef("--listen %s is not a loopback address: give a token ($%s or --token-file) or basic-auth credentials ($%s or --basic-auth-file)",
			*listen, envToken, envBasicAuth)
	}
	inboxes, err := parseInboxes(inboxFlags, stores)
	if err != nil {
		return err
	}

	logger := slog.New(slog.NewJSONHandler(a.stderr, nil))
	cfg := console.Config{Prefix: *prefix, AllowWrites: *allowWrites, Logger: logger}
	if auth != nil {
		cfg.User = auth.user
	}
	var dbs []*sql.DB
	defer func() {
		for _, db := range dbs {
			_ = db.Close()
		}
	}()
	dbOf := map[string]*sql.DB{}
	for _, st := range stores {
		if st.dsn == "" {
			return usagef("no database: give -dsn or set OUTBOX_DSN (or name stores with -store NAME=DSN)")
		}
		mc, err := mysql.ParseDSN(st.dsn)
		if err != nil {
			return usagef("malformed DSN: %v", err)
		}
		if mc.Timeout == 0 {
			mc.Timeout = a.connectTimeout
		}
		name := cmpOr(st.name, mc.DBName)
		db, err := a.connect(ctx, mc)
		if err != nil {
			return fmt.Errorf("store %s: %w", name, err)
		}
		dbs = append(dbs, db)
		dbOf[st.name] = db
		store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: a.table, RelayTable: *relayTable, Routes: a.routes})
		if err != nil {
			return err
		}
		if _, err := store.Check(ctx); err != nil {
			return fmt.Errorf("store %s: %w", name, err)
		}
		cfg.Stores = append(cfg.Stores, console.Store{Name: name, Store: store, Lease: *lease})
	}
	if *namesrv != "" && len(inboxes) > 0 {
		outbox.RouteRocketMQClientLogs(logger) // once, before the resend senders' clients start
	}
	for _, ib := range inboxes {
		in, err := inbox.New(dbOf[ib.store], inbox.Config{Group: ib.group, Table: *inboxTable})
		if err != nil {
			return err
		}
		entry := console.Inbox{Inbox: in}
		if *namesrv != "" {
			sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{NameServers: strings.Split(*namesrv, ",")})
			if err != nil {
				return err
			}
			defer sender.Close()
			entry.Sender = sender
		}
		cfg.Inboxes = append(cfg.Inboxes, entry)
	}
	h, err := console.New(cfg)
	if err != nil {
		return err
	}
	if auth != nil {
		h = auth.wrap(h)
	} else {
		h = loopbackOnly(h)
	}

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *listen, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: nil}
	mode := "read-only"
	if *allowWrites {
		mode = "writes allowed"
	}
	fmt.Fprintf(a.stderr, "outboxctl: console on http://%s%s (%s; %d stores, %d inboxes)\n", ln.Addr(), *prefix, mode, len(cfg.Stores), len(cfg.Inboxes))
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("serve: shut down: %w", err)
	}
	<-done
	return nil
}

// loopback reports whether host names only this machine.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// loopbackOnly refuses a request whose Host is not a loopback name: a console without
// credentials answers only pages of this machine's own addresses, so that a web page whose
// name an attacker points at 127.0.0.1 (DNS rebinding) reads nothing of it.
func loopbackOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if hh, _, err := net.SplitHostPort(host); err == nil {
			host = hh
		}
		if !loopback(strings.Trim(host, "[]")) {
			http.Error(w, "outbox console: without credentials it answers only to a loopback host name (localhost, 127.0.0.1, [::1])", http.StatusMisdirectedRequest)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// inboxFlag is one --inbox: the store whose database holds the inbox, and the group.
type inboxFlag struct{ store, group string }

func parseInboxes(flags []string, stores []namedStore) ([]inboxFlag, error) {
	var out []inboxFlag
	for _, f := range flags {
		var ib inboxFlag
		rest := f
		if store, group, ok := strings.Cut(rest, "/"); ok {
			ib.store, ib.group = store, group
		} else {
			ib.group = rest
		}
		switch {
		case ib.group == "":
			return nil, usagef("--inbox %q: want [STORE/]GROUP", f)
		case strings.Contains(ib.group, "="):
			return nil, usagef("--inbox %q: want [STORE/]GROUP (a resend goes to the topic the message was consumed from: name no topic)", f)
		}
		switch {
		case ib.store == "" && len(stores) > 1:
			return nil, usagef("--inbox %q: %d stores are given: name the one whose database holds the inbox, STORE/GROUP", f, len(stores))
		case ib.store == "":
			ib.store = stores[0].name
		default:
			found := false
			for _, st := range stores {
				found = found || st.name == ib.store
			}
			if !found {
				return nil, usagef("--inbox %q: unknown store %q", f, ib.store)
			}
		}
		out = append(out, ib)
	}
	return out, nil
}

// consoleAuth checks a request's credentials: the bearer token (as an Authorization:
// Bearer header, or as the password of basic auth, for a browser), or basic auth's user
// and password. Secrets are compared by their SHA-256, in constant time.
type consoleAuth struct {
	token          [32]byte
	hasToken       bool
	username       string
	password       [32]byte
	hasBasicSecret bool
}

// readAuth reads the token and the basic-auth credentials from their files or the
// environment; nil when neither is given.
func readAuth(tokenFile, basicFile string) (*consoleAuth, error) {
	token, err := secret(tokenFile, envToken)
	if err != nil {
		return nil, err
	}
	basic, err := secret(basicFile, envBasicAuth)
	if err != nil {
		return nil, err
	}
	if token == "" && basic == "" {
		return nil, nil
	}
	a := &consoleAuth{}
	if token != "" {
		if len(token) < 16 {
			return nil, usagef("the console token is %d characters: give at least 16", len(token))
		}
		a.token, a.hasToken = sha256.Sum256([]byte(token)), true
	}
	if basic != "" {
		user, pass, ok := strings.Cut(basic, ":")
		if !ok || user == "" || pass == "" {
			return nil, usagef("basic-auth credentials: want user:password")
		}
		a.username, a.password, a.hasBasicSecret = user, sha256.Sum256([]byte(pass)), true
	}
	return a, nil
}

// secret reads the first line of file, else the environment variable env.
func secret(file, env string) (string, error) {
	if file == "" {
		return os.Getenv(env), nil
	}
	f, err := os.Open(file)
	if err != nil {
		return "", usagef("%v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan()
	if err := sc.Err(); err != nil {
		return "", usagef("%s: %v", file, err)
	}
	s := strings.TrimSpace(sc.Text())
	if s == "" {
		return "", usagef("%s is empty", file)
	}
	return s, nil
}

func (a *consoleAuth) matches(want [32]byte, got string) bool {
	sum := sha256.Sum256([]byte(got))
	return subtle.ConstantTimeCompare(want[:], sum[:]) == 1
}

// check returns who the request comes from, or false.
func (a *consoleAuth) check(r *http.Request) (string, bool) {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && a.hasToken {
		return "token", a.matches(a.token, tok)
	}
	user, pass, ok := r.BasicAuth()
	if !ok {
		return "", false
	}
	if a.hasBasicSecret && user == a.username && a.matches(a.password, pass) {
		return user, true
	}
	if a.hasToken && a.matches(a.token, pass) {
		return cmpOr(user, "token"), true
	}
	return "", false
}

type userKey struct{}

// user names who makes r, for the console's audit records.
func (a *consoleAuth) user(r *http.Request) string {
	if u, ok := r.Context().Value(userKey{}).(string); ok {
		return u
	}
	return "anonymous"
}

// wrap refuses requests without valid credentials (401, asking the browser for basic auth).
func (a *consoleAuth) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, ok := a.check(r)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Basic realm="outbox console", charset="UTF-8"`)
			http.Error(w, "outbox console: credentials required", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
	})
}

// runServe runs serve over every store given: -dsn's database, or each -store.
func (a *app) runServe(ctx context.Context, dsnSet bool, args []string) int {
	stores := a.stores
	switch {
	case a.on != "":
		fmt.Fprintf(a.stderr, "outboxctl: -on %s: serve shows every store given; leave out -on\n", a.on)
		return exitUsage
	case len(stores) > 0 && dsnSet:
		fmt.Fprintln(a.stderr, "outboxctl: give -dsn or -store, not both")
		return exitUsage
	case len(stores) == 0:
		stores = []namedStore{{dsn: a.dsn}}
	}
	code, _ := a.exec(ctx, "serve", "", func(ctx context.Context, args []string) error { return a.serve(ctx, stores, args) }, args)
	return code
}
