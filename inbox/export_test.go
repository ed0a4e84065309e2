package inbox

// RetentionLockForTest is the SQL expression of the named lock Purge holds, for tests that
// hold it themselves.
func RetentionLockForTest(in *Inbox) string { return in.q.retainLock }

// RecordForTest is the statement that records eventID: the duplicate check.
func RecordForTest(in *Inbox, eventID string) string { return in.q.record(eventID) }

// RejectedByEventIDQueryForTest is the statement RejectedByEventID runs, for a test that
// EXPLAINs it.
func RejectedByEventIDQueryForTest(in *Inbox) string { return in.q.getRejectedByEvent }

// RejectedQueryForTest is the statement Rejected runs, for a test that EXPLAINs it.
func RejectedQueryForTest(in *Inbox) string { return in.q.rejected }
