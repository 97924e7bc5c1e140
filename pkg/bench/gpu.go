package bench

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/glmctl/glmctl/pkg/gpustat"
)

// GPUSampler reads the GPUs a run uses: pkg/gpustat/nvml's sampler narrowed
// to the deployment's GPUs (gpustat.CUDASampler), or a fake in tests. It
// must be safe for concurrent use.
type GPUSampler interface {
	Sample(ctx context.Context) ([]gpustat.Stats, error)
}

// DefaultGPUInterval is how often a run samples its GPUs when
// Hooks.GPUInterval is 0: NVML's utilisation and power are averages over
// the driver's own period (up to 1 s), so faster sampling adds little.
const DefaultGPUInterval = 500 * time.Millisecond

// gpuSampleTimeout bounds one sample during a run.
const gpuSampleTimeout = 2 * time.Second

// GPUTelemetry summarises the GPU samples taken over one run's measured
// part (one at its start, one every interval, one at its end). Across
// several GPUs, peaks and maxima are the largest of any GPU and means are
// per GPU, averaged over the GPUs; a reading no GPU reported is 0 and
// listed in NotReported.
type GPUTelemetry struct {
	Samples    int     `json:"samples"`
	IntervalMs float64 `json:"interval_ms"`

	PeakMemoryUsedBytes uint64  `json:"peak_memory_used_bytes"`
	MeanUtilPercent     float64 `json:"mean_util_percent"`
	MeanPowerWatts      float64 `json:"mean_power_watts"` // per GPU
	PeakPowerWatts      float64 `json:"peak_power_watts"` // one GPU's highest sample
	MaxTemperatureC     float64 `json:"max_temperature_c"`
	MeanSMClockMHz      float64 `json:"mean_sm_clock_mhz"`
	NotReported         string  `json:"not_reported,omitempty"`
	notReported         gpustat.Field

	GPUs []GPURunStats `json:"gpus"`

	// FailedSamples counts samples that failed (not in Samples); Error is
	// the first failure.
	FailedSamples int    `json:"failed_samples,omitempty"`
	Error         string `json:"error,omitempty"`
}

// GPURunStats is one GPU over a run. Memory used is NVML's (every process
// on the GPU); peaks are the highest sample, not the true peak between
// samples.
type GPURunStats struct {
	Index               int     `json:"index"`
	Name                string  `json:"name"`
	UUID                string  `json:"uuid"`
	Samples             int     `json:"samples"`
	MemoryTotalBytes    uint64  `json:"memory_total_bytes"`
	PeakMemoryUsedBytes uint64  `json:"peak_memory_used_bytes"`
	MeanUtilPercent     float64 `json:"mean_util_percent"`
	MeanMemUtilPercent  float64 `json:"mean_mem_util_percent"` // memory read or written
	MeanPowerWatts      float64 `json:"mean_power_watts"`
	PeakPowerWatts      float64 `json:"peak_power_watts"`
	PowerLimitWatts     float64 `json:"power_limit_watts"`
	MaxTemperatureC     float64 `json:"max_temperature_c"`
	MeanSMClockMHz      float64 `json:"mean_sm_clock_mhz"`
	MinSMClockMHz       float64 `json:"min_sm_clock_mhz"`
	NotReported         string  `json:"not_reported,omitempty"`
}

// mean accumulates a mean over the samples that carried a reading.
type mean struct {
	sum float64
	n   int
}

func (m *mean) add(v float64) { m.sum += v; m.n++ }

func (m mean) value() float64 {
	if m.n == 0 {
		return 0
	}
	return m.sum / float64(m.n)
}

// SummariseGPU summarises samples (each one Sample's GPUs) into a run's
// telemetry; nil when there are none. GPUs are matched across samples by
// UUID (index when a GPU reports none), in the order first seen. Failed
// samples are counted by the caller.
func SummariseGPU(samples [][]gpustat.Stats, interval time.Duration) *GPUTelemetry {
	if len(samples) == 0 {
		return nil
	}
	type acc struct {
		s                            gpustat.Stats // identity and the last power limit
		n                            int
		util, memUtil, power, sm     mean
		peakMem                      uint64
		peakPower, maxTemp, minSM    float64
		seenMem, seenPower, seenTemp bool
		seenLimit, seenSM, seenUtil  bool
	}
	var order []string
	accs := map[string]*acc{}
	for _, sample := range samples {
		for _, g := range sample {
			key := g.UUID
			if key == "" {
				key = fmt.Sprintf("index %d", g.Index)
			}
			a := accs[key]
			if a == nil {
				a = &acc{s: g, minSM: math.Inf(1)}
				accs[key] = a
				order = append(order, key)
			}
			a.n++
			if g.Has(gpustat.FieldMemory) {
				a.seenMem = true
				a.s.MemoryTotalBytes = g.MemoryTotalBytes
				a.peakMem = max(a.peakMem, g.MemoryUsedBytes)
			}
			if g.Has(gpustat.FieldUtilization) {
				a.seenUtil = true
				a.util.add(g.GPUUtilPercent)
				a.memUtil.add(g.MemUtilPercent)
			}
			if g.Has(gpustat.FieldPower) {
				a.seenPower = true
				a.power.add(g.PowerWatts)
				a.peakPower = max(a.peakPower, g.PowerWatts)
			}
			if g.Has(gpustat.FieldPowerLimit) {
				a.seenLimit = true
				a.s.PowerLimitWatts = g.PowerLimitWatts
			}
			if g.Has(gpustat.FieldTemperature) {
				a.seenTemp = true
				a.maxTemp = max(a.maxTemp, g.TemperatureC)
			}
			if g.Has(gpustat.FieldSMClock) {
				a.seenSM = true
				a.sm.add(g.SMClockMHz)
				a.minSM = min(a.minSM, g.SMClockMHz)
			}
		}
	}
	t := &GPUTelemetry{Samples: len(samples), IntervalMs: ms(interval)}
	var util, power, sm mean
	var notReported gpustat.Field = ^gpustat.Field(0)
	for _, key := range order {
		a := accs[key]
		var missing gpustat.Field
		note := func(seen bool, f gpustat.Field) {
			if !seen {
				missing |= f
			}
		}
		note(a.seenMem, gpustat.FieldMemory)
		note(a.seenUtil, gpustat.FieldUtilization)
		note(a.seenPower, gpustat.FieldPower)
		note(a.seenLimit, gpustat.FieldPowerLimit)
		note(a.seenTemp, gpustat.FieldTemperature)
		note(a.seenSM, gpustat.FieldSMClock)
		notReported &= missing
		g := GPURunStats{
			Index: a.s.Index, Name: a.s.Name, UUID: a.s.UUID, Samples: a.n,
			MemoryTotalBytes: a.s.MemoryTotalBytes, PeakMemoryUsedBytes: a.peakMem,
			MeanUtilPercent: a.util.value(), MeanMemUtilPercent: a.memUtil.value(),
			MeanPowerWatts: a.power.value(), PeakPowerWatts: a.peakPower, PowerLimitWatts: a.s.PowerLimitWatts,
			MaxTemperatureC: a.maxTemp, MeanSMClockMHz: a.sm.value(),
		}
		if a.seenSM {
			g.MinSMClockMHz = a.minSM
		}
		if missing != 0 {
			g.NotReported = missing.String()
		}
		t.GPUs = append(t.GPUs, g)
		t.PeakMemoryUsedBytes = max(t.PeakMemoryUsedBytes, g.PeakMemoryUsedBytes)
		t.PeakPowerWatts = max(t.PeakPowerWatts, g.PeakPowerWatts)
		t.MaxTemperatureC = max(t.MaxTemperatureC, g.MaxTemperatureC)
		if a.seenUtil {
			util.add(g.MeanUtilPercent)
		}
		if a.seenPower {
			power.add(g.MeanPowerWatts)
		}
		if a.seenSM {
			sm.add(g.MeanSMClockMHz)
		}
	}
	t.MeanUtilPercent, t.MeanPowerWatts, t.MeanSMClockMHz = util.value(), power.value(), sm.value()
	if len(order) > 0 && notReported != 0 {
		t.notReported, t.NotReported = notReported, notReported.String()
	}
	return t
}

// gpuWatch samples the GPUs in the background from start until stop.
type gpuWatch struct {
	every   time.Duration
	stopped chan struct{}
	done    chan struct{}

	mu       sync.Mutex
	samples  [][]gpustat.Stats
	failed   int
	firstErr error
}

// watchGPUs starts sampling s every interval (DefaultGPUInterval when <= 0):
// one sample now, one per tick, one when stopped.
func watchGPUs(s GPUSampler, every time.Duration) *gpuWatch {
	if every <= 0 {
		every = DefaultGPUInterval
	}
	w := &gpuWatch{every: every, stopped: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			w.sample(s)
			select {
			case <-w.stopped:
				w.sample(s)
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

func (w *gpuWatch) sample(s GPUSampler) {
	ctx, cancel := context.WithTimeout(context.Background(), gpuSampleTimeout)
	defer cancel()
	st, err := s.Sample(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.failed++
		if w.firstErr == nil {
			w.firstErr = err
		}
		return
	}
	w.samples = append(w.samples, st)
}

// stop takes the last sample and summarises the run; nil when every sample
// failed and there is nothing to say but the error.
func (w *gpuWatch) stop() *GPUTelemetry {
	close(w.stopped)
	<-w.done
	t := SummariseGPU(w.samples, w.every)
	if w.failed == 0 {
		return t
	}
	if t == nil {
		t = &GPUTelemetry{IntervalMs: ms(w.every)}
	}
	t.FailedSamples, t.Error = w.failed, w.firstErr.Error()
	return t
}

// gpuColumns are the table columns of GPU telemetry (Report.Columns adds
// them when a run has telemetry).
func gpuColumns() []string {
	return []string{"GPU mem GiB", "GPU util", "power W mean/peak", "temp °C", "SM MHz"}
}

// gpuCells formats one run's telemetry for the table: peak memory used of
// the fullest GPU, mean utilisation, mean/peak power per GPU, the hottest
// GPU and the mean SM clock.
func gpuCells(t *GPUTelemetry) []string {
	if t == nil || t.Samples == 0 {
		return []string{"-", "-", "-", "-", "-"}
	}
	reported := func(f gpustat.Field, s string) string {
		if t.notReported&f != 0 {
			return "-"
		}
		return s
	}
	return []string{
		reported(gpustat.FieldMemory, fmt.Sprintf("%.1f", float64(t.PeakMemoryUsedBytes)/(1<<30))),
		reported(gpustat.FieldUtilization, fmt.Sprintf("%.0f%%", t.MeanUtilPercent)),
		reported(gpustat.FieldPower, fmt.Sprintf("%.0f/%.0f", t.MeanPowerWatts, t.PeakPowerWatts)),
		reported(gpustat.FieldTemperature, fmt.Sprintf("%.0f", t.MaxTemperatureC)),
		reported(gpustat.FieldSMClock, fmt.Sprintf("%.0f", t.MeanSMClockMHz)),
	}
}

// GPULines describe GPU telemetry below the table: "GPU telemetry:
// unavailable (reason)" when there is none, else one line per run and GPU,
// and the failures of sampling.
func (r *Report) GPULines() []string {
	if e := r.Header.GPUTelemetryError; e != "" {
		return []string{fmt.Sprintf("GPU telemetry: unavailable (%s)", e)}
	}
	var out []string
	for _, run := range r.Runs {
		t := run.GPU
		if t == nil {
			continue
		}
		for _, g := range t.GPUs {
			l := fmt.Sprintf("GPU telemetry at concurrency %d: GPU %d %s: peak %.1f of %.1f GiB used, util %.0f%% (memory %.0f%%), power %.0f W mean, %.0f W peak (limit %.0f W), max %.0f °C, SM clock %.0f MHz mean, %.0f MHz min",
				run.Concurrency, g.Index, g.Name, float64(g.PeakMemoryUsedBytes)/(1<<30), float64(g.MemoryTotalBytes)/(1<<30),
				g.MeanUtilPercent, g.MeanMemUtilPercent, g.MeanPowerWatts, g.PeakPowerWatts, g.PowerLimitWatts,
				g.MaxTemperatureC, g.MeanSMClockMHz, g.MinSMClockMHz)
			if g.NotReported != "" {
				l += "; not reported: " + g.NotReported
			}
			out = append(out, fmt.Sprintf("%s (%d samples)", l, g.Samples))
		}
		if t.FailedSamples > 0 {
			out = append(out, fmt.Sprintf("GPU telemetry at concurrency %d: %d sample(s) failed, first: %s", run.Concurrency, t.FailedSamples, t.Error))
		}
	}
	return out
}
