package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-outbox/outbox"
)

// ---- blocked

// blockedRow is a blocked key as blocked prints it in JSON.
type blockedRow struct {
	listed
	Waiting int64 `json:"waiting"`
}

func (a *app) blocked(ctx context.Context, args []string) error {
	fs := a.newFlags("blocked", "blocked [--limit N] [--json]",
		"Lists dead letters (FAIL) with WAIT events of the same biz no after them, oldest first,\n"+
			"and how many wait behind each. With per-key ordering (KeyOrder) those keys stand still\n"+
			"until the dead letter is requeued (requeue ID: sent after all) or skipped (skip ID:\n"+
			"never sent). Exits 1 when no key is blocked.")
	limit := fs.Int("limit", 0, fmt.Sprintf("most rows to print (default %d, at most %d)", outbox.ListLimitDefault, outbox.ListLimitMax))
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	if *limit < 0 || *limit > outbox.ListLimitMax {
		return usagef("--limit must be between 0 and %d, got %d", outbox.ListLimitMax, *limit)
	}
	if err := a.open(ctx); err != nil {
		return err
	}
	keys, err := a.store.Blocked(ctx, *limit)
	if err != nil {
		return err
	}
	if *asJSON {
		out := make([]blockedRow, len(keys))
		for i, k := range keys {
			out[i] = blockedRow{toListed(k.Event, k.PayloadSize), k.Waiting}
		}
		if err := writeJSON(a.stdout, out); err != nil {
			return err
		}
	} else if len(keys) > 0 {
		tw := table(a.stdout)
		fmt.Fprintln(tw, "ID\tBIZ NO\tEVENT TYPE\tWAITING BEHIND\tRETRIES\tFAILED (UTC)\tLAST ERROR")
		for _, k := range keys {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%s\t%s\n", k.ID, cell(k.BizNo, 40), cell(k.EventType, 40), k.Waiting,
				k.RetryCount, stamp(k.UpdateTime), cell(k.LastError, 60))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(keys) == 0 {
		return errors.New("no dead letter has events of its biz no waiting behind it")
	}
	return nil
}

// ---- skip

func (a *app) skip(ctx context.Context, args []string) error {
	fs := a.newFlags("skip", "skip ID... [--json]",
		"Marks dead letters (FAIL) SKIPPED: never to be sent. SKIPPED is final and counts as sent\n"+
			"for per-key ordering, so the events of a blocked biz no behind it go on (see blocked).\n"+
			"Every id must be a FAIL event, or nothing changes. To send a dead letter after all,\n"+
			"requeue it instead.")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("skip takes one or more event ids")
	}
	ids := make([]int64, len(pos))
	for i, s := range pos {
		if ids[i], err = parseID(s); err != nil {
			return err
		}
	}
	if len(ids) > outbox.ListLimitMax {
		return usagef("at most %d ids at once, got %d", outbox.ListLimitMax, len(ids))
	}
	if err := a.open(ctx); err != nil {
		return err
	}
	if err := a.checkFailed(ctx, ids, "skipped"); err != nil {
		return err
	}
	var done []int64
	for _, id := range ids {
		if err := a.store.Skip(ctx, id); err != nil {
			return fmt.Errorf("after %d skipped (%s): %w", len(done), joinIDs(done), err)
		}
		done = append(done, id)
		fmt.Fprintf(a.stderr, "%s skipped event %d\n", time.Now().UTC().Format(time.RFC3339), id)
	}
	if *asJSON {
		return writeJSON(a.stdout, map[string]any{"skipped": done})
	}
	fmt.Fprintf(a.stdout, "skipped %d dead letters: %s\n", len(done), joinIDs(done))
	return nil
}

func joinIDs(ids []int64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprint(id)
	}
	return strings.Join(s, ", ")
}
