// Package sample turns one position's logits into the next token, the way the
// CPU backend does it (the CUDA backend implements the same rules on the GPU).
//
// Order (vLLM v1): penalties on the raw logits -> the token mask of a
// constrained request (disallowed tokens to -Inf) -> greedy argmax, or
// temperature -> min-p -> top-k -> top-p -> one draw by inverse CDF with a
// counter-based uniform keyed by (seed, sample index). Logprobs are the
// log-softmax of the raw logits, before penalties and temperature (vLLM's
// default "raw_logprobs"). docs/engine.md states every rule and formula.
package sample

import (
	"fmt"
	"math"

	"github.com/glmctl/glmctl/pkg/engine"
)

// History is the part of a sequence the sampler reads: its tokens (for
// penalties) and how many tokens it has generated so far (the RNG counter).
type History struct {
	PromptTokens []int32
	OutputTokens []int32
	SampleIndex  int
	// Allowed, when not nil, is the token bitmask of a constrained request
	// (engine.StepSeq.AllowedTokens): only its tokens may be drawn.
	Allowed []uint32
}

// Result is one sampled token. Logprob and TopLogprobs are filled only when
// the parameters ask for logprobs.
type Result struct {
	Token       int32
	Logprob     float32
	TopLogprobs []engine.TokenLogprob
}

// Sampler holds scratch buffers sized to the vocabulary, reused across calls.
// The zero value is ready to use. A Sampler is not safe for concurrent use;
// give each goroutine its own.
type Sampler struct {
	weights []float64 // adjusted logits, then unnormalised kept probabilities
	mark    []uint8   // per-token "already penalised" flags, cleared after use
	count   []int32   // per-token output counts, cleared after use
	heap    []int32   // token ids for top-k / top-p / top-n selection
	topk    []float64 // min-heap of the k largest weights
}

// Sample draws the next token with a fresh Sampler.
func Sample(logits []float32, p engine.SamplingParams, h History) (Result, error) {
	var s Sampler
	return s.Sample(logits, p, h)
}

// Distribution returns the probabilities Sample draws from: after penalties,
// temperature and the min-p / top-k / top-p filters, normalised to sum 1.
// Greedy parameters give a one-hot vector at the argmax.
func Distribution(logits []float32, p engine.SamplingParams, h History) ([]float64, error) {
	var s Sampler
	total, err := s.weigh(logits, p, h)
	if err != nil {
		return nil, err
	}
	out := make([]float64, len(logits))
	for i, w := range s.weights[:len(logits)] {
		out[i] = w / total
	}
	return out, nil
}

// ForStep samples for one StepSeq of a backend step, taking the parameters and
// history from seq. It is what a backend calls after computing the logits of
// seq's last position.
func (s *Sampler) ForStep(logits []float32, seq *engine.StepSeq) (engine.SeqResult, error) {
	r, err := s.Sample(logits, seq.Sampling, historyOf(seq))
	if err != nil {
		return engine.SeqResult{}, fmt.Errorf("sequence %d: %w", seq.SeqID, err)
	}
	return engine.SeqResult{SeqID: seq.SeqID, Token: r.Token, Logprob: r.Logprob, TopLogprobs: r.TopLogprobs}, nil
}

// historyOf is the part of a step's sequence the sampler reads.
func historyOf(seq *engine.StepSeq) History {
	return History{
		PromptTokens: seq.PromptTokens,
		OutputTokens: seq.OutputTokens,
		SampleIndex:  seq.SampleIndex,
		Allowed:      seq.AllowedTokens,
	}
}

// Sample draws the next token from logits (one position, vocabulary-sized).
// Logits holding NaN or +Inf, or only -Inf, give an error wrapping
// engine.ErrNonFiniteLogits, never a token.
func (s *Sampler) Sample(logits []float32, p engine.SamplingParams, h History) (Result, error) {
	total, err := s.weigh(logits, p, h)
	if err != nil {
		return Result{}, err
	}
	var tok int32
	if p.Greedy() {
		tok = s.onlyKept(len(logits))
	} else {
		tok = drawInverseCDF(s.weights[:len(logits)], total, Uniform(p.Seed, h.SampleIndex))
	}
	r := Result{Token: tok}
	if p.WantsLogprobs() {
		r.Logprob, r.TopLogprobs = s.logprobs(logits, tok, p.TopLogprobs)
	}
	return r, nil
}

// drawInverseCDF walks token ids in ascending order accumulating the kept
// weights and returns the first id whose running sum exceeds u*total. If
// rounding leaves the sum short of the target it returns the last kept id.
func drawInverseCDF(weights []float64, total, u float64) int32 {
	target := u * total
	acc := 0.0
	last := int32(-1)
	for i, w := range weights {
		if w <= 0 {
			continue
		}
		acc += w
		last = int32(i)
		if acc > target {
			return last
		}
	}
	return last
}

// onlyKept returns the single token with non-zero weight after a greedy weigh.
func (s *Sampler) onlyKept(n int) int32 {
	for i, w := range s.weights[:n] {
		if w > 0 {
			return int32(i)
		}
	}
	return -1 // unreachable: weigh guarantees one kept token
}

// weigh fills s.weights[:len(logits)] with the unnormalised probabilities of
// the final sampling distribution (0 for filtered tokens) and returns their
// sum, which is > 0.
func (s *Sampler) weigh(logits []float32, p engine.SamplingParams, h History) (float64, error) {
	vocab := len(logits)
	if vocab == 0 {
		return 0, fmt.Errorf("sample: empty logits")
	}
	if err := p.Validate(); err != nil {
		return 0, err
	}
	if err := checkHistory(h, vocab); err != nil {
		return 0, err
	}
	s.grow(vocab)
	w := s.weights[:vocab]
	anyFinite := false
	for i, l := range logits {
		f := float64(l)
		if math.IsNaN(f) || math.IsInf(f, 1) {
			return 0, fmt.Errorf("sample: %w: logit %d is %v", engine.ErrNonFiniteLogits, i, l)
		}
		if !math.IsInf(f, -1) {
			anyFinite = true
		}
		w[i] = f
	}
	if !anyFinite {
		return 0, fmt.Errorf("sample: %w: all %d logits are -Inf", engine.ErrNonFiniteLogits, vocab)
	}
	s.applyPenalties(w, p, h)
	if h.Allowed != nil {
		if err := applyMask(w, h.Allowed); err != nil {
			return 0, err
		}
	}

	if p.Greedy() {
		best := argmax(w)
		clear(w)
		w[best] = 1
		return 1, nil
	}

	// Temperature, then softmax numerators relative to the maximum, so the top
	// token has weight exactly 1 and min-p compares weights directly.
	inv := 1 / float64(p.Temperature)
	maxL := math.Inf(-1)
	for i := range w {
		w[i] *= inv
		if w[i] > maxL {
			maxL = w[i]
		}
	}
	if math.IsInf(maxL, -1) {
		return 0, fmt.Errorf("sample: every logit is -Inf after penalties")
	}
	if math.IsInf(maxL, 1) {
		return 0, fmt.Errorf("sample: %w: a logit overflows to +Inf at temperature %v", engine.ErrNonFiniteLogits, p.Temperature)
	}
	for i, l := range w {
		w[i] = math.Exp(l - maxL) // exp(-Inf) = 0
	}

	// min-p: drop tokens with p_i < min_p * p_max, i.e. weight < min_p.
	if p.MinPEnabled() {
		minP := float64(p.MinP)
		for i, x := range w {
			if x < minP {
				w[i] = 0
			}
		}
	}
	if p.TopKEnabled(vocab) {
		s.topK(w, p.TopK)
	}
	if p.TopPEnabled() {
		s.topP(w, float64(p.TopP))
	}
	total := 0.0
	for _, x := range w {
		total += x
	}
	if !(total > 0) || math.IsInf(total, 0) {
		return 0, fmt.Errorf("sample: no token left to sample (weight sum %v)", total)
	}
	return total, nil
}

func checkHistory(h History, vocab int) error {
	if h.SampleIndex < 0 {
		return fmt.Errorf("sample: sample index %d is negative", h.SampleIndex)
	}
	if h.Allowed != nil && len(h.Allowed) < engine.MaskWords(vocab) {
		return fmt.Errorf("sample: token mask has %d words, a vocabulary of %d needs %d", len(h.Allowed), vocab, engine.MaskWords(vocab))
	}
	for i, t := range h.PromptTokens {
		if t < 0 || int(t) >= vocab {
			return fmt.Errorf("sample: prompt token %d at index %d is outside the vocabulary (size %d)", t, i, vocab)
		}
	}
	for i, t := range h.OutputTokens {
		if t < 0 || int(t) >= vocab {
			return fmt.Errorf("sample: output token %d at index %d is outside the vocabulary (size %d)", t, i, vocab)
		}
	}
	return nil
}

func (s *Sampler) grow(vocab int) {
	if cap(s.weights) < vocab {
		s.weights = make([]float64, vocab)
		s.mark = make([]uint8, vocab)
		s.count = make([]int32, vocab)
	}
	s.weights = s.weights[:vocab]
	s.mark = s.mark[:vocab]
	s.count = s.count[:vocab]
}

// applyPenalties applies, in place on the raw logits:
//   - repetition penalty (HF/vLLM) once per distinct token of prompt+output:
//     l > 0 -> l / r, else l * r;
//   - frequency and presence penalties (OpenAI) per distinct output token:
//     l -= count*frequency + presence.
func (s *Sampler) applyPenalties(w []float64, p engine.SamplingParams, h History) {
	if p.RepetitionPenaltyEnabled() {
		r := float64(p.RepetitionPenalty)
		for _, toks := range [2][]int32{h.PromptTokens, h.OutputTokens} {
			for _, t := range toks {
				if s.mark[t] != 0 {
					continue
				}
				s.mark[t] = 1
				if w[t] > 0 {
					w[t] /= r
				} else {
					w[t] *= r
				}
			}
		}
		for _, toks := range [2][]int32{h.PromptTokens, h.OutputTokens} {
			for _, t := range toks {
				s.mark[t] = 0
			}
		}
	}
	if p.FrequencyPenalty != 0 || p.PresencePenalty != 0 {
		freq, pres := float64(p.FrequencyPenalty), float64(p.PresencePenalty)
		for _, t := range h.OutputTokens {
			s.count[t]++
		}
		for _, t := range h.OutputTokens {
			if c := s.count[t]; c > 0 {
				w[t] -= float64(c)*freq + pres
				s.count[t] = 0 // applied once; also leaves the buffer clear
			}
		}
	}
}

// applyMask sets every token the mask does not allow to -Inf. It fails when
// no allowed token keeps a finite logit (the constraint and the model leave
// nothing to sample).
func applyMask(w []float64, mask []uint32) error {
	negInf := math.Inf(-1)
	alive := false
	for i := range w {
		if mask[i>>5]>>(uint(i)&31)&1 == 0 {
			w[i] = negInf
		} else if !math.IsInf(w[i], -1) {
			alive = true
		}
	}
	if !alive {
		return fmt.Errorf("sample: %w: the token mask leaves no token with a finite logit", engine.ErrNoAllowedToken)
	}
	return nil
}

// argmax returns the index of the largest value, the lowest index on ties.
func argmax(w []float64) int {
	best := 0
	for i, x := range w {
		if x > w[best] {
			best = i
		}
	}
	return best
}

// topK zeroes every weight below the k-th largest kept weight. Ties with the
// k-th weight are kept (as vLLM's comparison against the k-th value does).
func (s *Sampler) topK(w []float64, k int) {
	h := s.topk[:0]
	for _, x := range w {
		if x <= 0 {
			continue
		}
		if len(h) < k {
			h = append(h, x)
			siftUpMin(h, len(h)-1)
		} else if x > h[0] {
			h[0] = x
			siftDownMin(h, 0)
		}
	}
	s.topk = h
	if len(h) < k {
		return // fewer than k tokens left: nothing to drop
	}
	kth := h[0]
	for i, x := range w {
		if x < kth {
			w[i] = 0
		}
	}
}

func siftUpMin(h []float64, i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if h[parent] <= h[i] {
			return
		}
		h[parent], h[i] = h[i], h[parent]
		i = parent
	}
}

func siftDownMin(h []float64, i int) {
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		small := l
		if r := l + 1; r < n && h[r] < h[l] {
			small = r
		}
		if h[i] <= h[small] {
			return
		}
		h[i], h[small] = h[small], h[i]
		i = small
	}
}

// topP keeps the smallest head of the kept tokens, in order of decreasing
// weight (ties: lower id first), whose mass reaches top_p: a token is kept
// when the mass strictly before it is < top_p * total. That equals vLLM's
// rule (drop where the ascending inclusive cumulative probability <= 1-top_p)
// and always keeps the most likely token.
func (s *Sampler) topP(w []float64, topP float64) {
	h := s.heap[:0]
	total := 0.0
	for i, x := range w {
		if x > 0 {
			h = append(h, int32(i))
			total += x
		}
	}
	s.heap = h
	better := func(a, b int32) bool { return w[a] > w[b] || (w[a] == w[b] && a < b) }
	heapify(h, better)
	limit := topP * total
	mass := 0.0
	n := len(h)
	for n > 0 && mass < limit {
		top := h[0]
		mass += w[top]
		n--
		h[0], h[n] = h[n], h[0]
		siftDown(h[:n], 0, better)
	}
	for _, id := range h[:n] { // never reached the limit: dropped
		w[id] = 0
	}
}

// logprobs returns the raw log-softmax of tok and the top n tokens by raw
// logit (ties: lower id first), best first.
func (s *Sampler) logprobs(logits []float32, tok int32, n int) (float32, []engine.TokenLogprob) {
	maxL := math.Inf(-1)
	for _, l := range logits {
		if float64(l) > maxL {
			maxL = float64(l)
		}
	}
	sum := 0.0
	for _, l := range logits {
		sum += math.Exp(float64(l) - maxL)
	}
	lse := maxL + math.Log(sum)
	lp := func(id int32) float32 { return float32(float64(logits[id]) - lse) }
	if n <= 0 {
		return lp(tok), nil
	}
	if n > len(logits) {
		n = len(logits)
	}
	// Min-heap (by "better") of the n best ids seen so far.
	better := func(a, b int32) bool { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b) }
	worse := func(a, b int32) bool { return better(b, a) }
	h := s.heap[:0]
	for i := range logits {
		id := int32(i)
		if len(h) < n {
			h = append(h, id)
			siftUp(h, len(h)-1, worse)
		} else if better(id, h[0]) {
			h[0] = id
			siftDown(h, 0, worse)
		}
	}
	s.heap = h
	out := make([]engine.TokenLogprob, len(h))
	for k := len(h) - 1; k >= 0; k-- { // pop worst first into the back
		out[k] = engine.TokenLogprob{Token: h[0], Logprob: lp(h[0])}
		last := len(h) - 1
		h[0] = h[last]
		h = h[:last]
		siftDown(h, 0, worse)
	}
	return lp(tok), out
}

// heapify orders h as a heap whose root is the "first" element under less.
func heapify(h []int32, less func(a, b int32) bool) {
	for i := len(h)/2 - 1; i >= 0; i-- {
		siftDown(h, i, less)
	}
}

func siftUp(h []int32, i int, less func(a, b int32) bool) {
	for i > 0 {
		parent := (i - 1) / 2
		if !less(h[i], h[parent]) {
			return
		}
		h[parent], h[i] = h[i], h[parent]
		i = parent
	}
}

func siftDown(h []int32, i int, less func(a, b int32) bool) {
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		first := l
		if r := l + 1; r < n && less(h[r], h[l]) {
			first = r
		}
		if !less(h[first], h[i]) {
			return
		}
		h[i], h[first] = h[first], h[i]
		i = first
	}
}
