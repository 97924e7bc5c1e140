package hub

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/glmctl/glmctl/pkg/hub/hubtest"
)

const testRepo = "test-org/Tiny-Model"

func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func testFiles() []hubtest.File {
	return []hubtest.File{
		{Path: "config.json", Data: []byte(`{"model_type": "glm4_moe"}` + "\n")},
		{Path: "tokenizer.json", Data: bytes.Repeat([]byte("tok "), 3000)},
		{Path: "tokenizer_config.json", Data: []byte("{}\n")},
		{Path: "model-00001-of-00002.safetensors", Data: randBytes(1, 300_000), LFS: true},
		{Path: "model-00002-of-00002.safetensors", Data: randBytes(2, 200_000), LFS: true},
		{Path: "sub/dir/notes.txt", Data: []byte("hello\n")},
		{Path: "empty.txt", Data: nil},
	}
}

func fileData(files []hubtest.File, path string) []byte {
	for _, f := range files {
		if f.Path == path {
			return f.Data
		}
	}
	return nil
}

// testOptions: the hub cache in a temporary directory, short waits.
func testOptions(t *testing.T) Options {
	t.Helper()
	return Options{
		Repo: testRepo, CacheDir: t.TempDir(), Workers: 3,
		Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, StallTimeout: 5 * time.Second,
	}
}

func newTestHub(t *testing.T) (*hubtest.Server, string, []hubtest.File) {
	t.Helper()
	srv := hubtest.New(t)
	files := testFiles()
	commit := srv.Commit(testRepo, files)
	return srv, commit, files
}

func client(srv *hubtest.Server) *Client { return NewClient(srv.URL, "") }

func etagOf(f hubtest.File) string {
	if f.LFS {
		h := sha256.Sum256(f.Data)
		return hex.EncodeToString(h[:])
	}
	return GitBlobID(f.Data)
}

// checkCache asserts the hub cache layout of a complete download: refs,
// relative snapshot links to blobs named by etag, contents, no leftovers.
func checkCache(t *testing.T, cacheDir, commit string, files []hubtest.File) {
	t.Helper()
	repoDir := filepath.Join(cacheDir, "models--test-org--Tiny-Model")
	if b, err := os.ReadFile(filepath.Join(repoDir, "refs", "main")); err != nil || string(b) != commit {
		t.Errorf("refs/main = %q, %v; want %s", b, err, commit)
	}
	snap := filepath.Join(repoDir, "snapshots", commit)
	for _, f := range files {
		link := filepath.Join(snap, filepath.FromSlash(f.Path))
		target, err := os.Readlink(link)
		if err != nil {
			t.Errorf("%s: not a link: %v", f.Path, err)
			continue
		}
		want := strings.Repeat("../", strings.Count(f.Path, "/")) + "../../blobs/" + etagOf(f)
		if target != want {
			t.Errorf("%s -> %s, want %s", f.Path, target, want)
		}
		got, err := os.ReadFile(link)
		if err != nil || !bytes.Equal(got, f.Data) {
			t.Errorf("%s: content differs (%d bytes, %v)", f.Path, len(got), err)
		}
	}
	noLeftovers(t, repoDir)
}

func noLeftovers(t *testing.T, dir string) {
	t.Helper()
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && (strings.HasSuffix(p, ".incomplete") || strings.HasSuffix(p, ".tmp") || strings.HasSuffix(p, ".tmp-link")) {
			t.Errorf("left over: %s", p)
		}
		return nil
	})
}

func statuses(r *Result) map[string]string {
	m := map[string]string{}
	for _, f := range r.Files {
		m[f.Path] = f.Status
	}
	return m
}

func TestDownloadHubCacheAndRerun(t *testing.T) {
	srv, commit, files := newTestHub(t)
	o := testOptions(t)
	res, err := Download(context.Background(), client(srv), o)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, f := range files {
		total += int64(len(f.Data))
	}
	if res.Commit != commit || res.TotalBytes != total || res.FetchedBytes != total || res.NeedBytes != total || res.AlreadyComplete {
		t.Errorf("result %+v", res)
	}
	if res.Count(StatusDownloaded) != len(files) {
		t.Errorf("statuses %v", statuses(res))
	}
	wantDir := filepath.Join(o.CacheDir, "models--test-org--Tiny-Model", "snapshots", commit)
	if res.Dir != wantDir || res.Layout != "hub-cache" {
		t.Errorf("dir %s layout %s, want %s", res.Dir, res.Layout, wantDir)
	}
	checkCache(t, o.CacheDir, commit, files)

	// A re-run finds everything and does nothing but ask for the listing.
	srv.ResetRequests()
	res, err = Download(context.Background(), client(srv), o)
	if err != nil {
		t.Fatal(err)
	}
	if !res.AlreadyComplete || res.FetchedBytes != 0 || res.NeedBytes != 0 || res.Count(StatusPresent) != len(files) {
		t.Errorf("re-run: %+v %v", res, statuses(res))
	}
	for _, r := range srv.Requests() {
		if !strings.HasPrefix(r.Path, "/api/models/") {
			t.Errorf("re-run requested %s %s", r.Method, r.Path)
		}
	}
	checkCache(t, o.CacheDir, commit, files)
}

func TestDownloadResumesWithinARun(t *testing.T) {
	shard := "model-00001-of-00002.safetensors"
	for _, tc := range []struct {
		name      string
		path      string
		fault     hubtest.Fault
		noRange   bool
		wantRange []string // Range headers of the file's GETs, in order
	}{
		{"dropped connection, LFS", shard, hubtest.Fault{Times: 1, DropAfter: 100_000}, false, []string{"", "bytes=100000-"}},
		{"dropped twice, LFS", shard, hubtest.Fault{Times: 2, DropAfter: 70_000}, false, []string{"", "bytes=70000-", "bytes=140000-"}},
		{"dropped connection, small file", "tokenizer.json", hubtest.Fault{Times: 1, DropAfter: 1000}, false, []string{"", "bytes=1000-"}},
		{"503 then success", shard, hubtest.Fault{Times: 2, Status: 503}, false, []string{"", "", ""}},
		{"500 once", "config.json", hubtest.Fault{Times: 1, Status: 500}, false, []string{"", ""}},
		{"stalled response", shard, hubtest.Fault{Times: 1, HangAfter: 50_000}, false, []string{"", "bytes=50000-"}},
		{"server ignores Range", shard, hubtest.Fault{Times: 1, DropAfter: 100_000}, true, []string{"", "bytes=100000-"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, commit, files := newTestHub(t)
			srv.NoRange = tc.noRange
			srv.SetFault(tc.path, &tc.fault)
			o := testOptions(t)
			if tc.fault.HangAfter > 0 {
				o.StallTimeout = time.Second
			}
			res, err := Download(context.Background(), client(srv), o)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range srv.ContentGETs(tc.path) {
				got = append(got, r.Range)
			}
			if strings.Join(got, "|") != strings.Join(tc.wantRange, "|") {
				t.Errorf("GET ranges %q, want %q", got, tc.wantRange)
			}
			if s := statuses(res)[tc.path]; s != StatusDownloaded {
				t.Errorf("status %s", s)
			}
			checkCache(t, o.CacheDir, commit, files)
		})
	}
}

func TestDownloadGivesUpAfterMaxAttempts(t *testing.T) {
	srv, _, _ := newTestHub(t)
	srv.SetFault("config.json", &hubtest.Fault{Status: 503})
	o := testOptions(t)
	o.MaxAttempts = 3
	res, err := Download(context.Background(), client(srv), o)
	if err == nil || !strings.Contains(err.Error(), "config.json") || !strings.Contains(err.Error(), "503") ||
		!strings.Contains(err.Error(), "giving up after 3 tries") {
		t.Fatalf("err %v", err)
	}
	if n := len(srv.ContentGETs("config.json")); n != 3 {
		t.Errorf("%d GETs, want 3", n)
	}
	if s := statuses(res); s["config.json"] != StatusFailed || s["tokenizer.json"] != StatusDownloaded {
		t.Errorf("statuses %v (the other files must complete)", s)
	}
}

// cancelProgress cancels a download once a file has received n bytes.
type cancelProgress struct {
	nopProgress
	file   string
	n      int64
	cancel context.CancelFunc
	mu     sync.Mutex
	got    int64
}

func (p *cancelProgress) Add(file string, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if file == p.file {
		p.got += n
		if p.got >= p.n {
			p.cancel()
		}
	}
}

// Ctrl-C in the middle of a file leaves its .incomplete file; the next run
// resumes it with a Range request.
func TestDownloadResumeAfterInterrupt(t *testing.T) {
	for _, local := range []bool{false, true} {
		t.Run(map[bool]string{false: "hub cache", true: "local dir"}[local], func(t *testing.T) {
			srv, commit, files := newTestHub(t)
			shard := files[3]
			srv.SetFault(shard.Path, &hubtest.Fault{Times: 1, HangAfter: 120_000})
			o := testOptions(t)
			inc := filepath.Join(o.CacheDir, "models--test-org--Tiny-Model", "blobs", etagOf(shard)+".incomplete")
			if local {
				o.LocalDir = filepath.Join(t.TempDir(), "m")
				inc = filepath.Join(o.LocalDir, ".cache/huggingface/download", shard.Path+"."+etagOf(shard)+".incomplete")
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			o.Progress = &cancelProgress{file: shard.Path, n: 120_000, cancel: cancel}
			_, err := Download(ctx, client(srv), o)
			if err == nil || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "run the same command again to resume") {
				t.Fatalf("err %v", err)
			}
			st, err := os.Stat(inc)
			if err != nil || st.Size() != 120_000 {
				t.Fatalf("incomplete file: %v %v", st, err)
			}

			o.Progress = nil
			srv.ResetRequests()
			res, err := Download(context.Background(), client(srv), o)
			if err != nil {
				t.Fatal(err)
			}
			gets := srv.ContentGETs(shard.Path)
			if len(gets) != 1 || gets[0].Range != "bytes=120000-" {
				t.Errorf("resume GETs %+v", gets)
			}
			if s := statuses(res)[shard.Path]; s != StatusResumed {
				t.Errorf("status %s, want resumed", s)
			}
			if want := int64(len(shard.Data) - 120_000); res.NeedBytes < want {
				t.Errorf("need %d, want at least %d", res.NeedBytes, want)
			}
			if local {
				if got, _ := os.ReadFile(filepath.Join(o.LocalDir, shard.Path)); !bytes.Equal(got, shard.Data) {
					t.Error("resumed file differs")
				}
				noLeftovers(t, o.LocalDir)
				return
			}
			checkCache(t, o.CacheDir, commit, files)
		})
	}
}

func TestDownloadChecksumMismatch(t *testing.T) {
	for _, tc := range []struct{ path, kind string }{
		{"model-00002-of-00002.safetensors", "sha256 mismatch"},
		{"tokenizer.json", "git blob id mismatch"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			srv, commit, files := newTestHub(t)
			srv.SetFault(tc.path, &hubtest.Fault{Corrupt: true})
			o := testOptions(t)
			res, err := Download(context.Background(), client(srv), o)
			var ce *checksumError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.kind) || !strings.Contains(err.Error(), tc.path) {
				t.Fatalf("err %v", err)
			}
			if n := len(srv.ContentGETs(tc.path)); n != 1 {
				t.Errorf("%d GETs of a file downloaded from the start: a mismatch is not retried", n)
			}
			repoDir := filepath.Join(o.CacheDir, "models--test-org--Tiny-Model")
			var bad hubtest.File
			var good []hubtest.File
			for _, f := range files {
				if f.Path == tc.path {
					bad = f
				} else {
					good = append(good, f)
				}
			}
			if _, err := os.Lstat(filepath.Join(repoDir, "blobs", etagOf(bad))); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the bad blob exists: %v", err)
			}
			if _, err := os.Lstat(filepath.Join(repoDir, "snapshots", commit, tc.path)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the bad file is linked: %v", err)
			}
			if statuses(res)[tc.path] != StatusFailed {
				t.Errorf("statuses %v", statuses(res))
			}
			checkCache(t, o.CacheDir, commit, good)
		})
	}
}

// A partial file whose bytes on disk are wrong fails its checksum once
// resumed; it is then fetched once more from the start.
func TestDownloadCorruptIncompleteRefetched(t *testing.T) {
	srv, commit, files := newTestHub(t)
	o := testOptions(t)
	shard := files[3]
	blobs := filepath.Join(o.CacheDir, "models--test-org--Tiny-Model", "blobs")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		t.Fatal(err)
	}
	junk := bytes.Repeat([]byte{7}, 1000)
	if err := os.WriteFile(filepath.Join(blobs, etagOf(shard)+".incomplete"), junk, 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := Download(context.Background(), client(srv), o)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range srv.ContentGETs(shard.Path) {
		got = append(got, r.Range)
	}
	if strings.Join(got, "|") != "bytes=1000-|" {
		t.Errorf("GET ranges %q, want a resume then a full GET", got)
	}
	if s := statuses(res)[shard.Path]; s != StatusDownloaded {
		t.Errorf("status %s", s)
	}
	checkCache(t, o.CacheDir, commit, files)
}

func TestDownloadHubErrors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		repo     string
		revision string
		token    string
		gate     string // gate the repo with this token
		hide     string
		status   int
		code     string
		want     []string
		partial  bool // the other files are downloaded
	}{
		{name: "unknown repo, anonymous", repo: "test-org/nope", status: 401, code: "RepoNotFound",
			want: []string{"401", "test-org/nope does not exist", "private or gated", "--token"}},
		{name: "unknown repo, with token", repo: "test-org/nope", token: "hf_x", status: 404, code: "RepoNotFound",
			want: []string{"404", "no repository test-org/nope", "check the name"}},
		{name: "unknown revision", repo: testRepo, revision: "v9", status: 404, code: "RevisionNotFound",
			want: []string{`no revision "v9"`, "--revision"}},
		{name: "gated, no token", repo: testRepo, gate: "hf_good", status: 401, code: "GatedRepo",
			want: []string{"gated", "accept its conditions", "/" + testRepo, "HF_TOKEN"}},
		{name: "gated, wrong token", repo: testRepo, gate: "hf_good", token: "hf_bad", status: 403, code: "GatedRepo",
			want: []string{"403", "not been granted access"}},
		{name: "missing file", repo: testRepo, hide: "tokenizer.json", status: 404, code: "EntryNotFound",
			want: []string{"tokenizer.json", "EntryNotFound", "not in " + testRepo}, partial: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, commit, files := newTestHub(t)
			if tc.gate != "" {
				srv.Gate(testRepo, tc.gate)
			}
			if tc.hide != "" {
				srv.Hide(testRepo, tc.hide)
			}
			o := testOptions(t)
			o.Repo, o.Revision = tc.repo, tc.revision
			o.Workers = 1
			_, err := Download(context.Background(), NewClient(srv.URL, tc.token), o)
			var he *Error
			if !errors.As(err, &he) || he.Status != tc.status || he.Code != tc.code {
				t.Fatalf("err %v (%+v)", err, he)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q: %v", w, err)
				}
			}
			if tc.partial {
				var good []hubtest.File
				for _, f := range files {
					if f.Path != tc.hide {
						good = append(good, f)
					}
				}
				checkCache(t, o.CacheDir, commit, good)
				return
			}
			// A refused listing or file writes no file.
			var written []string
			_ = filepath.WalkDir(o.CacheDir, func(p string, d fs.DirEntry, err error) error {
				if err == nil && !d.IsDir() && !strings.Contains(p, "/.locks/") && !strings.Contains(p, "/refs/") {
					written = append(written, p)
				}
				return nil
			})
			if len(written) > 0 {
				t.Errorf("files written: %v", written)
			}
			if tc.gate != "" && tc.token != "" {
				// A refused token stops the whole download at the first file.
				var gets int
				for _, r := range srv.Requests() {
					if strings.Contains(r.Path, "/resolve/") {
						gets++
					}
				}
				if gets != 1 {
					t.Errorf("%d file requests after a 403, want 1", gets)
				}
			}
		})
	}
}

func TestDownloadGatedWithToken(t *testing.T) {
	srv, commit, files := newTestHub(t)
	srv.Gate(testRepo, "hf_good")
	o := testOptions(t)
	if _, err := Download(context.Background(), NewClient(srv.URL, "hf_good"), o); err != nil {
		t.Fatal(err)
	}
	for _, r := range srv.Requests() {
		if strings.Contains(r.Path, "/resolve/") && r.Auth != "Bearer hf_good" {
			t.Errorf("%s sent without the token", r.Path)
		}
	}
	checkCache(t, o.CacheDir, commit, files)
}

// A file that changes on the hub between two runs: the second run makes a
// new snapshot, moves refs/main, downloads only the changed blob and
// leaves the old snapshot as it was.
func TestDownloadFileChangesBetweenRuns(t *testing.T) {
	srv, commit1, files1 := newTestHub(t)
	o := testOptions(t)
	if _, err := Download(context.Background(), client(srv), o); err != nil {
		t.Fatal(err)
	}
	files2 := testFiles()
	files2[1].Data = append(files2[1].Data, []byte(" more")...) // tokenizer.json
	files2[4].Data = randBytes(3, 200_000)                      // model-00002
	commit2 := srv.Commit(testRepo, files2)
	srv.ResetRequests()
	res, err := Download(context.Background(), client(srv), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Commit != commit2 || res.AlreadyComplete {
		t.Fatalf("result %+v", res)
	}
	want := map[string]string{"tokenizer.json": StatusDownloaded, "model-00002-of-00002.safetensors": StatusDownloaded}
	for p, s := range statuses(res) {
		if w := want[p]; (w == "" && s != StatusPresent) || (w != "" && s != w) {
			t.Errorf("%s: %s", p, s)
		}
	}
	for _, r := range srv.Requests() {
		if strings.Contains(r.Path, "/resolve/") && !strings.HasSuffix(r.Path, "/tokenizer.json") && !strings.HasSuffix(r.Path, "/model-00002-of-00002.safetensors") {
			t.Errorf("unchanged file fetched again: %s", r.Path)
		}
	}
	if res.FetchedBytes != int64(len(files2[1].Data)+len(files2[4].Data)) {
		t.Errorf("fetched %d", res.FetchedBytes)
	}
	checkCache(t, o.CacheDir, commit2, files2)
	// The old snapshot still reads the old files.
	snap1 := filepath.Join(o.CacheDir, "models--test-org--Tiny-Model", "snapshots", commit1)
	for _, f := range files1 {
		if got, err := os.ReadFile(filepath.Join(snap1, f.Path)); err != nil || !bytes.Equal(got, f.Data) {
			t.Errorf("old snapshot %s: %v", f.Path, err)
		}
	}
	// The old commit by hash: complete, and refs/main is left alone.
	o.Revision = commit1
	res, err = Download(context.Background(), client(srv), o)
	if err != nil || !res.AlreadyComplete || res.Dir != snap1 {
		t.Errorf("old commit: %+v %v", res, err)
	}
	if b, _ := os.ReadFile(filepath.Join(o.CacheDir, "models--test-org--Tiny-Model", "refs", "main")); string(b) != commit2 {
		t.Errorf("refs/main %s", b)
	}
}

func TestDownloadHostileNames(t *testing.T) {
	for _, tc := range []struct {
		name  string
		local bool
		want  string
	}{
		{"../evil", false, `".." path component`},
		{"../evil", true, `".." path component`},
		{"/abs/evil", false, "absolute path"},
		{"/abs/evil", true, "absolute path"},
		{"a/../../b", false, `".." path component`},
		{"a/../../b", true, `".." path component`},
		{"a/./b", false, `"." path component`},
		{"a//b", false, "empty path component"},
		{`a\..\..\b`, false, "backslash"},
		{"a\x00b", false, "control character"},
		{"..", true, `".." path component`},
		{".cache/huggingface/download/config.json.metadata", true, "download metadata"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := hubtest.New(t)
			files := append(testFiles(), hubtest.File{Path: tc.name, Data: []byte("pwned")})
			srv.Commit(testRepo, files)
			base := t.TempDir()
			o := testOptions(t)
			o.CacheDir = filepath.Join(base, "cache")
			if tc.local {
				o.LocalDir = filepath.Join(base, "model")
			}
			_, err := Download(context.Background(), client(srv), o)
			var pe *pathError
			if !errors.As(err, &pe) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "nothing was written") {
				t.Fatalf("err %v", err)
			}
			// Refused before anything is created: the base directory is empty.
			if entries, _ := os.ReadDir(base); len(entries) != 0 {
				t.Errorf("written: %v", entries)
			}
			if _, err := os.Lstat("/abs/evil"); err == nil {
				t.Error("/abs/evil exists")
			}
			for _, r := range srv.Requests() {
				if strings.Contains(r.Path, "/resolve/") {
					t.Errorf("requested %s", r.Path)
				}
			}
		})
	}
}

// A link planted in the target directory cannot lead a write outside it.
func TestDownloadLinkOutOfTarget(t *testing.T) {
	for _, tc := range []struct{ name, link string }{
		{"local dir, a folder linked out", "sub"},
		{"hub cache, blobs linked out", "blobs"},
		{"hub cache, snapshots linked out", "snapshots"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, _, _ := newTestHub(t)
			base := t.TempDir()
			outside := filepath.Join(base, "outside")
			if err := os.Mkdir(outside, 0o755); err != nil {
				t.Fatal(err)
			}
			o := testOptions(t)
			dir := filepath.Join(o.CacheDir, "models--test-org--Tiny-Model")
			if tc.link == "sub" {
				o.LocalDir = filepath.Join(base, "model")
				dir = o.LocalDir
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, filepath.Join(dir, tc.link)); err != nil {
				t.Fatal(err)
			}
			_, err := Download(context.Background(), client(srv), o)
			if err == nil || !strings.Contains(err.Error(), "escapes") {
				t.Fatalf("err %v", err)
			}
			if entries, _ := os.ReadDir(outside); len(entries) != 0 {
				t.Errorf("written outside: %v", entries)
			}
		})
	}
}

func TestDownloadVerify(t *testing.T) {
	srv, commit, files := newTestHub(t)
	o := testOptions(t)
	if _, err := Download(context.Background(), client(srv), o); err != nil {
		t.Fatal(err)
	}
	shard := files[3]
	blob := filepath.Join(o.CacheDir, "models--test-org--Tiny-Model", "blobs", etagOf(shard))
	b, _ := os.ReadFile(blob)
	b[1234] ^= 1
	if err := os.WriteFile(blob, b, 0o644); err != nil {
		t.Fatal(err)
	}

	// Without --verify a blob of the right size is trusted.
	res, err := Download(context.Background(), client(srv), o)
	if err != nil || !res.AlreadyComplete {
		t.Fatalf("plain re-run: %v %+v", err, res)
	}
	// A dry run with --verify finds it and changes nothing.
	o.Verify, o.DryRun = true, true
	srv.ResetRequests()
	res, err = Download(context.Background(), client(srv), o)
	if err != nil {
		t.Fatal(err)
	}
	if s := statuses(res); s[shard.Path] != StatusCorrupt || s["config.json"] != StatusVerified || res.NeedBytes != int64(len(shard.Data)) {
		t.Errorf("dry run: %v need %d", s, res.NeedBytes)
	}
	if now, _ := os.ReadFile(blob); !bytes.Equal(now, b) {
		t.Error("a dry run changed the blob")
	}
	if len(srv.Requests()) != 1 {
		t.Errorf("a dry run made %d requests", len(srv.Requests()))
	}
	// --verify finds it and downloads it again.
	o.DryRun = false
	res, err = Download(context.Background(), client(srv), o)
	if err != nil {
		t.Fatal(err)
	}
	if s := statuses(res); s[shard.Path] != StatusReplaced || s["tokenizer.json"] != StatusVerified {
		t.Errorf("verify: %v", s)
	}
	checkCache(t, o.CacheDir, commit, files)

	// A blob of the wrong size is replaced even without --verify.
	if err := os.WriteFile(blob, b[:100], 0o644); err != nil {
		t.Fatal(err)
	}
	o.Verify = false
	res, err = Download(context.Background(), client(srv), o)
	if err != nil || statuses(res)[shard.Path] != StatusReplaced {
		t.Errorf("truncated blob: %v %v", err, statuses(res))
	}
	checkCache(t, o.CacheDir, commit, files)
}

func TestDownloadIncludeExclude(t *testing.T) {
	for _, tc := range []struct {
		name             string
		include, exclude []string
		want             []string
		err              string
	}{
		{name: "config and tokenizer", include: []string{"config.json", "tokenizer*"},
			want: []string{"config.json", "tokenizer.json", "tokenizer_config.json"}},
		{name: "no weights", exclude: []string{"*.safetensors"},
			want: []string{"config.json", "empty.txt", "sub/dir/notes.txt", "tokenizer.json", "tokenizer_config.json"}},
		{name: "a folder", include: []string{"sub/"}, want: []string{"sub/dir/notes.txt"}},
		{name: "star crosses slashes", include: []string{"*.txt"}, want: []string{"empty.txt", "sub/dir/notes.txt"}},
		{name: "class and exclude", include: []string{"model-0000[2-9]-*", "*.json"}, exclude: []string{"tok*"},
			want: []string{"config.json", "model-00002-of-00002.safetensors"}},
		{name: "nothing matches", include: []string{"*.gguf"}, err: "no file of " + testRepo + " matches"},
		{name: "bad pattern", include: []string{"[abc"}, err: "--include \"[abc\": unclosed '['"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, commit, files := newTestHub(t)
			o := testOptions(t)
			o.Include, o.Exclude = tc.include, tc.exclude
			res, err := Download(context.Background(), client(srv), o)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			var sel []hubtest.File
			for _, f := range res.Files {
				got = append(got, f.Path)
				sel = append(sel, hubtest.File{Path: f.Path, Data: fileData(files, f.Path), LFS: strings.HasSuffix(f.Path, ".safetensors")})
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("selected %v, want %v", got, tc.want)
			}
			checkCache(t, o.CacheDir, commit, sel)
			gets, nonEmpty := 0, 0
			for _, r := range srv.Requests() {
				if strings.Contains(r.Path, "/resolve/") {
					gets++
				}
			}
			for _, f := range sel {
				if len(f.Data) > 0 {
					nonEmpty++
				}
			}
			if gets != nonEmpty {
				t.Errorf("%d file GETs for %d non-empty files", gets, nonEmpty)
			}
		})
	}
}

func TestDownloadLocalDir(t *testing.T) {
	srv, commit, files := newTestHub(t)
	o := testOptions(t)
	o.LocalDir = filepath.Join(t.TempDir(), "GLM")
	res, err := Download(context.Background(), client(srv), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Dir != o.LocalDir || res.Layout != "local-dir" || res.Count(StatusDownloaded) != len(files) {
		t.Fatalf("result %+v", res)
	}
	checkLocal := func(files []hubtest.File, commit string) {
		t.Helper()
		for _, f := range files {
			p := filepath.Join(o.LocalDir, f.Path)
			st, err := os.Lstat(p)
			if err != nil || !st.Mode().IsRegular() {
				t.Errorf("%s: %v %v", f.Path, st, err)
				continue
			}
			if got, _ := os.ReadFile(p); !bytes.Equal(got, f.Data) {
				t.Errorf("%s: content differs", f.Path)
			}
			meta, err := os.ReadFile(filepath.Join(o.LocalDir, ".cache/huggingface/download", f.Path+".metadata"))
			lines := strings.Split(string(meta), "\n")
			if err != nil || len(lines) != 4 || lines[0] != commit || lines[1] != etagOf(f) {
				t.Errorf("%s metadata %q %v", f.Path, meta, err)
			}
		}
		noLeftovers(t, o.LocalDir)
	}
	checkLocal(files, commit)
	if _, err := os.Stat(filepath.Join(o.CacheDir, "models--test-org--Tiny-Model")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the hub cache was written in --local-dir mode: %v", err)
	}

	res, err = Download(context.Background(), client(srv), o)
	if err != nil || !res.AlreadyComplete || res.Count(StatusPresent) != len(files) {
		t.Fatalf("re-run: %v %v", err, statuses(res))
	}

	// A file edited after the download (same size, newer mtime) is
	// re-hashed and replaced.
	cfg := filepath.Join(o.LocalDir, "config.json")
	edited := bytes.ToUpper(files[0].Data)
	if err := os.WriteFile(cfg, edited, 0o644); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(5 * time.Second)
	if err := os.Chtimes(cfg, later, later); err != nil {
		t.Fatal(err)
	}
	res, err = Download(context.Background(), client(srv), o)
	if err != nil || statuses(res)["config.json"] != StatusReplaced || res.Count(StatusPresent) != len(files)-1 {
		t.Fatalf("edited file: %v %v", err, statuses(res))
	}
	checkLocal(files, commit)

	// A new commit changing one file: only it is fetched; the metadata of
	// the others names the new commit.
	files2 := testFiles()
	files2[0].Data = []byte(`{"model_type": "glm4_moe", "v": 2}` + "\n")
	commit2 := srv.Commit(testRepo, files2)
	o.DryRun = true
	res, err = Download(context.Background(), client(srv), o)
	if err != nil || statuses(res)["config.json"] != StatusOutdated || res.NeedBytes != int64(len(files2[0].Data)) {
		t.Fatalf("new commit, dry run: %v %v", err, statuses(res))
	}
	o.DryRun = false
	srv.ResetRequests()
	res, err = Download(context.Background(), client(srv), o)
	if err != nil || statuses(res)["config.json"] != StatusDownloaded || res.Count(StatusPresent) != len(files)-1 {
		t.Fatalf("new commit: %v %v", err, statuses(res))
	}
	if n := len(srv.ContentGETs("config.json")); n != 1 || len(srv.Requests()) != 2 {
		t.Errorf("requests %+v", srv.Requests())
	}
	checkLocal(files2, commit2)
}

func TestDownloadFreeSpace(t *testing.T) {
	srv, _, _ := newTestHub(t)
	o := testOptions(t)
	o.FreeSpace = func(string) (int64, error) { return 1000, nil }
	_, err := Download(context.Background(), client(srv), o)
	if err == nil || !strings.Contains(err.Error(), "not enough space") || !strings.Contains(err.Error(), "1.0 kB free") {
		t.Fatalf("err %v", err)
	}
	for _, r := range srv.Requests() {
		if strings.Contains(r.Path, "/resolve/") {
			t.Errorf("requested %s", r.Path)
		}
	}
	// Enough for what is left: only the small files.
	o.FreeSpace = func(string) (int64, error) { return 20_000, nil }
	o.Exclude = []string{"*.safetensors"}
	if _, err := Download(context.Background(), client(srv), o); err != nil {
		t.Fatal(err)
	}
}

// A mirror whose listing has names only: sizes and checksums come from
// HEAD requests (X-Linked-Size, X-Linked-Etag, ETag).
func TestDownloadMinimalListing(t *testing.T) {
	srv, commit, files := newTestHub(t)
	srv.MinimalListing = true
	o := testOptions(t)
	res, err := Download(context.Background(), client(srv), o)
	if err != nil {
		t.Fatal(err)
	}
	heads := 0
	for _, r := range srv.Requests() {
		if r.Method == "HEAD" {
			heads++
		}
	}
	if heads != len(files) {
		t.Errorf("%d HEADs for %d files", heads, len(files))
	}
	for _, f := range res.Files {
		if (f.SHA256 == "") != !strings.HasSuffix(f.Path, ".safetensors") {
			t.Errorf("%s: sha256 %q git %q", f.Path, f.SHA256, f.GitOID)
		}
	}
	checkCache(t, o.CacheDir, commit, files)
}

// Two files with the same content share a blob, fetched once.
func TestDownloadSharedBlob(t *testing.T) {
	srv := hubtest.New(t)
	data := randBytes(9, 50_000)
	files := []hubtest.File{
		{Path: "a.safetensors", Data: data, LFS: true},
		{Path: "copy/a.safetensors", Data: data, LFS: true},
		{Path: "config.json", Data: []byte("{}")},
	}
	commit := srv.Commit(testRepo, files)
	o := testOptions(t)
	res, err := Download(context.Background(), client(srv), o)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(srv.CDNGETs(data)); n != 1 || res.FetchedBytes != 50_002 {
		t.Errorf("%d CDN GETs, fetched %d", n, res.FetchedBytes)
	}
	checkCache(t, o.CacheDir, commit, files)
}

func TestDownloadLocked(t *testing.T) {
	srv, _, _ := newTestHub(t)
	o := testOptions(t)
	dir := filepath.Join(o.CacheDir, "models--test-org--Tiny-Model", ".locks")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "glmctl-download.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := lockFile(f); err != nil {
		t.Fatal(err)
	}
	_, err = Download(context.Background(), client(srv), o)
	if err == nil || !strings.Contains(err.Error(), "another download") {
		t.Fatalf("err %v", err)
	}
}

func TestDownloadDryRunWritesNothing(t *testing.T) {
	srv, _, files := newTestHub(t)
	o := testOptions(t)
	o.DryRun = true
	res, err := Download(context.Background(), client(srv), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Count(StatusMissing) != len(files) || res.NeedBytes != res.TotalBytes || res.AlreadyComplete {
		t.Errorf("dry run %+v", res)
	}
	if entries, _ := os.ReadDir(o.CacheDir); len(entries) != 0 {
		t.Errorf("a dry run wrote %v", entries)
	}
}

func TestGlobs(t *testing.T) {
	paths := []string{"config.json", "tokenizer.json", "a/b/c.json", "model-00001-of-00093.safetensors", "x?y", "[z]"}
	for _, tc := range []struct {
		include, exclude []string
		want             string
	}{
		{nil, nil, "config.json,tokenizer.json,a/b/c.json,model-00001-of-00093.safetensors,x?y,[z]"},
		{[]string{"*.json"}, nil, "config.json,tokenizer.json,a/b/c.json"},
		{[]string{"a/"}, nil, "a/b/c.json"},
		{[]string{"a/*/c.json"}, nil, "a/b/c.json"},
		{[]string{"model-000[0-1]?-*"}, nil, "model-00001-of-00093.safetensors"},
		{[]string{"[!act]*"}, nil, "model-00001-of-00093.safetensors,x?y,[z]"},
		{[]string{"x?y"}, nil, "x?y"},
		{[]string{"[[]z]"}, nil, "[z]"},
		{nil, []string{"*.json", "*.safetensors"}, "x?y,[z]"},
		{[]string{"config.json"}, []string{"config.json"}, ""},
	} {
		g, err := NewGlobs(tc.include, tc.exclude)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, p := range paths {
			if g.Match(p) {
				got = append(got, p)
			}
		}
		if strings.Join(got, ",") != tc.want {
			t.Errorf("include %q exclude %q: %v, want %s", tc.include, tc.exclude, got, tc.want)
		}
	}
}

func TestCheckFileName(t *testing.T) {
	for _, ok := range []string{"config.json", "a/b/c", ".hidden", "..x", "x..", "a/.cache/huggingface/x", "名前.json"} {
		if err := checkFileName(ok, true); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "../x", "x/..", "/x", "a//b", "a/", `a\b`, "a\nb", "a/./b", ".cache/huggingface/x"} {
		if err := checkFileName(bad, true); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if err := checkFileName(".cache/huggingface/x", false); err != nil {
		t.Errorf("hub cache mode: %v", err)
	}
}

func TestValidateRepoID(t *testing.T) {
	for _, ok := range []string{"zai-org/GLM-4.7-FP8", "a/b", "Org_1/model.v2"} {
		if err := ValidateRepoID(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "model", "a/b/c", "../x", "a/..", "a/.b", "-a/b", "a/b c", "a/b..c", "/a"} {
		if err := ValidateRepoID(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestCacheDirAndTokenFromEnv(t *testing.T) {
	home := t.TempDir()
	for _, k := range []string{"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_ENDPOINT"} {
		t.Setenv(k, "")
	}
	t.Setenv("HOME", home)
	if d, _ := DefaultCacheDir(); d != filepath.Join(home, ".cache/huggingface/hub") {
		t.Errorf("default %s", d)
	}
	t.Setenv("XDG_CACHE_HOME", "/xdg")
	if d, _ := DefaultCacheDir(); d != "/xdg/huggingface/hub" {
		t.Errorf("XDG %s", d)
	}
	t.Setenv("HF_HOME", "/hfhome")
	if d, _ := DefaultCacheDir(); d != "/hfhome/hub" {
		t.Errorf("HF_HOME %s", d)
	}
	t.Setenv("HF_HUB_CACHE", "/hubcache")
	if d, _ := DefaultCacheDir(); d != "/hubcache" {
		t.Errorf("HF_HUB_CACHE %s", d)
	}
	if e := EndpointFromEnv(); e != DefaultEndpoint {
		t.Errorf("endpoint %s", e)
	}
	t.Setenv("HF_ENDPOINT", "https://hf-mirror.com/")
	if e := EndpointFromEnv(); e != "https://hf-mirror.com" {
		t.Errorf("endpoint %s", e)
	}

	t.Setenv("HF_HOME", home)
	if tok, src := TokenFromEnv(); tok != "" || src != "" {
		t.Errorf("token %q from %q", tok, src)
	}
	if err := os.WriteFile(filepath.Join(home, "token"), []byte("hf_file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, src := TokenFromEnv(); tok != "hf_file" || src != filepath.Join(home, "token") {
		t.Errorf("token %q from %q", tok, src)
	}
	t.Setenv("HF_TOKEN", "hf_env")
	if tok, src := TokenFromEnv(); tok != "hf_env" || src != "HF_TOKEN" {
		t.Errorf("token %q from %q", tok, src)
	}
}

func TestParseContentRange(t *testing.T) {
	for _, tc := range []struct {
		in           string
		start, total int64
		ok           bool
	}{
		{"bytes 100-199/200", 100, 200, true},
		{"bytes 0-0/*", 0, -1, true},
		{"bytes */200", 0, -1, false},
		{"items 1-2/3", 0, -1, false},
		{"", 0, -1, false},
	} {
		s, tot, ok := parseContentRange(tc.in)
		if s != tc.start || tot != tc.total || ok != tc.ok {
			t.Errorf("%q: %d %d %v", tc.in, s, tot, ok)
		}
	}
}

// The terminal progress draws bars and file lines; the log progress writes
// a line per file and a summary.
func TestDownloadProgressOutput(t *testing.T) {
	srv, _, _ := newTestHub(t)
	var term bytes.Buffer
	o := testOptions(t)
	o.Progress = NewTermProgress(&term, 100)
	if _, err := Download(context.Background(), client(srv), o); err != nil {
		t.Fatal(err)
	}
	out := term.String()
	for _, want := range []string{"download model-00001-of-00002.safetensors  300.0 kB in", "download: 7/7 files, 512.0 kB in"} {
		if !strings.Contains(out, want) {
			t.Errorf("terminal output lacks %q:\n%s", want, out)
		}
	}

	var logs syncBuffer
	o = testOptions(t)
	o.Progress = NewLogProgress(newTextLogger(&logs), time.Hour)
	srv.SetFault("config.json", &hubtest.Fault{Times: 1, Status: 503})
	if _, err := Download(context.Background(), client(srv), o); err != nil {
		t.Fatal(err)
	}
	out = logs.String()
	for _, want := range []string{"download: starting", "files=7", "download: file done", "file=model-00002-of-00002.safetensors",
		"download: retrying", "503", "download: finished", "files=7/7"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newTextLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// After a failure cancels the context, forEach starts no further item, even
// one its feeder hands over in the same instant (the select between sending
// and ctx.Done picks either at random, so 200 rounds see that case ~100 times).
func TestForEachStartsNothingAfterCancel(t *testing.T) {
	for round := 0; round < 200; round++ {
		ctx, cancel := context.WithCancelCause(context.Background())
		var ran []int
		var mu sync.Mutex
		_ = forEach(ctx, 1, []int{0, 1, 2}, func(ctx context.Context, i int) error {
			mu.Lock()
			ran = append(ran, i)
			mu.Unlock()
			if i == 0 {
				cancel(errors.New("fatal"))
			}
			return nil
		})
		cancel(nil)
		if len(ran) != 1 || ran[0] != 0 {
			t.Fatalf("round %d: items run %v after the first cancelled the context, want [0]", round, ran)
		}
	}
}
