// Package faultinject wraps an engine.Backend so that chosen steps fail,
// panic, return non-finite logits, stall or hit a fatal (sticky) error. Tests
// of pkg/engine and pkg/server, and the soak run's fault mode, use it to
// check that a bad step never loses or hangs a request, never leaks a KV
// block, and never takes the server down.
package faultinject

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/glmctl/glmctl/pkg/engine"
)

// Kind is what goes wrong in a step.
type Kind int

const (
	// Fail: Step returns an error (every request of the step fails).
	Fail Kind = iota + 1
	// Panic: Step panics.
	Panic
	// NaN: the step runs, but one sampling sequence's logits are reported
	// non-finite (SeqResult.Err wrapping engine.ErrNonFiniteLogits), as a
	// backend does after seeing NaN logits; its Token is left valid, so an
	// engine that ignored Err would wrongly go on.
	NaN
	// Stall: Step sleeps for Fault.Stall (or until its context ends) first.
	Stall
	// Fatal: Step returns an error wrapping engine.ErrBackendFatal (a
	// sticky CUDA error).
	Fatal
)

func (k Kind) String() string {
	switch k {
	case Fail:
		return "fail"
	case Panic:
		return "panic"
	case NaN:
		return "nan"
	case Stall:
		return "stall"
	case Fatal:
		return "fatal"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// ParseKind reads a Kind from its String form.
func ParseKind(s string) (Kind, error) {
	for k := Fail; k <= Fatal; k++ {
		if k.String() == s {
			return k, nil
		}
	}
	return 0, fmt.Errorf("fault kind %q: want fail, panic, nan, stall or fatal", s)
}

// Fault is one injected fault.
type Fault struct {
	Kind Kind
	// Step is the 1-based step number it hits; with Every > 0, the first
	// of every Every steps from Step on.
	Step  int
	Every int
	// Stall is how long a Stall fault sleeps.
	Stall time.Duration
	// Seq picks the sampling sequence a NaN fault hits: the Seq-th one of
	// the batch (0-based, modulo their number).
	Seq int
}

func (f Fault) hits(step int) bool {
	if step < f.Step {
		return false
	}
	if f.Every > 0 {
		return (step-f.Step)%f.Every == 0
	}
	return step == f.Step
}

// Injected marks errors and panics that this package made up.
var Injected = errors.New("injected fault")

// Backend is an engine.Backend with faults. Safe for use by one engine (the
// engine calls Step from its loop only); Steps and Hits may be read from any
// goroutine.
type Backend struct {
	engine.Backend

	mu     sync.Mutex
	faults []Fault
	steps  int
	hits   map[Kind]int
}

// Wrap returns b with faults.
func Wrap(b engine.Backend, faults ...Fault) *Backend {
	return &Backend{Backend: b, faults: faults, hits: map[Kind]int{}}
}

// Add adds faults; they apply from the next step on.
func (b *Backend) Add(faults ...Fault) {
	b.mu.Lock()
	b.faults = append(b.faults, faults...)
	b.mu.Unlock()
}

// Steps is how many steps have been asked for.
func (b *Backend) Steps() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.steps
}

// Hits is how many faults of kind k have been injected.
func (b *Backend) Hits(k Kind) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.hits[k]
}

// Step implements engine.Backend.
func (b *Backend) Step(ctx context.Context, batch *engine.StepBatch) ([]engine.SeqResult, error) {
	b.mu.Lock()
	b.steps++
	step := b.steps
	var now []Fault
	for _, f := range b.faults {
		if f.hits(step) {
			now = append(now, f)
			b.hits[f.Kind]++
		}
	}
	b.mu.Unlock()

	var nan *Fault
	for i := range now {
		switch f := &now[i]; f.Kind {
		case Stall:
			t := time.NewTimer(f.Stall)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, fmt.Errorf("stalled step %d: %w", step, ctx.Err())
			}
		case Fail:
			return nil, fmt.Errorf("step %d: %w", step, Injected)
		case Panic:
			panic(fmt.Sprintf("step %d: %v", step, Injected))
		case Fatal:
			return nil, fmt.Errorf("step %d: %w: %w (illegal memory access, simulated)", step, engine.ErrBackendFatal, Injected)
		case NaN:
			nan = f
		}
	}
	res, err := b.Backend.Step(ctx, batch)
	if err != nil || nan == nil {
		return res, err
	}
	var sampling []int
	for i := range batch.Seqs {
		if batch.Seqs[i].Sample {
			sampling = append(sampling, i)
		}
	}
	if len(sampling) > 0 && len(res) == len(batch.Seqs) {
		i := sampling[nan.Seq%len(sampling)]
		res[i].Err = fmt.Errorf("step %d: %w: logit 0 is NaN (%w)", step, engine.ErrNonFiniteLogits, Injected)
	}
	return res, nil
}
