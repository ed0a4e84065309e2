package relay

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/mysqldialect"
)

// serverInfo is what the relay learned about the server when it checked it.
type serverInfo struct {
	// flavor is gomysql.MariaDBFlavor or gomysql.MySQLFlavor, as the binlog client wants it.
	flavor string
	// version is the server's VERSION(), e.g. "10.11.19-MariaDB-0+deb12u1-log".
	version string
	// serverID is the server's own @@server_id.
	serverID uint32
	// gtidPos is the server's current GTID position: MariaDB's @@gtid_binlog_pos
	// ("domain-server-seq" per domain), MySQL's @@gtid_executed (newlines removed). It is
	// empty on a server that has logged no transaction yet, or MySQL without gtid_mode.
	gtidPos string
	// rowImage is @@GLOBAL.binlog_row_image: FULL or NOBLOB.
	rowImage string
	// durability holds a warning for each setting that leaves the binlog or InnoDB's log
	// unsynced at commit (sync_binlog, innodb_flush_log_at_trx_commit): the relay runs, and
	// logs them.
	durability []string
	// replicasUnchecked, when not empty, says why the client's server id could not be
	// compared with the registered replicas' (the account may not list them: MariaDB 10.5+
	// asks for REPLICATION MASTER ADMIN), with the grant that would allow it. The relay can
	// still run; it should log this as a warning.
	replicasUnchecked string
}

// Server error numbers the check tells apart.
const (
	errSpecificAccessDenied = mysqldialect.ErrSpecificAccessDenied // a privilege is missing
	errParse                = mysqldialect.ErrParse                // a statement this version does not know
)

// checkServer checks that the server db points at can feed the relay, and that
// clientServerID (the id the binlog client registers with) is free. It refuses, with an
// error that wraps outbox.ErrInvalidConfig and names the fix, in this order, when:
//   - the binary log is off (log_bin, which needs a restart);
//   - binlog_format is not ROW globally: STATEMENT and MIXED log InnoDB inserts as
//     statements, which carry no row values;
//   - binlog_row_image is MINIMAL, which leaves out the columns an INSERT did not name
//     (the status and times its defaults fill in);
//   - binlog_row_metadata is not FULL, without which the binlog carries no column names
//     (servers before MariaDB 10.5 and MySQL 8.0 lack the setting);
//   - the account lacks REPLICATION SLAVE (to stream the binlog) or REPLICATION CLIENT
//     (MariaDB 10.5+: BINLOG MONITOR; to read the binlog's position);
//   - clientServerID is 0, the server's own @@server_id, or a registered replica's: the
//     server disconnects a replica when another client registers with its id.
//
// A session may still set binlog_format itself; the relay's reader detects the statements
// such a session logs, so the check looks only at the global format.
//
// How privileges are learnt, from the servers' documentation and, for MariaDB, tried on
// MariaDB 10.11: REPLICATION CLIENT by probing SHOW BINARY LOGS, which needs it (or SUPER)
// on both servers, so that privileges held through roles or SUPER count as the server
// counts them. REPLICATION SLAVE has no harmless probe on MariaDB (SHOW SLAVE HOSTS needs
// REPLICATION MASTER ADMIN there since 10.5.2), so on MariaDB the global grants of SHOW
// GRANTS are read: without FOR, MariaDB lists the grants of the active roles too, which
// SHOW GRANTS FOR CURRENT_USER() leaves out. On MySQL, SHOW REPLICAS (SHOW SLAVE HOSTS
// before 8.0.22) needs REPLICATION SLAVE, and MySQL's SHOW GRANTS shows neither the
// privileges of roles nor ALL PRIVILEGES at the global level, so the probe decides there.
// The MySQL paths follow MySQL's documentation and were not run against a MySQL server.
//
// A registered replica is any client that registered with the server, including another
// relay instance streaming with the same id: instances of one deployment that may stream
// at the same time need ids of their own.
func checkServer(ctx context.Context, db *sql.DB, clientServerID uint32) (serverInfo, error) {
	return checkServerFor(ctx, db, clientServerID, false)
}

// checkServerFor is checkServer; streamingHere says that the relay of the same table that
// leads now holds clientServerID (see Relay.serverIDHolder): a registered replica with the
// id is its binlog stream, which a standby of the table does not disturb until it leads.
func checkServerFor(ctx context.Context, db *sql.DB, clientServerID uint32, streamingHere bool) (serverInfo, error) {
	vars, err := globalVariables(ctx, db)
	if err != nil {
		return serverInfo{}, err
	}
	info, err := checkSettings(vars)
	if err != nil {
		return info, err
	}
	account, err := currentUser(ctx, db)
	if err != nil {
		return info, err
	}
	var missing []string
	var replicas []replicaHost
	listed := false
	if info.flavor == gomysql.MariaDBFlavor {
		grants, err := globalGrants(ctx, db)
		if err != nil {
			return info, err
		}
		if !grants.has("REPLICATION SLAVE", "REPLICATION REPLICA") {
			missing = append(missing, "REPLICATION SLAVE")
		}
	} else {
		replicas, err = listReplicas(ctx, db, info.flavor)
		switch {
		case isAccessDenied(err):
			missing = append(missing, "REPLICATION SLAVE")
		case err != nil:
			return info, err
		default:
			listed = true
		}
	}
	if err := probe(ctx, db, "SHOW BINARY LOGS"); isAccessDenied(err) {
		if info.flavor == gomysql.MariaDBFlavor {
			missing = append(missing, "BINLOG MONITOR")
		} else {
			missing = append(missing, "REPLICATION CLIENT")
		}
	} else if err != nil {
		return info, fmt.Errorf("relay: check the server: SHOW BINARY LOGS: %w", err)
	}
	if len(missing) > 0 {
		return info, grantError(info.flavor, account, missing)
	}

	switch {
	case clientServerID == 0:
		return info, fmt.Errorf("%w: relay: the binlog client's server id (Config.ServerID) must not be 0: "+
			"set it to a number unique among the server (server_id %d) and its replicas", outbox.ErrInvalidConfig, info.serverID)
	case clientServerID == info.serverID:
		return info, fmt.Errorf("%w: relay: the binlog client's server id (Config.ServerID) %d is the server's own server_id: "+
			"choose another id, unique among the server and its replicas", outbox.ErrInvalidConfig, clientServerID)
	}
	if info.flavor == gomysql.MariaDBFlavor {
		replicas, err = listReplicas(ctx, db, info.flavor)
		switch {
		case isAccessDenied(err):
			info.replicasUnchecked = fmt.Sprintf("the account may not list the replicas (SHOW SLAVE HOSTS), so the binlog client's "+
				"server id %d was not compared with theirs: %s lets the relay check it", clientServerID,
				"GRANT REPLICATION MASTER ADMIN ON *.* TO "+account)
		case err != nil:
			return info, err
		default:
			listed = true
		}
	}
	if listed && !streamingHere {
		for _, r := range replicas {
			if r.serverID == clientServerID {
				return info, fmt.Errorf("%w: relay: the binlog client's server id (Config.ServerID) %d is taken by the replica %s: choose an id no replica uses",
					outbox.ErrInvalidConfig, clientServerID, r)
			}
		}
	}
	return info, nil
}

// relayVariables are the server variables checkServer reads.
var relayVariables = []string{
	"version", "log_bin", "binlog_format", "binlog_row_image", "binlog_row_metadata",
	"server_id", "gtid_binlog_pos", "gtid_executed", "gtid_mode",
	"sync_binlog", "innodb_flush_log_at_trx_commit",
}

// globalVariables reads relayVariables with SHOW GLOBAL VARIABLES, which needs no
// privilege and leaves out, rather than fails on, a variable the server does not have.
func globalVariables(ctx context.Context, db *sql.DB) (map[string]string, error) {
	query := "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('" + strings.Join(relayVariables, "', '") + "')"
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("relay: check the server: read its variables: %w", err)
	}
	defer rows.Close()
	vars := map[string]string{}
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return nil, fmt.Errorf("relay: check the server: read its variables: %w", err)
		}
		vars[strings.ToLower(name)] = value
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("relay: check the server: read its variables: %w", err)
	}
	return vars, nil
}

// checkSettings checks the server's binlog settings, read by globalVariables, in
// checkServer's order, and returns what it learnt of the server.
func checkSettings(vars map[string]string) (serverInfo, error) {
	info := serverInfo{
		flavor:   gomysql.MySQLFlavor,
		version:  vars["version"],
		rowImage: strings.ToUpper(vars["binlog_row_image"]),
	}
	if strings.Contains(vars["version"], "MariaDB") {
		info.flavor = gomysql.MariaDBFlavor
		info.gtidPos = vars["gtid_binlog_pos"]
	} else {
		info.gtidPos = strings.ReplaceAll(vars["gtid_executed"], "\n", "")
	}
	if id, err := strconv.ParseUint(vars["server_id"], 10, 32); err == nil {
		info.serverID = uint32(id)
	}
	// How to change a dynamic setting for good: MySQL 8's SET PERSIST also writes it to
	// mysqld-auto.cnf; MariaDB has no SET PERSIST, so its option file must say it too.
	set := func(name, value string) string {
		if info.flavor == gomysql.MySQLFlavor {
			return fmt.Sprintf("run SET PERSIST %s = '%s' (no restart needed; PERSIST keeps it across restarts)", name, value)
		}
		return fmt.Sprintf("run SET GLOBAL %s = '%s' (no restart needed) and put %s=%s in the server's option file, "+
			"so that a restart keeps it", name, value, name, value)
	}
	invalid := func(format string, args ...any) (serverInfo, error) {
		return info, fmt.Errorf("%w: relay: "+format, append([]any{outbox.ErrInvalidConfig}, args...)...)
	}

	if logBin := strings.ToUpper(vars["log_bin"]); logBin != "ON" && logBin != "1" {
		return invalid("the server's binary log is off (log_bin=%s): start the server with --log-bin "+
			"(log_bin in its option file) and --binlog-format=ROW; log_bin cannot change while the server runs, "+
			"so this needs a restart", orNone(vars["log_bin"]))
	}
	if format := strings.ToUpper(vars["binlog_format"]); format != "ROW" {
		return invalid("the server logs binlog_format=%s, which logs InnoDB inserts as statements the relay cannot read: "+
			"%s; sessions already connected keep their format until they reconnect, and the relay hands over to polling "+
			"when it meets their statements", orNone(vars["binlog_format"]), set("binlog_format", "ROW"))
	}
	if info.rowImage != "FULL" && info.rowImage != "NOBLOB" {
		return invalid("the server logs binlog_row_image=%s, which leaves out the columns an INSERT did not name "+
			"(the status and times their defaults fill in): %s",
			orNone(vars["binlog_row_image"]), set("binlog_row_image", "FULL"))
	}
	metadata, ok := vars["binlog_row_metadata"]
	if !ok {
		return invalid("the server (version %s) has no binlog_row_metadata setting, without which its binlog carries no "+
			"column names: the relay needs MariaDB 10.5 or later, or MySQL 8.0 or later, with binlog_row_metadata=FULL",
			orNone(info.version))
	}
	if strings.ToUpper(metadata) != "FULL" {
		return invalid("the server logs binlog_row_metadata=%s, so its binlog carries no column names for the relay to map "+
			"the outbox table's columns by: %s", orNone(metadata), set("binlog_row_metadata", "FULL"))
	}
	// The relay resumes by GTID. MariaDB always has GTIDs; MySQL only with gtid_mode=ON.
	if info.flavor == gomysql.MySQLFlavor && strings.ToUpper(vars["gtid_mode"]) != "ON" {
		return invalid("the server runs gtid_mode=%s, and the relay records and resumes its position by GTID: set "+
			"enforce_gtid_consistency=ON and gtid_mode=ON (online, in the steps MySQL's manual gives: OFF_PERMISSIVE, "+
			"ON_PERMISSIVE, then ON), or start the server with --gtid-mode=ON --enforce-gtid-consistency=ON",
			orNone(vars["gtid_mode"]))
	}
	info.durability = durabilityWarnings(vars)
	return info, nil
}

// durabilityWarnings returns a warning for each setting that leaves a committed transaction
// unsynced. They are warnings, not refusals: they are the server's choice for every writer
// (MariaDB ships with sync_binlog=0), the relay cannot change them, and it works with them
// until the machine or the server crashes; what they risk then is told, with the fix.
func durabilityWarnings(vars map[string]string) []string {
	var out []string
	if v, ok := vars["sync_binlog"]; ok && v == "0" {
		out = append(out, "the server runs sync_binlog=0: its binary log is not synced at each commit, so a crash of its "+
			"machine can lose a binlog tail whose transactions the tables kept, or whose events the relay already published: "+
			"those events are then read by no binlog stream (they wait until a later term sweeps the table), or were published "+
			"for transactions the server no longer has; set sync_binlog=1 (SET GLOBAL sync_binlog = 1, and in the server's option file)")
	}
	if v, ok := vars["innodb_flush_log_at_trx_commit"]; ok && (v == "0" || v == "2") {
		what := "a crash of the server or its machine"
		if v == "2" {
			what = "a crash of the server's machine"
		}
		out = append(out, "the server runs innodb_flush_log_at_trx_commit="+v+": InnoDB does not sync its log at each commit, so "+
			what+" can lose about the last second of committed transactions, whose events the relay may already have published "+
			"(consumers then hold events of rows the database no longer has); set innodb_flush_log_at_trx_commit=1 "+
			"(SET GLOBAL innodb_flush_log_at_trx_commit = 1, and in the server's option file)")
	}
	return out
}

func orNone(v string) string {
	if v == "" {
		return "(empty)"
	}
	return v
}

// currentUser returns the account the server authenticated the session as, quoted for a
// GRANT statement: 'user'@'host'.
func currentUser(ctx context.Context, db *sql.DB) (string, error) {
	var cur string
	if err := db.QueryRowContext(ctx, "SELECT CURRENT_USER()").Scan(&cur); err != nil {
		return "", fmt.Errorf("relay: check the server: SELECT CURRENT_USER(): %w", err)
	}
	// The user name may hold an @; the host cannot.
	user, host := cur, ""
	if i := strings.LastIndexByte(cur, '@'); i >= 0 {
		user, host = cur[:i], cur[i+1:]
	}
	quote := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	return quote(user) + "@" + quote(host), nil
}

// grantError is the refusal for the privileges missing, with the GRANT statement that
// gives them to account.
func grantError(flavor, account string, missing []string) error {
	what := "REPLICATION SLAVE (to stream the binlog)"
	switch {
	case len(missing) == 2:
		what = "REPLICATION SLAVE (to stream the binlog) and " + missing[1] + " (to read the binlog's files and position)"
	case missing[0] != "REPLICATION SLAVE":
		what = missing[0] + " (to read the binlog's files and position)"
	}
	if flavor == gomysql.MariaDBFlavor && strings.Contains(what, "BINLOG MONITOR") {
		what += "; BINLOG MONITOR is REPLICATION CLIENT's name since MariaDB 10.5"
	}
	return fmt.Errorf("%w: relay: the account %s lacks %s: run GRANT %s ON *.* TO %s",
		outbox.ErrInvalidConfig, account, what, strings.Join(missing, ", "), account)
}

// privileges is a set of global privileges, by their upper-case names.
type privileges map[string]bool

// has reports whether the set holds any of names, or ALL PRIVILEGES.
func (p privileges) has(names ...string) bool {
	if p["ALL PRIVILEGES"] || p["ALL"] {
		return true
	}
	for _, n := range names {
		if p[n] {
			return true
		}
	}
	return false
}

// globalGrants reads SHOW GRANTS (the current account's, and on MariaDB its active
// roles') and returns the privileges granted ON *.*.
func globalGrants(ctx context.Context, db *sql.DB) (privileges, error) {
	rows, err := db.QueryContext(ctx, "SHOW GRANTS")
	if err != nil {
		return nil, fmt.Errorf("relay: check the server: SHOW GRANTS: %w", err)
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return nil, fmt.Errorf("relay: check the server: SHOW GRANTS: %w", err)
		}
		lines = append(lines, line)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("relay: check the server: SHOW GRANTS: %w", err)
	}
	return parseGlobalGrants(lines), nil
}

// parseGlobalGrants returns the privileges that lines of SHOW GRANTS grant ON *.*, e.g.
// "GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `relay`@`%`". Grants on a database,
// table or routine, of roles ("GRANT `r` TO ...") and of PROXY are not global and are
// left out. Global privileges never carry column lists, so the list splits on commas.
func parseGlobalGrants(lines []string) privileges {
	p := privileges{}
	for _, line := range lines {
		upper := strings.ToUpper(strings.TrimSpace(line))
		rest, ok := strings.CutPrefix(upper, "GRANT ")
		if !ok {
			continue
		}
		list, _, ok := strings.Cut(rest, " ON *.* TO ")
		if !ok {
			continue
		}
		for _, priv := range strings.Split(list, ",") {
			p[strings.Join(strings.Fields(priv), " ")] = true
		}
	}
	return p
}

// replicaHost is a row of SHOW SLAVE HOSTS / SHOW REPLICAS.
type replicaHost struct {
	serverID uint32
	host     string
	port     string
}

// String names the replica by its server id and reported host and port.
func (r replicaHost) String() string {
	host := r.host
	if host == "" {
		host = "(no report_host)"
	}
	return fmt.Sprintf("with server_id %d at %s:%s", r.serverID, host, r.port)
}

// listReplicas lists the replicas registered with the server: SHOW SLAVE HOSTS on
// MariaDB, SHOW REPLICAS on MySQL 8.0.22 and later, SHOW SLAVE HOSTS before. Its error is
// the server's own when a privilege is missing (see isAccessDenied).
func listReplicas(ctx context.Context, db *sql.DB, flavor string) ([]replicaHost, error) {
	query := "SHOW SLAVE HOSTS"
	if flavor == gomysql.MySQLFlavor {
		query = "SHOW REPLICAS"
	}
	rows, err := db.QueryContext(ctx, query)
	if flavor == gomysql.MySQLFlavor && serverErrorNumber(err) == errParse {
		query = "SHOW SLAVE HOSTS"
		rows, err = db.QueryContext(ctx, query)
	}
	if isAccessDenied(err) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("relay: check the server: %s: %w", query, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, fmt.Errorf("relay: check the server: %s: %w", query, err)
	}
	idCol, hostCol, portCol := -1, -1, -1
	for i, c := range cols {
		switch strings.ToLower(c) {
		case "server_id":
			idCol = i
		case "host":
			hostCol = i
		case "port":
			portCol = i
		}
	}
	if idCol < 0 {
		return nil, fmt.Errorf("relay: check the server: %s has no Server_id column (it has %v)", query, cols)
	}
	var out []replicaHost
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, fmt.Errorf("relay: check the server: %s: %w", query, err)
		}
		id, err := strconv.ParseUint(vals[idCol].String, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("relay: check the server: %s: Server_id %q: %w", query, vals[idCol].String, err)
		}
		r := replicaHost{serverID: uint32(id)}
		if hostCol >= 0 {
			r.host = vals[hostCol].String
		}
		if portCol >= 0 {
			r.port = vals[portCol].String
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("relay: check the server: %s: %w", query, err)
	}
	return out, nil
}

// probe runs a statement for its permission check alone and discards its rows.
func probe(ctx context.Context, db *sql.DB, query string) error {
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
	}
	return rows.Err()
}

// isAccessDenied reports whether err is the server's refusal for a missing privilege.
func isAccessDenied(err error) bool {
	return serverErrorNumber(err) == errSpecificAccessDenied
}

func serverErrorNumber(err error) uint16 { return mysqldialect.Number(err) }

// preflight runs Start's checks once: the server and the account's replication grants
// (checkServer), the account's grants on the two tables, the tables, the store's ordering
// and the ServerID's binlog stream. It returns an error wrapping outbox.ErrInvalidConfig for
// what the relay cannot run with, another error when the server cannot be reached, and logs
// the warnings.
func (r *Relay) preflight(ctx context.Context) (serverInfo, error) {
	holder, here, err := r.serverIDHolder(ctx)
	if err != nil {
		return serverInfo{}, err
	}
	info, err := checkServerFor(ctx, r.db, r.cfg.ServerID, here)
	if err != nil {
		return info, err
	}
	if err := r.checkGrants(ctx); err != nil {
		return info, err
	}
	if err := r.checkTables(ctx); err != nil {
		return info, err
	}
	if err := r.checkOrdering(ctx); err != nil {
		return info, err
	}
	if holder != 0 && !here {
		return info, r.serverIDTaken()
	}
	for _, w := range info.durability {
		r.cfg.Logger.WarnContext(ctx, "relay: "+w)
	}
	if info.replicasUnchecked != "" {
		r.cfg.Logger.WarnContext(ctx, "relay: "+info.replicasUnchecked, slog.Uint64("server_id", uint64(r.cfg.ServerID)))
	}
	return info, nil
}

// checkGrants checks the account's privileges on the outbox and checkpoint tables, as the
// server counts them (roles, database and global grants included), by running for each a
// statement that needs it and changes nothing: a SELECT of no row, and EXPLAIN of an
// INSERT or UPDATE, which needs the privileges of the statement it explains (MariaDB and
// MySQL alike) and runs nothing. A table that does not exist is left to checkTables.
func (r *Relay) checkGrants(ctx context.Context) error {
	out, cp := mysqldialect.Quote(r.cfg.Table), mysqldialect.Quote(r.cfg.CheckpointTable)
	probes := []struct {
		priv, table, role, query string
	}{
		{"SELECT", r.cfg.Table, "the outbox table", "SELECT id FROM " + out + " WHERE FALSE"},
		{"UPDATE", r.cfg.Table, "the outbox table", "EXPLAIN UPDATE " + out + " SET status = 'SUCCESS' WHERE FALSE"},
		{"SELECT", r.cfg.CheckpointTable, "the checkpoint table", "SELECT outbox_table FROM " + cp + " WHERE FALSE"},
		{"INSERT", r.cfg.CheckpointTable, "the checkpoint table", "EXPLAIN INSERT INTO " + cp + " (outbox_table) VALUES ('')"},
		{"UPDATE", r.cfg.CheckpointTable, "the checkpoint table", "EXPLAIN UPDATE " + cp + " SET mode = 'relay' WHERE FALSE"},
	}
	var lacks []string
	grants := map[string][]string{} // table -> privileges it lacks, in probe order
	var tables []string
	for _, p := range probes {
		err := probe(ctx, r.db, p.query)
		switch serverErrorNumber(err) {
		case 0:
			if err != nil {
				return fmt.Errorf("relay: check the account's grants: %w", err)
			}
			continue
		case mysqldialect.ErrTableAccessDenied, mysqldialect.ErrColumnAccessDenied:
		case mysqldialect.ErrNoSuchTable, mysqldialect.ErrBadField:
			continue // checkTables names it
		default:
			return fmt.Errorf("relay: check the account's grants: %s: %w", p.query, err)
		}
		lacks = append(lacks, fmt.Sprintf("%s on %s %s.%s", p.priv, p.role, r.conn.DBName, p.table))
		if grants[p.table] == nil {
			tables = append(tables, p.table)
		}
		grants[p.table] = append(grants[p.table], p.priv)
	}
	if len(lacks) == 0 {
		return nil
	}
	account, err := currentUser(ctx, r.db)
	if err != nil {
		return err
	}
	fix := make([]string, 0, len(tables))
	for _, t := range tables {
		fix = append(fix, fmt.Sprintf("GRANT %s ON %s.%s TO %s;", strings.Join(grants[t], ", "), mysqldialect.Quote(r.conn.DBName), mysqldialect.Quote(t), account))
	}
	return fmt.Errorf("%w: relay: the account %s lacks %s: run %s", outbox.ErrInvalidConfig, account,
		strings.Join(lacks, ", "), strings.Join(fix, " "))
}

// checkOrdering checks, as the store's Check does, that the outbox table can serve the
// relay's Ordering (key order needs the table's order index and its SKIPPED status).
func (r *Relay) checkOrdering(ctx context.Context) error {
	if r.cfg.Ordering == outbox.Unordered {
		return nil
	}
	store, err := outbox.NewMySQLStore(r.db, outbox.MySQLConfig{Table: r.cfg.Table, Ordering: r.cfg.Ordering, Routes: r.cfg.Routes})
	if err != nil {
		return fmt.Errorf("relay: Ordering %s: %w", r.cfg.Ordering, err)
	}
	if _, err := store.Check(ctx); err != nil {
		return fmt.Errorf("relay: Config.Ordering %s (the store's MySQLConfig.Ordering): %w", r.cfg.Ordering, err)
	}
	return nil
}

// serverIDLock is the GET_LOCK name a leader holds on its lock connection while it leads,
// and so while it streams the binlog with server id id. Lock names are the server's, across
// its databases, as server ids are: the lock tells a relay of another table, or database,
// that the id is taken, whatever its grants (listing the registered replicas needs
// REPLICATION MASTER ADMIN on MariaDB).
func serverIDLock(id uint32) string {
	return "outbox-relay-server-id:" + strconv.FormatUint(uint64(id), 10)
}

// serverIDHolder returns the connection that holds the ServerID's lock (0 when none), and
// whether that connection leads this relay's table: a standby of the same table, which
// streams only once it leads (and so once that connection has ended).
func (r *Relay) serverIDHolder(ctx context.Context) (holder int64, here bool, err error) {
	var id, table sql.NullInt64
	if err := r.db.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?), IS_USED_LOCK("+r.lockName()+")", serverIDLock(r.cfg.ServerID)).
		Scan(&id, &table); err != nil {
		return 0, false, fmt.Errorf("relay: check the server id's lock: %w", err)
	}
	if !id.Valid {
		return 0, false, nil
	}
	return id.Int64, table.Valid && table.Int64 == id.Int64, nil
}

// serverIDTaken is the refusal for a ServerID another relay's binlog stream holds.
func (r *Relay) serverIDTaken() error {
	return fmt.Errorf("%w: relay: server id (Config.ServerID) %d is in use by the binlog stream of a relay of another table "+
		"than %s.%s: give each table's relays their own ServerID", outbox.ErrInvalidConfig, r.cfg.ServerID, r.conn.DBName, r.cfg.Table)
}

// lockServerID takes the ServerID's lock on the leader's lock connection, before its term
// streams the binlog; the lock ends with the connection. A relay of another table that
// holds it (it started streaming after this relay's Start) ends the run: the error wraps
// outbox.ErrInvalidConfig.
func (r *Relay) lockServerID(ctx context.Context, lock *sql.Conn) error {
	var got sql.NullInt64
	if err := lock.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", serverIDLock(r.cfg.ServerID)).Scan(&got); err != nil {
		return fmt.Errorf("relay: GET_LOCK of the server id: %w", err)
	}
	if got.Int64 == 1 {
		return nil
	}
	return r.serverIDTaken()
}
