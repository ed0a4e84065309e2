package relay

import "testing"

// partitionMaintenance matches the outbox purge's own partition statements on the table,
// whole, and nothing else that names it.
func TestPartitionMaintenanceStatements(t *testing.T) {
	t.Parallel()
	re := partitionMaintenance("t_event_record")
	for _, c := range []struct {
		q    string
		want bool
	}{
		{"ALTER TABLE `t_event_record` DROP PARTITION `p1000`", true},
		{"ALTER TABLE `t_event_record` DROP PARTITION `p1000`, `p2000`", true},
		{"alter table t_event_record drop partition p1000", true},
		{"ALTER TABLE `t_event_record` REORGANIZE PARTITION `pmax` INTO (PARTITION p4000 VALUES LESS THAN (4000), " +
			"PARTITION p5000 VALUES LESS THAN (5000), PARTITION `pmax` VALUES LESS THAN MAXVALUE)", true},
		{"ALTER TABLE `t_event_record` ADD PARTITION (PARTITION p4000 VALUES LESS THAN (4000))", true},
		{"ALTER TABLE `t_event_record` TRUNCATE PARTITION p1000", false},
		{"ALTER TABLE `t_event_record` EXCHANGE PARTITION p1000 WITH TABLE other", false},
		{"ALTER TABLE `t_event_record` DROP PARTITION p1000, ADD COLUMN x INT", false},
		{"ALTER TABLE `t_event_record` ADD COLUMN note VARCHAR(16) NULL", false},
		{"ALTER TABLE `t_event_record` REORGANIZE PARTITION p1 INTO (PARTITION p2 VALUES LESS THAN (10))", false},
		{"ALTER TABLE `t_event_record_2` DROP PARTITION p1000", false},
		{"ALTER TABLE other.t_event_record DROP PARTITION p1000", false},
		{"ALTER TABLE `t_event_record` DROP PARTITION p1000; DELETE FROM t_event_record", false},
		{"TRUNCATE TABLE t_event_record", false},
	} {
		if got := re.MatchString(c.q); got != c.want {
			t.Errorf("%q: matched %v, want %v", c.q, got, c.want)
		}
	}
}
