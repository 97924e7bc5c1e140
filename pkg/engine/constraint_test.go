package engine_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/glmctl/glmctl/pkg/engine"
)

// setConstraint allows only the tokens of a fixed set and is done after n
// accepted tokens; it records what the engine did with it.
type setConstraint struct {
	mu       sync.Mutex
	allowed  []int32
	n        int
	accepted []int32
	fills    int
	closes   int
	fillErr  error // returned by the second FillMask
}

func (c *setConstraint) FillMask(dst []uint32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fills++
	if c.fillErr != nil && c.fills == 2 {
		return c.fillErr
	}
	clear(dst)
	for _, t := range c.allowed {
		dst[t/32] |= 1 << (t % 32)
	}
	return nil
}

func (c *setConstraint) Accept(tok int32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.Contains(c.allowed, tok) {
		return errors.New("not allowed")
	}
	c.accepted = append(c.accepted, tok)
	return nil
}

func (c *setConstraint) Done() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.accepted) >= c.n
}

func (c *setConstraint) Close() {
	c.mu.Lock()
	c.closes++
	c.mu.Unlock()
}

// lateMasks runs the CPU backend as a LateMasks backend does: the step
// "starts" (started is signalled), then waits for the engine's masks
// (StepBatch.AwaitMasks), then computes. With gate set, each FillMask of a
// gatedConstraint waits for a step to have started first, so a test
// deadlocks (and fails on its timeout) unless the engine fills the masks
// while the backend runs the step.
type lateMasks struct {
	engine.Backend
	started chan struct{}
}

func newLateMasks(b engine.Backend) engine.Backend {
	return &lateMasks{Backend: b, started: make(chan struct{}, 1)}
}

func (b *lateMasks) Info() engine.BackendInfo {
	info := b.Backend.Info()
	info.LateMasks = true
	return info
}

func (b *lateMasks) Step(ctx context.Context, batch *engine.StepBatch) ([]engine.SeqResult, error) {
	if batch.AwaitMasks != nil {
		select {
		case b.started <- struct{}{}:
		default:
		}
		batch.AwaitMasks()
	}
	return b.Backend.Step(ctx, &engine.StepBatch{Seqs: batch.Seqs})
}

// gatedConstraint is a setConstraint whose FillMask first waits for the
// backend's step to have started.
type gatedConstraint struct {
	*setConstraint
	started <-chan struct{}
}

func (c gatedConstraint) FillMask(dst []uint32) error {
	select {
	case <-c.started:
	case <-time.After(20 * time.Second):
		return errors.New("the mask was filled before the step started (no overlap)")
	}
	return c.setConstraint.FillMask(dst)
}

// The engine's two ways to fill masks: before the step, and while a
// LateMasks backend runs it.
var maskModes = []struct {
	name string
	wrap func(engine.Backend) engine.Backend
}{
	{"before-step", nil},
	{"late", newLateMasks},
}

// On the real CPU backend, with other requests in the same steps: every token
// of a constrained request is one its constraint allowed, the request stops
// when the constraint is done, the constraint is closed once, and the
// unconstrained neighbours are unaffected.
func TestConstraintLimitsTokens(t *testing.T) {
	for _, mode := range maskModes {
		t.Run(mode.name, func(t *testing.T) { testConstraintLimitsTokens(t, mode.wrap) })
	}
}

func testConstraintLimitsTokens(t *testing.T, wrap func(engine.Backend) engine.Backend) {
	eng, _ := startCPUEngineWith(t, 64, engine.Config{}, wrap)
	prompt := []int32{5, 17, 300, 42}
	free := engine.Request{PromptTokens: prompt, MaxTokens: 12, Sampling: engine.SamplingParams{Temperature: 0, TopP: 1, RepetitionPenalty: 1}}
	alone, _ := collectCPU(t, eng, &free)

	var wg sync.WaitGroup
	cons := make([]*setConstraint, 6)
	outs := make([][]int32, len(cons))
	fins := make([]engine.FinishReason, len(cons))
	var withOthers []int32
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := free
		withOthers, _ = collectCPU(t, eng, &r)
	}()
	for i := range cons {
		cons[i] = &setConstraint{allowed: []int32{7, 99, 250, int32(300 + i)}, n: 5 + i}
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := &engine.Request{PromptTokens: prompt, MaxTokens: 40, IgnoreEOS: true, Constraint: cons[i],
				Sampling: engine.SamplingParams{Temperature: 1.5, TopP: 1, RepetitionPenalty: 1, Seed: int64(i), HasSeed: true}}
			outs[i], fins[i] = collectCPU(t, eng, req)
		}()
	}
	wg.Wait()
	if !slices.Equal(alone, withOthers) {
		t.Fatalf("an unconstrained request changed next to constrained ones: %v vs %v", withOthers, alone)
	}
	for i, c := range cons {
		if fins[i] != engine.FinishStop || len(outs[i]) != c.n {
			t.Errorf("request %d: finish %q after %d tokens, want stop after %d", i, fins[i], len(outs[i]), c.n)
		}
		for _, tok := range outs[i] {
			if !slices.Contains(c.allowed, tok) {
				t.Errorf("request %d generated %d, outside %v", i, tok, c.allowed)
			}
		}
		if !slices.Equal(outs[i], c.accepted) || c.closes != 1 || c.fills != c.n {
			t.Errorf("request %d: accepted %v of %v, %d fills, closed %d times", i, c.accepted, outs[i], c.fills, c.closes)
		}
	}
	waitIdleCPU(t, eng)
}

// A constraint that fails fails its own request only, and is still closed.
func TestConstraintErrorFailsOnlyItsRequest(t *testing.T) {
	for _, mode := range maskModes {
		t.Run(mode.name, func(t *testing.T) { testConstraintErrorFailsOnlyItsRequest(t, mode.wrap) })
	}
}

func testConstraintErrorFailsOnlyItsRequest(t *testing.T, wrap func(engine.Backend) engine.Backend) {
	eng, _ := startCPUEngineWith(t, 64, engine.Config{}, wrap)
	c := &setConstraint{allowed: []int32{7, 99}, n: 10, fillErr: errors.New("grammar exploded")}
	st, err := eng.Submit(context.Background(), &engine.Request{PromptTokens: []int32{5, 6}, MaxTokens: 20, Constraint: c,
		Sampling: engine.SamplingParams{Temperature: 0, TopP: 1, RepetitionPenalty: 1}})
	if err != nil {
		t.Fatal(err)
	}
	other, fin := collectCPU(t, eng, &engine.Request{PromptTokens: []int32{9, 10, 11}, MaxTokens: 6,
		Sampling: engine.SamplingParams{Temperature: 0, TopP: 1, RepetitionPenalty: 1}})
	if fin != engine.FinishLength || len(other) != 6 {
		t.Fatalf("neighbour: finish %q after %d tokens", fin, len(other))
	}
	var last engine.Event
	n := 0
	for ev := range st.Events() {
		if ev.HasToken {
			n++
		}
		last = ev
	}
	if last.Finish != engine.FinishError || last.Err == nil || !strings.Contains(last.Err.Error(), "grammar exploded") || n != 1 {
		t.Fatalf("constrained request: %d tokens, finish %q, err %v", n, last.Finish, last.Err)
	}
	if c.closes != 1 {
		t.Fatalf("constraint closed %d times", c.closes)
	}
	waitIdleCPU(t, eng)
}

// With a LateMasks backend the masks are computed while the step runs: each
// FillMask here waits for the backend to have started its step, which only
// the overlapped path allows.
func TestLateMasksOverlapTheStep(t *testing.T) {
	var late *lateMasks
	eng, _ := startCPUEngineWith(t, 64, engine.Config{}, func(b engine.Backend) engine.Backend {
		late = newLateMasks(b).(*lateMasks)
		return late
	})
	c := &setConstraint{allowed: []int32{7, 99, 250}, n: 6}
	toks, fin := collectCPU(t, eng, &engine.Request{PromptTokens: []int32{5, 17, 300}, MaxTokens: 20, IgnoreEOS: true,
		Constraint: gatedConstraint{setConstraint: c, started: late.started},
		Sampling:   engine.SamplingParams{Temperature: 1, TopP: 1, RepetitionPenalty: 1, Seed: 3, HasSeed: true}})
	if fin != engine.FinishStop || len(toks) != 6 || !slices.Equal(toks, c.accepted) {
		t.Fatalf("finish %q, tokens %v, accepted %v", fin, toks, c.accepted)
	}
	for _, tok := range toks {
		if !slices.Contains(c.allowed, tok) {
			t.Fatalf("token %d outside %v", tok, c.allowed)
		}
	}
	waitIdleCPU(t, eng)
}

// A backend that cannot apply token masks refuses constrained requests at
// Submit, naming itself.
func TestConstraintNeedsBackendSupport(t *testing.T) {
	eng, err := engine.New(noMaskBackend{}, engine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = eng.Submit(context.Background(), &engine.Request{PromptTokens: []int32{1}, Constraint: &setConstraint{allowed: []int32{1}}})
	if !errors.Is(err, engine.ErrInvalidRequest) || !strings.Contains(err.Error(), "not supported by the fake backend") {
		t.Fatalf("err %v", err)
	}
}

// noMaskBackend is a backend without token-mask support; it never steps.
type noMaskBackend struct{}

func (noMaskBackend) Info() engine.BackendInfo {
	return engine.BackendInfo{Name: "fake", VocabSize: 100, MaxContext: 64, KVBlockSize: 4, NumKVBlocks: 16}
}
func (noMaskBackend) Close() error { return nil }
func (noMaskBackend) Step(context.Context, *engine.StepBatch) ([]engine.SeqResult, error) {
	return nil, errors.New("noMaskBackend never steps")
}

// allowAll allows every token and is never done.
type allowAll struct{ vocab int }

func (a allowAll) FillMask(dst []uint32) error {
	for i := range dst {
		dst[i] = ^uint32(0)
	}
	return nil
}
func (allowAll) Accept(int32) error { return nil }
func (allowAll) Done() bool         { return false }
func (allowAll) Close()             {}

// A constraint that allows every token leaves greedy output unchanged.
func TestConstraintAllowingEverythingKeepsGreedy(t *testing.T) {
	eng, _ := startCPUEngine(t, 64, engine.Config{})
	greedy := engine.SamplingParams{Temperature: 0, TopP: 1, RepetitionPenalty: 1}
	free, _ := collectCPU(t, eng, &engine.Request{PromptTokens: []int32{5, 17, 300, 42, 999, 7}, MaxTokens: 32, IgnoreEOS: true, Sampling: greedy})
	all, _ := collectCPU(t, eng, &engine.Request{PromptTokens: []int32{5, 17, 300, 42, 999, 7}, MaxTokens: 32, IgnoreEOS: true, Sampling: greedy, Constraint: allowAll{}})
	if !slices.Equal(free, all) || len(free) != 32 {
		t.Fatalf("greedy with an allow-all constraint %v, without %v", all, free)
	}
}
