package cpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/glmctl/glmctl/pkg/model"
)

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol*math.Max(1, math.Abs(b)) }

func checkClose(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		if !near(float64(got[i]), want[i], tol) {
			t.Errorf("%s[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

func TestRMSNorm(t *testing.T) {
	tests := []struct {
		name   string
		x, w   []float32
		eps    float32
		want   []float64
		inSitu bool
	}{
		// mean(x²) = (1+4+9+16)/4 = 7.5; 1/sqrt(7.5) = 0.36514837
		{"unit weight", []float32{1, 2, 3, 4}, []float32{1, 1, 1, 1}, 0,
			[]float64{0.36514837, 0.73029674, 1.09544512, 1.46059349}, false},
		{"weights and eps", []float32{1, 2, 3, 4}, []float32{2, 0.5, 1, -1}, 0.5,
			// 1/sqrt(8) = 0.35355339
			[]float64{0.70710678, 0.35355339, 1.06066017, -1.41421356}, true},
		{"zero row stays finite", []float32{0, 0}, []float32{1, 1}, 1e-5, []float64{0, 0}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := make([]float32, len(tt.x))
			x := slices.Clone(tt.x)
			if tt.inSitu {
				dst = x
			}
			rmsNorm(dst, x, tt.w, tt.eps)
			checkClose(t, "rmsnorm", dst, tt.want, 1e-6)
		})
	}
}

func TestRoPE(t *testing.T) {
	// rot = 4 of a 6-dim head, theta 100: inv_freq = [1, 100^-0.5 = 0.1].
	inv := ropeInvFreq(4, 100)
	checkClose(t, "inv_freq", inv, []float64{1, 0.1}, 1e-7)
	cos, sin := make([]float32, 2), make([]float32, 2)
	ropeAngles(1, inv, cos, sin) // angles 1 and 0.1
	c1, s1, c2, s2 := math.Cos(1), math.Sin(1), math.Cos(0.1), math.Sin(0.1)

	x := []float32{1, 2, 3, 4, 5, 6}
	ropeNeoX(x, cos, sin)
	// NeoX: dim 0 pairs with dim 2 (angle 1), dim 1 with dim 3 (angle 0.1);
	// dims 4, 5 are past the rotary part and untouched.
	checkClose(t, "neox", x, []float64{
		1*c1 - 3*s1, 2*c2 - 4*s2, 3*c1 + 1*s1, 4*c2 + 2*s2, 5, 6,
	}, 1e-6)

	y := []float32{1, 2, 3, 4, 5, 6}
	ropeInterleaved(y, cos, sin)
	// GPT-J: dims (0,1) at angle 1, (2,3) at angle 0.1.
	checkClose(t, "interleaved", y, []float64{
		1*c1 - 2*s1, 2*c1 + 1*s1, 3*c2 - 4*s2, 4*c2 + 3*s2, 5, 6,
	}, 1e-6)

	// Position 0 is the identity.
	ropeAngles(0, inv, cos, sin)
	z := []float32{1, 2, 3, 4, 5, 6}
	ropeNeoX(z, cos, sin)
	checkClose(t, "pos 0", z, []float64{1, 2, 3, 4, 5, 6}, 0)

	// GLM-4.7: rot 64, theta 1e6 -> inv_freq[i] = 1e6^(-2i/64).
	inv = ropeInvFreq(64, 1e6)
	for _, i := range []int{0, 1, 17, 31} {
		if want := math.Pow(1e6, -float64(2*i)/64); !near(float64(inv[i]), want, 1e-6) {
			t.Errorf("inv_freq[%d] = %v, want %v", i, inv[i], want)
		}
	}
}

func TestKVHeadGQA(t *testing.T) {
	// GLM-4.7: 96 query heads, 8 KV heads: h -> h / 12.
	for _, c := range []struct{ h, want int }{{0, 0}, {11, 0}, {12, 1}, {47, 3}, {95, 7}} {
		if got := kvHead(c.h, 96/8); got != c.want {
			t.Errorf("kvHead(%d) = %d, want %d", c.h, got, c.want)
		}
	}
}

// TestAttentionPagedGQA checks attention on a hand-built cache: 4 query
// heads over 2 KV heads, head dim 2, block size 2, the sequence's blocks out
// of order in the pool.
func TestAttentionPagedGQA(t *testing.T) {
	cfg := &model.Config{NumHiddenLayers: 1, NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 2, MaxPositionEmbeddings: 8}
	b := &Backend{cfg: cfg, kvBlockSize: 2, numKVBlocks: 4, kvLayers: 1, pool: newWorkerPool(2)}
	defer b.pool.close()
	b.kv = make([]float32, 4*1*2*2*cfg.KVDim())
	table := []int32{3, 1} // positions 0,1 in block 3; position 2 in block 1
	// keys/values per position p and kv head g.
	key := func(p, g int) [2]float32 { return [2]float32{float32(p + 1), float32(g)} }
	val := func(p, g int) [2]float32 { return [2]float32{float32(10*p + g), float32(-p)} }
	for p := range 3 {
		for g := range 2 {
			k, v := key(p, g), val(p, g)
			blk, slot := int(table[p/2]), p%2
			copy(b.kv[b.kvOffset(blk, 0, 0, slot)+g*2:], k[:])
			copy(b.kv[b.kvOffset(blk, 0, 1, slot)+g*2:], v[:])
		}
	}
	// One token at position 2; query head h = [h+1, 1].
	b.s.pos, b.s.seqOf = []int{2}, []int{0}
	b.s.table, b.s.decode = [][]int32{table}, []bool{true}
	b.s.q = []float32{1, 1, 2, 1, 3, 1, 4, 1}
	b.s.o = make([]float32, 8)
	b.attention(0, 1)
	for h := range 4 {
		g := h / 2 // GQA: heads 0,1 -> kv 0; heads 2,3 -> kv 1
		var sc [3]float64
		mx := math.Inf(-1)
		for p := range 3 {
			k := key(p, g)
			sc[p] = (float64(h+1)*float64(k[0]) + float64(k[1])) / math.Sqrt(2)
			mx = math.Max(mx, sc[p])
		}
		var sum float64
		for p := range sc {
			sc[p] = math.Exp(sc[p] - mx)
			sum += sc[p]
		}
		var want [2]float64
		for p := range 3 {
			v := val(p, g)
			want[0] += sc[p] / sum * float64(v[0])
			want[1] += sc[p] / sum * float64(v[1])
		}
		checkClose(t, "head output", b.s.o[h*2:h*2+2], want[:], 1e-5)
	}
}

func TestRouter(t *testing.T) {
	logit := func(p float64) float32 { return float32(math.Log(p / (1 - p))) } // sigmoid⁻¹
	tests := []struct {
		name     string
		r        router
		probs    []float64 // sigmoid scores
		corr     []float32
		wantIdx  []int
		wantWts  []float64
		sortIdxs bool
	}{
		{
			name:  "plain top-2, bias changes selection only",
			r:     router{experts: 4, topK: 2, groups: 1, topKGroup: 1, normTopK: true, scaling: 2.5},
			probs: []float64{0.9, 0.8, 0.3, 0.2},
			// expert 2 is lifted above expert 1 (and 0) by its bias, but
			// its weight is its plain score 0.3.
			corr:    []float32{0, 0, 0.65, 0},
			wantIdx: []int{2, 0},
			wantWts: []float64{2.5 * 0.3 / 1.2, 2.5 * 0.9 / 1.2},
		},
		{
			name: "group-limited: best expert's group dropped",
			// 4 groups of 2; group score = sum of the group's two choices:
			// g0 = 0.95+0.05 = 1.0, g1 = 0.6+0.6 = 1.2, g2 = 0.7+0.6 = 1.3,
			// g3 = 0.1+0.1 = 0.2. Keep g2, g1: expert 0 (0.95) is excluded.
			r:       router{experts: 8, topK: 2, groups: 4, topKGroup: 2, normTopK: true, scaling: 1},
			probs:   []float64{0.95, 0.05, 0.6, 0.6, 0.7, 0.6, 0.1, 0.1},
			corr:    make([]float32, 8),
			wantIdx: []int{4, 2}, // 0.7 first, then the lower index of the 0.6 tie
			wantWts: []float64{0.7 / 1.3, 0.6 / 1.3},
		},
		{
			name:    "no renormalisation",
			r:       router{experts: 4, topK: 2, groups: 1, topKGroup: 1, normTopK: false, scaling: 2},
			probs:   []float64{0.1, 0.5, 0.4, 0.2},
			corr:    make([]float32, 4),
			wantIdx: []int{1, 2},
			wantWts: []float64{1.0, 0.8},
		},
		{
			name:    "variant: weights from biased scores",
			r:       router{experts: 4, topK: 2, groups: 1, topKGroup: 1, normTopK: true, scaling: 2.5, weightsFromBiased: true},
			probs:   []float64{0.9, 0.8, 0.3, 0.2},
			corr:    []float32{0, 0, 0.65, 0},
			wantIdx: []int{2, 0},
			wantWts: []float64{2.5 * 0.95 / 1.85, 2.5 * 0.9 / 1.85},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logits := make([]float32, len(tt.probs))
			for i, p := range tt.probs {
				logits[i] = logit(p)
			}
			idx, wts := make([]int, tt.r.topK), make([]float32, tt.r.topK)
			var sc routerScratch
			tt.r.route(logits, tt.corr, &sc, idx, wts)
			if !slices.Equal(idx, tt.wantIdx) {
				t.Fatalf("experts %v, want %v", idx, tt.wantIdx)
			}
			checkClose(t, "weights", wts, tt.wantWts, 1e-6)
		})
	}
}

func TestQuantizeRow(t *testing.T) {
	tests := []struct {
		name      string
		x         []float32
		wantScale float64
		wantQ     []float64
	}{
		// amax 4 -> s = 4/448; x/s = 112, -224, 33.6, 448. 33.6 lies between
		// the E4M3 values 32 and 36 and rounds to 32.
		{"row", []float32{1, -2, 0.3, 4}, 4.0 / 448, []float64{112, -224, 32, 448}},
		// A zero row uses the floor scale 1/(448·512) and stays zero.
		{"zero row", []float32{0, 0, 0}, 1.0 / (448 * 512), []float64{0, 0, 0}},
		// Tiny values: the scale floor keeps the quotient small, into the
		// subnormals (multiples of 2^-9): 1e-9 / (1/229376) = 2.29e-4 -> 0.
		{"below floor", []float32{1e-9, -2e-6}, 1.0 / (448 * 512), []float64{0, -0.46875}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := make([]float32, len(tt.x))
			s := quantizeRow(q, tt.x, false)
			if !near(float64(s), tt.wantScale, 1e-6) {
				t.Errorf("scale %v, want %v", s, tt.wantScale)
			}
			checkClose(t, "codes", q, tt.wantQ, 1e-6)
		})
	}
}

// TestFP8Linear checks the FP8-activation linear against the formula
// y = (Σ q·W_fp8)·s_x·s_w[n] + b, and the exact linear against x·W + b.
func TestFP8Linear(t *testing.T) {
	b := &Backend{pool: newWorkerPool(2)}
	defer b.pool.close()
	x := []float32{1, -2, 0.3, 4} // quantizes to 112, -224, 32, 448 at s = 4/448
	l := linear{out: 2, in: 4,
		w:     []float32{1, 0.5, 2, -1, 0, 1, 0, 1},
		scale: []float32{0.25, 2},
		bias:  []float32{0.5, -1},
	}
	y := make([]float32, 2)
	b.linear(y, x, 1, &l)
	s := 4.0 / 448
	checkClose(t, "fp8 linear", y, []float64{
		(112-112+64-448)*s*0.25 + 0.5,
		(-224+448)*s*2 - 1,
	}, 1e-6)

	exact := linear{out: 2, in: 4, w: []float32{0.25, 0.125, 0.5, -0.25, 0, 2, 0, 2}, bias: l.bias}
	b.linear(y, x, 1, &exact)
	checkClose(t, "exact linear", y, []float64{0.25 - 0.25 + 0.15 - 1 + 0.5, -4 + 8 - 1}, 1e-6)
}

// TestLinearMatchesNaive covers the 4-row kernel, its tail and the split over
// workers on odd sizes.
func TestLinearMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	b := &Backend{pool: newWorkerPool(3)}
	defer b.pool.close()
	for _, sz := range []struct{ rows, out, in int }{{1, 7, 5}, {3, 33, 17}, {5, 130, 64}, {2, 1, 1}} {
		l := linear{out: sz.out, in: sz.in, w: make([]float32, sz.out*sz.in), bias: make([]float32, sz.out)}
		x := make([]float32, sz.rows*sz.in)
		for i := range l.w {
			l.w[i] = float32(rng.NormFloat64())
		}
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		for i := range l.bias {
			l.bias[i] = float32(rng.NormFloat64())
		}
		y := make([]float32, sz.rows*sz.out)
		b.linear(y, x, sz.rows, &l)
		for r := range sz.rows {
			for n := range sz.out {
				want := float64(l.bias[n])
				for k := range sz.in {
					want += float64(x[r*sz.in+k]) * float64(l.w[n*sz.in+k])
				}
				if got := y[r*sz.out+n]; !near(float64(got), want, 1e-5) {
					t.Fatalf("size %+v: y[%d][%d] = %v, want %v", sz, r, n, got, want)
				}
			}
		}
	}
}

func TestSiLU(t *testing.T) {
	for _, c := range []struct{ z, want float64 }{{0, 0}, {1, 0.7310585786}, {-2, -0.2384058440}, {20, 19.99999996}} {
		if got := silu(float32(c.z)); !near(float64(got), c.want, 1e-6) {
			t.Errorf("silu(%v) = %v, want %v", c.z, got, c.want)
		}
	}
}

// Non-finite router scores are never selected and never index memory (the
// old route returned expert -1 for an all-NaN row, and the MoE then
// panicked with index out of range [-1]).
func TestRouterNonFinite(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	tests := []struct {
		name       string
		r          router
		logits     []float32
		corr       []float32
		wantIdx    []int
		wantPicked int
	}{
		{"all NaN", router{experts: 4, topK: 2, groups: 1, topKGroup: 1, normTopK: true, scaling: 1},
			[]float32{nan, nan, nan, nan}, make([]float32, 4), []int{-1, -1}, 0},
		{"one NaN is skipped", router{experts: 4, topK: 2, groups: 1, topKGroup: 1, normTopK: true, scaling: 1},
			[]float32{nan, 1, 2, -1}, make([]float32, 4), []int{2, 1}, 2},
		{"too few finite", router{experts: 4, topK: 3, groups: 1, topKGroup: 1, normTopK: true, scaling: 1},
			[]float32{nan, 1, nan, 2}, make([]float32, 4), []int{3, 1, -1}, 2},
		{"NaN correction bias", router{experts: 4, topK: 2, groups: 1, topKGroup: 1, normTopK: false, scaling: 1},
			[]float32{3, 1, 2, 0}, []float32{nan, 0, 0, 0}, []int{2, 1}, 2},
		{"+Inf correction bias", router{experts: 4, topK: 2, groups: 1, topKGroup: 1, normTopK: false, scaling: 1},
			[]float32{0, 1, 2, 3}, []float32{inf, 0, 0, 0}, []int{3, 2}, 2},
		{"grouped, a NaN group", router{experts: 8, topK: 2, groups: 4, topKGroup: 2, normTopK: true, scaling: 1},
			[]float32{nan, nan, 1, 1, 2, 2, -3, -3}, make([]float32, 8), []int{4, 5}, 2},
		{"grouped, all NaN", router{experts: 8, topK: 2, groups: 4, topKGroup: 2, normTopK: true, scaling: 1},
			[]float32{nan, nan, nan, nan, nan, nan, nan, nan}, make([]float32, 8), []int{-1, -1}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			idx, wts := make([]int, tt.r.topK), make([]float32, tt.r.topK)
			var sc routerScratch
			picked := tt.r.route(tt.logits, tt.corr, &sc, idx, wts)
			if picked != tt.wantPicked || !slices.Equal(idx, tt.wantIdx) {
				t.Fatalf("picked %d experts %v, want %d %v", picked, idx, tt.wantPicked, tt.wantIdx)
			}
			for j, w := range wts {
				if !finite(w) {
					t.Errorf("weight %d is %v", j, w)
				}
			}
		})
	}
}
