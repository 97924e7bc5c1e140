package engine_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/glmctl/glmctl/pkg/backend/cpu"
	"github.com/glmctl/glmctl/pkg/engine"
)

// End-to-end tests of the engine on the real CPU backend and the bundled
// tiny model: scheduling must never change what a request computes.

const tinyModel = "../../testdata/models/tiny-f32"

func startCPUEngine(t *testing.T, blocks int, cfg engine.Config) (*engine.Engine, *cpu.Backend) {
	return startCPUEngineWith(t, blocks, cfg, nil)
}

// startCPUEngineWith is startCPUEngine with the backend wrapped by wrap (nil:
// the CPU backend itself).
func startCPUEngineWith(t *testing.T, blocks int, cfg engine.Config, wrap func(engine.Backend) engine.Backend) (*engine.Engine, *cpu.Backend) {
	t.Helper()
	be, err := cpu.Open(tinyModel, cpu.Options{KVBlockSize: 16, NumKVBlocks: blocks, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	var run engine.Backend = be
	if wrap != nil {
		run = wrap(be)
	}
	eng, stop, err := engine.Start(context.Background(), run, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stop()
		_ = be.Close()
	})
	return eng, be
}

func collectCPU(t *testing.T, eng *engine.Engine, req *engine.Request) ([]int32, engine.FinishReason) {
	t.Helper()
	st, err := eng.Submit(context.Background(), req)
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	var toks []int32
	var fin engine.FinishReason
	for ev := range st.Events() {
		if ev.HasToken {
			toks = append(toks, ev.Token)
		}
		if ev.Finish != "" {
			fin = ev.Finish
			if ev.Err != nil {
				t.Fatalf("request failed: %v", ev.Err)
			}
		}
	}
	return toks, fin
}

func waitIdleCPU(t *testing.T, eng *engine.Engine) engine.Stats {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := eng.Stats()
		if s.Running == 0 && s.Waiting == 0 && s.KVBlocksUsed == 0 {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine not idle: %+v", s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestCPUConcurrentGreedyMatchesAlone(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	type job struct {
		prompt []int32
		max    int
	}
	jobs := make([]job, 16)
	for i := range jobs {
		p := make([]int32, 1+rng.IntN(60))
		for k := range p {
			p[k] = int32(rng.IntN(1000))
		}
		jobs[i] = job{p, 4 + rng.IntN(16)}
	}
	greedy := engine.SamplingParams{Temperature: 0}

	// Alone: one request at a time, a roomy pool, no prefix cache.
	alone, _ := startCPUEngine(t, 64, engine.Config{})
	want := make([][]int32, len(jobs))
	for i, j := range jobs {
		want[i], _ = collectCPU(t, alone, &engine.Request{PromptTokens: j.prompt, MaxTokens: j.max, Sampling: greedy, IgnoreEOS: true})
		if len(want[i]) != j.max {
			t.Fatalf("job %d: %d tokens, want %d", i, len(want[i]), j.max)
		}
	}

	// Together: all at once, a pool of 12 blocks (192 tokens) so that
	// sequences are preempted and recomputed, small chunks, prefix cache on.
	for _, prefix := range []bool{false, true} {
		cfg := engine.Config{MaxBatchedTokens: 48, MaxSeqs: 8, PrefixCaching: prefix}
		eng, _ := startCPUEngine(t, 12, cfg)
		got := make([][]int32, len(jobs))
		var wg sync.WaitGroup
		for i, j := range jobs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[i], _ = collectCPU(t, eng, &engine.Request{PromptTokens: j.prompt, MaxTokens: j.max, Sampling: greedy, IgnoreEOS: true})
			}()
		}
		wg.Wait()
		for i := range jobs {
			if !slices.Equal(got[i], want[i]) {
				t.Errorf("prefix=%v job %d (prompt %d): together %v, alone %v", prefix, i, len(jobs[i].prompt), got[i], want[i])
			}
		}
		s := waitIdleCPU(t, eng)
		if s.Preemptions == 0 {
			t.Errorf("prefix=%v: no preemption happened; the test no longer covers recompute", prefix)
		}
		if s.KVBlocksUsed != 0 {
			t.Errorf("prefix=%v: %d KV blocks still used", prefix, s.KVBlocksUsed)
		}
	}
}

func TestCPUPrefixCacheHitIdentical(t *testing.T) {
	eng, _ := startCPUEngine(t, 32, engine.Config{PrefixCaching: true})
	prompt := make([]int32, 70)
	for i := range prompt {
		prompt[i] = int32((i*37 + 11) % 1000)
	}
	req := func() *engine.Request {
		return &engine.Request{PromptTokens: prompt, MaxTokens: 12, IgnoreEOS: true,
			Sampling: engine.SamplingParams{Temperature: 0.8, HasSeed: true, Seed: 99, Logprobs: true}}
	}
	a, _ := collectCPU(t, eng, req())
	before := eng.Stats().PrefixHitTokens
	b, _ := collectCPU(t, eng, req())
	if hit := eng.Stats().PrefixHitTokens - before; hit < 64 {
		t.Fatalf("second request hit %d cached tokens, want >= 64 (4 full blocks)", hit)
	}
	if !slices.Equal(a, b) {
		t.Fatalf("prefix-cache hit changed the output: %v vs %v", a, b)
	}
	waitIdleCPU(t, eng)
}

func TestCPUSeedsReproduceAndCancelFreesBlocks(t *testing.T) {
	eng, _ := startCPUEngine(t, 32, engine.DefaultConfig())
	req := func(seed int64) *engine.Request {
		return &engine.Request{PromptTokens: []int32{5, 6, 7, 8}, MaxTokens: 16, IgnoreEOS: true,
			Sampling: engine.SamplingParams{Temperature: 1.2, TopP: 0.9, HasSeed: true, Seed: seed}}
	}
	a, _ := collectCPU(t, eng, req(1))
	b, _ := collectCPU(t, eng, req(1))
	c, _ := collectCPU(t, eng, req(2))
	if !slices.Equal(a, b) {
		t.Fatalf("same seed, different tokens: %v vs %v", a, b)
	}
	if slices.Equal(a, c) {
		t.Fatalf("different seeds gave identical 16-token samples: %v", a)
	}

	st, err := eng.Submit(context.Background(), &engine.Request{PromptTokens: []int32{1, 2, 3}, MaxTokens: 4000, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	var fin engine.FinishReason
	for ev := range st.Events() {
		if ev.HasToken {
			n++
			if n == 3 {
				st.Cancel()
			}
		}
		if ev.Finish != "" {
			fin = ev.Finish
		}
	}
	if fin != engine.FinishCancelled {
		t.Fatalf("finish %q after cancel, want cancelled", fin)
	}
	waitIdleCPU(t, eng)
}
