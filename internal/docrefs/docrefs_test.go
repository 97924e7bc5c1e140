// Package docrefs holds a test that keeps the repository's references to
// Markdown documents true: every Markdown file name (a token ending in ".md")
// mentioned in a text file of the repository (code comments, scripts, docs,
// strings the program prints) must name a file that exists in the repository.
package docrefs

import (
	"bufio"
	"bytes"
	"go/scanner"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// external lists Markdown names that may be cited although no file of this
// repository carries them. Keep it tiny: a name belongs here only when it is
// an upstream file named for provenance, never a document of this project.
var external = map[string]string{}

var (
	mdToken = regexp.MustCompile(`[A-Za-z0-9_.-]+\.md\b`)
	// A URL's .md files are someone else's; drop URLs before looking.
	url = regexp.MustCompile(`https?://[^\s)>\]"'` + "`" + `]+`)
	// A shell redirect into a .md file names a report the script writes,
	// not a document: `>"$LOG/grid.md"`, `>"$LOG/ttft-$n.md"`.
	redirect = regexp.MustCompile(`>>?\s*"?([^\s"'<>|;&()]*\.md)\b`)
	shellVar = regexp.MustCompile(`\$\{?[A-Za-z_][A-Za-z0-9_]*\}?`)
)

// line is one line of text to scan, with its 1-based number in its file.
type line struct {
	n    int
	text string
}

// textLines returns what to scan of a file: every line, or for Go source
// only its comments and string literals (so a field named md selected
// from a variable is not taken for a file name).
func textLines(name string, data []byte) []line {
	var out []line
	add := func(first int, text string) {
		for i, l := range strings.Split(text, "\n") {
			out = append(out, line{first + i, l})
		}
	}
	if strings.HasSuffix(name, ".go") {
		fset := token.NewFileSet()
		file := fset.AddFile(name, -1, len(data))
		var s scanner.Scanner
		s.Init(file, data, nil, scanner.ScanComments)
		for {
			pos, tok, lit := s.Scan()
			if tok == token.EOF {
				break
			}
			if tok == token.COMMENT || tok == token.STRING || tok == token.CHAR {
				add(fset.Position(pos).Line, lit)
			}
		}
		return out
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), len(data)+1)
	for n := 1; sc.Scan(); n++ {
		out = append(out, line{n, sc.Text()})
	}
	return out
}

// written returns glob patterns of the .md reports a script writes through
// a shell redirect, shell variables in the name standing for anything.
func written(lines []line) []string {
	var globs []string
	for _, l := range lines {
		for _, m := range redirect.FindAllStringSubmatch(l.text, -1) {
			globs = append(globs, shellVar.ReplaceAllString(path.Base(m[1]), "*"))
		}
	}
	return globs
}

// repoRoot is the directory holding go.mod, found upward from the test's
// working directory (the package directory under `go test`).
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test's directory")
		}
		dir = parent
	}
}

// repoFiles lists the repository's files, relative to root, with slashes:
// `git ls-files` where git and a work tree are at hand (tracked files and
// new files not ignored, so build outputs and local virtual environments
// are not scanned), else a
// walk of the tree that skips .git, hidden directories and the ignored build
// outputs.
func repoFiles(t *testing.T, root string) []string {
	t.Helper()
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	if out, err := cmd.Output(); err == nil && len(out) > 0 {
		var files []string
		for _, f := range bytes.Split(out, []byte{0}) {
			if len(f) == 0 {
				continue
			}
			// Tracked but deleted in the work tree: not there to read or cite.
			if _, err := os.Stat(filepath.Join(root, string(f))); err != nil {
				continue
			}
			files = append(files, string(f))
		}
		return files
	}
	skip := map[string]bool{"bin": true, "build": true, "dist": true, "node_modules": true, "gpu-check-out": true, "__pycache__": true}
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || skip[d.Name()]) {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type().IsRegular() {
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestMarkdownReferencesExist fails, naming file:line, for every token
// ending in ".md" in a text file of the repository (outside URLs) that is not the
// base name of a file of the repository.
func TestMarkdownReferencesExist(t *testing.T) {
	root := repoRoot(t)
	files := repoFiles(t, root)
	if len(files) == 0 {
		t.Fatal("no files found")
	}
	have := map[string]bool{}
	for _, f := range files {
		have[pathBase(f)] = true
	}
	var bad []string
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f)))
		if err != nil {
			t.Fatal(err)
		}
		if isBinary(data) {
			continue
		}
		lines := textLines(f, data)
		reports := written(lines)
		for _, l := range lines {
			text := url.ReplaceAllString(l.text, " ")
			for _, loc := range mdToken.FindAllStringIndex(text, -1) {
				tok := text[loc[0]:loc[1]]
				// Part of a name built from a shell variable ("ttft-$n.md").
				if loc[0] > 0 && (text[loc[0]-1] == '$' || text[loc[0]-1] == '}') {
					continue
				}
				name := strings.TrimLeft(tok, ".")
				if have[name] || external[name] != "" || matchAny(reports, name) {
					continue
				}
				bad = append(bad, f+":"+itoa(l.n)+": "+tok)
			}
		}
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Errorf("%s: no such file in the repository", b)
	}
}

func matchAny(globs []string, name string) bool {
	for _, g := range globs {
		if ok, _ := path.Match(g, name); ok {
			return true
		}
	}
	return false
}

func pathBase(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[i+1:]
	}
	return p
}

// isBinary reports a NUL byte in the first 8000 bytes, git's own rule.
func isBinary(data []byte) bool {
	head := data
	if len(head) > 8000 {
		head = head[:8000]
	}
	return bytes.IndexByte(head, 0) >= 0
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}
