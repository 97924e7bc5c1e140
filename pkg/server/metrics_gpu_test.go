package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/glmctl/glmctl/pkg/gpustat"
	"github.com/glmctl/glmctl/pkg/gpustat/nvml"
)

// fakeGPUs answers each Sample with the next scripted reply (the last one
// repeats).
type fakeGPUs struct {
	mu      sync.Mutex
	replies []gpuReply
	calls   int
}

type gpuReply struct {
	stats []gpustat.Stats
	err   error
}

func (f *fakeGPUs) Sample(ctx context.Context) ([]gpustat.Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.replies[min(f.calls, len(f.replies)-1)]
	f.calls++
	return r.stats, r.err
}

func h200(i int, missing gpustat.Field) gpustat.Stats {
	return gpustat.Stats{
		Index: i, Name: "NVIDIA H200", UUID: fmt.Sprintf("GPU-%d", i),
		MemoryTotalBytes: 150 << 30, MemoryUsedBytes: 100 << 30, MemoryFreeBytes: 50 << 30,
		GPUUtilPercent: 87, MemUtilPercent: 64, PowerWatts: 512.5, PowerLimitWatts: 700,
		TemperatureC: 71, SMClockMHz: 1980, MemClockMHz: 2619, Missing: missing,
	}
}

func gpuFamilies(fams map[string]struct{}) []string {
	var out []string
	for name := range fams {
		if strings.HasPrefix(name, "glmctl_gpu_") {
			out = append(out, name)
		}
	}
	return out
}

func TestMetricsGPU(t *testing.T) {
	unavailable := fmt.Errorf("%w: libnvidia-ml.so.1 not found (no NVIDIA driver installed?)", gpustat.ErrUnavailable)
	boom := errors.New("nvml: GPU 0: handle: ERROR_UNKNOWN")
	two := []gpustat.Stats{h200(0, 0), h200(1, gpustat.FieldPower|gpustat.FieldSMClock)}
	type value struct {
		name   string
		labels []string
		want   float64
	}
	tests := []struct {
		name      string
		replies   []gpuReply
		scrapes   int      // before the checked one
		values    []value  // in the last scrape
		absent    []string // families (or "name gpu") absent from the last scrape
		noGPU     bool     // no glmctl_gpu_* family at all
		logs      []string
		logsOnce  []string
		logsNever []string
	}{
		{
			name:    "two GPUs, one without power or SM clock",
			replies: []gpuReply{{stats: two}},
			values: []value{
				{"glmctl_gpu_info", []string{"gpu", "1", "uuid", "GPU-1", "name", "NVIDIA H200"}, 1},
				{"glmctl_gpu_memory_used_bytes", []string{"gpu", "0", "uuid", "GPU-0"}, 100 << 30},
				{"glmctl_gpu_memory_total_bytes", []string{"gpu", "1"}, 150 << 30},
				{"glmctl_gpu_memory_free_bytes", []string{"gpu", "1"}, 50 << 30},
				{"glmctl_gpu_utilization_ratio", []string{"gpu", "0"}, 0.87},
				{"glmctl_gpu_memory_busy_ratio", []string{"gpu", "0"}, 0.64},
				{"glmctl_gpu_power_watts", []string{"gpu", "0"}, 512.5},
				{"glmctl_gpu_power_limit_watts", []string{"gpu", "1"}, 700},
				{"glmctl_gpu_temperature_celsius", []string{"gpu", "1"}, 71},
				{"glmctl_gpu_sm_clock_hz", []string{"gpu", "0"}, 1980e6},
				{"glmctl_gpu_memory_clock_hz", []string{"gpu", "1"}, 2619e6},
			},
			absent: []string{"glmctl_gpu_power_watts 1", "glmctl_gpu_sm_clock_hz 1"},
			logs:   []string{"GPU telemetry on", `"gpus":2`},
		},
		{
			name:      "NVML unavailable: no gauges, one line saying why",
			replies:   []gpuReply{{err: unavailable}},
			scrapes:   1,
			noGPU:     true,
			logsOnce:  []string{"GPU telemetry off", "libnvidia-ml.so.1 not found"},
			logsNever: []string{"sample failed"},
		},
		{
			name:     "failing, then working",
			replies:  []gpuReply{{err: boom}, {err: boom}, {stats: two[:1]}},
			scrapes:  1,
			values:   []value{{"glmctl_gpu_power_watts", []string{"gpu", "0"}, 512.5}},
			absent:   []string{"glmctl_gpu_info 1"},
			logsOnce: []string{"the first sample failed", "ERROR_UNKNOWN", "sampling works again"},
		},
		{
			name:     "working, then failing",
			replies:  []gpuReply{{stats: two}, {stats: two}, {err: boom}},
			scrapes:  2,
			noGPU:    true,
			logsOnce: []string{"sample failed; glmctl_gpu_* metrics left out"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fake := &fakeGPUs{replies: tc.replies}
			ts := startServer(t, func(o *Options, _ *scriptBackend) { o.GPU = fake })
			for range tc.scrapes {
				scrape(t, ts)
			}
			fams := scrape(t, ts)
			if _, ok := fams["glmctl_http_requests_in_flight"]; !ok {
				t.Fatal("the server's own metrics are missing")
			}
			names := map[string]struct{}{}
			for n := range fams {
				names[n] = struct{}{}
			}
			if got := gpuFamilies(names); tc.noGPU && len(got) > 0 {
				t.Errorf("GPU families %v present, want none", got)
			}
			for _, v := range tc.values {
				got, ok := metricValue(fams, v.name, v.labels...)
				if !ok {
					t.Errorf("%s%v missing", v.name, v.labels)
				} else if got != v.want {
					t.Errorf("%s%v = %v, want %v", v.name, v.labels, got, v.want)
				}
			}
			for _, a := range tc.absent {
				name, gpu, _ := strings.Cut(a, " ")
				if _, ok := metricValue(fams, name, "gpu", gpu); ok {
					t.Errorf("%s{gpu=%s} present, want absent", name, gpu)
				}
			}
			logs := ts.logs.String()
			for _, want := range tc.logs {
				if !strings.Contains(logs, want) {
					t.Errorf("logs lack %q:\n%s", want, logs)
				}
			}
			for _, want := range tc.logsOnce {
				if n := strings.Count(logs, want); n != 1 {
					t.Errorf("logs hold %q %d times, want once:\n%s", want, n, logs)
				}
			}
			for _, never := range tc.logsNever {
				if strings.Contains(logs, never) {
					t.Errorf("logs hold %q:\n%s", never, logs)
				}
			}
		})
	}
}

// hungGPUs never answers before the caller's deadline.
type hungGPUs struct{}

func (hungGPUs) Sample(ctx context.Context) ([]gpustat.Stats, error) {
	<-ctx.Done()
	return nil, fmt.Errorf("sample GPUs: NVML did not answer in time: %w", ctx.Err())
}

// A sampler that hangs costs the scrape its timeout and its GPU samples,
// never the scrape.
func TestGPUCollectorTimeout(t *testing.T) {
	var logs bytes.Buffer
	c := &gpuCollector{sampler: hungGPUs{}, timeout: 50 * time.Millisecond, log: slog.New(slog.NewTextHandler(&logs, nil))}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	t0 := time.Now()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("scrape took %v", d)
	}
	if len(fams) != 0 {
		t.Fatalf("%d families from a hung sampler, want none", len(fams))
	}
	if !strings.Contains(logs.String(), "did not answer in time") {
		t.Fatalf("logs: %s", logs.String())
	}
}

// The real NVML sampler: without a driver (this machine, CI) the server
// starts, logs why, and /metrics has no glmctl_gpu_* family; on a GPU
// machine every GPU has its gauges.
func TestMetricsRealNVML(t *testing.T) {
	s := nvml.New()
	defer s.Close()
	ts := startServer(t, func(o *Options, _ *scriptBackend) { o.GPU = s })
	fams := scrape(t, ts)
	_, sampleErr := s.Sample(context.Background())
	if sampleErr != nil {
		if !errors.Is(sampleErr, gpustat.ErrUnavailable) {
			t.Fatalf("real NVML: %v", sampleErr)
		}
		for name := range fams {
			if strings.HasPrefix(name, "glmctl_gpu_") {
				t.Errorf("%s present without NVML", name)
			}
		}
		if logs := ts.logs.String(); !strings.Contains(logs, "GPU telemetry off") || !strings.Contains(logs, "NVML unavailable") {
			t.Errorf("logs do not say why telemetry is off:\n%s", logs)
		}
		return
	}
	for _, name := range []string{"glmctl_gpu_memory_total_bytes", "glmctl_gpu_memory_used_bytes", "glmctl_gpu_utilization_ratio"} {
		if v, ok := metricValue(fams, name, "gpu", "0"); !ok || v < 0 {
			t.Errorf("%s{gpu=0} = %v, %v", name, v, ok)
		}
	}
	if v, _ := metricValue(fams, "glmctl_gpu_memory_total_bytes", "gpu", "0"); v <= 0 {
		t.Errorf("GPU 0 total memory %v", v)
	}
}
