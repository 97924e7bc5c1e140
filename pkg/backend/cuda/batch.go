package cuda

/*
#include <stdlib.h>
#include "glmrt.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/glmctl/glmctl/pkg/engine"
)

// cbuf is a growable C allocation. Step's flat arrays live in C memory so no
// Go pointer ever reaches the runtime, and are reused across steps.
type cbuf struct {
	p    unsafe.Pointer
	size uintptr
}

func (b *cbuf) ensure(bytes uintptr) error {
	if bytes <= b.size && b.p != nil {
		return nil
	}
	n := max(bytes, 2*b.size, 64)
	// realloc keeps the contents: the penalty arrays grow while earlier
	// sequences' entries are already in them.
	p := C.realloc(b.p, C.size_t(n))
	if p == nil {
		return fmt.Errorf("allocate %d bytes of step buffers: out of memory", n)
	}
	b.p, b.size = p, n
	return nil
}

func (b *cbuf) free() {
	C.free(b.p)
	b.p, b.size = nil, 0
}

// cslice returns the first n elements of b as a Go slice over C memory,
// growing b as needed.
func cslice[T any](b *cbuf, n int) ([]T, error) {
	var zero T
	if err := b.ensure(uintptr(n) * unsafe.Sizeof(zero)); err != nil {
		return nil, err
	}
	return unsafe.Slice((*T)(b.p), n), nil
}

// stepBuffers holds everything one glmrt_step call reads and writes.
type stepBuffers struct {
	batch  *C.glmrt_batch  // C memory
	result *C.glmrt_result // C memory

	seqs, tokens, blockTables               cbuf
	penTokens, penPrompt, penOutput         cbuf
	masks                                   cbuf
	outTokens, outLogprobs, topIDs, topLogp cbuf
	outStatus                               cbuf
	logits                                  cbuf
	// Speculative decoding: accepted drafts (count, tokens, logprobs, top
	// alternatives) and proposals.
	nAccepted, accepted, acceptedLogp, accTopIDs, accTopLogp, drafts cbuf

	// Dense per-token counters for building each sequence's distinct-token
	// penalty history in O(history), reset through touched after each use.
	promptCount, outputCount []int32
	touched                  []int32
	penLens                  []int // per sequence of the current batch
	nMasks                   int   // token-mask rows of the current batch (reserveMasks)
}

func newStepBuffers() (*stepBuffers, error) {
	s := &stepBuffers{
		batch:  (*C.glmrt_batch)(C.calloc(1, C.sizeof_glmrt_batch)),
		result: (*C.glmrt_result)(C.calloc(1, C.sizeof_glmrt_result)),
	}
	if s.batch == nil || s.result == nil {
		s.free()
		return nil, fmt.Errorf("allocate step buffers: out of memory")
	}
	return s, nil
}

func (s *stepBuffers) free() {
	C.free(unsafe.Pointer(s.batch))
	C.free(unsafe.Pointer(s.result))
	s.batch, s.result = nil, nil
	for _, b := range []*cbuf{&s.seqs, &s.tokens, &s.blockTables, &s.penTokens, &s.penPrompt, &s.penOutput, &s.masks,
		&s.outTokens, &s.outLogprobs, &s.topIDs, &s.topLogp, &s.outStatus, &s.logits,
		&s.nAccepted, &s.accepted, &s.acceptedLogp, &s.accTopIDs, &s.accTopLogp, &s.drafts} {
		b.free()
	}
}

// limits are the runtime's per-step limits (from glmrt_info).
type limits struct {
	vocab, maxContext, blockSize      int
	maxSeqs, maxTokens, maxBlocksSeq  int
	maxTopLogprobs, maxPenaltyEntries int
}

// usesPenalties reports whether the sampler needs the sequence's history,
// and whether the prompt part of it (the repetition penalty only).
func usesPenalties(p engine.SamplingParams) (any, prompt bool) {
	rep := p.RepetitionPenalty != 0 && p.RepetitionPenalty != 1
	return rep || p.FrequencyPenalty != 0 || p.PresencePenalty != 0, rep
}

// fill converts an engine batch into the flat glmrt_batch and sizes the
// result buffers, checking the limits first so errors name the sequence.
func (s *stepBuffers) fill(b *engine.StepBatch, lim limits) error {
	n := len(b.Seqs)
	if n == 0 {
		return fmt.Errorf("step: empty batch")
	}
	if n > lim.maxSeqs {
		return fmt.Errorf("step: %d sequences exceed the runtime's max_seqs_per_step %d", n, lim.maxSeqs)
	}
	nTok, nBlocks, topStride, logitRows, draftStride := 0, 0, 0, 0, 0
	accTop := false // a verifying sequence asks for top logprobs
	for i := range b.Seqs {
		q := &b.Seqs[i]
		if len(q.Tokens) == 0 {
			return fmt.Errorf("step: seq %d (id %d): no tokens", i, q.SeqID)
		}
		if q.Drafts < 0 || q.Drafts >= len(q.Tokens) || (q.Drafts > 0 && !q.Sample) {
			return fmt.Errorf("step: seq %d (id %d): %d drafts among %d tokens (drafts need Sample and a token before them)", i, q.SeqID, q.Drafts, len(q.Tokens))
		}
		if q.Propose < 0 || (q.Propose > 0 && !(q.Draft && q.Sample)) {
			return fmt.Errorf("step: seq %d (id %d): Propose %d needs Draft and Sample", i, q.SeqID, q.Propose)
		}
		if q.Drafts > 0 || q.Propose > 0 {
			draftStride = max(draftStride, q.Drafts, q.Propose)
			accTop = accTop || (q.Drafts > 0 && q.Sampling.TopLogprobs > 0)
		}
		if q.StartPos < 0 || q.StartPos+len(q.Tokens) > lim.maxContext {
			return fmt.Errorf("step: seq %d (id %d): positions %d..%d outside the context [0, %d)", i, q.SeqID, q.StartPos, q.StartPos+len(q.Tokens)-1, lim.maxContext)
		}
		need := (q.StartPos + len(q.Tokens) + lim.blockSize - 1) / lim.blockSize
		if len(q.BlockTable) < need {
			return fmt.Errorf("step: seq %d (id %d): block table has %d blocks, positions up to %d need %d", i, q.SeqID, len(q.BlockTable), q.StartPos+len(q.Tokens)-1, need)
		}
		if need > lim.maxBlocksSeq {
			return fmt.Errorf("step: seq %d (id %d): %d blocks exceed max_blocks_per_seq %d", i, q.SeqID, need, lim.maxBlocksSeq)
		}
		nTok += len(q.Tokens)
		nBlocks += need
		if q.Sample {
			k := q.Sampling.TopLogprobs
			if k < 0 || k > lim.maxTopLogprobs {
				return fmt.Errorf("step: seq %d (id %d): top_logprobs %d out of range [0, %d]", i, q.SeqID, k, lim.maxTopLogprobs)
			}
			topStride = max(topStride, k)
		}
		if q.WantLogits {
			logitRows++
		}
	}
	if nTok > lim.maxTokens {
		return fmt.Errorf("step: %d tokens exceed the runtime's max_tokens_per_step %d", nTok, lim.maxTokens)
	}
	if nBlocks > math.MaxInt32 {
		return fmt.Errorf("step: %d block table entries exceed int32", nBlocks)
	}

	seqs, err := cslice[C.glmrt_seq](&s.seqs, n)
	if err != nil {
		return err
	}
	toks, err := cslice[C.int32_t](&s.tokens, nTok)
	if err != nil {
		return err
	}
	tables, err := cslice[C.int32_t](&s.blockTables, nBlocks)
	if err != nil {
		return err
	}
	nPen, err := s.fillPenalties(b, lim)
	if err != nil {
		return err
	}
	nMasks, err := s.reserveMasks(b, lim)
	if err != nil {
		return err
	}
	maskRow := 0
	tokOff, tabOff, penOff := 0, 0, 0
	for i := range b.Seqs {
		q := &b.Seqs[i]
		for j, t := range q.Tokens {
			if t < 0 || int(t) >= lim.vocab {
				return fmt.Errorf("step: seq %d (id %d): token %d at position %d outside the vocabulary [0, %d)", i, q.SeqID, t, q.StartPos+j, lim.vocab)
			}
			toks[tokOff+j] = C.int32_t(t)
		}
		need := (q.StartPos + len(q.Tokens) + lim.blockSize - 1) / lim.blockSize
		for j, blk := range q.BlockTable[:need] {
			tables[tabOff+j] = C.int32_t(blk)
		}
		cs := &seqs[i]
		*cs = C.glmrt_seq{
			n_tokens:           C.int32_t(len(q.Tokens)),
			start_pos:          C.int32_t(q.StartPos),
			block_table_offset: C.int32_t(tabOff),
			block_table_len:    C.int32_t(need),
			sample:             b2i(q.Sample),
			want_logits:        b2i(q.WantLogits),
			penalty_offset:     C.int32_t(penOff),
			penalty_len:        C.int32_t(s.penLens[i]),
			mask_index:         -1,
			n_drafts:           C.int32_t(q.Drafts),
			draft:              b2i(q.Draft),
			next_token:         -1,
			propose:            C.int32_t(q.Propose),
		}
		if q.Draft && !q.Sample {
			if q.NextToken < -1 || int(q.NextToken) >= lim.vocab {
				return fmt.Errorf("step: seq %d (id %d): next token %d outside the vocabulary [0, %d)", i, q.SeqID, q.NextToken, lim.vocab)
			}
			cs.next_token = C.int32_t(q.NextToken)
		}
		if q.Sample && q.AllowedTokens != nil {
			cs.mask_index = C.int32_t(maskRow)
			maskRow++
		}
		if q.Sample {
			p := q.Sampling
			cs.sampling = C.glmrt_sampling{
				temperature:        C.float(p.Temperature),
				top_k:              C.int32_t(clampInt32(p.TopK)),
				top_p:              C.float(p.TopP),
				min_p:              C.float(p.MinP),
				repetition_penalty: C.float(p.RepetitionPenalty),
				frequency_penalty:  C.float(p.FrequencyPenalty),
				presence_penalty:   C.float(p.PresencePenalty),
				n_top_logprobs:     C.int32_t(p.TopLogprobs),
				// The engine always sets a seed (its own when the request
				// has none), so Seed is used as is, as by the CPU sampler.
				seed:         C.uint64_t(uint64(p.Seed)),
				sample_index: C.int64_t(q.SampleIndex),
			}
		}
		tokOff += len(q.Tokens)
		tabOff += need
		penOff += s.penLens[i]
	}

	bt := s.batch
	*bt = C.glmrt_batch{
		n_seqs:                C.int32_t(n),
		n_tokens:              C.int32_t(nTok),
		seqs:                  &seqs[0],
		token_ids:             &toks[0],
		n_block_table_entries: C.int32_t(nBlocks),
		n_penalty_entries:     C.int32_t(nPen),
	}
	if nBlocks > 0 {
		bt.block_tables = &tables[0]
	}
	if nPen > 0 {
		bt.penalty_tokens = (*C.int32_t)(s.penTokens.p)
		bt.penalty_prompt_counts = (*C.int32_t)(s.penPrompt.p)
		bt.penalty_output_counts = (*C.int32_t)(s.penOutput.p)
	}
	if nMasks > 0 {
		// token_masks stays NULL: the rows go to glmrt_step_finish.
		bt.n_token_masks = C.int32_t(nMasks)
		bt.mask_words = C.int32_t(engine.MaskWords(lim.vocab))
	}
	return s.sizeResult(n, topStride, logitRows, lim.vocab, draftStride, accTop)
}

func clampInt32(v int) int {
	return max(min(v, math.MaxInt32), math.MinInt32)
}

// reserveMasks checks the token mask of every sampled, constrained sequence
// and sizes C memory for them, one row each in sequence order; the rows are
// written by copyMasks once the engine has filled them (StepBatch.AwaitMasks).
func (s *stepBuffers) reserveMasks(b *engine.StepBatch, lim limits) (int, error) {
	words := engine.MaskWords(lim.vocab)
	n := 0
	for i := range b.Seqs {
		q := &b.Seqs[i]
		if !q.Sample || q.AllowedTokens == nil {
			continue
		}
		if len(q.AllowedTokens) < words {
			return 0, fmt.Errorf("step: seq %d (id %d): token mask has %d words, the vocabulary of %d needs %d", i, q.SeqID, len(q.AllowedTokens), lim.vocab, words)
		}
		n++
	}
	s.nMasks = n
	if n == 0 {
		return 0, nil
	}
	if _, err := cslice[C.uint32_t](&s.masks, n*words); err != nil {
		return 0, err
	}
	return n, nil
}

// copyMasks writes the rows reserveMasks sized, from the masks as they are
// now, and returns them for glmrt_step_finish (nil when there are none).
func (s *stepBuffers) copyMasks(b *engine.StepBatch, lim limits) *C.uint32_t {
	if s.nMasks == 0 {
		return nil
	}
	words := engine.MaskWords(lim.vocab)
	rows := unsafe.Slice((*C.uint32_t)(s.masks.p), s.nMasks*words)
	r := 0
	for i := range b.Seqs {
		q := &b.Seqs[i]
		if !q.Sample || q.AllowedTokens == nil {
			continue
		}
		dst := rows[r*words : (r+1)*words]
		for j, w := range q.AllowedTokens[:words] {
			dst[j] = C.uint32_t(w)
		}
		r++
	}
	return &rows[0]
}

// fillPenalties writes the distinct-token history of every sampled sequence
// whose parameters use penalties: one entry per distinct token with its
// prompt and output counts (prompt tokens only when the repetition penalty,
// the one that reads them, is on). Others get penalty_len 0.
func (s *stepBuffers) fillPenalties(b *engine.StepBatch, lim limits) (int, error) {
	s.penLens = s.penLens[:0]
	total := 0
	for i := range b.Seqs {
		q := &b.Seqs[i]
		use, withPrompt := usesPenalties(q.Sampling)
		if !q.Sample || !use {
			s.penLens = append(s.penLens, 0)
			continue
		}
		if len(s.promptCount) < lim.vocab {
			s.promptCount = make([]int32, lim.vocab)
			s.outputCount = make([]int32, lim.vocab)
		}
		s.touched = s.touched[:0]
		count := func(toks []int32, counts []int32, what string) error {
			for j, t := range toks {
				if t < 0 || int(t) >= lim.vocab {
					return fmt.Errorf("step: seq %d (id %d): %s token %d (index %d) outside the vocabulary [0, %d)", i, q.SeqID, what, t, j, lim.vocab)
				}
				if s.promptCount[t] == 0 && s.outputCount[t] == 0 {
					s.touched = append(s.touched, t)
				}
				counts[t]++
			}
			return nil
		}
		var err error
		if withPrompt {
			err = count(q.PromptTokens, s.promptCount, "prompt")
		}
		if err == nil {
			err = count(q.OutputTokens, s.outputCount, "output")
		}
		if err != nil {
			s.resetCounts()
			return 0, err
		}
		m := len(s.touched)
		if total+m > lim.maxPenaltyEntries {
			s.resetCounts()
			return 0, fmt.Errorf("step: penalty history of %d distinct tokens (seq %d, id %d, brings it past) exceeds max_penalty_entries %d", total+m, i, q.SeqID, lim.maxPenaltyEntries)
		}
		toks, err1 := cslice[C.int32_t](&s.penTokens, total+m)
		pc, err2 := cslice[C.int32_t](&s.penPrompt, total+m)
		oc, err3 := cslice[C.int32_t](&s.penOutput, total+m)
		if err := errors.Join(err1, err2, err3); err != nil {
			s.resetCounts()
			return 0, err
		}
		for j, t := range s.touched {
			toks[total+j] = C.int32_t(t)
			pc[total+j] = C.int32_t(s.promptCount[t])
			oc[total+j] = C.int32_t(s.outputCount[t])
		}
		s.resetCounts()
		s.penLens = append(s.penLens, m)
		total += m
	}
	return total, nil
}

func (s *stepBuffers) resetCounts() {
	for _, t := range s.touched {
		s.promptCount[t], s.outputCount[t] = 0, 0
	}
	s.touched = s.touched[:0]
}

// sizeResult points the result struct at buffers large enough for n
// sequences, topStride alternatives each, logitRows rows of logits and
// draftStride accepted drafts and proposals each (with top alternatives for
// the accepted ones when accTop).
func (s *stepBuffers) sizeResult(n, topStride, logitRows, vocab, draftStride int, accTop bool) error {
	toks, err1 := cslice[C.int32_t](&s.outTokens, n)
	lps, err2 := cslice[C.float](&s.outLogprobs, n)
	st, err3 := cslice[C.int32_t](&s.outStatus, n)
	if err := errors.Join(err1, err2, err3); err != nil {
		return err
	}
	r := s.result
	// With sample_status set, a sequence whose logits cannot be sampled
	// (NaN / +Inf, all -Inf) fails alone; the others keep their tokens.
	*r = C.glmrt_result{tokens: &toks[0], logprobs: &lps[0], top_stride: C.int32_t(topStride), sample_status: &st[0]}
	if topStride > 0 {
		ids, err1 := cslice[C.int32_t](&s.topIDs, n*topStride)
		tlp, err2 := cslice[C.float](&s.topLogp, n*topStride)
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		r.top_ids, r.top_logprobs = &ids[0], &tlp[0]
	}
	if logitRows > 0 {
		lg, err := cslice[C.float](&s.logits, logitRows*vocab)
		if err != nil {
			return err
		}
		r.logits, r.logits_capacity = &lg[0], C.int64_t(logitRows*vocab)
	}
	if draftStride > 0 {
		na, err1 := cslice[C.int32_t](&s.nAccepted, n)
		acc, err2 := cslice[C.int32_t](&s.accepted, n*draftStride)
		alp, err3 := cslice[C.float](&s.acceptedLogp, n*draftStride)
		dr, err4 := cslice[C.int32_t](&s.drafts, n*draftStride)
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			return err
		}
		r.draft_stride = C.int32_t(draftStride)
		r.n_accepted, r.accepted, r.accepted_logprobs, r.drafts = &na[0], &acc[0], &alp[0], &dr[0]
		if accTop && topStride > 0 {
			ids, err1 := cslice[C.int32_t](&s.accTopIDs, n*draftStride*topStride)
			tlp, err2 := cslice[C.float](&s.accTopLogp, n*draftStride*topStride)
			if err := errors.Join(err1, err2); err != nil {
				return err
			}
			r.accepted_top_ids, r.accepted_top_logprobs = &ids[0], &tlp[0]
		}
	}
	return nil
}

// results converts the filled result buffers back, copying out of C memory.
func (s *stepBuffers) results(b *engine.StepBatch, vocab int) ([]engine.SeqResult, error) {
	n := len(b.Seqs)
	r := s.result
	toks := unsafe.Slice((*C.int32_t)(s.outTokens.p), n)
	lps := unsafe.Slice((*C.float)(s.outLogprobs.p), n)
	status := unsafe.Slice((*C.int32_t)(s.outStatus.p), n)
	stride := int(r.top_stride)
	out := make([]engine.SeqResult, n)
	row := 0
	for i := range b.Seqs {
		q := &b.Seqs[i]
		res := engine.SeqResult{SeqID: q.SeqID}
		if q.Sample && status[i] != C.GLMRT_SAMPLE_OK {
			cause := engine.ErrNonFiniteLogits
			if status[i] == C.GLMRT_SAMPLE_MASKED_ALL {
				cause = engine.ErrNoAllowedToken
			}
			res.Err = fmt.Errorf("cuda step: seq %d (id %d): %s: %w", i, q.SeqID, sampleStatusText(int(status[i])), cause)
		} else if q.Sample {
			res.Token = int32(toks[i])
			if res.Token < 0 || int(res.Token) >= vocab {
				return nil, fmt.Errorf("glmrt_step: seq %d (id %d): sampled token %d outside the vocabulary [0, %d)", i, q.SeqID, res.Token, vocab)
			}
			res.Logprob = float32(lps[i])
			k := q.Sampling.TopLogprobs
			if k > 0 {
				res.TopLogprobs = topLogprobs(s.topIDs.p, s.topLogp.p, i*stride, k)
			}
			if err := s.speculative(&res, q, i, k, stride, vocab); err != nil {
				return nil, fmt.Errorf("glmrt_step: seq %d (id %d): %w", i, q.SeqID, err)
			}
		}
		if q.WantLogits {
			src := unsafe.Slice((*float32)(s.logits.p), (row+1)*vocab)[row*vocab:]
			res.Logits = append([]float32(nil), src...)
			row++
		}
		out[i] = res
	}
	return out, nil
}

// topLogprobs reads k alternatives from the C arrays ids / lps at offset
// off, up to the first -1.
func topLogprobs(ids, lps unsafe.Pointer, off, k int) []engine.TokenLogprob {
	idv := unsafe.Slice((*C.int32_t)(ids), off+k)[off:]
	lpv := unsafe.Slice((*C.float)(lps), off+k)[off:]
	out := make([]engine.TokenLogprob, 0, k)
	for j, id := range idv {
		if id < 0 {
			break
		}
		out = append(out, engine.TokenLogprob{Token: int32(id), Logprob: float32(lpv[j])})
	}
	return out
}

// speculative fills res.Accepted (q.Drafts > 0) and res.Drafts (q.Propose >
// 0) of sequence i from the result buffers; k top alternatives each.
func (s *stepBuffers) speculative(res *engine.SeqResult, q *engine.StepSeq, i, k, stride, vocab int) error {
	r := s.result
	ds := int(r.draft_stride)
	if q.Drafts > 0 {
		a := int(unsafe.Slice((*C.int32_t)(s.nAccepted.p), i+1)[i])
		if a < 0 || a > q.Drafts {
			return fmt.Errorf("%d drafts accepted of %d", a, q.Drafts)
		}
		drafts := q.Tokens[len(q.Tokens)-q.Drafts:]
		acc := unsafe.Slice((*C.int32_t)(s.accepted.p), (i+1)*ds)[i*ds:]
		alp := unsafe.Slice((*C.float)(s.acceptedLogp.p), (i+1)*ds)[i*ds:]
		for j := range a {
			if int32(acc[j]) != drafts[j] {
				return fmt.Errorf("accepted token %d at draft %d is not the draft %d", acc[j], j, drafts[j])
			}
			t := engine.AcceptedToken{Token: int32(acc[j]), Logprob: float32(alp[j])}
			if k > 0 && s.accTopIDs.p != nil {
				t.TopLogprobs = topLogprobs(s.accTopIDs.p, s.accTopLogp.p, (i*ds+j)*stride, k)
			}
			res.Accepted = append(res.Accepted, t)
		}
	}
	if q.Propose > 0 {
		dr := unsafe.Slice((*C.int32_t)(s.drafts.p), (i+1)*ds)[i*ds:]
		for j := range q.Propose {
			d := int32(dr[j])
			if d < 0 {
				break // the runtime proposes fewer than asked (one per step)
			}
			if int(d) >= vocab {
				return fmt.Errorf("proposed token %d outside the vocabulary [0, %d)", d, vocab)
			}
			res.Drafts = append(res.Drafts, d)
		}
	}
	return nil
}

// sampleStatusText says why the runtime could not sample a sequence
// (glmrt_result.sample_status).
func sampleStatusText(st int) string {
	switch st {
	case C.GLMRT_SAMPLE_NONFINITE:
		return "a logit is NaN or +Inf"
	case C.GLMRT_SAMPLE_ALL_NEG_INF:
		return "every logit is -Inf"
	case C.GLMRT_SAMPLE_ALL_NEG_INF_PENALTY:
		return "every logit is -Inf after the penalties"
	case C.GLMRT_SAMPLE_NONE_LEFT:
		return "no token left to sample"
	case C.GLMRT_SAMPLE_MASKED_ALL:
		return "the token mask allows no token with a finite logit"
	default:
		return fmt.Sprintf("unknown sample status %d", st)
	}
}
