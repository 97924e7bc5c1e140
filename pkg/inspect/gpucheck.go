package inspect

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/glmctl/glmctl/pkg/gpustat"
	"github.com/glmctl/glmctl/pkg/model"
)

// GPUSampler reads the GPUs present, in CUDA device order (pkg/gpustat/nvml
// through gpustat.CUDASampler, or a fake in tests).
type GPUSampler interface {
	Sample(ctx context.Context) ([]gpustat.Stats, error)
}

// GPUCheck holds the memory plan against the free memory of the GPUs
// present: the first TP of them must each have the plan's per-GPU bytes
// (the busiest GPU's) free.
type GPUCheck struct {
	TP        int   `json:"tp"`
	PlanBytes int64 `json:"plan_bytes_per_gpu"`
	// Skipped says why the check did not run (NVML unavailable, no plan);
	// the check then passes.
	Skipped string `json:"skipped,omitempty"`
	// Error is a sample that failed for another reason: the check fails.
	Error   string   `json:"error,omitempty"`
	Present int      `json:"gpus_present"`
	GPUs    []GPUFit `json:"gpus,omitempty"` // the first TP GPUs present
	OK      bool     `json:"ok"`
}

// GPUFit is one GPU against the plan.
type GPUFit struct {
	Index      int    `json:"index"` // NVML's (nvidia-smi's) index
	Name       string `json:"name"`
	UUID       string `json:"uuid"`
	FreeBytes  uint64 `json:"free_bytes"`
	TotalBytes uint64 `json:"total_bytes"`
	// ShortBytes is how much more free memory the plan needs (0 when it
	// fits; the whole plan when NVML did not report the GPU's memory).
	ShortBytes  int64 `json:"short_bytes,omitempty"`
	NotReported bool  `json:"memory_not_reported,omitempty"`
	OK          bool  `json:"ok"`
}

// CheckGPUs samples the GPUs with s and holds plan against them; plan nil
// (it could not be computed) skips the check.
func CheckGPUs(ctx context.Context, s GPUSampler, plan *model.MemoryPlan) *GPUCheck {
	if plan == nil {
		return &GPUCheck{Skipped: "no memory plan", OK: true}
	}
	gpus, err := s.Sample(ctx)
	return checkGPUs(plan, gpus, err)
}

func checkGPUs(plan *model.MemoryPlan, gpus []gpustat.Stats, err error) *GPUCheck {
	c := &GPUCheck{TP: plan.Opts.TP, PlanBytes: plan.Total}
	switch {
	case errors.Is(err, gpustat.ErrUnavailable):
		c.Skipped, c.OK = err.Error(), true
		return c
	case err != nil:
		c.Error = fmt.Sprintf("sample GPUs: %v", err)
		return c
	}
	c.Present = len(gpus)
	c.OK = c.Present >= c.TP
	for _, g := range gpus[:min(c.TP, len(gpus))] {
		f := GPUFit{Index: g.Index, Name: g.Name, UUID: g.UUID, FreeBytes: g.MemoryFreeBytes, TotalBytes: g.MemoryTotalBytes}
		switch {
		case !g.Has(gpustat.FieldMemory):
			f.ShortBytes, f.NotReported = c.PlanBytes, true // nothing known to be free
		case uint64(c.PlanBytes) > g.MemoryFreeBytes:
			f.ShortBytes = c.PlanBytes - int64(g.MemoryFreeBytes)
		}
		f.OK = f.ShortBytes == 0
		c.OK = c.OK && f.OK
		c.GPUs = append(c.GPUs, f)
	}
	return c
}

// gib formats bytes in GiB as nvidia-smi counts them (MiB below 1 GiB, so
// a small model's plan does not read 0.0).
func gib(n float64) string {
	if math.Abs(n) < 1<<30 {
		return fmt.Sprintf("%.1f MiB", n/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", n/(1<<30))
}

// Lines are the check as printed: a heading and one line per GPU.
func (c *GPUCheck) Lines() []string {
	switch {
	case c.Skipped != "":
		return []string{fmt.Sprintf("GPU memory check: skipped (%s)", c.Skipped)}
	case c.Error != "":
		return []string{fmt.Sprintf("GPU memory check: failed (%s)", c.Error)}
	}
	out := []string{fmt.Sprintf("GPU memory check at TP%d: %s per GPU planned, against each GPU's free memory (NVML), %d GPU(s) present",
		c.TP, gib(float64(c.PlanBytes)), c.Present)}
	for _, f := range c.GPUs {
		verdict := fmt.Sprintf("OK, %s spare", gib(float64(int64(f.FreeBytes)-c.PlanBytes)))
		switch {
		case f.NotReported:
			verdict = "SHORT: NVML does not report its memory"
		case !f.OK:
			verdict = "SHORT by " + gib(float64(f.ShortBytes))
		}
		out = append(out, fmt.Sprintf("  GPU %d %s: plan %s, free %s of %s: %s",
			f.Index, f.Name, gib(float64(c.PlanBytes)), gib(float64(f.FreeBytes)), gib(float64(f.TotalBytes)), verdict))
	}
	if c.Present < c.TP {
		out = append(out, fmt.Sprintf("  %d more GPU(s) needed: SHORT", c.TP-c.Present))
	}
	return out
}

// Err is nil when the plan fits (or the check was skipped), else an error
// naming the first GPU short and by how much, or the GPUs missing.
func (c *GPUCheck) Err() error {
	if c == nil || c.OK {
		return nil
	}
	if c.Error != "" {
		return fmt.Errorf("GPU memory check: %s", c.Error)
	}
	var short []GPUFit
	for _, f := range c.GPUs {
		if !f.OK {
			short = append(short, f)
		}
	}
	var errs []error
	if c.Present < c.TP {
		errs = append(errs, fmt.Errorf("GPU memory check: TP%d needs %d GPUs, %d present", c.TP, c.TP, c.Present))
	}
	if len(short) > 0 {
		f := short[0]
		more := ""
		if len(short) > 1 {
			more = fmt.Sprintf(" (and %d more GPU(s) short)", len(short)-1)
		}
		errs = append(errs, fmt.Errorf("GPU memory check: GPU %d (%s, %s) has %s free, the TP%d plan needs %s: short by %s%s",
			f.Index, f.Name, f.UUID, gib(float64(f.FreeBytes)), c.TP, gib(float64(c.PlanBytes)), gib(float64(f.ShortBytes)), more))
	}
	return errors.Join(errs...)
}
