package outbox

// StatsQueryForTest returns the statement [MySQLStore.Stats] runs, so that the tests EXPLAIN
// the real text.
func StatsQueryForTest(s *MySQLStore, countSucceeded, sentPerMinute bool) string {
	return s.statsQuery(countSucceeded, countSucceeded, sentPerMinute)
}
