package outbox_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// goBlockRE finds the Go code blocks of a Markdown text, indented ones (in a list item)
// included; group 1 is the code.
var goBlockRE = regexp.MustCompile("(?m)^[ \t]*```go\n((?s:.*?))^[ \t]*```")

// docBlock is one Go block of the documentation.
type docBlock struct {
	file string // README.md or docs/NAME.md
	line int    // the line of the block's first line of code
	code string
}

func (b docBlock) String() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

// docFiles are the Markdown files whose Go blocks are compiled: the README and every page
// of docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join("docs", "*.md"))
	require.NoError(t, err)
	require.NotEmpty(t, pages, "docs/ has pages")
	slices.Sort(pages)
	return append([]string{"README.md"}, pages...)
}

// goBlocks returns the Go blocks of text, which is the content of file.
func goBlocks(file, text string) []docBlock {
	var blocks []docBlock
	for _, m := range goBlockRE.FindAllStringSubmatchIndex(text, -1) {
		blocks = append(blocks, docBlock{
			file: file,
			line: strings.Count(text[:m[2]], "\n") + 1,
			code: text[m[2]:m[3]],
		})
	}
	return blocks
}

// isWholeFile reports whether a block is a whole Go file: its first line that is neither
// blank nor a comment starts with "package ".
func isWholeFile(code string) bool {
	for line := range strings.Lines(code) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "//") {
			continue
		}
		return strings.HasPrefix(line, "package ")
	}
	return false
}

// fragmentImports are the packages a fragment may use without importing them, each with a
// reference that keeps the import used.
var fragmentImports = []struct{ name, path, ref string }{
	{"context", "context", "context.Background"},
	{"sql", "database/sql", "sql.Open"},
	{"errors", "errors", "errors.New"},
	{"fmt", "fmt", "fmt.Sprint"},
	{"log", "log", "log.Print"},
	{"slog", "log/slog", "slog.Default"},
	{"os", "os", "os.Getenv"},
	{"time", "time", "time.Now"},
	{"outbox", "github.com/go-outbox/outbox", "outbox.DefaultInstanceID"},
	{"inbox", "github.com/go-outbox/outbox/inbox", "inbox.New"},
	{"testing", "testing", "testing.Short"},
	{"outboxtest", "github.com/go-outbox/outbox/outboxtest", "outboxtest.NewMemorySender"},
	{"inboxtest", "github.com/go-outbox/outbox/inbox/inboxtest", "inboxtest.Message"},
	{"relay", "github.com/go-outbox/outbox/relay", "relay.New"},
	{"mysql", "github.com/go-sql-driver/mysql", "mysql.ParseDSN"},
	{"rocketmq", "github.com/apache/rocketmq-client-go/v2", "rocketmq.NewPushConsumer"},
	{"consumer", "github.com/apache/rocketmq-client-go/v2/consumer", "consumer.WithNameServer"},
	{"primitive", "github.com/apache/rocketmq-client-go/v2/primitive", "primitive.NewMessage"},
	{"producer", "github.com/apache/rocketmq-client-go/v2/producer", "producer.WithRetry"},
	{"propagation", "go.opentelemetry.io/otel/propagation", "propagation.TraceContext{}"},
	{"trace", "go.opentelemetry.io/otel/trace", "trace.SpanKindConsumer"},
	{"metric", "go.opentelemetry.io/otel/metric", "metric.WithUnit"},
}

// fragmentParams are what a fragment finds in scope, as the parameters of its function.
const fragmentParams = "ctx context.Context, db *sql.DB, store *outbox.MySQLStore, sender *outbox.RocketMQSender, publisher *outbox.Publisher, t *testing.T"

// fragmentSource makes a fragment the body of a function (see docs/development.md, "Go
// code in the documentation"): inside a block of its own, so that it may declare store,
// sender or publisher anew with :=, followed by a use of every variable it declares at its
// top level (before its closing return, if it ends in one), so that a variable it leaves
// unused is no error. //line comments make the compiler's positions the Markdown's.
func fragmentSource(b docBlock) (string, error) {
	var head strings.Builder
	head.WriteString("package docblock\n\nimport (\n")
	for _, im := range fragmentImports {
		fmt.Fprintf(&head, "\t%s %q\n", im.name, im.path)
	}
	head.WriteString(")\n\nvar (\n")
	for _, im := range fragmentImports {
		fmt.Fprintf(&head, "\t_ = %s\n", im.ref)
	}
	fmt.Fprintf(&head, ")\n\nfunc block(%s) error {\n\t{\n", fragmentParams)
	directive := fmt.Sprintf("//line %s:%d\n", b.file, b.line)
	code := b.code
	if !strings.HasSuffix(code, "\n") {
		code += "\n"
	}
	parse := func(body, tail string) (*ast.File, *token.FileSet, string, error) {
		src := head.String() + directive + body + "//line docblock_tail.go:1\n\t}\n" + tail + "}\n"
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, "docblock.go", src, parser.SkipObjectResolution)
		return f, fset, src, err
	}
	f, fset, src, err := parse(code, "\treturn nil\n")
	if err != nil {
		return src, err
	}
	var inner *ast.BlockStmt
	for _, d := range f.Decls {
		if d, ok := d.(*ast.FuncDecl); ok && d.Name.Name == "block" {
			inner = d.Body.List[0].(*ast.BlockStmt)
		}
	}
	var uses strings.Builder
	uses.WriteString("//line docblock_uses.go:1\n")
	for _, s := range inner.List {
		var names []*ast.Ident
		switch s := s.(type) {
		case *ast.AssignStmt:
			if s.Tok == token.DEFINE {
				for _, e := range s.Lhs {
					if id, ok := e.(*ast.Ident); ok {
						names = append(names, id)
					}
				}
			}
		case *ast.DeclStmt:
			if g, ok := s.Decl.(*ast.GenDecl); ok && g.Tok == token.VAR {
				for _, spec := range g.Specs {
					names = append(names, spec.(*ast.ValueSpec).Names...)
				}
			}
		}
		for _, id := range names {
			if id.Name != "_" {
				fmt.Fprintf(&uses, "\t_ = %s\n", id.Name)
			}
		}
	}
	if n := len(inner.List); n > 0 {
		if ret, ok := inner.List[n-1].(*ast.ReturnStmt); ok {
			// The uses go before the closing return's line, which keeps its Markdown line
			// (positions read through the //line comment are the Markdown's).
			at := fset.Position(ret.Pos()).Line - b.line
			lines := strings.SplitAfter(code, "\n")
			fmt.Fprintf(&uses, "//line %s:%d\n", b.file, b.line+at)
			_, _, src, err = parse(strings.Join(lines[:at], "")+uses.String()+strings.Join(lines[at:], ""), "")
			return src, err
		}
	}
	_, _, src, err = parse(code+uses.String(), "\treturn nil\n")
	return src, err
}

// Every Go block of the README and of docs/ compiles and vets against the package as it is:
// a block that is a whole file (it starts with a package clause) as a package of its own,
// any other as the body of a function with ctx, db, store, sender and publisher in scope.
// Each goes into a directory of a temporary module that a go.work joins to this one, so
// nothing is written into the repository; errors point at the Markdown's lines.
func TestDocsGoBlocksCompile(t *testing.T) {
	t.Parallel()
	wd, err := os.Getwd()
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module docblocks\n\ngo 1.26.0\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.work"),
		fmt.Appendf(nil, "go 1.26.0\n\nuse (\n\t%s\n\t%s\n\t%s\n)\n", wd, filepath.Join(wd, "relay"), dir), 0o600))

	var blocks []docBlock
	for _, file := range docFiles(t) {
		text, err := os.ReadFile(file)
		require.NoError(t, err)
		blocks = append(blocks, goBlocks(file, string(text))...)
	}
	require.NotEmpty(t, blocks)
	for i, b := range blocks {
		pkg := fmt.Sprintf("b%03d", i)
		var src string
		if isWholeFile(b.code) {
			src = fmt.Sprintf("//line %s:%d\n%s", b.file, b.line, b.code)
		} else {
			src, err = fragmentSource(b)
			require.NoError(t, err, "%s: the block does not parse as a function body:\n%s", b, numbered(src))
		}
		require.NoError(t, os.Mkdir(filepath.Join(dir, pkg), 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(dir, pkg, "block.go"), []byte(src), 0o600))
	}
	t.Logf("%d Go blocks in %d files", len(blocks), len(docFiles(t)))

	goCmd := func(args ...string) (string, error) {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(dir, "go.work"), "GOFLAGS=-mod=readonly")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// Compile first, every error of every block (-e), then vet.
	out, err := goCmd("build", "-gcflags=-e", "./...")
	require.NoError(t, err, "the documentation's Go blocks do not compile:\n%s", out)
	out, err = goCmd("vet", "./...")
	require.NoError(t, err, "the documentation's Go blocks do not vet:\n%s", out)
}

// The README's quick start loses no error of the start and closes things in the right
// order by construction: `if err := publisher.Start(ctx); err != nil { return err }`, then
// `defer publisher.Close()`, so that the deferred Close stops the publisher, waits for it
// and closes the sender; it never starts the publisher with `go publisher.Run(`, which
// would drop Start's refusal, and never closes the sender itself. And it stays short.
func TestReadmeQuickStart(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	text := string(readme)
	start := strings.Index(text, "\n## Quick start\n")
	require.GreaterOrEqual(t, start, 0, "the README has a Quick start section")
	section := text[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	blocks := goBlocks("README.md", section)
	require.NotEmpty(t, blocks, "the quick start has Go code")
	var code strings.Builder
	lines := 0
	for _, b := range blocks {
		code.WriteString(b.code)
		for line := range strings.Lines(b.code) {
			if strings.TrimSpace(line) != "" {
				lines++
			}
		}
	}
	assert.LessOrEqual(t, lines, 15, "the quick start is at most 15 lines of Go")

	src := "package p\n\nfunc quickStart() {\n" + code.String() + "}\n"
	f, err := parser.ParseFile(token.NewFileSet(), "quickstart.go", src, parser.SkipObjectResolution)
	require.NoError(t, err, numbered(src))
	var deferClose, checkedStart token.Pos
	var goRun, senderClose []token.Pos
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.DeferStmt:
			if isCall(n.Call, "publisher", "Close") && deferClose == 0 {
				deferClose = n.Pos()
			}
		case *ast.IfStmt:
			if startChecked(n) && checkedStart == 0 {
				checkedStart = n.Pos()
			}
		case *ast.GoStmt:
			if isCall(n.Call, "publisher", "Run") || isCall(n.Call, "publisher", "Start") {
				goRun = append(goRun, n.Pos())
			}
		case *ast.CallExpr:
			if isCall(n, "sender", "Close") {
				senderClose = append(senderClose, n.Pos())
			}
		}
		return true
	})
	require.NotZero(t, checkedStart, "the quick start has `if err := publisher.Start(ctx); err != nil { return err }`")
	require.NotZero(t, deferClose, "the quick start has `defer publisher.Close()`")
	assert.Less(t, checkedStart, deferClose, "`defer publisher.Close()` comes after the checked Start")
	assert.Empty(t, goRun, "the quick start never drops the start's error with `go publisher.Run(ctx)`")
	assert.Empty(t, senderClose, "the quick start never calls sender.Close(): Publisher.Close closes the sender")
}

// startChecked reports whether s is `if err := publisher.Start(...); err != nil { ... return
// err ... }`: the start's refusal reaches the caller.
func startChecked(s *ast.IfStmt) bool {
	init, ok := s.Init.(*ast.AssignStmt)
	if !ok || len(init.Lhs) != 1 || len(init.Rhs) != 1 {
		return false
	}
	call, ok := init.Rhs[0].(*ast.CallExpr)
	if !ok || !isCall(call, "publisher", "Start") {
		return false
	}
	errName, ok := init.Lhs[0].(*ast.Ident)
	if !ok {
		return false
	}
	cond, ok := s.Cond.(*ast.BinaryExpr)
	if !ok || cond.Op != token.NEQ {
		return false
	}
	if x, ok := cond.X.(*ast.Ident); !ok || x.Name != errName.Name {
		return false
	}
	for _, st := range s.Body.List {
		if r, ok := st.(*ast.ReturnStmt); ok && len(r.Results) == 1 {
			if id, ok := r.Results[0].(*ast.Ident); ok && id.Name == errName.Name {
				return true
			}
		}
	}
	return false
}

// isCall reports whether c calls recv.method.
func isCall(c *ast.CallExpr, recv, method string) bool {
	sel, ok := c.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != method {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == recv
}

// The README sells and starts; the detail lives in docs/.
func TestReadmeIsShort(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	lines := strings.Count(string(readme), "\n")
	if !strings.HasSuffix(string(readme), "\n") {
		lines++
	}
	assert.LessOrEqual(t, lines, 200, "README.md has at most 200 lines")
}

// The README links every page of docs/, and the changelog, the contributing guide and the
// licence.
func TestReadmeLinksEveryPage(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	pages, err := filepath.Glob(filepath.Join("docs", "*.md"))
	require.NoError(t, err)
	for _, page := range append(pages, "CHANGELOG.md", "CONTRIBUTING.md", "LICENSE") {
		assert.Contains(t, string(readme), "]("+filepath.ToSlash(page)+")", "the README links %s", page)
	}
}

// The file map of docs/development.md ("Where things are") names every non-test .go file
// at the root and every top-level directory, and names nothing that does not exist.
func TestFileMap(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("docs", "development.md"))
	require.NoError(t, err)
	text := string(doc)
	start := strings.Index(text, "\n## Where things are\n")
	require.GreaterOrEqual(t, start, 0, "docs/development.md has a section \"Where things are\"")
	section := text[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	// The names are the code spans of the table's first column.
	named := map[string]bool{}
	codeSpan := regexp.MustCompile("`([^`]+)`")
	for line := range strings.Lines(section) {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "|") || len(cells) < 3 {
			continue
		}
		for _, m := range codeSpan.FindAllStringSubmatch(cells[1], -1) {
			named[m[1]] = true
		}
	}
	require.NotEmpty(t, named, "the file map has a table")
	for name := range named {
		info, err := os.Stat(filepath.FromSlash(strings.TrimSuffix(name, "/")))
		if assert.NoError(t, err, "the file map names %s, which does not exist", name) {
			assert.Equal(t, strings.HasSuffix(name, "/"), info.IsDir(),
				"the file map writes a directory with a trailing slash, and a file without: %s", name)
		}
	}
	entries, err := os.ReadDir(".")
	require.NoError(t, err)
	for _, e := range entries {
		name := e.Name()
		switch {
		case e.IsDir() && name != ".git":
			assert.True(t, named[name+"/"], "the file map names the directory %s/", name)
		case !e.IsDir() && strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go"):
			assert.True(t, named[name], "the file map names %s", name)
		}
	}
}

func numbered(src string) string {
	var b strings.Builder
	for i, line := range strings.Split(src, "\n") {
		fmt.Fprintf(&b, "%3d  %s\n", i+1, line)
	}
	return b.String()
}
