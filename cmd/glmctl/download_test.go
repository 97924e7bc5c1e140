package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/glmctl/glmctl/pkg/hub/hubtest"
)

const tinyRepo = "test-org/tiny-f32"

// serveTiny puts testdata/models/tiny-f32 on a fake hub (weights and
// tokenizer.json in LFS, as on the real one) and points the hub
// environment at it, with an empty HF_HOME and no token.
func serveTiny(t *testing.T) (*hubtest.Server, string, []hubtest.File) {
	t.Helper()
	dir := "../../testdata/models/tiny-f32"
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []hubtest.File
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		lfs := strings.HasSuffix(e.Name(), ".safetensors") || e.Name() == "tokenizer.json"
		files = append(files, hubtest.File{Path: e.Name(), Data: b, LFS: lfs})
	}
	srv := hubtest.New(t)
	commit := srv.Commit(tinyRepo, files)
	for _, k := range []string{"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH"} {
		t.Setenv(k, "")
	}
	t.Setenv("HF_ENDPOINT", srv.URL)
	t.Setenv("HF_HOME", t.TempDir())
	return srv, commit, files
}

// The whole command against the fake hub: the hub cache layout, progress
// lines on a non-terminal, inspect's verdict, and a re-run that does
// nothing.
func TestDownloadCommandHubCache(t *testing.T) {
	srv, commit, files := serveTiny(t)
	out, errOut, code := runCLI(t, "download", tinyRepo)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	snap := filepath.Join(os.Getenv("HF_HOME"), "hub", "models--test-org--tiny-f32", "snapshots", commit)
	for _, want := range []string{
		"Downloaded " + tinyRepo + " at main (commit " + commit + "): 8 file(s)", snap + "\n", "Verdict: OK",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, want := range []string{"download: resolved", "download: starting", "download: file done",
		"file=model-00001-of-00002.safetensors", "download: finished", "files=8/8"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("log lacks %q:\n%s", want, errOut)
		}
	}
	for _, f := range files {
		p := filepath.Join(snap, f.Path)
		if l, err := os.Readlink(p); err != nil || !strings.HasPrefix(l, "../../blobs/") {
			t.Errorf("%s: link %q %v", f.Path, l, err)
		}
	}

	srv.ResetRequests()
	out, errOut, code = runCLI(t, "download", tinyRepo)
	if code != 0 || !strings.Contains(out, "Already complete: "+tinyRepo+" at main (commit "+commit+"), 8 file(s)") ||
		!strings.Contains(out, "nothing downloaded") || !strings.Contains(out, "Verdict: OK") {
		t.Errorf("re-run: exit %d\n%s\n%s", code, out, errOut)
	}
	if n := len(srv.Requests()); n != 1 {
		t.Errorf("re-run made %d requests, want the listing only", n)
	}

	// Other commands read the snapshot.
	out, errOut, code = runCLI(t, "inspect", snap, "--tp", "1", "--ep", "1", "--max-rows", "1")
	if code != 0 || !strings.Contains(out, "Verdict: OK") {
		t.Errorf("inspect on the snapshot: exit %d\n%s", code, errOut)
	}
}

// Only the config and the tokenizer, into a plain directory, with a JSON
// summary: not a checkpoint, which the download reports without failing.
func TestDownloadCommandIncludeLocalDirJSON(t *testing.T) {
	serveTiny(t)
	dir := filepath.Join(t.TempDir(), "tiny")
	out, errOut, code := runCLI(t, "download", tinyRepo, "--local-dir", dir, "--include", "config.json,tokenizer*", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var sum struct {
		Repo, Commit, Layout, Dir string
		Files                     []struct{ Path, Status, SHA256 string }
		FetchedBytes              int64 `json:"fetched_bytes"`
		AlreadyComplete           bool  `json:"already_complete"`
		Inspect                   *struct {
			OK    bool
			Error string
		}
	}
	if err := json.Unmarshal([]byte(out), &sum); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, out)
	}
	var got []string
	for _, f := range sum.Files {
		got = append(got, f.Path+":"+f.Status)
	}
	if sum.Layout != "local-dir" || sum.Dir != dir || sum.AlreadyComplete || sum.FetchedBytes == 0 ||
		strings.Join(got, ",") != "config.json:downloaded,tokenizer.json:downloaded,tokenizer_config.json:downloaded" {
		t.Errorf("summary %+v", sum)
	}
	if sum.Inspect == nil || sum.Inspect.OK || sum.Inspect.Error == "" {
		t.Errorf("inspect verdict %+v", sum.Inspect)
	}
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		t.Error(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "model-00001-of-00002.safetensors")); err == nil {
		t.Error("an excluded shard was downloaded")
	}

	out, errOut, code = runCLI(t, "download", tinyRepo, "--local-dir", dir, "--include", "config.json", "--include", "tokenizer*")
	if code != 0 || !strings.Contains(out, "Already complete") || !strings.Contains(out, "inspect: not a checkpoint it can read") ||
		!strings.Contains(out, "only the files matching --include/--exclude") {
		t.Errorf("human re-run: exit %d\n%s\n%s", code, out, errOut)
	}
}

func TestDownloadCommandDryRun(t *testing.T) {
	serveTiny(t)
	dir := filepath.Join(t.TempDir(), "tiny")
	out, errOut, code := runCLI(t, "download", tinyRepo, "--local-dir", dir, "--dry-run", "--exclude", "*.jinja")
	if code != 0 || !strings.Contains(out, "7 of 8 file(s) selected") || !strings.Contains(out, "missing") ||
		!strings.Contains(out, "nothing was written") {
		t.Errorf("exit %d\n%s\n%s", code, out, errOut)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Error("a dry run created the directory")
	}
}

func TestDownloadCommandErrors(t *testing.T) {
	srv, _, _ := serveTiny(t)
	srv.Gate(tinyRepo, "hf_secret")
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		code int
		want string
	}{
		{"unknown repository", []string{"test-org/nope"}, nil, 1, "test-org/nope does not exist"},
		{"not ORG/NAME", []string{"nope"}, nil, 1, "want ORG/NAME"},
		{"gated without token", []string{tinyRepo}, nil, 1, "is gated: accept its conditions"},
		{"gated, token flag", []string{tinyRepo, "--token", "hf_secret"}, nil, 0, ""},
		{"gated, HF_TOKEN", []string{tinyRepo, "--verify"}, map[string]string{"HF_TOKEN": "hf_secret"}, 0, ""},
		{"bad workers", []string{tinyRepo, "--workers", "0"}, nil, 1, "--workers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			out, errOut, code := runCLI(t, append([]string{"download"}, tc.args...)...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\n%s\n%s", code, tc.code, out, errOut)
			}
			if tc.code == 0 {
				return
			}
			if !strings.Contains(errOut, tc.want) || strings.Count(errOut, "glmctl:") != 1 {
				t.Errorf("stderr lacks %q (or has it twice):\n%s", tc.want, errOut)
			}
		})
	}
}
