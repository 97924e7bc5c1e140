package inspect

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/glmctl/glmctl/pkg/gpustat"
	"github.com/glmctl/glmctl/pkg/model"
)

type fakeGPUs struct {
	gpus []gpustat.Stats
	err  error
}

func (f fakeGPUs) Sample(context.Context) ([]gpustat.Stats, error) { return f.gpus, f.err }

const gibi = 1 << 30

// present builds GPUs with these free GiB (140 GiB each).
func present(freeGiB ...float64) []gpustat.Stats {
	out := make([]gpustat.Stats, len(freeGiB))
	for i, f := range freeGiB {
		free := uint64(f * gibi)
		out[i] = gpustat.Stats{Index: i, Name: "NVIDIA H200", UUID: fmt.Sprintf("GPU-%d", i),
			MemoryTotalBytes: 140 * gibi, MemoryFreeBytes: free, MemoryUsedBytes: 140*gibi - free}
	}
	return out
}

func TestCheckGPUs(t *testing.T) {
	plan := func(tp int, gib float64) *model.MemoryPlan {
		return &model.MemoryPlan{Opts: model.PlanOptions{TP: tp, EP: tp}, Total: int64(gib * gibi)}
	}
	noMemory := present(100)
	noMemory[0].Missing = gpustat.FieldMemory
	tests := []struct {
		name      string
		plan      *model.MemoryPlan
		sampler   fakeGPUs
		ok        bool
		skipped   string
		lines     []string // substrings, one per printed line, in order
		errWants  []string // substrings of Err; none when ok
		errAvoids []string
	}{
		{
			name: "fits", plan: plan(2, 44), sampler: fakeGPUs{gpus: present(139, 100, 10)}, ok: true,
			lines: []string{"GPU memory check at TP2: 44.0 GiB per GPU planned, against each GPU's free memory (NVML), 3 GPU(s) present",
				"GPU 0 NVIDIA H200: plan 44.0 GiB, free 139.0 GiB of 140.0 GiB: OK, 95.0 GiB spare",
				"GPU 1 NVIDIA H200: plan 44.0 GiB, free 100.0 GiB of 140.0 GiB: OK, 56.0 GiB spare"},
		},
		{
			name: "exactly fits", plan: plan(1, 50), sampler: fakeGPUs{gpus: present(50)}, ok: true,
			lines: []string{"TP1", "OK, 0.0 MiB spare"},
		},
		{
			name: "one GPU short", plan: plan(4, 44), sampler: fakeGPUs{gpus: present(139, 139, 40.5, 139)},
			lines:     []string{"TP4", "GPU 0", "GPU 1", "GPU 2 NVIDIA H200: plan 44.0 GiB, free 40.5 GiB of 140.0 GiB: SHORT by 3.5 GiB", "GPU 3"},
			errWants:  []string{"GPU 2 (NVIDIA H200, GPU-2) has 40.5 GiB free, the TP4 plan needs 44.0 GiB: short by 3.5 GiB"},
			errAvoids: []string{"more GPU(s) short", "present"},
		},
		{
			name: "two GPUs short: the first named, the count of the rest", plan: plan(2, 44), sampler: fakeGPUs{gpus: present(10, 20)},
			lines:    []string{"TP2", "SHORT by 34.0 GiB", "SHORT by 24.0 GiB"},
			errWants: []string{"GPU 0 (NVIDIA H200, GPU-0)", "short by 34.0 GiB (and 1 more GPU(s) short)"},
		},
		{
			name: "fewer GPUs than TP", plan: plan(8, 44), sampler: fakeGPUs{gpus: present(139, 139)},
			lines:    []string{"TP8", "GPU 0", "GPU 1", "6 more GPU(s) needed: SHORT"},
			errWants: []string{"TP8 needs 8 GPUs, 2 present"},
		},
		{
			name: "fewer GPUs and one short", plan: plan(4, 44), sampler: fakeGPUs{gpus: present(1)},
			lines:    []string{"TP4", "SHORT by 43.0 GiB", "3 more GPU(s) needed"},
			errWants: []string{"TP4 needs 4 GPUs, 1 present", "GPU 0 (NVIDIA H200, GPU-0) has 1.0 GiB free"},
		},
		{
			name: "memory not reported", plan: plan(1, 44), sampler: fakeGPUs{gpus: noMemory},
			lines:    []string{"TP1", "SHORT: NVML does not report its memory"},
			errWants: []string{"GPU 0", "short by 44.0 GiB"},
		},
		{
			name: "NVML unavailable: skipped", plan: plan(8, 44),
			sampler: fakeGPUs{err: fmt.Errorf("%w: libnvidia-ml.so.1 not found (no NVIDIA driver installed?)", gpustat.ErrUnavailable)},
			ok:      true, skipped: "NVML unavailable: libnvidia-ml.so.1 not found (no NVIDIA driver installed?)",
			lines: []string{"GPU memory check: skipped (NVML unavailable: libnvidia-ml.so.1 not found (no NVIDIA driver installed?))"},
		},
		{
			name: "no plan: skipped", plan: nil, sampler: fakeGPUs{gpus: present(1)}, ok: true, skipped: "no memory plan",
			lines: []string{"GPU memory check: skipped (no memory plan)"},
		},
		{
			name: "sampling fails", plan: plan(1, 44), sampler: fakeGPUs{err: errors.New("nvml: GPU 0: handle: ERROR_UNKNOWN")},
			lines:    []string{"GPU memory check: failed (sample GPUs: nvml: GPU 0: handle: ERROR_UNKNOWN)"},
			errWants: []string{"GPU memory check: sample GPUs: nvml: GPU 0: handle: ERROR_UNKNOWN"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := CheckGPUs(context.Background(), tc.sampler, tc.plan)
			if c.OK != tc.ok || c.Skipped != tc.skipped {
				t.Errorf("OK %v skipped %q, want %v %q", c.OK, c.Skipped, tc.ok, tc.skipped)
			}
			lines := c.Lines()
			if len(lines) != len(tc.lines) {
				t.Fatalf("lines:\n%s\nwant %d lines", strings.Join(lines, "\n"), len(tc.lines))
			}
			for i, want := range tc.lines {
				if !strings.Contains(lines[i], want) {
					t.Errorf("line %d %q lacks %q", i, lines[i], want)
				}
			}
			err := c.Err()
			if tc.ok != (err == nil) {
				t.Fatalf("Err() = %v, want an error: %v", err, !tc.ok)
			}
			for _, want := range tc.errWants {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
			for _, avoid := range tc.errAvoids {
				if strings.Contains(err.Error(), avoid) {
					t.Errorf("error %q holds %q", err, avoid)
				}
			}
		})
	}
	var nilCheck *GPUCheck
	if nilCheck.Err() != nil {
		t.Error("nil check has an error")
	}
}
