package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/go-outbox/outbox/internal/storename"
)

// namedStore is one database of a service that publishes several (-store NAME=DSN): its
// name, as the service's Config.StoreName has it, and its DSN.
type namedStore struct{ name, dsn string }

// onAll, as -on, runs the command against every store in turn.
const onAll = "all"

// addStore reads one NAME=DSN, from -store or a line of a -stores file.
func (a *app) addStore(s string) error {
	name, dsn, ok := strings.Cut(s, "=")
	name = strings.TrimSpace(name)
	switch {
	case !ok:
		return fmt.Errorf("want NAME=DSN, got %q", redact(s))
	case name == "":
		return fmt.Errorf("the store has no name: want NAME=DSN")
	case storename.Check(name) != nil:
		return fmt.Errorf("store name %.40q %w", redact(name), storename.Check(name))
	case name == onAll:
		return fmt.Errorf("store name %q is taken: -on %s runs a command against every store", name, onAll)
	case strings.TrimSpace(dsn) == "":
		return fmt.Errorf("store %q has no DSN", name)
	}
	for _, st := range a.stores {
		if st.name == name {
			return fmt.Errorf("store %q is named twice: give each database a name of its own", name)
		}
	}
	a.stores = append(a.stores, namedStore{name: name, dsn: strings.TrimSpace(dsn)})
	return nil
}

// redact hides what follows a DSN's user name, so that an error never prints a password:
// up to the last '@' before the last '/', as the driver reads a DSN (a password may hold
// an '@').
func redact(s string) string {
	slash := strings.LastIndexByte(s, '/')
	if slash < 0 {
		slash = len(s)
	}
	if i := strings.LastIndexByte(s[:slash], '@'); i >= 0 {
		if j := strings.IndexByte(s[:i], ':'); j >= 0 {
			return s[:j] + ":***" + s[i:]
		}
	}
	return s
}

// readStores reads a -stores file: one NAME=DSN a line; blank lines and lines beginning with
// # are skipped.
func (a *app) readStores(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return usagef("-stores: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if err := a.addStore(line); err != nil {
			return usagef("-stores %s, line %d: %v", path, n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return usagef("-stores %s: %v", path, err)
	}
	return nil
}

// targets returns the stores a command runs against: none named (the single database of
// -dsn), the one -on names, or every store with -on all. dsnSet says -dsn was given.
func (a *app) targets(dsnSet bool) ([]namedStore, error) {
	switch {
	case len(a.stores) == 0 && a.on != "":
		return nil, usagef("-on %s names a store, and no store is given: give -store NAME=DSN (or -stores FILE)", a.on)
	case len(a.stores) == 0:
		return []namedStore{{dsn: a.dsn}}, nil
	case dsnSet:
		return nil, usagef("give -dsn or -store, not both")
	case a.on == onAll:
		return a.stores, nil
	case a.on == "" && len(a.stores) == 1:
		return a.stores, nil
	case a.on == "":
		return nil, usagef("%d stores are given (%s): choose one with -on NAME, or every one with -on %s",
			len(a.stores), a.storeNames(), onAll)
	}
	for _, st := range a.stores {
		if st.name == a.on {
			return []namedStore{st}, nil
		}
	}
	return nil, usagef("-on %s: unknown store %q (the stores are %s)", a.on, a.on, a.storeNames())
}

func (a *app) storeNames() string {
	names := make([]string, len(a.stores))
	for i, st := range a.stores {
		names[i] = st.name
	}
	return strings.Join(names, ", ")
}

// perTable refuses ids when the command runs against every store: an id is a row of one
// table, and the same id in another table is another event.
func (a *app) perTable() error {
	if a.each {
		return usagef("ids are per table: name the store with -on NAME, not -on %s", onAll)
	}
	return nil
}

// runEach runs cmd against every store in turn, the next one after a failure (a database
// that is down stops only its own run), and stops at bad input, which would be bad for every
// store. Text output comes under a "== store NAME ==" line for each store; with --json it is
// one JSON array of {"store", "result"} or {"store", "error"}. The exit status is the worst (see
// worse).
func (a *app) runEach(ctx context.Context, cmdName string, cmd func(context.Context, []string) error, stores []namedStore, args []string) int {
	asJSON := false
	for _, arg := range args {
		if arg == "--" {
			break
		}
		if f := strings.TrimLeft(arg, "-"); strings.HasPrefix(arg, "-") && (f == "json" || f == "json=true") {
			asJSON = true
		}
	}
	type entry struct {
		Store  string          `json:"store"`
		Result json.RawMessage `json:"result,omitempty"`
		Error  string          `json:"error,omitempty"`
	}
	var entries []entry
	stdout, worst := a.stdout, exitOK
	a.each = true
	for i, st := range stores {
		var out bytes.Buffer
		a.stdout, a.dsn = &out, st.dsn
		code, err := a.exec(ctx, cmdName, st.name, cmd, args)
		worst = worse(worst, code)
		if asJSON {
			e := entry{Store: st.name}
			if json.Valid(out.Bytes()) {
				e.Result = bytes.TrimSpace(out.Bytes())
			}
			if err != nil && code != exitFound {
				e.Error = err.Error()
			}
			entries = append(entries, e)
		} else {
			if i > 0 {
				fmt.Fprintln(stdout)
			}
			fmt.Fprintf(stdout, "== store %s ==\n", st.name)
			_, _ = io.Copy(stdout, &out)
		}
		if code == exitUsage {
			break
		}
	}
	a.stdout = stdout
	if asJSON {
		if err := writeJSON(stdout, entries); err != nil {
			return exitFail
		}
	}
	return worst
}
