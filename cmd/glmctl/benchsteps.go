package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/glmctl/glmctl/pkg/bench"
	"github.com/glmctl/glmctl/pkg/engine"
)

// addStepBenchFlags registers bench's decode-step grid and profile flags.
func addStepBenchFlags(f *pflag.FlagSet) {
	f.String("batches", "", "decode-step grid: comma-separated batch sizes; with --contexts, time decode steps straight on the backend instead of the request workload (see docs/bench.md)")
	f.String("contexts", "1024,4096,16384", "decode-step grid: comma-separated context lengths (keys each sequence attends to)")
	f.Int("steps", 20, "decode-step grid: timed steps per cell")
	f.Int("warmup-steps", 3, "decode-step grid: untimed steps per cell before the timed ones (the first capture CUDA graphs)")
	f.Bool("token-masks", false, "decode-step grid: sample every sequence under a token mask allowing a random half of the vocabulary (the cost of structured outputs on the step)")
	f.Bool("profile", false, "also report GPU time per kernel family, bytes moved and bandwidth per family (backends that can profile: cuda)")
}

// parseInts reads a comma-separated list of positive integers for flag name.
func parseInts(name, s string) ([]int, error) {
	var out []int
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		n, err := strconv.Atoi(part)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--%s: entry %d (%q) is not a positive integer", name, i, part)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--%s: no values given", name)
	}
	return out, nil
}

// stepGridFromFlags reads the grid flags; ok is false when --batches is unset
// (the request workload runs instead).
func (a *app) stepGridFromFlags() (g bench.StepGrid, ok bool, err error) {
	v := a.v
	if v.GetString("batches") == "" {
		return g, false, nil
	}
	if g.Batches, err = parseInts("batches", v.GetString("batches")); err != nil {
		return g, true, err
	}
	if g.Contexts, err = parseInts("contexts", v.GetString("contexts")); err != nil {
		return g, true, err
	}
	g.Steps, g.Warmup, g.Seed = v.GetInt("steps"), v.GetInt("warmup-steps"), v.GetInt64("seed")
	g.TokenMasks = v.GetBool("token-masks")
	if g.Steps < 1 {
		return g, true, fmt.Errorf("--steps: %d must be >= 1", g.Steps)
	}
	if g.Warmup < 0 {
		return g, true, fmt.Errorf("--warmup-steps: %d must be >= 0", g.Warmup)
	}
	return g, true, nil
}

// profilerOf returns be's profiler when --profile asks for one, or an error
// naming the backend that cannot profile.
func (a *app) profilerOf(be engine.Backend) (bench.Profiler, error) {
	if !a.v.GetBool("profile") {
		return nil, nil
	}
	p, ok := be.(bench.Profiler)
	if !ok {
		return nil, fmt.Errorf("--profile: the %s backend cannot profile its steps (use --backend cuda)", be.Info().Name)
	}
	return p, nil
}

// runStepGrid runs the decode-step grid on be and prints its report.
func (a *app) runStepGrid(ctx context.Context, be engine.Backend, g bench.StepGrid, h bench.Header, fm bench.FloorModel, bw bench.Bandwidth) error {
	prof, err := a.profilerOf(be)
	if err != nil {
		return err
	}
	floor := func(b, c int) (bench.Floor, error) { return fm.Floor(float64(b), float64(c), bw.BytesPerSecond) }
	cells, err := bench.RunSteps(ctx, be, g, prof, floor, func(c bench.StepResult) {
		if c.Skipped != "" {
			a.log.Info("bench cell skipped", "batch", c.Batch, "context", c.Context, "why", c.Skipped)
			return
		}
		a.log.Info("bench cell finished", "batch", c.Batch, "context", c.Context,
			"step_ms", fmt.Sprintf("%.3f", c.StepMs.P50), "of_floor", fmt.Sprintf("%.1f%%", 100*c.OfFloor))
	})
	if err != nil {
		return err
	}
	rep := &bench.StepReport{Header: h, Grid: g, Cells: cells}
	switch {
	case a.v.GetBool("json"):
		return writeJSON(a.out, rep)
	case a.v.GetBool("markdown"):
		return rep.WriteMarkdown(a.out, bw.BytesPerSecond)
	}
	if err := rep.WriteText(a.out); err != nil {
		return err
	}
	if err := renderTable(a.out, rep.Columns(), rep.Rows()); err != nil {
		return err
	}
	for _, c := range cells {
		if c.Profile == nil {
			continue
		}
		if err := c.Profile.WriteProfileText(a.out, fmt.Sprintf("batch %d context %d", c.Batch, c.Context)); err != nil {
			return err
		}
		if err := renderTable(a.out, bench.ProfileColumns(bw.BytesPerSecond), c.Profile.ProfileRows(bw.BytesPerSecond)); err != nil {
			return err
		}
	}
	return nil
}

// printRunProfiles prints the per-run profiles of the request workload.
func (a *app) printRunProfiles(runs []bench.RunResult, bw bench.Bandwidth) error {
	for _, r := range runs {
		if r.Profile == nil {
			continue
		}
		if err := r.Profile.WriteProfileText(a.out, fmt.Sprintf("concurrency %d (prefill and decode steps)", r.Concurrency)); err != nil {
			return err
		}
		if err := renderTable(a.out, bench.ProfileColumns(bw.BytesPerSecond), r.Profile.ProfileRows(bw.BytesPerSecond)); err != nil {
			return err
		}
	}
	return nil
}
