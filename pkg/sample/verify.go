package sample

import (
	"errors"
	"fmt"

	"github.com/glmctl/glmctl/pkg/engine"
)

// Speculative verification (docs/speculative.md, step 2): the target model's
// logits at the D+1 positions ending a speculating sequence's step decide how
// many of its D drafts are accepted and which token follows them, so that
// every emitted token is distributed exactly as plain sampling would draw it.

// acceptKeyXor domain-separates the acceptance test's uniforms from the
// sampling draws of the same (seed, sample index), so that the accept/reject
// decision and the draw after a rejection are independent.
const acceptKeyXor = 0x5851F42D4C957F2D

// AcceptUniform returns the uniform in [0, 1) that decides whether the draft
// at sample number sampleIndex of a request is accepted:
//
//	AcceptUniform(seed, i) = Uniform(int64(uint64(seed) ^ 0x5851F42D4C957F2D), i)
//
// that is the Bits/Uniform formula of rng.go with the seed XORed by the
// constant. A GPU sampler must use the same formula for its tokens to match
// the CPU backend's.
func AcceptUniform(seed int64, sampleIndex int) float64 {
	return Uniform(int64(uint64(seed)^acceptKeyXor), sampleIndex)
}

// Verified is the outcome of verifying one sequence's drafts.
type Verified struct {
	// Accepted are the accepted drafts in order, each with its logprobs
	// under the raw target logits of its position (when asked for).
	Accepted []Result
	// Next is the token that follows them: the target's correction at the
	// first rejected position, or its sample after the last draft when all
	// were accepted.
	Next Result
}

// Verify runs the speculative acceptance rule over the target logits of
// len(drafts)+1 positions, row j = logits[j*V:(j+1)*V] with V =
// len(logits)/(len(drafts)+1). Row j is the target's prediction for the token
// after draft j (row 0: after the last token the target sampled). For j = 0,
// 1, …, with history h.OutputTokens followed by drafts[:j] (penalties see the
// accepted drafts) and sample index h.SampleIndex+j:
//   - greedy: drafts[j] is accepted when it is the token Sample picks;
//     otherwise that token is Next;
//   - sampling: with p the distribution Sample draws from, drafts[j] is
//     accepted when AcceptUniform(seed, index) < p[drafts[j]]; otherwise Next
//     is drawn from p without drafts[j], renormalised, by inverse CDF with
//     Uniform(seed, index).
//
// When every draft is accepted, Next is Sample on the last row. This is
// speculative sampling with a point-mass draft distribution, so each emitted
// token has exactly the target's sampling distribution.
//
// Rows after the first rejection are never read: they describe contexts that
// did not happen, so a non-finite logit there does not fail the sequence
// (plain decoding would not have computed it). A non-finite row that is read
// gives an error wrapping engine.ErrNonFiniteLogits, as Sample does.
func (s *Sampler) Verify(logits []float32, drafts []int32, p engine.SamplingParams, h History) (Verified, error) {
	rows := len(drafts) + 1
	if len(logits) == 0 || len(logits)%rows != 0 {
		return Verified{}, fmt.Errorf("sample: verify: %d logits do not split into %d rows", len(logits), rows)
	}
	if h.Allowed != nil {
		// A constraint's mask changes with every token; one mask cannot
		// verify several positions.
		return Verified{}, errors.New("sample: verify: a token mask cannot be applied to drafts")
	}
	V := len(logits) / rows
	for j, d := range drafts {
		if d < 0 || int(d) >= V {
			return Verified{}, fmt.Errorf("sample: verify: draft %d (index %d) is outside the vocabulary (size %d)", d, j, V)
		}
	}
	// One history buffer: row j reads its first len(OutputTokens)+j tokens.
	hist := make([]int32, 0, len(h.OutputTokens)+len(drafts))
	hist = append(append(hist, h.OutputTokens...), drafts...)
	var out Verified
	for j := range rows {
		row := logits[j*V : (j+1)*V]
		hj := History{PromptTokens: h.PromptTokens, OutputTokens: hist[:len(h.OutputTokens)+j], SampleIndex: h.SampleIndex + j}
		if j == len(drafts) {
			r, err := s.Sample(row, p, hj)
			if err != nil {
				return Verified{}, fmt.Errorf("verify position %d: %w", j, err)
			}
			out.Next = r
			return out, nil
		}
		acc, next, err := s.verifyRow(row, drafts[j], p, hj)
		if err != nil {
			return Verified{}, fmt.Errorf("verify position %d: %w", j, err)
		}
		if !acc {
			out.Next = next
			return out, nil
		}
		out.Accepted = append(out.Accepted, next)
	}
	return out, nil // unreachable: the last row returns
}

// verifyRow decides one draft. It returns (true, the draft with its
// logprobs) when accepted, else (false, the replacement token).
func (s *Sampler) verifyRow(row []float32, draft int32, p engine.SamplingParams, h History) (bool, Result, error) {
	if p.Greedy() {
		r, err := s.Sample(row, p, h)
		if err != nil {
			return false, Result{}, err
		}
		return r.Token == draft, r, nil
	}
	total, err := s.weigh(row, p, h)
	if err != nil {
		return false, Result{}, err
	}
	w := s.weights[:len(row)]
	tok := draft
	accepted := AcceptUniform(p.Seed, h.SampleIndex) < w[draft]/total
	if !accepted {
		// Residual distribution: p with the draft removed. Its mass is
		// summed again rather than taken as total − w[draft], which would
		// cancel catastrophically when the draft held almost all of it.
		w[draft] = 0
		rest := 0.0
		for _, x := range w {
			rest += x
		}
		if !(rest > 0) {
			// Only the draft was left, so p[draft] = 1 and u < 1 accepts:
			// not reachable, but never index with -1.
			return false, Result{}, fmt.Errorf("sample: verify: nothing left to sample after rejecting draft %d", draft)
		}
		tok = drawInverseCDF(w, rest, Uniform(p.Seed, h.SampleIndex))
	}
	r := Result{Token: tok}
	if p.WantsLogprobs() {
		r.Logprob, r.TopLogprobs = s.logprobs(row, tok, p.TopLogprobs)
	}
	return accepted, r, nil
}

// ForVerifyStep verifies one speculating StepSeq (seq.Drafts > 0 drafts, the
// last of seq.Tokens) from the target logits of its last seq.Drafts+1
// positions, concatenated, and returns its SeqResult with Accepted and Token
// filled. With seq.Drafts = 0 it is ForStep on the one row.
func (s *Sampler) ForVerifyStep(logits []float32, seq *engine.StepSeq) (engine.SeqResult, error) {
	D := seq.Drafts
	if D < 0 || D >= len(seq.Tokens) {
		return engine.SeqResult{}, fmt.Errorf("sequence %d: %d drafts among %d tokens", seq.SeqID, D, len(seq.Tokens))
	}
	if D == 0 {
		return s.ForStep(logits, seq)
	}
	v, err := s.Verify(logits, seq.Tokens[len(seq.Tokens)-D:], seq.Sampling, historyOf(seq))
	if err != nil {
		return engine.SeqResult{}, fmt.Errorf("sequence %d: %w", seq.SeqID, err)
	}
	res := engine.SeqResult{SeqID: seq.SeqID, Token: v.Next.Token, Logprob: v.Next.Logprob, TopLogprobs: v.Next.TopLogprobs}
	if len(v.Accepted) > 0 {
		res.Accepted = make([]engine.AcceptedToken, len(v.Accepted))
		for i, a := range v.Accepted {
			res.Accepted[i] = engine.AcceptedToken{Token: a.Token, Logprob: a.Logprob, TopLogprobs: a.TopLogprobs}
		}
	}
	return res, nil
}
