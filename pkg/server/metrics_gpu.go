package server

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/glmctl/glmctl/pkg/gpustat"
)

// GPUSampler reads the GPUs the server runs on (pkg/gpustat/nvml's sampler,
// or a fake in tests). It must be safe for concurrent use.
type GPUSampler interface {
	Sample(ctx context.Context) ([]gpustat.Stats, error)
}

// GPU telemetry is sampled when /metrics is scraped, by a Collector, rather
// than by a background ticker: the values are those of the scrape's instant
// (a ticker's would be up to one period old), nothing runs when nobody
// scrapes, and there is no goroutine whose lifetime to tie to Serve. An NVML
// read takes about a millisecond per GPU; the sampler runs one read at a time
// and answers each caller by its deadline, so concurrent scrapes do not pile
// up, and a driver that hangs costs a scrape gpuScrapeTimeout and its
// glmctl_gpu_* samples, not the scrape.
const (
	gpuScrapeTimeout = 2 * time.Second
	// gpuProbeTimeout bounds the first sample, taken in New: it loads
	// NVML, which takes seconds on 8 GPUs without persistence mode.
	gpuProbeTimeout = 15 * time.Second
)

var (
	gpuLabels   = []string{"gpu", "uuid"}
	descGPUInfo = prometheus.NewDesc("glmctl_gpu_info",
		"GPUs the server runs on (value 1), by NVML index (nvidia-smi's numbering), UUID and name.", []string{"gpu", "uuid", "name"}, nil)
	descGPUMemUsed = prometheus.NewDesc("glmctl_gpu_memory_used_bytes",
		"Device memory in use (every process, NVML).", gpuLabels, nil)
	descGPUMemTotal = prometheus.NewDesc("glmctl_gpu_memory_total_bytes",
		"Device memory installed.", gpuLabels, nil)
	descGPUMemFree = prometheus.NewDesc("glmctl_gpu_memory_free_bytes",
		"Device memory free.", gpuLabels, nil)
	descGPUUtil = prometheus.NewDesc("glmctl_gpu_utilization_ratio",
		"Share of the driver's last sample period (1/6 s to 1 s) in which a kernel ran (0..1).", gpuLabels, nil)
	descGPUMemBusy = prometheus.NewDesc("glmctl_gpu_memory_busy_ratio",
		"Share of the driver's last sample period in which device memory was read or written (0..1; NVML's memory utilisation).", gpuLabels, nil)
	descGPUPower = prometheus.NewDesc("glmctl_gpu_power_watts",
		"Power draw.", gpuLabels, nil)
	descGPUPowerLimit = prometheus.NewDesc("glmctl_gpu_power_limit_watts",
		"Enforced power limit.", gpuLabels, nil)
	descGPUTemp = prometheus.NewDesc("glmctl_gpu_temperature_celsius",
		"GPU die temperature.", gpuLabels, nil)
	descGPUSMClock = prometheus.NewDesc("glmctl_gpu_sm_clock_hz",
		"Current SM clock.", gpuLabels, nil)
	descGPUMemClock = prometheus.NewDesc("glmctl_gpu_memory_clock_hz",
		"Current memory clock.", gpuLabels, nil)
)

// watchGPUs samples s once: if telemetry is unavailable (no driver, a CPU
// deployment) it logs why and the glmctl_gpu_* metrics stay absent;
// otherwise it registers the collector that samples at each scrape. It
// never fails: telemetry is not worth refusing to serve.
func (m *metrics) watchGPUs(s GPUSampler, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), gpuProbeTimeout)
	defer cancel()
	gpus, err := s.Sample(ctx)
	c := &gpuCollector{sampler: s, timeout: gpuScrapeTimeout, log: log}
	switch {
	case errors.Is(err, gpustat.ErrUnavailable):
		log.Info("GPU telemetry off: no glmctl_gpu_* metrics", "reason", err.Error())
		return
	case err != nil:
		log.Warn("GPU telemetry: the first sample failed; retrying at each scrape", "err", err.Error())
		c.lastErr = err.Error()
	default:
		log.Info("GPU telemetry on: glmctl_gpu_* metrics", "gpus", len(gpus))
	}
	m.reg.MustRegister(c)
}

// gpuCollector samples the GPUs at each scrape.
type gpuCollector struct {
	sampler GPUSampler
	timeout time.Duration
	log     *slog.Logger

	mu      sync.Mutex
	lastErr string // the last scrape's error: log changes only, not every scrape
}

func (c *gpuCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descGPUInfo, descGPUMemUsed, descGPUMemTotal, descGPUMemFree, descGPUUtil,
		descGPUMemBusy, descGPUPower, descGPUPowerLimit, descGPUTemp, descGPUSMClock, descGPUMemClock} {
		ch <- d
	}
}

// Collect sends one sample of every GPU; a failed sample sends nothing (the
// rest of the scrape is unaffected) and is logged when the error changes.
func (c *gpuCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	gpus, err := c.sampler.Sample(ctx)
	c.noteErr(err)
	if err != nil {
		return
	}
	for _, g := range gpus {
		idx := strconv.Itoa(g.Index)
		ch <- prometheus.MustNewConstMetric(descGPUInfo, prometheus.GaugeValue, 1, idx, g.UUID, g.Name)
		gauge := func(f gpustat.Field, d *prometheus.Desc, v float64) {
			if g.Has(f) {
				ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, idx, g.UUID)
			}
		}
		gauge(gpustat.FieldMemory, descGPUMemUsed, float64(g.MemoryUsedBytes))
		gauge(gpustat.FieldMemory, descGPUMemTotal, float64(g.MemoryTotalBytes))
		gauge(gpustat.FieldMemory, descGPUMemFree, float64(g.MemoryFreeBytes))
		gauge(gpustat.FieldUtilization, descGPUUtil, g.GPUUtilPercent/100)
		gauge(gpustat.FieldUtilization, descGPUMemBusy, g.MemUtilPercent/100)
		gauge(gpustat.FieldPower, descGPUPower, g.PowerWatts)
		gauge(gpustat.FieldPowerLimit, descGPUPowerLimit, g.PowerLimitWatts)
		gauge(gpustat.FieldTemperature, descGPUTemp, g.TemperatureC)
		gauge(gpustat.FieldSMClock, descGPUSMClock, g.SMClockMHz*1e6)
		gauge(gpustat.FieldMemClock, descGPUMemClock, g.MemClockMHz*1e6)
	}
}

func (c *gpuCollector) noteErr(err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	c.mu.Lock()
	prev := c.lastErr
	c.lastErr = msg
	c.mu.Unlock()
	switch {
	case msg == prev:
	case msg == "":
		c.log.Info("GPU telemetry: sampling works again")
	default:
		c.log.Warn("GPU telemetry: sample failed; glmctl_gpu_* metrics left out of scrapes until it works", "err", msg)
	}
}
