package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/gpustat"
)

// gpu is one GPU's sample; the tests vary memory used, utilisation, power,
// temperature and SM clock.
func gpu(i int, usedGiB, util, watts, temp, sm float64) gpustat.Stats {
	return gpustat.Stats{
		Index: i, Name: "NVIDIA H200", UUID: fmt.Sprintf("GPU-%d", i),
		MemoryTotalBytes: 140 << 30, MemoryUsedBytes: uint64(usedGiB * (1 << 30)), MemoryFreeBytes: 140<<30 - uint64(usedGiB*(1<<30)),
		GPUUtilPercent: util, MemUtilPercent: util / 2, PowerWatts: watts, PowerLimitWatts: 700, TemperatureC: temp, SMClockMHz: sm,
	}
}

func without(g gpustat.Stats, f gpustat.Field) gpustat.Stats {
	g.Missing |= f
	return g
}

func TestSummariseGPU(t *testing.T) {
	tests := []struct {
		name    string
		samples [][]gpustat.Stats
		check   func(t *testing.T, g *GPUTelemetry)
	}{
		{"no samples", nil, func(t *testing.T, g *GPUTelemetry) {
			if g != nil {
				t.Errorf("got %+v, want nil", g)
			}
		}},
		{"one GPU over three samples", [][]gpustat.Stats{
			{gpu(0, 100, 50, 400, 60, 1980)},
			{gpu(0, 120, 100, 650, 72, 1800)},
			{gpu(0, 110, 90, 600, 70, 1830)},
		}, func(t *testing.T, g *GPUTelemetry) {
			one := g.GPUs[0]
			switch {
			case g.Samples != 3 || len(g.GPUs) != 1 || one.Samples != 3:
				t.Errorf("samples %d, GPUs %d", g.Samples, len(g.GPUs))
			case one.PeakMemoryUsedBytes != 120<<30 || one.MemoryTotalBytes != 140<<30:
				t.Errorf("memory peak %d total %d", one.PeakMemoryUsedBytes, one.MemoryTotalBytes)
			case !within(one.MeanUtilPercent, 80, 1e-9) || !within(one.MeanMemUtilPercent, 40, 1e-9):
				t.Errorf("util %g mem util %g", one.MeanUtilPercent, one.MeanMemUtilPercent)
			case !within(one.MeanPowerWatts, 550, 1e-9) || one.PeakPowerWatts != 650 || one.PowerLimitWatts != 700:
				t.Errorf("power mean %g peak %g limit %g", one.MeanPowerWatts, one.PeakPowerWatts, one.PowerLimitWatts)
			case one.MaxTemperatureC != 72 || !within(one.MeanSMClockMHz, 1870, 1e-9) || one.MinSMClockMHz != 1800:
				t.Errorf("temp %g SM mean %g min %g", one.MaxTemperatureC, one.MeanSMClockMHz, one.MinSMClockMHz)
			case g.PeakMemoryUsedBytes != one.PeakMemoryUsedBytes || g.MeanPowerWatts != one.MeanPowerWatts || g.NotReported != "":
				t.Errorf("aggregate %+v differs from the one GPU", g)
			}
		}},
		{"two GPUs: peaks of any GPU, means per GPU", [][]gpustat.Stats{
			{gpu(0, 100, 80, 500, 60, 1900), gpu(1, 90, 40, 300, 65, 1700)},
			{gpu(1, 95, 60, 700, 80, 1500), gpu(0, 130, 100, 600, 70, 1980)}, // matched by UUID, not position
		}, func(t *testing.T, g *GPUTelemetry) {
			if len(g.GPUs) != 2 || g.GPUs[0].Index != 0 || g.GPUs[1].Index != 1 {
				t.Fatalf("GPUs %+v", g.GPUs)
			}
			switch {
			case g.GPUs[0].PeakMemoryUsedBytes != 130<<30 || g.GPUs[1].PeakMemoryUsedBytes != 95<<30 || g.PeakMemoryUsedBytes != 130<<30:
				t.Errorf("memory peaks %d %d all %d", g.GPUs[0].PeakMemoryUsedBytes, g.GPUs[1].PeakMemoryUsedBytes, g.PeakMemoryUsedBytes)
			case !within(g.MeanUtilPercent, (90+50)/2.0, 1e-9):
				t.Errorf("mean util %g", g.MeanUtilPercent)
			case !within(g.MeanPowerWatts, (550+500)/2.0, 1e-9) || g.PeakPowerWatts != 700:
				t.Errorf("power mean %g peak %g", g.MeanPowerWatts, g.PeakPowerWatts)
			case g.MaxTemperatureC != 80 || !within(g.MeanSMClockMHz, (1940+1600)/2.0, 1e-9):
				t.Errorf("temp %g SM %g", g.MaxTemperatureC, g.MeanSMClockMHz)
			}
		}},
		{"power never reported, temperature sometimes", [][]gpustat.Stats{
			{without(gpu(0, 10, 50, 0, 0, 1000), gpustat.FieldPower|gpustat.FieldTemperature)},
			{without(gpu(0, 10, 50, 0, 55, 1000), gpustat.FieldPower)},
		}, func(t *testing.T, g *GPUTelemetry) {
			if g.NotReported != "power" || g.GPUs[0].NotReported != "power" || g.MaxTemperatureC != 55 {
				t.Errorf("not reported %q / %q, temp %g", g.NotReported, g.GPUs[0].NotReported, g.MaxTemperatureC)
			}
			cells := gpuCells(g)
			if cells[2] != "-" || cells[3] != "55" || cells[0] != "10.0" {
				t.Errorf("cells %q: want power '-', temperature 55", cells)
			}
		}},
		{"power on one GPU only: the mean is over GPUs that report it", [][]gpustat.Stats{
			{gpu(0, 10, 50, 400, 50, 1000), without(gpu(1, 10, 50, 0, 50, 1000), gpustat.FieldPower)},
		}, func(t *testing.T, g *GPUTelemetry) {
			if g.MeanPowerWatts != 400 || g.NotReported != "" || g.GPUs[1].NotReported != "power" {
				t.Errorf("power mean %g, not reported %q / %q", g.MeanPowerWatts, g.NotReported, g.GPUs[1].NotReported)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.check(t, SummariseGPU(tc.samples, time.Second))
		})
	}
}

func TestReportGPU(t *testing.T) {
	tel := SummariseGPU([][]gpustat.Stats{{gpu(0, 100, 80, 500, 60, 1900)}, {gpu(0, 120, 90, 600, 66, 1800)}}, 500*time.Millisecond)
	tests := []struct {
		name        string
		rep         Report
		wantCols    bool
		wantCells   []string
		wantLines   []string
		wantJSON    []string
		notWantJSON []string
	}{
		{
			name:        "telemetry",
			rep:         Report{Runs: []RunResult{{Concurrency: 4, GPU: tel}, {Concurrency: 8}}},
			wantCols:    true,
			wantCells:   []string{"120.0", "85%", "550/600", "66", "1850"},
			wantLines:   []string{"GPU telemetry at concurrency 4: GPU 0 NVIDIA H200: peak 120.0 of 140.0 GiB used, util 85% (memory 42%), power 550 W mean, 600 W peak (limit 700 W), max 66 °C, SM clock 1850 MHz mean, 1800 MHz min (2 samples)"},
			wantJSON:    []string{`"gpu":{"samples":2,"interval_ms":500,"peak_memory_used_bytes":128849018880`, `"mean_power_watts":550`},
			notWantJSON: []string{"gpu_telemetry_error"},
		},
		{
			name:        "unavailable",
			rep:         Report{Header: Header{GPUTelemetryError: "NVML unavailable: libnvidia-ml.so.1 not found"}, Runs: []RunResult{{Concurrency: 1}}},
			wantLines:   []string{"GPU telemetry: unavailable (NVML unavailable: libnvidia-ml.so.1 not found)"},
			wantJSON:    []string{`"gpu_telemetry_error":"NVML unavailable: libnvidia-ml.so.1 not found"`},
			notWantJSON: []string{`"gpu":`},
		},
		{
			name:      "samples failed",
			rep:       Report{Runs: []RunResult{{Concurrency: 2, GPU: &GPUTelemetry{FailedSamples: 3, Error: "sample GPUs: boom"}}}},
			wantLines: []string{"GPU telemetry at concurrency 2: 3 sample(s) failed, first: sample GPUs: boom"},
			wantJSON:  []string{`"failed_samples":3`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cols, rows := tc.rep.Columns(), tc.rep.TableRows()
			hasCols := strings.Contains(strings.Join(cols, "|"), "GPU mem GiB")
			if hasCols != tc.wantCols {
				t.Fatalf("columns %q: GPU columns %v, want %v", cols, hasCols, tc.wantCols)
			}
			for _, row := range rows {
				if len(row) != len(cols) {
					t.Fatalf("row %q has %d cells for %d columns", row, len(row), len(cols))
				}
			}
			if tc.wantCells != nil {
				if got := rows[0][len(cols)-5:]; fmt.Sprint(got) != fmt.Sprint(tc.wantCells) {
					t.Errorf("GPU cells %q, want %q", got, tc.wantCells)
				}
				if got := rows[1][len(cols)-5:]; fmt.Sprint(got) != "[- - - - -]" {
					t.Errorf("run without telemetry: cells %q", got)
				}
			}
			if got := tc.rep.GPULines(); fmt.Sprint(got) != fmt.Sprint(tc.wantLines) {
				t.Errorf("lines %q\nwant %q", got, tc.wantLines)
			}
			var md strings.Builder
			if err := tc.rep.WriteMarkdown(&md); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(md.String(), tc.wantLines[0]) {
				t.Errorf("markdown lacks %q:\n%s", tc.wantLines[0], md.String())
			}
			js, err := json.Marshal(tc.rep)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range tc.wantJSON {
				if !strings.Contains(string(js), want) {
					t.Errorf("JSON lacks %s:\n%s", want, js)
				}
			}
			for _, not := range tc.notWantJSON {
				if strings.Contains(string(js), not) {
					t.Errorf("JSON holds %s:\n%s", not, js)
				}
			}
		})
	}
}

// scriptGPUs is a fake GPU sampler: memory used grows by 1 GiB per sample;
// it fails once err is set.
type scriptGPUs struct {
	mu    sync.Mutex
	calls int
	err   error
}

func (s *scriptGPUs) Sample(ctx context.Context) ([]gpustat.Stats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.err != nil {
		return nil, s.err
	}
	return []gpustat.Stats{gpu(0, float64(s.calls), 50, 300, 40, 1500)}, nil
}

// The measured part of each run is sampled (at least at its start and end)
// into RunResult.GPU; a sampler that fails yields the failure, not an error
// of the run.
func TestRunHookedGPU(t *testing.T) {
	eng := startEngine(t, engine.Config{MaxBatchedTokens: 256, MaxSeqs: 16})
	w := Workload{Concurrency: []int{1, 2}, Requests: 2, Warmup: 0, InputLen: 8, OutputLen: 3, Seed: 1}
	s := &scriptGPUs{}
	runs, err := RunHooked(context.Background(), eng, w, Hooks{GPU: s, GPUInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	prevPeak := uint64(0)
	for _, r := range runs {
		g := r.GPU
		if g == nil || g.Samples < 2 || g.FailedSamples != 0 || len(g.GPUs) != 1 || g.IntervalMs != 1 {
			t.Fatalf("conc %d: GPU %+v", r.Concurrency, g)
		}
		if g.PeakMemoryUsedBytes <= prevPeak || g.MeanPowerWatts != 300 || g.MaxTemperatureC != 40 {
			t.Errorf("conc %d: peak %d (previous run %d), power %g, temp %g", r.Concurrency, g.PeakMemoryUsedBytes, prevPeak, g.MeanPowerWatts, g.MaxTemperatureC)
		}
		prevPeak = g.PeakMemoryUsedBytes
	}

	s.err = errors.New("sample GPUs: boom")
	runs, err = RunHooked(context.Background(), eng, Workload{Concurrency: []int{1}, Requests: 1, InputLen: 8, OutputLen: 3}, Hooks{GPU: s})
	if err != nil {
		t.Fatal(err)
	}
	if g := runs[0].GPU; g == nil || g.Samples != 0 || g.FailedSamples < 2 || g.Error != "sample GPUs: boom" {
		t.Fatalf("failing sampler: GPU %+v", g)
	}
}
