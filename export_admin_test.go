package outbox

// EventIDQueryForTest returns the statement that finds an event id's row, with n forms of
// the id, so that the tests EXPLAIN the real text.
func EventIDQueryForTest(s *MySQLStore, n int) string { return s.eventIDQuery(n) }
