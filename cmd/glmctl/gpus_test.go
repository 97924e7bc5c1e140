package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/glmctl/glmctl/pkg/gpustat"
)

// fakeGPUSampler stands in for NVML: these GPUs, or err.
type fakeGPUSampler struct {
	mu     sync.Mutex
	gpus   []gpustat.Stats
	err    error
	closed int
}

func (f *fakeGPUSampler) Sample(context.Context) ([]gpustat.Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gpus, f.err
}

func (f *fakeGPUSampler) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed++
	return nil
}

// useGPUs makes the commands see f instead of NVML for the test, and counts
// the samplers opened.
func useGPUs(t *testing.T, f *fakeGPUSampler) *int {
	t.Helper()
	opened := 0
	prev := newGPUSampler
	newGPUSampler = func() gpuSampler { opened++; return f }
	t.Cleanup(func() { newGPUSampler = prev })
	return &opened
}

func fakeH200s(freeBytes ...uint64) []gpustat.Stats {
	out := make([]gpustat.Stats, len(freeBytes))
	for i, f := range freeBytes {
		out[i] = gpustat.Stats{Index: i, Name: "NVIDIA H200", UUID: fmt.Sprintf("GPU-%d", i),
			MemoryTotalBytes: 140 << 30, MemoryFreeBytes: f, MemoryUsedBytes: 140<<30 - f}
	}
	return out
}

var errNoDriver = fmt.Errorf("%w: libnvidia-ml.so.1 not found (no NVIDIA driver installed?)", gpustat.ErrUnavailable)

// inspect --tp N holds the tiny model's plan (a few MB per GPU) against
// the fake GPUs' free memory.
func TestInspectGPUCheck(t *testing.T) {
	tests := []struct {
		name       string
		fake       *fakeGPUSampler
		args       []string
		wantCode   int
		wantOut    []string
		wantErr    []string
		notOut     []string
		wantOpened int
	}{
		{"fits on 2 GPUs", &fakeGPUSampler{gpus: fakeH200s(100<<30, 100<<30, 1)}, []string{"--tp", "2", "--ep", "1"}, 0,
			[]string{"GPU memory check at TP2", "3 GPU(s) present", "GPU 0 NVIDIA H200: plan 2.2 MiB, free 100.0 GiB of 140.0 GiB: OK, 100.0 GiB spare", "GPU 1 NVIDIA H200", "Verdict: OK"},
			nil, []string{"GPU 2 NVIDIA"}, 1},
		{"GPU 1 short", &fakeGPUSampler{gpus: fakeH200s(100<<30, 1<<10)}, []string{"--tp", "2", "--ep", "1"}, 1,
			[]string{"GPU 1 NVIDIA H200: plan 2.2 MiB, free 0.0 MiB of 140.0 GiB: SHORT by 2.2 MiB", "Verdict: OK"},
			[]string{"GPU memory check: GPU 1 (NVIDIA H200, GPU-1) has 0.0 MiB free, the TP2 plan needs 2.2 MiB: short by 2.2 MiB", "--gpu-check=false"}, nil, 1},
		{"fewer GPUs than --tp", &fakeGPUSampler{gpus: fakeH200s(100 << 30)}, []string{"--tp", "4", "--ep", "1"}, 1,
			[]string{"1 GPU(s) present", "3 more GPU(s) needed: SHORT"},
			[]string{"TP4 needs 4 GPUs, 1 present"}, nil, 1},
		{"CUDA_VISIBLE_DEVICES picks the GPUs", &fakeGPUSampler{gpus: fakeH200s(1<<10, 100<<30)}, []string{"--tp", "1", "--ep", "1", "--cuda-visible", "1"}, 0,
			[]string{"GPU memory check at TP1", "GPU 1 NVIDIA H200: plan 4.3 MiB, free 100.0 GiB"}, nil, []string{"GPU 0 NVIDIA"}, 1},
		{"no driver: skipped", &fakeGPUSampler{err: errNoDriver}, []string{"--tp", "4", "--ep", "4"}, 0,
			[]string{"GPU memory check: skipped (NVML unavailable: libnvidia-ml.so.1 not found (no NVIDIA driver installed?))", "Verdict: OK"}, nil, nil, 1},
		{"--gpu-check=false", &fakeGPUSampler{gpus: fakeH200s(1)}, []string{"--tp", "2", "--ep", "1", "--gpu-check=false"}, 0,
			[]string{"Verdict: OK"}, nil, []string{"GPU memory check"}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opened := useGPUs(t, tc.fake)
			args := append([]string{"inspect", tinyModel, "--max-rows", "1"}, tc.args...)
			if i := indexOf(args, "--cuda-visible"); i >= 0 {
				t.Setenv("CUDA_VISIBLE_DEVICES", args[i+1])
				args = append(args[:i], args[i+2:]...)
			} else {
				unsetEnv(t, "CUDA_VISIBLE_DEVICES")
			}
			out, errOut, code := runCLI(t, args...)
			if code != tc.wantCode {
				t.Fatalf("exit %d, want %d\nstdout %s\nstderr %s", code, tc.wantCode, out, errOut)
			}
			for _, want := range tc.wantOut {
				if !strings.Contains(out, want) {
					t.Errorf("stdout lacks %q:\n%s", want, out)
				}
			}
			for _, not := range tc.notOut {
				if strings.Contains(out, not) {
					t.Errorf("stdout holds %q:\n%s", not, out)
				}
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(errOut, want) {
					t.Errorf("stderr lacks %q:\n%s", want, errOut)
				}
			}
			if *opened != tc.wantOpened || tc.fake.closed != tc.wantOpened {
				t.Errorf("sampler opened %d closed %d times, want %d", *opened, tc.fake.closed, tc.wantOpened)
			}
		})
	}

	// --json carries the check.
	useGPUs(t, &fakeGPUSampler{gpus: fakeH200s(1 << 10)})
	out, _, code := runCLI(t, "inspect", tinyModel, "--tp", "1", "--ep", "1", "--json")
	var rep struct {
		GPUCheck struct {
			TP   int  `json:"tp"`
			OK   bool `json:"ok"`
			GPUs []struct {
				Index      int   `json:"index"`
				ShortBytes int64 `json:"short_bytes"`
			} `json:"gpus"`
		} `json:"gpu_check"`
		OK bool `json:"ok"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("bad JSON: %v\n%s", err, out)
	}
	if code == 0 || !rep.OK || rep.GPUCheck.OK || rep.GPUCheck.TP != 1 || len(rep.GPUCheck.GPUs) != 1 || rep.GPUCheck.GPUs[0].ShortBytes <= 0 {
		t.Errorf("--json: exit %d, report %+v", code, rep)
	}
}

// unsetEnv unsets key for the test (t.Setenv restores it afterwards).
func unsetEnv(t *testing.T, key string) {
	t.Helper()
	t.Setenv(key, "")
	if err := os.Unsetenv(key); err != nil {
		t.Fatal(err)
	}
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// bench keeps GPU telemetry off for the cpu backend, saying so in the text
// and the JSON report.
func TestBenchGPUTelemetryCPU(t *testing.T) {
	opened := useGPUs(t, &fakeGPUSampler{gpus: fakeH200s(1)})
	out, errOut, code := benchCLI(t, "--concurrency", "1", "--requests", "1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "GPU telemetry: unavailable (the cpu backend runs on no GPU)") || strings.Contains(out, "GPU mem GiB") {
		t.Errorf("text report:\n%s", out)
	}
	out, errOut, code = benchCLI(t, "--concurrency", "1", "--requests", "1", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep struct {
		Header struct {
			GPUTelemetryError string `json:"gpu_telemetry_error"`
		} `json:"header"`
		Runs []map[string]any `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Header.GPUTelemetryError != "the cpu backend runs on no GPU" || len(rep.Runs) != 1 || rep.Runs[0]["gpu"] != nil {
		t.Errorf("JSON header %+v runs %v", rep.Header, rep.Runs)
	}
	if *opened != 0 {
		t.Errorf("NVML opened %d times for the cpu backend", *opened)
	}
}

// benchGPUs: the cuda backend's GPUs (--device, --tp) when NVML answers,
// else the reason.
func TestBenchGPUs(t *testing.T) {
	tests := []struct {
		name       string
		backend    string
		fake       *fakeGPUSampler
		device, tp int
		wantGPUs   []int
		wantReason string
		wantOpened int
	}{
		{"cuda, GPUs 1-2 of 4", "cuda", &fakeGPUSampler{gpus: fakeH200s(1, 2, 3, 4)}, 1, 2, []int{1, 2}, "", 1},
		{"cuda, no driver", "cuda", &fakeGPUSampler{err: errNoDriver}, 0, 1, nil, "NVML unavailable: libnvidia-ml.so.1 not found", 1},
		{"cuda, fewer GPUs than --tp", "cuda", &fakeGPUSampler{gpus: fakeH200s(1)}, 0, 2, nil, "CUDA devices 0..1: only 1 GPU(s) visible", 1},
		{"cpu", "cpu", &fakeGPUSampler{gpus: fakeH200s(1)}, 0, 1, nil, "the cpu backend runs on no GPU", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			unsetEnv(t, "CUDA_VISIBLE_DEVICES")
			opened := useGPUs(t, tc.fake)
			a := &app{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			s, closeFn, reason := a.benchGPUs(context.Background(), tc.backend, tc.device, tc.tp)
			if !strings.Contains(reason, tc.wantReason) || (tc.wantReason == "") != (reason == "") {
				t.Errorf("reason %q, want %q", reason, tc.wantReason)
			}
			if tc.wantGPUs == nil {
				if s != nil {
					t.Errorf("sampler %v, want none", s)
				}
			} else {
				got, err := s.Sample(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				var idx []int
				for _, g := range got {
					idx = append(idx, g.Index)
				}
				if fmt.Sprint(idx) != fmt.Sprint(tc.wantGPUs) {
					t.Errorf("GPUs %v, want %v", idx, tc.wantGPUs)
				}
			}
			closeFn()
			if *opened != tc.wantOpened || tc.fake.closed != tc.wantOpened {
				t.Errorf("opened %d closed %d, want %d", *opened, tc.fake.closed, tc.wantOpened)
			}
		})
	}
}
