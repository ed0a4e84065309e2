package outbox

// ScanQueriesForTest returns the candidate and reclaim statements as the store runs them, so
// that the tests EXPLAIN the real text.
func ScanQueriesForTest(s *MySQLStore) (candidates, reclaim string) {
	return s.q.candidates, s.q.expired
}
