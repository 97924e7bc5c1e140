package golden

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/glmctl/glmctl/pkg/engine"
)

const validDoc = `{"model":"tiny-x","reference":"hand-made","cases":[
 {"prompt_token_ids":[1,2,3],"last_logits":[0,1,5,2,0,0,0,0],"greedy_token_ids":[2,4,4],"greedy_margins":[3,0.0005,2]},
 {"prompt_token_ids":[7],"last_logits":[0,0,0,0,0,0,1,0.5],"greedy_token_ids":[6,1],"greedy_margins":[0.5,1]}]}`

func TestParse(t *testing.T) {
	f, err := Parse([]byte(validDoc))
	if err != nil {
		t.Fatal(err)
	}
	if f.Model != "tiny-x" || len(f.Cases) != 2 || f.VocabSize() != 8 || !slices.Equal(f.Cases[0].GreedyTokenIDs, []int32{2, 4, 4}) {
		t.Errorf("parsed %+v", f)
	}
	tests := []struct {
		name, doc, want string
	}{
		{"not JSON", `{`, "parse JSON"},
		{"trailing data", `{"model":"m","reference":"r","cases":[{"prompt_token_ids":[1],"last_logits":[1,2],"greedy_token_ids":[],"greedy_margins":[]}]} {}`, "trailing data"},
		{"unknown key", `{"model":"m","reference":"r","extra":1,"cases":[]}`, `unknown field "extra"`},
		{"missing model", `{"reference":"r","cases":[]}`, `field "model": missing`},
		{"missing reference", `{"model":"m","cases":[]}`, `field "reference": missing`},
		{"no cases", `{"model":"m","reference":"r","cases":[]}`, `field "cases": missing or empty`},
		{"wrong type", `{"model":"m","reference":"r","cases":[{"prompt_token_ids":"abc"}]}`, `field "cases.prompt_token_ids"`},
		{"missing logits", `{"model":"m","reference":"r","cases":[{"prompt_token_ids":[1],"greedy_token_ids":[],"greedy_margins":[]}]}`, `cases[0]: field "last_logits"`},
		{"missing margins", `{"model":"m","reference":"r","cases":[{"prompt_token_ids":[1],"last_logits":[1],"greedy_token_ids":[]}]}`, `field "greedy_margins": missing`},
		{"margins length", `{"model":"m","reference":"r","cases":[{"prompt_token_ids":[1],"last_logits":[1,2],"greedy_token_ids":[1],"greedy_margins":[]}]}`, "greedy_margins has 0 values for 1 greedy_token_ids"},
		{"negative margin", `{"model":"m","reference":"r","cases":[{"prompt_token_ids":[1],"last_logits":[1,2],"greedy_token_ids":[1],"greedy_margins":[-1]}]}`, "greedy_margins[0]"},
		{"negative token", `{"model":"m","reference":"r","cases":[{"prompt_token_ids":[-3],"last_logits":[1,2],"greedy_token_ids":[],"greedy_margins":[]}]}`, "prompt_token_ids[0]: -3 is negative"},
		{"token beyond vocab", `{"model":"m","reference":"r","cases":[{"prompt_token_ids":[1],"last_logits":[1,2],"greedy_token_ids":[2],"greedy_margins":[1]}]}`, "greedy_token_ids[0]: 2 is outside the vocabulary of 2 logits"},
		{"vocab differs", `{"model":"m","reference":"r","cases":[{"prompt_token_ids":[1],"last_logits":[1,2],"greedy_token_ids":[],"greedy_margins":[]},{"prompt_token_ids":[1],"last_logits":[1],"greedy_token_ids":[],"greedy_margins":[]}]}`, "cases[1].last_logits: 1 values, but cases[0] has 2"},
		{"float32 overflow", `{"model":"m","reference":"r","cases":[{"prompt_token_ids":[1],"last_logits":[1e39],"greedy_token_ids":[],"greedy_margins":[]}]}`, "last_logits"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want it to mention %q", err, tt.want)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	for _, name := range []string{"tiny-f32", "tiny-bf16g"} {
		f, err := Load(filepath.Join("../../testdata/models", name+".golden.json"))
		if err != nil {
			t.Fatal(err)
		}
		if f.Model != name || len(f.Cases) != 6 || f.VocabSize() != 1040 {
			t.Errorf("%s: model %q, %d cases, vocab %d", name, f.Model, len(f.Cases), f.VocabSize())
		}
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"model":""}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(bad); err == nil || !strings.Contains(err.Error(), "golden file "+bad) {
		t.Errorf("bad file: err %v, want it to name the file", err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "none.json")); err == nil || !strings.Contains(err.Error(), "none.json") {
		t.Errorf("missing file: err %v", err)
	}
}

func TestMetrics(t *testing.T) {
	var cr CaseResult
	compareLogits(&cr, []float32{1, 2, 3, 0, -1, 0.5}, []float32{1, 2, 4, 0, -1, 0.5}, ExactTolerances)
	// diff (0,0,-1,0,0,0): ‖d‖ = 1; ‖ref‖ = sqrt(1+4+16+1+0.25) = sqrt(22.25) = 4.717
	if !near(cr.RelL2, 1/math.Sqrt(22.25)) || cr.MaxAbs != 1 || !cr.Top1Match || cr.Top5Overlap != 5 {
		t.Errorf("metrics %+v", cr)
	}
	if len(cr.Failures) != 1 || !strings.Contains(cr.Failures[0], "relative L2 error 0.212 > 0.0001") {
		t.Errorf("failures %q", cr.Failures)
	}
	if got := topN([]float32{3, 5, 5, 1, 4}, 3); !slices.Equal(got, []int{1, 2, 4}) {
		t.Errorf("topN with a tie: %v", got)
	}
	if got := overlap([]int{1, 2, 3}, []int{3, 4, 1}); got != 2 {
		t.Errorf("overlap %d", got)
	}
	if argmax([]float32{float32(math.NaN()), 1, 2, 2}) != 2 {
		t.Error("argmax: NaN must not win, ties go to the lower index")
	}
}

// fakeBackend answers from a golden file: it keeps the tokens written to
// each KV slot, rebuilds the sequence through the block table, and returns
// the reference logits (prefill) or a logit vector peaked at the reference
// greedy token (decode). tweak may change a step's answer.
type fakeBackend struct {
	info  engine.BackendInfo
	f     *File
	slots map[int]int32
	tweak func(c, step int, logits []float32, tok *int32)
	fail  error
	extra bool  // return one result too many
	steps []int // new tokens of every step received
}

func newFake(f *File, vocab int) *fakeBackend {
	return &fakeBackend{
		info:  engine.BackendInfo{Name: "fake", VocabSize: vocab, MaxContext: 64, KVBlockSize: 2, NumKVBlocks: 6},
		f:     f,
		slots: map[int]int32{},
	}
}

func (b *fakeBackend) Info() engine.BackendInfo { return b.info }
func (b *fakeBackend) Close() error             { return nil }

func (b *fakeBackend) Step(_ context.Context, batch *engine.StepBatch) ([]engine.SeqResult, error) {
	if b.fail != nil {
		return nil, b.fail
	}
	var out []engine.SeqResult
	bs := b.info.KVBlockSize
	for _, s := range batch.Seqs {
		b.steps = append(b.steps, len(s.Tokens))
		if b.info.MaxStepTokens > 0 && len(s.Tokens) > b.info.MaxStepTokens {
			return nil, fmt.Errorf("fake: %d tokens in one step, limit %d", len(s.Tokens), b.info.MaxStepTokens)
		}
		end := s.StartPos + len(s.Tokens)
		for i, tok := range s.Tokens {
			p := s.StartPos + i
			b.slots[int(s.BlockTable[p/bs])*bs+p%bs] = tok
		}
		seq := make([]int32, end)
		for p := range seq {
			seq[p] = b.slots[int(s.BlockTable[p/bs])*bs+p%bs]
		}
		ci, stepIdx := -1, -1
		for i, c := range b.f.Cases {
			n := len(c.PromptTokenIDs)
			if end >= n && end < n+len(c.GreedyTokenIDs) &&
				slices.Equal(seq[:n], c.PromptTokenIDs) && slices.Equal(seq[n:], c.GreedyTokenIDs[:end-n]) {
				ci, stepIdx = i, end-n
			}
		}
		if ci < 0 && !s.Sample && !s.WantLogits {
			for _, c := range b.f.Cases { // an early prefill chunk: no result wanted
				if end < len(c.PromptTokenIDs) && slices.Equal(seq, c.PromptTokenIDs[:end]) {
					ci = -2
				}
			}
			if ci == -2 {
				out = append(out, engine.SeqResult{SeqID: s.SeqID})
				continue
			}
		}
		if ci < 0 {
			return nil, fmt.Errorf("fake: sequence %v matches no case", seq)
		}
		c := b.f.Cases[ci]
		logits := make([]float32, b.info.VocabSize)
		if stepIdx == 0 {
			copy(logits, c.LastLogits)
		} else {
			logits[c.GreedyTokenIDs[stepIdx]] = 10
		}
		tok := argmax(logits)
		if b.tweak != nil {
			b.tweak(ci, stepIdx, logits, &tok)
		}
		out = append(out, engine.SeqResult{SeqID: s.SeqID, Token: tok, Logits: logits})
	}
	if b.extra {
		out = append(out, engine.SeqResult{})
	}
	return out, nil
}

func TestCompare(t *testing.T) {
	f, err := Parse([]byte(validDoc))
	if err != nil {
		t.Fatal(err)
	}
	f.Path = "x.golden.json"
	ctx := context.Background()
	opt := Options{Tolerances: ExactTolerances, ModelName: "tiny-x"}

	tests := []struct {
		name      string
		tweak     func(c, step int, logits []float32, tok *int32)
		pass      bool
		worst     int
		wantFail  string
		tolerated int
	}{
		{name: "perfect", pass: true},
		{
			name: "logit noise",
			tweak: func(c, step int, l []float32, _ *int32) {
				if c == 1 && step == 0 {
					l[0] += 0.01 // rel L2 = 0.01/sqrt(1.25) = 8.9e-3
				}
			},
			worst: 1, wantFail: "last-logit relative L2 error 0.00894 > 0.0001",
		},
		{
			name: "greedy mismatch above the margin",
			tweak: func(c, step int, l []float32, tok *int32) {
				if c == 0 && step == 2 {
					l[4], l[5] = 0, 10
					*tok = 5
				}
			},
			worst: 0, wantFail: "1 greedy mismatch(es), first at step 2: want token 4, got 5 (reference margin 2 > 0.001)",
		},
		{
			name: "greedy mismatch at a near-tie is tolerated",
			tweak: func(c, step int, l []float32, tok *int32) {
				if c == 0 && step == 1 {
					l[4], l[3] = 0, 10
					*tok = 3
				}
			},
			pass: true, tolerated: 1,
		},
		{
			name: "sampled token is not the argmax",
			tweak: func(c, step int, _ []float32, tok *int32) {
				if c == 1 && step == 1 {
					*tok = 0
				}
			},
			worst: 1, wantFail: "greedy step 1: sampled token 0 is not the argmax 1",
		},
		{
			name: "top-1 flipped",
			tweak: func(c, step int, l []float32, tok *int32) {
				if c == 1 && step == 0 {
					l[7] = 1.1
					*tok = 7
				}
			},
			worst: 1, wantFail: "last-logit top-1 is token 7, reference 6 (reference margin 0.5)",
		},
		{
			name: "NaN logits fail",
			tweak: func(c, step int, l []float32, _ *int32) {
				if c == 0 && step == 0 {
					l[0] = float32(math.NaN())
				}
			},
			worst: 0, wantFail: "relative L2 error NaN",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			be := newFake(f, 8)
			be.tweak = tt.tweak
			rep, err := Compare(ctx, be, f, opt)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Pass != tt.pass {
				t.Fatalf("pass %v, want %v: %+v", rep.Pass, tt.pass, rep.Cases)
			}
			if rep.Cases[0].GreedyTolerated != tt.tolerated {
				t.Errorf("tolerated %d, want %d", rep.Cases[0].GreedyTolerated, tt.tolerated)
			}
			if tt.pass {
				if rep.Err() != nil {
					t.Errorf("Err() = %v for a passing report", rep.Err())
				}
				return
			}
			if rep.Worst != tt.worst {
				t.Errorf("worst case %d, want %d", rep.Worst, tt.worst)
			}
			err = rep.Err()
			if err == nil || !strings.Contains(err.Error(), tt.wantFail) ||
				!strings.Contains(err.Error(), fmt.Sprintf("worst is case %d", tt.worst)) ||
				!strings.Contains(err.Error(), "golden x.golden.json (model tiny-x) on the fake backend") {
				t.Errorf("Err() = %v, want the worst case %d and %q", err, tt.worst, tt.wantFail)
			}
		})
	}
}

// A backend with a step limit below a prompt gets the prompt in chunks, the
// last one sampling; the comparison is the same as in one step.
// Options.ChunkTokens asks for the same chunks below the backend's limit.
func TestCompareChunkedPrefill(t *testing.T) {
	f, err := Parse([]byte(validDoc))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name                string
		stepLimit, chunkOpt int
		want                []int
	}{
		// Case 0: prompt of 3 in chunks 2 + 1, then 2 decode steps; case 1: 1, then 1.
		{"backend limit", 2, 0, []int{2, 1, 1, 1, 1, 1}},
		{"option", 0, 2, []int{2, 1, 1, 1, 1, 1}},
		{"option under the limit", 8, 1, []int{1, 1, 1, 1, 1, 1, 1}},
		{"no limit", 0, 0, []int{3, 1, 1, 1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newFake(f, 8)
			b.info.MaxStepTokens = tc.stepLimit
			rep, err := Compare(context.Background(), b, f, Options{Tolerances: ExactTolerances, ChunkTokens: tc.chunkOpt})
			if err != nil {
				t.Fatal(err)
			}
			if err := rep.Err(); err != nil {
				t.Error(err)
			}
			if !slices.Equal(b.steps, tc.want) {
				t.Errorf("step sizes %v, want %v", b.steps, tc.want)
			}
		})
	}
}

func TestCompareRefuses(t *testing.T) {
	f, err := Parse([]byte(validDoc))
	if err != nil {
		t.Fatal(err)
	}
	f.Path = "x.golden.json"
	ctx := context.Background()
	tests := []struct {
		name  string
		setup func(b *fakeBackend, o *Options)
		want  string
	}{
		{"other model", func(_ *fakeBackend, o *Options) { o.ModelName = "tiny-y" }, "golden file x.golden.json was made for model tiny-x, not tiny-y"},
		{"other vocab", func(b *fakeBackend, _ *Options) { b.info.VocabSize = 9 }, "has 8 logits per case, but the fake backend's model has vocab size 9"},
		{"pool too small", func(b *fakeBackend, _ *Options) { b.info.NumKVBlocks = 2 }, "case 0: needs 3 KV blocks of 2 tokens, the backend has 2"},
		{"context too short", func(b *fakeBackend, _ *Options) { b.info.MaxContext = 4 }, "needs 5 positions, over the backend's max context 4"},
		{"step error", func(b *fakeBackend, _ *Options) { b.fail = errors.New("boom") }, "case 0: prefill of 3 tokens: boom"},
		{"result count", func(b *fakeBackend, _ *Options) { b.extra = true }, "backend returned 2 results for 1 sequence"},
		{"bad tolerances", func(_ *fakeBackend, o *Options) { o.Tolerances.MaxRelL2 = 0 }, "max rel L2 must be > 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			be := newFake(f, 8)
			o := Options{Tolerances: ExactTolerances, ModelName: "tiny-x"}
			tt.setup(be, &o)
			_, err := Compare(ctx, be, f, o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want it to mention %q", err, tt.want)
			}
		})
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := Compare(cctx, newFake(f, 8), f, Options{Tolerances: ExactTolerances}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: err %v", err)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(1, math.Abs(b)) }

func TestNumerics(t *testing.T) {
	doc := strings.Replace(validDoc, `"reference":"hand-made",`, `"reference":"hand-made","numerics":"fp8-gpu",`, 1)
	f, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if f.Numerics != NumericsFP8GPU {
		t.Fatalf("numerics %q", f.Numerics)
	}
	bad := strings.Replace(validDoc, `"reference":"hand-made",`, `"reference":"hand-made","numerics":"bf16",`, 1)
	if _, err := Parse([]byte(bad)); err == nil || !strings.Contains(err.Error(), `field "numerics": "bf16" is not a known`) {
		t.Fatalf("unknown numerics: err %v", err)
	}
	plain, err := Parse([]byte(validDoc))
	if err != nil {
		t.Fatal(err)
	}
	f.Path = "m.fp8.golden.json"
	tests := []struct {
		name    string
		f       *File
		fp8     bool
		want    Tolerances
		wantErr string
	}{
		{"float32 golden, exact path", plain, false, ExactTolerances, ""},
		{"float32 golden, FP8 path", plain, true, FP8Tolerances, ""},
		{"FP8 golden, FP8 path", f, true, FP8GoldenTolerances, ""},
		{"FP8 golden, exact path", f, false, Tolerances{}, "golden file m.fp8.golden.json holds the GPU's FP8 arithmetic"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := TolerancesFor(tt.f, tt.fp8)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

// The agreement criterion: with MinAgreeFraction set, every case may pass its
// own tolerance and the report still fails when too few cases agree closely.
func TestCompareAgreement(t *testing.T) {
	f, err := Parse([]byte(validDoc))
	if err != nil {
		t.Fatal(err)
	}
	f.Path = "x.fp8.golden.json"
	tol := Tolerances{MaxRelL2: 1e-2, MarginThreshold: 5e-2, MinAgreeFraction: 0.5, AgreeRelL2: 1e-5}
	tests := []struct {
		name     string
		noisy    map[int]bool // cases whose last logits get ~1e-3 relative noise
		pass     bool
		agreeing int
	}{
		{"all agree", nil, true, 2},
		{"half agree", map[int]bool{1: true}, true, 1},
		{"none agree", map[int]bool{0: true, 1: true}, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			be := newFake(f, 8)
			be.tweak = func(c, step int, logits []float32, _ *int32) {
				if step == 0 && tt.noisy[c] {
					logits[0] += 0.004
				}
			}
			rep, err := Compare(context.Background(), be, f, Options{Tolerances: tol})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Pass != tt.pass || rep.Agreeing != tt.agreeing || rep.NumFailed() != 0 {
				t.Fatalf("pass %v agreeing %d failed %d, want pass %v agreeing %d and no failed case", rep.Pass, rep.Agreeing, rep.NumFailed(), tt.pass, tt.agreeing)
			}
			if err := rep.Err(); (err == nil) != tt.pass {
				t.Fatalf("Err() = %v with pass %v", err, tt.pass)
			} else if err != nil && !strings.Contains(err.Error(), "only 0 of 2 cases agree with the reference to 1e-05 relative L2, want at least 50%") {
				t.Fatalf("Err() = %v", err)
			}
		})
	}
	if _, err := Compare(context.Background(), newFake(f, 8), f, Options{Tolerances: Tolerances{MaxRelL2: 1, MinAgreeFraction: 0.5}}); err == nil {
		t.Fatal("an agreement fraction without an agreement error was accepted")
	}
}
