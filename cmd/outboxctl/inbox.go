package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
)

// inbox runs the consumer's-side commands: rejected and resend.
func (a *app) inbox(ctx context.Context, args []string) error {
	if len(args) == 0 || (args[0] != "rejected" && args[0] != "resend") {
		return usagef("inbox needs a subcommand: rejected or resend ID|EVENT_ID...")
	}
	sub, args := args[0], args[1:]
	fs := a.newFlags("inbox "+sub, "outboxctl inbox "+sub+" --group GROUP [flags]", map[string]string{
		"rejected": "Lists a consumer group's rejected messages, oldest first: why each was rejected, how often, its event.",
		"resend":   "Publishes rejected messages again, as the same events, for the group's running consumers, and deletes their rows.",
	}[sub])
	group := fs.String("group", "", "the consumer group (required)")
	table := fs.String("inbox-table", "t_inbox", "the inbox table; the rejected messages are in it plus _rejected")
	after := fs.Int64("after", 0, "rejected: only rows with an id above this")
	limit := fs.Int("limit", 100, "rejected: at most this many rows (1 to 1000)")
	asJSON := fs.Bool("json", false, "rejected: JSON output")
	namesrv := fs.String("namesrv", os.Getenv("OUTBOX_NAMESRV"), "resend: RocketMQ name servers, comma-separated; defaults to $OUTBOX_NAMESRV")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if *group == "" {
		return usagef("--group is required")
	}
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
	var refs []ref
	if sub == "resend" {
		if len(pos) == 0 {
			return usagef("resend needs the ids (or event ids) of the rejected messages")
		}
		if err := a.perTable(); err != nil {
			return err
		}
		var err error
		if refs, err = parseRefs(pos); err != nil { // a rejected row's id, or its event id
			return err
		}
		if *namesrv == "" {
			return usagef("resend needs --namesrv (or $OUTBOX_NAMESRV)")
		}
	} else if err := noArgs(pos); err != nil {
		return err
	}
	db, err := a.connect(ctx, cfg)
	if err != nil {
		return err
	}
	a.db = db
	in, err := inbox.New(db, inbox.Config{Group: *group, Table: *table})
	if err != nil {
		return err
	}
	if sub == "rejected" {
		return a.listRejected(ctx, in, *after, *limit, *asJSON)
	}
	sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{NameServers: strings.Split(*namesrv, ",")})
	if err != nil {
		return err
	}
	defer sender.Close()
	for i, r := range refs {
		id := r.id
		if r.eventID != "" {
			m, err := in.RejectedByEventID(ctx, r.eventID)
			if err != nil {
				if i > 0 {
					return partial(err)
				}
				return err
			}
			id = m.ID
		}
		if err := in.Resend(ctx, id, sender); err != nil {
			if i > 0 {
				return partial(err) // the ones before it were resent: status 1, not "nothing changed"
			}
			return err
		}
		fmt.Fprintf(a.stdout, "rejected message %d resent and deleted\n", id)
	}
	return nil
}

func (a *app) listRejected(ctx context.Context, in *inbox.Inbox, after int64, limit int, asJSON bool) error {
	rows, err := in.Rejected(ctx, after, limit)
	if err != nil {
		return err
	}
	if asJSON {
		type row struct {
			ID          int64  `json:"id"`
			EventID     string `json:"event_id"`
			EventType   string `json:"event_type"`
			BizNo       string `json:"biz_no"`
			MsgID       string `json:"msg_id"`
			ReasonClass string `json:"reason_class"`
			Reason      string `json:"reason"`
			Deliveries  int    `json:"deliveries"`
			FirstAt     string `json:"first_rejected"`
			LastAt      string `json:"last_rejected"`
		}
		out := make([]row, len(rows))
		for i, r := range rows {
			out[i] = row{r.ID, r.Message.EventID, r.Message.EventType, r.Message.BizNo, r.Message.MsgID, r.ReasonClass,
				r.Reason, r.Message.Deliveries, stamp(r.FirstAt), stamp(r.LastAt)}
		}
		return writeJSON(a.stdout, out)
	}
	w := table(a.stdout)
	fmt.Fprintln(w, "ID\tEVENT_ID\tEVENT_TYPE\tBIZ_NO\tREASON_CLASS\tDELIVERIES\tLAST_REJECTED\tREASON")
	for _, r := range rows {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.ID, cell(r.Message.EventID, 36), cell(r.Message.EventType, 32),
			cell(r.Message.BizNo, 32), r.ReasonClass, r.Message.Deliveries, stamp(r.LastAt), cell(oneLine(r.Reason), 80))
	}
	return w.Flush()
}
