package hub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Options of Download. The zero value of every field but Repo is usable.
type Options struct {
	Repo     string // ORG/NAME
	Revision string // branch, tag or commit hash; "" = main

	// LocalDir, when set, receives the files as a plain tree, with the
	// download metadata and .incomplete files under LocalDir/.cache/huggingface
	// (as huggingface_hub's local_dir). Otherwise the files go to the hub
	// cache: CacheDir/models--ORG--NAME/{blobs,refs,snapshots}.
	LocalDir string
	CacheDir string // "" = DefaultCacheDir()

	Include, Exclude []string // fnmatch-style globs (see Globs)

	Workers      int           // files downloaded at once; 0 = 8
	MaxAttempts  int           // tries of a file in a row that bring no byte; 0 = 6
	Backoff      time.Duration // first wait between tries, doubled up to MaxBackoff; 0 = 1 s
	MaxBackoff   time.Duration // 0 = 30 s
	StallTimeout time.Duration // a response that brings no byte for this long is dropped and retried; 0 = 60 s

	// Verify re-hashes every file already on disk; a file that does not
	// match is downloaded again.
	Verify bool
	// DryRun resolves the listing and reports what is on disk and what a
	// download would fetch, writing nothing.
	DryRun bool

	Progress Progress     // nil = none
	Log      *slog.Logger // nil = discard
	// FreeSpace returns the bytes available to an unprivileged user on the
	// file system of dir (negative: unknown). nil = statfs.
	FreeSpace func(dir string) (int64, error)
}

// File statuses in a Result.
const (
	StatusDownloaded = "downloaded" // fetched in full by this run
	StatusResumed    = "resumed"    // completed from a previous run's .incomplete file
	StatusPresent    = "present"    // already complete on disk (trusted: it was verified when written)
	StatusVerified   = "verified"   // already on disk and re-hashed by this run
	StatusReplaced   = "replaced"   // on disk but wrong (--verify or size), downloaded again
	StatusFailed     = "failed"
	// Dry runs only:
	StatusMissing  = "missing"
	StatusPartial  = "partial" // an .incomplete file holds part of it
	StatusCorrupt  = "corrupt"
	StatusOutdated = "outdated" // local dir: another version of the file is there
)

// FileResult is one selected file of a Result.
type FileResult struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256,omitempty"`
	GitOID string `json:"git_oid,omitempty"`
	Status string `json:"status"`
	// Fetched counts the bytes this run downloaded for the file.
	Fetched int64  `json:"fetched_bytes"`
	Error   string `json:"error,omitempty"`
}

// Result says what Download did.
type Result struct {
	Repo     string `json:"repo"`
	Revision string `json:"revision"`
	Commit   string `json:"commit"`
	Endpoint string `json:"endpoint"`
	Layout   string `json:"layout"` // "hub-cache" or "local-dir"
	// Dir holds the files under their repository names: the snapshot of the
	// commit in the hub cache, or the local directory. It is what to pass to
	// --model and inspect.
	Dir string `json:"dir"`
	// RepoDir is the repository's folder in the hub cache (hub-cache only).
	RepoDir string `json:"repo_dir,omitempty"`

	RepoFiles  int          `json:"repo_files"` // files in the listing
	Files      []FileResult `json:"files"`      // the selected ones
	TotalBytes int64        `json:"total_bytes"`
	// NeedBytes is what remained to download when the run started
	// (.incomplete files deducted); FetchedBytes what it downloaded.
	NeedBytes    int64 `json:"need_bytes"`
	FetchedBytes int64 `json:"fetched_bytes"`
	FreeBytes    int64 `json:"free_bytes"` // at the start; -1 = unknown
	// AlreadyComplete is true when every selected file was already on disk.
	AlreadyComplete bool    `json:"already_complete"`
	DryRun          bool    `json:"dry_run,omitempty"`
	Seconds         float64 `json:"seconds"`
}

// Count returns how many files have the status.
func (r *Result) Count(status string) int {
	n := 0
	for _, f := range r.Files {
		if f.Status == status {
			n++
		}
	}
	return n
}

func (o Options) withDefaults() Options {
	if o.Revision == "" {
		o.Revision = "main"
	}
	if o.Workers <= 0 {
		o.Workers = 8
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 6
	}
	if o.Backoff <= 0 {
		o.Backoff = time.Second
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 30 * time.Second
	}
	if o.StallTimeout <= 0 {
		o.StallTimeout = 60 * time.Second
	}
	if o.Progress == nil {
		o.Progress = nopProgress{}
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.FreeSpace == nil {
		o.FreeSpace = freeSpace
	}
	return o
}

// fsError is a local file-system failure (not worth retrying).
type fsError struct {
	file string
	err  error
}

func (e *fsError) Error() string { return fmt.Sprintf("%s: %v", e.file, e.err) }
func (e *fsError) Unwrap() error { return e.err }

// fsErr names a file under the target directory in full.
func (d *downloader) fsErr(name string, err error) error {
	if d.root != nil {
		name = filepath.Join(d.root.Name(), filepath.FromSlash(name))
	}
	return &fsError{file: name, err: err}
}

// sizeError is a server that sends a size other than its listing's.
type sizeError struct {
	file      string
	got, want int64
	what      string
}

func (e *sizeError) Error() string {
	return fmt.Sprintf("%s: %s %d bytes, the listing says %d", e.file, e.what, e.got, e.want)
}

// target is one selected file and where it goes.
type target struct {
	file RepoFile
	res  *FileResult
	// link is the snapshot entry (hub cache), linkTo its relative target.
	link, linkTo string
	// meta is the local-dir metadata file.
	meta string
	job  *job
}

// job is one file to put on disk: final is its path under the root,
// incomplete where it grows. In the hub cache several targets with the same
// content share one blob, hence one job.
type job struct {
	file        RepoFile
	final       string
	incomplete  string
	targets     []*target
	complete    bool  // final is on disk and good
	offset      int64 // bytes in incomplete at the start
	replace     bool  // final was on disk but wrong
	metaStale   bool  // local dir: complete, but its metadata names another commit
	outdated    bool  // local dir: another version of the file is on disk
	fetched     int64
	resumedFrom int64
	done        bool // fetched, verified and renamed into place
	err         error
}

type downloader struct {
	c      *Client
	o      Options
	local  bool
	root   *os.Root // nil in a dry run of a directory that does not exist
	commit string
}

// Download fetches the selected files of a model repository at a revision,
// resuming .incomplete files, verifying size and checksum of every file, and
// leaving already complete files alone. It returns a Result even when some
// files failed (with the error), so a caller can report what was done.
func Download(ctx context.Context, c *Client, o Options) (*Result, error) {
	start := time.Now()
	o = o.withDefaults()
	if err := ValidateRepoID(o.Repo); err != nil {
		return nil, err
	}
	if err := checkRelPath("revision", o.Revision); err != nil {
		return nil, err
	}
	globs, err := NewGlobs(o.Include, o.Exclude)
	if err != nil {
		return nil, err
	}
	d := &downloader{c: c, o: o, local: o.LocalDir != ""}

	var info *RepoInfo
	err = d.retry(ctx, "list "+o.Repo, func() error {
		var err error
		info, err = c.ModelInfo(ctx, o.Repo, o.Revision)
		return err
	})
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) && ctx.Err() == nil {
			return nil, fmt.Errorf("list %s at %s: cannot reach %s (no network? HF_ENDPOINT or --endpoint can name a mirror): %w",
				o.Repo, o.Revision, c.Endpoint, err)
		}
		return nil, fmt.Errorf("list %s at %s: %w", o.Repo, o.Revision, err)
	}
	if !hexID.MatchString(info.Commit) {
		return nil, &pathError{what: "commit id", name: info.Commit, why: "not a hexadecimal hash"}
	}
	d.commit = info.Commit
	if info.Gated != "" && c.Token == "" {
		// The hub lists a gated repository to anyone but refuses its files
		// (401) without a token: stop before creating anything.
		e := &Error{Status: http.StatusUnauthorized, Code: "GatedRepo", Repo: o.Repo,
			Message: "the listing marks the repository as gated (" + info.Gated + ") and no token was given"}
		c.addHint(e, o.Revision)
		return nil, e
	}
	files, err := d.selectFiles(ctx, info, globs)
	if err != nil {
		return nil, err
	}
	res := &Result{Repo: o.Repo, Revision: o.Revision, Commit: info.Commit, Endpoint: c.Endpoint,
		RepoFiles: len(info.Files), DryRun: o.DryRun, FreeBytes: -1}
	rootDir, err := d.openRoot(res)
	if err != nil {
		return nil, err
	}
	if d.root != nil {
		defer d.root.Close()
	}
	o.Log.Info("download: resolved", "repo", o.Repo, "revision", o.Revision, "commit", info.Commit,
		"files", len(files), "of", len(info.Files), "endpoint", c.Endpoint, "dir", res.Dir)
	if !o.DryRun {
		unlock, err := d.lock(rootDir)
		if err != nil {
			return nil, err
		}
		defer unlock()
		if err := d.writeRef(); err != nil {
			return nil, err
		}
	}

	targets, jobs, err := d.plan(files, res)
	if err != nil {
		return nil, err
	}
	if err := d.check(ctx, jobs); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("interrupted while hashing the files on disk (nothing was removed): %w", err)
		}
		return nil, err
	}

	var todo []*job
	for _, j := range jobs {
		res.TotalBytes += j.file.Size
		if !j.complete {
			todo = append(todo, j)
			res.NeedBytes += j.file.Size - j.offset
		}
	}
	res.AlreadyComplete = len(todo) == 0
	if free, err := o.FreeSpace(existingParent(rootDir)); err == nil {
		res.FreeBytes = free
	}
	if o.DryRun {
		d.finishDry(targets)
		res.Seconds = time.Since(start).Seconds()
		return res, nil
	}
	if res.NeedBytes > 0 && res.FreeBytes >= 0 && res.NeedBytes > res.FreeBytes {
		return nil, fmt.Errorf("not enough space for %s in %s: %s to download, %s free (.incomplete files already deducted)",
			o.Repo, rootDir, fmtBytes(res.NeedBytes), fmtBytes(res.FreeBytes))
	}
	// Complete files are linked (or their metadata refreshed) first, so a
	// run that is interrupted leaves every finished file usable.
	for _, t := range targets {
		if t.job.complete && (!d.local || t.job.metaStale) {
			if err := d.place(t); err != nil {
				return nil, err
			}
		}
	}
	var dlErr error
	if len(todo) > 0 {
		dlErr = d.fetchAll(ctx, todo)
	}
	for _, t := range targets {
		j := t.job
		t.res.Fetched = j.fetched
		switch {
		case j.complete:
			// status set by check
		case !j.done:
			t.res.Status, t.res.Error = StatusFailed, j.err.Error()
		default:
			if err := d.place(t); err != nil {
				t.res.Status, t.res.Error = StatusFailed, err.Error()
				dlErr = errors.Join(dlErr, err)
				continue
			}
			switch {
			case j.replace:
				t.res.Status = StatusReplaced
			case j.resumedFrom > 0:
				t.res.Status = StatusResumed
			default:
				t.res.Status = StatusDownloaded
			}
		}
	}
	for _, j := range jobs {
		res.FetchedBytes += j.fetched
	}
	res.Seconds = time.Since(start).Seconds()
	return res, dlErr
}

// selectFiles validates every listed name (a hostile name anywhere in the
// listing refuses the whole download), applies the globs, and fills in
// sizes and checksums a mirror's listing may lack.
func (d *downloader) selectFiles(ctx context.Context, info *RepoInfo, g *Globs) ([]RepoFile, error) {
	seen := make(map[string]bool, len(info.Files))
	for _, f := range info.Files {
		if err := checkFileName(f.Path, d.local); err != nil {
			return nil, err
		}
		if seen[f.Path] {
			return nil, &pathError{what: "file name", name: f.Path, why: "listed twice"}
		}
		seen[f.Path] = true
	}
	for p := range seen {
		for dir := path.Dir(p); dir != "."; dir = path.Dir(dir) {
			if seen[dir] {
				return nil, &pathError{what: "file name", name: p, why: fmt.Sprintf("%q is listed as a file too", dir)}
			}
		}
	}
	var sel []RepoFile
	for _, f := range info.Files {
		if g.Match(f.Path) {
			sel = append(sel, f)
		}
	}
	if len(sel) == 0 {
		names := make([]string, 0, len(info.Files))
		for _, f := range info.Files {
			names = append(names, f.Path)
		}
		sort.Strings(names)
		if len(names) > 20 {
			names = append(names[:20], "...")
		}
		return nil, fmt.Errorf("no file of %s matches --include/--exclude (the repository has %d: %s)",
			d.o.Repo, len(info.Files), strings.Join(names, ", "))
	}
	for i := range sel {
		f := &sel[i]
		if f.Size < 0 || f.ETag() == "" {
			var m *FileMeta
			err := d.retry(ctx, "HEAD "+f.Path, func() error {
				var err error
				m, err = d.c.HeadFile(ctx, d.o.Repo, d.commit, f.Path)
				return err
			})
			if err != nil {
				return nil, err
			}
			if f.Size < 0 {
				f.Size = m.Size
			}
			if f.ETag() == "" {
				switch len(m.ETag) {
				case 64:
					f.SHA256 = m.ETag
				case 40:
					f.GitOID = m.ETag
				}
			}
		}
		if f.Size < 0 {
			return nil, fmt.Errorf("%s: the server gives no size for it", f.Path)
		}
		if f.SHA256 != "" && (len(f.SHA256) != 64 || !hexID.MatchString(f.SHA256)) {
			return nil, &pathError{what: "sha256", name: f.SHA256, why: "not 64 hexadecimal digits (file " + f.Path + ")"}
		}
		if f.SHA256 == "" {
			if f.GitOID == "" {
				return nil, fmt.Errorf("%s: the server gives no checksum (sha256 or git blob id) for it", f.Path)
			}
			if !hexID.MatchString(f.GitOID) {
				return nil, &pathError{what: "git blob id", name: f.GitOID, why: "not a hexadecimal hash (file " + f.Path + ")"}
			}
		}
	}
	sort.Slice(sel, func(a, b int) bool { return sel[a].Path < sel[b].Path })
	return sel, nil
}

// openRoot creates (unless a dry run) and opens the target directory; every
// later file operation goes through the os.Root, which refuses any path or
// link that leads outside it.
func (d *downloader) openRoot(res *Result) (string, error) {
	var rootDir string
	if d.local {
		rootDir = d.o.LocalDir
		res.Layout, res.Dir = "local-dir", rootDir
	} else {
		cache := d.o.CacheDir
		if cache == "" {
			var err error
			if cache, err = DefaultCacheDir(); err != nil {
				return "", err
			}
		}
		rootDir = filepath.Join(cache, cacheFolderName(d.o.Repo))
		res.Layout, res.RepoDir = "hub-cache", rootDir
		res.Dir = filepath.Join(rootDir, "snapshots", d.commit)
	}
	if !d.o.DryRun {
		if err := os.MkdirAll(rootDir, 0o755); err != nil {
			return "", fmt.Errorf("create %s: %w", rootDir, err)
		}
	}
	root, err := os.OpenRoot(rootDir)
	switch {
	case err == nil:
		d.root = root
	case d.o.DryRun && errors.Is(err, fs.ErrNotExist):
	default:
		return "", fmt.Errorf("open %s: %w", rootDir, err)
	}
	return rootDir, nil
}

// lock takes the target directory for this process: two downloads into the
// same .incomplete file would corrupt it.
func (d *downloader) lock(rootDir string) (func(), error) {
	var name string
	if d.local {
		name = ".cache/huggingface/.glmctl-download.lock"
	} else {
		name = ".locks/glmctl-download.lock"
	}
	if err := d.root.MkdirAll(path.Dir(name), 0o755); err != nil {
		return nil, &fsError{file: filepath.Join(rootDir, name), err: err}
	}
	if _, err := d.root.Lstat(".cache/huggingface/.gitignore"); d.local && errors.Is(err, fs.ErrNotExist) {
		if err := d.root.WriteFile(".cache/huggingface/.gitignore", []byte("*\n"), 0o644); err != nil {
			return nil, &fsError{file: filepath.Join(rootDir, ".cache/huggingface/.gitignore"), err: err}
		}
	}
	f, err := d.root.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, &fsError{file: filepath.Join(rootDir, name), err: err}
	}
	if err := lockFile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: another download into %s is running (%v)", filepath.Join(rootDir, name), rootDir, err)
	}
	return func() { f.Close() }, nil
}

// writeRef records the commit a branch or tag resolved to (hub cache).
func (d *downloader) writeRef() error {
	if d.local || d.o.Revision == d.commit {
		return nil
	}
	name := "refs/" + d.o.Revision
	if err := d.root.MkdirAll(path.Dir(name), 0o755); err != nil {
		return d.fsErr(name, err)
	}
	if b, err := d.root.ReadFile(name); err == nil && string(b) == d.commit {
		return nil
	}
	if err := d.atomicWrite(name, []byte(d.commit)); err != nil {
		return err
	}
	return nil
}

func (d *downloader) atomicWrite(name string, b []byte) error {
	tmp := name + ".tmp"
	if err := d.root.WriteFile(tmp, b, 0o644); err != nil {
		return d.fsErr(name, err)
	}
	if err := d.root.Rename(tmp, name); err != nil {
		return d.fsErr(name, err)
	}
	return nil
}

// plan maps the selected files to targets and jobs.
func (d *downloader) plan(files []RepoFile, res *Result) ([]*target, []*job, error) {
	res.Files = make([]FileResult, len(files))
	targets := make([]*target, len(files))
	byFinal := map[string]*job{}
	var jobs []*job
	for i, f := range files {
		res.Files[i] = FileResult{Path: f.Path, Size: f.Size, SHA256: f.SHA256, GitOID: f.GitOID}
		t := &target{file: f, res: &res.Files[i]}
		targets[i] = t
		var final, inc string
		if d.local {
			final = f.Path
			inc = ".cache/huggingface/download/" + f.Path + "." + f.ETag() + ".incomplete"
			t.meta = ".cache/huggingface/download/" + f.Path + ".metadata"
		} else {
			final = "blobs/" + f.ETag()
			inc = final + ".incomplete"
			t.link = "snapshots/" + d.commit + "/" + f.Path
			t.linkTo = strings.Repeat("../", strings.Count(f.Path, "/")) + "../../" + final
		}
		j := byFinal[final]
		if j == nil {
			j = &job{file: f, final: final, incomplete: inc}
			byFinal[final] = j
			jobs = append(jobs, j)
		} else if j.file.Size != f.Size {
			return nil, nil, fmt.Errorf("%s and %s: the same checksum %s with different sizes (%d, %d)",
				j.file.Path, f.Path, f.ETag(), j.file.Size, f.Size)
		}
		j.targets = append(j.targets, t)
		t.job = j
	}
	return targets, jobs, nil
}

// check finds what is on disk: complete files (re-hashed with --verify, or
// in a local directory without up-to-date metadata), wrong ones, and
// .incomplete files to resume.
func (d *downloader) check(ctx context.Context, jobs []*job) error {
	var hashJobs []*job
	for _, j := range jobs {
		if d.root == nil {
			d.setStatus(j, StatusMissing)
			continue
		}
		st, err := d.root.Lstat(j.final)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return d.fsErr(j.final, err)
		case !st.Mode().IsRegular() || st.Size() != j.file.Size:
			// A link, a directory or a file of the wrong size: wrong,
			// unless it is a local-dir file of another commit (outdated).
			j.outdated = d.local && d.outdated(j)
			j.replace = !j.outdated
			if !d.o.DryRun && (!d.local || !st.IsDir()) {
				if err := d.root.Remove(j.final); err != nil {
					return d.fsErr(j.final, err)
				}
			}
		case d.o.Verify:
			hashJobs = append(hashJobs, j)
		default:
			if d.local {
				if d.outdated(j) {
					j.outdated = true
					break
				}
				current, sameCommit := d.metadataCurrent(j, st)
				if !current {
					hashJobs = append(hashJobs, j)
					break
				}
				j.metaStale = !sameCommit
			}
			j.complete = true
			d.setStatus(j, StatusPresent)
		}
		if ist, err := d.root.Lstat(j.incomplete); err == nil {
			switch {
			case j.complete:
				if !d.o.DryRun {
					_ = d.root.RemoveAll(j.incomplete) // left over; the file is complete
				}
			case ist.Mode().IsRegular() && ist.Size() <= j.file.Size:
				j.offset = ist.Size()
			case !d.o.DryRun:
				if err := d.root.RemoveAll(j.incomplete); err != nil {
					return d.fsErr(j.incomplete, err)
				}
			}
		}
	}
	if len(hashJobs) > 0 {
		if err := d.hashAll(ctx, hashJobs); err != nil {
			return err
		}
	}
	for _, j := range jobs {
		if j.complete || !d.o.DryRun {
			continue
		}
		switch {
		case j.replace:
			d.setStatus(j, StatusCorrupt)
		case j.outdated:
			d.setStatus(j, StatusOutdated)
		case j.offset > 0:
			d.setStatus(j, StatusPartial)
		default:
			d.setStatus(j, StatusMissing)
		}
	}
	return nil
}

func (d *downloader) setStatus(j *job, s string) {
	for _, t := range j.targets {
		t.res.Status = s
	}
}

// metadataCurrent reads a local-dir file's metadata (huggingface_hub's
// format: commit, etag, timestamp): current when it names the file's etag
// and the file was not modified after it was written; sameCommit when it
// also names this commit.
func (d *downloader) metadataCurrent(j *job, st fs.FileInfo) (current, sameCommit bool) {
	t := j.targets[0]
	b, err := d.root.ReadFile(t.meta)
	if err != nil {
		return false, false
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 3 || lines[1] != j.file.ETag() {
		return false, false
	}
	ts, err := strconv.ParseFloat(strings.TrimSpace(lines[2]), 64)
	if err != nil {
		return false, false
	}
	mtime := float64(st.ModTime().UnixNano()) / 1e9
	return mtime-1 <= ts, lines[0] == d.commit
}

// outdated reports whether a local-dir file's metadata names another
// version of it.
func (d *downloader) outdated(j *job) bool {
	b, err := d.root.ReadFile(j.targets[0].meta)
	if err != nil {
		return false
	}
	lines := strings.Split(string(b), "\n")
	return len(lines) >= 3 && lines[1] != "" && lines[1] != j.file.ETag()
}

// hashAll re-hashes files on disk, in parallel.
func (d *downloader) hashAll(ctx context.Context, jobs []*job) error {
	var total int64
	for _, j := range jobs {
		total += j.file.Size
	}
	p := d.o.Progress
	p.Phase("verify", len(jobs), total)
	defer p.Finish()
	err := forEach(ctx, d.o.Workers, jobs, func(ctx context.Context, j *job) error {
		p.FileStart(j.file.Path, 0, j.file.Size)
		err := d.hashFile(ctx, j)
		p.FileDone(j.file.Path, err)
		var ce *checksumError
		switch {
		case err == nil:
			j.complete = true
			d.setStatus(j, StatusVerified)
			if d.local && !d.o.DryRun {
				for _, t := range j.targets {
					if err := d.writeMeta(t); err != nil {
						return err
					}
				}
			}
			return nil
		case errors.As(err, &ce):
			j.outdated = d.local && d.outdated(j)
			j.replace = !j.outdated
			if j.replace && !d.o.DryRun {
				p.Note("file on disk is wrong; it will be downloaded again", "file", j.file.Path, "err", err.Error())
			}
			if !d.o.DryRun {
				if err := d.root.Remove(j.final); err != nil {
					return d.fsErr(j.final, err)
				}
				if d.local {
					_ = d.root.Remove(j.targets[0].meta)
				}
			}
			return nil
		}
		return err
	})
	return err
}

func (d *downloader) hashFile(ctx context.Context, j *job) error {
	f, err := d.root.Open(j.final)
	if err != nil {
		return d.fsErr(j.final, err)
	}
	defer f.Close()
	v := newVerifier(j.file)
	buf := make([]byte, 4<<20)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := f.Read(buf)
		if n > 0 {
			v.Write(buf[:n])
			d.o.Progress.Add(j.file.Path, int64(n))
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return d.fsErr(j.final, err)
		}
	}
	return v.check(j.file.Path)
}

// finishDry fills in dry-run statuses that check left.
func (d *downloader) finishDry(targets []*target) {
	for _, t := range targets {
		if t.res.Status == "" {
			t.res.Status = StatusMissing
		}
	}
}

// place makes a complete file visible under its repository name: a
// snapshot link to its blob (hub cache), or current metadata (local dir).
func (d *downloader) place(t *target) error {
	if d.local {
		return d.writeMeta(t)
	}
	if cur, err := d.root.Readlink(t.link); err == nil && cur == t.linkTo {
		return nil
	}
	if err := d.root.MkdirAll(path.Dir(t.link), 0o755); err != nil {
		return d.fsErr(t.link, err)
	}
	tmp := t.link + ".tmp-link"
	_ = d.root.Remove(tmp)
	if err := d.root.Symlink(t.linkTo, tmp); err != nil {
		return d.fsErr(t.link, err)
	}
	if err := d.root.Rename(tmp, t.link); err != nil {
		_ = d.root.Remove(tmp)
		return d.fsErr(t.link, err)
	}
	return nil
}

func (d *downloader) writeMeta(t *target) error {
	if err := d.root.MkdirAll(path.Dir(t.meta), 0o755); err != nil {
		return d.fsErr(t.meta, err)
	}
	ts := strconv.FormatFloat(float64(time.Now().UnixNano())/1e9, 'f', 3, 64)
	return d.atomicWrite(t.meta, []byte(d.commit+"\n"+t.file.ETag()+"\n"+ts+"\n"))
}

// fetchAll downloads jobs on Workers goroutines: small files first (the
// config and tokenizer are usable early), then in name order. A file that
// fails does not stop the others unless no other can succeed (a refused
// token, a missing repository) or ctx is cancelled.
func (d *downloader) fetchAll(ctx context.Context, jobs []*job) error {
	sort.SliceStable(jobs, func(a, b int) bool {
		sa, sb := jobs[a].file.Size < 10<<20, jobs[b].file.Size < 10<<20
		if sa != sb {
			return sa
		}
		return jobs[a].file.Path < jobs[b].file.Path
	})
	var need int64
	for _, j := range jobs {
		need += j.file.Size - j.offset
	}
	p := d.o.Progress
	p.Phase("download", len(jobs), need)
	defer p.Finish()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var errs []error
	var mu sync.Mutex
	_ = forEach(ctx, d.o.Workers, jobs, func(ctx context.Context, j *job) error {
		err := d.fetch(ctx, j)
		p.FileDone(j.file.Path, err)
		j.done = err == nil
		if err != nil {
			j.err = err
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
			var he *Error
			if errors.As(err, &he) && he.Fatal() {
				cancel(err)
			}
		}
		return nil
	})
	for _, j := range jobs {
		if !j.done && j.err == nil {
			j.err = fmt.Errorf("%s: not downloaded: the download stopped", j.file.Path)
		}
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("interrupted: partial files are kept as .incomplete; run the same command again to resume: %w", err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d of %d file(s) failed: %w", len(errs), len(jobs), errors.Join(errs...))
	}
	return nil
}

// forEach runs fn on items with at most n at once; it stops handing out
// items when ctx is done or fn fails, and returns the first failure. No item
// starts once ctx is done: the feeder's select may still hand one over after
// the cancel (both of its cases ready, Go picks either), and a worker skips it
// (a zero-byte file, which needs no request, was otherwise still written after
// a refused token had stopped the download).
func forEach[T any](ctx context.Context, n int, items []T, fn func(context.Context, T) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	ch := make(chan T)
	var wg sync.WaitGroup
	for range min(n, len(items)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range ch {
				if ctx.Err() != nil {
					continue
				}
				if err := fn(ctx, it); err != nil {
					cancel(err)
				}
			}
		}()
	}
feed:
	for _, it := range items {
		select {
		case ch <- it:
		case <-ctx.Done():
			break feed
		}
	}
	close(ch)
	wg.Wait()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return ctx.Err()
}

// fetch downloads one job into its .incomplete file and renames it into
// place once size and checksum match. A resumed file whose checksum fails
// is downloaded once more from its start: the part on disk may be what was
// wrong.
func (d *downloader) fetch(ctx context.Context, j *job) error {
	err := d.fetchOnce(ctx, j)
	var ce *checksumError
	if errors.As(err, &ce) && j.resumedFrom > 0 {
		d.o.Progress.Note("checksum mismatch on a resumed file: downloading it again from the start", "file", j.file.Path)
		j.resumedFrom = 0
		err = d.fetchOnce(ctx, j)
	}
	return err
}

var errStalled = errors.New("no data received")

func (d *downloader) fetchOnce(ctx context.Context, j *job) error {
	f := j.file
	if err := d.root.MkdirAll(path.Dir(j.incomplete), 0o755); err != nil {
		return d.fsErr(j.incomplete, err)
	}
	fh, err := d.root.OpenFile(j.incomplete, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return d.fsErr(j.incomplete, err)
	}
	off := int64(0)
	defer func() {
		if fh != nil {
			fh.Close()
			if off == 0 {
				// Nothing worth resuming.
				_ = d.root.Remove(j.incomplete)
			}
		}
	}()
	st, err := fh.Stat()
	if err != nil {
		return d.fsErr(j.incomplete, err)
	}
	off = st.Size()
	if off > f.Size {
		if err := fh.Truncate(0); err != nil {
			return d.fsErr(j.incomplete, err)
		}
		off = 0
	}
	v := newVerifier(f)
	if off > 0 {
		d.o.Log.Debug("download: resuming", "file", f.Path, "at", off, "of", f.Size)
		if _, err := io.Copy(v, io.NewSectionReader(fh, 0, off)); err != nil {
			return d.fsErr(j.incomplete, err)
		}
	}
	j.resumedFrom = off
	d.o.Progress.FileStart(f.Path, off, f.Size)
	// restart drops what is on disk: the file starts over from byte 0.
	restart := func() error {
		if err := fh.Truncate(0); err != nil {
			return d.fsErr(j.incomplete, err)
		}
		off, j.resumedFrom = 0, 0
		v.Reset()
		d.o.Progress.FileStart(f.Path, 0, f.Size)
		return nil
	}
	fails := 0
	for off < f.Size {
		n, err := d.get(ctx, j, fh, v, &off, restart)
		if err == nil && off == f.Size {
			break
		}
		if err == nil {
			err = fmt.Errorf("%s: response ended at byte %d of %d", f.Path, off, f.Size)
		}
		if !errorIsRetryable(ctx, err) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if n > 0 {
			fails = 0
		}
		fails++
		if fails >= d.o.MaxAttempts {
			return fmt.Errorf("%s: giving up after %d tries without progress: %w", f.Path, fails, err)
		}
		wait := d.backoff(fails, err)
		d.o.Progress.Note("retrying", "file", f.Path, "at", off, "of", f.Size, "in", wait.Round(time.Millisecond).String(), "err", err.Error())
		if err := sleep(ctx, wait); err != nil {
			return err
		}
	}
	if err := v.check(f.Path); err != nil {
		fh.Close()
		fh = nil
		if rerr := d.root.Remove(j.incomplete); rerr != nil {
			return errors.Join(err, d.fsErr(j.incomplete, rerr))
		}
		return err
	}
	if err := fh.Sync(); err != nil {
		return d.fsErr(j.incomplete, err)
	}
	if err := fh.Close(); err != nil {
		fh = nil
		return d.fsErr(j.incomplete, err)
	}
	fh = nil
	if err := d.root.MkdirAll(path.Dir(j.final), 0o755); err != nil {
		return d.fsErr(j.final, err)
	}
	if err := d.root.Rename(j.incomplete, j.final); err != nil {
		return d.fsErr(j.final, err)
	}
	return nil
}

// get does one GET of the file from *off, appending what arrives to fh and
// v. It returns how many bytes it added.
func (d *downloader) get(ctx context.Context, j *job, fh *os.File, v *verifier, off *int64, restart func() error) (int64, error) {
	f := j.file
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stall := time.AfterFunc(d.o.StallTimeout, func() { cancel(errStalled) })
	defer stall.Stop()
	stallErr := func(err error) error {
		if errors.Is(context.Cause(actx), errStalled) && ctx.Err() == nil {
			return fmt.Errorf("%s: no data for %s at byte %d: %w", f.Path, d.o.StallTimeout, *off, errStalled)
		}
		return err
	}
	req, err := d.c.newRequest(actx, http.MethodGet, d.c.ResolveURL(d.o.Repo, d.commit, f.Path))
	if err != nil {
		return 0, err
	}
	if *off > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", *off))
	}
	resp, err := d.c.httpClient().Do(req)
	if err != nil {
		return 0, stallErr(fmt.Errorf("%s: %w", f.Path, err))
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusPartialContent:
		start, total, ok := parseContentRange(resp.Header.Get("Content-Range"))
		if total >= 0 && total != f.Size {
			return 0, &sizeError{file: f.Path, got: total, want: f.Size, what: "the server has"}
		}
		if !ok || start != *off {
			d.o.Progress.Note("the server answered another range: starting the file over", "file", f.Path,
				"asked", *off, "content-range", resp.Header.Get("Content-Range"))
			if err := restart(); err != nil {
				return 0, err
			}
			return 0, fmt.Errorf("%s: unexpected Content-Range %q", f.Path, resp.Header.Get("Content-Range"))
		}
	case http.StatusOK:
		if resp.ContentLength >= 0 && resp.ContentLength != f.Size {
			return 0, &sizeError{file: f.Path, got: resp.ContentLength, want: f.Size, what: "the server sends"}
		}
		if *off > 0 {
			d.o.Progress.Note("the server ignored the range request: starting the file over", "file", f.Path, "at", *off)
			if err := restart(); err != nil {
				return 0, err
			}
		}
	case http.StatusRequestedRangeNotSatisfiable:
		// The part on disk is longer than what the server has now.
		if err := restart(); err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("%s: range not satisfiable at byte %d", f.Path, *off)
	default:
		return 0, d.c.responseError(resp, d.o.Repo, d.commit, f.Path)
	}
	buf := make([]byte, 1<<20)
	var n int64
	for {
		k, rerr := resp.Body.Read(buf)
		if k > 0 {
			stall.Reset(d.o.StallTimeout)
			if *off+int64(k) > f.Size {
				return n, &sizeError{file: f.Path, got: *off + int64(k), want: f.Size, what: "the server sent at least"}
			}
			if _, err := fh.WriteAt(buf[:k], *off); err != nil {
				return n, d.fsErr(j.incomplete, err)
			}
			v.Write(buf[:k])
			*off += int64(k)
			n += int64(k)
			j.fetched += int64(k)
			d.o.Progress.Add(f.Path, int64(k))
		}
		if rerr == io.EOF {
			if *off < f.Size {
				return n, fmt.Errorf("%s: connection closed at byte %d of %d: %w", f.Path, *off, f.Size, io.ErrUnexpectedEOF)
			}
			return n, nil
		}
		if rerr != nil {
			return n, stallErr(fmt.Errorf("%s: connection broke at byte %d of %d: %w", f.Path, *off, f.Size, rerr))
		}
	}
}

// parseContentRange reads "bytes START-END/TOTAL" (TOTAL may be "*": -1).
func parseContentRange(s string) (start, total int64, ok bool) {
	rest, found := strings.CutPrefix(s, "bytes ")
	if !found {
		return 0, -1, false
	}
	rng, tot, found := strings.Cut(rest, "/")
	if !found {
		return 0, -1, false
	}
	a, _, found := strings.Cut(rng, "-")
	if !found {
		return 0, -1, false
	}
	start, err := strconv.ParseInt(a, 10, 64)
	if err != nil {
		return 0, -1, false
	}
	total = -1
	if tot != "*" {
		if total, err = strconv.ParseInt(tot, 10, 64); err != nil {
			return 0, -1, false
		}
	}
	return start, total, true
}

// backoff is the wait before try number fails+1: Backoff doubled per
// failure up to MaxBackoff, ±20 % jitter, or the server's Retry-After.
func (d *downloader) backoff(fails int, err error) time.Duration {
	w := d.o.Backoff << min(fails-1, 20)
	if w > d.o.MaxBackoff || w <= 0 {
		w = d.o.MaxBackoff
	}
	var he *Error
	if errors.As(err, &he) && he.RetryAfter > 0 {
		return min(he.RetryAfter, 2*d.o.MaxBackoff)
	}
	return time.Duration(float64(w) * (0.8 + 0.4*rand.Float64()))
}

// retry runs a request until it succeeds, fails for good, or has failed
// MaxAttempts times.
func (d *downloader) retry(ctx context.Context, what string, fn func() error) error {
	for fails := 1; ; fails++ {
		err := fn()
		if err == nil || !errorIsRetryable(ctx, err) || fails >= d.o.MaxAttempts {
			if err != nil && ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		wait := d.backoff(fails, err)
		d.o.Log.Warn("retrying", "what", what, "in", wait.Round(time.Millisecond).String(), "err", err)
		if err := sleep(ctx, wait); err != nil {
			return err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// existingParent returns dir or its nearest existing parent (for statfs in
// a dry run).
func existingParent(dir string) string {
	for {
		if _, err := os.Stat(dir); err == nil {
			return dir
		}
		p := filepath.Dir(dir)
		if p == dir {
			return dir
		}
		dir = p
	}
}

// fmtBytes formats a byte count in decimal units (GB = 1e9).
func fmtBytes(n int64) string {
	f := float64(n)
	switch {
	case f >= 1e12:
		return fmt.Sprintf("%.2f TB", f/1e12)
	case f >= 1e9:
		return fmt.Sprintf("%.2f GB", f/1e9)
	case f >= 1e6:
		return fmt.Sprintf("%.2f MB", f/1e6)
	case f >= 1e3:
		return fmt.Sprintf("%.1f kB", f/1e3)
	}
	return fmt.Sprintf("%d B", n)
}
