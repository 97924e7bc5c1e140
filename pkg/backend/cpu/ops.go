package cpu

import (
	"math"

	"github.com/glmctl/glmctl/pkg/safetensors"
)

// The element-wise operations of the forward (docs/model.md §3), each on one
// row, in float32 the way the float32 transformers reference computes them.

// rmsNorm writes x / sqrt(mean(x²) + eps) · w into dst (dst may be x). The
// mean of squares is accumulated in float64, then the normalisation and the
// weight are applied in float32 (normalise first, then multiply by w).
func rmsNorm(dst, x, w []float32, eps float32) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	variance := float32(ss / float64(len(x)))
	r := float32(1 / math.Sqrt(float64(variance+eps)))
	for i, v := range x {
		dst[i] = w[i] * (v * r)
	}
}

// silu is z·sigmoid(z).
func silu(z float32) float32 {
	return float32(float64(z) / (1 + math.Exp(-float64(z))))
}

func sigmoid(z float32) float32 {
	return float32(1 / (1 + math.Exp(-float64(z))))
}

// ropeInvFreq returns the rot/2 inverse frequencies 1/theta^(2i/rot), with
// the exponent and the result rounded to float32 as torch builds them.
func ropeInvFreq(rot int, theta float64) []float32 {
	inv := make([]float32, rot/2)
	for i := range inv {
		e := float32(2*i) / float32(rot)
		inv[i] = 1 / float32(math.Pow(theta, float64(e)))
	}
	return inv
}

// ropeAngles fills cos/sin (rot/2 each) for one position: angle_i =
// pos·inv_freq_i rounded to float32, cos and sin rounded to float32.
func ropeAngles(pos int, invFreq, cos, sin []float32) {
	p := float32(pos)
	for i, f := range invFreq {
		a := float64(p * f)
		cos[i] = float32(math.Cos(a))
		sin[i] = float32(math.Sin(a))
	}
}

// ropeNeoX rotates the first 2·len(cos) dims of one head in place, NeoX
// (rotate_half) style: dim j pairs with dim j+half, both at angle j. Dims
// beyond the rotary part are untouched.
func ropeNeoX(x, cos, sin []float32) {
	half := len(cos)
	for j := range half {
		x1, x2 := x[j], x[j+half]
		c, s := cos[j], sin[j]
		x[j] = x1*c - x2*s
		x[j+half] = x2*c + x1*s
	}
}

// ropeInterleaved is the GPT-J pairing (2j, 2j+1) at angle j. It is not
// GLM-4.7's RoPE; only Variant.InterleavedRoPE uses it.
func ropeInterleaved(x, cos, sin []float32) {
	for j := range cos {
		x1, x2 := x[2*j], x[2*j+1]
		c, s := cos[j], sin[j]
		x[2*j] = x1*c - x2*s
		x[2*j+1] = x2*c + x1*s
	}
}

// FP8 activation quantization constants (docs/model.md §4.3).
const (
	fp8Max      = 448
	minActScale = 1.0 / (448 * 512)
)

// quantizeRow quantizes one activation row per token: s = max(amax/448,
// 1/(448·512)), dst = fp8_rne(clamp(x/s, ±448)) as float32 code values.
// It returns s. headroom (Variant.FP8ScaleHeadroom, a deliberate bug) takes
// s = amax/440 instead.
func quantizeRow(dst, x []float32, headroom bool) float32 {
	var amax float32
	for _, v := range x {
		if a := float32(math.Abs(float64(v))); a > amax {
			amax = a
		}
	}
	s := max(amax/fp8Max, float32(minActScale))
	if headroom {
		s = max(amax/440, float32(minActScale))
	}
	for i, v := range x {
		// Float32ToF8E4M3 clamps to ±448 before rounding to nearest even.
		dst[i] = safetensors.F8E4M3ToFloat32(safetensors.Float32ToF8E4M3(v / s))
	}
	return s
}

// dot is a float32 dot product over len(a) elements with eight partial sums
// (fewer dependent adds, and less rounding than one running sum).
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3, s4, s5, s6, s7 float32
	i := 0
	for ; i+8 <= len(a); i += 8 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
		s4 += a[i+4] * b[i+4]
		s5 += a[i+5] * b[i+5]
		s6 += a[i+6] * b[i+6]
		s7 += a[i+7] * b[i+7]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
}

// dot4 computes the dot products of x with four weight rows at once, so each
// x element is loaded once for four rows.
func dot4(x, w0, w1, w2, w3 []float32) (r0, r1, r2, r3 float32) {
	n := len(x)
	w0, w1, w2, w3 = w0[:n], w1[:n], w2[:n], w3[:n]
	var a0, a1, a2, a3, b0, b1, b2, b3 float32
	i := 0
	for ; i+2 <= n; i += 2 {
		x0, x1 := x[i], x[i+1]
		a0 += x0 * w0[i]
		a1 += x0 * w1[i]
		a2 += x0 * w2[i]
		a3 += x0 * w3[i]
		b0 += x1 * w0[i+1]
		b1 += x1 * w1[i+1]
		b2 += x1 * w2[i+1]
		b3 += x1 * w3[i+1]
	}
	for ; i < n; i++ {
		a0 += x[i] * w0[i]
		a1 += x[i] * w1[i]
		a2 += x[i] * w2[i]
		a3 += x[i] * w3[i]
	}
	return a0 + b0, a1 + b1, a2 + b2, a3 + b3
}

// router holds the MoE routing rule of one model (docs/model.md §3.6).
type router struct {
	experts, topK     int
	groups, topKGroup int
	normTopK          bool
	scaling           float32
	weightsFromBiased bool // Variant.RoutingWeightsFromBiased
}

// routerScratch is per-call working memory for route.
type routerScratch struct {
	scores, choice, groupScore []float32
	groupKept                  []bool
}

func (s *routerScratch) size(experts, groups int) {
	if cap(s.scores) < experts {
		s.scores = make([]float32, experts)
		s.choice = make([]float32, experts)
	}
	if cap(s.groupScore) < groups {
		s.groupScore = make([]float32, groups)
		s.groupKept = make([]bool, groups)
	}
	s.scores, s.choice = s.scores[:experts], s.choice[:experts]
	s.groupScore, s.groupKept = s.groupScore[:groups], s.groupKept[:groups]
}

// route turns one token's router logits into topK expert ids and weights:
// s = sigmoid(logits); choice = s + correction; keep the topKGroup groups
// with the largest sum of their two best choice values (others -> -inf);
// pick the topK largest choice values; weights are the plain s of those
// experts, renormalised (norm_topk_prob) and times routed_scaling_factor.
// Ties go to the lower index.
//
// Non-finite values are never selected: an expert whose choice value is NaN
// or ±Inf is not a candidate, and a group's score counts only finite values.
// route returns how many experts it picked; when fewer than topK are finite
// the remaining slots get id -1 and weight 0 (callers must skip them and
// treat the token as poisoned), so no non-finite score ever indexes memory.
func (r *router) route(logits, correction []float32, sc *routerScratch, idx []int, wts []float32) int {
	sc.size(r.experts, r.groups)
	for e, l := range logits[:r.experts] {
		sc.scores[e] = sigmoid(l)
		sc.choice[e] = sc.scores[e] + correction[e]
	}
	negInf := float32(math.Inf(-1))
	if r.groups > 1 {
		per := r.experts / r.groups
		for g := range r.groups {
			grp := sc.choice[g*per : (g+1)*per]
			b1, b2 := negInf, negInf
			for _, v := range grp {
				if !finite(v) {
					continue
				}
				if v > b1 {
					b1, b2 = v, b1
				} else if v > b2 {
					b2 = v
				}
			}
			sc.groupScore[g] = b1 + b2
			sc.groupKept[g] = false
		}
		for range r.topKGroup {
			best := -1
			for g, v := range sc.groupScore {
				if !sc.groupKept[g] && (best < 0 || v > sc.groupScore[best]) {
					best = g
				}
			}
			sc.groupKept[best] = true
		}
		for g, kept := range sc.groupKept {
			if !kept {
				for e := g * per; e < (g+1)*per; e++ {
					sc.choice[e] = negInf
				}
			}
		}
	}
	// topK by repeated selection over finite values; a picked expert is
	// marked with NaN, which is not finite.
	src := sc.scores
	if r.weightsFromBiased {
		src = nil
	}
	nan := float32(math.NaN())
	var sum float32
	picked := 0
	for j := range r.topK {
		best := -1
		for e, v := range sc.choice {
			if finite(v) && (best < 0 || v > sc.choice[best]) {
				best = e
			}
		}
		if best < 0 {
			idx[j], wts[j] = -1, 0
			continue
		}
		picked++
		idx[j] = best
		if src != nil {
			wts[j] = src[best]
		} else {
			wts[j] = sc.choice[best]
		}
		sum += wts[j]
		sc.choice[best] = nan
	}
	if r.normTopK {
		den := sum + 1e-20
		for j := range r.topK {
			wts[j] /= den
		}
	}
	for j := range r.topK {
		wts[j] *= r.scaling
	}
	return picked
}

// finite reports whether v is neither NaN nor ±Inf.
func finite(v float32) bool {
	return v-v == 0 // NaN-NaN and Inf-Inf are NaN
}
