package errwrap_test

import (
	"testing"

	"golang.org/x/tools/go/analysis/analysistest"

	"github.com/go-outbox/outbox/tools/errwrap"
)

// The analyzer reports each `want` line of testdata/src/a and nothing else: %v and %s of an
// error in fmt.Errorf (with flags, '*' widths and explicit indexes), an error's text given to
// log/slog; not %w, %T, %%, a string, or a test file.
func TestAnalyzer(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), errwrap.Analyzer, "a")
}
