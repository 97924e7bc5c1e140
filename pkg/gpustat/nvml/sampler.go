// Package nvml is the NVML implementation of gpustat's sampler: it reads
// every GPU through NVIDIA's management library (libnvidia-ml.so.1, part of
// the driver), loaded at run time on the first Sample, so a binary holding it
// runs on machines without a driver and says why there is no telemetry.
//
// With -tags nonvml (make link-check) the go-nvml binding is left out and
// every Sample answers gpustat.ErrUnavailable (sampler_nonvml.go).
package nvml

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/glmctl/glmctl/pkg/gpustat"
)

// LibraryName is the library NVML is loaded from.
const LibraryName = "libnvidia-ml.so.1"

// closeWait is how long Close waits for a sample in flight before giving up
// on shutting NVML down.
const closeWait = 5 * time.Second

// errClosed answers Sample after Close.
var errClosed = errors.New("NVML sampler closed")

// Sampler reads every GPU present through NVML. It is safe for concurrent
// use: one sample runs at a time, callers that cannot get their turn before
// their context ends return the context's error, and a caller whose context
// ends while its sample runs returns at once (an NVML call cannot be
// interrupted; it finishes in the background and holds the turn until it
// does, so a hung driver costs one goroutine, never one per caller).
//
// NVML is initialised on the first Sample; a failure there (no driver, no
// GPU) is remembered and returned, wrapping gpustat.ErrUnavailable, by
// every later Sample without trying again. Close shuts NVML down.
type Sampler struct {
	turn chan struct{} // one slot: whoever holds it may touch state
	st   state         // only with the turn held
}

// result is one sample, handed from the goroutine that took it.
type result struct {
	stats []gpustat.Stats
	err   error
}

// Sample implements gpustat.Sampler.
func (s *Sampler) Sample(ctx context.Context) ([]gpustat.Stats, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sample GPUs: %w", err)
	}
	select {
	case s.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("sample GPUs: waiting for the sample in flight: %w", ctx.Err())
	}
	done := make(chan result, 1)
	go func() {
		defer func() { <-s.turn }()
		defer func() {
			// NVML is C underneath; a Go panic here would be a bug of ours
			// or of the binding: report it as an error, never crash the
			// server over telemetry.
			if p := recover(); p != nil {
				done <- result{err: fmt.Errorf("sample GPUs: panic in NVML binding: %v", p)}
			}
		}()
		stats, err := s.st.sample()
		done <- result{stats, err}
	}()
	select {
	case r := <-done:
		return r.stats, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("sample GPUs: NVML did not answer in time: %w", ctx.Err())
	}
}

// Close shuts NVML down if a Sample initialised it; later Samples fail. It
// waits up to 5 s for a sample in flight; past that it returns an error and
// leaves NVML as it is (the process is usually exiting anyway).
func (s *Sampler) Close() error {
	t := time.NewTimer(closeWait)
	defer t.Stop()
	select {
	case s.turn <- struct{}{}:
	case <-t.C:
		return fmt.Errorf("close NVML sampler: a sample has not returned for %s; NVML not shut down", closeWait)
	}
	defer func() { <-s.turn }()
	return s.st.close()
}
