package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/go-outbox/outbox/tools/internal/bench"
)

// consumeRow is one way of consuming, run once per round.
type consumeRow struct {
	c       bench.Consumer
	results []bench.ConsumeResult
}

// rates returns the rate of each round, sorted, by f.
func (r consumeRow) rates(f func(bench.ConsumeResult) float64) []float64 {
	out := make([]float64, len(r.results))
	for i, res := range r.results {
		out[i] = f(res)
	}
	slices.Sort(out)
	return out
}

// versus returns, round by round, this row's rate (by f) over plain's in the same round, in
// percent: its median, lowest and highest. Each round runs every way back to back, so that a
// ratio within a round is less at the mercy of the machine's drift than the medians of the
// rates are.
func (r consumeRow) versus(plain consumeRow, f func(bench.ConsumeResult) float64) (med, lo, hi float64) {
	ratios := make([]float64, len(r.results))
	for i := range r.results {
		ratios[i] = 100 * f(r.results[i]) / f(plain.results[i])
	}
	slices.Sort(ratios)
	return median(ratios), ratios[0], ratios[len(ratios)-1]
}

// perMessage is the rounds' statements (and redo) per message, over all rounds.
func (r consumeRow) perMessage() bench.PerEvent {
	p := bench.PerEvent{Com: map[string]float64{}}
	n := float64(len(r.results))
	for _, res := range r.results {
		p.Questions += res.PerMessage.Questions / n
		for k, v := range res.PerMessage.Com {
			p.Com[k] += v / n
		}
		if p.RedoBytes >= 0 && res.PerMessage.RedoBytes >= 0 {
			p.RedoBytes += res.PerMessage.RedoBytes / n
		} else {
			p.RedoBytes = -1
		}
	}
	return p
}

// effects returns the effect rows per message over all rounds, and whether every row's event
// id was distinct; and the errors over all rounds.
func (r consumeRow) effects() (perMessage float64, distinct bool, errs int64) {
	rows, msgs := 0, 0
	distinct = true
	for _, res := range r.results {
		rows += res.Effects
		msgs += res.Messages
		distinct = distinct && res.Distinct == res.Effects
		errs += res.Errors
	}
	return float64(rows) / float64(msgs), distinct, errs
}

// consumeRounds runs every way of consuming once per round, each round starting one way
// further, so that whatever drifts during a run spreads over all alike.
func consumeRounds(ctx context.Context, env bench.Env, c bench.Consume, runs int, what string) []consumeRow {
	rows := make([]consumeRow, len(bench.Consumers))
	for i, k := range bench.Consumers {
		rows[i].c = k
	}
	for run := range runs {
		for j := range rows {
			i := (j + run) % len(rows)
			c.Consumer = rows[i].c
			res, err := c.Run(ctx, env)
			if err != nil {
				log.Fatalf("inbox, %s, %s (run %d): %v", what, rows[i].c, run+1, err)
			}
			rows[i].results = append(rows[i].results, res)
		}
	}
	return rows
}

// inboxTable prints what the inbox costs a consumer beside a plain one, in the same run: on
// the database path (inbox.Handle on messages made beforehand), and, with namesrv, through
// RocketMQ (a push consumer of a topic published beforehand).
func inboxTable(ctx context.Context, env bench.Env, messages, workers, runs int, namesrv, broker string) {
	fmt.Printf("\ninbox: %d messages per run, %d goroutines, %d rounds (each way once per round, in turn); %s; "+
		"statements and redo from the server-wide counters (valid on a server nothing else uses)\n",
		messages, workers, runs, flushNote(ctx, env))
	fmt.Println("plain: the handler in a transaction of its own (BEGIN, INSERT effect, COMMIT), no deduplication; " +
		"inbox: the same handler through inbox.Handle, its defaults (the session's isolation, as plain); " +
		"READ COMMITTED per tx: Config.TxOptions at READ COMMITTED; READ COMMITTED per session: the defaults, " +
		"on a pool whose sessions are at READ COMMITTED (set once per connection, in the DSN)")
	db := consumeRounds(ctx, env, bench.Consume{Messages: messages, Workers: workers}, runs, "database path")
	fmt.Println()
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "database path\tmessages\tmsgs/s (median of %d)\tlowest\thighest\tvs plain (median of rounds)\trange\tstatements/msg\tbegin\tinsert\tcommit\tset_option\tredo KB/msg\teffects/msg\terrors\t\n", runs)
	for _, r := range db {
		printConsumeRow(w, r, db[0], messages)
	}
	_ = w.Flush()
	breakdown(db)
	if namesrv == "" {
		return
	}
	topic, err := bench.NewTopic(ctx, []string{namesrv}, broker, messages)
	if err != nil {
		log.Fatalf("inbox, through RocketMQ: %v", err)
	}
	defer topic.Delete()
	fmt.Printf("\nthrough RocketMQ: topic %s (4 queues on %s), %d messages published beforehand in %.2f s; "+
		"each run a push consumer of a fresh group from the first offset, %d consume goroutines; "+
		"from start: from the consumer's start to the last effect committed; once flowing: from the first effect to the last\n",
		topic.Name, broker, messages, topic.Published.Seconds(), workers)
	mq := consumeRounds(ctx, env, bench.Consume{Workers: workers, Topic: topic}, runs, "through RocketMQ")
	w = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "through RocketMQ\tmessages\tmsgs/s from start (median of %d)\tlowest\thighest\tvs plain (median of rounds)\trange\tmsgs/s once flowing (median)\tvs plain\tstatements/msg\tredo KB/msg\teffects/msg\terrors\t\n", runs)
	for _, r := range mq {
		start, flow := r.rates(bench.ConsumeResult.Rate), r.rates(bench.ConsumeResult.FlowingRate)
		vs, lo, hi := r.versus(mq[0], bench.ConsumeResult.Rate)
		vsFlow, _, _ := r.versus(mq[0], bench.ConsumeResult.FlowingRate)
		p := r.perMessage()
		eff, distinct, errs := r.effects()
		fmt.Fprintf(w, "%s\t%d\t%.0f\t%.0f\t%.0f\t%.0f %%\t%.0f–%.0f %%\t%.0f\t%.0f %%\t%.2f\t%s\t%s\t%d\t\n", r.c, messages,
			median(start), start[0], start[len(start)-1], vs, lo, hi, median(flow), vsFlow,
			p.Questions, redoKB(p), effectsCell(eff, distinct), errs)
	}
	_ = w.Flush()
	breakdown(mq)
}

func printConsumeRow(w io.Writer, r, plain consumeRow, messages int) {
	p := r.perMessage()
	eff, distinct, errs := r.effects()
	rates := r.rates(bench.ConsumeResult.Rate)
	vs, lo, hi := r.versus(plain, bench.ConsumeResult.Rate)
	fmt.Fprintf(w, "%s\t%d\t%.0f\t%.0f\t%.0f\t%.0f %%\t%.0f–%.0f %%\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%s\t%s\t%d\t\n", r.c, messages,
		median(rates), rates[0], rates[len(rates)-1], vs, lo, hi,
		p.Questions, p.Com["begin"], p.Com["insert"], p.Com["commit"], p.Com["set_option"], redoKB(p), effectsCell(eff, distinct), errs)
}

func redoKB(p bench.PerEvent) string {
	if p.RedoBytes < 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", p.RedoBytes/1024)
}

// effectsCell is the effect rows per message, marked when an event's effect was written more
// than once.
func effectsCell(perMessage float64, distinct bool) string {
	s := fmt.Sprintf("%.2f", perMessage)
	if !distinct {
		s += " (doubled)"
	}
	return s
}

// breakdown prints each way's statements per message by kind, and what the inbox adds to
// the plain consumer.
func breakdown(rows []consumeRow) {
	fmt.Println("statements per message by kind (server Com_* counters):")
	plain := rows[0].perMessage()
	for _, r := range rows {
		p := r.perMessage()
		line := fmt.Sprintf("  %-34s %s", r.c.String()+":", bench.Breakdown(p.Com))
		if r.c != bench.PlainConsumer {
			var added []string
			for _, k := range []string{"set_option", "begin", "insert", "commit"} {
				if d := p.Com[k] - plain.Com[k]; d > 0.005 || d < -0.005 {
					added = append(added, fmt.Sprintf("%s %+.2f", k, d))
				}
			}
			line += fmt.Sprintf("; beside plain: %+.2f statements (%s), %+.2f KB redo", p.Questions-plain.Questions,
				strings.Join(added, ", "), (p.RedoBytes-plain.RedoBytes)/1024)
		}
		fmt.Println(line)
	}
}
