//go:build gpu

package cuda

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/glmctl/glmctl/pkg/backend/cpu"
	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/golden"
	"github.com/glmctl/glmctl/pkg/synth"
)

// TestSyntheticRuntime checks glmrt_synthesize on the GPU (built only with
// -tags gpu, like TestRealRuntime): the weights it generates for 2 layers of
// rank 0/8 must be exactly the ones pkg/synth writes to a checkpoint, so an
// engine synthesized on the GPU and one loaded from that checkpoint give
// bitwise identical logits at every greedy step, on the production FP8 path
// and at validation precision (which also covers the FP32 lm_head). Then
// the CUDA backend on that checkpoint is compared with the CPU backend:
// validation precision vs the exact CPU path within golden.ExactTolerances,
// the FP8 path vs the CPU's FP8 activations within golden.FP8Tolerances.
func TestSyntheticRuntime(t *testing.T) {
	lib, err := LibraryPath(Options{})
	if err != nil {
		t.Fatal(err)
	}
	n, err := DeviceCount(lib)
	if err != nil || n == 0 {
		if err == nil || !strings.Contains(err.Error(), "glmrt_device_count") {
			t.Fatalf("no device: DeviceCount = %d, %v; want a clear glmrt_device_count error", n, err)
		}
		t.Logf("no CUDA device, as the runtime says: %v", err)
		return
	}
	ctx := context.Background()
	spec := synth.Spec{Base: "glm-4.7", Rank: 0, Ranks: 8, Layers: 2, DenseLayers: 1, Seed: 1}
	dir := t.TempDir()
	start := time.Now()
	res, err := synth.Write(ctx, dir, spec, synth.WriteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: checkpoint of %.2f GB written in %.1f s", spec, float64(res.Bytes)/1e9, time.Since(start).Seconds())
	prompt := []int32{11, 7, 4000, 123, 18000, 5, 900, 18943, 0}
	const steps = 6

	for _, exact := range []bool{false, true} {
		o := Options{LibPath: lib, KVBlockSize: 16, NumKVBlocks: 64, MemoryBudget: 4 << 30, Exact: exact}
		start := time.Now()
		syn, err := OpenSynthetic(ctx, spec, o)
		if err != nil {
			t.Fatal(err)
		}
		tSyn := time.Since(start)
		start = time.Now()
		ck, err := Open(dir, o)
		if err != nil {
			syn.Close()
			t.Fatal(err)
		}
		t.Logf("exact=%v: synthesized in %.2f s, loaded from the checkpoint in %.2f s; runtime %+v", exact, tSyn.Seconds(), time.Since(start).Seconds(), syn.RuntimeInfo())
		if syn.RuntimeInfo().WeightBytes != ck.RuntimeInfo().WeightBytes {
			t.Errorf("exact=%v: weight bytes %d synthesized, %d loaded", exact, syn.RuntimeInfo().WeightBytes, ck.RuntimeInfo().WeightBytes)
		}
		toksS, logitsS := greedyRun(t, syn, prompt, steps)
		toksC, logitsC := greedyRun(t, ck, prompt, steps)
		syn.Close()
		ck.Close()
		t.Logf("exact=%v: greedy tokens synthesized %v, checkpoint %v", exact, toksS, toksC)
		for s := range logitsS {
			if toksS[s] != toksC[s] {
				t.Errorf("exact=%v step %d: token %d synthesized, %d from the checkpoint", exact, s, toksS[s], toksC[s])
			}
			if i := firstBitDiff(logitsS[s], logitsC[s]); i >= 0 {
				t.Errorf("exact=%v step %d: logits differ first at id %d: %v synthesized, %v from the checkpoint (rel L2 %.3g)",
					exact, s, i, logitsS[s][i], logitsC[s][i], relL2(logitsS[s], logitsC[s]))
				break
			}
		}
		// The conditioning: finite logits with a trained-model-like spread.
		for s, l := range logitsS {
			if std := stddev(l); !(std > 0.5 && std < 20) {
				t.Errorf("exact=%v step %d: logits std %v", exact, s, std)
			}
		}
	}

	// CUDA vs the CPU backend on the checkpoint.
	prompts := [][]int32{prompt, {1, 2, 3}, {18000, 17, 9, 4242, 100, 6000, 31, 2, 2, 2, 77, 1200, 5000, 9, 10, 11, 12, 13}}
	for _, c := range []struct {
		exact bool
		tol   float64
	}{{true, golden.ExactTolerances.MaxRelL2}, {false, golden.FP8Tolerances.MaxRelL2}} {
		g, err := Open(dir, Options{LibPath: lib, KVBlockSize: 16, NumKVBlocks: 64, MemoryBudget: 4 << 30, Exact: c.exact})
		if err != nil {
			t.Fatal(err)
		}
		h, err := cpu.Open(dir, cpu.Options{FP8Activations: !c.exact, KVBlockSize: 16, NumKVBlocks: 16})
		if err != nil {
			g.Close()
			t.Fatal(err)
		}
		for i, p := range prompts {
			nb := (len(p) + 15) / 16
			got := lastLogits(t, g, p, 0, blockRange(1, nb))
			want := lastLogits(t, h, p, 0, blockRange(1, nb))
			e := relL2(got, want)
			t.Logf("exact=%v prompt %d (%d tokens): cuda vs cpu rel L2 %.3g (bound %g), argmax %d vs %d", c.exact, i, len(p), e, c.tol, argmax(got), argmax(want))
			if !(e <= c.tol) {
				t.Errorf("exact=%v prompt %d: cuda vs cpu rel L2 %.3g > %g", c.exact, i, e, c.tol)
			}
		}
		g.Close()
		h.Close()
	}
}

// greedyRun prefills prompt and decodes steps tokens greedily, returning the
// token and the logits of every step.
func greedyRun(t *testing.T, b engine.Backend, prompt []int32, steps int) ([]int32, [][]float32) {
	t.Helper()
	blocks := blockRange(1, 4) // 64 positions
	var toks []int32
	var logits [][]float32
	cur, pos := prompt, 0
	for s := 0; s <= steps; s++ {
		res, err := b.Step(context.Background(), &engine.StepBatch{Seqs: []engine.StepSeq{{
			SeqID: 1, Tokens: cur, StartPos: pos, BlockTable: blocks, Sample: true, WantLogits: true, SampleIndex: s,
		}}})
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, res[0].Token)
		logits = append(logits, res[0].Logits)
		pos += len(cur)
		cur = []int32{res[0].Token}
	}
	return toks, logits
}

func firstBitDiff(a, b []float32) int {
	if len(a) != len(b) {
		return 0
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

func stddev(x []float32) float64 {
	var s, ss float64
	for _, v := range x {
		s += float64(v)
		ss += float64(v) * float64(v)
	}
	m := s / float64(len(x))
	return math.Sqrt(ss/float64(len(x)) - m*m)
}

func argmax(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}
