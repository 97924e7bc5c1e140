//go:build nonvml

package nvml

import (
	"fmt"

	"github.com/glmctl/glmctl/pkg/gpustat"
)

// Available reports whether this binary was built with NVML support.
const Available = false

// New returns a sampler whose every Sample answers gpustat.ErrUnavailable:
// this binary was built with -tags nonvml (the link check), without go-nvml.
func New() *Sampler {
	return &Sampler{turn: make(chan struct{}, 1)}
}

type state struct{ closed bool }

func (s *state) sample() ([]gpustat.Stats, error) {
	if s.closed {
		return nil, errClosed
	}
	return nil, fmt.Errorf("%w: this glmctl was built with -tags nonvml, without NVML", gpustat.ErrUnavailable)
}

func (s *state) close() error {
	s.closed = true
	return nil
}
