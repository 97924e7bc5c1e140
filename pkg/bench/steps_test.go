package bench

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"

	"github.com/glmctl/glmctl/pkg/backend/cpu"
	"github.com/glmctl/glmctl/pkg/engine"
)

// countingProfiler stands in for a backend's profiler: it counts the steps
// between Start and Stop through the wrapped backend.
type countingProfiler struct {
	be      *countingBackend
	started bool
	base    int
	starts  int
}

func (p *countingProfiler) StartProfile() error {
	p.started, p.base = true, p.be.steps
	p.starts++
	return nil
}

func (p *countingProfiler) StopProfile() (engine.StepProfile, error) {
	p.started = false
	n := p.be.steps - p.base
	return engine.StepProfile{Steps: n, StepUs: 100 * float64(n), Graphs: true, Families: []engine.FamilyProfile{
		{Name: "attention", Us: 60 * float64(n), Bytes: 6e6 * int64(n), Launches: int64(n)},
		{Name: "idle", Us: 0, Bytes: 0, Launches: 0},
		{Name: "norm", Us: 40 * float64(n), Bytes: 1e6 * int64(n), Launches: 2 * int64(n)},
	}}, nil
}

type countingBackend struct {
	engine.Backend
	steps   int
	batches []int
	masked  int // sequences stepped with a token mask
	escaped int // of those, sampled tokens the mask does not allow
}

func (b *countingBackend) Step(ctx context.Context, sb *engine.StepBatch) ([]engine.SeqResult, error) {
	b.steps++
	b.batches = append(b.batches, len(sb.Seqs))
	res, err := b.Backend.Step(ctx, sb)
	for i := range sb.Seqs {
		if m := sb.Seqs[i].AllowedTokens; m != nil && err == nil {
			b.masked++
			if !engine.Allowed(m, res[i].Token) {
				b.escaped++
			}
		}
	}
	return res, err
}

// With TokenMasks every sequence of every step carries a mask, and the
// backend samples inside it.
func TestRunStepsTokenMasks(t *testing.T) {
	be, err := cpu.Open(tinyDir, cpu.Options{KVBlockSize: 16, NumKVBlocks: 64, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	cb := &countingBackend{Backend: be}
	g := StepGrid{Batches: []int{2}, Contexts: []int{20}, Steps: 3, Warmup: 1, Seed: 1, TokenMasks: true}
	if _, err := RunSteps(context.Background(), cb, g, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if cb.masked != 2*(g.Warmup+g.Steps) || cb.escaped != 0 {
		t.Fatalf("%d masked sequences (want %d), %d tokens outside their mask", cb.masked, 2*(g.Warmup+g.Steps), cb.escaped)
	}
}

func TestRunStepsTinyCPU(t *testing.T) {
	be, err := cpu.Open(tinyDir, cpu.Options{KVBlockSize: 16, NumKVBlocks: 64, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	cb := &countingBackend{Backend: be}
	prof := &countingProfiler{be: cb}
	floorModel, _, err := LoadFloorModel(tinyDir, FloorOptions{TP: 1})
	if err != nil {
		t.Fatal(err)
	}
	bw := Bandwidth{BytesPerSecond: 20e9, Source: "test"}
	floor := func(b, c int) (Floor, error) { return floorModel.Floor(float64(b), float64(c), bw.BytesPerSecond) }
	g := StepGrid{Batches: []int{1, 3}, Contexts: []int{5, 400}, Steps: 3, Warmup: 1, Seed: 1}
	var seen int
	cells, err := RunSteps(context.Background(), cb, g, prof, floor, func(StepResult) { seen++ })
	if err != nil {
		t.Fatal(err)
	}
	if len(cells) != 4 || seen != 4 {
		t.Fatalf("%d cells, %d callbacks, want 4", len(cells), seen)
	}
	for _, c := range cells {
		// 3 sequences × 25 blocks of 16 do not fit 64 blocks: skipped, said why.
		if c.Batch == 3 && c.Context == 400 {
			if !strings.Contains(c.Skipped, "75 KV blocks") {
				t.Errorf("batch 3 context 400: skipped %q, want the 75 blocks it needs", c.Skipped)
			}
			continue
		}
		if c.Skipped != "" {
			t.Errorf("batch %d context %d skipped: %s", c.Batch, c.Context, c.Skipped)
			continue
		}
		if !(c.StepMs.P50 > 0) || c.Floor == nil || !(c.OfFloor > 0) || c.Floor.Context != float64(c.Context) {
			t.Errorf("batch %d context %d: step %+v floor %+v of %g", c.Batch, c.Context, c.StepMs, c.Floor, c.OfFloor)
		}
		p := c.Profile
		if p == nil || p.Steps != g.Steps || p.StepUs != 100 || len(p.Families) != 2 {
			t.Fatalf("batch %d context %d: profile %+v (want %d steps, 100 µs/step, the empty family dropped)", c.Batch, c.Context, p, g.Steps)
		}
		if near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Abs(b) }; !near(p.Families[0].Share, 0.6) ||
			!near(p.Families[0].BytesPerSecUs, 1e11) || !near(p.FloorUs, c.Floor.StepMs*1e3) {
			t.Errorf("profile families %+v floor %g", p.Families, p.FloorUs)
		}
	}
	// Per run cell: warm-up + timed + profile warm-up + profiled steps, each
	// of the cell's batch size.
	if want := 3 * (g.Warmup + g.Steps + profileWarmup + g.Steps); cb.steps != want {
		t.Errorf("backend ran %d steps, want %d", cb.steps, want)
	}
	if prof.starts != 6 {
		t.Errorf("profile started %d times, want 2 per run cell", prof.starts)
	}
	rep := &StepReport{Grid: g, Cells: cells}
	var buf bytes.Buffer
	if err := rep.WriteMarkdown(&buf, bw.BytesPerSecond); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"skipped: needs 75 KV blocks", "Profile, batch 1, context 5 (CUDA graphs)", "| attention |"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, buf.String())
		}
	}
}

func TestStepGridCheck(t *testing.T) {
	info := engine.BackendInfo{MaxContext: 1000, MaxBatchSeqs: 8, KVBlockSize: 16, NumKVBlocks: 10}
	for _, tc := range []struct {
		g    StepGrid
		want string
	}{
		{StepGrid{Contexts: []int{1}, Steps: 1}, "at least one batch"},
		{StepGrid{Batches: []int{9}, Contexts: []int{1}, Steps: 1}, "exceeds the backend's 8"},
		{StepGrid{Batches: []int{0}, Contexts: []int{1}, Steps: 1}, "batch 0 out of range"},
		{StepGrid{Batches: []int{1}, Contexts: []int{1001}, Steps: 1}, "context 1001 out of range"},
		{StepGrid{Batches: []int{1}, Contexts: []int{10}, Steps: 0}, "steps 0"},
		{StepGrid{Batches: []int{1}, Contexts: []int{10}, Steps: 1, Warmup: -1}, "warm-up steps -1"},
		{StepGrid{Batches: []int{1}, Contexts: []int{10}, Steps: 1}, ""},
	} {
		err := tc.g.Check(info)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%+v: %v", tc.g, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.g, err, tc.want)
		}
	}
}
