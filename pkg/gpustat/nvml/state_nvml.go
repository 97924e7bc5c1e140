//go:build !nonvml

package nvml

// This file and pkg/cudabuild/gpu_nvml.go are the only ones importing
// go-nvml. Importing it adds -Wl,--unresolved-symbols=ignore-in-object-files
// to the whole binary's link (docs/backends.md), so `make link-check` builds
// with -tags nonvml, which swaps in state_nonvml.go.

import (
	"fmt"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/glmctl/glmctl/pkg/gpustat"
)

// Available reports whether this binary was built with NVML support.
const Available = true

// New returns a sampler of every GPU present. Nothing is loaded until the
// first Sample.
func New() *Sampler {
	return newSampler(func() gonvml.Interface { return gonvml.New() })
}

// newSampler is New over another NVML (tests pass go-nvml's mock).
func newSampler(lib func() gonvml.Interface) *Sampler {
	return &Sampler{turn: make(chan struct{}, 1), st: state{newLib: lib}}
}

// state is NVML as a Sampler holds it; its methods run with the turn held.
type state struct {
	newLib  func() gonvml.Interface
	lib     gonvml.Interface
	inited  bool  // Init succeeded: Shutdown on close
	initErr error // Init failed: returned by every sample
	closed  bool
	count   int
}

func (s *state) init() error {
	s.lib = s.newLib()
	if ret := s.lib.Init(); ret != gonvml.SUCCESS {
		return unavailable(ret)
	}
	s.inited = true
	n, ret := s.lib.DeviceGetCount()
	switch {
	case ret != gonvml.SUCCESS:
		return fmt.Errorf("%w: device count: %s", gpustat.ErrUnavailable, ret.Error())
	case n <= 0:
		return fmt.Errorf("%w: the NVIDIA driver reports no GPUs", gpustat.ErrUnavailable)
	}
	s.count = n
	return nil
}

// unavailable explains an Init failure.
func unavailable(ret gonvml.Return) error {
	switch ret {
	case gonvml.ERROR_LIBRARY_NOT_FOUND:
		return fmt.Errorf("%w: %s not found (no NVIDIA driver installed?)", gpustat.ErrUnavailable, LibraryName)
	case gonvml.ERROR_DRIVER_NOT_LOADED:
		return fmt.Errorf("%w: the NVIDIA driver is not loaded (nvml: %s)", gpustat.ErrUnavailable, ret.Error())
	case gonvml.ERROR_NO_PERMISSION:
		return fmt.Errorf("%w: no permission to use the NVIDIA driver (nvml: %s)", gpustat.ErrUnavailable, ret.Error())
	}
	return fmt.Errorf("%w: init: %s", gpustat.ErrUnavailable, ret.Error())
}

func (s *state) sample() ([]gpustat.Stats, error) {
	switch {
	case s.closed:
		return nil, errClosed
	case s.initErr != nil:
		return nil, s.initErr
	case !s.inited:
		if err := s.init(); err != nil {
			s.initErr = err
			if s.inited { // initialised, but nothing to sample
				s.inited = false
				_ = s.lib.Shutdown()
			}
			return nil, err
		}
	}
	out := make([]gpustat.Stats, 0, s.count)
	for i := 0; i < s.count; i++ {
		dev, ret := s.lib.DeviceGetHandleByIndex(i)
		if ret != gonvml.SUCCESS {
			return nil, fmt.Errorf("nvml: GPU %d: handle: %s", i, ret.Error())
		}
		g, err := read(i, dev)
		if err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, nil
}

// read takes one GPU's readings. A reading the GPU does not give (not
// supported, no permission) is marked missing; a lost GPU is an error.
func read(i int, dev gonvml.Device) (gpustat.Stats, error) {
	g := gpustat.Stats{Index: i}
	var lost error
	ok := func(ret gonvml.Return, f gpustat.Field, what string) bool {
		if ret == gonvml.SUCCESS {
			return true
		}
		if ret == gonvml.ERROR_GPU_IS_LOST && lost == nil {
			lost = fmt.Errorf("nvml: GPU %d: %s: %s", i, what, ret.Error())
		}
		g.Missing |= f
		return false
	}
	var ret gonvml.Return
	if g.Name, ret = dev.GetName(); !ok(ret, 0, "name") {
		g.Name = ""
	}
	if g.UUID, ret = dev.GetUUID(); !ok(ret, 0, "uuid") {
		g.UUID = ""
	}
	if m, ret := dev.GetMemoryInfo(); ok(ret, gpustat.FieldMemory, "memory") {
		g.MemoryTotalBytes, g.MemoryUsedBytes, g.MemoryFreeBytes = m.Total, m.Used, m.Free
	}
	if u, ret := dev.GetUtilizationRates(); ok(ret, gpustat.FieldUtilization, "utilization") {
		g.GPUUtilPercent, g.MemUtilPercent = float64(u.Gpu), float64(u.Memory)
	}
	if mw, ret := dev.GetPowerUsage(); ok(ret, gpustat.FieldPower, "power") {
		g.PowerWatts = float64(mw) / 1000
	}
	if mw, ret := dev.GetEnforcedPowerLimit(); ok(ret, gpustat.FieldPowerLimit, "power limit") {
		g.PowerLimitWatts = float64(mw) / 1000
	}
	if c, ret := dev.GetTemperature(gonvml.TEMPERATURE_GPU); ok(ret, gpustat.FieldTemperature, "temperature") {
		g.TemperatureC = float64(c)
	}
	if mhz, ret := dev.GetClockInfo(gonvml.CLOCK_SM); ok(ret, gpustat.FieldSMClock, "SM clock") {
		g.SMClockMHz = float64(mhz)
	}
	if mhz, ret := dev.GetClockInfo(gonvml.CLOCK_MEM); ok(ret, gpustat.FieldMemClock, "memory clock") {
		g.MemClockMHz = float64(mhz)
	}
	if lost != nil {
		return gpustat.Stats{}, lost
	}
	return g, nil
}

func (s *state) close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	if !s.inited {
		return nil
	}
	s.inited = false
	if ret := s.lib.Shutdown(); ret != gonvml.SUCCESS {
		return fmt.Errorf("nvml shutdown: %s", ret.Error())
	}
	return nil
}
