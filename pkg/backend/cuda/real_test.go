//go:build gpu

package cuda

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/glmctl/glmctl/internal/ckptedit"
	"github.com/glmctl/glmctl/pkg/backend/cpu"
	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/golden"
	"github.com/glmctl/glmctl/pkg/sample"
)

// TestRealRuntime loads a real libglmcuda.so (from $GLMCTL_CUDA_LIB or the
// `glmctl build` cache). It is built only with -tags gpu: `make gpu-tests`
// compiles it into bin/cuda.test, which scripts/gpu-check.sh runs on the GPU
// machine (there is no Go there). Without a GPU the
// runtime must report that clearly; with one, both tiny checkpoints must
// match their golden files within the FP8-activation tolerances, and seeded
// sampling must not depend on what else shares the batch.
func TestRealRuntime(t *testing.T) {
	lib, err := LibraryPath(Options{})
	if err != nil {
		t.Fatal(err)
	}
	n, err := DeviceCount(lib)
	if err != nil || n == 0 {
		if err == nil || !strings.Contains(err.Error(), "glmrt_device_count") || strings.Contains(err.Error(), "no message") {
			t.Fatalf("no device: DeviceCount = %d, %v; want a clear glmrt_device_count error", n, err)
		}
		t.Logf("no CUDA device, as the runtime says: %v", err)
		return
	}
	for _, m := range []string{"tiny-f32", "tiny-bf16g"} {
		t.Run(m, func(t *testing.T) {
			dir := "../../../testdata/models/" + m
			b, err := Open(dir, Options{LibPath: lib, KVBlockSize: 16, NumKVBlocks: 256, MemoryBudget: 2 << 30})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			t.Logf("runtime: %+v", b.RuntimeInfo())
			g := goldenPasses(t, b, dir, m, "")
			chunkedPrefillMatches(t, b, g.Cases[len(g.Cases)-1].PromptTokenIDs)
			mixedStepMatches(t, b, g.Cases[len(g.Cases)-1].PromptTokenIDs)
			matchesCPU(t, b, dir, g)
			seededSampling(t, b, false)
			// At validation precision every row is computed alike at any
			// batch size, so a seeded sample must not depend on the batch.
			exact, err := Open(dir, Options{LibPath: lib, KVBlockSize: 16, NumKVBlocks: 256, MemoryBudget: 2 << 30, Exact: true})
			if err != nil {
				t.Fatal(err)
			}
			defer exact.Close()
			seededSampling(t, exact, true)
		})
	}
	t.Run("FP8 KV cache", func(t *testing.T) { fp8KVCache(t, lib) })
	t.Run("NaN token fails only its sequence", func(t *testing.T) { nanTokenFailsOnlyItsSequence(t, lib) })
	t.Run("token masks", func(t *testing.T) { tokenMasks(t, lib) })
}

// tokenMasks: on the GPU a sequence with a token mask draws only allowed
// tokens, greedy or sampled, next to unconstrained ones; greedy takes the best
// allowed raw logit (the logits come back unmasked) and the CPU sampler
// (pkg/sample) picks the same token from them; a mask that allows
// no token fails that sequence alone with ErrNoAllowedToken.
func tokenMasks(t *testing.T, lib string) {
	b, err := Open(filepath.Join("../../../testdata/models", "tiny-f32"), Options{LibPath: lib, KVBlockSize: 16, NumKVBlocks: 64, MemoryBudget: 2 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	vocab := b.Info().VocabSize
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := range 20 {
		mask := make([]uint32, engine.MaskWords(vocab))
		var allowed []int32
		for range 1 + rng.IntN(40) {
			id := int32(rng.IntN(1000))
			mask[id/32] |= 1 << (id % 32)
			allowed = append(allowed, id)
		}
		p := engine.SamplingParams{Temperature: 0, TopP: 1, RepetitionPenalty: 1, Seed: int64(trial), HasSeed: true}
		if trial%2 == 1 {
			p.Temperature, p.TopK, p.TopP = 1.3, 5, 0.9
		}
		prompt := []int32{int32(5 + trial), 17, 300, 42}
		seqs := []engine.StepSeq{
			{SeqID: 1, Tokens: prompt, BlockTable: []int32{0}, Sample: true, Sampling: p, AllowedTokens: mask, WantLogits: true},
			{SeqID: 2, Tokens: prompt, BlockTable: []int32{1}, Sample: true, Sampling: p},
		}
		res, err := b.Step(context.Background(), &engine.StepBatch{Seqs: seqs})
		if err != nil || res[0].Err != nil || res[1].Err != nil {
			t.Fatalf("trial %d: %v %+v", trial, err, res)
		}
		if !engine.Allowed(mask, res[0].Token) {
			t.Fatalf("trial %d: the masked sequence drew %d, outside %v", trial, res[0].Token, allowed)
		}
		cpu, err := sample.Sample(res[0].Logits, p, sample.History{PromptTokens: prompt, Allowed: mask})
		if err != nil {
			t.Fatal(err)
		}
		if cpu.Token != res[0].Token {
			t.Errorf("trial %d (T=%v): GPU drew %d, the CPU sampler on the same logits and mask %d", trial, p.Temperature, res[0].Token, cpu.Token)
		}
	}
	// Late masks: the mask is empty when the step starts and filled in
	// AwaitMasks, which the backend calls after launching the forward; the
	// draw must follow the filled mask (glmrt_step_finish sends it).
	for trial := range 6 {
		mask := make([]uint32, engine.MaskWords(vocab))
		id := int32(100 + 37*trial)
		p := engine.SamplingParams{Temperature: float32(trial % 2), TopP: 1, RepetitionPenalty: 1, Seed: int64(trial), HasSeed: true}
		awaited := false
		res, err := b.Step(context.Background(), &engine.StepBatch{
			Seqs: []engine.StepSeq{{SeqID: 1, Tokens: []int32{5, 17, 300}, BlockTable: []int32{0}, Sample: true, Sampling: p, AllowedTokens: mask}},
			AwaitMasks: func() {
				awaited = true
				mask[id/32] |= 1 << (id % 32)
			},
		})
		if err != nil || res[0].Err != nil || !awaited || res[0].Token != id {
			t.Fatalf("late mask trial %d: err %v, awaited %v, result %+v; want token %d", trial, err, awaited, res, id)
		}
	}
	// The two-call ABI refuses calls out of order, and steps on afterwards.
	var finishErr, beginErr error
	b.thread.run(func() { finishErr = b.eng.stepFinish(nil, b.bufs.result) })
	if finishErr == nil || !strings.Contains(finishErr.Error(), "no step was begun") {
		t.Fatalf("finish without begin: %v", finishErr)
	}
	b.thread.run(func() {
		if beginErr = b.bufs.fill(&engine.StepBatch{Seqs: []engine.StepSeq{{SeqID: 1, Tokens: []int32{5}, BlockTable: []int32{0}, Sample: true}}}, b.lim); beginErr != nil {
			return
		}
		if beginErr = b.eng.stepBegin(b.bufs.batch); beginErr != nil {
			return
		}
		beginErr = b.eng.stepBegin(b.bufs.batch)
		if err := b.eng.stepFinish(nil, b.bufs.result); err != nil {
			beginErr = fmt.Errorf("finish after a refused second begin: %w", err)
		}
	})
	if beginErr == nil || !strings.Contains(beginErr.Error(), "not finished") {
		t.Fatalf("begin twice: %v", beginErr)
	}
	mask := make([]uint32, engine.MaskWords(vocab)) // allows nothing
	res, err := b.Step(context.Background(), &engine.StepBatch{Seqs: []engine.StepSeq{
		{SeqID: 1, Tokens: []int32{5}, BlockTable: []int32{0}, Sample: true, AllowedTokens: mask},
		{SeqID: 2, Tokens: []int32{6}, BlockTable: []int32{1}, Sample: true},
	}})
	if err != nil || !errors.Is(res[0].Err, engine.ErrNoAllowedToken) || res[1].Err != nil {
		t.Fatalf("empty mask: %v, %+v", err, res)
	}
}

// nanTokenFailsOnlyItsSequence: a NaN in one token's embedding row makes the
// logits of a sequence holding that token NaN. On the GPU that sequence alone
// ends with an error wrapping engine.ErrNonFiniteLogits (the runtime reports it
// through glmrt_result.sample_status); a clean sequence in the same step gets
// its token (at validation precision the same token as alone), nothing reads
// out of bounds (the router never selects a NaN score), and the next step runs.
func nanTokenFailsOnlyItsSequence(t *testing.T, lib string) {
	dir := t.TempDir()
	if err := ckptedit.Copy(dir, filepath.Join("../../../testdata/models", "tiny-f32")); err != nil {
		t.Fatal(err)
	}
	const bad = 7
	const hidden = 256 // tiny-f32 hidden_size: row `bad` of embed_tokens
	elems := make([]int, hidden)
	for i := range elems {
		elems[i] = bad*hidden + i
	}
	if err := ckptedit.Set(dir, "model.embed_tokens.weight", elems, float32(math.NaN())); err != nil {
		t.Fatal(err)
	}
	for _, exact := range []bool{false, true} {
		b, err := Open(dir, Options{LibPath: lib, KVBlockSize: 16, NumKVBlocks: 64, MemoryBudget: 2 << 30, Exact: exact})
		if err != nil {
			t.Fatal(err)
		}
		good := engine.StepSeq{SeqID: 1, Tokens: []int32{1, 2, 3}, BlockTable: []int32{0}, Sample: true}
		poisoned := engine.StepSeq{SeqID: 2, Tokens: []int32{1, bad, 3}, BlockTable: []int32{1}, Sample: true}
		alone, err := b.Step(context.Background(), &engine.StepBatch{Seqs: []engine.StepSeq{good}})
		if err != nil || alone[0].Err != nil {
			t.Fatalf("exact=%v: clean sequence alone: %v, %v", exact, err, alone)
		}
		both, err := b.Step(context.Background(), &engine.StepBatch{Seqs: []engine.StepSeq{good, poisoned}})
		if err != nil {
			t.Fatalf("exact=%v: the step failed as a whole: %v", exact, err)
		}
		if both[0].Err != nil || both[0].Token < 0 || int(both[0].Token) >= b.Info().VocabSize ||
			(exact && both[0].Token != alone[0].Token) {
			t.Errorf("exact=%v: clean sequence: token %d err %v, alone %d", exact, both[0].Token, both[0].Err, alone[0].Token)
		}
		if !errors.Is(both[1].Err, engine.ErrNonFiniteLogits) {
			t.Errorf("exact=%v: poisoned sequence: token %d err %v, want ErrNonFiniteLogits", exact, both[1].Token, both[1].Err)
		} else {
			t.Logf("exact=%v: poisoned sequence: %v", exact, both[1].Err)
		}
		if res, err := b.Step(context.Background(), &engine.StepBatch{Seqs: []engine.StepSeq{good}}); err != nil || res[0].Err != nil {
			t.Errorf("exact=%v: next step: %v, %v", exact, err, res)
		}
		b.Close()
	}
}

// seededSampling checks that a seeded sample is reproducible: the same batch
// twice gives the same tokens. With batchInvariant it must also not depend
// on what else shares the batch; that holds at validation precision. On the
// real FP8 path the cuBLASLt / streaming-kernel choice and the per-token FP8
// rounding depend on the batch, so a sample near a CDF boundary may differ
// with other company (as in vLLM without its batch-invariant mode).
func seededSampling(t *testing.T, b *Backend, batchInvariant bool) {
	t.Helper()
	params := engine.SamplingParams{Temperature: 0.9, TopP: 0.95, RepetitionPenalty: 1.1, Seed: 1234, HasSeed: true, TopLogprobs: 3}
	seq := func(id uint64, blocks []int32) engine.StepSeq {
		return engine.StepSeq{SeqID: id, Tokens: []int32{5, 17, 300, 41, 9}, BlockTable: blocks, Sample: true, Sampling: params,
			SampleIndex: 2, PromptTokens: []int32{5, 17, 300, 41, 9}, OutputTokens: []int32{7, 7}}
	}
	other := seq(2, []int32{1})
	other.Tokens = []int32{99, 98, 97, 96, 95, 94, 93}
	other.Sampling.Seed = 99
	run := func(batch ...engine.StepSeq) []engine.SeqResult {
		res, err := b.Step(context.Background(), &engine.StepBatch{Seqs: batch})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	alone, alone2 := run(seq(1, []int32{0})), run(seq(1, []int32{0}))
	shared, shared2 := run(other, seq(3, []int32{2})), run(other, seq(3, []int32{2}))
	if alone[0].Token != alone2[0].Token || shared[0].Token != shared2[0].Token || shared[1].Token != shared2[1].Token {
		t.Errorf("seeded sampling not reproducible: alone %d then %d; batched %d,%d then %d,%d",
			alone[0].Token, alone2[0].Token, shared[0].Token, shared[1].Token, shared2[0].Token, shared2[1].Token)
	}
	if batchInvariant && alone[0].Token != shared[1].Token {
		t.Errorf("seeded sample %d alone, %d when batched with another sequence", alone[0].Token, shared[1].Token)
	}
	if len(alone[0].TopLogprobs) != 3 || alone[0].Logprob > 0 {
		t.Errorf("logprobs: %v, %v", alone[0].Logprob, alone[0].TopLogprobs)
	}
}

func relL2(got, ref []float32) float64 {
	var num, den float64
	for i := range ref {
		d := float64(got[i]) - float64(ref[i])
		num += d * d
		den += float64(ref[i]) * float64(ref[i])
	}
	return math.Sqrt(num / den)
}

func lastLogits(t *testing.T, b engine.Backend, toks []int32, start int, blocks []int32) []float32 {
	t.Helper()
	res, err := b.Step(context.Background(), &engine.StepBatch{Seqs: []engine.StepSeq{{
		SeqID: 1, Tokens: toks, StartPos: start, BlockTable: blocks, WantLogits: true,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	return res[0].Logits
}

func blockRange(first, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(first + 2*i) // not the identity, not contiguous
	}
	return out
}

// chunkedPrefillMatches checks the KV/block-table plumbing: a prompt in one
// step and the same prompt in chunks (through the KV cache) give the same
// last logits. The CUDA runtime keeps KV in bf16, where a one-step prefill
// may not round through it, and FP8 activation rounding can flip on that, so
// the two agree to ~3e-3 rather than exactly (H200, the conditioned tiny
// models); a negative control (the last chunk reading unwritten KV blocks for
// its context) lands at ~0.1, well above the bound. The CPU backend gives 0.
func chunkedPrefillMatches(t *testing.T, b engine.Backend, prompt []int32) {
	t.Helper()
	const bound = 0.02
	bs := b.Info().KVBlockSize
	blocks := blockRange(10, (len(prompt)+bs-1)/bs)
	whole := lastLogits(t, b, prompt, 0, blocks)
	var chunked []float32
	last := 0
	for start := 0; start < len(prompt); start += 7 {
		end := min(start+7, len(prompt))
		chunked = lastLogits(t, b, prompt[start:end], start, blocks)
		last = start
	}
	e := relL2(chunked, whole)
	t.Logf("chunked vs one-step prefill (%d tokens): rel L2 %.3g", len(prompt), e)
	if e > bound {
		t.Errorf("prompt of %d tokens: chunked prefill differs from one-step prefill by rel L2 %.3g > %g", len(prompt), e, bound)
	}
	if last < bs {
		t.Fatalf("prompt of %d tokens too short for the negative control", len(prompt))
	}
	// Every block before the last chunk's own replaced by one nothing wrote
	// (blockRange uses even ids from 10 up; golden.Compare the top of the pool).
	wrong := append([]int32{}, blocks...)
	for i := 0; i < last/bs; i++ {
		wrong[i] = int32(11 + 2*i)
	}
	bad := lastLogits(t, b, prompt[last:], last, wrong)
	eBad := relL2(bad, whole)
	t.Logf("negative control (context blocks never written): rel L2 %.3g vs one-step, %.3g vs chunked", eBad, relL2(bad, chunked))
	if eBad < 2*bound {
		t.Errorf("wrong KV blocks moved the logits by only rel L2 %.3g: this check cannot tell plumbing errors from rounding", eBad)
	}
}

// mixedStepMatches checks a step that mixes a decode sequence (first) with a
// prefill (second), as continuous batching does: the prefill's logits must
// match the same prefill run alone. The attention planners number the prefill
// sequences among themselves while block tables are by batch index; a mix-up
// makes the prefill read the decode sequence's blocks (rel L2 ~0.1 and more).
func mixedStepMatches(t *testing.T, b engine.Backend, prompt []int32) {
	t.Helper()
	const bound = 0.02
	bs := b.Info().KVBlockSize
	solo := lastLogits(t, b, prompt, 0, blockRange(10, (len(prompt)+bs-1)/bs))
	// The decode sequence: a short prompt of its own, then one more token.
	other := prompt[:len(prompt)/2]
	otherBlocks := blockRange(120, (len(other)+1+bs-1)/bs)
	lastLogits(t, b, other, 0, otherBlocks)
	res, err := b.Step(context.Background(), &engine.StepBatch{Seqs: []engine.StepSeq{
		{SeqID: 7, Tokens: []int32{prompt[0]}, StartPos: len(other), BlockTable: otherBlocks, WantLogits: true},
		{SeqID: 8, Tokens: prompt, StartPos: 0, BlockTable: blockRange(161, (len(prompt)+bs-1)/bs), WantLogits: true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	e := relL2(res[1].Logits, solo)
	t.Logf("prefill after a decode sequence in one step vs alone (%d tokens): rel L2 %.3g", len(prompt), e)
	if e > bound {
		t.Errorf("prefill of %d tokens sharing a step with a decode sequence differs from alone by rel L2 %.3g > %g", len(prompt), e, bound)
	}
}

// matchesCPU compares the last-position logits with the CPU backend with FP8
// activations (the executable specification) on every golden prompt.
func matchesCPU(t *testing.T, b *Backend, dir string, g *golden.File) {
	t.Helper()
	c, err := cpu.Open(dir, cpu.Options{FP8Activations: true, KVBlockSize: 16, NumKVBlocks: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i, cs := range g.Cases {
		p := cs.PromptTokenIDs
		n := (len(p) + 15) / 16
		got := lastLogits(t, b, p, 0, blockRange(1, n))
		want := lastLogits(t, c, p, 0, blockRange(1, n))
		t.Logf("case %d (%d tokens): cuda vs cpu-fp8 rel L2 %.3g, cpu-fp8 vs golden %.3g", i, len(p), relL2(got, want), relL2(want, cs.LastLogits))
	}
}

// fp8KVCache: the FP8 (e4m3, scaled) KV cache's accuracy check. On both tiny
// checkpoints it must pass the golden files at the FP8-activation
// tolerances, its chunked prefill and mixed steps must agree with whole
// prefill (both read the same FP8 cache), and the last logits of the longest
// golden prompt must stay within 2% (relative L2) of the BF16 cache's; a
// block size other than 16 and the validation precision are refused by name.
func fp8KVCache(t *testing.T, lib string) {
	for _, m := range []string{"tiny-f32", "tiny-bf16g"} {
		t.Run(m, func(t *testing.T) {
			dir := "../../../testdata/models/" + m
			o := Options{LibPath: lib, KVBlockSize: 16, NumKVBlocks: 256, MemoryBudget: 2 << 30}
			ref, err := Open(dir, o)
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			o.KVFP8 = true
			b, err := Open(dir, o)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			g := goldenPasses(t, b, dir, m, "FP8 KV ")
			prompt := g.Cases[len(g.Cases)-1].PromptTokenIDs
			chunkedPrefillMatches(t, b, prompt)
			mixedStepMatches(t, b, prompt)
			blocks := blockRange(10, (len(prompt)+15)/16)
			d := relL2(lastLogits(t, b, prompt, 0, blocks), lastLogits(t, ref, prompt, 0, blocks))
			t.Logf("FP8 KV against BF16 KV, %d-token prompt: last logits rel L2 %.2e", len(prompt), d)
			if d > 0.02 {
				t.Errorf("FP8 KV cache: last logits rel L2 %.3g from the BF16 cache's, want <= 0.02", d)
			}
		})
	}
	dir := "../../../testdata/models/tiny-f32"
	for _, c := range []struct {
		name string
		o    Options
		want string
	}{
		{"block size 32", Options{LibPath: lib, KVBlockSize: 32, NumKVBlocks: 64, MemoryBudget: 2 << 30, KVFP8: true}, "kv_block_size 16"},
		{"exact", Options{LibPath: lib, KVBlockSize: 16, NumKVBlocks: 64, MemoryBudget: 2 << 30, KVFP8: true, Exact: true}, "KVFP8"},
	} {
		b, err := Open(dir, c.o)
		if err == nil {
			b.Close()
			t.Errorf("%s: FP8 KV cache opened, want an error naming %q", c.name, c.want)
		} else if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q does not name %q", c.name, err, c.want)
		}
	}
}

// goldenPasses loads the checkpoint's golden file, compares backend b with
// it at the FP8-activation tolerances, logs each case (prefixed by label)
// and fails the test when a case fails; it returns the golden file.
func goldenPasses(t *testing.T, b engine.Backend, dir, model, label string) *golden.File {
	t.Helper()
	g, err := golden.Load(dir + ".golden.json")
	if err != nil {
		t.Fatal(err)
	}
	rep, err := golden.Compare(context.Background(), b, g, golden.Options{Tolerances: golden.FP8Tolerances, ModelName: model})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Cases {
		t.Logf("%scase %d: %d prompt tokens, rel L2 %.2e, top1 %v, greedy %d/%d mismatches (%d tolerated)",
			label, c.Case, c.PromptLen, c.RelL2, c.Top1Match, c.GreedyMismatches, c.GreedySteps, c.GreedyTolerated)
	}
	if err := rep.Err(); err != nil {
		t.Error(err)
	}
	return g
}
