package cpu

import (
	"context"
	"fmt"
	"math"

	"github.com/glmctl/glmctl/pkg/engine"
)

// Speculative decoding with the checkpoint's MTP layer (docs/speculative.md).
// After the target forward and verification (heads), the draft pass runs the
// MTP layer over every valid position of each drafting sequence with the
// token that follows it (step 3), then chains it Propose-1 more times from
// the last valid position to propose the next step's drafts (step 4).
//
// Numerics: the MTP layer's hidden input h_i is the final-normed target
// state exactly as lm_head reads it (BF16-rounded on the FP8 path); its
// quantized linears, KV cache and attention follow the same rules as the
// main layers (a sequence's MTP rows use the decode attention schedule when
// its target rows did, chained rows always); eh_proj is a float32 linear;
// shared_head.norm's output is rounded to BF16 on the FP8 path before the
// main lm_head, like the final norm's.

// mtpScratch is the draft pass's working memory.
type mtpScratch struct {
	hn     []float32 // final-normed target hidden state per token of the step [T][H]
	hid    []float32 // hidden input of the pass's rows [R][H]
	x      []float32 // [enorm(embed(t)) ; hnorm(h)] per row [R][2H]
	z      []float32 // shared_head.norm output of the rows that need logits
	logits []float32
	// Per proposing sequence (batch index in prop): the row of its last
	// valid position in the current pass, and its MTP output there (the
	// chained hidden input).
	prop    []int
	propRow []int
	chain   []float32 // [P][H]
}

// anyDraft reports whether some sequence of the batch runs the MTP layer.
func anyDraft(batch *engine.StepBatch) bool {
	for i := range batch.Seqs {
		if batch.Seqs[i].Draft {
			return true
		}
	}
	return false
}

// validateDraft checks the speculative fields of one sequence
// (docs/speculative.md), naming the field and the sequence.
func (b *Backend) validateDraft(s *engine.StepSeq) error {
	maxD := b.opts.DraftTokens
	V := b.cfg.VocabSize
	switch {
	case s.NextToken < -1 || int(s.NextToken) >= V:
		return fmt.Errorf("sequence %d: NextToken %d is outside the vocabulary [0, %d) (-1: unknown)", s.SeqID, s.NextToken, V)
	case s.Drafts < 0 || s.Propose < 0:
		return fmt.Errorf("sequence %d: Drafts %d and Propose %d must be >= 0", s.SeqID, s.Drafts, s.Propose)
	case !s.Draft && (s.Drafts > 0 || s.Propose > 0):
		return fmt.Errorf("sequence %d: Drafts %d / Propose %d without Draft set", s.SeqID, s.Drafts, s.Propose)
	case !s.Draft:
		return nil
	case maxD == 0:
		return fmt.Errorf("sequence %d: Draft set, but the backend runs no draft model (MaxDraftTokens 0; open it with Options.DraftTokens > 0)", s.SeqID)
	case s.AllowedTokens != nil:
		return fmt.Errorf("sequence %d: Draft set together with AllowedTokens (a constrained sequence cannot speculate)", s.SeqID)
	case s.WantLogits:
		return fmt.Errorf("sequence %d: Draft set together with WantLogits", s.SeqID)
	case s.Drafts > 0 && !s.Sample:
		return fmt.Errorf("sequence %d: Drafts %d without Sample (drafts are verified by sampling)", s.SeqID, s.Drafts)
	case s.Drafts > maxD:
		return fmt.Errorf("sequence %d: Drafts %d exceeds MaxDraftTokens %d", s.SeqID, s.Drafts, maxD)
	case s.Drafts >= len(s.Tokens):
		return fmt.Errorf("sequence %d: Drafts %d with only %d tokens (the first token is never a draft)", s.SeqID, s.Drafts, len(s.Tokens))
	case s.Propose > 0 && !s.Sample:
		return fmt.Errorf("sequence %d: Propose %d without Sample (proposals follow the sampled token)", s.SeqID, s.Propose)
	case s.Propose > maxD:
		return fmt.Errorf("sequence %d: Propose %d exceeds MaxDraftTokens %d", s.SeqID, s.Propose, maxD)
	}
	// Chained proposals write the MTP cache up to position end+Propose-2.
	bs := b.kvBlockSize
	if last := s.StartPos + len(s.Tokens) + s.Propose - 2; s.Propose > 1 && len(s.BlockTable) < last/bs+1 {
		return fmt.Errorf("sequence %d: block table has %d blocks, Propose %d writes the MTP cache up to position %d and needs %d (block size %d)",
			s.SeqID, len(s.BlockTable), s.Propose, last, last/bs+1, bs)
	}
	return nil
}

// normDraftRows computes the final-normed hidden state of every token of
// the drafting sequences into s.mtp.hn (the rows lm_head reads, and the MTP
// layer's h_i).
func (b *Backend) normDraftRows(batch *engine.StepBatch) {
	s, H := &b.s, b.cfg.HiddenSize
	s.mtp.hn = grow(s.mtp.hn, len(s.tok)*H)
	for i := range batch.Seqs {
		if !batch.Seqs[i].Draft {
			continue
		}
		for t := s.first[i]; t <= s.last[i]; t++ {
			b.finalNorm(s.mtp.hn[t*H:(t+1)*H], s.h[t*H:(t+1)*H])
		}
	}
}

// draft runs steps 3 and 4 of docs/speculative.md for every drafting
// sequence whose verification succeeded, filling results[i].Drafts.
func (b *Backend) draft(ctx context.Context, batch *engine.StepBatch, results []engine.SeqResult) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("cpu step: cancelled before the MTP layer: %w", err)
	}
	R := b.mtpStepRows(batch, results)
	if R == 0 {
		return nil
	}
	s, m := &b.s, &b.s.mtp
	rows := m.propRow // draft logits only where a proposal is asked for
	if b.mtpHook != nil {
		rows = make([]int, R)
		for r := range rows {
			rows[r] = r
		}
	}
	drafts := b.mtpPass(R, rows)
	if b.mtpHook != nil {
		V := b.cfg.VocabSize
		for k, r := range rows {
			b.mtpHook(batch.Seqs[s.seqOf[r]].SeqID, s.pos[r], m.logits[k*V:(k+1)*V])
		}
	}
	for k, i := range m.prop {
		results[i].Drafts = make([]int32, batch.Seqs[i].Propose)
		if b.mtpHook != nil {
			k = m.propRow[k] // drafts are per row: every row had logits
		}
		results[i].Drafts[0] = drafts[k]
	}
	return b.chain(ctx, batch, results)
}

// mtpStepRows lays out step 3's rows: for each drafting sequence without an
// error, its valid positions s..v paired with the token that follows each
// (the step's next token inside it; at v the sampled Token, or NextToken for
// a non-final prefill chunk, skipped when -1). It fills the row descriptors
// and s.mtp.hid, records the proposing sequences, and returns the row count.
func (b *Backend) mtpStepRows(batch *engine.StepBatch, results []engine.SeqResult) int {
	s, H := &b.s, b.cfg.HiddenSize
	m := &s.mtp
	m.prop, m.propRow = m.prop[:0], m.propRow[:0]
	// Gather first: the rows replace the target's descriptors (s.tok ...);
	// only s.first and s.mtp.hn of the target pass are read.
	type rowSrc struct{ seq, t, pos, next int }
	var rows []rowSrc
	for i := range batch.Seqs {
		seq := &batch.Seqs[i]
		if !seq.Draft || results[i].Err != nil {
			continue
		}
		v := seq.StartPos + len(seq.Tokens) - 1 - seq.Drafts + len(results[i].Accepted)
		for p := seq.StartPos; p <= v; p++ {
			next := int(seq.NextToken)
			switch {
			case p < v:
				next = int(seq.Tokens[p+1-seq.StartPos])
			case seq.Sample:
				next = int(results[i].Token)
			}
			if next < 0 {
				continue // the prompt's next token is not known yet
			}
			if p == v && seq.Propose > 0 {
				m.prop = append(m.prop, i)
				m.propRow = append(m.propRow, len(rows))
			}
			rows = append(rows, rowSrc{seq: i, t: s.first[i] + p - seq.StartPos, pos: p, next: next})
		}
	}
	R := len(rows)
	m.hid = grow(m.hid, R*H)
	for r, src := range rows {
		copy(m.hid[r*H:(r+1)*H], m.hn[src.t*H:(src.t+1)*H])
	}
	b.sizeRows(R)
	for r, src := range rows {
		seq := &batch.Seqs[src.seq]
		s.tok[r], s.pos[r], s.seqOf[r] = src.next, src.pos, src.seq
		s.table[r], s.decode[r] = seq.BlockTable, len(seq.Tokens) == 1 || seq.Drafts > 0
	}
	return R
}

// chain runs the Propose-1 chained MTP passes (step 4): pass j feeds each
// sequence still proposing its MTP output of pass j-1 (before
// shared_head.norm) and its draft j-1, at the next position.
func (b *Backend) chain(ctx context.Context, batch *engine.StepBatch, results []engine.SeqResult) error {
	s, H := &b.s, b.cfg.HiddenSize
	m := &s.mtp
	// Keep the proposing rows' outputs and positions before the next pass
	// overwrites s.h.
	P := len(m.prop)
	m.chain = grow(m.chain, P*H)
	pos := make([]int, P)
	for k, r := range m.propRow {
		copy(m.chain[k*H:(k+1)*H], s.h[r*H:(r+1)*H])
		pos[k] = s.pos[r]
	}
	for j := 1; ; j++ { // drafts[j] is proposed by this pass
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("cpu step: cancelled before MTP proposal %d: %w", j+1, err)
		}
		// Sequences still proposing, in m.prop order (compacted in place).
		live := m.prop[:0]
		liveChain := m.chain[:0]
		livePos := pos[:0]
		for k, i := range m.prop {
			if j < batch.Seqs[i].Propose {
				live = append(live, i)
				liveChain = append(liveChain, m.chain[k*H:(k+1)*H]...)
				livePos = append(livePos, pos[k]+1)
			}
		}
		m.prop, m.chain, pos = live, liveChain, livePos
		R := len(m.prop)
		if R == 0 {
			return nil
		}
		b.sizeRows(R)
		m.hid = grow(m.hid, R*H)
		copy(m.hid, m.chain)
		m.propRow = growInt(m.propRow, R)
		for r, i := range m.prop {
			seq := &batch.Seqs[i]
			s.tok[r], s.pos[r], s.seqOf[r] = int(results[i].Drafts[j-1]), pos[r], i
			s.table[r], s.decode[r] = seq.BlockTable, true
			m.propRow[r] = r
		}
		drafts := b.mtpPass(R, m.propRow)
		for r, i := range m.prop {
			results[i].Drafts[j] = drafts[r]
			copy(m.chain[r*H:(r+1)*H], s.h[r*H:(r+1)*H])
		}
	}
}

// mtpPass runs the MTP layer on the first R rows (descriptors set, hidden
// inputs in s.mtp.hid) and leaves its output v in s.h. For each row in
// rows it computes the draft logits (into s.mtp.logits, in rows order) and
// returns the greedy drafts.
func (b *Backend) mtpPass(R int, rows []int) []int32 {
	cfg, s, mw := b.cfg, &b.s, b.w.mtp
	H, V := cfg.HiddenSize, cfg.VocabSize
	eps := float32(cfg.RMSNormEps)
	m := &s.mtp
	m.x = grow(m.x, R*2*H)
	for r := range R {
		tok := s.tok[r]
		x := m.x[r*2*H : (r+1)*2*H]
		rmsNorm(x[:H], b.w.embed[tok*H:(tok+1)*H], mw.enorm, eps)
		rmsNorm(x[H:], m.hid[r*H:(r+1)*H], mw.hnorm, eps)
	}
	s.h = grow(s.h, R*H)
	b.linear(s.h, m.x, R, &mw.ehProj)
	b.ropeRows(R)
	b.layer(&mw.layer, cfg.NumHiddenLayers, R)

	n := len(rows)
	if n == 0 {
		return nil
	}
	m.z = grow(m.z, n*H)
	for k, r := range rows {
		z := m.z[k*H : (k+1)*H]
		rmsNorm(z, s.h[r*H:(r+1)*H], mw.headNorm, eps)
		if b.opts.FP8Activations {
			roundBF16(z) // lm_head reads BF16 on the GPU's FP8 path
		}
	}
	m.logits = grow(m.logits, n*V)
	b.linear(m.logits, m.z, n, &b.w.lmHead)
	drafts := make([]int32, n)
	for k := range rows {
		drafts[k] = argmaxFinite(m.logits[k*V : (k+1)*V])
	}
	return drafts
}

// argmaxFinite is the greedy draft: the largest finite logit, the lowest id
// on ties; 0 when no logit is finite (a broken draft costs only its
// rejection).
func argmaxFinite(row []float32) int32 {
	best := -1
	for i, v := range row {
		if !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) && (best < 0 || v > row[best]) {
			best = i
		}
	}
	return int32(max(best, 0))
}
