package sample

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/glmctl/glmctl/pkg/engine"
)

// refDistribution is a direct, unoptimised transcription of the sampling
// rules (sorts instead of heaps, explicit softmax), used as the oracle.
func refDistribution(logits []float32, p engine.SamplingParams, h History) []float64 {
	n := len(logits)
	l := make([]float64, n)
	for i, x := range logits {
		l[i] = float64(x)
	}
	if p.RepetitionPenalty > 0 && p.RepetitionPenalty != 1 {
		seen := map[int32]bool{}
		for _, t := range append(slices.Clone(h.PromptTokens), h.OutputTokens...) {
			seen[t] = true
		}
		for t := range seen {
			if l[t] > 0 {
				l[t] /= float64(p.RepetitionPenalty)
			} else {
				l[t] *= float64(p.RepetitionPenalty)
			}
		}
	}
	counts := map[int32]int{}
	for _, t := range h.OutputTokens {
		counts[t]++
	}
	for t, c := range counts {
		l[t] -= float64(c)*float64(p.FrequencyPenalty) + float64(p.PresencePenalty)
	}
	out := make([]float64, n)
	if p.Temperature <= 0 {
		best := 0
		for i := range l {
			if l[i] > l[best] {
				best = i
			}
		}
		out[best] = 1
		return out
	}
	for i := range l {
		l[i] /= float64(p.Temperature)
	}
	softmax := func(keep []bool) []float64 {
		m := math.Inf(-1)
		for i, x := range l {
			if keep[i] && x > m {
				m = x
			}
		}
		pr := make([]float64, n)
		z := 0.0
		for i, x := range l {
			if keep[i] {
				pr[i] = math.Exp(x - m)
				z += pr[i]
			}
		}
		for i := range pr {
			pr[i] /= z
		}
		return pr
	}
	keep := make([]bool, n)
	for i := range keep {
		keep[i] = !math.IsInf(l[i], -1)
	}
	if p.MinP > 0 {
		pr := softmax(keep)
		maxP := slices.Max(pr)
		for i := range pr {
			if pr[i] < float64(p.MinP)*maxP {
				keep[i] = false
			}
		}
	}
	if p.TopK > 0 && p.TopK < n {
		var vals []float64
		for i := range l {
			if keep[i] {
				vals = append(vals, l[i])
			}
		}
		sort.Sort(sort.Reverse(sort.Float64Slice(vals)))
		if len(vals) >= p.TopK {
			kth := vals[p.TopK-1]
			for i := range l {
				if l[i] < kth {
					keep[i] = false
				}
			}
		}
	}
	if p.TopP > 0 && p.TopP < 1 {
		pr := softmax(keep)
		var ids []int
		for i := range pr {
			if keep[i] {
				ids = append(ids, i)
			}
		}
		sort.SliceStable(ids, func(a, b int) bool { return pr[ids[a]] > pr[ids[b]] })
		before := 0.0
		for _, id := range ids {
			if before >= float64(p.TopP) {
				keep[id] = false
			}
			before += pr[id]
		}
	}
	return softmax(keep)
}

func refDraw(dist []float64, u float64) int32 {
	acc, last := 0.0, int32(-1)
	for i, p := range dist {
		if p <= 0 {
			continue
		}
		acc += p
		last = int32(i)
		if acc > u {
			return last
		}
	}
	return last
}

func randomLogits(r *rand.Rand, n int) []float32 {
	l := make([]float32, n)
	for i := range l {
		l[i] = float32(r.NormFloat64() * 3)
	}
	return l
}

func TestDistributionMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	hist := History{PromptTokens: []int32{3, 5, 5, 9, 40}, OutputTokens: []int32{5, 7, 7, 7, 12, 0}, SampleIndex: 6}
	cases := []struct {
		name string
		p    engine.SamplingParams
	}{
		{"greedy", engine.SamplingParams{}},
		{"greedy with penalties", engine.SamplingParams{RepetitionPenalty: 1.3, FrequencyPenalty: 0.5, PresencePenalty: 0.4}},
		{"temperature", engine.SamplingParams{Temperature: 0.7}},
		{"hot", engine.SamplingParams{Temperature: 2.5}},
		{"top-k", engine.SamplingParams{Temperature: 1, TopK: 5}},
		{"top-k 1", engine.SamplingParams{Temperature: 1, TopK: 1}},
		{"top-p", engine.SamplingParams{Temperature: 1, TopP: 0.8}},
		{"top-p tiny", engine.SamplingParams{Temperature: 1, TopP: 0.01}},
		{"min-p", engine.SamplingParams{Temperature: 1, MinP: 0.1}},
		{"repetition", engine.SamplingParams{Temperature: 1, RepetitionPenalty: 1.5}},
		{"repetition below 1", engine.SamplingParams{Temperature: 1, RepetitionPenalty: 0.7}},
		{"frequency", engine.SamplingParams{Temperature: 1, FrequencyPenalty: 1.2}},
		{"presence negative", engine.SamplingParams{Temperature: 1, PresencePenalty: -1.5}},
		{"everything", engine.SamplingParams{Temperature: 0.8, TopK: 20, TopP: 0.9, MinP: 0.02,
			RepetitionPenalty: 1.1, FrequencyPenalty: 0.3, PresencePenalty: 0.2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for trial := range 20 {
				logits := randomLogits(r, 64)
				got, err := Distribution(logits, tc.p, hist)
				if err != nil {
					t.Fatal(err)
				}
				want := refDistribution(logits, tc.p, hist)
				for i := range want {
					if math.Abs(got[i]-want[i]) > 1e-12 {
						t.Fatalf("trial %d token %d: got p=%v, reference %v", trial, i, got[i], want[i])
					}
				}
				p := tc.p
				p.Seed = int64(trial)
				res, err := Sample(logits, p, hist)
				if err != nil {
					t.Fatal(err)
				}
				wantTok := refDraw(want, Uniform(p.Seed, hist.SampleIndex))
				if res.Token != wantTok {
					t.Fatalf("trial %d: sampled %d, reference inverse CDF gives %d", trial, res.Token, wantTok)
				}
			}
		})
	}
}

func TestFiltersOnKnownDistribution(t *testing.T) {
	// Probabilities 0.4, 0.3, 0.15, 0.1, 0.05 in logit form (temperature 1).
	probs := []float64{0.05, 0.4, 0.15, 0.3, 0.1}
	logits := make([]float32, len(probs))
	for i, p := range probs {
		logits[i] = float32(math.Log(p))
	}
	kept := func(p engine.SamplingParams) []int {
		d, err := Distribution(logits, p, History{})
		if err != nil {
			t.Fatal(err)
		}
		var ids []int
		for i, x := range d {
			if x > 0 {
				ids = append(ids, i)
			}
		}
		return ids
	}
	cases := []struct {
		name string
		p    engine.SamplingParams
		want []int
	}{
		{"top-k 2", engine.SamplingParams{Temperature: 1, TopK: 2}, []int{1, 3}},
		{"top-k >= vocab", engine.SamplingParams{Temperature: 1, TopK: 9}, []int{0, 1, 2, 3, 4}},
		{"top-p 0.5 needs two", engine.SamplingParams{Temperature: 1, TopP: 0.5}, []int{1, 3}},
		{"top-p 0.4 one is enough", engine.SamplingParams{Temperature: 1, TopP: 0.39}, []int{1}},
		{"top-p 0.8", engine.SamplingParams{Temperature: 1, TopP: 0.8}, []int{1, 2, 3}},
		{"min-p 0.3 of 0.4 = 0.12", engine.SamplingParams{Temperature: 1, MinP: 0.3}, []int{1, 2, 3}},
		{"min-p then top-p renormalised", engine.SamplingParams{Temperature: 1, MinP: 0.5, TopP: 0.55}, []int{1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := kept(tc.p); !slices.Equal(got, tc.want) {
				t.Fatalf("kept %v, want %v", got, tc.want)
			}
		})
	}
}

func TestGreedyTiesPickLowestID(t *testing.T) {
	logits := []float32{1, 3, 2, 3, 3}
	res, err := Sample(logits, engine.SamplingParams{}, History{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Token != 1 {
		t.Fatalf("greedy picked %d, want 1 (lowest id among ties)", res.Token)
	}
	// Repetition penalty on token 1 hands the tie to token 3.
	res, err = Sample(logits, engine.SamplingParams{RepetitionPenalty: 2}, History{PromptTokens: []int32{1}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Token != 3 {
		t.Fatalf("greedy with penalty picked %d, want 3", res.Token)
	}
}

func TestTopKKeepsTies(t *testing.T) {
	logits := []float32{1, 2, 2, 2, 0}
	d, err := Distribution(logits, engine.SamplingParams{Temperature: 1, TopK: 2}, History{})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []float64{0, 1. / 3, 1. / 3, 1. / 3, 0} {
		if math.Abs(d[i]-want) > 1e-12 {
			t.Fatalf("token %d: p=%v, want %v (ties with the k-th value are kept)", i, d[i], want)
		}
	}
}

func TestSeedReproducesAndDiffers(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	logits := randomLogits(r, 200)
	p := engine.SamplingParams{Temperature: 1, Seed: 42, HasSeed: true}
	run := func(seed int64) []int32 {
		p.Seed = seed
		var s Sampler
		var out []int32
		for i := range 50 {
			res, err := s.Sample(logits, p, History{SampleIndex: i})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, res.Token)
		}
		return out
	}
	a, b, c := run(42), run(42), run(43)
	if !slices.Equal(a, b) {
		t.Fatalf("same seed gave different tokens:\n%v\n%v", a, b)
	}
	if slices.Equal(a, c) {
		t.Fatalf("seeds 42 and 43 gave identical 50-token draws %v", a)
	}
}

func TestEmpiricalFrequencies(t *testing.T) {
	probs := []float64{0.5, 0.2, 0.15, 0.1, 0.05}
	logits := make([]float32, len(probs))
	for i, p := range probs {
		logits[i] = float32(math.Log(p))
	}
	const n = 20000
	counts := make([]int, len(probs))
	var s Sampler
	p := engine.SamplingParams{Temperature: 1, Seed: 7, HasSeed: true}
	for i := range n {
		res, err := s.Sample(logits, p, History{SampleIndex: i})
		if err != nil {
			t.Fatal(err)
		}
		counts[res.Token]++
	}
	for i, want := range probs {
		got := float64(counts[i]) / n
		// 5 standard deviations of a binomial proportion.
		if tol := 5 * math.Sqrt(want*(1-want)/n); math.Abs(got-want) > tol {
			t.Fatalf("token %d frequency %.4f, want %.4f ± %.4f", i, got, want, tol)
		}
	}
}

func TestLogprobs(t *testing.T) {
	logits := []float32{0.5, 2, -1, 2, 1.5, float32(math.Inf(-1))}
	p := engine.SamplingParams{Temperature: 0.5, RepetitionPenalty: 3, Logprobs: true, TopLogprobs: 3, Seed: 1}
	res, err := Sample(logits, p, History{PromptTokens: []int32{1, 3}})
	if err != nil {
		t.Fatal(err)
	}
	// Raw log-softmax: penalties and temperature must not show.
	z := 0.0
	for _, l := range logits {
		z += math.Exp(float64(l))
	}
	lp := func(id int32) float32 { return float32(float64(logits[id]) - math.Log(z)) }
	if math.Abs(float64(res.Logprob-lp(res.Token))) > 1e-6 {
		t.Fatalf("logprob of %d = %v, want raw %v", res.Token, res.Logprob, lp(res.Token))
	}
	want := []engine.TokenLogprob{{Token: 1, Logprob: lp(1)}, {Token: 3, Logprob: lp(3)}, {Token: 4, Logprob: lp(4)}}
	if len(res.TopLogprobs) != len(want) {
		t.Fatalf("top logprobs %v, want %v", res.TopLogprobs, want)
	}
	for i := range want {
		if res.TopLogprobs[i].Token != want[i].Token || math.Abs(float64(res.TopLogprobs[i].Logprob-want[i].Logprob)) > 1e-6 {
			t.Fatalf("top logprobs %v, want %v", res.TopLogprobs, want)
		}
	}
	// No logprobs requested: none computed.
	res, err = Sample(logits, engine.SamplingParams{}, History{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Logprob != 0 || res.TopLogprobs != nil {
		t.Fatalf("logprobs returned without being asked: %+v", res)
	}
}

func TestBadInput(t *testing.T) {
	nan := float32(math.NaN())
	cases := []struct {
		name    string
		logits  []float32
		p       engine.SamplingParams
		h       History
		wantErr string
	}{
		{"empty", nil, engine.SamplingParams{}, History{}, "empty logits"},
		{"nan", []float32{1, nan}, engine.SamplingParams{}, History{}, "logit 1 is NaN"},
		{"+inf", []float32{float32(math.Inf(1)), 0}, engine.SamplingParams{}, History{}, "logit 0 is +Inf"},
		{"all -inf", []float32{float32(math.Inf(-1))}, engine.SamplingParams{Temperature: 1}, History{}, "all 1 logits are -Inf"},
		{"prompt token range", []float32{1, 2}, engine.SamplingParams{}, History{PromptTokens: []int32{2}}, "prompt token 2 at index 0 is outside the vocabulary (size 2)"},
		{"output token range", []float32{1, 2}, engine.SamplingParams{}, History{OutputTokens: []int32{0, -1}}, "output token -1 at index 1"},
		{"temperature", []float32{1}, engine.SamplingParams{Temperature: -1}, History{}, "temperature"},
		{"top-p", []float32{1}, engine.SamplingParams{TopP: 1.5}, History{}, "top_p"},
		{"min-p", []float32{1}, engine.SamplingParams{MinP: -0.1}, History{}, "min_p"},
		{"frequency", []float32{1}, engine.SamplingParams{FrequencyPenalty: 3}, History{}, "frequency_penalty"},
		{"top logprobs", []float32{1}, engine.SamplingParams{TopLogprobs: 21}, History{}, "top_logprobs 21 must be in [0, 20]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Sample(tc.logits, tc.p, tc.h)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestForStep(t *testing.T) {
	logits := []float32{0, 1, 5, 2}
	seq := &engine.StepSeq{SeqID: 9, Sampling: engine.SamplingParams{RepetitionPenalty: 10, Logprobs: true},
		PromptTokens: []int32{2}, SampleIndex: 0}
	var s Sampler
	res, err := s.ForStep(logits, seq)
	if err != nil {
		t.Fatal(err)
	}
	if res.SeqID != 9 || res.Token != 3 {
		t.Fatalf("got %+v, want seq 9 token 3 (token 2 penalised to 0.5)", res)
	}
	seq.OutputTokens = []int32{7}
	if _, err := s.ForStep(logits, seq); err == nil || !strings.Contains(err.Error(), "sequence 9") {
		t.Fatalf("err = %v, want one naming sequence 9", err)
	}
}

func TestSamplerReuseAcrossVocabSizes(t *testing.T) {
	var s Sampler
	big := randomLogits(rand.New(rand.NewPCG(5, 6)), 500)
	p := engine.SamplingParams{Temperature: 1, RepetitionPenalty: 1.2, FrequencyPenalty: 0.5, TopK: 10, TopP: 0.9}
	h := History{OutputTokens: []int32{1, 1, 2, 3}}
	for range 3 {
		for _, l := range [][]float32{big, big[:7], big} {
			got, err := s.Sample(l, p, h)
			if err != nil {
				t.Fatal(err)
			}
			want, err := Sample(l, p, h)
			if err != nil {
				t.Fatal(err)
			}
			if got.Token != want.Token {
				t.Fatalf("reused sampler gave %d, fresh one %d (scratch not cleared?)", got.Token, want.Token)
			}
		}
	}
}

// Non-finite logits never give a token: every such case is an error wrapping
// engine.ErrNonFiniteLogits (what the engine counts and reports), whatever
// the sampling parameters.
func TestNonFiniteLogitsAreAnError(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, tc := range []struct {
		name   string
		logits []float32
	}{
		{"nan first", []float32{nan, 1, 2}},
		{"nan last", []float32{1, 2, nan}},
		{"all nan", []float32{nan, nan, nan}},
		{"+inf", []float32{1, inf, 2}},
		{"all -inf", []float32{-inf, -inf, -inf}},
	} {
		for _, p := range []engine.SamplingParams{
			{}, {Temperature: 1}, {Temperature: 0.7, TopK: 2, TopP: 0.9}, {Temperature: 1, MinP: 0.1, Logprobs: true, TopLogprobs: 2},
		} {
			res, err := Sample(tc.logits, p, History{})
			if !errors.Is(err, engine.ErrNonFiniteLogits) {
				t.Errorf("%s %+v: token %d, err %v; want ErrNonFiniteLogits", tc.name, p, res.Token, err)
			}
		}
	}
	var s Sampler
	res, err := s.ForStep([]float32{nan, 1}, &engine.StepSeq{SeqID: 7})
	if !errors.Is(err, engine.ErrNonFiniteLogits) || !strings.Contains(err.Error(), "sequence 7") {
		t.Errorf("ForStep: %+v, %v", res, err)
	}
}

func maskOf(vocab int, allowed ...int) []uint32 {
	m := make([]uint32, engine.MaskWords(vocab))
	for _, t := range allowed {
		m[t/32] |= 1 << (t % 32)
	}
	return m
}

// A constrained request draws only the tokens its mask allows, greedy or
// not, while logprobs stay those of the raw logits.
func TestAllowedTokens(t *testing.T) {
	const vocab = 70
	logits := make([]float32, vocab)
	for i := range logits {
		logits[i] = float32(i%7) * 0.5
	}
	logits[3] = 9 // the unconstrained argmax, not allowed below
	allowed := []int{1, 33, 40, 69}
	mask := maskOf(vocab, allowed...)
	params := []engine.SamplingParams{
		{Temperature: 0, TopP: 1, RepetitionPenalty: 1},
		{Temperature: 1, TopP: 1, RepetitionPenalty: 1, Logprobs: true},
		{Temperature: 2, TopP: 0.9, TopK: 2, RepetitionPenalty: 1.2},
	}
	for _, p := range params {
		seen := map[int32]bool{}
		for i := range 200 {
			p.Seed, p.HasSeed = int64(i), true
			r, err := Sample(logits, p, History{Allowed: mask, SampleIndex: i, PromptTokens: []int32{33}})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(allowed, int(r.Token)) {
				t.Fatalf("%+v: sampled %d, allowed %v", p, r.Token, allowed)
			}
			seen[r.Token] = true
			if p.Logprobs {
				full, _ := Distribution(logits, engine.SamplingParams{Temperature: 1, TopP: 1, RepetitionPenalty: 1}, History{})
				if got := math.Exp(float64(r.Logprob)); math.Abs(got-full[r.Token]) > 1e-5 {
					t.Fatalf("logprob %v of token %d is not the raw one %v", got, r.Token, full[r.Token])
				}
			}
		}
		// Allowed logits: 1 -> 0.5, 33 -> 2.5, 40 -> 2.5, 69 -> 3.
		if p.Greedy() && (len(seen) != 1 || !seen[69]) {
			t.Fatalf("greedy under the mask gave %v, want only 69", seen)
		}
		if !p.Greedy() && len(seen) < 2 {
			t.Fatalf("%+v: sampling under the mask gave only %v", p, seen)
		}
	}
	d, err := Distribution(logits, engine.SamplingParams{Temperature: 1, TopP: 1, RepetitionPenalty: 1}, History{Allowed: mask})
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, i := range allowed {
		sum += d[i]
	}
	if math.Abs(sum-1) > 1e-12 {
		t.Fatalf("the allowed tokens carry %v of the probability", sum)
	}

	if _, err := Sample(logits, params[0], History{Allowed: mask[:1]}); err == nil || !strings.Contains(err.Error(), "token mask has 1 words, a vocabulary of 70 needs 3") {
		t.Fatalf("short mask: err %v", err)
	}
	neg := slices.Clone(logits)
	neg[1], neg[33], neg[40], neg[69] = float32(math.Inf(-1)), float32(math.Inf(-1)), float32(math.Inf(-1)), float32(math.Inf(-1))
	if _, err := Sample(neg, params[1], History{Allowed: mask}); !errors.Is(err, engine.ErrNoAllowedToken) {
		t.Fatalf("every allowed logit -Inf: err %v", err)
	}
	if _, err := Sample(logits, params[0], History{Allowed: maskOf(vocab)}); !errors.Is(err, engine.ErrNoAllowedToken) {
		t.Fatalf("empty mask: err %v", err)
	}
}
