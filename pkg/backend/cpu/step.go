package cpu

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/glmctl/glmctl/pkg/engine"
)

// scratch is the per-step working memory, grown as needed and reused.
type scratch struct {
	// Rows of the current pass (the target's tokens, or the MTP layer's
	// rows): token id, position, owning sequence (batch index), that
	// sequence's block table, and whether attention runs the GPU's decode
	// schedule for the row (attentionGPU).
	tok, pos, seqOf []int
	table           [][]int32
	decode          []bool
	last            []int // per sequence: index of its last token, or -1
	first           []int // per sequence: index of its first token

	h, a, tmp   []float32 // [T][H]
	q, o        []float32 // [T][NH·D]
	k, v        []float32 // [T][NKV·D]
	cos, sin    []float32 // [T][rot/2]
	xq          []float32 // quantized linear input [rows][in]
	xs          []float32 // per-row activation scales
	inter, up   []float32 // [T][I] MLP intermediates
	attn        [][]float32
	invFreq     []float32
	routerOut   []float32 // [T][E]
	expertIdx   []int     // [T][K]
	expertWts   []float32 // [T][K]
	routed      []float32 // [T][H] routed-expert accumulator
	tokens      [][]int   // per expert: token indices
	slots       [][]int   // per expert: which of the token's K picks
	xe, ye      []float32 // gathered expert input/output rows
	rsc         routerScratch
	poisoned    []int     // tokens of this MoE call with fewer than top_k finite router scores
	headRows    []float32 // normed hidden states that lm_head reads [R][H]
	logits      []float32 // [R][V]
	logitSeqIdx []int     // per sequence with logits: batch index
	logitRow0   []int     // per sequence with logits: its first row of headRows
	mtp         mtpScratch
}

func grow(buf []float32, n int) []float32 {
	if cap(buf) < n {
		return make([]float32, n)
	}
	return buf[:n]
}

func growInt(buf []int, n int) []int {
	if cap(buf) < n {
		return make([]int, n)
	}
	return buf[:n]
}

// validate checks a batch against the model and the KV pool, naming the
// sequence and field at fault. It never panics on bad input.
func (b *Backend) validate(batch *engine.StepBatch) error {
	if len(batch.Seqs) == 0 {
		return errors.New("empty batch (no sequences)")
	}
	V, maxCtx, bs := b.cfg.VocabSize, b.cfg.MaxPositionEmbeddings, b.kvBlockSize
	// written maps each KV slot written this step to its sequence, so two
	// sequences cannot write the same slot (their results would depend on
	// the order of writes).
	written := make(map[int64]int, batch.NumTokens())
	for i := range batch.Seqs {
		s := &batch.Seqs[i]
		if len(s.Tokens) == 0 {
			return fmt.Errorf("sequence %d (batch index %d): no tokens", s.SeqID, i)
		}
		if s.StartPos < 0 {
			return fmt.Errorf("sequence %d: start position %d is negative", s.SeqID, s.StartPos)
		}
		end := s.StartPos + len(s.Tokens)
		if end > maxCtx {
			return fmt.Errorf("sequence %d: positions %d..%d exceed the max context %d (max_position_embeddings)",
				s.SeqID, s.StartPos, end-1, maxCtx)
		}
		for j, t := range s.Tokens {
			if t < 0 || int(t) >= V {
				return fmt.Errorf("sequence %d: token %d at index %d is outside the vocabulary [0, %d)", s.SeqID, t, j, V)
			}
		}
		need := (end + bs - 1) / bs
		if len(s.BlockTable) < need {
			return fmt.Errorf("sequence %d: block table has %d blocks, positions 0..%d need %d (block size %d)",
				s.SeqID, len(s.BlockTable), end-1, need, bs)
		}
		for j, blk := range s.BlockTable {
			if blk < 0 || int(blk) >= b.numKVBlocks {
				return fmt.Errorf("sequence %d: block table entry %d is block %d, outside the pool [0, %d)", s.SeqID, j, blk, b.numKVBlocks)
			}
		}
		if err := b.validateDraft(s); err != nil {
			return err
		}
		// Chained proposals write the MTP layer's KV at positions up to
		// end+Propose-2 (validateDraft checked the block table covers them).
		for p := s.StartPos; p < end+max(0, s.Propose-1); p++ {
			slot := int64(s.BlockTable[p/bs])*int64(bs) + int64(p%bs)
			if other, dup := written[slot]; dup && other != i {
				return fmt.Errorf("sequences %d and %d both write KV block %d slot %d in one step",
					batch.Seqs[other].SeqID, s.SeqID, s.BlockTable[p/bs], p%bs)
			}
			written[slot] = i
		}
	}
	return nil
}

// kvOffset is the index in b.kv of (block, layer, k=0|v=1, slot). Layer
// num_hidden_layers, when the pool has it, is the MTP layer's.
func (b *Backend) kvOffset(block, layer, which, slot int) int {
	kvDim := b.cfg.KVDim()
	return (((block*b.kvLayers+layer)*2+which)*b.kvBlockSize + slot) * kvDim
}

func (b *Backend) forward(ctx context.Context, batch *engine.StepBatch) ([]engine.SeqResult, error) {
	H := b.cfg.HiddenSize
	T := batch.NumTokens()
	s := &b.s
	b.targetRows(batch, T)
	// The rows point at the batch's block tables; let go of them when the
	// step ends (the engine owns the tables).
	defer func() { clear(s.table[:cap(s.table)]) }()
	s.h = grow(s.h, T*H)
	for t, tok := range s.tok {
		copy(s.h[t*H:(t+1)*H], b.w.embed[tok*H:(tok+1)*H])
	}
	b.ropeRows(T)
	for l := range b.w.layers {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("cpu step: cancelled before layer %d: %w", l, err)
		}
		b.layer(&b.w.layers[l], l, T)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("cpu step: cancelled before lm_head: %w", err)
	}
	results, err := b.heads(batch)
	if err != nil || !anyDraft(batch) {
		return results, err
	}
	if err := b.draft(ctx, batch, results); err != nil {
		return nil, err
	}
	return results, nil
}

// targetRows describes the step's T tokens as rows: every sequence's new
// tokens in batch order. A row runs the GPU's decode attention schedule when
// its sequence has one token, or verifies drafts: the CUDA backend runs each
// verify position through its decode kernel with its own context length, so
// a verified token sees the arithmetic of plain one-token decoding.
func (b *Backend) targetRows(batch *engine.StepBatch, T int) {
	s := &b.s
	b.sizeRows(T)
	s.last = growInt(s.last, len(batch.Seqs))
	s.first = growInt(s.first, len(batch.Seqs))
	t := 0
	for i := range batch.Seqs {
		seq := &batch.Seqs[i]
		decode := len(seq.Tokens) == 1 || seq.Drafts > 0
		s.first[i] = t
		for j, tok := range seq.Tokens {
			s.tok[t], s.pos[t], s.seqOf[t] = int(tok), seq.StartPos+j, i
			s.table[t], s.decode[t] = seq.BlockTable, decode
			t++
		}
		s.last[i] = t - 1
	}
}

// sizeRows sizes the row descriptors for n rows.
func (b *Backend) sizeRows(n int) {
	s := &b.s
	s.tok, s.pos, s.seqOf = growInt(s.tok, n), growInt(s.pos, n), growInt(s.seqOf, n)
	if cap(s.table) < n {
		s.table, s.decode = make([][]int32, n), make([]bool, n)
	}
	s.table, s.decode = s.table[:n], s.decode[:n]
}

// ropeRows fills the RoPE tables of the first n rows from their positions.
func (b *Backend) ropeRows(n int) {
	s := &b.s
	rot := b.cfg.RotaryDim()
	if s.invFreq == nil {
		s.invFreq = ropeInvFreq(rot, b.cfg.RopeTheta)
	}
	half := rot / 2
	s.cos, s.sin = grow(s.cos, n*half), grow(s.sin, n*half)
	for t, p := range s.pos[:n] {
		ropeAngles(p, s.invFreq, s.cos[t*half:(t+1)*half], s.sin[t*half:(t+1)*half])
	}
}

// logitRows is how many positions of seq get target logits: the last one
// where it samples or asks for logits, and with drafts to verify the
// Drafts+1 positions that predict each draft and the token after them.
func logitRows(seq *engine.StepSeq) int {
	switch {
	case seq.Sample:
		return seq.Drafts + 1
	case seq.WantLogits:
		return 1
	}
	return 0
}

// heads computes the final norm and lm_head where logitRows asks, then
// samples (or verifies drafts). For a sequence with Draft set it also keeps
// the final-normed hidden state of every position (s.mtp.hn), the MTP
// layer's input.
func (b *Backend) heads(batch *engine.StepBatch) ([]engine.SeqResult, error) {
	cfg, s := b.cfg, &b.s
	H, V := cfg.HiddenSize, cfg.VocabSize
	results := make([]engine.SeqResult, len(batch.Seqs))
	for i := range batch.Seqs {
		results[i].SeqID = batch.Seqs[i].SeqID
	}
	if anyDraft(batch) {
		b.normDraftRows(batch)
	}
	s.logitSeqIdx, s.logitRow0 = s.logitSeqIdx[:0], s.logitRow0[:0]
	n := 0
	for i := range batch.Seqs {
		if k := logitRows(&batch.Seqs[i]); k > 0 {
			s.logitSeqIdx = append(s.logitSeqIdx, i)
			s.logitRow0 = append(s.logitRow0, n)
			n += k
		}
	}
	if n == 0 {
		return results, nil
	}
	s.headRows = grow(s.headRows, n*H)
	for r, i := range s.logitSeqIdx {
		seq := &batch.Seqs[i]
		k := logitRows(seq)
		for j := range k {
			t := s.last[i] - (k - 1) + j
			row := s.headRows[(s.logitRow0[r]+j)*H:][:H]
			if seq.Draft {
				copy(row, s.mtp.hn[t*H:(t+1)*H]) // the same norm, computed once
				continue
			}
			b.finalNorm(row, s.h[t*H:(t+1)*H])
		}
	}
	s.logits = grow(s.logits, n*V)
	b.linear(s.logits, s.headRows, n, &b.w.lmHead)
	for r, i := range s.logitSeqIdx {
		seq := &batch.Seqs[i]
		logits := s.logits[s.logitRow0[r]*V : (s.logitRow0[r]+logitRows(seq))*V]
		if seq.Sample {
			var res engine.SeqResult
			var err error
			if seq.Drafts > 0 {
				res, err = b.sampler.ForVerifyStep(logits, seq)
			} else {
				res, err = b.sampler.ForStep(logits, seq)
			}
			if err != nil {
				// This sequence alone fails (non-finite logits wrap
				// engine.ErrNonFiniteLogits); the others keep their tokens.
				res = engine.SeqResult{SeqID: seq.SeqID, Err: fmt.Errorf("cpu step: %w", err)}
			}
			results[i] = res
		}
		if seq.WantLogits {
			results[i].Logits = append([]float32(nil), logits[len(logits)-V:]...)
		}
	}
	return results, nil
}

// finalNorm is the final RMSNorm of one hidden row into dst: what lm_head
// reads, rounded to BF16 on the FP8 path (the GPU's lm_head is a BF16 GEMM).
func (b *Backend) finalNorm(dst, x []float32) {
	rmsNorm(dst, x, b.w.finalNorm, float32(b.cfg.RMSNormEps))
	if b.opts.FP8Activations {
		roundBF16(dst)
	}
}

// linear computes y[t][n] = x[t]·W[n] (+ bias[n]) for t < rows, splitting
// output rows over the worker pool. On the FP8-activation path a quantized
// module first quantizes each input row per token and rescales each sum by
// s_x[t]·s_w[n].
func (b *Backend) linear(y, x []float32, rows int, l *linear) {
	in, out := l.in, l.out
	s := &b.s
	quant := l.scale != nil
	if quant {
		s.xq, s.xs = grow(s.xq, rows*in), grow(s.xs, rows)
		for t := range rows {
			s.xs[t] = quantizeRow(s.xq[t*in:(t+1)*in], x[t*in:(t+1)*in], b.opts.Variant.FP8ScaleHeadroom)
		}
		x = s.xq
	}
	xs := s.xs
	// About 16K multiply-adds per chunk keeps goroutine hand-off cheap
	// relative to the work.
	grain := max(4, 16384/max(1, in*rows))
	grain = (grain + 3) &^ 3
	b.pool.run(out, grain, func(_, lo, hi int) {
		n := lo
		for ; n+4 <= hi; n += 4 {
			w0, w1 := l.w[n*in:(n+1)*in], l.w[(n+1)*in:(n+2)*in]
			w2, w3 := l.w[(n+2)*in:(n+3)*in], l.w[(n+3)*in:(n+4)*in]
			for t := range rows {
				r := [4]float32{}
				r[0], r[1], r[2], r[3] = dot4(x[t*in:(t+1)*in], w0, w1, w2, w3)
				for j := range 4 {
					v := r[j]
					if quant {
						v = v * xs[t] * l.scale[n+j]
					}
					if l.bias != nil {
						v += l.bias[n+j]
					}
					y[t*out+n+j] = v
				}
			}
		}
		for ; n < hi; n++ {
			wr := l.w[n*in : (n+1)*in]
			for t := range rows {
				v := dot(x[t*in:(t+1)*in], wr)
				if quant {
					v = v * xs[t] * l.scale[n]
				}
				if l.bias != nil {
					v += l.bias[n]
				}
				y[t*out+n] = v
			}
		}
	})
}

// layer runs a decoder layer on the pass's T rows, in place on s.h, with
// its K/V in pool layer kvl.
func (b *Backend) layer(lw *layerWeights, kvl int, T int) {
	cfg, s := b.cfg, &b.s
	H, D := cfg.HiddenSize, cfg.HeadDim
	NH, NKV := cfg.NumAttentionHeads, cfg.NumKeyValueHeads
	eps := float32(cfg.RMSNormEps)
	s.a, s.tmp = grow(s.a, T*H), grow(s.tmp, T*H)
	s.q, s.o = grow(s.q, T*NH*D), grow(s.o, T*NH*D)
	s.k, s.v = grow(s.k, T*NKV*D), grow(s.v, T*NKV*D)

	for t := range T {
		rmsNorm(s.a[t*H:(t+1)*H], s.h[t*H:(t+1)*H], lw.inNorm, eps)
	}
	b.linear(s.q, s.a, T, &lw.q)
	b.linear(s.k, s.a, T, &lw.k)
	b.linear(s.v, s.a, T, &lw.v)
	b.qkNormRoPE(lw, T)
	b.writeKV(kvl, T)
	b.attention(kvl, T)
	b.linear(s.tmp, s.o, T, &lw.o)
	for i := range T * H {
		s.h[i] += s.tmp[i]
	}

	for t := range T {
		rmsNorm(s.a[t*H:(t+1)*H], s.h[t*H:(t+1)*H], lw.postNorm, eps)
	}
	if lw.dense != nil {
		b.mlp(s.tmp, s.a, T, lw.dense)
	} else {
		b.moe(s.tmp, s.a, T, lw.moe)
	}
	for i := range T * H {
		s.h[i] += s.tmp[i]
	}
}

// qkNormRoPE applies the per-head q/k RMSNorm and partial RoPE in place.
func (b *Backend) qkNormRoPE(lw *layerWeights, T int) {
	cfg, s := b.cfg, &b.s
	D, NH, NKV := cfg.HeadDim, cfg.NumAttentionHeads, cfg.NumKeyValueHeads
	half := cfg.RotaryDim() / 2
	eps := float32(cfg.RMSNormEps)
	vr := b.opts.Variant
	rope := ropeNeoX
	if vr.InterleavedRoPE {
		rope = ropeInterleaved
	}
	for t := range T {
		cos, sin := s.cos[t*half:(t+1)*half], s.sin[t*half:(t+1)*half]
		do := func(x, norm []float32) {
			if norm != nil && !vr.QKNormAfterRoPE {
				rmsNorm(x, x, norm, eps)
			}
			rope(x, cos, sin)
			if norm != nil && vr.QKNormAfterRoPE {
				rmsNorm(x, x, norm, eps)
			}
		}
		for h := range NH {
			do(s.q[(t*NH+h)*D:(t*NH+h+1)*D], lw.qNorm)
		}
		for h := range NKV {
			do(s.k[(t*NKV+h)*D:(t*NKV+h+1)*D], lw.kNorm)
		}
	}
}

// writeKV stores the pass's K (after norm and RoPE) and V of pool layer l
// in the slots the rows' block tables name.
func (b *Backend) writeKV(l, T int) {
	s, bs := &b.s, b.kvBlockSize
	kvDim := b.cfg.KVDim()
	for t := range T {
		p := s.pos[t]
		blk, slot := int(s.table[t][p/bs]), p%bs
		k := b.kv[b.kvOffset(blk, l, 0, slot):][:kvDim]
		v := b.kv[b.kvOffset(blk, l, 1, slot):][:kvDim]
		copy(k, s.k[t*kvDim:(t+1)*kvDim])
		copy(v, s.v[t*kvDim:(t+1)*kvDim])
		if b.opts.FP8Activations && !b.opts.Variant.FP8FloatKV { // the GPU's KV cache is BF16
			roundBF16(k)
			roundBF16(v)
		}
	}
}

// attention computes, for every token t at position p of its sequence and
// every query head h, softmax(q·kᵀ/√D) over positions 0..p of the sequence
// (read from the pool) times V, with query head h reading KV head
// h / (NH/NKV) (GQA).
func (b *Backend) attention(l int, T int) {
	if b.opts.FP8Activations && !b.opts.Variant.FP8ExactSoftmax {
		b.attentionGPU(l, T)
		return
	}
	cfg, s, bs := b.cfg, &b.s, b.kvBlockSize
	D, NH, NKV := cfg.HeadDim, cfg.NumAttentionHeads, cfg.NumKeyValueHeads
	group := NH / NKV
	scale := float32(1 / math.Sqrt(float64(D)))
	maxLen := 0
	for t := range T {
		maxLen = max(maxLen, s.pos[t]+1)
	}
	if len(s.attn) < b.pool.n {
		s.attn = make([][]float32, b.pool.n)
	}
	for w := range s.attn {
		s.attn[w] = grow(s.attn[w], maxLen)
	}
	work := T * NH
	grain := max(1, 32768/max(1, maxLen*D))
	b.pool.run(work, grain, func(worker, lo, hi int) {
		scores := s.attn[worker]
		for item := lo; item < hi; item++ {
			t, h := item/NH, item%NH
			kvh := kvHead(h, group)
			table := s.table[t]
			n := s.pos[t] + 1
			q := s.q[(t*NH+h)*D : (t*NH+h+1)*D]
			mx := float32(math.Inf(-1))
			for j := range n {
				off := b.kvOffset(int(table[j/bs]), l, 0, j%bs) + kvh*D
				sc := dot(q, b.kv[off:off+D]) * scale
				scores[j] = sc
				mx = max(mx, sc)
			}
			var sum float32
			for j := range n {
				e := float32(math.Exp(float64(scores[j] - mx)))
				scores[j] = e
				sum += e
			}
			out := s.o[(t*NH+h)*D : (t*NH+h+1)*D]
			clear(out)
			inv := 1 / sum
			for j := range n {
				pj := scores[j] * inv
				off := b.kvOffset(int(table[j/bs]), l, 1, j%bs) + kvh*D
				vv := b.kv[off : off+D]
				for d := range out {
					out[d] += pj * vv[d]
				}
			}
		}
	})
}

// kvHead maps a query head to its KV head under GQA: consecutive groups of
// NH/NKV query heads share one KV head.
func kvHead(h, group int) int { return h / group }

// mlp computes down(silu(gate(x)) · up(x)) for T rows of x into y.
func (b *Backend) mlp(y, x []float32, T int, m *mlpWeights) {
	s := &b.s
	I := m.gate.out
	s.inter, s.up = grow(s.inter, T*I), grow(s.up, T*I)
	b.linear(s.inter, x, T, &m.gate)
	b.linear(s.up, x, T, &m.up)
	for i := range T * I {
		s.inter[i] = silu(s.inter[i]) * s.up[i]
	}
	b.linear(y, s.inter, T, &m.down)
}

// moe computes the routed experts (weighted, accumulated in expert order)
// plus the shared expert for T rows of x into y.
func (b *Backend) moe(y, x []float32, T int, mw *moeWeights) {
	cfg, s := b.cfg, &b.s
	H, E, K := cfg.HiddenSize, cfg.NRoutedExperts, cfg.NumExpertsPerTok
	r := router{
		experts: E, topK: K, groups: cfg.NGroup, topKGroup: cfg.TopKGroup,
		normTopK: cfg.NormTopKProb, scaling: float32(cfg.RoutedScalingFactor),
		weightsFromBiased: b.opts.Variant.RoutingWeightsFromBiased,
	}
	// Router logits in float32 (the router is never quantized).
	s.routerOut = grow(s.routerOut, T*E)
	b.linear(s.routerOut, x, T, &mw.router)
	s.expertIdx, s.expertWts = growInt(s.expertIdx, T*K), grow(s.expertWts, T*K)
	if len(s.tokens) < E {
		s.tokens, s.slots = make([][]int, E), make([][]int, E)
	}
	for e := range E {
		s.tokens[e], s.slots[e] = s.tokens[e][:0], s.slots[e][:0]
	}
	s.poisoned = s.poisoned[:0]
	for t := range T {
		idx, wts := s.expertIdx[t*K:(t+1)*K], s.expertWts[t*K:(t+1)*K]
		if r.route(s.routerOut[t*E:(t+1)*E], mw.correction, &s.rsc, idx, wts) < K {
			// Fewer than top_k finite router scores: the token's state is
			// already broken. Its routed output becomes NaN below, so its
			// sequence ends with ErrNonFiniteLogits instead of going on with
			// silently wrong experts.
			s.poisoned = append(s.poisoned, t)
		}
		for j, e := range idx {
			if e < 0 {
				continue
			}
			s.tokens[e] = append(s.tokens[e], t)
			s.slots[e] = append(s.slots[e], j)
		}
	}
	s.routed = grow(s.routed, T*H)
	clear(s.routed)
	for e := range E {
		toks := s.tokens[e]
		n := len(toks)
		if n == 0 {
			continue
		}
		s.xe, s.ye = grow(s.xe, n*H), grow(s.ye, n*H)
		for i, t := range toks {
			copy(s.xe[i*H:(i+1)*H], x[t*H:(t+1)*H])
		}
		b.mlp(s.ye, s.xe, n, &mw.experts[e])
		for i, t := range toks {
			w := s.expertWts[t*K+s.slots[e][i]]
			dst, src := s.routed[t*H:(t+1)*H], s.ye[i*H:(i+1)*H]
			for d := range dst {
				dst[d] += src[d] * w
			}
		}
	}
	nan := float32(math.NaN())
	for _, t := range s.poisoned {
		for d := range H {
			s.routed[t*H+d] = nan
		}
	}
	if mw.shared == nil {
		copy(y[:T*H], s.routed)
		return
	}
	b.mlp(y, x, T, mw.shared)
	for i := range T * H {
		y[i] = s.routed[i] + y[i]
	}
}
