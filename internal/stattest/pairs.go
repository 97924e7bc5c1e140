package stattest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/glmctl/glmctl/pkg/engine"
)

// FirstTwoTokens submits n requests of prompt to eng, at most inFlight at a
// time, request i sampled with params(i), two tokens each (EOS ignored), and
// counts the (first, second) token pairs: the joint distribution the
// speculative-sampling tests compare, since the second token is where a
// draft is verified.
func FirstTwoTokens(eng *engine.Engine, prompt []int32, n, inFlight int, params func(i int) engine.SamplingParams) (map[[2]int32]int, error) {
	counts := map[[2]int32]int{}
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	slots := make(chan struct{}, inFlight)
	for i := range n {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			toks, err := twoTokens(eng, prompt, params(i))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("request %d: %w", i, err))
				return
			}
			counts[[2]int32{toks[0], toks[1]}]++
		}()
	}
	wg.Wait()
	return counts, errors.Join(errs...)
}

func twoTokens(eng *engine.Engine, prompt []int32, p engine.SamplingParams) ([]int32, error) {
	st, err := eng.Submit(context.Background(), &engine.Request{PromptTokens: prompt, MaxTokens: 2, IgnoreEOS: true, Sampling: p})
	if err != nil {
		return nil, err
	}
	var toks []int32
	var failed error
	for ev := range st.Events() {
		if ev.HasToken {
			toks = append(toks, ev.Token)
		}
		if ev.Err != nil {
			failed = ev.Err
		}
	}
	if failed != nil {
		return nil, failed
	}
	if len(toks) != 2 {
		return nil, fmt.Errorf("%d tokens, want 2", len(toks))
	}
	return toks, nil
}

// SameDistribution fails t when the two count tables differ by more than a
// two-sample chi-square test at the 1e-6 level allows (seeded samples make
// the outcome deterministic).
func SameDistribution(t testing.TB, off, on map[[2]int32]int) {
	t.Helper()
	chi2, dof := ChiSquareTwoSample(off, on)
	limit := ChiSquareQuantile(dof, Z1e6)
	t.Logf("%d categories, chi2 %.1f (limit %.1f for dof %d)", len(off), chi2, limit, dof)
	if chi2 > limit {
		t.Fatalf("the joint (first, second) token distribution changed with drafting: chi2 %.1f > %.1f\noff %v\non  %v", chi2, limit, off, on)
	}
}

// CheckVerified fails t unless drafting verified a draft for each of n
// requests and both accepted and rejected some (the verify rule ran both
// ways); it logs the counts.
func CheckVerified(t testing.TB, st engine.Stats, n int) {
	t.Helper()
	t.Logf("drafts verified %d, accepted %d", st.DraftsVerified, st.DraftsAccepted)
	if st.DraftsVerified < uint64(n) || st.DraftsAccepted == 0 || st.DraftsAccepted == st.DraftsVerified {
		t.Fatalf("drafts verified %d, accepted %d: the verify path did not run for every request, both ways", st.DraftsVerified, st.DraftsAccepted)
	}
}
