// Command apicheck records the library's exported API in api/ and checks today's against it.
//
// api/ holds the API of release 0.1.0, one file a package (api/outbox.txt for the root
// package, api/<dir>.txt for the others), one line an exported identifier, as Go's own
// api/go1.*.txt: "pkg github.com/go-outbox/outbox, method (*Publisher) Run(context.Context) error".
// The check computes today's API of every package of the library's modules (the root module
// and relay; not tools, examples, internal or main packages), compares it with api/, and
// fails for each identifier added, changed or removed since that the CHANGELOG's
// [Unreleased] section does not name:
//
//	go -C tools run ./apicheck                    # the check (CI)
//	go -C tools run ./apicheck -write -rev 1c5fa73 # api/ again, from the commit of 0.1.0
//
// An identifier counts as named when a bullet of [Unreleased] writes it as Go code does
// (`New`, `Publisher.Run`, `Config.MaxBackoff`, with or without the package's name), or a
// bullet names the type and the member in backticks (`RocketMQConfig.CloudEventsSource` and
// `CloudEventsContentType`), or names a new package (package `inbox`, module
// `github.com/go-outbox/outbox/relay`); the members of a type added or removed whole count
// with the type.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

func main() {
	root := flag.String("root", "..", "the repository's root (the library's module)")
	write := flag.Bool("write", false, "write api/ from -rev instead of checking")
	rev := flag.String("rev", "", "with -write: the commit whose API api/ records (the release's)")
	verbose := flag.Bool("v", false, "also list the differences the CHANGELOG names")
	flag.Parse()
	if *write {
		if *rev == "" {
			fmt.Fprintln(os.Stderr, "apicheck: -write needs -rev, the release's commit")
			os.Exit(2)
		}
		if err := writeAPI(*root, *rev); err != nil {
			fmt.Fprintln(os.Stderr, "apicheck:", err)
			os.Exit(1)
		}
		return
	}
	problems, err := check(*root, *verbose)
	if err != nil {
		fmt.Fprintln(os.Stderr, "apicheck:", err)
		os.Exit(1)
	}
	if len(problems) > 0 {
		fmt.Fprintf(os.Stderr, "apicheck: %d exported identifier(s) differ from api/ (the API of 0.1.0) and the CHANGELOG's [Unreleased] section does not name them.\n"+
			"Add a bullet for each under ## [Unreleased] (### Added, ### Changed or ### Removed; a breaking change with its replacement),\n"+
			"naming it in backticks as `Name` or `Type.Member` (docs/development.md, \"The API record\"):\n", len(problems))
		for _, p := range problems {
			fmt.Fprintln(os.Stderr, "  "+p)
		}
		os.Exit(1)
	}
	fmt.Println("apicheck: every exported identifier that differs from api/ is in the CHANGELOG's [Unreleased] section")
}

// writeAPI extracts rev's tree (git archive) and writes its packages' API into root/api/.
func writeAPI(root, rev string) error {
	tmp, err := os.MkdirTemp("", "apicheck-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	archive := exec.Command("git", "-C", root, "archive", "--format=tar", rev)
	untar := exec.Command("tar", "-x", "-C", tmp)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return err
	}
	untar.Stdin = pipe
	archive.Stderr, untar.Stderr = os.Stderr, os.Stderr
	if err := untar.Start(); err != nil {
		return err
	}
	if err := archive.Run(); err != nil {
		return fmt.Errorf("git archive %s: %w", rev, err)
	}
	if err := untar.Wait(); err != nil {
		return fmt.Errorf("untar %s: %w", rev, err)
	}
	pkgs, err := packages(tmp)
	if err != nil {
		return err
	}
	dir := filepath.Join(root, "api")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	old, _ := filepath.Glob(filepath.Join(dir, "*.txt"))
	for _, f := range old {
		if err := os.Remove(f); err != nil {
			return err
		}
	}
	for _, p := range pkgs {
		if err := os.WriteFile(filepath.Join(dir, p.file+".txt"), []byte(strings.Join(p.lines, "\n")+"\n"), 0o644); err != nil {
			return err
		}
		fmt.Printf("api/%s.txt: %s, %d identifiers\n", p.file, p.path, len(p.lines))
	}
	return nil
}

// check compares root's API with root/api/ and returns the differences CHANGELOG.md's
// [Unreleased] section does not name, one line each.
func check(root string, verbose bool) ([]string, error) {
	recorded := map[string][]string{} // import path: lines
	files, err := filepath.Glob(filepath.Join(root, "api", "*.txt"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no api/*.txt under %s: write them with -write -rev <the release's commit>", root)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for line := range strings.Lines(string(data)) {
			line = strings.TrimSpace(line)
			if line == "" {
				continue
			}
			path, _, _ := strings.Cut(strings.TrimPrefix(line, "pkg "), ", ")
			recorded[path] = append(recorded[path], line)
		}
	}
	pkgs, err := packages(root)
	if err != nil {
		return nil, err
	}
	today := map[string][]string{}
	for _, p := range pkgs {
		today[p.path] = p.lines
	}
	changelog, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		return nil, err
	}
	unreleased, err := unreleasedSection(string(changelog))
	if err != nil {
		return nil, err
	}
	paths := map[string]bool{}
	for p := range recorded {
		paths[p] = true
	}
	changes := diff(recorded, today)
	if verbose {
		for _, c := range changes {
			fmt.Println(c)
		}
	}
	return uncovered(changes, unreleased, paths), nil
}
