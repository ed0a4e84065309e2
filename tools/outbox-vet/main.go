// Command outbox-vet runs the project's own analyzers as a vet tool, over the packages go vet
// is given:
//
//	go -C tools build -o /tmp/outbox-vet ./outbox-vet
//	go vet -vettool=/tmp/outbox-vet ./...
//
// errwrap: an error formatted with %v or %s in fmt.Errorf (wrap it with %w), or turned into
// text in a log/slog call (pass the error), in non-test files.
package main

import (
	"golang.org/x/tools/go/analysis/unitchecker"

	"github.com/go-outbox/outbox/tools/errwrap"
)

func main() { unitchecker.Main(errwrap.Analyzer) }
