package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/go-outbox/outbox/tools/internal/bench"
)

// consoleTable loads a console table of rows events and prints what the console's calls take
// on it, rounds times each, side by side with the statements a hand-written console would run
// instead: first on the unordered table (idx_biz_no), then after the ALTER that makes it
// ordered (idx_biz_no_status). With explain it then prints the plan of every statement the
// console's calls ran, on each table, and runs the console's writes for real on the ordered
// one to print theirs.
func consoleTable(ctx context.Context, env bench.Env, rows, rounds int, explain, keep bool) {
	t, err := bench.LoadConsole(ctx, env, rows)
	if err != nil {
		log.Fatalf("console: %v", err)
	}
	// log.Fatalf runs no deferred call: fatal drops the tables first.
	fatal := func(format string, args ...any) {
		if !keep {
			t.Drop()
		}
		log.Fatalf(format, args...)
	}
	if keep {
		defer fmt.Printf("\nconsole: tables %s, %s and %s_rejected kept (-console-keep): drop them when done\n", t.Name, t.Inbox, t.Inbox)
	} else {
		defer t.Drop()
	}
	m := t.Mix
	fmt.Printf("\nconsole: table %s, %d events loaded in %.1f s (INSERT ... SELECT from seq_1_to_N, 50,000 rows a statement): "+
		"%d SUCCESS over 7 days, %d SUCCESS in the last hour, %d FAIL (%d types) and %d SKIPPED over the 7 days, %d WAIT (%d of them behind %d dead letters of their key), %d SENDING; "+
		"rejected table: %d messages of 3 groups, %d of group %s\n",
		t.Name, m.Rows, t.Load.Seconds(), m.History, m.Recent, m.Fail, m.FailTypes, m.Skipped, m.Wait, m.BlockedWaiting, m.Blocked, m.Sending,
		m.Rejected, m.RejectedOfGroup, bench.ConsoleGroup)
	startLoad := loadAverage()
	unordered, err := t.MeasureConsole(ctx, env, rounds)
	if err != nil {
		fatal("console, unordered table: %v", err)
	}
	var explained [][]bench.Explained
	if explain {
		e, err := t.ExplainConsole(ctx, env, false)
		if err != nil {
			fatal("console, explain: %v", err)
		}
		explained = append(explained, e)
	}
	took, err := t.KeyOrder(ctx)
	if err != nil {
		fatal("console: make the table ordered: %v", err)
	}
	ordered, err := t.MeasureConsole(ctx, env, rounds)
	if err != nil {
		fatal("console, ordered table: %v", err)
	}
	fmt.Printf("%d rounds, each call once per round, in turn (after one untimed round); the ALTER to idx_biz_no_status took %.1f s; "+
		"overview: the four calls the overview runs, one after the other, summed per round; baseline: a hand-written console's status counts and sent per minute; "+
		"load average %s at the start, %s at the end\n",
		rounds, took.Seconds(), startLoad, loadAverage())
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "console call (%d events)\trows\tunordered median\tp95\tmax\tkey order median\tp95\tmax\t\n", m.Rows)
	for i := range unordered {
		u, o := unordered[i], ordered[i]
		kind := ""
		if u.Baseline && !strings.HasPrefix(u.Name, "baseline") {
			kind = "baseline: "
		}
		rowsCell := fmt.Sprint(u.Rows)
		if u.Rows != o.Rows {
			rowsCell = fmt.Sprintf("%d / %d", u.Rows, o.Rows)
		}
		if strings.HasPrefix(u.Name, "overview") || strings.HasPrefix(u.Name, "baseline") {
			rowsCell = ""
		}
		fmt.Fprintf(w, "%s%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", kind, u.Name, rowsCell,
			ms(u.Quantile(0.5)), ms(u.Quantile(0.95)), ms(u.Quantile(1)),
			ms(o.Quantile(0.5)), ms(o.Quantile(0.95)), ms(o.Quantile(1)))
	}
	_ = w.Flush()
	if explain {
		e, err := t.ExplainConsole(ctx, env, true)
		if err != nil {
			fatal("console, explain: %v", err)
		}
		explained = append(explained, e)
		for i, es := range explained {
			fmt.Printf("\nplans on the %s table (ANALYZE: the plan and the rows read, r_rows; EXPLAIN for the writes):\n",
				[]string{"unordered", "ordered"}[i])
			bench.WriteExplained(os.Stdout, es)
		}
	}
}

// loadAverage is the machine's load average over the last minute, "?" where /proc does not
// say.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}
