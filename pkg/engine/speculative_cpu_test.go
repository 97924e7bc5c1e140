//go:build !race

// Thousands of CPU-backend requests: minutes under -race, so in the plain pass only.

package engine_test

import (
	"context"
	"testing"

	"github.com/glmctl/glmctl/internal/fixtures"
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
	sample := func(drafts int) map[[2]int32]int {
		eng := startSpecEngine(t, "../../testdata/models/demo-go", 1, drafts)
		// 64 in flight, fewer than DraftMaxBatch: every request drafts.
		counts, err := stattest.FirstTwoTokens(eng, fixtures.DemoGoPrompt(), n, 64, func(i int) engine.SamplingParams {
			return engine.SamplingParams{Temperature: 1, TopK: 3, TopP: 1, RepetitionPenalty: 1, Seed: int64(1000 + i), HasSeed: true}
		})
		if err != nil {
			t.Fatal(err)
		}
		if drafts > 0 {
			stattest.CheckVerified(t, eng.Stats(), n)
		}
		return counts
	}
	stattest.SameDistribution(t, sample(0), sample(1))
}
