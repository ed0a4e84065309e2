package a

import "fmt"

// Test files are not checked.
func g(err error) error { return fmt.Errorf("%v", err) }
