// Package console is an operator's web console for outbox tables and inboxes: an
// [http.Handler] that shows each store's counts, relay and throughput, its dead letters
// (payload, failure history, the message properties the broker will see), the keys they
// block, and each inbox's rejected messages, and lets an operator requeue or skip dead
// letters and replay or resend rejected messages, one at a time or, for dead letters, all
// those a filter selects after a dry-run count.
//
// It reads and writes through the library's own calls ([outbox.Admin], [outbox.MySQLStore.Stats],
// [inbox.Inbox.Rejected], [inbox.Inbox.Replay], [inbox.Inbox.Resend]) and runs no SQL of its
// own: what an operator does here is what outboxctl does.
//
// A service mounts the handler under a path of its choice ([Config.Prefix]) behind its own
// authentication middleware; the console authenticates nobody. It is read-only unless
// [Config.AllowWrites] is set. Every write is a POST carrying a CSRF token bound to a cookie
// and passing [http.CrossOriginProtection], and each is recorded as one audit record on
// [Config.Logger]. Every page is rendered with html/template, so that markup in a payload, a
// biz no or an error shows as text. See docs/console.md.
package console
