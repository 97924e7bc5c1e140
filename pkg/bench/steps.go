package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/glmctl/glmctl/pkg/engine"
)

// StepGrid is a decode-step benchmark: for every batch size and context
// length, Steps decode steps of Batch sequences that each attend to Context
// keys, run straight on the backend (no scheduler, no prefill: the KV blocks
// are read as they are, so the backend's cache must hold finite values — the
// synthetic weights fill it). It measures the step the engine repeats while
// it decodes, at exactly the shapes of the table in docs/perf.md.
type StepGrid struct {
	Batches  []int `json:"batches"`
	Contexts []int `json:"contexts"`
	Steps    int   `json:"steps"`  // timed steps per cell
	Warmup   int   `json:"warmup"` // untimed steps before (the first ones capture CUDA graphs)
	Seed     int64 `json:"seed"`
	// TokenMasks samples every sequence under a token mask that allows a
	// random half of the vocabulary (structured outputs): the step time then
	// includes the masks' trip to the backend and the masked sampler, not
	// the grammar's CPU time (pkg/grammar's benchmarks measure that).
	TokenMasks bool `json:"token_masks,omitempty"`
}

// Limits of a step grid.
const (
	MaxStepBatch = 1 << 14
	MaxSteps     = 1 << 16
)

// Check validates g against the backend's limits.
func (g StepGrid) Check(info engine.BackendInfo) error {
	if len(g.Batches) == 0 || len(g.Contexts) == 0 {
		return errors.New("step grid: give at least one batch size and one context length")
	}
	for _, b := range g.Batches {
		if b < 1 || b > MaxStepBatch {
			return fmt.Errorf("step grid: batch %d out of range [1, %d]", b, MaxStepBatch)
		}
		if info.MaxBatchSeqs > 0 && b > info.MaxBatchSeqs {
			return fmt.Errorf("step grid: batch %d exceeds the backend's %d sequences per step (--max-seqs)", b, info.MaxBatchSeqs)
		}
	}
	for _, c := range g.Contexts {
		if c < 1 || c > info.MaxContext {
			return fmt.Errorf("step grid: context %d out of range [1, %d] (max_position_embeddings)", c, info.MaxContext)
		}
	}
	switch {
	case g.Steps < 1 || g.Steps > MaxSteps:
		return fmt.Errorf("step grid: steps %d out of range [1, %d]", g.Steps, MaxSteps)
	case g.Warmup < 0 || g.Warmup > MaxSteps:
		return fmt.Errorf("step grid: warm-up steps %d out of range [0, %d]", g.Warmup, MaxSteps)
	case info.KVBlockSize < 1:
		return fmt.Errorf("step grid: backend reports KV block size %d", info.KVBlockSize)
	}
	return nil
}

// StepResult is one cell of the grid.
type StepResult struct {
	Batch   int `json:"batch"`
	Context int `json:"context"`
	// Skipped says why the cell did not run (its KV does not fit the pool).
	Skipped string `json:"skipped,omitempty"`
	// StepMs is the wall time of one backend step (host work, launches,
	// GPU, the result copy), over the timed steps.
	StepMs          Percentiles    `json:"step_ms"`
	TokensPerSecond float64        `json:"tokens_per_s"` // batch / median step
	Floor           *Floor         `json:"floor,omitempty"`
	OfFloor         float64        `json:"of_floor,omitempty"` // floor step / median step
	Profile         *ProfileReport `json:"profile,omitempty"`
}

// Profiler is a backend that can time its steps by kernel family (the CUDA
// backend).
type Profiler interface {
	StartProfile() error
	StopProfile() (engine.StepProfile, error)
}

// FloorFunc gives the floor of a decode step of batch sequences at context.
type FloorFunc func(batch, context int) (Floor, error)

// RunSteps runs the grid on be. prof, if not nil, profiles a second series of
// Steps steps per cell after the timed ones (profiling slows steps down, so
// the two are kept apart). floor, if not nil, attaches each cell's floor.
func RunSteps(ctx context.Context, be engine.Backend, g StepGrid, prof Profiler, floor FloorFunc, done func(StepResult)) ([]StepResult, error) {
	info := be.Info()
	if err := g.Check(info); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(uint64(g.Seed), 0x57e9))
	var out []StepResult
	for _, c := range g.Contexts {
		for _, b := range g.Batches {
			if err := ctx.Err(); err != nil {
				return out, err
			}
			res := StepResult{Batch: b, Context: c}
			perSeq := (c + info.KVBlockSize - 1) / info.KVBlockSize
			if need := int64(b) * int64(perSeq); need > int64(info.NumKVBlocks) {
				res.Skipped = fmt.Sprintf("needs %d KV blocks (%d sequences × %d), the pool has %d", need, b, perSeq, info.NumKVBlocks)
				out = append(out, res)
				if done != nil {
					done(res)
				}
				continue
			}
			batch := stepBatch(b, c, perSeq, info.VocabSize, g.TokenMasks, rng)
			for range g.Warmup {
				if _, err := be.Step(ctx, batch); err != nil {
					return out, fmt.Errorf("batch %d context %d: warm-up step: %w", b, c, err)
				}
			}
			times := make([]float64, 0, g.Steps)
			for range g.Steps {
				t0 := time.Now()
				if _, err := be.Step(ctx, batch); err != nil {
					return out, fmt.Errorf("batch %d context %d: step: %w", b, c, err)
				}
				times = append(times, ms(time.Since(t0)))
			}
			slices.Sort(times)
			res.StepMs = summarise(times)
			res.TokensPerSecond = float64(b) / (res.StepMs.P50 / 1e3)
			if floor != nil {
				f, err := floor(b, c)
				if err != nil {
					return out, err
				}
				res.Floor = &f
				res.OfFloor = f.StepMs / res.StepMs.P50
			}
			if prof != nil {
				p, err := profileSteps(ctx, be, prof, batch, g.Steps)
				if err != nil {
					return out, fmt.Errorf("batch %d context %d: %w", b, c, err)
				}
				var fl *Floor
				if res.Floor != nil {
					fl = res.Floor
				}
				res.Profile = NewProfileReport(p, fl)
			}
			out = append(out, res)
			if done != nil {
				done(res)
			}
		}
	}
	return out, nil
}

// stepBatch is batch sequences of one new token each at position context-1,
// with disjoint block tables (sequence i owns blocks i*perSeq ..), greedy.
func stepBatch(batch, context, perSeq, vocab int, masks bool, rng *rand.Rand) *engine.StepBatch {
	sb := &engine.StepBatch{Seqs: make([]engine.StepSeq, batch)}
	for i := range sb.Seqs {
		table := make([]int32, perSeq)
		for j := range table {
			table[j] = int32(i*perSeq + j)
		}
		sb.Seqs[i] = engine.StepSeq{
			SeqID:      uint64(i + 1),
			Tokens:     []int32{int32(rng.IntN(vocab))},
			StartPos:   context - 1,
			BlockTable: table,
			Sample:     true,
			Sampling:   engine.SamplingParams{TopP: 1, RepetitionPenalty: 1},
		}
		if masks {
			m := make([]uint32, engine.MaskWords(vocab))
			for w := range m {
				m[w] = rng.Uint32()
			}
			m[0] |= 1 // never empty
			sb.Seqs[i].AllowedTokens = m
		}
	}
	return sb
}

// profileWarmup is how many profiled steps run before the profile restarts:
// the CUDA backend captures a separate (event-carrying) graph per batch size
// for profiling, on the second step it sees of that size.
const profileWarmup = 2

func profileSteps(ctx context.Context, be engine.Backend, prof Profiler, batch *engine.StepBatch, steps int) (engine.StepProfile, error) {
	for pass := range 2 {
		if err := prof.StartProfile(); err != nil {
			return engine.StepProfile{}, fmt.Errorf("start profile: %w", err)
		}
		if pass == 1 {
			break
		}
		for range profileWarmup {
			if _, err := be.Step(ctx, batch); err != nil {
				_, _ = prof.StopProfile()
				return engine.StepProfile{}, fmt.Errorf("profiled warm-up step: %w", err)
			}
		}
	}
	for range steps {
		if _, err := be.Step(ctx, batch); err != nil {
			_, _ = prof.StopProfile()
			return engine.StepProfile{}, fmt.Errorf("profiled step: %w", err)
		}
	}
	p, err := prof.StopProfile()
	if err != nil {
		return engine.StepProfile{}, fmt.Errorf("stop profile: %w", err)
	}
	return p, nil
}
