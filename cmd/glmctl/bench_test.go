package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/glmctl/glmctl/pkg/bench"
)

func benchCLI(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	base := []string{"bench", "--model", tinyDir, "--backend", "cpu", "--threads", "2", "--log-level", "warn",
		"--input-len", "12", "--output-len", "5", "--warmup", "1"}
	return runCLI(t, append(base, args...)...)
}

// bench on the tiny model: JSON parses, every run has exactly
// requests × output-len tokens and a floor; nothing about speed is asserted.
func TestBenchJSON(t *testing.T) {
	out, errOut, code := benchCLI(t, "--concurrency", "1,3", "--requests", "3", "--json",
		"--project-model", "../../testdata/glm-4.7-fp8", "--hbm-bandwidth", "5e10")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep bench.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("bad JSON %q: %v", out, err)
	}
	h := rep.Header
	if h.Backend != "cpu" || h.Floor == nil || h.Floor.Bandwidth.BytesPerSecond != 5e10 || h.Floor.Label != "TP1/EP1" {
		t.Fatalf("header %+v", h)
	}
	if p := h.Projection; p == nil || p.Label != "floor for glm-4.7-fp8 at TP8/EP8" || p.Bandwidth.BytesPerSecond != bench.H200MeasuredBandwidth {
		t.Fatalf("projection %+v", h.Projection)
	}
	if !strings.Contains(h.CommandLine, "--concurrency=1,3") || !strings.Contains(h.CommandLine, "--json") {
		t.Errorf("command line %q", h.CommandLine)
	}
	if len(rep.Runs) != 2 {
		t.Fatalf("%d runs, want 2", len(rep.Runs))
	}
	for _, r := range rep.Runs {
		if r.Requests != 3 || r.OutputTokens != 3*5 || r.PromptTokens != 3*12 || r.Steps.GeneratedTokens != 3*5 {
			t.Errorf("conc %d: %+v", r.Concurrency, r)
		}
		if r.Floor == nil || !(r.Floor.StepMs > 0) || !(r.Floor.OfFloor > 0) || r.Projection == nil || !(r.Projection.StepMs > 0) {
			t.Errorf("conc %d: floor %+v projection %+v", r.Concurrency, r.Floor, r.Projection)
		}
	}
}

// --speculative mtp --speculative-compare on the tiny model (CPU): two runs per
// concurrency, drafting off then on, the second with its speed-up, in JSON and
// in the table.
func TestBenchSpeculativeCompare(t *testing.T) {
	out, errOut, code := benchCLI(t, "--concurrency", "2", "--requests", "2", "--speculative", "mtp",
		"--speculative-compare", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep bench.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("bad JSON %q: %v", out, err)
	}
	if len(rep.Runs) != 2 || rep.Runs[0].Speculation != "off" || rep.Runs[1].Speculation != "on" ||
		rep.Runs[0].Steps.DraftsVerified != 0 || rep.Runs[1].Steps.DraftsVerified == 0 || !(rep.Runs[1].SpeedupVsPlain > 0) {
		t.Fatalf("runs %+v", rep.Runs)
	}
	out, errOut, code = benchCLI(t, "--concurrency", "2", "--requests", "2", "--speculative", "mtp", "--speculative-compare")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"speculation", "× off", "drafts accepted"} {
		if !strings.Contains(out, want) {
			t.Errorf("text output lacks %q:\n%s", want, out)
		}
	}
}

func TestBenchTextAndMarkdown(t *testing.T) {
	out, errOut, code := benchCLI(t, "--concurrency", "2", "--requests", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"floor      TP1/EP1", "assumed 20 GB/s", "of floor", "TPOT ms p50/p90/p99"} {
		if !strings.Contains(out, want) {
			t.Errorf("text output lacks %q:\n%s", want, out)
		}
	}
	out, errOut, code = benchCLI(t, "--concurrency", "2", "--requests", "2", "--markdown", "--floor-kv-dtype", "fp8")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "| conc | reqs |") || !strings.Contains(out, "| ---: |") || !strings.Contains(out, "(1-byte elements)") {
		t.Errorf("markdown output:\n%s", out)
	}
}

func TestBenchBadInput(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"bad concurrency", []string{"--concurrency", "1,x"}, `--concurrency: entry 1 ("x")`},
		{"json and markdown", []string{"--json", "--markdown"}, "choose one"},
		{"kv dtype", []string{"--floor-kv-dtype", "int4"}, "--floor-kv-dtype"},
		{"negative bandwidth", []string{"--hbm-bandwidth", "-1"}, "--hbm-bandwidth"},
		{"cpu at TP2", []string{"--tp", "2"}, "cpu backend runs on one device"},
		{"projection dir", []string{"--project-model", "/nonexistent"}, "--project-model"},
		{"projection EP", []string{"--project-model", "../../testdata/glm-4.7-fp8", "--project-ep", "3"}, "ep: 3 must divide tp 8"},
		{"concurrency over max-seqs", []string{"--concurrency", "4", "--max-seqs", "2"}, "--max-seqs"},
		{"output too short", []string{"--output-len", "1"}, "output length"},
		{"speculative compare without drafting", []string{"--speculative-compare"}, "--speculative-compare: only means something with --speculative mtp"},
		{"speculative compare on the grid", []string{"--speculative", "mtp", "--speculative-compare", "--batches", "1", "--contexts", "16"}, "--speculative-compare"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, errOut, code := benchCLI(t, tt.args...)
			if code == 0 || !strings.Contains(errOut, tt.want) {
				t.Fatalf("exit %d, stderr %q; want failure naming %q", code, errOut, tt.want)
			}
		})
	}
}

// The decode-step grid through the CLI on the CPU backend: JSON cells with
// floors, and the errors of its flags (named, exit 1, before any weight loads).
func TestBenchStepGrid(t *testing.T) {
	out, errOut, code := benchCLI(t, "--batches", "1,2", "--contexts", "8,40", "--steps", "2", "--warmup-steps", "1", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep bench.StepReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("bad JSON %q: %v", out, err)
	}
	if len(rep.Cells) != 4 || rep.Grid.Steps != 2 || rep.Header.Floor == nil {
		t.Fatalf("report %+v", rep)
	}
	for _, c := range rep.Cells {
		if c.Skipped != "" || !(c.StepMs.P50 > 0) || c.Floor == nil || !(c.OfFloor > 0) {
			t.Errorf("cell %+v", c)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--batches", "1,x"}, `--batches: entry 1 ("x") is not a positive integer`},
		{[]string{"--batches", "1", "--contexts", "0"}, `--contexts: entry 0 ("0") is not a positive integer`},
		{[]string{"--batches", "1", "--steps", "0"}, "--steps: 0 must be >= 1"},
		{[]string{"--batches", "1", "--profile"}, "--profile: the cpu backend cannot profile"},
		{[]string{"--concurrency", "2", "--profile"}, "--profile: the cpu backend cannot profile"},
	} {
		_, errOut, code := benchCLI(t, tc.args...)
		if code != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", tc.args, code, errOut, tc.want)
		}
	}
}
