// Package storename is the rule for a store's name (outbox.Config.StoreName): a metric
// label's value, so bounded. The library and outboxctl both check names by it, so that the
// names an operator types are the ones the logs, metrics and Health show.
package storename

import (
	"fmt"
	"regexp"
)

// MaxLen is the longest name, in bytes.
const MaxLen = 64

var valid = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

// Check says what is wrong with name, in words that follow the name ("... is 65 bytes
// long, at most 64"), or returns nil.
func Check(name string) error {
	switch {
	case len(name) > MaxLen:
		return fmt.Errorf("is %d bytes long, at most %d", len(name), MaxLen)
	case !valid.MatchString(name):
		return fmt.Errorf("is not a bounded label: want 1 to %d ASCII letters, digits, '_', '-' or '.', beginning with a letter or a digit", MaxLen)
	}
	return nil
}
