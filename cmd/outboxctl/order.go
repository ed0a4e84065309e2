package main

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// ---- blocked

// blockedRow is a blocked key as blocked prints it in JSON.
type blockedRow struct {
	listed
	Waiting int64 `json:"waiting"`
}

func (a *app) blocked(ctx context.Context, args []string) error {
	fs := a.newFlags("blocked", "blocked [--limit N] [--json] [--check]",
		"Lists dead letters (FAIL) with WAIT events of the same biz no after them, oldest first,\n"+
			"and how many wait behind each. With per-key ordering (KeyOrder) those keys stand still\n"+
			"until the dead letter is requeued (requeue ID: sent after all) or skipped (skip ID:\n"+
			"never sent). Nothing blocked is success: it says so (--json: []) and exits 0, as when\n"+
			"something is; with --check a blocked key exits 5, for an alert (a failure stays 1).")
	limit := fs.Int("limit", 0, "most rows to print (default 100, at most 10000)")
	after := fs.Int64("after", 0, "only dead letters with an id above this: the next page starts after the last id printed")
	check := fs.Bool("check", false, "exit 5 when some key is blocked (0 when none)")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	if *limit < 0 || *limit > 10000 {
		return usagef("--limit must be between 0 and 10000, got %d", *limit)
	}
	if *after < 0 {
		return usagef("--after is an id (0 for the first page), got %d", *after)
	}
	if err := a.open(ctx); err != nil {
		return err
	}
	keys, err := a.admin.Blocked(ctx, *after, *limit)
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
		fmt.Fprintln(tw, "ID\tBIZ_NO\tEVENT_TYPE\tWAITING BEHIND\tRETRIES\tFAILED (UTC)\tEVENT_ID\tLAST_ERROR")
		for _, k := range keys {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", k.ID, cell(k.BizNo, 40), cell(k.EventType, 40), k.Waiting,
				k.RetryCount, stamp(k.UpdateTime), k.EventID, cell(k.LastError, 60))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(keys) == 0 && !*asJSON {
		fmt.Fprintln(a.stdout, "no dead letter has events of its biz no waiting behind it")
	}
	if len(keys) > 0 && *check {
		return exitError{code: exitFound, quiet: true, err: fmt.Errorf("%d blocked keys", len(keys))}
	}
	return nil
}

// ---- skip

func (a *app) skip(ctx context.Context, args []string) error {
	fs := a.newFlags("skip", "skip ID|EVENT_ID... [--json]",
		"Marks dead letters (FAIL) SKIPPED: never to be sent. SKIPPED is final and counts as sent\n"+
			"for per-key ordering, so the events of a blocked biz no behind it go on (see blocked).\n"+
			"Each is named by its id or its event_id, and every one must be a FAIL event, or nothing\n"+
			"changes (exit 3 when one does not exist, 4 when one is not FAIL). To send a dead letter\n"+
			"after all, requeue it instead.")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("skip takes one or more ids or event_ids")
	}
	if err := a.perTable(); err != nil {
		return err
	}
	refs, err := parseRefs(pos)
	if err != nil {
		return err
	}
	if len(refs) > 10000 {
		return usagef("at most 10000 ids at once, got %d", len(refs))
	}
	if err := a.open(ctx); err != nil {
		return err
	}
	ids, err := a.resolve(ctx, refs)
	if err != nil {
		return err
	}
	if err := a.checkFailed(ctx, ids, "skipped"); err != nil {
		return err
	}
	var done []int64
	for _, id := range ids {
		if err := a.admin.Skip(ctx, id); err != nil {
			err = fmt.Errorf("after %d skipped (%s): %w", len(done), joinIDs(done), err)
			if len(done) > 0 {
				err = partial(err)
			}
			return err
		}
		done = append(done, id)
		fmt.Fprintf(a.stderr, "%s skipped id %d\n", time.Now().UTC().Format(time.RFC3339), id)
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
