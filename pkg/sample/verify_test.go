package sample

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/glmctl/glmctl/pkg/engine"
)

// rowsOf concatenates logits rows, as a backend hands them to Verify.
func rowsOf(rows ...[]float32) []float32 {
	var out []float32
	for _, r := range rows {
		out = append(out, r...)
	}
	return out
}

// peak is a 6-token row whose argmax is tok by a margin of 2.
func peak(tok int) []float32 {
	r := []float32{0, 0.5, 0.25, 0.75, 0.1, 0.3}
	r[tok] = 3
	return r
}

// plainGreedy is the sequential reference: what plain decoding emits when
// it is fed the drafts as long as they match, then stops at the first token
// that differs (or after the token following the last draft).
func plainGreedy(t *testing.T, logits []float32, drafts []int32, p engine.SamplingParams, h History) []int32 {
	t.Helper()
	V := len(logits) / (len(drafts) + 1)
	out := slices.Clone(h.OutputTokens)
	var emitted []int32
	for j := 0; j <= len(drafts); j++ {
		r, err := Sample(logits[j*V:(j+1)*V], p, History{PromptTokens: h.PromptTokens, OutputTokens: out, SampleIndex: h.SampleIndex + j})
		if err != nil {
			t.Fatal(err)
		}
		emitted = append(emitted, r.Token)
		if j == len(drafts) || r.Token != drafts[j] {
			break
		}
		out = append(out, r.Token)
	}
	return emitted
}

func emittedTokens(v Verified) []int32 {
	var out []int32
	for _, a := range v.Accepted {
		out = append(out, a.Token)
	}
	return append(out, v.Next.Token)
}

func TestVerifyGreedy(t *testing.T) {
	// Row 1 of the penalty cases prefers token 2 by 0.5 over token 3, so a
	// presence penalty of 1 on an accepted draft 2 flips it to 3, and a
	// repetition penalty on a prompt token does the same at row 0.
	close2 := []float32{0, 0, 2, 1.5, 0, 0}
	cases := []struct {
		name     string
		rows     [][]float32
		drafts   []int32
		p        engine.SamplingParams
		h        History
		accepted []int32
		next     int32
	}{
		{"all accepted", [][]float32{peak(2), peak(4), peak(1)}, []int32{2, 4}, engine.SamplingParams{}, History{}, []int32{2, 4}, 1},
		{"reject at 0", [][]float32{peak(3), peak(4), peak(1)}, []int32{2, 4}, engine.SamplingParams{}, History{}, nil, 3},
		{"reject mid", [][]float32{peak(2), peak(5), peak(1)}, []int32{2, 4}, engine.SamplingParams{}, History{}, []int32{2}, 5},
		{"reject last", [][]float32{peak(2), peak(4), peak(0), peak(1)}, []int32{2, 4, 5}, engine.SamplingParams{}, History{}, []int32{2, 4}, 0},
		{"one draft accepted", [][]float32{peak(0), peak(0)}, []int32{0}, engine.SamplingParams{}, History{}, []int32{0}, 0},
		{"accepted draft penalised at the next row", [][]float32{peak(2), close2, peak(1)}, []int32{2, 2},
			engine.SamplingParams{PresencePenalty: 1}, History{}, []int32{2}, 3},
		{"unpenalised accepted draft repeats", [][]float32{peak(2), close2, peak(1)}, []int32{2, 2},
			engine.SamplingParams{}, History{}, []int32{2, 2}, 1},
		{"output history penalises row 0", [][]float32{close2, peak(4), peak(1)}, []int32{2, 4},
			engine.SamplingParams{FrequencyPenalty: 0.3}, History{OutputTokens: []int32{2, 2}}, nil, 3},
		{"repetition penalty from the prompt", [][]float32{close2, peak(4), peak(1)}, []int32{3, 4},
			engine.SamplingParams{RepetitionPenalty: 2}, History{PromptTokens: []int32{2}}, []int32{3, 4}, 1},
		{"draft accepted on a tie (lowest id wins)", [][]float32{{1, 1, 0, 0, 0, 0}, peak(1)}, []int32{0}, engine.SamplingParams{}, History{}, []int32{0}, 1},
		{"draft rejected on a tie it loses", [][]float32{{1, 1, 0, 0, 0, 0}, peak(1)}, []int32{1}, engine.SamplingParams{}, History{}, nil, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var s Sampler
			logits := rowsOf(tc.rows...)
			v, err := s.Verify(logits, tc.drafts, tc.p, tc.h)
			if err != nil {
				t.Fatal(err)
			}
			var acc []int32
			for _, a := range v.Accepted {
				acc = append(acc, a.Token)
			}
			if !slices.Equal(acc, tc.accepted) || v.Next.Token != tc.next {
				t.Fatalf("accepted %v next %d, want %v next %d", acc, v.Next.Token, tc.accepted, tc.next)
			}
			if want := plainGreedy(t, logits, tc.drafts, tc.p, tc.h); !slices.Equal(emittedTokens(v), want) {
				t.Fatalf("emitted %v, plain greedy decoding emits %v", emittedTokens(v), want)
			}
		})
	}
}

// Greedy verification emits what plain greedy decoding emits, on random
// rows and drafts that are right about half the time.
func TestVerifyGreedyMatchesPlainDecoding(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	var s Sampler
	for it := range 300 {
		D := 1 + r.IntN(4)
		V := 5 + r.IntN(20)
		rows := make([][]float32, D+1)
		drafts := make([]int32, D)
		for j := range rows {
			rows[j] = randomLogits(r, V)
		}
		p := engine.SamplingParams{PresencePenalty: float32(r.IntN(2)), RepetitionPenalty: 1 + float32(r.IntN(2))}
		h := History{OutputTokens: []int32{int32(r.IntN(V))}, PromptTokens: []int32{int32(r.IntN(V))}, SampleIndex: r.IntN(100)}
		// Drafts from the plain path, with one corrupted at random.
		logits := rowsOf(rows...)
		out := slices.Clone(h.OutputTokens)
		for j := range drafts {
			res, err := Sample(rows[j], p, History{PromptTokens: h.PromptTokens, OutputTokens: out})
			if err != nil {
				t.Fatal(err)
			}
			drafts[j] = res.Token
			if r.IntN(2*D) == 0 {
				drafts[j] = int32(r.IntN(V))
			}
			out = append(out, drafts[j])
		}
		v, err := s.Verify(logits, drafts, p, h)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := emittedTokens(v), plainGreedy(t, logits, drafts, p, h); !slices.Equal(got, want) {
			t.Fatalf("iteration %d: emitted %v, plain decoding %v (drafts %v)", it, got, want, drafts)
		}
	}
}

func TestVerifyLogprobs(t *testing.T) {
	rows := [][]float32{peak(2), peak(4), {0.1, 0.2, 0.3, 0.4, 0.5, 2}}
	logits := rowsOf(rows...)
	rawLP := func(row []float32, tok int32) float32 {
		z := 0.0
		for _, l := range row {
			z += math.Exp(float64(l))
		}
		return float32(float64(row[tok]) - math.Log(z))
	}
	for _, p := range []engine.SamplingParams{
		{Logprobs: true, TopLogprobs: 2, PresencePenalty: 1.5},
		{Temperature: 0.7, Logprobs: true, TopLogprobs: 2, Seed: 5, HasSeed: true},
	} {
		var s Sampler
		v, err := s.Verify(logits, []int32{2, 4}, p, History{})
		if err != nil {
			t.Fatal(err)
		}
		got := emittedTokens(v)
		all := append(slices.Clone(v.Accepted), v.Next)
		for j, r := range all {
			if want := rawLP(rows[j], got[j]); math.Abs(float64(r.Logprob-want)) > 1e-6 {
				t.Errorf("%+v: position %d token %d logprob %v, want raw %v", p, j, got[j], r.Logprob, want)
			}
			if len(r.TopLogprobs) != 2 {
				t.Fatalf("%+v: position %d: top logprobs %v, want 2", p, j, r.TopLogprobs)
			}
			// Each row's best raw logit comes first.
			best := int32(argmax(func() []float64 {
				f := make([]float64, len(rows[j]))
				for i, x := range rows[j] {
					f[i] = float64(x)
				}
				return f
			}()))
			if r.TopLogprobs[0].Token != best {
				t.Errorf("%+v: position %d: top logprob token %d, want %d", p, j, r.TopLogprobs[0].Token, best)
			}
		}
	}
	// No logprobs asked: none computed for accepted drafts either.
	var s Sampler
	v, err := s.Verify(logits, []int32{2, 4}, engine.SamplingParams{}, History{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range v.Accepted {
		if a.Logprob != 0 || a.TopLogprobs != nil {
			t.Fatalf("logprobs without being asked: %+v", a)
		}
	}
}

func TestVerifyErrors(t *testing.T) {
	nan := float32(math.NaN())
	bad := []float32{0, nan, 0, 0, 0, 0}
	for _, greedy := range []bool{true, false} {
		p := engine.SamplingParams{Seed: 3}
		if !greedy {
			p.Temperature = 1
		}
		var s Sampler
		// A non-finite row the rule reads fails the sequence.
		_, err := s.Verify(rowsOf(peak(2), bad), []int32{2}, engine.SamplingParams{}, History{})
		if !errors.Is(err, engine.ErrNonFiniteLogits) || !strings.Contains(err.Error(), "verify position 1") {
			t.Fatalf("greedy %v: err = %v, want ErrNonFiniteLogits at position 1", greedy, err)
		}
		_, err = s.Verify(rowsOf(bad, peak(2)), []int32{2}, p, History{})
		if !errors.Is(err, engine.ErrNonFiniteLogits) {
			t.Fatalf("greedy %v: err = %v, want ErrNonFiniteLogits", greedy, err)
		}
	}
	// A row after the first rejection is never read.
	var s Sampler
	v, err := s.Verify(rowsOf(peak(3), bad), []int32{2}, engine.SamplingParams{}, History{})
	if err != nil || v.Next.Token != 3 {
		t.Fatalf("got %+v, %v; want token 3 without reading the rejected context's row", v, err)
	}
	for _, tc := range []struct {
		name   string
		logits []float32
		drafts []int32
		h      History
		want   string
	}{
		{"rows", make([]float32, 13), []int32{1}, History{}, "13 logits do not split into 2 rows"},
		{"draft range", rowsOf(peak(1), peak(1)), []int32{6}, History{}, "draft 6 (index 0) is outside the vocabulary"},
		{"mask", rowsOf(peak(1), peak(1)), []int32{1}, History{Allowed: maskOf(6, 1)}, "token mask"},
	} {
		if _, err := s.Verify(tc.logits, tc.drafts, engine.SamplingParams{}, tc.h); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestForVerifyStep(t *testing.T) {
	var s Sampler
	seq := &engine.StepSeq{SeqID: 4, Tokens: []int32{1, 2, 4}, Drafts: 2, Sampling: engine.SamplingParams{Logprobs: true}}
	res, err := s.ForVerifyStep(rowsOf(peak(2), peak(4), peak(5)), seq)
	if err != nil {
		t.Fatal(err)
	}
	if res.SeqID != 4 || res.Token != 5 || len(res.Accepted) != 2 || res.Accepted[0].Token != 2 || res.Accepted[1].Token != 4 {
		t.Fatalf("got %+v", res)
	}
	if res.Accepted[0].Logprob >= 0 || res.Logprob >= 0 {
		t.Fatalf("logprobs not filled: %+v", res)
	}
	// No drafts: exactly ForStep.
	seq = &engine.StepSeq{SeqID: 5, Tokens: []int32{1}, Sampling: engine.SamplingParams{Temperature: 1, Seed: 9, TopLogprobs: 2}, SampleIndex: 7}
	row := []float32{0.3, 0.1, 0.2, 0.5, 0.4, 0}
	a, err := s.ForVerifyStep(row, seq)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.ForStep(row, seq)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatalf("ForVerifyStep without drafts %+v, ForStep %+v", a, b)
	}
	seq = &engine.StepSeq{SeqID: 6, Tokens: []int32{1}, Drafts: 1}
	if _, err := s.ForVerifyStep(rowsOf(peak(1), peak(1)), seq); err == nil || !strings.Contains(err.Error(), "sequence 6") {
		t.Fatalf("err = %v, want one naming sequence 6", err)
	}
}

func TestAcceptUniform(t *testing.T) {
	if got, want := AcceptUniform(42, 7), Uniform(int64(uint64(42)^0x5851F42D4C957F2D), 7); got != want {
		t.Fatalf("AcceptUniform(42, 7) = %v, want %v", got, want)
	}
	// Domain separation: the acceptance draw is not the sampling draw.
	same := 0
	for i := range 1000 {
		u, a := Uniform(int64(i), i), AcceptUniform(int64(i), i)
		if a < 0 || a >= 1 {
			t.Fatalf("AcceptUniform(%d, %d) = %v outside [0, 1)", i, i, a)
		}
		if u == a {
			same++
		}
	}
	if same != 0 {
		t.Fatalf("%d of 1000 acceptance uniforms equal the sampling uniform", same)
	}
}

// ---------------------------------------------------------------- statistics

// rule emits the tokens of one speculative step for one seed: the accepted
// drafts followed by the next token.
type rule func(t *testing.T, logits []float32, drafts []int32, p engine.SamplingParams, h History) []int32

func correctRule(t *testing.T, logits []float32, drafts []int32, p engine.SamplingParams, h History) []int32 {
	var s Sampler
	v, err := s.Verify(logits, drafts, p, h)
	if err != nil {
		t.Fatal(err)
	}
	return emittedTokens(v)
}

// wrongRule builds a deliberately wrong verifier from the row distributions
// (the negative controls): accept decides acceptance from (p[d], u_accept),
// and resample draws the replacement from (p, d, u_draw, u_accept).
func wrongRule(accept func(pd, u float64) bool, resample func(dist []float64, d int32, u, ua float64) int32) rule {
	return func(t *testing.T, logits []float32, drafts []int32, p engine.SamplingParams, h History) []int32 {
		V := len(logits) / (len(drafts) + 1)
		out := slices.Clone(h.OutputTokens)
		var emitted []int32
		for j := 0; ; j++ {
			dist, err := Distribution(logits[j*V:(j+1)*V], p, History{PromptTokens: h.PromptTokens, OutputTokens: out})
			if err != nil {
				t.Fatal(err)
			}
			u, ua := Uniform(p.Seed, h.SampleIndex+j), AcceptUniform(p.Seed, h.SampleIndex+j)
			if j == len(drafts) {
				return append(emitted, drawInverseCDF(dist, 1, u))
			}
			d := drafts[j]
			if !accept(dist[d], ua) {
				return append(emitted, resample(dist, d, u, ua))
			}
			emitted = append(emitted, d)
			out = append(out, d)
		}
	}
}

var (
	// Accepts every draft.
	acceptAlways = wrongRule(func(float64, float64) bool { return true }, nil)
	// Resamples from p itself, the draft included.
	resampleWithDraft = wrongRule(func(pd, u float64) bool { return u < pd },
		func(dist []float64, _ int32, u, _ float64) int32 { return drawInverseCDF(dist, 1, u) })
	// Reuses the acceptance uniform for the replacement draw (after a
	// rejection it is known to be >= p[d]: correlated).
	reuseUniform = wrongRule(func(pd, u float64) bool { return u < pd },
		func(dist []float64, d int32, _, ua float64) int32 {
			w := slices.Clone(dist)
			w[d] = 0
			total := 0.0
			for _, x := range w {
				total += x
			}
			return drawInverseCDF(w, total, ua)
		})
)

// specCase is a speculative step whose emitted tokens' joint distribution is
// known exactly from the rows.
type specCase struct {
	name   string
	rows   [][]float32
	drafts []int32
	p      engine.SamplingParams
	h      History
}

func specCases() []specCase {
	// Target distributions of moderate entropy over 6 tokens; presence
	// penalties make each row's distribution depend on the accepted drafts.
	r0 := []float32{1.2, 0.1, -0.6, 0.8, 0.4, -0.2} // token 2 unlikely, 0 likely
	r1 := []float32{0.2, 1.5, 0.3, -0.4, 0.9, 0.0}  // token 1 likely
	r2 := []float32{0.5, 0.5, 0.0, 1.0, -0.5, 0.3}
	return []specCase{
		{"low then high", [][]float32{r0, r1, r2}, []int32{2, 1}, engine.SamplingParams{Temperature: 1}, History{}},
		{"high then low", [][]float32{r0, r1, r2}, []int32{0, 3}, engine.SamplingParams{Temperature: 0.8, PresencePenalty: 0.7}, History{OutputTokens: []int32{1}, SampleIndex: 17}},
		{"filtered draft", [][]float32{r0, r1, r2}, []int32{5, 1}, engine.SamplingParams{Temperature: 1.3, TopK: 4}, History{SampleIndex: 3}},
		{"top-p and repetition", [][]float32{r1, r2, r0}, []int32{1, 3}, engine.SamplingParams{Temperature: 1, TopP: 0.9, RepetitionPenalty: 1.5}, History{PromptTokens: []int32{3}}},
		{"one draft", [][]float32{r2, r0}, []int32{4}, engine.SamplingParams{Temperature: 1.1, FrequencyPenalty: 0.5}, History{OutputTokens: []int32{4, 4}}},
	}
}

// jointDistribution is the exact distribution of the emitted token
// sequences under plain sampling, keyed by the sequence: the first token
// x1 ~ p0; while x_j equals draft j the step goes on with row j and that
// draft in the history; it stops at the first token that differs from its
// draft, or after the last row.
func jointDistribution(t *testing.T, c specCase) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	var walk func(j int, prefix []int32, prob float64)
	walk = func(j int, prefix []int32, prob float64) {
		hist := append(slices.Clone(c.h.OutputTokens), prefix...)
		dist, err := Distribution(c.rows[j], c.p, History{PromptTokens: c.h.PromptTokens, OutputTokens: hist})
		if err != nil {
			t.Fatal(err)
		}
		for x, px := range dist {
			seq := append(slices.Clone(prefix), int32(x))
			if j < len(c.drafts) && int32(x) == c.drafts[j] {
				walk(j+1, seq, prob*px)
				continue
			}
			out[seqKey(seq, len(seq))] += prob * px
		}
	}
	walk(0, nil, 1)
	return out
}

// seqKey names the first n emitted tokens of seq; a sequence shorter than
// n ends in "end" (no further token emitted this step).
func seqKey(seq []int32, n int) string {
	if len(seq) >= n {
		return fmt.Sprint(seq[:n])
	}
	return fmt.Sprint(seq) + " end"
}

// marginal maps a distribution or a count table over full sequences to
// one over their first n tokens.
func marginal[T int | float64](full map[string]T, seqs map[string][]int32, n int) map[string]T {
	out := map[string]T{}
	for k, v := range full {
		out[seqKey(seqs[k], n)] += v
	}
	return out
}

// chiSquare compares observed counts with expected probabilities over n
// draws. Categories expected fewer than 20 times are pooled. It returns
// the upper tail probability of the statistic and, when a category of
// probability 0 was observed, a description of it (the test then fails
// regardless of the statistic).
func chiSquare(n int, obs map[string]int, want map[string]float64) (stat float64, df int, pval float64, impossible string) {
	for k, o := range obs {
		if want[k] == 0 && o > 0 {
			impossible = fmt.Sprintf("impossible %s observed %d times", k, o)
		}
	}
	var poolE float64
	var poolO, bins int
	for k, p := range want {
		e := p * float64(n)
		if e == 0 {
			continue
		}
		if e < 20 {
			poolE += e
			poolO += obs[k]
			continue
		}
		d := float64(obs[k]) - e
		stat += d * d / e
		bins++
	}
	if poolE > 0 {
		d := float64(poolO) - poolE
		stat += d * d / poolE
		bins++
	}
	df = bins - 1
	return stat, df, chiSquareSF(stat, df), impossible
}

// The emitted tokens of a speculative step (accepted drafts, then the next
// token) have exactly the distribution of plain sampling. Chi-square tests
// on the first emitted token, on the pair (first, second or "end") and on
// the whole emitted sequence, over 40k seeds, each at a false-failure
// probability of 1e-6 (the seeds are fixed, so the test is deterministic).
// Three wrong rules fail the first-token or pair statistic.
func TestVerifySamplingDistribution(t *testing.T) {
	const n = 40000
	const alpha = 1e-6
	rules := []struct {
		name    string
		r       rule
		correct bool
	}{
		{"correct", correctRule, true},
		{"accept-always", acceptAlways, false},
		{"resample-with-draft", resampleWithDraft, false},
		{"reuse-accept-uniform", reuseUniform, false},
	}
	for _, c := range specCases() {
		want := jointDistribution(t, c)
		logits := rowsOf(c.rows...)
		for _, ru := range rules {
			obs := map[string]int{}
			seqs := map[string][]int32{}
			for k := range want {
				seqs[k] = parseSeq(k)
			}
			firstAccepted := 0
			for seed := range n {
				p := c.p
				p.Seed, p.HasSeed = int64(seed)*7919+int64(len(c.name)), true
				em := ru.r(t, logits, c.drafts, p, c.h)
				k := seqKey(em, len(em))
				obs[k]++
				seqs[k] = em
				if len(em) > 1 {
					firstAccepted++
				}
			}
			statFailed, anyFailed := false, false
			for _, m := range []struct {
				name string
				n    int // tokens kept; 0 = the whole sequence
			}{{"first", 1}, {"pair", 2}, {"sequence", 0}} {
				o, w := obs, want
				if m.n > 0 {
					o, w = marginal(obs, seqs, m.n), marginal(want, seqs, m.n)
				}
				stat, df, pval, impossible := chiSquare(n, o, w)
				t.Logf("%s / %s / %s: chi2 %.1f, df %d, p %.3g %s", c.name, ru.name, m.name, stat, df, pval, impossible)
				if pval < alpha && m.n > 0 {
					statFailed = true
				}
				if pval < alpha || impossible != "" {
					anyFailed = true
				}
			}
			t.Logf("%s / %s: first draft accepted %.4f (target p %.4f)", c.name, ru.name, float64(firstAccepted)/n, firstDraftProb(t, c))
			if ru.correct && anyFailed {
				t.Errorf("%s: the correct rule fails a chi-square test", c.name)
			}
			if !ru.correct && !statFailed && !wrongRuleHarmless(c, ru.name) {
				t.Errorf("%s: wrong rule %s passes the first-token and pair chi-square tests", c.name, ru.name)
			}
		}
	}
}

// parseSeq inverts seqKey for a full sequence ("[1 2 3]" or "[1 2] end").
func parseSeq(k string) []int32 {
	k = strings.TrimSuffix(k, " end")
	var out []int32
	for _, f := range strings.Fields(strings.Trim(k, "[]")) {
		var v int32
		fmt.Sscan(f, &v)
		out = append(out, v)
	}
	return out
}

// wrongRuleHarmless names the cases where a wrong rule happens to be
// exact: with a draft of target probability 0 (filtered by top-k), every
// rule that accepts with probability p[d] always rejects it, a replacement
// drawn from p never picks it, and the acceptance uniform, not conditioned
// by u >= p[d] = 0, is as good as a fresh one.
func wrongRuleHarmless(c specCase, rule string) bool {
	return c.name == "filtered draft" && rule != "accept-always"
}

func firstDraftProb(t *testing.T, c specCase) float64 {
	dist, err := Distribution(c.rows[0], c.p, History{PromptTokens: c.h.PromptTokens, OutputTokens: c.h.OutputTokens})
	if err != nil {
		t.Fatal(err)
	}
	return dist[c.drafts[0]]
}

// chiSquareSF is the upper tail probability of the chi-square distribution
// with df degrees of freedom: Q(df/2, x/2), the regularised upper incomplete
// gamma function (series below a+1, continued fraction above).
func chiSquareSF(x float64, df int) float64 {
	if df <= 0 {
		return 1
	}
	if x <= 0 {
		return 1
	}
	if math.IsInf(x, 1) {
		return 0
	}
	a, z := float64(df)/2, x/2
	lg, _ := math.Lgamma(a)
	if z < a+1 {
		sum, term := 1/a, 1/a
		for k := 1; k < 1000; k++ {
			term *= z / (a + float64(k))
			sum += term
			if term < sum*1e-16 {
				break
			}
		}
		return 1 - sum*math.Exp(-z+a*math.Log(z)-lg)
	}
	// Lentz's continued fraction for Q.
	const tiny = 1e-300
	b := z + 1 - a
	cc := 1 / tiny
	d := 1 / b
	h := d
	for i := 1; i < 1000; i++ {
		an := -float64(i) * (float64(i) - a)
		b += 2
		d = an*d + b
		if math.Abs(d) < tiny {
			d = tiny
		}
		cc = b + an/cc
		if math.Abs(cc) < tiny {
			cc = tiny
		}
		d = 1 / d
		del := d * cc
		h *= del
		if math.Abs(del-1) < 1e-16 {
			break
		}
	}
	return math.Exp(-z+a*math.Log(z)-lg) * h
}

func TestChiSquareSF(t *testing.T) {
	// Closed forms: df = 1 is erfc(sqrt(x/2)); an even df = 2m is
	// exp(-x/2)·Σ_{k<m} (x/2)^k/k!.
	closed := func(x float64, df int) float64 {
		if df == 1 {
			return math.Erfc(math.Sqrt(x / 2))
		}
		sum, term := 0.0, 1.0
		for k := range df / 2 {
			if k > 0 {
				term *= x / 2 / float64(k)
			}
			sum += term
		}
		return math.Exp(-x/2) * sum
	}
	for _, df := range []int{1, 2, 4, 10, 16, 30} {
		for _, x := range []float64{0.3, 1, 3.84, 9, 20, 45, 80, 150} {
			got, want := chiSquareSF(x, df), closed(x, df)
			if math.Abs(got-want) > 1e-9*want+1e-300 {
				t.Errorf("chiSquareSF(%v, %d) = %.10g, want %.10g", x, df, got, want)
			}
		}
	}
}
