package cuda

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/glmctl/glmctl/pkg/cudabuild"
	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/safetensors"
)

const tinyModel = "../../../testdata/models/tiny-f32"

// buildFake compiles testdata/fake_glmrt.c with extra -D flags into dir.
func buildFake(t *testing.T, name string, defines ...string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Fatalf("gcc is needed to build the fake runtime: %v", err)
	}
	out := filepath.Join(t.TempDir(), name)
	args := append([]string{"-shared", "-fPIC", "-O1", "-I../../../cuda/include", "-o", out}, defines...)
	args = append(args, "testdata/fake_glmrt.c", "-lpthread")
	if msg, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %v: %v\n%s", args, err, msg)
	}
	return out
}

var (
	fakeOnce sync.Once
	fakeLib  string
	fakeDir  string
)

// fake returns the fake runtime, built once per test binary.
func fake(t *testing.T) string {
	t.Helper()
	fakeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "glmctl-fake-glmrt-")
		if err != nil {
			t.Fatal(err)
		}
		fakeDir = dir
		out := filepath.Join(dir, "libglmcuda.so")
		if msg, err := exec.Command("gcc", "-shared", "-fPIC", "-O1", "-I../../../cuda/include", "-o", out, "testdata/fake_glmrt.c", "-lpthread").CombinedOutput(); err != nil {
			t.Fatalf("build fake runtime: %v\n%s", err, msg)
		}
		fakeLib = out
	})
	if fakeLib == "" {
		t.Fatal("fake runtime not built")
	}
	return fakeLib
}

func TestMain(m *testing.M) {
	code := m.Run()
	if fakeDir != "" {
		os.RemoveAll(fakeDir)
	}
	os.Exit(code)
}

func TestABIMatchesHeader(t *testing.T) {
	v, err := cudabuild.ABIVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v != ABIVersion {
		t.Errorf("embedded glmrt.h says ABI %d, this package was compiled against %d", v, ABIVersion)
	}
	syms, err := cudabuild.ABISymbols()
	if err != nil {
		t.Fatal(err)
	}
	if got := apiSymbolNames(); !slices.Equal(got, syms) {
		t.Errorf("loader resolves %v, glmrt.h declares %v", got, syms)
	}
}

func TestOpenBadLibraries(t *testing.T) {
	t.Setenv(LibEnv, "")
	notELF := filepath.Join(t.TempDir(), "libglmcuda.so")
	if err := os.WriteFile(notELF, []byte(strings.Repeat("this is not a shared object\n", 10)), 0o644); err != nil {
		t.Fatal(err)
	}
	stale := buildFake(t, "stale.so", fmt.Sprintf("-DFAKE_ABI_VERSION=%d", ABIVersion+1))
	noStep := buildFake(t, "nostep.so", "-DFAKE_OMIT_STEP")
	tests := []struct {
		name, lib string
		parts     []string
		is        error
	}{
		{"missing file", "/nonexistent/libglmcuda.so", []string{"load /nonexistent/libglmcuda.so", "cannot open shared object file"}, nil},
		{"not a library", notELF, []string{"load " + notELF, "invalid ELF header"}, nil},
		{"wrong library", "libm.so.6", []string{"load libm.so.6", "not a glmctl CUDA runtime", "missing symbol glmrt_abi_version"}, nil},
		{"incomplete runtime", noStep, []string{"missing symbol glmrt_step"}, nil},
		{"stale runtime", stale, []string{fmt.Sprintf("ABI version %d, this glmctl needs %d", ABIVersion+1, ABIVersion), "glmctl build"}, ErrStaleLibrary},
	}
	for _, tt := range tests {
		// The model directory is never reached: the library is checked first.
		_, err := Open("/nonexistent/model", Options{LibPath: tt.lib})
		if err == nil {
			t.Errorf("%s: Open succeeded", tt.name)
			continue
		}
		for _, p := range tt.parts {
			if !strings.Contains(err.Error(), p) {
				t.Errorf("%s: error %q lacks %q", tt.name, err, p)
			}
		}
		if tt.is != nil && !errors.Is(err, tt.is) {
			t.Errorf("%s: error %v does not wrap %v", tt.name, err, tt.is)
		}
	}
}

func TestLibraryPath(t *testing.T) {
	t.Setenv(LibEnv, "")
	cache := t.TempDir()
	if p, err := LibraryPath(Options{LibPath: "/x/lib.so"}); err != nil || p != "/x/lib.so" {
		t.Errorf("LibPath: %q, %v", p, err)
	}
	t.Setenv(LibEnv, "/env/lib.so")
	if p, err := LibraryPath(Options{CacheDir: cache}); err != nil || p != "/env/lib.so" {
		t.Errorf("$%s: %q, %v", LibEnv, p, err)
	}
	if p, err := LibraryPath(Options{LibPath: "/x/lib.so"}); err != nil || p != "/x/lib.so" {
		t.Errorf("LibPath must beat $%s: %q, %v", LibEnv, p, err)
	}
	t.Setenv(LibEnv, "")
	_, err := LibraryPath(Options{CacheDir: cache, Arch: "sm_90a"})
	if !errors.Is(err, cudabuild.ErrNotBuilt) || !strings.Contains(err.Error(), "libglmcuda.so not found: run `glmctl build`") {
		t.Errorf("empty cache: %v, want ErrNotBuilt", err)
	}
	if _, gerr := cudabuild.DetectGPUs(); gerr != nil {
		_, err := LibraryPath(Options{CacheDir: cache})
		if !errors.Is(err, cudabuild.ErrNotBuilt) || !strings.Contains(err.Error(), "no NVIDIA driver/GPU found") {
			t.Errorf("no GPU, no arch: %v, want ErrNotBuilt naming the missing GPU", err)
		}
	}
}

func TestDeviceCount(t *testing.T) {
	n, err := DeviceCount(fake(t))
	if err != nil || n != 3 {
		t.Fatalf("DeviceCount(fake) = %d, %v; want 3", n, err)
	}
	if _, err := DeviceCount("libm.so.6"); err == nil {
		t.Fatal("DeviceCount(libm) succeeded")
	}
}

func openFake(t *testing.T, o Options) *Backend {
	t.Helper()
	o.LibPath = fake(t)
	b, err := Open(tinyModel, o)
	if err != nil {
		t.Fatalf("Open with the fake runtime: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestOpenLoadsEveryTensor(t *testing.T) {
	b := openFake(t, Options{KVBlockSize: 8, NumKVBlocks: 100, MaxSeqs: 4})
	info := b.Info()
	want := engine.BackendInfo{Name: "cuda", Device: "fake GPU (sm_00, 0 GiB) x1", VocabSize: 1040, MaxContext: 4096, KVBlockSize: 8, NumKVBlocks: 100, MaxBatchSeqs: 4, MaxStepTokens: 8192, TokenMasks: true, LateMasks: true}
	if info != want {
		t.Errorf("Info = %+v, want %+v", info, want)
	}
	// The fake reports what it received: bytes, tensor count, byte sum.
	ck, err := safetensors.Open(tinyModel, safetensors.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	var bytes, sum int64
	for name := range ck.Tensors {
		d, err := ck.Data(name)
		if err != nil {
			t.Fatal(err)
		}
		bytes += int64(len(d))
		for _, c := range d {
			sum += int64(c)
		}
	}
	rt := b.RuntimeInfo()
	if rt.WeightBytes != bytes || rt.KVBytes != int64(len(ck.Tensors)) || rt.WorkspaceBytes != sum {
		t.Errorf("runtime got %d bytes in %d tensors (byte sum %d), checkpoint has %d in %d (sum %d)",
			rt.WeightBytes, rt.KVBytes, rt.WorkspaceBytes, bytes, len(ck.Tensors), sum)
	}
	if rt.ABIVersion != ABIVersion || rt.MaxTopLogprobs != MaxTopLogprobs || rt.MaxBlocksPerSeq != 4096/8 {
		t.Errorf("RuntimeInfo = %+v", rt)
	}
}

func TestOpenModelErrors(t *testing.T) {
	if _, err := Open(t.TempDir(), Options{LibPath: fake(t)}); err == nil || !strings.Contains(err.Error(), "config.json") {
		t.Errorf("Open on an empty directory: %v, want a config.json error", err)
	}
	if _, err := Open(tinyModel, Options{LibPath: fake(t), KVBlockSize: 4096}); err == nil || !strings.Contains(err.Error(), "kv_block_size 4096 > 1024") || !strings.Contains(err.Error(), "GLMRT_ERR_INVALID") {
		t.Errorf("Open with a bad block size: %v, want the runtime's message", err)
	}
	if _, err := Open(tinyModel, Options{LibPath: fake(t), MaxSeqs: -1}); err == nil || !strings.Contains(err.Error(), "MaxSeqs") {
		t.Errorf("Open with MaxSeqs -1: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := OpenContext(ctx, tinyModel, Options{LibPath: fake(t)}); !errors.Is(err, context.Canceled) {
		t.Errorf("OpenContext with a canceled context: %v", err)
	}
}

func seqTokenSum(toks []int32) int64 {
	var s int64
	for _, t := range toks {
		s += int64(t)
	}
	return s
}

func TestStepConversion(t *testing.T) {
	b := openFake(t, Options{KVBlockSize: 4, NumKVBlocks: 64})
	const vocab = 1040
	batch := &engine.StepBatch{Seqs: []engine.StepSeq{
		{ // prefill chunk, no sample, wants logits
			SeqID: 11, Tokens: []int32{5, 6, 7, 8, 9}, StartPos: 0, BlockTable: []int32{3, 4, 60}, WantLogits: true,
		},
		{ // decode, greedy, top logprobs, penalties with repetition (prompt counted)
			SeqID: 12, Tokens: []int32{1000}, StartPos: 9, BlockTable: []int32{1, 2, 7, 9}, Sample: true, SampleIndex: 3,
			Sampling:     engine.SamplingParams{Temperature: 0.5, TopLogprobs: 3, RepetitionPenalty: 1.1, Seed: 42, HasSeed: true},
			PromptTokens: []int32{1, 2, 2, 3}, OutputTokens: []int32{3, 4, 4, 4},
		},
		{ // decode, frequency penalty only: prompt not counted
			SeqID: 13, Tokens: []int32{17}, StartPos: 2, BlockTable: []int32{5}, Sample: true, WantLogits: true,
			Sampling:     engine.SamplingParams{FrequencyPenalty: 0.2, Seed: 7, HasSeed: true},
			PromptTokens: []int32{50, 51}, OutputTokens: []int32{60, 61, 60},
		},
		{ // decode, no penalties although history is given
			SeqID: 14, Tokens: []int32{1039}, StartPos: 0, BlockTable: []int32{0}, Sample: true,
			Sampling:     engine.SamplingParams{RepetitionPenalty: 1, TopLogprobs: 1},
			PromptTokens: []int32{1, 1, 1},
		},
	}}
	res, err := b.Step(context.Background(), batch)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 4 {
		t.Fatalf("%d results for 4 seqs", len(res))
	}
	for i, r := range res {
		if r.SeqID != batch.Seqs[i].SeqID {
			t.Errorf("result %d: SeqID %d, want %d", i, r.SeqID, batch.Seqs[i].SeqID)
		}
	}
	// seq 0: not sampled; logits row 0 = v + 1000*0 + 0.
	if r := res[0]; r.Token != 0 || r.TopLogprobs != nil || len(r.Logits) != vocab || r.Logits[0] != 0 || r.Logits[vocab-1] != vocab-1 {
		t.Errorf("seq 0 result %+v (logits %d)", r.Token, len(r.Logits))
	}
	// seq 1: history distinct tokens {1,2,3,4}: penalty_len 4, prompt sum 4, output sum 4.
	wantTok := int32((1000 + 9 + 7*4 + 3) % vocab)
	r := res[1]
	if r.Token != wantTok || r.Logprob != 1000*4+4 {
		t.Errorf("seq 1: token %d logprob %g, want %d and %d", r.Token, r.Logprob, wantTok, 1000*4+4)
	}
	wantTop := []engine.TokenLogprob{{Token: wantTok, Logprob: -0.5}, {Token: (wantTok + 1) % vocab, Logprob: -1.5}, {Token: (wantTok + 2) % vocab, Logprob: -2.5}}
	if !slices.Equal(r.TopLogprobs, wantTop) || r.Logits != nil {
		t.Errorf("seq 1: top %v, want %v; logits %d", r.TopLogprobs, wantTop, len(r.Logits))
	}
	// seq 2: output-only history {60,61}: penalty_len 2, prompt sum 0, output sum 3.
	r = res[2]
	if want := int32((17 + 2 + 7*2 + 0) % vocab); r.Token != want || r.Logprob != 3 || r.TopLogprobs != nil {
		t.Errorf("seq 2: token %d logprob %g top %v, want %d, 3, none", r.Token, r.Logprob, r.TopLogprobs, want)
	}
	if len(r.Logits) != vocab || r.Logits[5] != 5+2000+2 {
		t.Errorf("seq 2: logits row wrong (len %d, [5]=%v)", len(r.Logits), r.Logits[5])
	}
	// seq 3: no penalty, one top logprob (temperature 0 → logprob -0).
	r = res[3]
	if want := int32((1039 + 0) % vocab); r.Token != want || r.Logprob != -0.5 || len(r.TopLogprobs) != 1 || r.TopLogprobs[0].Token != want {
		t.Errorf("seq 3: %+v", r)
	}

	// Buffers are reused and regrown: a bigger batch after a small one.
	big := &engine.StepBatch{}
	for i := range 40 {
		big.Seqs = append(big.Seqs, engine.StepSeq{
			SeqID: uint64(i), Tokens: []int32{int32(i), int32(i + 1)}, StartPos: 6, BlockTable: []int32{1, 2},
			Sample: true, Sampling: engine.SamplingParams{PresencePenalty: 0.1, TopLogprobs: 20},
			OutputTokens: []int32{int32(i), int32(i + 500), int32(i)},
		})
	}
	res, err = b.Step(context.Background(), big)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		want := int32((int64(2*i+1) + 6 + 7*2) % vocab)
		if r.Token != want || r.Logprob != 3 || len(r.TopLogprobs) != 20 {
			t.Fatalf("big batch seq %d: token %d logprob %g tops %d; want %d, 3, 20", i, r.Token, r.Logprob, len(r.TopLogprobs), want)
		}
	}
}

// Speculative fields cross the ABI both ways: Drafts / Draft / NextToken /
// Propose into glmrt_seq, accepted drafts (with logprobs and top
// alternatives) and proposals back into SeqResult (the fake accepts drafts
// while they are even and proposes token + 1).
func TestStepSpeculativeConversion(t *testing.T) {
	b := openFake(t, Options{KVBlockSize: 4, NumKVBlocks: 64, DraftTokens: 1})
	if got := b.Info().MaxDraftTokens; got != 1 {
		t.Fatalf("MaxDraftTokens %d, want 1", got)
	}
	const vocab = 1040
	batch := &engine.StepBatch{Seqs: []engine.StepSeq{
		{SeqID: 1, Tokens: []int32{9, 8}, StartPos: 3, BlockTable: []int32{1, 2}, Sample: true, Draft: true, Drafts: 1, Propose: 1,
			Sampling: engine.SamplingParams{TopLogprobs: 2}},
		{SeqID: 2, Tokens: []int32{9, 7}, StartPos: 3, BlockTable: []int32{3, 4}, Sample: true, Draft: true, Drafts: 1, Propose: 1},
		{SeqID: 3, Tokens: []int32{4, 5, 6}, BlockTable: []int32{5}, Draft: true, NextToken: 11},
		{SeqID: 4, Tokens: []int32{4}, StartPos: 1, BlockTable: []int32{6}, Sample: true},
	}}
	res, err := b.Step(context.Background(), batch)
	if err != nil {
		t.Fatal(err)
	}
	tok0 := int32((9 + 8 + 3) % vocab)
	want0 := []engine.AcceptedToken{{Token: 8, Logprob: -1, TopLogprobs: []engine.TokenLogprob{{Token: 8, Logprob: 0}, {Token: 9, Logprob: -1}}}}
	if r := res[0]; r.Token != tok0 || !reflect.DeepEqual(r.Accepted, want0) || !slices.Equal(r.Drafts, []int32{tok0 + 1}) {
		t.Errorf("seq 1: token %d accepted %+v drafts %v; want %d, %+v, [%d]", r.Token, r.Accepted, r.Drafts, tok0, want0, tok0+1)
	}
	if r := res[1]; r.Accepted != nil || len(r.Drafts) != 1 {
		t.Errorf("seq 2 (odd draft rejected): accepted %+v drafts %v", r.Accepted, r.Drafts)
	}
	if r := res[2]; r.Accepted != nil || r.Drafts != nil {
		t.Errorf("seq 3 (prefill chunk): %+v", r)
	}
	if r := res[3]; r.Accepted != nil || r.Drafts != nil || r.Token != int32(5) {
		t.Errorf("seq 4 (plain decode): %+v", r)
	}
	// Drafts that make no sense are refused before the runtime sees them.
	for _, q := range []engine.StepSeq{
		{SeqID: 5, Tokens: []int32{1}, BlockTable: []int32{0}, Sample: true, Drafts: 1},
		{SeqID: 6, Tokens: []int32{1, 2}, BlockTable: []int32{0}, Drafts: 1},
		{SeqID: 7, Tokens: []int32{1}, BlockTable: []int32{0}, Sample: true, Propose: 1},
		{SeqID: 8, Tokens: []int32{1}, BlockTable: []int32{0}, Draft: true, NextToken: vocab},
	} {
		if _, err := b.Step(context.Background(), &engine.StepBatch{Seqs: []engine.StepSeq{q}}); err == nil {
			t.Errorf("seq %d %+v: no error", q.SeqID, q)
		}
	}
}

func TestStepErrors(t *testing.T) {
	b := openFake(t, Options{KVBlockSize: 4, NumKVBlocks: 8, MaxSeqs: 2, MaxTokensPerStep: 8, MaxPenaltyEntries: 3})
	ok := engine.StepSeq{Tokens: []int32{1}, BlockTable: []int32{0}, Sample: true}
	tests := []struct {
		name  string
		seqs  []engine.StepSeq
		parts []string
	}{
		{"empty", nil, []string{"empty batch"}},
		{"too many seqs", []engine.StepSeq{ok, ok, ok}, []string{"3 sequences exceed", "max_seqs_per_step 2"}},
		{"too many tokens", []engine.StepSeq{{Tokens: make([]int32, 9), BlockTable: []int32{0, 1, 2}}}, []string{"9 tokens exceed", "max_tokens_per_step 8"}},
		{"no tokens", []engine.StepSeq{{SeqID: 5, BlockTable: []int32{0}}}, []string{"seq 0 (id 5): no tokens"}},
		{"short table", []engine.StepSeq{{Tokens: []int32{1, 2}, StartPos: 3, BlockTable: []int32{0}}}, []string{"block table has 1 blocks", "need 2"}},
		{"beyond context", []engine.StepSeq{{Tokens: []int32{1}, StartPos: 4096, BlockTable: []int32{0}}}, []string{"outside the context [0, 4096)"}},
		{"bad token", []engine.StepSeq{{Tokens: []int32{1040}, BlockTable: []int32{0}}}, []string{"token 1040", "outside the vocabulary [0, 1040)"}},
		{"bad history token", []engine.StepSeq{{Tokens: []int32{1}, BlockTable: []int32{0}, Sample: true, Sampling: engine.SamplingParams{PresencePenalty: 1}, OutputTokens: []int32{-3}}}, []string{"output token -3"}},
		{"too many top logprobs", []engine.StepSeq{{Tokens: []int32{1}, BlockTable: []int32{0}, Sample: true, Sampling: engine.SamplingParams{TopLogprobs: 21}}}, []string{"top_logprobs 21 out of range [0, 20]"}},
		{"penalty history too long", []engine.StepSeq{{Tokens: []int32{1}, BlockTable: []int32{0}, Sample: true, Sampling: engine.SamplingParams{FrequencyPenalty: 1}, OutputTokens: []int32{1, 2, 3, 4}}}, []string{"4 distinct tokens", "max_penalty_entries 3"}},
		{"runtime refuses", []engine.StepSeq{{Tokens: []int32{1}, BlockTable: []int32{0}, Sample: true, Sampling: engine.SamplingParams{Seed: 0xBAD}}}, []string{"glmrt_step_finish: fake: seed 0xBAD refused for seq 0", "GLMRT_ERR_INVALID"}},
		{"block id out of pool", []engine.StepSeq{{Tokens: []int32{1}, BlockTable: []int32{8}}}, []string{"fake: seq 0: block 8"}},
	}
	for _, tt := range tests {
		_, err := b.Step(context.Background(), &engine.StepBatch{Seqs: tt.seqs})
		if err == nil {
			t.Errorf("%s: Step succeeded", tt.name)
			continue
		}
		for _, p := range tt.parts {
			if !strings.Contains(err.Error(), p) {
				t.Errorf("%s: error %q lacks %q", tt.name, err, p)
			}
		}
	}
	// After errors the backend still works and the counters were reset:
	// a history of 3 distinct tokens fits exactly.
	res, err := b.Step(context.Background(), &engine.StepBatch{Seqs: []engine.StepSeq{{
		Tokens: []int32{1}, BlockTable: []int32{0}, Sample: true,
		Sampling: engine.SamplingParams{FrequencyPenalty: 1}, OutputTokens: []int32{1, 2, 3, 3},
	}}})
	if err != nil || res[0].Logprob != 4 {
		t.Fatalf("Step after errors: %v, %v; want output count sum 4", res, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.Step(ctx, &engine.StepBatch{Seqs: []engine.StepSeq{ok}}); !errors.Is(err, context.Canceled) {
		t.Errorf("Step with a canceled context: %v", err)
	}
}

// TestStepNonFiniteOneSequence: a sequence the runtime cannot sample (its
// logits NaN: the fake's seed 0x7FC00000) ends alone with an error wrapping
// engine.ErrNonFiniteLogits; the others in the step keep their tokens, and
// the next step runs.
func TestStepNonFiniteOneSequence(t *testing.T) {
	b := openFake(t, Options{KVBlockSize: 4, NumKVBlocks: 8})
	const vocab = 1040
	batch := &engine.StepBatch{Seqs: []engine.StepSeq{
		{SeqID: 1, Tokens: []int32{5}, BlockTable: []int32{0}, Sample: true},
		{SeqID: 2, Tokens: []int32{6}, BlockTable: []int32{1}, Sample: true, WantLogits: true,
			Sampling: engine.SamplingParams{Seed: 0x7FC00000, HasSeed: true, TopLogprobs: 2}},
		{SeqID: 3, Tokens: []int32{7}, BlockTable: []int32{2}, Sample: true},
	}}
	res, err := b.Step(context.Background(), batch)
	if err != nil {
		t.Fatalf("Step failed as a whole: %v", err)
	}
	if e := res[1].Err; !errors.Is(e, engine.ErrNonFiniteLogits) || !strings.Contains(e.Error(), "NaN") ||
		!strings.Contains(e.Error(), "id 2") {
		t.Errorf("seq 2: Err %v, want one naming the sequence and NaN, wrapping ErrNonFiniteLogits", e)
	}
	if res[1].TopLogprobs != nil || len(res[1].Logits) != vocab {
		t.Errorf("seq 2: top %v, %d logits; want none and its logits row", res[1].TopLogprobs, len(res[1].Logits))
	}
	for _, i := range []int{0, 2} {
		if r := res[i]; r.Err != nil || r.Token != int32(5+i) {
			t.Errorf("seq %d: token %d err %v; want token %d and no error", r.SeqID, r.Token, r.Err, 5+i)
		}
	}
	res, err = b.Step(context.Background(), &engine.StepBatch{Seqs: batch.Seqs[:1]})
	if err != nil || res[0].Err != nil || res[0].Token != 5 {
		t.Fatalf("next step: %+v, %v", res, err)
	}
}

// Token masks reach the runtime per sequence (glmrt_batch.token_masks): the
// fake takes the first allowed id at or after its answer, and a mask that
// allows nothing fails that sequence alone with ErrNoAllowedToken.
func TestStepTokenMasks(t *testing.T) {
	b := openFake(t, Options{KVBlockSize: 4, NumKVBlocks: 8})
	if !b.Info().TokenMasks {
		t.Fatal("the cuda backend does not announce token masks")
	}
	const vocab = 1040
	mask := func(ids ...int) []uint32 {
		m := make([]uint32, engine.MaskWords(vocab))
		for _, id := range ids {
			m[id/32] |= 1 << (id % 32)
		}
		return m
	}
	batch := &engine.StepBatch{Seqs: []engine.StepSeq{
		{SeqID: 1, Tokens: []int32{5}, BlockTable: []int32{0}, Sample: true, AllowedTokens: mask(3, 700)},
		{SeqID: 2, Tokens: []int32{6}, BlockTable: []int32{1}, Sample: true},
		{SeqID: 3, Tokens: []int32{7}, BlockTable: []int32{2}, Sample: true, AllowedTokens: mask(1039, 2)},
		{SeqID: 4, Tokens: []int32{8}, BlockTable: []int32{3}, Sample: true, AllowedTokens: mask()},
		{SeqID: 5, Tokens: []int32{9}, BlockTable: []int32{4}, AllowedTokens: mask(1)}, // not sampled: ignored
	}}
	res, err := b.Step(context.Background(), batch)
	if err != nil {
		t.Fatalf("Step failed as a whole: %v", err)
	}
	for i, want := range []int32{700, 6, 1039} {
		if r := res[i]; r.Err != nil || r.Token != want {
			t.Errorf("seq %d: token %d err %v, want %d", r.SeqID, r.Token, r.Err, want)
		}
	}
	if e := res[3].Err; !errors.Is(e, engine.ErrNoAllowedToken) || !strings.Contains(e.Error(), "id 4") {
		t.Errorf("seq 4: err %v, want ErrNoAllowedToken naming the sequence", e)
	}
	// Late masks: empty when Step starts, filled in AwaitMasks (after
	// glmrt_step_begin); the runtime must see the filled rows.
	late := mask()
	awaits := 0
	res, err = b.Step(context.Background(), &engine.StepBatch{
		Seqs: []engine.StepSeq{{SeqID: 6, Tokens: []int32{5}, BlockTable: []int32{0}, Sample: true, AllowedTokens: late}},
		AwaitMasks: func() {
			awaits++
			late[900/32] |= 1 << (900 % 32)
		},
	})
	if err != nil || awaits != 1 || res[0].Err != nil || res[0].Token != 900 {
		t.Errorf("late mask: err %v, %d awaits, result %+v; want token 900", err, awaits, res)
	}
	short := &engine.StepBatch{Seqs: []engine.StepSeq{{SeqID: 9, Tokens: []int32{5}, BlockTable: []int32{0}, Sample: true, AllowedTokens: []uint32{1}}}}
	if _, err := b.Step(context.Background(), short); err == nil || !strings.Contains(err.Error(), "token mask has 1 words, the vocabulary of 1040 needs 33") {
		t.Errorf("short mask: err %v", err)
	}
}

// TestStepFromManyGoroutines: whatever goroutine (and OS thread) calls Step,
// the runtime must only ever see the engine's own thread (the fake refuses
// calls from any other one).
func TestStepFromManyGoroutines(t *testing.T) {
	b := openFake(t, Options{KVBlockSize: 16, NumKVBlocks: 8})
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // pin each caller to a different thread
			defer runtime.UnlockOSThread()
			for i := range 20 {
				tok := int32(g*20 + i)
				res, err := b.Step(context.Background(), &engine.StepBatch{Seqs: []engine.StepSeq{{
					SeqID: uint64(tok), Tokens: []int32{tok}, BlockTable: []int32{0}, Sample: true,
				}}})
				if err != nil {
					errs <- err
					return
				}
				if res[0].Token != tok {
					errs <- fmt.Errorf("token %d, want %d", res[0].Token, tok)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestClose(t *testing.T) {
	b, err := Open(tinyModel, Options{LibPath: fake(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_, err = b.Step(context.Background(), &engine.StepBatch{Seqs: []engine.StepSeq{{Tokens: []int32{1}, BlockTable: []int32{0}}}})
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("Step after Close: %v, want ErrClosed", err)
	}
}

func TestUsesPenalties(t *testing.T) {
	tests := []struct {
		p            engine.SamplingParams
		use, prompts bool
	}{
		{engine.SamplingParams{}, false, false},
		{engine.SamplingParams{RepetitionPenalty: 1}, false, false},
		{engine.SamplingParams{RepetitionPenalty: 1.2}, true, true},
		{engine.SamplingParams{RepetitionPenalty: 0.9, FrequencyPenalty: 0.5}, true, true},
		{engine.SamplingParams{FrequencyPenalty: -0.5}, true, false},
		{engine.SamplingParams{PresencePenalty: 0.5, RepetitionPenalty: 1}, true, false},
		{engine.SamplingParams{Temperature: 1, TopK: 5, TopP: 0.9, MinP: 0.1}, false, false},
	}
	for _, tt := range tests {
		use, prompts := usesPenalties(tt.p)
		if use != tt.use || prompts != tt.prompts {
			t.Errorf("usesPenalties(%+v) = %v, %v; want %v, %v", tt.p, use, prompts, tt.use, tt.prompts)
		}
	}
}

// TestKVFP8Option: KVFP8 reaches the runtime as kv_cache_dtype
// GLMRT_KV_FP8_E4M3 (the fake runtime accepts only the ABI's values), and
// with Exact it is refused before the runtime sees it, naming the option.
func TestKVFP8Option(t *testing.T) {
	openFake(t, Options{KVBlockSize: 16, NumKVBlocks: 8, KVFP8: true})
	_, err := Open(tinyModel, Options{LibPath: fake(t), KVBlockSize: 16, NumKVBlocks: 8, KVFP8: true, Exact: true})
	if err == nil || !strings.Contains(err.Error(), "KVFP8") {
		t.Errorf("Open with KVFP8 and Exact: %v, want an error naming KVFP8", err)
	}
}
