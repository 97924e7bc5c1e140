package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeTerminal makes stderr count as a terminal for the test's duration.
func fakeTerminal(t *testing.T) {
	t.Helper()
	old := isTerminal
	isTerminal = func(io.Writer) bool { return true }
	t.Cleanup(func() { isTerminal = old })
}

// Without a terminal, progress is Info log lines at a coarse granularity
// (never one per tensor or per case), silenced by --log-level warn, and
// stdout is what it was.
func TestProgressPlainLines(t *testing.T) {
	quiet, quietErr, code := runCLI(t, "validate", "--model", tinyF32, "--backend", "cpu", "--log-level", "warn")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, quietErr)
	}
	if strings.Contains(quietErr, "validate cases") || strings.Contains(quietErr, "loading weights") {
		t.Errorf("progress lines at --log-level warn:\n%s", quietErr)
	}
	out, errOut, code := runCLI(t, "validate", "--model", tinyF32, "--backend", "cpu")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if out != quiet {
		t.Errorf("stdout changed with progress lines:\n%s\nwant:\n%s", out, quiet)
	}
	for _, s := range []string{`msg="loading weights: starting"`, `msg="loading weights: done"`,
		`msg="validate cases: starting" total=6`, `msg="validate cases: done" done=6 of=6`} {
		if !strings.Contains(errOut, s) {
			t.Errorf("stderr lacks %s:\n%s", s, errOut)
		}
	}
	// 6 cases: a line at each tenth crossed (17%, 33%, 50%, 67%, 83%).
	if n := strings.Count(errOut, `msg="validate cases: progress"`); n != 5 {
		t.Errorf("%d case progress lines, want 5:\n%s", n, errOut)
	}
	if n := strings.Count(errOut, `msg="loading weights: progress"`); n > 9 {
		t.Errorf("%d weight progress lines, want at most 9:\n%s", n, errOut)
	}
	if strings.Contains(errOut, "\r") {
		t.Errorf("bar drawn without a terminal:\n%q", errOut)
	}
}

// On a terminal, bars go to stderr instead of the plain lines; stdout
// (JSON included) is untouched.
func TestProgressBarsOnTerminal(t *testing.T) {
	want, _, code := runCLI(t, "validate", "--model", tinyF32, "--backend", "cpu", "--json", "--log-level", "warn")
	if code != 0 {
		t.Fatal("validate failed")
	}
	fakeTerminal(t)
	out, errOut, code := runCLI(t, "validate", "--model", tinyF32, "--backend", "cpu", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if out != want {
		t.Errorf("stdout with bars:\n%s\nwant:\n%s", out, want)
	}
	if !strings.Contains(errOut, "validate cases") || !strings.Contains(errOut, "loading weights") {
		t.Errorf("stderr lacks the bars:\n%q", errOut)
	}
	if strings.Contains(errOut, `msg="validate cases:`) || strings.Contains(errOut, `msg="loading weights:`) {
		t.Errorf("plain progress lines beside the bars:\n%s", errOut)
	}

	out, errOut, code = benchCLI(t, "--concurrency", "2", "--requests", "3", "--json")
	if code != 0 {
		t.Fatalf("bench exit %d: %s", code, errOut)
	}
	if !strings.HasPrefix(out, "{") {
		t.Errorf("bench stdout is not the JSON report alone:\n%s", out)
	}
	if !strings.Contains(errOut, "bench concurrency 2 requests") || strings.Contains(errOut, `msg="bench concurrency 2 requests:`) {
		t.Errorf("bench stderr: want a bar, no plain lines:\n%q", errOut)
	}
}

// build on a terminal: a bar over the units and the link replaces the
// "[i/n] compiled" lines; stdout is still the library path alone.
func TestProgressBuildOnTerminal(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	nvcc := filepath.Join(t.TempDir(), "nvcc")
	if err := os.WriteFile(nvcc, []byte(fmt.Sprintf(fakeNVCCScript, root)), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NCCL_HOME", "")
	fakeTerminal(t)
	var out, errOut bytes.Buffer
	if code := run([]string{"build", "--check", "--nvcc", nvcc, "--cache-dir", t.TempDir(), "--jobs", "2"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d:\n%s", code, errOut.String())
	}
	if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != 1 || !strings.HasSuffix(lines[0], "libglmcuda.so") {
		t.Errorf("stdout %q, want the library path alone", out.String())
	}
	e := errOut.String()
	if strings.Contains(e, "] compiled ") || !strings.Contains(e, "libglmcuda: compiling") || !strings.Contains(e, "libglmcuda: built in") {
		t.Errorf("stderr: want the bar and the summary lines, no per-unit lines:\n%q", e)
	}
}
