package cpu_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/glmctl/glmctl/pkg/backend/cpu"
	"github.com/glmctl/glmctl/pkg/engine"
)

// Speculative decoding with the MTP layer (docs/speculative.md).

var mtpModels = []string{"tiny-f32", "tiny-bf16g", "demo-go"}

// goPrompt is demo-go's tokenization of
// "// Reverse returns a copy of s with its bytes in reverse order.\nfunc Reverse(s string) string {\n".
var goPrompt = []int32{263, 767, 2657, 746, 265, 1868, 368, 288, 552, 1576, 1098, 336, 330, 2657, 1798, 301, 343, 767, 2657, 534, 428, 8, 428, 271}

// promptFor is a prompt of ordinary tokens for the model: real Go code for
// demo-go (so its MTP layer sees text like its training data), the usual
// deterministic ids for the random tiny models.
func promptFor(model string, n int) []int32 {
	if model == "demo-go" {
		return slices.Clone(goPrompt[:min(n, len(goPrompt))])
	}
	return prompt(n, 3)
}

// tableFrom is a block table of n consecutive blocks from first.
func tableFrom(first, n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(first + i)
	}
	return t
}

// genSpec describes one generation of the test's engine loop.
type genSpec struct {
	prompt []int32
	n      int   // tokens to generate
	chunk  int   // prefill chunk length (0: the whole prompt at once)
	k      int   // drafts per step (0: plain decoding, Draft never set)
	draft  bool  // with k = 0: still run the MTP layer (Draft set, no proposals)
	wrong  int64 // > 0: replace about a third of the drafts by random tokens (seeded)
	// oracle, when set, is fed as the drafts instead of the proposals (the
	// tokens plain decoding emits: drafts that are right unless corrupted).
	oracle []int32
	params engine.SamplingParams
}

type genStats struct {
	steps, proposed, accepted int
}

func (s genStats) String() string {
	return fmt.Sprintf("%d steps, %d/%d drafts accepted (%.3f), %.2f tokens per decode step",
		s.steps, s.accepted, s.proposed, float64(s.accepted)/float64(max(1, s.proposed)), float64(s.accepted+s.steps)/float64(max(1, s.steps)))
}

// seqState is one sequence of the test's engine loop: what the engine
// keeps between steps.
type seqState struct {
	id     uint64
	g      genSpec
	table  []int32
	done   int // prompt tokens prefilled
	out    []int32
	drafts []int32
	rng    *rand.Rand
	stats  genStats
}

func newSeq(id uint64, g genSpec, firstBlock int) *seqState {
	s := &seqState{id: id, g: g, table: tableFrom(firstBlock, (len(g.prompt)+g.n+g.k+cpu.DefaultKVBlockSize)/cpu.DefaultKVBlockSize+1)}
	if g.wrong > 0 {
		s.rng = rand.New(rand.NewPCG(uint64(g.wrong), 1))
	}
	return s
}

func (s *seqState) finished() bool { return len(s.out) >= s.g.n }

// next is the sequence's StepSeq for the coming step, as the engine builds
// it (docs/speculative.md, "What the engine does"): prefill chunks with
// NextToken, then the last token followed by the previous step's drafts.
func (s *seqState) next() engine.StepSeq {
	g := s.g
	spec := g.k > 0 || g.draft
	seq := engine.StepSeq{SeqID: s.id, BlockTable: s.table, Sampling: g.params, PromptTokens: g.prompt,
		OutputTokens: s.out, SampleIndex: len(s.out), Draft: spec, NextToken: -1}
	if s.done < len(g.prompt) {
		end := len(g.prompt)
		if g.chunk > 0 {
			end = min(end, s.done+g.chunk)
		}
		seq.Tokens, seq.StartPos = g.prompt[s.done:end], s.done
		if end < len(g.prompt) {
			seq.NextToken = g.prompt[end]
		} else {
			seq.Sample, seq.Propose = true, g.k
		}
		return seq
	}
	drafts := s.drafts
	if g.oracle != nil {
		drafts = make([]int32, len(s.drafts))
		for i := range drafts {
			if j := len(s.out) + i; j < len(g.oracle) {
				drafts[i] = g.oracle[j]
			}
		}
	}
	if s.rng != nil {
		// Wrong drafts anywhere in the list: rejections at every index,
		// and right drafts after wrong ones (which must not be accepted).
		drafts = slices.Clone(drafts)
		for i := range drafts {
			if s.rng.IntN(3) == 0 {
				drafts[i] = int32(s.rng.IntN(50))
			}
		}
	}
	seq.Tokens = append([]int32{s.out[len(s.out)-1]}, drafts...)
	seq.StartPos = len(g.prompt) + len(s.out) - 1
	seq.Sample, seq.Drafts, seq.Propose = true, len(drafts), g.k
	return seq
}

// apply takes the step's result for the StepSeq built by next.
func (s *seqState) apply(t *testing.T, seq engine.StepSeq, r engine.SeqResult) {
	t.Helper()
	if r.Err != nil {
		t.Fatalf("sequence %d: %v", s.id, r.Err)
	}
	if s.done < len(s.g.prompt) {
		s.done = seq.StartPos + len(seq.Tokens)
	}
	if !seq.Sample {
		if r.Token != 0 || r.Accepted != nil || r.Drafts != nil {
			t.Fatalf("sequence %d: non-final chunk returned %+v", s.id, r)
		}
		return
	}
	if seq.Drafts > 0 {
		s.stats.steps++
		s.stats.proposed += seq.Drafts
		s.stats.accepted += len(r.Accepted)
	}
	for j, a := range r.Accepted {
		if a.Token != seq.Tokens[1+j] {
			t.Fatalf("sequence %d: accepted token %d is not draft %d (%d)", s.id, a.Token, j, seq.Tokens[1+j])
		}
		s.out = append(s.out, a.Token)
	}
	s.out = append(s.out, r.Token)
	if len(r.Drafts) != seq.Propose {
		t.Fatalf("sequence %d: %d drafts proposed, asked for %d", s.id, len(r.Drafts), seq.Propose)
	}
	s.drafts = r.Drafts
}

// runSeqs drives the sequences to completion, all of them in each step
// while they last, and returns each one's first n tokens.
func runSeqs(t *testing.T, be *cpu.Backend, seqs ...*seqState) [][]int32 {
	t.Helper()
	for {
		var live []*seqState
		var batch []engine.StepSeq
		for _, s := range seqs {
			if !s.finished() {
				live = append(live, s)
				batch = append(batch, s.next())
			}
		}
		if len(batch) == 0 {
			break
		}
		res := step(t, be, batch...)
		for i, s := range live {
			s.apply(t, batch[i], res[i])
		}
	}
	out := make([][]int32, len(seqs))
	for i, s := range seqs {
		out[i] = s.out[:s.g.n]
	}
	return out
}

func generate(t *testing.T, be *cpu.Backend, g genSpec) ([]int32, genStats) {
	t.Helper()
	s := newSeq(1, g, 0)
	return runSeqs(t, be, s)[0], s.stats
}

// Greedy decoding with drafting on emits exactly the tokens of plain greedy
// decoding, on the exact and the FP8 path, for k = 1, 2, 3 drafts per step,
// with a chunked prefill, and with random drafts fed in place of the
// proposals (rejections roll back through the position counter alone).
func TestSpeculativeGreedyEqualsPlain(t *testing.T) {
	stats := map[string]genStats{}
	models, paths := mtpModels, []bool{false, true}
	if raceEnabled {
		// demo-go accepts and rejects (the tiny models only reject); the
		// FP8 path has the per-row attention schedules. The plain pass runs
		// the whole matrix.
		models, paths = []string{"demo-go"}, []bool{true}
	}
	for _, m := range models {
		for _, fp8 := range paths {
			name := m + "/" + variantName(cpu.Options{FP8Activations: fp8})
			t.Run(name, func(t *testing.T) {
				be := openTiny(t, m, cpu.Options{FP8Activations: fp8, DraftTokens: 3})
				p := promptFor(m, 24)
				const n = 22
				want, _ := generate(t, be, genSpec{prompt: p, n: n})
				chunked, _ := generate(t, be, genSpec{prompt: p, n: n, chunk: 10})
				if !slices.Equal(chunked, want) {
					t.Fatalf("plain decoding after a chunked prefill %v, one-shot %v", chunked, want)
				}
				for _, g := range []struct {
					name string
					g    genSpec
				}{
					{"k=1", genSpec{k: 1}},
					{"k=2 chunked prefill", genSpec{k: 2, chunk: 7}},
					{"k=3", genSpec{k: 3}},
					{"k=3 wrong drafts", genSpec{k: 3, wrong: 5}},
					{"k=3 corrupted right drafts", genSpec{k: 3, wrong: 6, oracle: want}},
					{"draft pass without proposals", genSpec{draft: true}},
				} {
					gs := g.g
					gs.prompt, gs.n = p, n
					got, st := generate(t, be, gs)
					if !slices.Equal(got, want) {
						t.Errorf("%s: tokens\n%v\nplain greedy\n%v", g.name, got, want)
					}
					if gs.k > 0 && st.proposed == 0 {
						t.Errorf("%s: no draft was verified", g.name)
					}
					t.Logf("%s: %v", g.name, st)
					stats[name+" "+g.name] = st
				}
			})
		}
	}
	// The trained MTP layer drafts well: most single drafts are accepted
	// (the random tiny models accept a few by chance).
	for _, fp8 := range []string{"exact", "fp8"} {
		if st, ok := stats["demo-go/"+fp8+" k=1"]; ok {
			if rate := float64(st.accepted) / float64(st.proposed); rate < 0.3 {
				t.Errorf("demo-go %s k=1: acceptance %.3f, want > 0.3 (%v)", fp8, rate, st)
			}
		}
	}
}

// The plain path of a backend that loaded the MTP layer computes exactly
// what a backend without it computes.
func TestDraftTokensLeavePlainPathAlone(t *testing.T) {
	for _, fp8 := range []bool{false, true} {
		off := openTiny(t, "tiny-bf16g", cpu.Options{FP8Activations: fp8})
		on := openTiny(t, "tiny-bf16g", cpu.Options{FP8Activations: fp8, DraftTokens: 2})
		if off.Info().MaxDraftTokens != 0 || on.Info().MaxDraftTokens != 2 {
			t.Fatalf("MaxDraftTokens %d and %d, want 0 and 2", off.Info().MaxDraftTokens, on.Info().MaxDraftTokens)
		}
		p := prompt(21, 9)
		seq := engine.StepSeq{SeqID: 1, Tokens: p, BlockTable: blocks(3, 4), WantLogits: true}
		sameLogits(t, "prefill logits with DraftTokens", step(t, on, seq)[0].Logits, step(t, off, seq)[0].Logits)
		seq = engine.StepSeq{SeqID: 1, Tokens: []int32{7}, StartPos: 21, BlockTable: blocks(3, 4), WantLogits: true}
		sameLogits(t, "decode logits with DraftTokens", step(t, on, seq)[0].Logits, step(t, off, seq)[0].Logits)
	}
}

// Sequences that speculate, decode plainly and prefill share steps without
// changing each other's tokens or drafts.
func TestSpeculativeMixedBatch(t *testing.T) {
	paths := []bool{false, true}
	if raceEnabled {
		paths = paths[1:] // the FP8 path: per-row attention schedules
	}
	for _, fp8 := range paths {
		be := openTiny(t, "demo-go", cpu.Options{FP8Activations: fp8, DraftTokens: 3})
		specs := []genSpec{
			{prompt: promptFor("demo-go", 24), n: 14, k: 3},
			{prompt: promptFor("demo-go", 17), n: 8},                  // plain
			{prompt: prompt(30, 4), n: 8, k: 2, chunk: 9},             // long chunked prefill
			{prompt: promptFor("demo-go", 9), n: 10, k: 1, wrong: 3},  // random drafts
			{prompt: promptFor("demo-go", 20), n: 8, k: 2, chunk: 16}, // two chunks
		}
		var alone [][]int32
		for _, g := range specs {
			out, _ := generate(t, be, g)
			alone = append(alone, out)
		}
		var seqs []*seqState
		next := 0
		for i, g := range specs {
			s := newSeq(uint64(10+i), g, next)
			next += len(s.table)
			seqs = append(seqs, s)
		}
		together := runSeqs(t, be, seqs...)
		for i := range specs {
			if !slices.Equal(together[i], alone[i]) {
				t.Errorf("fp8 %v: sequence %d in a mixed batch\n%v\nalone\n%v", fp8, i, together[i], alone[i])
			}
		}
	}
}

// Sampling through the speculative path: a fixed seed gives the same valid
// tokens twice, accepted drafts carry logprobs, and the emitted tokens
// follow the target distribution (pkg/sample's statistical tests cover the
// rule itself).
func TestSpeculativeSampling(t *testing.T) {
	be := openTiny(t, "demo-go", cpu.Options{DraftTokens: 2})
	params := engine.SamplingParams{Temperature: 0.8, TopP: 0.95, Seed: 1234, HasSeed: true, Logprobs: true, TopLogprobs: 2}
	g := genSpec{prompt: goPrompt, n: 24, k: 2, params: params}
	a, st := generate(t, be, g)
	b, _ := generate(t, be, g)
	if !slices.Equal(a, b) {
		t.Fatalf("same seed, different tokens:\n%v\n%v", a, b)
	}
	for _, tok := range a {
		if tok < 0 || int(tok) >= be.Info().VocabSize {
			t.Fatalf("token %d outside the vocabulary", tok)
		}
	}
	t.Logf("sampling at temperature 0.8: %v", st)
	if st.accepted == 0 {
		t.Errorf("no draft accepted while sampling demo-go (%v)", st)
	}
	// One verify step by hand: its accepted drafts have logprobs.
	s := newSeq(1, g, 20)
	for s.done < len(goPrompt) || len(s.drafts) == 0 {
		seq := s.next()
		s.apply(t, seq, step(t, be, seq)[0])
	}
	for range 10 {
		seq := s.next()
		r := step(t, be, seq)[0]
		for _, acc := range r.Accepted {
			if !(acc.Logprob < 0) || len(acc.TopLogprobs) != 2 {
				t.Fatalf("accepted token without logprobs: %+v", acc)
			}
		}
		if !(r.Logprob <= 0) || len(r.TopLogprobs) != 2 {
			t.Fatalf("token without logprobs: %+v", r)
		}
		s.apply(t, seq, r)
	}
}

// mtpGolden is testdata/models/<model>.mtp.golden.json
// (scripts/make_mtp_golden.py).
type mtpGolden struct {
	Model     string  `json:"model"`
	Reference string  `json:"reference"`
	ProbeIDs  []int32 `json:"probe_ids"`
	Cases     []struct {
		TokenIDs  []int32 `json:"token_ids"`
		Positions []struct {
			Argmax int32     `json:"argmax"`
			Margin float64   `json:"margin"`
			LSE    float64   `json:"lse"`
			L2     float64   `json:"l2"`
			MaxAbs float64   `json:"max_abs"`
			Proj   float64   `json:"proj"`
			IDs    []int32   `json:"ids"`
			Logits []float64 `json:"logits"`
		} `json:"positions"`
	} `json:"cases"`
}

// draftLogits prefills ids (in chunks of chunk tokens, 0: at once) with
// Draft set and returns the MTP layer's draft logits by position.
func draftLogits(t *testing.T, be *cpu.Backend, id uint64, ids []int32, chunk int, table []int32) map[int][]float32 {
	t.Helper()
	got := map[int][]float32{}
	cpu.SetMTPHook(be, func(seq uint64, pos int, logits []float32) {
		if seq != id {
			t.Errorf("hook called for sequence %d, want %d", seq, id)
		}
		if _, dup := got[pos]; dup {
			t.Errorf("position %d drafted twice", pos)
		}
		got[pos] = slices.Clone(logits)
	})
	defer cpu.SetMTPHook(be, nil)
	if chunk == 0 {
		chunk = len(ids)
	}
	for s := 0; s < len(ids); s += chunk {
		e := min(len(ids), s+chunk)
		next := int32(-1)
		if e < len(ids) {
			next = ids[e]
		}
		step(t, be, engine.StepSeq{SeqID: id, Tokens: ids[s:e], StartPos: s, BlockTable: table, Draft: true, NextToken: next})
	}
	return got
}

// projWeight is the golden file's projection r(v).
func projWeight(v int) float64 {
	return float64((uint64(v)*2654435761)%(1<<32))/(1<<32) - 0.5
}

// TestMTPGolden compares the exact path's MTP draft logits with the float64
// numpy reference (scripts/make_mtp_golden.py): at every position i of each
// case, the draft logits from (h_i, t_{i+1}). Logit values within 1e-4 of
// the row's scale, greedy draft equal wherever the reference margin exceeds
// 1e-3. A chunked prefill (NextToken at chunk ends) gives the same logits
// bit for bit.
func TestMTPGolden(t *testing.T) {
	for _, m := range mtpModels {
		t.Run(m, func(t *testing.T) {
			path := filepath.Join(modelsDir, m+".mtp.golden.json")
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var gf mtpGolden
			if err := json.Unmarshal(raw, &gf); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if gf.Model != m || len(gf.Cases) == 0 {
				t.Fatalf("%s: model %q with %d cases", path, gf.Model, len(gf.Cases))
			}
			be := openTiny(t, m, cpu.Options{DraftTokens: 1})
			worst := 0.0
			for ci, c := range gf.Cases {
				got := draftLogits(t, be, uint64(ci+1), c.TokenIDs, 0, tableFrom(0, 4))
				if len(got) != len(c.Positions) {
					t.Fatalf("case %d: %d drafted positions, golden has %d", ci, len(got), len(c.Positions))
				}
				for i, ref := range c.Positions {
					row := got[i]
					if row == nil {
						t.Fatalf("case %d: position %d not drafted", ci, i)
					}
					tol := 1e-4 * math.Max(1, ref.MaxAbs)
					check := func(what string, g, w, tol float64) {
						t.Helper()
						d := math.Abs(g - w)
						worst = math.Max(worst, d/math.Max(1, ref.MaxAbs))
						if !(d <= tol) {
							t.Errorf("case %d position %d: %s %.6g, reference %.6g (tolerance %.2g)", ci, i, what, g, w, tol)
						}
					}
					for j, id := range ref.IDs {
						check(fmt.Sprintf("logit[%d]", id), float64(row[id]), ref.Logits[j], tol)
					}
					var l2, proj, mx float64
					for v, x := range row {
						l2 += float64(x) * float64(x)
						proj += float64(x) * projWeight(v)
						mx = math.Max(mx, float64(x))
					}
					var se float64
					for _, x := range row {
						se += math.Exp(float64(x) - mx)
					}
					check("l2", math.Sqrt(l2), ref.L2, 1e-4*ref.L2)
					check("lse", mx+math.Log(se), ref.LSE, tol)
					check("projection", proj, ref.Proj, 1e-4*ref.L2*math.Sqrt(float64(len(row))/12))
					if best := slices.Index(row, slices.Max(row)); int32(best) != ref.Argmax && ref.Margin > 1e-3 {
						t.Errorf("case %d position %d: greedy draft %d, reference %d (margin %.3g)", ci, i, best, ref.Argmax, ref.Margin)
					}
				}
			}
			t.Logf("%s: %d cases, worst logit error %.2e of the row scale", m, len(gf.Cases), worst)
			// The longest case again, prefilled in chunks across blocks.
			c := gf.Cases[len(gf.Cases)-1]
			whole := draftLogits(t, be, 100, c.TokenIDs, 0, tableFrom(10, 4))
			chunked := draftLogits(t, be, 101, c.TokenIDs, 11, tableFrom(20, 4))
			for i := range len(c.TokenIDs) - 1 {
				sameLogits(t, fmt.Sprintf("draft logits at position %d, chunked prefill", i), chunked[i], whole[i])
			}
		})
	}
}

func TestSpeculativeRejectsBadSeqs(t *testing.T) {
	be := openTiny(t, "tiny-f32", cpu.Options{NumKVBlocks: 8, DraftTokens: 2})
	plain := openTiny(t, "tiny-f32", cpu.Options{NumKVBlocks: 8})
	ok := func() engine.StepSeq {
		return engine.StepSeq{SeqID: 5, Tokens: []int32{1, 2, 3}, BlockTable: blocks(0), Draft: true, Sample: true, Drafts: 2, Propose: 2, NextToken: -1}
	}
	with := func(f func(*engine.StepSeq)) *engine.StepBatch {
		s := ok()
		f(&s)
		return &engine.StepBatch{Seqs: []engine.StepSeq{s}}
	}
	tests := []struct {
		name  string
		be    *cpu.Backend
		batch *engine.StepBatch
		want  string
	}{
		{"draft without MTP", plain, with(func(s *engine.StepSeq) {}), "sequence 5: Draft set, but the backend runs no draft model"},
		{"NextToken beyond vocab", be, with(func(s *engine.StepSeq) { s.NextToken = 1040 }), "sequence 5: NextToken 1040 is outside the vocabulary"},
		{"NextToken below -1", be, with(func(s *engine.StepSeq) { s.NextToken = -2 }), "NextToken -2"},
		{"NextToken on a plain seq", plain, &engine.StepBatch{Seqs: []engine.StepSeq{{SeqID: 5, Tokens: []int32{1}, BlockTable: blocks(0), NextToken: 5000}}}, "NextToken 5000"},
		{"negative drafts", be, with(func(s *engine.StepSeq) { s.Drafts = -1 }), "Drafts -1 and Propose 2 must be >= 0"},
		{"drafts without Draft", be, with(func(s *engine.StepSeq) { s.Draft = false }), "sequence 5: Drafts 2 / Propose 2 without Draft set"},
		{"drafts without Sample", be, with(func(s *engine.StepSeq) { s.Sample, s.Propose = false, 0 }), "sequence 5: Drafts 2 without Sample"},
		{"too many drafts", be, with(func(s *engine.StepSeq) { s.Tokens = []int32{1, 2, 3, 4}; s.Drafts = 3 }), "sequence 5: Drafts 3 exceeds MaxDraftTokens 2"},
		{"drafts fill the tokens", be, with(func(s *engine.StepSeq) { s.Tokens = []int32{1, 2} }), "sequence 5: Drafts 2 with only 2 tokens"},
		{"propose without Sample", be, with(func(s *engine.StepSeq) { s.Sample, s.Drafts = false, 0 }), "sequence 5: Propose 2 without Sample"},
		{"too many proposals", be, with(func(s *engine.StepSeq) { s.Propose = 3 }), "sequence 5: Propose 3 exceeds MaxDraftTokens 2"},
		{"draft with a token mask", be, with(func(s *engine.StepSeq) { s.AllowedTokens = make([]uint32, engine.MaskWords(1040)) }), "sequence 5: Draft set together with AllowedTokens"},
		{"draft with logits", be, with(func(s *engine.StepSeq) { s.WantLogits = true }), "sequence 5: Draft set together with WantLogits"},
		{"chained positions past the table", be, with(func(s *engine.StepSeq) { s.StartPos = 13 }), "sequence 5: block table has 1 blocks, Propose 2 writes the MTP cache up to position 16 and needs 2"},
		{"chained positions in another sequence's slots", be, &engine.StepBatch{Seqs: []engine.StepSeq{
			{SeqID: 5, Tokens: []int32{1, 2, 3}, BlockTable: blocks(0), Draft: true, Sample: true, Drafts: 1, Propose: 2},
			{SeqID: 6, Tokens: []int32{4}, StartPos: 3, BlockTable: blocks(0)},
		}}, "sequences 5 and 6 both write KV block 0 slot 3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := tt.be.Step(context.Background(), tt.batch)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want it to mention %q", err, tt.want)
			}
			if out != nil {
				t.Errorf("results %v with an error", out)
			}
		})
	}
	// Still works afterwards, and a valid speculating step returns its
	// proposals.
	r := step(t, be, ok())[0]
	if len(r.Drafts) != 2 || len(r.Accepted) > 2 {
		t.Fatalf("valid step: %+v", r)
	}
}

// A checkpoint without the MTP layer opens without drafting and is refused
// with it, naming the config field or the missing tensor.
func TestOpenDraftTokensNeedsMTP(t *testing.T) {
	src := filepath.Join(modelsDir, "tiny-f32")
	// num_nextn_predict_layers = 0 (the layer's tensors then are extras).
	noMTP := t.TempDir()
	linkCheckpoint(t, src, noMTP, func(cfg map[string]any) { cfg["num_nextn_predict_layers"] = 0 })
	be, err := cpu.Open(noMTP, cpu.Options{NumKVBlocks: 4})
	if err != nil {
		t.Fatalf("plain open without an MTP layer: %v", err)
	}
	be.Close()
	if _, err := cpu.Open(noMTP, cpu.Options{NumKVBlocks: 4, DraftTokens: 1}); err == nil || !strings.Contains(err.Error(), "num_nextn_predict_layers = 0") {
		t.Errorf("DraftTokens without an MTP layer: err %v", err)
	}
	if _, err := cpu.Open(src, cpu.Options{DraftTokens: -1}); err == nil || !strings.Contains(err.Error(), "DraftTokens -1 must be >= 0") {
		t.Errorf("negative DraftTokens: err %v", err)
	}
	// The MTP layer's eh_proj missing: plain inference does not care.
	noEH := t.TempDir()
	copyWithout(t, src, noEH, "model.layers.3.eh_proj.weight")
	be, err = cpu.Open(noEH, cpu.Options{NumKVBlocks: 4})
	if err != nil {
		t.Fatalf("plain open without eh_proj: %v", err)
	}
	be.Close()
	_, err = cpu.Open(noEH, cpu.Options{NumKVBlocks: 4, DraftTokens: 1})
	if err == nil || !strings.Contains(err.Error(), "model.layers.3.eh_proj.weight: missing") || !strings.Contains(err.Error(), "MTP layer") {
		t.Errorf("DraftTokens without eh_proj: err %v", err)
	}
	// The MTP layer's own embedding and head are never read: a checkpoint
	// without them drafts.
	noHead := t.TempDir()
	copyWithout(t, src, noHead, "model.layers.3.embed_tokens.weight", "model.layers.3.shared_head.head.weight", "model.layers.3.shared_head.head.weight_scale")
	be, err = cpu.Open(noHead, cpu.Options{NumKVBlocks: 4, DraftTokens: 1})
	if err != nil {
		t.Fatalf("open without the MTP layer's embedding and head: %v", err)
	}
	be.Close()
}
