//go:build !race

// Thousands of CPU-backend requests: minutes under -race, so in the plain pass only.

package engine_test

import (
	"context"
	"sync"
	"testing"

	"github.com/glmctl/glmctl/internal/stattest"
	"github.com/glmctl/glmctl/pkg/backend/cpu"
	"github.com/glmctl/glmctl/pkg/engine"
)

// startSpecEngine runs the CPU backend on model with the MTP draft model
// loaded (k drafts at most) and an engine speculating with drafts (0: off).
func startSpecEngine(t *testing.T, model string, k, drafts int) *engine.Engine {
	t.Helper()
	be, err := cpu.Open(model, cpu.Options{KVBlockSize: 16, NumKVBlocks: 512, Threads: 2, DraftTokens: k})
	if err != nil {
		t.Fatal(err)
	}
	// Prefix caching: the shared prompt is computed once.
	eng, stop, err := engine.Start(context.Background(), be, engine.Config{MaxSeqs: 256, DraftTokens: drafts, DraftMaxBatch: 256, PrefixCaching: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stop()
		_ = be.Close()
	})
	return eng
}

// Speculative sampling keeps the model's output distribution: over many
// seeds, the joint distribution of a request's first two sampled tokens
// (the second one is where drafts are verified: accepted with probability
// p(draft), else drawn from p without the draft) is the same with drafting
// on as off. demo-go's MTP layer is trained, so drafts often fall among the
// top-k tokens and both the acceptance and the residual draw matter (with a
// draft outside the top-k, p(draft) = 0 and the residual draw is the plain
// one). A two-sample chi-square test
// over the (first, second) pairs, at a threshold a correct rule fails with
// probability 1e-6 (seeds are fixed, so the outcome is deterministic).
func TestSpeculativeSamplingKeepsDistribution(t *testing.T) {
	if testing.Short() {
		t.Skip("samples thousands of requests")
	}
	const n = 1200
	const demoModel = "../../testdata/models/demo-go"
	// demo-go's tokens of "package main\n\nimport (\n\t\"fmt\"\n\t\"strings\"\n)\n\n
	// func main() {\n\tfor i := 0; i < 10; i++ {\n\t\tfmt."
	goPrompt := []int32{841, 2004, 444, 889, 899, 197, 2308, 421, 197, 2656, 421, 469, 343, 2004, 333, 271, 461,
		287, 295, 220, 15, 26, 287, 456, 220, 653, 26, 287, 777, 271, 197, 1007, 13}
	sample := func(drafts int) map[[2]int32]int {
		eng := startSpecEngine(t, demoModel, 1, drafts)
		counts := map[[2]int32]int{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		slots := make(chan struct{}, 64) // fewer than DraftMaxBatch: every request drafts
		for i := range n {
			wg.Add(1)
			slots <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				toks, _ := collectCPU(t, eng, &engine.Request{PromptTokens: goPrompt, MaxTokens: 2, IgnoreEOS: true,
					Sampling: engine.SamplingParams{Temperature: 1, TopK: 3, TopP: 1, RepetitionPenalty: 1, Seed: int64(1000 + i), HasSeed: true}})
				if len(toks) != 2 {
					t.Errorf("request %d: %d tokens", i, len(toks))
					return
				}
				mu.Lock()
				counts[[2]int32{toks[0], toks[1]}]++
				mu.Unlock()
			}()
		}
		wg.Wait()
		if st := eng.Stats(); drafts > 0 && (st.DraftsVerified < n || st.DraftsAccepted == 0 || st.DraftsAccepted == st.DraftsVerified) {
			t.Fatalf("drafts verified %d, accepted %d: the verify path did not run for every request, both ways", st.DraftsVerified, st.DraftsAccepted)
		} else if drafts > 0 {
			t.Logf("drafts verified %d, accepted %d", st.DraftsVerified, st.DraftsAccepted)
		}
		return counts
	}
	off, on := sample(0), sample(1)
	chi2, dof := stattest.ChiSquareTwoSample(off, on)
	// Upper 1e-6 tail of chi-square: a Wilson–Hilferty bound is plenty here.
	limit := stattest.ChiSquareQuantile(dof, stattest.Z1e6)
	t.Logf("%d categories, chi2 %.1f (limit %.1f for dof %d)", len(off), chi2, limit, dof)
	if chi2 > limit {
		t.Fatalf("the joint (first, second) token distribution changed with drafting: chi2 %.1f > %.1f\noff %v\non  %v", chi2, limit, off, on)
	}
}
