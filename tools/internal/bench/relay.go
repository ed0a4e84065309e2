package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/go-sql-driver/mysql"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/relay"
)

// relayTable is the checkpoint table of the relays on outbox table name.
func relayTable(name string) string { return name + "_cp" }

// newRelay makes instance i's relay of table name (see Drain.Relay), sending through s.
func newRelay(ctx context.Context, env Env, db *sql.DB, name string, i int, s outbox.Sender, errs *errorCounter) (*relay.Relay, error) {
	cfg := relay.Config{Table: name, CheckpointTable: relayTable(name), InstanceID: fmt.Sprintf("bench-relay-%d", i),
		Logger: slog.New(errs)}
	if i == 0 {
		if err := relay.CreateSchema(ctx, db, cfg); err != nil {
			return nil, err
		}
	}
	return relay.New(env.DSN, s, cfg)
}

// waitLeader waits until one of the instances' relays leads.
func waitLeader(ctx context.Context, ins []*instance) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, in := range ins {
			if in.rl != nil && in.rl.Health().Leader {
				return nil
			}
		}
		if time.Now().After(deadline) {
			for _, in := range ins {
				if in.rl != nil {
					return fmt.Errorf("no relay leads after 30s: %s", in.rl.Health().LastError)
				}
			}
			return errors.New("no relay leads after 30s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// runBinlogReference reads the outbox table's inserts from the binlog and sends each
// transaction's events, writing nothing: the least a relay that reads the binlog can cost,
// whatever it records (the BinlogOnly reference).
func runBinlogReference(ctx context.Context, env Env, db *sql.DB, table string, s outbox.Sender) error {
	cfg, err := mysql.ParseDSN(env.DSN)
	if err != nil {
		return err
	}
	host, port, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return err
	}
	var pos, version string
	if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.gtid_binlog_pos, VERSION()").Scan(&pos, &version); err != nil {
		return err
	}
	if !strings.Contains(version, "MariaDB") {
		return errors.New("the binlog reference reads MariaDB's GTIDs only")
	}
	start, err := gomysql.ParseMariadbGTIDSet(pos)
	if err != nil {
		return err
	}
	syncer := replication.NewBinlogSyncer(replication.BinlogSyncerConfig{ServerID: 1<<30 + 77, Flavor: gomysql.MariaDBFlavor,
		Host: host, Port: uint16(p), User: cfg.User, Password: cfg.Passwd, ParseTime: true, DisableRetrySync: true,
		HeartbeatPeriod: time.Second, Logger: slog.New(slog.DiscardHandler)})
	defer syncer.Close()
	st, err := syncer.StartSyncGTID(start)
	if err != nil {
		return err
	}
	var evs []outbox.Event
	for {
		ev, err := st.GetEvent(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		switch e := ev.Event.(type) {
		case *replication.RowsEvent:
			if string(e.Table.Table) != table || ev.Header.EventType != replication.WRITE_ROWS_EVENTv1 && ev.Header.EventType != replication.WRITE_ROWS_EVENTv2 {
				continue
			}
			idx := map[string]int{}
			for i, n := range e.Table.ColumnNameString() {
				idx[n] = i
			}
			for _, row := range e.Rows {
				id, _ := row[idx["id"]].(int64)
				eid, _ := row[idx["event_id"]].(string)
				biz, _ := row[idx["biz_no"]].(string)
				typ, _ := row[idx["event_type"]].(string)
				payload, _ := row[idx["payload"]].([]byte)
				evs = append(evs, outbox.Event{ID: id, EventID: eid, BizNo: biz, EventType: typ, Payload: payload})
			}
		case *replication.XIDEvent:
			if len(evs) > 0 {
				for i, err := range s.Send(ctx, evs, false) {
					if err != nil {
						return fmt.Errorf("send %s: %w", evs[i].EventID, err)
					}
				}
				evs = evs[:0]
			}
		}
	}
}
