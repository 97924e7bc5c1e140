//go:build !nonvml

package cudabuild

// This file and pkg/gpustat/nvml/state_nvml.go (GPU telemetry) are the only
// ones importing go-nvml. Importing it adds
// -Wl,--unresolved-symbols=ignore-in-object-files to the whole binary's link
// (docs/backends.md), so `make link-check` builds once with -tags nonvml, which
// swaps in gpu_nonvml.go, to keep unresolved C symbols link errors.

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVMLAvailable reports whether this binary was built with NVML support.
const NVMLAvailable = true

// DetectGPUs lists the visible NVIDIA GPUs through NVML (libnvidia-ml.so.1,
// loaded at run time). Without a driver it returns an error wrapping ErrNoGPU.
func DetectGPUs() ([]GPU, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w (nvml: %s)", ErrNoGPU, nvml.ErrorString(ret))
	}
	defer nvml.Shutdown()
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w (nvml: device count: %s)", ErrNoGPU, nvml.ErrorString(ret))
	}
	gpus := make([]GPU, 0, n)
	for i := 0; i < n; i++ {
		dev, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml: GPU %d: handle: %s", i, nvml.ErrorString(ret))
		}
		g := GPU{Index: i}
		if g.Name, ret = dev.GetName(); ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml: GPU %d: name: %s", i, nvml.ErrorString(ret))
		}
		if g.Major, g.Minor, ret = dev.GetCudaComputeCapability(); ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml: GPU %d (%s): compute capability: %s", i, g.Name, nvml.ErrorString(ret))
		}
		if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
			g.MemoryBytes = mem.Total
		}
		gpus = append(gpus, g)
	}
	if len(gpus) == 0 {
		return nil, fmt.Errorf("%w (nvml: 0 devices)", ErrNoGPU)
	}
	return gpus, nil
}
