package cpu

import (
	"math"

	"github.com/glmctl/glmctl/pkg/safetensors"
)

// The GPU's attention arithmetic (cuda/kernels/attention.cu), reproduced on
// the FP8 path so that this backend computes what the CUDA backend computes
// (docs/validation.md, "FP8 golden"). Both kernels run on BF16 tensor cores
// in the log2 domain: the query is multiplied by log2(e)/sqrt(D) and rounded
// to BF16, a score is the float sum of exact BF16 products with the BF16
// keys, P = 2^(s − m) with m a running maximum, the normaliser sums the
// unrounded P and the output sums BF16(P)·V. Where m is taken depends on the
// kernel's tile schedule, and it decides how P rounds:
//   - attention_prefill (a sequence with several new tokens in the step):
//     per query row, 64-key tiles from key 0 in order, one running maximum;
//   - attention_decode (one new token, or a position of a speculative
//     verify step, which the CUDA runtime runs as one decode row per
//     position): 16-key tiles, tile j on warp j % 4,
//     a running maximum per warp, the warps merged with weights 2^(m_w − M).
//
// These are the kernels' single-split launches (decode contexts up to 128
// keys, prompts up to 256 tokens); longer ones the GPU splits over CTAs,
// which changes only how P rounds, at the BF16 level.
const (
	gpuDecodeTile  = 16
	gpuDecodeWarps = 4
	gpuPrefillTile = 64
)

// roundBF16 rounds every element of x to BF16 (nearest, ties to even) in
// place.
func roundBF16(x []float32) {
	for i, v := range x {
		x[i] = safetensors.BF16ToFloat32(safetensors.Float32ToBF16(v))
	}
}

func bf16(v float32) float32 { return safetensors.BF16ToFloat32(safetensors.Float32ToBF16(v)) }

func exp2(x float32) float32 { return float32(math.Exp2(float64(x))) }

// attentionGPU is attention with the GPU's rounding and tile schedules (see
// above); the cache already holds BF16 values (writeKV).
func (b *Backend) attentionGPU(l int, T int) {
	cfg, s, bs := b.cfg, &b.s, b.kvBlockSize
	D, NH, NKV := cfg.HeadDim, cfg.NumAttentionHeads, cfg.NumKeyValueHeads
	group := NH / NKV
	// As the kernels form it: 1/sqrtf(D) times log2(e), in float32.
	qscale := float32(1/math.Sqrt(float64(D))) * float32(math.Log2E)
	maxLen := 0
	for t := range T {
		maxLen = max(maxLen, s.pos[t]+1)
	}
	if len(s.attn) < b.pool.n {
		s.attn = make([][]float32, b.pool.n)
	}
	for w := range s.attn {
		// scores, then the query and one output accumulator per warp
		s.attn[w] = grow(s.attn[w], maxLen+(1+gpuDecodeWarps)*D)
	}
	work := T * NH
	grain := max(1, 32768/max(1, maxLen*D))
	b.pool.run(work, grain, func(worker, lo, hi int) {
		buf := s.attn[worker]
		for item := lo; item < hi; item++ {
			t, h := item/NH, item%NH
			kvh := kvHead(h, group)
			table := s.table[t]
			n := s.pos[t] + 1
			scores := buf[:n]
			q := buf[maxLen : maxLen+D]
			for d, v := range s.q[(t*NH+h)*D : (t*NH+h+1)*D] {
				q[d] = bf16(v * qscale)
			}
			for j := range n {
				off := b.kvOffset(int(table[j/bs]), l, 0, j%bs) + kvh*D
				scores[j] = dot(q, b.kv[off:off+D])
			}
			tile, warps := gpuPrefillTile, 1
			if s.decode[t] {
				tile, warps = gpuDecodeTile, gpuDecodeWarps
			}
			nTiles := (n + tile - 1) / tile
			var ms, ls [gpuDecodeWarps]float32
			for w := range warps {
				o := buf[maxLen+(1+w)*D : maxLen+(2+w)*D]
				clear(o)
				m, sum := float32(math.Inf(-1)), float32(0)
				for j := w; j < nTiles; j += warps {
					st := scores[j*tile : min(n, (j+1)*tile)]
					mn := m
					for _, v := range st {
						mn = max(mn, v)
					}
					var al float32 // 0 on the warp's first tile
					if !math.IsInf(float64(m), -1) {
						al = exp2(m - mn)
					}
					var ps float32
					for k := range st {
						st[k] = exp2(st[k] - mn)
						ps += st[k]
					}
					sum = sum*al + ps
					for d := range o {
						o[d] *= al
					}
					for k, p := range st {
						key := j*tile + k
						off := b.kvOffset(int(table[key/bs]), l, 1, key%bs) + kvh*D
						pb := bf16(p)
						for d, v := range b.kv[off : off+D] {
							o[d] += pb * v
						}
					}
					m = mn
				}
				ms[w], ls[w] = m, sum
			}
			M := float32(math.Inf(-1))
			for w := range warps {
				M = max(M, ms[w])
			}
			var L float32
			var f [gpuDecodeWarps]float32
			for w := range warps {
				if !math.IsInf(float64(ms[w]), -1) { // a warp without tiles weighs 0
					f[w] = exp2(ms[w] - M)
				}
				L += ls[w] * f[w]
			}
			inv := 1 / L
			out := s.o[(t*NH+h)*D : (t*NH+h+1)*D]
			for d := range out {
				var acc float32
				for w := range warps {
					acc += buf[maxLen+(1+w)*D+d] * f[w]
				}
				out[d] = acc * inv
			}
		}
	})
}
