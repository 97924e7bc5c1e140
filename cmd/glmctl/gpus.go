package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/glmctl/glmctl/pkg/gpustat"
	"github.com/glmctl/glmctl/pkg/gpustat/nvml"
)

// gpuSampler is GPU telemetry as the commands hold it.
type gpuSampler interface {
	Sample(ctx context.Context) ([]gpustat.Stats, error)
	Close() error
}

// newGPUSampler opens GPU telemetry: NVML, loaded on the first Sample (a
// machine without a driver answers gpustat.ErrUnavailable). Tests replace it.
var newGPUSampler = func() gpuSampler { return nvml.New() }

// gpuProbeTimeout bounds a command's first sample, which loads NVML
// (seconds on 8 GPUs without persistence mode).
const gpuProbeTimeout = 30 * time.Second

// cudaGPUs narrows s to the GPUs that CUDA ordinals first..first+n-1 name
// (n <= 0: every visible GPU from first on) under this process's
// CUDA_VISIBLE_DEVICES: the GPUs a backend opened with --device first --tp
// n runs on.
func cudaGPUs(s gpustat.Sampler, first, n int) gpustat.CUDASampler {
	visible, set := os.LookupEnv("CUDA_VISIBLE_DEVICES")
	return gpustat.CUDASampler{Sampler: s, First: first, N: n, Visible: visible, VisibleSet: set}
}

// noGPUReason is why a backend has no GPU telemetry.
func noGPUReason(backendName string) string {
	return fmt.Sprintf("the %s backend runs on no GPU", backendName)
}

// closeGPUs shuts telemetry down, logging a failure (there is nothing else
// to do about it on the way out).
func (a *app) closeGPUs(s gpuSampler) {
	if err := s.Close(); err != nil {
		a.log.Warn("GPU telemetry: close", "err", err.Error())
	}
}
