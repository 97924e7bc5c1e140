package cpu_test

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/glmctl/glmctl/pkg/backend/cpu"
	"github.com/glmctl/glmctl/pkg/engine"
)

func openTiny(t *testing.T, name string, o cpu.Options) *cpu.Backend {
	t.Helper()
	if o.NumKVBlocks == 0 {
		o.NumKVBlocks = 64
	}
	be, err := cpu.Open(filepath.Join(modelsDir, name), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return be
}

// prompt returns n deterministic ordinary token ids.
func prompt(n, seed int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((seed*131 + i*37 + i*i*7) % 1000)
	}
	return p
}

func blocks(ids ...int32) []int32 { return ids }

func step(t *testing.T, be *cpu.Backend, seqs ...engine.StepSeq) []engine.SeqResult {
	t.Helper()
	out, err := be.Step(context.Background(), &engine.StepBatch{Seqs: seqs})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(seqs) {
		t.Fatalf("%d results for %d sequences", len(out), len(seqs))
	}
	for i := range out {
		if out[i].SeqID != seqs[i].SeqID {
			t.Fatalf("result %d has seq id %d, want %d", i, out[i].SeqID, seqs[i].SeqID)
		}
	}
	return out
}

func sameLogits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) == 0 || len(got) != len(want) {
		t.Fatalf("%s: %d logits vs %d", what, len(got), len(want))
	}
	for i := range want {
		// The per-row arithmetic does not depend on what else is in the
		// batch or on how the prompt was chunked, so results are identical.
		if got[i] != want[i] {
			t.Fatalf("%s: logit %d = %v, want %v (bit-identical)", what, i, got[i], want[i])
		}
	}
}

func TestMixedBatchEqualsAlone(t *testing.T) {
	for _, fp8 := range []bool{false, true} {
		be := openTiny(t, "tiny-bf16g", cpu.Options{FP8Activations: fp8})
		a, bp := prompt(19, 1), prompt(6, 2)
		// Alone: A prefill, then A decodes one token; B prefill.
		aloneA := step(t, be, engine.StepSeq{SeqID: 1, Tokens: a, BlockTable: blocks(5, 9), WantLogits: true})[0].Logits
		aloneA2 := step(t, be, engine.StepSeq{SeqID: 1, Tokens: []int32{42}, StartPos: 19, BlockTable: blocks(5, 9), WantLogits: true})[0].Logits
		aloneB := step(t, be, engine.StepSeq{SeqID: 2, Tokens: bp, BlockTable: blocks(3), WantLogits: true})[0].Logits

		// Together: A's prefill and B's prefill in one step (other blocks).
		out := step(t, be,
			engine.StepSeq{SeqID: 1, Tokens: a, BlockTable: blocks(11, 12), WantLogits: true},
			engine.StepSeq{SeqID: 2, Tokens: bp, BlockTable: blocks(13), WantLogits: true},
		)
		sameLogits(t, "A prefill in a mixed batch", out[0].Logits, aloneA)
		sameLogits(t, "B prefill in a mixed batch", out[1].Logits, aloneB)

		// A decode token next to a fresh prefill of B and a non-final chunk
		// of a third sequence (no sample, no logits).
		out = step(t, be,
			engine.StepSeq{SeqID: 3, Tokens: prompt(7, 3), BlockTable: blocks(20)},
			engine.StepSeq{SeqID: 1, Tokens: []int32{42}, StartPos: 19, BlockTable: blocks(11, 12), WantLogits: true},
			engine.StepSeq{SeqID: 2, Tokens: bp, BlockTable: blocks(14), WantLogits: true},
		)
		if out[0].Logits != nil || out[0].Token != 0 {
			t.Errorf("non-final chunk returned %+v, want a zero result", out[0])
		}
		sameLogits(t, "A decode in a mixed batch", out[1].Logits, aloneA2)
		sameLogits(t, "B prefill next to a decode", out[2].Logits, aloneB)
	}
}

func TestChunkedPrefillEqualsOneShot(t *testing.T) {
	be := openTiny(t, "tiny-f32", cpu.Options{KVBlockSize: 8})
	p := prompt(45, 4)
	table := blocks(7, 2, 9, 4, 0, 6)
	whole := step(t, be, engine.StepSeq{SeqID: 1, Tokens: p, BlockTable: table, WantLogits: true})[0].Logits
	other := blocks(10, 11, 12, 13, 14, 15)
	// Chunks that do not line up with the 8-token blocks.
	var last []float32
	for _, c := range [][2]int{{0, 13}, {13, 30}, {30, 31}, {31, 45}} {
		r := step(t, be, engine.StepSeq{SeqID: 2, Tokens: p[c[0]:c[1]], StartPos: c[0], BlockTable: other, WantLogits: c[1] == 45})
		last = r[0].Logits
	}
	sameLogits(t, "chunked prefill", last, whole)
}

func TestDecodeThroughKVEqualsRecompute(t *testing.T) {
	be := openTiny(t, "tiny-bf16g", cpu.Options{})
	p := prompt(30, 5)
	table := blocks(1, 3, 5)
	step(t, be, engine.StepSeq{SeqID: 1, Tokens: p[:20], BlockTable: table})
	var got []float32
	for i := 20; i < 30; i++ {
		got = step(t, be, engine.StepSeq{SeqID: 1, Tokens: p[i : i+1], StartPos: i, BlockTable: table, WantLogits: true})[0].Logits
	}
	full := step(t, be, engine.StepSeq{SeqID: 2, Tokens: p, BlockTable: blocks(6, 7), WantLogits: true})[0].Logits
	sameLogits(t, "decode via KV cache", got, full)
}

func TestSampling(t *testing.T) {
	be := openTiny(t, "tiny-f32", cpu.Options{})
	p := prompt(9, 6)
	greedy := step(t, be, engine.StepSeq{SeqID: 1, Tokens: p, BlockTable: blocks(0), Sample: true, WantLogits: true,
		Sampling: engine.SamplingParams{TopP: 1, Logprobs: true}, PromptTokens: p})[0]
	best := slices.Index(greedy.Logits, slices.Max(greedy.Logits))
	if int(greedy.Token) != best {
		t.Errorf("greedy token %d, argmax %d", greedy.Token, best)
	}
	if greedy.Logprob >= 0 || math.IsNaN(float64(greedy.Logprob)) {
		t.Errorf("greedy logprob %v, want a negative number", greedy.Logprob)
	}
	// A seeded draw does not depend on what else is in the batch.
	seeded := engine.SamplingParams{Temperature: 1.3, TopP: 1, Seed: 99, HasSeed: true}
	alone := step(t, be, engine.StepSeq{SeqID: 1, Tokens: p, BlockTable: blocks(0), Sample: true, Sampling: seeded, SampleIndex: 3, PromptTokens: p})[0]
	mixed := step(t, be,
		engine.StepSeq{SeqID: 7, Tokens: prompt(12, 7), BlockTable: blocks(1), Sample: true, Sampling: seeded},
		engine.StepSeq{SeqID: 1, Tokens: p, BlockTable: blocks(2), Sample: true, Sampling: seeded, SampleIndex: 3, PromptTokens: p},
	)[1]
	if alone.Token != mixed.Token {
		t.Errorf("seeded token %d alone, %d in a batch", alone.Token, mixed.Token)
	}
	// Invalid sampling parameters are an error of that sequence, not a
	// panic (nor a failure of the whole step).
	res, err := be.Step(context.Background(), &engine.StepBatch{Seqs: []engine.StepSeq{{SeqID: 1, Tokens: p, BlockTable: blocks(0), Sample: true,
		Sampling: engine.SamplingParams{Temperature: -1}}}})
	if err != nil || len(res) != 1 || res[0].Err == nil || !strings.Contains(res[0].Err.Error(), "temperature") {
		t.Errorf("negative temperature: results %+v, err %v", res, err)
	}
}

func TestStepRejectsBadBatches(t *testing.T) {
	be := openTiny(t, "tiny-f32", cpu.Options{NumKVBlocks: 8, KVBlockSize: 16})
	ok := func() engine.StepSeq {
		return engine.StepSeq{SeqID: 5, Tokens: []int32{1, 2, 3}, BlockTable: blocks(0)}
	}
	tests := []struct {
		name  string
		batch *engine.StepBatch
		want  string
	}{
		{"nil batch", nil, "nil batch"},
		{"empty batch", &engine.StepBatch{}, "empty batch"},
		{"no tokens", &engine.StepBatch{Seqs: []engine.StepSeq{{SeqID: 5, BlockTable: blocks(0)}}}, "sequence 5 (batch index 0): no tokens"},
		{"token beyond vocab", &engine.StepBatch{Seqs: []engine.StepSeq{{SeqID: 5, Tokens: []int32{1, 1040}, BlockTable: blocks(0)}}}, "token 1040 at index 1 is outside the vocabulary [0, 1040)"},
		{"negative token", &engine.StepBatch{Seqs: []engine.StepSeq{{SeqID: 5, Tokens: []int32{-1}, BlockTable: blocks(0)}}}, "token -1"},
		{"negative start", &engine.StepBatch{Seqs: []engine.StepSeq{{SeqID: 5, Tokens: []int32{1}, StartPos: -2, BlockTable: blocks(0)}}}, "start position -2"},
		{"past max context", &engine.StepBatch{Seqs: []engine.StepSeq{{SeqID: 5, Tokens: []int32{1}, StartPos: 4096, BlockTable: blocks(0)}}}, "exceed the max context 4096"},
		{"short block table", &engine.StepBatch{Seqs: []engine.StepSeq{{SeqID: 5, Tokens: []int32{1}, StartPos: 16, BlockTable: blocks(0)}}}, "block table has 1 blocks, positions 0..16 need 2"},
		{"block out of pool", &engine.StepBatch{Seqs: []engine.StepSeq{{SeqID: 5, Tokens: []int32{1}, BlockTable: blocks(8)}}}, "block 8, outside the pool [0, 8)"},
		{"negative block", &engine.StepBatch{Seqs: []engine.StepSeq{{SeqID: 5, Tokens: []int32{1}, BlockTable: blocks(-1)}}}, "block -1"},
		{"two writers of one slot", &engine.StepBatch{Seqs: []engine.StepSeq{ok(), {SeqID: 6, Tokens: []int32{4}, StartPos: 2, BlockTable: blocks(0)}}}, "sequences 5 and 6 both write KV block 0 slot 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := be.Step(context.Background(), tt.batch)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want it to mention %q", err, tt.want)
			}
			if out != nil {
				t.Errorf("results %v with an error", out)
			}
		})
	}
	// The backend still works after rejecting bad batches.
	step(t, be, ok())
}

func TestStepCancelledAndClosed(t *testing.T) {
	be := openTiny(t, "tiny-f32", cpu.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := be.Step(ctx, &engine.StepBatch{Seqs: []engine.StepSeq{{Tokens: []int32{1}, BlockTable: blocks(0)}}})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: err %v", err)
	}
	if err := be.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = be.Step(context.Background(), &engine.StepBatch{Seqs: []engine.StepSeq{{Tokens: []int32{1}, BlockTable: blocks(0)}}})
	if !errors.Is(err, cpu.ErrClosed) {
		t.Errorf("after Close: err %v", err)
	}
	if err := be.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestOpenAndInfo(t *testing.T) {
	be := openTiny(t, "tiny-bf16g", cpu.Options{Threads: 2, KVBlockSize: 32, NumKVBlocks: 10})
	info := be.Info()
	want := engine.BackendInfo{Name: "cpu", VocabSize: 1040, MaxContext: 4096, KVBlockSize: 32, NumKVBlocks: 10, TokenMasks: true}
	info.Device = ""
	if info != want {
		t.Errorf("info %+v, want %+v", info, want)
	}
	def, err := cpu.Open(filepath.Join(modelsDir, "tiny-f32"), cpu.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer def.Close()
	// 8 sequences of 4096 tokens in 16-token blocks.
	if got := def.Info(); got.KVBlockSize != 16 || got.NumKVBlocks != 2048 {
		t.Errorf("default pool %d blocks of %d, want 2048 of 16", got.NumKVBlocks, got.KVBlockSize)
	}

	for _, c := range []struct {
		dir  string
		o    cpu.Options
		want string
	}{
		{"no-such-model", cpu.Options{}, "read model config"},
		{"tiny-f32", cpu.Options{Threads: -1}, "must be >= 0"},
		{"tiny-f32", cpu.Options{NumKVBlocks: 1 << 30}, "over the limit"},
	} {
		if _, err := cpu.Open(filepath.Join(modelsDir, c.dir), c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open(%s, %+v): err %v, want %q", c.dir, c.o, err, c.want)
		}
	}
}

// TestDecodeSpeed reports the tiny model's single-sequence decode rate. It
// asserts nothing about time (benchmarks are commands, not tests); it only
// logs, so `go test -v` shows whether the model is interactive.
func TestDecodeSpeed(t *testing.T) {
	be := openTiny(t, "tiny-f32", cpu.Options{})
	p := prompt(16, 8)
	table := blocks(0, 1, 2, 3, 4)
	r := step(t, be, engine.StepSeq{SeqID: 1, Tokens: p, BlockTable: table, Sample: true, PromptTokens: p})[0]
	const n = 50
	start := time.Now()
	var out []int32
	for i := range n {
		out = append(out, r.Token)
		r = step(t, be, engine.StepSeq{SeqID: 1, Tokens: []int32{r.Token}, StartPos: 16 + i, BlockTable: table, Sample: true,
			SampleIndex: i + 1, PromptTokens: p, OutputTokens: out})[0]
	}
	t.Logf("tiny-f32 decode: %.0f tokens/s", n/time.Since(start).Seconds())
}
