// Package relay publishes an outbox table's events by reading the database's binary log
// instead of polling the table: an opt-in mode of github.com/go-outbox/outbox for MySQL and
// MariaDB servers that log rows (binlog_format=ROW).
//
// A [Relay] is started with [Relay.Start], which refuses, with an error wrapping
// outbox.ErrInvalidConfig that names the fix, what the server, the account or the tables
// lack, and closed with [Relay.Close]; see docs/relay.md for the grants it needs.
//
// It is a module of its own so that services which poll never download the binlog client
// (github.com/go-mysql-org/go-mysql) and its dependencies.
package relay

import (
	_ "github.com/go-mysql-org/go-mysql/replication" // the binlog client, used by relay.go
	_ "github.com/go-outbox/outbox"
)
