package bench

import (
	"context"
	"database/sql"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Counters is a snapshot of the server's own statement counters (Questions and every Com_*),
// of its redo log sequence number and of the bytes it wrote to its binary log. The counters
// are global: they count every client of the server, so a measurement is only as clean as
// the server is quiet (use a private one).
type Counters struct {
	Questions int64
	Com       map[string]int64 // Com_select, Com_update, ... without the prefix
	LSN       int64            // -1 if the server does not say
	// BinlogBytes is MariaDB's Binlog_bytes_written: what the server wrote to its binary
	// log since it started, 0 while the binary log is off; -1 if the server does not say
	// (MySQL has no such counter).
	BinlogBytes int64
}

// readCounters takes a snapshot in one statement. That statement is itself counted (one
// Questions, one Com_show_status) in the snapshot it returns, so the difference of two
// snapshots includes exactly one statement of the harness's own: sub removes it.
func readCounters(ctx context.Context, db *sql.DB) (Counters, error) {
	c := Counters{Com: map[string]int64{}, LSN: -1, BinlogBytes: -1}
	rows, err := db.QueryContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name = 'Questions' OR Variable_name LIKE 'Com\\_%' "+
		"OR Variable_name IN ('Innodb_lsn_current', 'Innodb_redo_log_current_lsn', 'Binlog_bytes_written')")
	if err != nil {
		return c, err
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var v sql.NullInt64
		if err := rows.Scan(&name, &v); err != nil {
			return c, err
		}
		switch {
		case name == "Questions":
			c.Questions = v.Int64
		case name == "Innodb_lsn_current" || name == "Innodb_redo_log_current_lsn":
			c.LSN = v.Int64
		case name == "Binlog_bytes_written":
			c.BinlogBytes = v.Int64
		case strings.HasPrefix(name, "Com_"):
			c.Com[strings.TrimPrefix(name, "Com_")] = v.Int64
		}
	}
	return c, rows.Err()
}

// sub returns the counts from c0 to c, less the one snapshot statement in between.
func (c Counters) sub(c0 Counters) Counters {
	d := Counters{Questions: c.Questions - c0.Questions - 1, Com: map[string]int64{}, LSN: -1, BinlogBytes: -1}
	for k, v := range c.Com {
		if n := v - c0.Com[k]; n != 0 {
			d.Com[k] = n
		}
	}
	d.Com["show_status"]--
	if d.Com["show_status"] == 0 {
		delete(d.Com, "show_status")
	}
	if c.LSN >= 0 && c0.LSN >= 0 {
		d.LSN = c.LSN - c0.LSN
	}
	if c.BinlogBytes >= 0 && c0.BinlogBytes >= 0 {
		d.BinlogBytes = c.BinlogBytes - c0.BinlogBytes
	}
	return d
}

// PerEvent is a Counters difference divided by a number of events: the statements (and
// redo and binary log bytes) each event cost.
type PerEvent struct {
	Questions   float64
	Com         map[string]float64
	RedoBytes   float64 // -1 if unknown
	BinlogBytes float64 // -1 if unknown; 0 with the binary log off
}

func (c Counters) per(events int) PerEvent {
	p := PerEvent{Com: map[string]float64{}, RedoBytes: -1, BinlogBytes: -1}
	if events <= 0 {
		return p
	}
	n := float64(events)
	p.Questions = float64(c.Questions) / n
	for k, v := range c.Com {
		p.Com[k] = float64(v) / n
	}
	if c.LSN >= 0 {
		p.RedoBytes = float64(c.LSN) / n
	}
	if c.BinlogBytes >= 0 {
		p.BinlogBytes = float64(c.BinlogBytes) / n
	}
	return p
}

// minus returns the counts of d less events times what one event cost in cal: what is left
// when a calibrated part of the load (the writers') is taken out. Redo and binary log bytes
// are NaN where either side does not know them: what is left is a difference, which the
// noise of the calibration can make a little negative.
func (c Counters) minus(cal PerEvent, events int) (q float64, com map[string]float64, redo, binlog float64) {
	n := float64(events)
	q = float64(c.Questions) - cal.Questions*n
	com = map[string]float64{}
	for k, v := range c.Com {
		com[k] = float64(v)
	}
	for k, v := range cal.Com {
		com[k] -= v * n
	}
	for k, v := range com {
		if v > -0.5 && v < 0.5 {
			delete(com, k)
		}
	}
	redo, binlog = math.NaN(), math.NaN()
	if c.LSN >= 0 && cal.RedoBytes >= 0 {
		redo = float64(c.LSN) - cal.RedoBytes*n
	}
	if c.BinlogBytes >= 0 && cal.BinlogBytes >= 0 {
		binlog = float64(c.BinlogBytes) - cal.BinlogBytes*n
	}
	return q, com, redo, binlog
}

// KB formats a byte count as KB with two decimals, "-" when it is unknown (NaN).
func KB(bytes float64) string {
	if math.IsNaN(bytes) {
		return "-"
	}
	return strconv.FormatFloat(bytes/1024, 'f', 2, 64)
}

// Breakdown formats per-event counts by statement kind, largest first ("update 1.00,
// select 0.50, ..."). The prepared-statement commands (stmt_prepare, stmt_execute,
// stmt_close) are left out of the list: an executed prepared statement is counted under its
// kind too (and once in Questions). They are summarised at the end instead, since each also
// costs the server a PREPARE and a CLOSE that Questions does not count.
func Breakdown(com map[string]float64) string {
	keys := make([]string, 0, len(com))
	for k := range com {
		if !strings.HasPrefix(k, "stmt_") {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		if com[keys[i]] != com[keys[j]] {
			return com[keys[i]] > com[keys[j]]
		}
		return keys[i] < keys[j]
	})
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(k)
		b.WriteByte(' ')
		b.WriteString(strconv.FormatFloat(com[k], 'f', 2, 64))
	}
	if n := com["stmt_execute"]; n != 0 {
		b.WriteString("; of these, prepared " + strconv.FormatFloat(n, 'f', 2, 64) +
			" (each also a PREPARE and a CLOSE)")
	}
	return b.String()
}
