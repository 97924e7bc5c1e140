package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/glmctl/glmctl/pkg/backend/cpu"
	"github.com/glmctl/glmctl/pkg/engine"
)

// startEngine runs the tiny model on the CPU backend; the engine stops at
// the end of the test.
func startEngine(t *testing.T, cfg engine.Config) *engine.Engine {
	t.Helper()
	be, err := cpu.Open(tinyDir, cpu.Options{KVBlockSize: 16, NumKVBlocks: 64, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	eng, stop, err := engine.Start(context.Background(), be, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stop()
		be.Close()
	})
	return eng
}

func TestPercentile(t *testing.T) {
	tests := []struct {
		v    []float64
		p    float64
		want float64
	}{
		{nil, 50, 0},
		{[]float64{7}, 99, 7},
		{[]float64{1, 2, 3, 4}, 50, 2.5},
		{[]float64{1, 2, 3, 4}, 0, 1},
		{[]float64{1, 2, 3, 4}, 100, 4},
		{[]float64{0, 10}, 90, 9},
		{[]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 90, 10},
	}
	for _, tt := range tests {
		if got := Percentile(tt.v, tt.p); got != tt.want {
			t.Errorf("Percentile(%v, %g) = %g, want %g", tt.v, tt.p, got, tt.want)
		}
	}
	s := summarise([]float64{4, 1, 3, 2})
	if s.Mean != 2.5 || s.P50 != 2.5 || !within(s.P99, 3.97, 1e-12) {
		t.Errorf("summarise: %+v", s)
	}
}

func TestWorkloadCheck(t *testing.T) {
	lim := engine.Limits{MaxSeqs: 8, MaxModelLen: 100, VocabSize: 50, BlockSize: 16, NumKVBlocks: 10}
	ok := Workload{Concurrency: []int{1, 8}, InputLen: 10, OutputLen: 4}
	if err := ok.Check(lim); err != nil {
		t.Fatalf("valid workload: %v", err)
	}
	tests := []struct {
		name   string
		edit   func(*Workload)
		substr string
	}{
		{"no concurrency", func(w *Workload) { w.Concurrency = nil }, "concurrency"},
		{"zero concurrency", func(w *Workload) { w.Concurrency = []int{0} }, "concurrency: 0"},
		{"over max seqs", func(w *Workload) { w.Concurrency = []int{9} }, "--max-seqs"},
		{"output 1", func(w *Workload) { w.OutputLen = 1 }, "output length"},
		{"input 0", func(w *Workload) { w.InputLen = 0 }, "input length"},
		{"too long", func(w *Workload) { w.InputLen = 97 }, "max model length 100"},
		{"negative requests", func(w *Workload) { w.Requests = -1 }, "requests"},
		{"negative temperature", func(w *Workload) { w.Temperature = -1 }, "temperature"},
		{"compare speculation without drafting", func(w *Workload) { w.CompareSpeculation = true }, "does not draft"},
	}
	for _, tt := range tests {
		w := ok
		tt.edit(&w)
		if err := w.Check(lim); err == nil || !strings.Contains(err.Error(), tt.substr) {
			t.Errorf("%s: err %v, want one containing %q", tt.name, err, tt.substr)
		}
	}
	if n := (Workload{}).requestsFor(3); n != 12 {
		t.Errorf("default requests at concurrency 3: %d, want 12", n)
	}
	if n := (Workload{Requests: 2}).requestsFor(5); n != 5 {
		t.Errorf("requests below concurrency: %d, want 5", n)
	}
}

// CompareSpeculation on the real engine with the tiny model's MTP layer (CPU
// backend): each concurrency gives a run with drafting off (no draft
// verified) then one with it on (drafts verified), the same requests, and the
// second carries its output tok/s over the first's; the table says which is
// which.
func TestRunCompareSpeculation(t *testing.T) {
	be, err := cpu.Open(tinyDir, cpu.Options{KVBlockSize: 16, NumKVBlocks: 64, Threads: 2, DraftTokens: 2})
	if err != nil {
		t.Fatal(err)
	}
	eng, stop, err := engine.Start(context.Background(), be, engine.Config{MaxBatchedTokens: 256, MaxSeqs: 8, DraftTokens: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stop()
		be.Close()
	})
	w := Workload{Concurrency: []int{1, 2}, Requests: 2, Warmup: 0, InputLen: 12, OutputLen: 6, Seed: 3, CompareSpeculation: true}
	if n := w.warmupFor(2); n != 2 {
		t.Errorf("warm-up at concurrency 2 while comparing: %d, want 2 (at least one per slot)", n)
	}
	runs, err := Run(context.Background(), eng, w, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 4 {
		t.Fatalf("%d runs, want 4 (off and on per concurrency)", len(runs))
	}
	for i := 0; i < 4; i += 2 {
		off, on := runs[i], runs[i+1]
		if off.Warmup != off.Concurrency || on.Warmup != on.Concurrency {
			t.Errorf("conc %d: warm-up %d / %d requests", on.Concurrency, off.Warmup, on.Warmup)
		}
		if off.Concurrency != on.Concurrency || off.Speculation != "off" || on.Speculation != "on" {
			t.Fatalf("runs %d, %d: concurrency %d / %d, speculation %q / %q", i, i+1, off.Concurrency, on.Concurrency,
				off.Speculation, on.Speculation)
		}
		if off.Steps.DraftsVerified != 0 || on.Steps.DraftsVerified == 0 {
			t.Errorf("conc %d: drafts verified off %d, on %d (want 0 and > 0)", on.Concurrency,
				off.Steps.DraftsVerified, on.Steps.DraftsVerified)
		}
		if off.OutputTokens != on.OutputTokens || off.PromptTokens != on.PromptTokens {
			t.Errorf("conc %d: tokens off %d/%d, on %d/%d", on.Concurrency, off.PromptTokens, off.OutputTokens,
				on.PromptTokens, on.OutputTokens)
		}
		if want := on.OutputTokensPerSecond / off.OutputTokensPerSecond; off.SpeedupVsPlain != 0 || !within(on.SpeedupVsPlain, want, 1e-12) {
			t.Errorf("conc %d: speed-up off %g, on %g, want 0 and %g", on.Concurrency, off.SpeedupVsPlain, on.SpeedupVsPlain, want)
		}
	}
	rep := &Report{Header: Header{Workload: w}, Runs: runs}
	cols := rep.Columns()
	if cols[len(cols)-1] != "speculation" {
		t.Fatalf("columns %v: want speculation last", cols)
	}
	rows := rep.TableRows()
	if got := rows[0][len(cols)-1]; got != "off" {
		t.Errorf("off row's cell %q", got)
	}
	if got := rows[1][len(cols)-1]; !strings.HasPrefix(got, "on, ") || !strings.HasSuffix(got, "× off") {
		t.Errorf("on row's cell %q, want \"on, N.NN× off\"", got)
	}
	var found bool
	for _, l := range rep.HeaderLines() {
		found = found || l[0] == "speculation"
	}
	if !found {
		t.Error("no speculation header line")
	}
}

// The real engine on the tiny model: every request completes with exactly
// output-len tokens, the counters agree with the workload, and the floor and
// projection columns are filled. No timing is asserted.
func TestRunTinyCPU(t *testing.T) {
	eng := startEngine(t, engine.Config{MaxBatchedTokens: 256, MaxSeqs: 16})
	w := Workload{Concurrency: []int{1, 3}, Requests: 4, Warmup: -1, InputLen: 20, OutputLen: 6, Seed: 7}
	var seen []int
	runs, err := Run(context.Background(), eng, w, func(r RunResult) { seen = append(seen, r.Concurrency) })
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || len(seen) != 2 || seen[1] != 3 {
		t.Fatalf("runs %d, callbacks %v", len(runs), seen)
	}
	floorModel, _, err := LoadFloorModel(tinyDir, FloorOptions{TP: 1})
	if err != nil {
		t.Fatal(err)
	}
	proj, _, err := LoadFloorModel(glm47Dir, FloorOptions{TP: 8, EP: 8})
	if err != nil {
		t.Fatal(err)
	}
	cpuBW, err := DefaultBandwidth("cpu", "")
	if err != nil {
		t.Fatal(err)
	}
	h200 := Bandwidth{H200MeasuredBandwidth, "H200 measured"}
	for i := range runs {
		r := &runs[i]
		if r.Requests != 4 || r.Warmup != r.Concurrency {
			t.Errorf("conc %d: %d requests, %d warm-up", r.Concurrency, r.Requests, r.Warmup)
		}
		// Counters: exact, from the workload.
		if r.OutputTokens != 4*6 || r.PromptTokens != 4*20 {
			t.Errorf("conc %d: %d output, %d prompt tokens", r.Concurrency, r.OutputTokens, r.PromptTokens)
		}
		s := r.Steps
		if s.GeneratedTokens != 4*6 || s.PromptTokens != 4*20 {
			t.Errorf("conc %d: engine counted %d generated, %d prompt tokens", r.Concurrency, s.GeneratedTokens, s.PromptTokens)
		}
		// Without preemption or prefix hits the backend computes each prompt
		// once and every generated token but the last.
		if s.Preemptions == 0 && s.PrefixHitTokens == 0 && s.ComputedTokens != 4*(20+6-1) {
			t.Errorf("conc %d: computed %d tokens, want %d", r.Concurrency, s.ComputedTokens, 4*(20+6-1))
		}
		// A request's tokens need at least output-len steps; a batch never
		// exceeds the concurrency.
		if s.Steps < 6 || s.MeanDecodeBatch <= 0 || s.MeanDecodeBatch > float64(r.Concurrency) {
			t.Errorf("conc %d: %d steps, mean batch %g", r.Concurrency, s.Steps, s.MeanDecodeBatch)
		}
		if r.Concurrency == 1 && s.MeanDecodeBatch != 1 {
			t.Errorf("concurrency 1 with one-step prefill: mean batch %g, want 1", s.MeanDecodeBatch)
		}
		if r.MeanDecodeContext != 23 {
			t.Errorf("mean decode context %g, want 20 + 6/2", r.MeanDecodeContext)
		}
		pos := map[string]float64{
			"wall": r.WallSeconds, "out tok/s": r.OutputTokensPerSecond, "req/s": r.RequestsPerSecond,
			"ttft p50": r.TTFTMs.P50, "tpot mean": r.TPOTMs.Mean, "step ms": s.MeanStepMs, "busy": s.BackendBusy,
		}
		for k, v := range pos {
			if !(v > 0) {
				t.Errorf("conc %d: %s = %g, want > 0", r.Concurrency, k, v)
			}
		}
		if !within(r.TotalTokensPerSecond, r.OutputTokensPerSecond*(20+6)/6, 1e-9) {
			t.Errorf("total tok/s %g not (prompt+output)/output × output tok/s %g", r.TotalTokensPerSecond, r.OutputTokensPerSecond)
		}
		if !(r.TTFTMs.P50 <= r.TTFTMs.P90 && r.TTFTMs.P90 <= r.TTFTMs.P99) {
			t.Errorf("TTFT percentiles not ordered: %+v", r.TTFTMs)
		}
		if err := AttachFloor(r, "TP1/EP1", floorModel, cpuBW); err != nil {
			t.Fatal(err)
		}
		if err := AttachProjection(r, "GLM-4.7 at TP8/EP8", proj, h200); err != nil {
			t.Fatal(err)
		}
		f := r.Floor
		want, _ := floorModel.Floor(s.MeanDecodeBatch, 23, CPUAssumedBandwidth)
		if f.StepMs != want.StepMs || !within(f.OfFloor, want.StepMs/r.TPOTMs.Mean, 1e-12) || f.AchievedTPOTMs != r.TPOTMs.Mean {
			t.Errorf("floor %+v, want step %g ms", f, want.StepMs)
		}
		if p := r.Projection; p.OfFloor != 0 || p.AchievedTPOTMs != 0 || p.StepMs <= f.StepMs {
			t.Errorf("projection %+v must carry no achieved figures and exceed the tiny floor", p)
		}
	}

	rep := &Report{Header: Header{
		Model: tinyDir, Backend: "cpu", Device: "CPU", CommandLine: "glmctl bench | x", Workload: w,
		Floor:      &Basis{Label: "TP1/EP1", ModelDir: tinyDir, Model: floorModel, Bandwidth: cpuBW},
		Projection: &Basis{Label: "GLM-4.7 at TP8/EP8", ModelDir: glm47Dir, Model: proj, Bandwidth: h200},
	}, Runs: runs}
	var js bytes.Buffer
	if err := json.NewEncoder(&js).Encode(rep); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("JSON does not parse back: %v", err)
	}
	if len(back.Runs) != 2 || back.Runs[1].Floor == nil || back.Runs[1].Floor.OfFloor != runs[1].Floor.OfFloor || back.Header.Projection == nil {
		t.Errorf("JSON round trip lost fields: %+v", back.Runs)
	}
	var md bytes.Buffer
	if err := rep.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(md.String()), "\n")
	table := lines[len(lines)-4:]
	for i, l := range table {
		if n := strings.Count(strings.ReplaceAll(l, `\|`, ""), "|"); n != len(rep.Columns())+1 {
			t.Errorf("markdown row %d %q has %d pipes, want %d", i, l, n, len(rep.Columns())+1)
		}
	}
	if !strings.Contains(md.String(), "`glmctl bench \\| x`") || !strings.Contains(md.String(), "PROJECTION, not a measurement") {
		t.Errorf("markdown header:\n%s", md.String())
	}
	// A profiled run (--profile --markdown) gets its families after the table.
	rep.Runs[1].Profile = &ProfileReport{Steps: 3, StepUs: 1000, Families: []FamilyReport{{Name: "attention", Us: 400, Share: 0.4}}}
	md.Reset()
	if err := rep.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), fmt.Sprintf("Profile, concurrency %d (prefill and decode steps): GPU 1000 µs per step", rep.Runs[1].Concurrency)) ||
		!strings.Contains(md.String(), "| attention |") {
		t.Errorf("markdown lacks the run's profile:\n%s", md.String())
	}
}

func TestRunRejectsWorkloadBeyondEngine(t *testing.T) {
	eng := startEngine(t, engine.Config{MaxSeqs: 2})
	_, err := Run(context.Background(), eng, Workload{Concurrency: []int{4}, InputLen: 4, OutputLen: 4}, nil)
	if err == nil || !strings.Contains(err.Error(), "max-seqs") {
		t.Fatalf("err %v", err)
	}
}

func TestRunSampledAndCancelled(t *testing.T) {
	eng := startEngine(t, engine.Config{MaxSeqs: 8})
	w := Workload{Concurrency: []int{2}, Requests: 2, Warmup: 0, InputLen: 5, OutputLen: 3, Temperature: 0.8, Seed: 3}
	runs, err := Run(context.Background(), eng, w, nil)
	if err != nil || len(runs) != 1 || runs[0].OutputTokens != 6 || runs[0].Warmup != 0 {
		t.Fatalf("sampled run: %+v, %v", runs, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, eng, w, nil); err == nil {
		t.Fatal("a cancelled context must fail the run")
	}
}

func TestNum(t *testing.T) {
	tests := map[float64]string{0: "0", 0.000726: "0.000726", 0.00196: "0.00196", 0.469: "0.469", 0.67: "0.670", 0.1: "0.100", 0.0099999: "0.0100", 1e-12: "1e-12", 3.4: "3.40", 45.21: "45.2", 15320.1: "15320", 4.46e12: "4460000000000", 2e15: "2e+15"}
	for v, want := range tests {
		if got := num(v); got != want {
			t.Errorf("num(%g) = %q, want %q", v, got, want)
		}
	}
}

// A long prompt arriving among decoding streams: its TTFT and the streams'
// inter-token gaps during its prefill are reported; its tokens are not part
// of the run's totals. A step budget below the prompt makes the engine mix
// prefill chunks with the streams' decode tokens.
func TestRunArrival(t *testing.T) {
	eng := startEngine(t, engine.Config{MaxSeqs: 4, MaxBatchedTokens: 32})
	w := Workload{Concurrency: []int{2}, Requests: 2, Warmup: 0, InputLen: 8, OutputLen: 48, ArrivalLen: 200}
	runs, err := Run(context.Background(), eng, w, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := runs[0].Arrival
	if a == nil {
		t.Fatal("no arrival result")
	}
	if a.PromptTokens != 200 || a.TTFTMs <= 0 || a.PrefillTokPerS <= 0 {
		t.Errorf("arrival %+v", a)
	}
	// 200 tokens at <= 32 per step take >= 7 steps, each also decoding the streams.
	if a.GapsDuring < 2 || a.ITLDuringMs.P50 <= 0 || a.ITLDuringMax < a.ITLDuringMs.P50 {
		t.Errorf("streams' gaps during the arrival: %+v", a)
	}
	if runs[0].OutputTokens != 2*48 || runs[0].PromptTokens != 2*8 {
		t.Errorf("run totals include the arrival: prompt %d output %d", runs[0].PromptTokens, runs[0].OutputTokens)
	}
	rep := &Report{Runs: runs}
	if l := rep.ArrivalLines(); len(l) != 1 || !strings.Contains(l[0], "a 200-token prompt, TTFT") {
		t.Errorf("arrival lines %q", l)
	}
	w.ArrivalLen = 1 << 20
	if _, err := Run(context.Background(), eng, w, nil); err == nil || !strings.Contains(err.Error(), "arrival length") {
		t.Errorf("oversized arrival: err %v", err)
	}
}

func TestRunHooked(t *testing.T) {
	eng := startEngine(t, engine.Config{MaxBatchedTokens: 256, MaxSeqs: 16})
	w := Workload{Concurrency: []int{1, 2}, Requests: 3, Warmup: 1, InputLen: 8, OutputLen: 3, Seed: 1}
	var (
		mu     sync.Mutex
		events []string
		reqs   int
	)
	_, err := RunHooked(context.Background(), eng, w, Hooks{
		RunStart: func(c, n int) { events = append(events, fmt.Sprintf("start %d %d", c, n)) },
		Request: func() {
			mu.Lock()
			reqs++
			mu.Unlock()
		},
		RunDone: func(r RunResult) {
			events = append(events, fmt.Sprintf("done %d after %d requests", r.Concurrency, reqs))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	// Warm-up requests are not counted.
	want := []string{"start 1 3", "done 1 after 3 requests", "start 2 3", "done 2 after 6 requests"}
	if fmt.Sprint(events) != fmt.Sprint(want) {
		t.Errorf("hooks %q, want %q", events, want)
	}
}
