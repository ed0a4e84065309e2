// Package outbox is a transactional-outbox publisher for services that write to MySQL and
// publish to Apache RocketMQ.
//
// A service writes its business rows and an event row in one database transaction:
//
//	tx, err := store.BeginTx(ctx, nil)
//	// ... INSERT INTO orders ... through tx ...
//	eventID, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: "ORD-1", EventType: "ORDER_CREATED", Payload: body})
//	err = tx.Commit()
//
// If the transaction rolls back, so does the event; once it commits, the event can no longer
// be lost. A [Publisher], started with [Publisher.Start] in every instance of the service and
// ended with [Publisher.Close], scans the outbox table and sends each event through a
// [Sender]:
//
//	publisher, err := outbox.NewPublisher(store, sender, outbox.Config{})
//	if err := publisher.Start(ctx); err != nil {
//		return err // what keeps it from running, reported before anything runs
//	}
//	defer publisher.Close() // stops it, waits for its last sends, closes the sender
//
// Consumers deduplicate on the eventId message property, the event id InsertEvent returned.
//
// Three audiences, three parts of the API: business code meets [MySQLStore.BeginTx],
// [MySQLStore.WrapTx] and [Tx.InsertEvent]; a publisher calls the [Store] methods, which
// a store for another database implements (package outboxtest checks it); operators use
// [Admin] (and the outboxctl command) to look at and repair events.
//
// # Ownership
//
// Several instances scan the same table, and an instance owns a row only when its own claim
// changed it. By default one short transaction locks up to [Tuning.BatchSize] due rows with
// SELECT ... FOR UPDATE SKIP LOCKED, skipping rows other instances are claiming, and claims
// exactly those. (The instances' locking SELECTs take turns on a named lock, which orders
// them and protects nothing: see [MySQLConfig.ConcurrentClaims].) In the design article's
// per-row mode ([Tuning.ClaimPerRow]) a lock-free SELECT finds candidates, and the
// conditional claim
//
//	UPDATE ... SET status = 'SENDING', claim_owner = ? ... WHERE id = ? AND status = 'WAIT'
//
// decides ownership by its affected-row count. Every later write (success, retry, dead
// letter) is conditioned on status = 'SENDING' AND claim_owner = the claimer, so an instance
// that lost its lease can never overwrite the state another instance wrote. A claim whose
// holder died is a lease: the reclaim loop returns SENDING rows whose claimed_at is older
// than [Tuning.Lease] to WAIT.
//
// # Guarantee
//
// Delivery is at least once. An event whose transaction committed is sent, unless it is
// dead-lettered after [Config.MaxAttempts] attempts, or as a poison event after
// [Tuning.MaxReclaims] reclaims (and then [Config.OnDeadLetter] is told). A fault alone
// never dead-letters: a send that fails because the broker is unavailable ([Unavailable])
// spends no retry, and the publisher pauses its claims and probes until the broker answers.
// In normal operation it is sent once; after a crash, or a send that outlives the lease, it
// may be sent twice, so consumers must be idempotent: they deduplicate on the eventId
// property, the event's [Event.EventID]. That is a UUIDv7 generated once at insert and stored
// in the row (a version-1 UUID from the database for a row another program wrote with plain
// SQL), so every send of the event carries it, and no other event ever has it. The row
// id is no substitute: it is unique in one table only, and repeats when the table is
// recreated or truncated, a backup is restored, or two tables or services publish to one
// topic, and a consumer keyed on it would drop new events as duplicates of old ones.
//
// # Sharing
//
// A *sql.DB and a [MySQLStore] may serve any number of goroutines, business transactions
// and publishers in a process. A [Sender] belongs to the one publisher it is given to:
// [Publisher.Close] closes it. A service that publishes several databases (shards, a
// database per tenant) runs a publisher per database through one sender instead: each
// names its store ([Config.StoreName], on its logs, metrics and [Health]) and sets
// [Config.SharedSender], so that its Close leaves the sender open, and the service closes
// the sender once after them (see docs/many-databases.md). Every publisher of a table needs an InstanceID of its own
// ([DefaultInstanceID] makes a new one on each call, the default), and every store of a
// table the same [MySQLConfig.Ordering]. A [Tx] is one transaction: one goroutine at a
// time, as a *sql.Tx.
//
// # Clocks
//
// Every lease and retry time is computed by the database (UTC_TIMESTAMP(3), the database's
// NOW() read in UTC so that sessions with different time_zone settings agree), never by the
// application: instances whose clocks disagree still agree on who holds a lease.
package outbox
