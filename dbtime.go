package outbox

import (
	"fmt"
	"time"
)

// dbTime scans a DATETIME column whether or not the DSN has parseTime=true; NULL scans as the
// zero time. The column holds UTC.
type dbTime struct{ t *time.Time }

func (d dbTime) Scan(v any) error {
	switch x := v.(type) {
	case nil:
		*d.t = time.Time{}
	case time.Time:
		*d.t = x
	case []byte:
		return d.parse(string(x))
	case string:
		return d.parse(x)
	default:
		return fmt.Errorf("outbox: cannot scan %T into a time", v)
	}
	return nil
}

func (d dbTime) parse(s string) error {
	t, err := time.ParseInLocation("2006-01-02 15:04:05.999999", s, time.UTC)
	if err != nil {
		return fmt.Errorf("outbox: cannot parse time %q: %w", s, err)
	}
	*d.t = t
	return nil
}
