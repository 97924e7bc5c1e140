package cpu_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/glmctl/glmctl/pkg/backend/cpu"
	"github.com/glmctl/glmctl/pkg/golden"
)

const modelsDir = "../../../testdata/models"

var tinyModels = []string{"tiny-f32", "tiny-bf16g"}

// compareGolden runs one golden file on a fresh backend for the named tiny
// model and logs every case.
func compareGolden(t *testing.T, model, goldenPath string, o cpu.Options, tol golden.Tolerances) *golden.Report {
	t.Helper()
	be := openTiny(t, model, o)
	f, err := golden.Load(goldenPath)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := golden.Compare(context.Background(), be, f, golden.Options{Tolerances: tol, ModelName: model})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Cases {
		t.Logf("%s %s case %d (%d tokens): rel L2 %.2e, max abs %.2e, top-1 %v, top-5 %d/5, greedy mismatches %d (+%d near-tie)",
			model, variantName(o), c.Case, c.PromptLen, c.RelL2, c.MaxAbs, c.Top1Match, c.Top5Overlap, c.GreedyMismatches, c.GreedyTolerated)
	}
	return rep
}

func hfGolden(model string) string { return filepath.Join(modelsDir, model+".golden.json") }

// The exact float32 path reproduces transformers within 1e-4 relative L2
// (it measures about 1e-6) with every greedy token equal.
func TestGoldensExact(t *testing.T) {
	for _, m := range tinyModels {
		t.Run(m, func(t *testing.T) {
			rep := compareGolden(t, m, hfGolden(m), cpu.Options{}, golden.ExactTolerances)
			if err := rep.Err(); err != nil {
				t.Fatal(err)
			}
			for _, c := range rep.Cases {
				if c.GreedyTolerated != 0 || c.Top5Overlap != 5 {
					t.Errorf("case %d: %d near-tie mismatches, top-5 overlap %d; the exact path should agree fully", c.Case, c.GreedyTolerated, c.Top5Overlap)
				}
			}
		})
	}
}

// Each deliberately wrong variant must fail the exact goldens of both models.
func TestWrongVariantsFailGoldens(t *testing.T) {
	if raceEnabled {
		// Arithmetic, not concurrency: 1-2 minutes under the race detector
		// for nothing it could find. The plain pass of make test runs it.
		t.Skip("runs in the plain (non -race) pass")
	}
	variants := []struct {
		name string
		v    cpu.Variant
	}{
		{"interleaved-rope", cpu.Variant{InterleavedRoPE: true}},
		{"routing-weights-from-biased", cpu.Variant{RoutingWeightsFromBiased: true}},
		{"qk-norm-after-rope", cpu.Variant{QKNormAfterRoPE: true}},
	}
	for _, m := range tinyModels {
		for _, vv := range variants {
			v := vv.v
			t.Run(m+"/"+vv.name, func(t *testing.T) {
				rep := compareGolden(t, m, hfGolden(m), cpu.Options{Variant: v}, golden.ExactTolerances)
				err := rep.Err()
				if err == nil {
					t.Fatalf("variant %+v passed the %s golden", v, m)
				}
				failed := 0
				for _, c := range rep.Cases {
					if !c.Pass {
						failed++
					}
				}
				t.Logf("variant %+v: %d of %d cases fail: %v", v, failed, len(rep.Cases), err)
			})
		}
	}
}

// A golden file made for the other tiny model is refused by name, and its
// numbers would not match either.
func TestWrongModelGoldenFails(t *testing.T) {
	be := openTiny(t, "tiny-f32", cpu.Options{})
	f, err := golden.Load(hfGolden("tiny-bf16g"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = golden.Compare(context.Background(), be, f, golden.Options{Tolerances: golden.ExactTolerances, ModelName: "tiny-f32"})
	want := "golden file " + hfGolden("tiny-bf16g") + " was made for model tiny-bf16g, not tiny-f32"
	if err == nil || err.Error() != want {
		t.Fatalf("err %v, want %q", err, want)
	}
	rep, err := golden.Compare(context.Background(), be, f, golden.Options{Tolerances: golden.ExactTolerances})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Pass {
		t.Fatal("tiny-bf16g golden passed on tiny-f32 with the name check off")
	}
}

func fp8Golden(model string) string { return filepath.Join(modelsDir, model+".fp8.golden.json") }

// TestFP8PathMatchesFP8Golden checks the FP8 path against
// testdata/models/<model>.fp8.golden.json, written by an independent float64
// numpy forward that rounds where the GPU's FP8 path rounds
// (scripts/make_fp8_golden.py): per-token FP8 activations, BF16 KV cache,
// BF16 attention operands with the kernels' tile schedules, BF16 lm_head
// input. 6 transformers-golden prompts and 24 short ones.
//
// FP8 rounding is discontinuous: where an activation lies within float
// rounding (~1e-7) of a rounding boundary, the two implementations pick
// neighbouring codes, the ~6% code step propagates, and the case ends up at
// FP8-noise level (1e-4 to 9e-3 here). Every other case agrees to ~1e-7 (24
// of 30 on tiny-f32, 19 of 30 on tiny-bf16g at the time of writing). Which
// cases flip depends on float32 summation order, so golden.FP8GoldenTolerances
// asks half of the cases to agree to 1e-5 and the rest to stay within 2e-2.
func TestFP8PathMatchesFP8Golden(t *testing.T) {
	for _, m := range tinyModels {
		t.Run(m, func(t *testing.T) {
			f, err := golden.Load(fp8Golden(m))
			if err != nil {
				t.Fatal(err)
			}
			tol, err := golden.TolerancesFor(f, true)
			if err != nil {
				t.Fatal(err)
			}
			if tol != golden.FP8GoldenTolerances {
				t.Fatalf("tolerances for an FP8 golden: %+v", tol)
			}
			rep := compareGolden(t, m, fp8Golden(m), cpu.Options{FP8Activations: true}, tol)
			t.Logf("%d of %d cases agree to %.0e", rep.Agreeing, len(rep.Cases), tol.AgreeRelL2)
			if err := rep.Err(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Each FP8 bug below moves the logits by less than the FP8 rounding noise:
// it passes the float32 transformers golden with golden.FP8Tolerances, which
// is all an FP8 path could be checked against before, and fails the FP8
// golden, whose agreement criterion no case of it meets.
func TestFP8VariantsFailFP8Golden(t *testing.T) {
	if raceEnabled {
		// Arithmetic, not concurrency: 1-2 minutes under the race detector
		// for nothing it could find. The plain pass of make test runs it.
		t.Skip("runs in the plain (non -race) pass")
	}
	variants := []struct {
		name string
		v    cpu.Variant
	}{
		{"scale-headroom", cpu.Variant{FP8ScaleHeadroom: true}},
		{"float32-kv-cache", cpu.Variant{FP8FloatKV: true}},
		{"exact-softmax", cpu.Variant{FP8ExactSoftmax: true}},
	}
	for _, m := range tinyModels {
		for _, vv := range variants {
			t.Run(m+"/"+vv.name, func(t *testing.T) {
				o := cpu.Options{FP8Activations: true, Variant: vv.v}
				loose := compareGolden(t, m, hfGolden(m), o, golden.FP8Tolerances)
				if err := loose.Err(); err != nil {
					t.Fatalf("variant %s should stay within the FP8 noise of the float32 golden: %v", vv.name, err)
				}
				rep := compareGolden(t, m, fp8Golden(m), o, golden.FP8GoldenTolerances)
				err := rep.Err()
				if err == nil {
					t.Fatalf("variant %s passed the FP8 golden (%d of %d cases agree)", vv.name, rep.Agreeing, len(rep.Cases))
				}
				// The prompt logits of a one-token prompt do not depend on the
				// softmax (one key: the output is V), so those 7 cases may
				// still agree under exact-softmax; every other case moves.
				if rep.Agreeing > onePromptTokenCases(t, m) {
					t.Errorf("variant %s: %d cases still agree to %.0e", vv.name, rep.Agreeing, golden.FP8GoldenTolerances.AgreeRelL2)
				}
				t.Logf("variant %s: %d of %d cases agree: %v", vv.name, rep.Agreeing, len(rep.Cases), err)
			})
		}
	}
}

// The FP8 path passes the float32 transformers goldens with issue 3's FP8
// criterion (golden.FP8Tolerances: relative L2 <= 3e-2, greedy tokens equal
// wherever the reference margin is above 5e-2). The tiny models are
// conditioned like trained ones (docs/golden.md): FP8 activation noise costs
// about 1% of the logits, every case stays within half the tolerance, and no
// routing decision or counted greedy step is near a tie under that noise.
// An error below 1e-3 would mean the FP8 switch did nothing.
func TestFP8PathPassesFloat32Goldens(t *testing.T) {
	for _, m := range tinyModels {
		t.Run(m, func(t *testing.T) {
			rep := compareGolden(t, m, hfGolden(m), cpu.Options{FP8Activations: true}, golden.FP8Tolerances)
			if err := rep.Err(); err != nil {
				t.Fatal(err)
			}
			headroom := golden.FP8Tolerances.MaxRelL2 / 2
			for _, c := range rep.Cases {
				if !(c.RelL2 > 1e-3) {
					t.Errorf("case %d: relative L2 %.3g vs float32 is below 1e-3: FP8 quantization not applied", c.Case, c.RelL2)
				}
				if c.RelL2 > headroom {
					t.Errorf("case %d: relative L2 %.3g passes but exceeds %.3g, half the FP8 tolerance the tiny models are made to leave", c.Case, c.RelL2, headroom)
				}
				if c.GreedyMismatches != 0 || !c.Top1Match {
					t.Errorf("case %d: %d greedy mismatches, top-1 match %v", c.Case, c.GreedyMismatches, c.Top1Match)
				}
			}
		})
	}
}

// variantName is how the logs name a backend configuration.
func variantName(o cpu.Options) string {
	name := "exact"
	if o.FP8Activations {
		name = "fp8"
	}
	if !o.Variant.IsZero() {
		name += fmt.Sprintf(" %+v", o.Variant)
	}
	return name
}

// onePromptTokenCases counts the cases of the model's FP8 golden whose prompt
// is a single token.
func onePromptTokenCases(t *testing.T, model string) int {
	t.Helper()
	f, err := golden.Load(fp8Golden(model))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range f.Cases {
		if len(c.PromptTokenIDs) == 1 {
			n++
		}
	}
	return n
}
