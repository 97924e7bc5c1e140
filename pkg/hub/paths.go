package hub

import (
	"fmt"
	"regexp"
	"strings"
)

var (
	repoPart = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	hexID    = regexp.MustCompile(`^(?:[0-9a-f]{40}|[0-9a-f]{64})$`)
)

// ValidateRepoID checks ORG/NAME: two parts of letters, digits, '.', '_'
// and '-', neither starting with a punctuation mark nor holding "..".
func ValidateRepoID(id string) error {
	org, name, ok := strings.Cut(id, "/")
	if !ok || !repoPart.MatchString(org) || !repoPart.MatchString(name) ||
		strings.Contains(id, "..") || len(id) > 96 {
		return fmt.Errorf("repository %q: want ORG/NAME (e.g. zai-org/GLM-4.7-FP8)", id)
	}
	return nil
}

// cacheFolderName is the hub cache's folder of a model repository.
func cacheFolderName(repo string) string {
	return "models--" + strings.ReplaceAll(repo, "/", "--")
}

// pathError is a file name from the server that could write outside the
// target directory, or a revision that cannot name a refs file.
type pathError struct {
	what, name, why string
}

func (e *pathError) Error() string {
	return fmt.Sprintf("refusing %s %q from the server: %s (nothing was written)", e.what, e.name, e.why)
}

// checkRelPath accepts a '/'-separated relative path whose every component
// is a plain name: no "..", no ".", no empty component (so no leading '/'),
// no backslash, no control characters.
func checkRelPath(what, p string) error {
	bad := func(why string) error { return &pathError{what: what, name: p, why: why} }
	switch {
	case p == "":
		return bad("empty name")
	case strings.HasPrefix(p, "/"):
		return bad("absolute path")
	case strings.Contains(p, `\`):
		return bad("backslash in the name")
	case len(p) > 4096:
		return bad("name too long")
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f {
			return bad("control character in the name")
		}
	}
	for _, c := range strings.Split(p, "/") {
		switch c {
		case "":
			return bad("empty path component")
		case ".", "..":
			return bad(fmt.Sprintf("%q path component", c))
		}
	}
	return nil
}

// checkFileName accepts a repository file name that can be written under
// the target directory. localDir mode also keeps .cache/huggingface for the
// downloader's own metadata.
func checkFileName(p string, localDir bool) error {
	if err := checkRelPath("file name", p); err != nil {
		return err
	}
	if localDir && (p == ".cache/huggingface" || strings.HasPrefix(p, ".cache/huggingface/")) {
		return &pathError{what: "file name", name: p, why: "it would overwrite the download metadata in .cache/huggingface"}
	}
	return nil
}

// Globs selects repository files: --include and --exclude patterns in the
// style of huggingface-cli (fnmatch: '*' matches any run of characters,
// '/' included; '?' one character; [abc], [a-z] and [!abc] classes; a
// pattern ending in '/' matches everything under that folder).
type Globs struct {
	include, exclude []*regexp.Regexp
}

// NewGlobs compiles include and exclude patterns. No include pattern selects
// every file; an exclude pattern removes files from the selection.
func NewGlobs(include, exclude []string) (*Globs, error) {
	g := &Globs{}
	for _, p := range include {
		re, err := globRegexp(p)
		if err != nil {
			return nil, fmt.Errorf("--include %q: %w", p, err)
		}
		g.include = append(g.include, re)
	}
	for _, p := range exclude {
		re, err := globRegexp(p)
		if err != nil {
			return nil, fmt.Errorf("--exclude %q: %w", p, err)
		}
		g.exclude = append(g.exclude, re)
	}
	return g, nil
}

// Match reports whether a repository path is selected.
func (g *Globs) Match(p string) bool {
	if g == nil {
		return true
	}
	if len(g.include) > 0 {
		ok := false
		for _, re := range g.include {
			if re.MatchString(p) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	for _, re := range g.exclude {
		if re.MatchString(p) {
			return false
		}
	}
	return true
}

func globRegexp(p string) (*regexp.Regexp, error) {
	if p == "" {
		return nil, fmt.Errorf("empty pattern")
	}
	if strings.HasSuffix(p, "/") {
		p += "*"
	}
	r := []rune(p)
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(r); i++ {
		switch c := r[i]; c {
		case '*':
			b.WriteString(".*")
		case '?':
			b.WriteString(".")
		case '[':
			j := i + 1
			if j < len(r) && r[j] == '!' {
				j++
			}
			if j < len(r) && r[j] == ']' {
				j++
			}
			for j < len(r) && r[j] != ']' {
				j++
			}
			if j >= len(r) {
				return nil, fmt.Errorf("unclosed '['")
			}
			class := string(r[i+1 : j])
			b.WriteString("[")
			if strings.HasPrefix(class, "!") {
				b.WriteString("^")
				class = class[1:]
			}
			b.WriteString(strings.NewReplacer(`\`, `\\`, `[`, `\[`).Replace(class))
			b.WriteString("]")
			i = j
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString("$")
	return regexp.Compile(b.String())
}
