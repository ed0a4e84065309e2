package outbox_test

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// goBlockRE finds the Go code blocks of a Markdown text.
var goBlockRE = regexp.MustCompile("(?s)```go\n(.*?)```")

// The README's quick start is correct to copy: its Go blocks, in order, make one function
// that compiles and vets against the package as it is, and it closes the sender only after
// Run has returned (a deferred Close beside `go publisher.Run(ctx)` can run first, and the
// sends after it fail).
func TestReadmeQuickStartCompiles(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	text := string(readme)
	start := strings.Index(text, "\n## Quick start\n")
	require.GreaterOrEqual(t, start, 0, "the README has a Quick start section")
	section := text[start+1:]
	if end := regexp.MustCompile(`\n##+ `).FindStringIndex(section[3:]); end != nil {
		section = section[:end[0]+3]
	}
	var body strings.Builder
	for _, m := range goBlockRE.FindAllStringSubmatch(section, -1) {
		body.WriteString(m[1])
		body.WriteString("\n")
	}
	require.Contains(t, body.String(), "publisher.Run(", "the quick start runs the publisher")

	src := `package testsvc

import (
	"context"
	"database/sql"
	"log/slog"

	"github.com/go-outbox/outbox"
)

var _ = slog.Default

// quickStart is the README's quick start; its parameters are what the text leaves to the
// reader.
func quickStart(ctx context.Context, db *sql.DB, no string, uid int, body []byte, alert func(outbox.Event, error)) error {
` + body.String() + `	return err
}
`
	// Vetted as one more file of a package of the module (internal/testsvc, which imports
	// the outbox package already), given through an overlay: nothing is written into the
	// repository.
	wd, err := os.Getwd()
	require.NoError(t, err)
	dir := t.TempDir()
	file := filepath.Join(dir, "quickstart.go")
	require.NoError(t, os.WriteFile(file, []byte(src), 0o600))
	overlay, err := json.Marshal(map[string]any{"Replace": map[string]string{
		filepath.Join(wd, "internal", "testsvc", "zz_readme_quickstart.go"): file,
	}})
	require.NoError(t, err)
	overlayFile := filepath.Join(dir, "overlay.json")
	require.NoError(t, os.WriteFile(overlayFile, overlay, 0o600))
	out, err := exec.Command("go", "vet", "-overlay="+overlayFile, "./internal/testsvc").CombinedOutput()
	require.NoError(t, err, "the quick start does not compile or vet:\n%s\n%s", out, numbered(src))

	// The shutdown order: a receive (Run's result) before sender.Close(), and no deferred Close.
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "quickstart.go", src, 0)
	require.NoError(t, err)
	var firstReceive, closeAt token.Pos
	deferredClose := false
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.ExprStmt:
			if u, ok := n.X.(*ast.UnaryExpr); ok && u.Op == token.ARROW && firstReceive == 0 {
				firstReceive = n.Pos()
			}
		case *ast.DeferStmt:
			if isSenderClose(n.Call) {
				deferredClose = true
			}
		case *ast.CallExpr:
			if isSenderClose(n) && closeAt == 0 {
				closeAt = n.Pos()
			}
		}
		return true
	})
	assert.False(t, deferredClose, "no `defer sender.Close()`: it can run before Run has finished")
	require.NotZero(t, closeAt, "the quick start closes the sender")
	require.NotZero(t, firstReceive, "the quick start waits for Run to return")
	assert.Less(t, firstReceive, closeAt, "the sender is closed after Run has returned")
}

func isSenderClose(c *ast.CallExpr) bool {
	sel, ok := c.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Close" {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == "sender"
}

func numbered(src string) string {
	var b strings.Builder
	for i, line := range strings.Split(src, "\n") {
		fmt.Fprintf(&b, "%3d  %s\n", i+1, line)
	}
	return b.String()
}
