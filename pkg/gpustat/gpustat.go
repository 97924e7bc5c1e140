// Package gpustat is GPU telemetry: what one NVIDIA GPU reports at one
// instant (memory, utilisation, power, temperature, clocks), read through
// NVML (nvml.go; libnvidia-ml.so.1, loaded at run time), and the mapping
// from CUDA device ordinals to those GPUs. /metrics (pkg/server), bench
// reports (pkg/bench) and inspect's memory check (pkg/inspect) consume
// []Stats through small interfaces of their own, so tests drive them with
// fakes; this package's own types carry no cgo.
package gpustat

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrUnavailable is wrapped by a sampler's errors when there is nothing to
// sample: no NVIDIA driver (libnvidia-ml.so.1 not found), NVML failing to
// initialise, no GPU, or a binary built without NVML (-tags nonvml). Callers
// treat it as "telemetry off", not as a failure.
var ErrUnavailable = errors.New("NVML unavailable")

// unavailableError reads as its own message and wraps ErrUnavailable, for
// reasons that are not NVML's ("NVML unavailable: …" would mislead).
type unavailableError struct{ msg string }

func (e unavailableError) Error() string { return e.msg }
func (e unavailableError) Unwrap() error { return ErrUnavailable }

// Field names a group of readings that a GPU may not report (NVML answers
// "not supported" for power on some boards, clocks under MIG, and so on).
type Field uint16

// The readings of Stats, by group.
const (
	FieldMemory      Field = 1 << iota // MemoryTotalBytes, MemoryUsedBytes, MemoryFreeBytes
	FieldUtilization                   // GPUUtilPercent, MemUtilPercent
	FieldPower                         // PowerWatts
	FieldPowerLimit                    // PowerLimitWatts
	FieldTemperature                   // TemperatureC
	FieldSMClock                       // SMClockMHz
	FieldMemClock                      // MemClockMHz
)

var fieldNames = []struct {
	f    Field
	name string
}{
	{FieldMemory, "memory"}, {FieldUtilization, "utilization"}, {FieldPower, "power"},
	{FieldPowerLimit, "power limit"}, {FieldTemperature, "temperature"},
	{FieldSMClock, "SM clock"}, {FieldMemClock, "memory clock"},
}

// String lists the fields of the set, e.g. "power, SM clock".
func (f Field) String() string {
	var names []string
	for _, n := range fieldNames {
		if f&n.f != 0 {
			names = append(names, n.name)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// Stats is one GPU at one instant.
type Stats struct {
	Index int    `json:"index"` // NVML's index, as nvidia-smi numbers the GPUs
	Name  string `json:"name"`
	UUID  string `json:"uuid"`

	MemoryTotalBytes uint64 `json:"memory_total_bytes"`
	MemoryUsedBytes  uint64 `json:"memory_used_bytes"`
	MemoryFreeBytes  uint64 `json:"memory_free_bytes"`
	// GPUUtilPercent is the share of the driver's last sample period (1/6 s
	// to 1 s) in which a kernel ran; MemUtilPercent the share in which
	// device memory was read or written. Both 0..100.
	GPUUtilPercent  float64 `json:"gpu_util_percent"`
	MemUtilPercent  float64 `json:"mem_util_percent"`
	PowerWatts      float64 `json:"power_watts"`
	PowerLimitWatts float64 `json:"power_limit_watts"` // the enforced limit
	TemperatureC    float64 `json:"temperature_c"`     // GPU die
	SMClockMHz      float64 `json:"sm_clock_mhz"`
	MemClockMHz     float64 `json:"mem_clock_mhz"`

	// Missing is what the GPU did not report; those fields read 0.
	Missing Field `json:"-"`
}

// Has reports whether every reading of f was reported.
func (s Stats) Has(f Field) bool { return s.Missing&f == 0 }

// Label is "GPU 3 (NVIDIA H200)" for messages.
func (s Stats) Label() string {
	if s.Name == "" {
		return fmt.Sprintf("GPU %d", s.Index)
	}
	return fmt.Sprintf("GPU %d (%s)", s.Index, s.Name)
}

// Sampler reads every GPU present. The NVML sampler implements it;
// consumers declare their own one-method interfaces and need not import it.
type Sampler interface {
	Sample(ctx context.Context) ([]Stats, error)
}

// CUDAOrder returns the GPUs of all (one sample of every GPU present, in
// NVML order) in CUDA's device-ordinal order under CUDA_VISIBLE_DEVICES:
// visible is its value and set whether it is set at all. Unset, every GPU is
// visible in NVML's order (PCI bus order, which is CUDA's for identical GPUs;
// CUDA_DEVICE_ORDER=FASTEST_FIRST may differ on mixed machines). Entries are
// indices or UUIDs ("GPU-8f…", a unique prefix is enough); as in CUDA, an
// entry that names no GPU hides it and every entry after it. MIG instances
// ("MIG-…") cannot be mapped: that is an error.
func CUDAOrder(all []Stats, visible string, set bool) ([]Stats, error) {
	if !set {
		return all, nil
	}
	var out []Stats
	seen := map[int]bool{}
	for _, e := range strings.Split(visible, ",") {
		e = strings.TrimSpace(e)
		if strings.HasPrefix(e, "MIG-") {
			return nil, unavailableError{fmt.Sprintf("CUDA_VISIBLE_DEVICES=%q names a MIG instance (%s): GPU telemetry maps whole GPUs only", visible, e)}
		}
		g, ok := lookupVisible(all, e)
		if !ok || seen[g.Index] {
			break // CUDA ignores this entry and all that follow
		}
		seen[g.Index] = true
		out = append(out, g)
	}
	return out, nil
}

func lookupVisible(all []Stats, e string) (Stats, bool) {
	if e == "" {
		return Stats{}, false
	}
	if i, err := strconv.Atoi(e); err == nil {
		for _, g := range all {
			if g.Index == i {
				return g, true
			}
		}
		return Stats{}, false
	}
	var found []Stats
	for _, g := range all {
		if strings.HasPrefix(g.UUID, e) {
			found = append(found, g)
		}
	}
	if len(found) != 1 { // none, or an ambiguous prefix
		return Stats{}, false
	}
	return found[0], true
}

// CUDASampler samples the GPUs that CUDA ordinals First..First+N-1 name (N
// <= 0: every visible GPU from First on), in ordinal order: the GPUs a
// backend opened with --device First --tp N runs on.
type CUDASampler struct {
	Sampler Sampler
	First   int
	N       int
	// Visible and VisibleSet are CUDA_VISIBLE_DEVICES (see CUDAOrder).
	Visible    string
	VisibleSet bool
}

// Sample implements Sampler. Fewer visible GPUs than First+N is an error
// (not ErrUnavailable: NVML works, the deployment does not fit).
func (c CUDASampler) Sample(ctx context.Context) ([]Stats, error) {
	all, err := c.Sampler.Sample(ctx)
	if err != nil {
		return nil, err
	}
	gpus, err := CUDAOrder(all, c.Visible, c.VisibleSet)
	if err != nil {
		return nil, err
	}
	if c.First < 0 {
		return nil, fmt.Errorf("first CUDA device %d must be >= 0", c.First)
	}
	if c.N <= 0 {
		if c.First > len(gpus) {
			return nil, fmt.Errorf("CUDA device %d: only %d GPU(s) visible", c.First, len(gpus))
		}
		return gpus[c.First:], nil
	}
	if c.First+c.N > len(gpus) {
		return nil, fmt.Errorf("CUDA devices %d..%d: only %d GPU(s) visible", c.First, c.First+c.N-1, len(gpus))
	}
	return gpus[c.First : c.First+c.N], nil
}
