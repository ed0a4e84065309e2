package outbox_test

import (
	"go/ast"
	"go/doc/comment"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The library's packages whose doc comments and names the docs link: import path and
// directory (the relay is a module of its own beside this one).
var docPackages = map[string]string{
	"github.com/go-outbox/outbox":                    ".",
	"github.com/go-outbox/outbox/inbox":              "inbox",
	"github.com/go-outbox/outbox/inbox/inboxtest":    "inbox/inboxtest",
	"github.com/go-outbox/outbox/outboxtest":         "outboxtest",
	"github.com/go-outbox/outbox/relay":              "relay",
	"github.com/go-outbox/outbox/cmd/outboxctl":      "cmd/outboxctl",
	"github.com/go-outbox/outbox/console":            "console",
	"github.com/go-outbox/outbox/internal/storename": "internal/storename",
	"github.com/go-outbox/outbox/internal/testsvc":   "internal/testsvc",
}

// Every doc link of the library's doc comments ([Name], [Name.Member], [pkg.Name],
// [pkg.Name.Member]) names something that exists: a link to a renamed or removed identifier
// fails here instead of rendering as plain text on pkg.go.dev.
func TestDocLinksResolve(t *testing.T) {
	t.Parallel()
	apis := loadAPIs(t)
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", nil)
	checked := 0
	for path, dir := range docPackages {
		for _, f := range parseDir(t, dir) {
			imports := map[string]string{}
			for _, is := range f.file.Imports {
				p, _ := strconv.Unquote(is.Path.Value)
				name := p[strings.LastIndexByte(p, '/')+1:]
				if is.Name != nil {
					name = is.Name.Name
				}
				imports[name] = p
			}
			parser := &comment.Parser{
				LookupPackage: func(name string) (string, bool) {
					if p, ok := imports[name]; ok {
						return p, true
					}
					for p := range docPackages {
						if strings.HasSuffix(p, "/"+name) {
							return p, true
						}
					}
					return "", false // the standard library's names are known to the parser
				},
				// Every link is a link: whether it resolves is this test's question.
				LookupSym: func(recv, name string) bool { return true },
			}
			for _, cg := range docComments(f.file) {
				for _, link := range docLinks(parser.Parse(cg.Text())) {
					checked++
					where := f.name + ":" + strconv.Itoa(fsetLine(f.fset, cg.Pos()))
					target := link.ImportPath
					if target == "" {
						target = path
					}
					if api, ok := apis[target]; ok {
						assert.True(t, api.has(link.Recv, link.Name), "%s: the doc link [%s] names nothing in %s", where, linkText(link), target)
						continue
					}
					pkg, err := imp.Import(target)
					if !assert.NoError(t, err, "%s: the doc link [%s]: its package", where, linkText(link)) {
						continue
					}
					assert.True(t, externalHas(pkg, link.Recv, link.Name), "%s: the doc link [%s] names nothing in %s", where, linkText(link), target)
				}
			}
		}
	}
	assert.Greater(t, checked, 100, "the doc links were found")
}

// The identifiers the pages of docs/ and the README name in code spans as Go API
// (`Config.MaxBackoff`, `Publisher.Run`, `relay.Config.CheckpointTable`,
// `Publisher.Health().BrokerUnavailable`, `ErrClosed`, `NewAdmin`) exist in the library's
// packages. docs/upgrading.md may also name the earlier API the CHANGELOG records as renamed
// or removed ("`X` -> ...").
func TestDocsNameExistingAPI(t *testing.T) {
	t.Parallel()
	apis := loadAPIs(t)
	changelog, err := os.ReadFile("CHANGELOG.md")
	require.NoError(t, err)
	former := formerNames(string(changelog))
	require.Contains(t, former, "MySQLConfig.KeyOrderIndex", "the CHANGELOG's renames and removals were read")

	pages, err := filepath.Glob(filepath.Join("docs", "*.md"))
	require.NoError(t, err)
	checked := 0
	for _, page := range append(pages, "README.md") {
		data, err := os.ReadFile(page)
		require.NoError(t, err)
		for n, line := range proseLines(string(data)) {
			for _, span := range codeSpanRE.FindAllStringSubmatch(line, -1) {
				chain, ok := apiChain(span[1])
				if !ok {
					continue
				}
				checked++
				if resolveChain(apis, chain) {
					continue
				}
				if filepath.Base(page) == "upgrading.md" && former[strings.Join(chain, ".")] {
					continue
				}
				assert.Fail(t, "a doc names Go API that does not exist",
					"%s:%d: `%s` is in none of the library's packages", page, n+1, span[1])
			}
		}
	}
	assert.Greater(t, checked, 200, "the docs' identifiers were found")
}

// The check itself: a link or a name to something that does not exist is caught, one to
// something that does is not.
func TestDocLinkCheckCatchesAStaleName(t *testing.T) {
	t.Parallel()
	apis := loadAPIs(t)
	root := apis["github.com/go-outbox/outbox"]
	assert.True(t, root.has("Tuning", "MaxBackoff"))
	assert.False(t, root.has("Config", "MaxBackoff"), "MaxBackoff is Tuning's, not Config's")
	assert.True(t, root.has("Publisher", "Run"))
	assert.True(t, root.has("", "ErrInvalidConfig"))
	assert.False(t, root.has("", "ErrNoSuchThing"))

	for span, want := range map[string]bool{
		"outbox.Config.MaxBackoff":             false, // the relay's Config has one: unqualified, it resolves there
		"relay.Config.MaxBackoff":              true,
		"Config.Tuning.MaxBackoff":             true,
		"MySQLConfig.KeyOrderIndex":            false,
		"Publisher.Run":                        true,
		"Publisher.Health().BrokerUnavailable": true,
		"relay.Config.CheckpointTable":         true,
		"outbox.ErrClosed":                     true,
	} {
		chain, ok := apiChain(span)
		require.True(t, ok, span)
		assert.Equal(t, want, resolveChain(apis, chain), span)
	}
	for _, span := range []string{"WAIT", "time.Duration", "p.Run(ctx)", "outbox.events.sent", "SELECT ... FOR UPDATE", "go test"} {
		_, ok := apiChain(span)
		assert.False(t, ok, "%q does not look like the library's Go API", span)
	}
}

// pkgAPI is what a package declares: its package-level names, and for each type its
// methods and fields with the name of the type they give (for a chain such as
// Config.Tuning.MaxBackoff or Publisher.Health().BrokerUnavailable), and its embedded types.
type pkgAPI struct {
	names   map[string]bool
	members map[string]map[string]string // type: member: the member's type name ("" unknown)
	embeds  map[string][]string
}

func (a pkgAPI) has(recv, name string) bool {
	if recv == "" {
		return a.names[name]
	}
	_, ok := a.member(recv, name, 0)
	return ok
}

// member looks name up on typ, through its embedded types.
func (a pkgAPI) member(typ, name string, depth int) (string, bool) {
	if t, ok := a.members[typ][name]; ok {
		return t, true
	}
	if depth > 4 {
		return "", false
	}
	for _, e := range a.embeds[typ] {
		if t, ok := a.member(e, name, depth+1); ok {
			return t, true
		}
	}
	return "", false
}

type parsedFile struct {
	name string
	fset *token.FileSet
	file *ast.File
}

func parseDir(t *testing.T, dir string) []parsedFile {
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var files []parsedFile
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		fset := token.NewFileSet()
		path := filepath.Join(dir, n)
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		require.NoError(t, err)
		files = append(files, parsedFile{name: path, fset: fset, file: f})
	}
	return files
}

func fsetLine(fset *token.FileSet, p token.Pos) int { return fset.Position(p).Line }

func loadAPIs(t *testing.T) map[string]pkgAPI {
	apis := map[string]pkgAPI{}
	for path, dir := range docPackages {
		a := pkgAPI{names: map[string]bool{}, members: map[string]map[string]string{}, embeds: map[string][]string{}}
		addMember := func(typ, name, result string) {
			if a.members[typ] == nil {
				a.members[typ] = map[string]string{}
			}
			a.members[typ][name] = result
		}
		for _, f := range parseDir(t, dir) {
			for _, decl := range f.file.Decls {
				switch d := decl.(type) {
				case *ast.FuncDecl:
					if d.Recv == nil {
						a.names[d.Name.Name] = true
						continue
					}
					addMember(typeName(d.Recv.List[0].Type), d.Name.Name, resultName(d.Type))
				case *ast.GenDecl:
					for _, spec := range d.Specs {
						switch s := spec.(type) {
						case *ast.ValueSpec:
							for _, n := range s.Names {
								a.names[n.Name] = true
							}
						case *ast.TypeSpec:
							a.names[s.Name.Name] = true
							switch tt := s.Type.(type) {
							case *ast.StructType:
								for _, fl := range tt.Fields.List {
									if len(fl.Names) == 0 {
										a.embeds[s.Name.Name] = append(a.embeds[s.Name.Name], typeName(fl.Type))
										addMember(s.Name.Name, typeName(fl.Type), typeName(fl.Type))
									}
									for _, n := range fl.Names {
										addMember(s.Name.Name, n.Name, typeName(fl.Type))
									}
								}
							case *ast.InterfaceType:
								for _, m := range tt.Methods.List {
									for _, n := range m.Names {
										addMember(s.Name.Name, n.Name, resultName(m.Type.(*ast.FuncType)))
									}
									if len(m.Names) == 0 {
										a.embeds[s.Name.Name] = append(a.embeds[s.Name.Name], typeName(m.Type))
									}
								}
							}
						}
					}
				}
			}
		}
		apis[path] = a
	}
	return apis
}

// typeName is the name of a type expression's named type: T of T, *T, []T, T[P]; "" for
// another package's type or a literal.
func typeName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.Ident:
		return t.Name
	case *ast.StarExpr:
		return typeName(t.X)
	case *ast.ArrayType:
		return typeName(t.Elt)
	case *ast.IndexExpr:
		return typeName(t.X)
	case *ast.IndexListExpr:
		return typeName(t.X)
	}
	return ""
}

// resultName is the type name of a function's first result ("" for none).
func resultName(ft *ast.FuncType) string {
	if ft.Results == nil || len(ft.Results.List) == 0 {
		return ""
	}
	return typeName(ft.Results.List[0].Type)
}

// docComments are a file's doc comments: the package's, each declaration's and spec's,
// and each struct field's and interface method's.
func docComments(f *ast.File) []*ast.CommentGroup {
	var out []*ast.CommentGroup
	add := func(cgs ...*ast.CommentGroup) {
		for _, cg := range cgs {
			if cg != nil {
				out = append(out, cg)
			}
		}
	}
	add(f.Doc)
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.FuncDecl:
			add(x.Doc)
			return false // comments inside a body are not documentation
		case *ast.GenDecl:
			add(x.Doc)
		case *ast.TypeSpec:
			add(x.Doc, x.Comment)
		case *ast.ValueSpec:
			add(x.Doc, x.Comment)
		case *ast.Field:
			add(x.Doc, x.Comment)
		}
		return true
	})
	return out
}

func docLinks(d *comment.Doc) []*comment.DocLink {
	var links []*comment.DocLink
	var text func([]comment.Text)
	text = func(ts []comment.Text) {
		for _, t := range ts {
			switch x := t.(type) {
			case *comment.DocLink:
				links = append(links, x)
			case *comment.Italic, comment.Plain:
			case *comment.Link:
				text(x.Text)
			}
		}
	}
	for _, b := range d.Content {
		switch x := b.(type) {
		case *comment.Paragraph:
			text(x.Text)
		case *comment.Heading:
			text(x.Text)
		case *comment.List:
			for _, it := range x.Items {
				for _, c := range it.Content {
					if p, ok := c.(*comment.Paragraph); ok {
						text(p.Text)
					}
				}
			}
		}
	}
	return links
}

func linkText(l *comment.DocLink) string {
	s := l.Name
	if l.Recv != "" {
		s = l.Recv + "." + s
	}
	if l.ImportPath != "" {
		s = l.ImportPath[strings.LastIndexByte(l.ImportPath, '/')+1:] + "." + s
	}
	return s
}

// externalHas looks a link up in another package (the standard library, a dependency).
func externalHas(pkg *types.Package, recv, name string) bool {
	if recv == "" {
		return pkg.Scope().Lookup(name) != nil
	}
	tn, ok := pkg.Scope().Lookup(recv).(*types.TypeName)
	if !ok {
		return false
	}
	obj, _, _ := types.LookupFieldOrMethod(types.NewPointer(tn.Type()), true, pkg, name)
	return obj != nil
}

var (
	codeSpanRE = regexp.MustCompile("`([^`\n]+)`")
	// A Go API chain: [pkg.]Name{.Name}, each exported, a call's () (or arguments) allowed
	// after a name.
	chainRE = regexp.MustCompile(`^(?:(outbox|relay|inbox|outboxtest)\.)?([A-Z]\w*(?:\([^()]*\))?(?:\.[A-Z]\w*(?:\([^()]*\))?)*)$`)
	callRE  = regexp.MustCompile(`\([^()]*\)`)
)

// apiChain reads a code span as a chain of the library's exported names: "Config.MaxBackoff"
// as [Config MaxBackoff], "relay.Config.Checkpoint" as [relay Config Checkpoint]. A single
// name counts only as a constructor or an error (New..., Err...): others are statuses,
// SQL or words.
func apiChain(span string) ([]string, bool) {
	m := chainRE.FindStringSubmatch(strings.TrimSpace(span))
	if m == nil {
		return nil, false
	}
	names := strings.Split(callRE.ReplaceAllString(m[2], ""), ".")
	if len(names) == 1 && m[1] == "" && !regexp.MustCompile(`^(New|Err)[A-Z]\w*$`).MatchString(names[0]) {
		return nil, false
	}
	if len(names) == 1 && strings.ToUpper(names[0]) == names[0] {
		return nil, false
	}
	if m[1] != "" {
		names = append([]string{m[1]}, names...)
	}
	return names, true
}

// resolveChain: the chain names a package-level name and then members, each on the type the
// one before gives, in the package named or in any of the library's packages.
func resolveChain(apis map[string]pkgAPI, chain []string) bool {
	candidates := []pkgAPI{}
	if p, ok := map[string]string{
		"outbox": "github.com/go-outbox/outbox", "relay": "github.com/go-outbox/outbox/relay",
		"inbox": "github.com/go-outbox/outbox/inbox", "outboxtest": "github.com/go-outbox/outbox/outboxtest",
	}[chain[0]]; ok {
		candidates = append(candidates, apis[p])
		chain = chain[1:]
	} else {
		for _, a := range apis {
			candidates = append(candidates, a)
		}
	}
	for _, a := range candidates {
		if !a.names[chain[0]] {
			continue
		}
		typ, ok := chain[0], true
		for _, name := range chain[1:] {
			if typ == "" {
				break // a type of another package: not followed
			}
			if typ, ok = a.member(typ, name, 0); !ok {
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// formerNames are the identifiers the CHANGELOG records as renamed or removed: the code
// spans before "->" in a bullet's first line ("- `Config.Ordering` -> ...", "- `A`, `B`
// and the `C` type -> ..."), as written and with a leading type's name on the following
// bare names ("`Config.ClaimMode`, `ClaimBatch`").
func formerNames(changelog string) map[string]bool {
	names := map[string]bool{}
	for line := range strings.Lines(changelog) {
		before, _, ok := strings.Cut(line, "->")
		if !ok || !strings.HasPrefix(line, "- ") {
			continue
		}
		typ := ""
		for _, m := range codeSpanRE.FindAllStringSubmatch(before, -1) {
			name := callRE.ReplaceAllString(strings.TrimPrefix(m[1], "outbox."), "")
			names[name] = true
			if i := strings.LastIndex(name, "."); i >= 0 {
				typ = name[:i+1]
			} else if typ != "" {
				names[typ+name] = true
			}
		}
	}
	return names
}

// proseLines are a Markdown page's lines with its fenced code blocks blanked (the Go ones are
// compiled by TestReadmeGoBlocksCompile and its kin).
func proseLines(page string) []string {
	lines := strings.Split(page, "\n")
	fenced := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			lines[i] = ""
			continue
		}
		if fenced {
			lines[i] = ""
		}
	}
	return lines
}

// docs/design.md shows the success statements as the store runs them: each
// "SET status = 'SUCCESS' WHERE ..." of its SQL has its WHERE clause in the store's
// statements (the per-row success accepts a row already SUCCESS under the same claim).
func TestDesignSuccessStatementsAreTheStores(t *testing.T) {
	t.Parallel()
	design, err := os.ReadFile(filepath.Join("docs", "design.md"))
	require.NoError(t, err)
	queries, err := os.ReadFile("store_mysql_queries.go")
	require.NoError(t, err)
	store := strings.Join(strings.Fields(string(queries)), " ")
	re := regexp.MustCompile(`SET status = 'SUCCESS' WHERE ([^;]+);`)
	found := re.FindAllStringSubmatch(strings.Join(strings.Fields(string(design)), " "), -1)
	require.NotEmpty(t, found, "docs/design.md shows the success statement")
	stores := map[string]bool{}
	for _, m := range regexp.MustCompile("SET status = 'SUCCESS'[^`]*? WHERE ([^`]+)`").FindAllStringSubmatch(store, -1) {
		stores[m[1]] = true
	}
	require.NotEmpty(t, stores, "the store's success statements were found")
	for _, m := range found {
		where := strings.ReplaceAll(m[1], "(...)", "(%s)") // the store's id list
		assert.True(t, stores[where], "docs/design.md's success statement is none of the store's: WHERE %s", where)
	}
}

// schema.sql's comments name what exists: each Go name written Type.Field (Config.MaxAttempts,
// MySQLConfig.Ordering) is in the library's packages, and each page and section they point
// to (docs/ordering.md, "Making an existing table ordered") is there.
func TestSchemaCommentsNameWhatExists(t *testing.T) {
	t.Parallel()
	apis := loadAPIs(t)
	for _, file := range []string{"schema.sql", filepath.Join("inbox", "schema.sql")} {
		data, err := os.ReadFile(file)
		require.NoError(t, err)
		var comments []string
		for line := range strings.Lines(string(data)) {
			if _, c, ok := strings.Cut(line, "-- "); ok {
				comments = append(comments, strings.TrimSpace(c))
			}
		}
		text := strings.Join(comments, " ")
		names := regexp.MustCompile(`\b[A-Z]\w*(?:\.[A-Z]\w*)+\b`).FindAllString(text, -1)
		for _, n := range names {
			assert.True(t, resolveChain(apis, strings.Split(n, ".")), "%s names %s, which is in none of the library's packages", file, n)
		}
		assert.False(t, strings.Contains(text, "README's \""), "%s points to a section of the README, an overview without them: point to docs/", file)
		for _, m := range regexp.MustCompile(`(docs/[a-z-]+\.md)(?:, "([^"]+)")?`).FindAllStringSubmatch(text, -1) {
			page, err := os.ReadFile(m[1])
			if !assert.NoError(t, err, "%s points to %s", file, m[1]) || m[2] == "" {
				continue
			}
			assert.Contains(t, string(page), "\n## "+m[2]+"\n", "%s points to the section %q of %s", file, m[2], m[1])
		}
	}
}

// CONTRIBUTING.md's "Run the tests" lists commands .ci/run runs, in order: each is a command
// line of .ci/run after the one before, as written there (or the command of a line's $(...)).
func TestContributingCommandsAreCIs(t *testing.T) {
	t.Parallel()
	contributing, err := os.ReadFile("CONTRIBUTING.md")
	require.NoError(t, err)
	ci, err := os.ReadFile(filepath.Join(".ci", "run"))
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(contributing), "\n## Run the tests\n")
	require.True(t, ok, "CONTRIBUTING.md has a section \"Run the tests\"")
	_, block, ok := strings.Cut(section, "```sh\n")
	require.True(t, ok)
	block, _, _ = strings.Cut(block, "```")
	runs := shellCommands(string(ci))
	commands := shellCommands(block)
	require.NotEmpty(t, commands)
	next := 0 // in order: each command after the one before
	for _, c := range commands {
		found := false
		for i := next; i < len(runs) && !found; i++ {
			if runs[i] == c || strings.Contains(runs[i], "$("+c+")") { // unformatted="$(gofmt -l .)"
				found, next = true, i+1
			}
		}
		assert.True(t, found, "CONTRIBUTING.md says .ci/run runs %q (after the command before it), which it does not", c)
	}
}

// shellCommands are a script's command lines: continuations joined, comments (after " #")
// and repeated blanks dropped.
func shellCommands(script string) []string {
	var out []string
	script = strings.ReplaceAll(script, "\\\n", " ")
	for line := range strings.Lines(script) {
		if i := strings.Index(line, " # "); i >= 0 {
			line = line[:i]
		}
		line = strings.Join(strings.Fields(line), " ")
		if line != "" && !strings.HasPrefix(line, "#") {
			out = append(out, line)
		}
	}
	return out
}

// The examples are a module of their own, so no page runs one from the root
// (`go run ./examples/order-service` fails there: the root module does not contain it); the
// README gives the command that runs the example on a fresh machine.
func TestDocsRunTheExamplesFromTheirModule(t *testing.T) {
	t.Parallel()
	_, err := os.Stat(filepath.Join("examples", "go.mod"))
	require.NoError(t, err, "the examples are a module of their own")
	pages, err := filepath.Glob(filepath.Join("docs", "*.md"))
	require.NoError(t, err)
	fromRoot := regexp.MustCompile(`go run \./examples/[a-z]`)
	for _, page := range append(pages, "README.md", "CONTRIBUTING.md", filepath.Join("scripts", "run-example.sh")) {
		data, err := os.ReadFile(page)
		require.NoError(t, err)
		for n, line := range strings.Split(string(data), "\n") {
			assert.False(t, fromRoot.MatchString(line), "%s:%d runs an example from the root module, which fails: use `go -C examples run ./...`: %s", page, n+1, line)
		}
	}
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	assert.Contains(t, string(readme), "`bash scripts/run-example.sh", "the README says how to run the example on a fresh machine")
	script, err := os.ReadFile(filepath.Join("scripts", "run-example.sh"))
	require.NoError(t, err)
	assert.Contains(t, string(script), "go -C examples run ./order-service", "the script runs the example from its module")
}
