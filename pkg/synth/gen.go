package synth

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sort"
	"strings"
	"sync"

	"github.com/glmctl/glmctl/pkg/model"
	"github.com/glmctl/glmctl/pkg/safetensors"
)

// The generator (docs/synthetic.md §3). Everything here is integer
// arithmetic except one IEEE float32 multiply per value, so that
// cuda/runtime/synth.cu computes the same bits; change one, change both,
// and the golden hashes in gen_test.go.

// gamma is SplitMix64's increment (the golden ratio in 64 bits).
const gamma uint64 = 0x9E3779B97F4A7C15

// mix64 is the SplitMix64 output function (Stafford's Mix13).
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// fnv1a64 is the 64-bit FNV-1a hash of s's bytes.
func fnv1a64(s string) uint64 {
	h := uint64(0xCBF29CE484222325)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 0x100000001B3
	}
	return h
}

// TensorKey is the per-tensor stream key: mix64(seed XOR FNV-1a-64(name)).
func TensorKey(seed uint64, name string) uint64 { return mix64(seed ^ fnv1a64(name)) }

// elementHash is the 64 random bits of element i (row-major index in the
// checkpoint tensor): the i-th SplitMix64 output of the stream key.
func elementHash(key uint64, i int64) uint64 { return mix64(key + uint64(i+1)*gamma) }

// e4m3Normal maps the top byte of an element hash to an F8_E4M3 code: code
// i is float8_e4m3fn(Φ⁻¹((i+0.5)/256) · 448/Φ⁻¹(255.5/256)) rounded to
// nearest even, a 256-quantile Gaussian whose extremes are ±448 (the range
// a min-max observer gives every row); RMS 154.14. No NaN code (0x7F/0xFF).
// gen_test.go recomputes it.
var e4m3Normal = [256]uint8{
	0xFE, 0xFC, 0xFB, 0xFB, 0xFA, 0xFA, 0xF9, 0xF9, 0xF9, 0xF9, 0xF8, 0xF8, 0xF8, 0xF8, 0xF7, 0xF7,
	0xF7, 0xF6, 0xF6, 0xF6, 0xF6, 0xF5, 0xF5, 0xF5, 0xF5, 0xF4, 0xF4, 0xF4, 0xF4, 0xF4, 0xF3, 0xF3,
	0xF3, 0xF3, 0xF3, 0xF3, 0xF2, 0xF2, 0xF2, 0xF2, 0xF2, 0xF2, 0xF1, 0xF1, 0xF1, 0xF1, 0xF1, 0xF1,
	0xF1, 0xF0, 0xF0, 0xF0, 0xF0, 0xF0, 0xEF, 0xEF, 0xEF, 0xEF, 0xEE, 0xEE, 0xEE, 0xEE, 0xED, 0xED,
	0xED, 0xED, 0xEC, 0xEC, 0xEC, 0xEC, 0xEC, 0xEB, 0xEB, 0xEB, 0xEB, 0xEA, 0xEA, 0xEA, 0xEA, 0xEA,
	0xE9, 0xE9, 0xE9, 0xE9, 0xE9, 0xE8, 0xE8, 0xE8, 0xE7, 0xE7, 0xE7, 0xE6, 0xE6, 0xE5, 0xE5, 0xE5,
	0xE4, 0xE4, 0xE3, 0xE3, 0xE3, 0xE2, 0xE2, 0xE1, 0xE1, 0xE1, 0xE0, 0xE0, 0xDF, 0xDE, 0xDD, 0xDD,
	0xDC, 0xDB, 0xDA, 0xDA, 0xD9, 0xD8, 0xD6, 0xD5, 0xD3, 0xD2, 0xD0, 0xCE, 0xCB, 0xC7, 0xC1, 0xB4,
	0x34, 0x41, 0x47, 0x4B, 0x4E, 0x50, 0x52, 0x53, 0x55, 0x56, 0x58, 0x59, 0x5A, 0x5A, 0x5B, 0x5C,
	0x5D, 0x5D, 0x5E, 0x5F, 0x60, 0x60, 0x61, 0x61, 0x61, 0x62, 0x62, 0x63, 0x63, 0x63, 0x64, 0x64,
	0x65, 0x65, 0x65, 0x66, 0x66, 0x67, 0x67, 0x67, 0x68, 0x68, 0x68, 0x69, 0x69, 0x69, 0x69, 0x69,
	0x6A, 0x6A, 0x6A, 0x6A, 0x6A, 0x6B, 0x6B, 0x6B, 0x6B, 0x6C, 0x6C, 0x6C, 0x6C, 0x6C, 0x6D, 0x6D,
	0x6D, 0x6D, 0x6E, 0x6E, 0x6E, 0x6E, 0x6F, 0x6F, 0x6F, 0x6F, 0x70, 0x70, 0x70, 0x70, 0x70, 0x71,
	0x71, 0x71, 0x71, 0x71, 0x71, 0x71, 0x72, 0x72, 0x72, 0x72, 0x72, 0x72, 0x73, 0x73, 0x73, 0x73,
	0x73, 0x73, 0x74, 0x74, 0x74, 0x74, 0x74, 0x75, 0x75, 0x75, 0x75, 0x76, 0x76, 0x76, 0x76, 0x77,
	0x77, 0x77, 0x78, 0x78, 0x78, 0x78, 0x79, 0x79, 0x79, 0x79, 0x7A, 0x7A, 0x7B, 0x7B, 0x7C, 0x7E,
}

// Normalisers of the two real-valued generators: a weight row's expected
// RMS is E[jitter]·RMS(e4m3Normal) ≈ 1.125 × 154.14 ≈ scaleNorm, and the
// Irwin–Hall sum of 8 bytes has standard deviation √43690 ≈ gaussNorm.
const (
	scaleNorm = 173.4
	gaussNorm = 209.0
)

// Gains: the RMS of a linear's output for an RMS-1 input (weights, through
// their row scales), or the RMS of the values (plain tensors).
const (
	GainEmbed      = 0.5   // embed_tokens values
	GainLMHead     = 3.0   // logits std for the RMS-1 final normed hidden
	GainRouter     = 1.5   // router logits std
	GainCorrection = 0.001 // e_score_correction_bias values
	GainBias       = 0.05  // q/k/v bias values
	GainProj       = 1.0   // q, k, v, gate, up outputs
	GainOProj      = 0.25  // o_proj output (a residual update)
	GainDenseDown  = 0.15  // dense MLP down output
	GainExpertDown = 0.06  // routed expert down output (before the routing weight)
	GainSharedDown = 0.10  // shared expert down output
)

// ScaleBase is the row scale before the per-row jitter:
// float32(gain / (173.4 · √fanIn)), in float64 then rounded once.
func ScaleBase(gain float64, fanIn int) float32 {
	return float32(gain / (scaleNorm * math.Sqrt(float64(fanIn))))
}

// GaussStep is the multiplier of the Irwin–Hall integer:
// float32(gain / (209 · √fanIn)).
func GaussStep(gain float64, fanIn int) float32 {
	return float32(gain / (gaussNorm * math.Sqrt(float64(fanIn))))
}

// Kind is how a tensor's elements are made from their hashes h.
type Kind int

// Kinds.
const (
	// KindFP8: F8_E4M3 byte e4m3Normal[h >> 56].
	KindFP8 Kind = iota
	// KindScale: F32 Param × jitter, jitter = the float32 with bits
	// 0x3F800000 | (h >> 43), uniform in [1, 1.25).
	KindScale
	// KindGaussBF16: BF16 round-to-nearest-even of float32(n) × Param,
	// n = (sum of h's 8 bytes) − 1020.
	KindGaussBF16
	// KindGaussF32: F32 float32(n) × Param, n as above.
	KindGaussF32
	// KindNorm: BF16 bits 0x3F80 + (h >> 60) − 8, i.e. 1 + small steps in
	// [0.96875, 1.0546875].
	KindNorm
)

var kindNames = [...]string{"fp8", "scale", "gauss-bf16", "gauss-f32", "norm"}

func (k Kind) String() string {
	if k >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Tensor is one checkpoint tensor of a synthetic model and how its values
// are generated.
type Tensor struct {
	Name  string
	DType safetensors.DType
	Shape []int64
	Kind  Kind
	// Param is ScaleBase (KindScale) or GaussStep (KindGauss*); 0 otherwise.
	Param float32
	// Gain and FanIn are what Param was computed from.
	Gain  float64
	FanIn int
}

// NumElements is the product of the shape.
func (t *Tensor) NumElements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// ElemSize is the bytes of one element.
func (t *Tensor) ElemSize() int {
	switch t.DType {
	case safetensors.F32:
		return 4
	case safetensors.BF16:
		return 2
	}
	return 1
}

// ByteSize is the bytes of the whole tensor.
func (t *Tensor) ByteSize() int64 { return t.NumElements() * int64(t.ElemSize()) }

// bf16 rounds float32 bits to BF16 bits, to nearest even (no NaNs arise).
func bf16(u uint32) uint16 { return uint16((u + 0x7FFF + ((u >> 16) & 1)) >> 16) }

// ihSum is the Irwin–Hall integer of a hash: the sum of its 8 bytes − 1020.
func ihSum(h uint64) int32 {
	x := (h & 0x00FF00FF00FF00FF) + ((h >> 8) & 0x00FF00FF00FF00FF)
	x = (x & 0x0000FFFF0000FFFF) + ((x >> 16) & 0x0000FFFF0000FFFF)
	x = (x & 0xFFFFFFFF) + (x >> 32)
	return int32(x) - 1020
}

// Fill writes the little-endian bytes of elements from, from+1, ... of the
// tensor into dst (len(dst)/ElemSize elements).
func (t *Tensor) Fill(seed uint64, dst []byte, from int64) {
	key := TensorKey(seed, t.Name)
	p := t.Param
	// state + gamma per element is elementHash's argument, incrementally.
	state := key + uint64(from+1)*gamma
	switch t.Kind {
	case KindFP8:
		for j := range dst {
			dst[j] = e4m3Normal[mix64(state)>>56]
			state += gamma
		}
	case KindScale:
		for j := 0; j+4 <= len(dst); j += 4 {
			jitter := math.Float32frombits(0x3F800000 | uint32(mix64(state)>>43))
			binary.LittleEndian.PutUint32(dst[j:], math.Float32bits(float32(p*jitter)))
			state += gamma
		}
	case KindGaussBF16:
		for j := 0; j+2 <= len(dst); j += 2 {
			v := float32(float32(ihSum(mix64(state))) * p)
			binary.LittleEndian.PutUint16(dst[j:], bf16(math.Float32bits(v)))
			state += gamma
		}
	case KindGaussF32:
		for j := 0; j+4 <= len(dst); j += 4 {
			v := float32(float32(ihSum(mix64(state))) * p)
			binary.LittleEndian.PutUint32(dst[j:], math.Float32bits(v))
			state += gamma
		}
	case KindNorm:
		for j := 0; j+2 <= len(dst); j += 2 {
			binary.LittleEndian.PutUint16(dst[j:], uint16(0x3F80+int(mix64(state)>>60)-8))
			state += gamma
		}
	}
}

// fillChunk is how many elements one worker fills at a time.
const fillChunk = 1 << 20

// Bytes generates the whole tensor with up to workers goroutines (0: one
// per CPU).
func (t *Tensor) Bytes(seed uint64, workers int) []byte {
	es := int64(t.ElemSize())
	n := t.NumElements()
	out := make([]byte, n*es)
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	chunks := (n + fillChunk - 1) / fillChunk
	if workers == 1 || chunks <= 1 {
		t.Fill(seed, out, 0)
		return out
	}
	var wg sync.WaitGroup
	next := make(chan int64)
	for range min(int64(workers), chunks) {
		wg.Go(func() {
			for c := range next {
				lo, hi := c*fillChunk, min((c+1)*fillChunk, n)
				t.Fill(seed, out[lo*es:hi*es], lo)
			}
		})
	}
	for c := range chunks {
		next <- c
	}
	close(next)
	wg.Wait()
	return out
}

// Tensors lists every tensor of the synthetic checkpoint of cfg (the MTP
// layer excluded), embedding first, then layer by layer (names sorted
// within a layer), then the final norm and lm_head. Linears other than
// lm_head must be FP8 under cfg's quantization_config.
func Tensors(cfg *model.Config) ([]Tensor, error) {
	lins, tens := cfg.Architecture()
	var out []Tensor
	for _, s := range tens {
		if s.MTP {
			continue
		}
		t := Tensor{Name: s.Name, Shape: s.Shape}
		switch s.Role {
		case model.RoleEmbedding:
			t.DType, t.Kind, t.Gain, t.FanIn = safetensors.BF16, KindGaussBF16, GainEmbed, 1
		case model.RoleNorm:
			t.DType, t.Kind = safetensors.BF16, KindNorm
		case model.RoleRouter:
			t.DType, t.Kind, t.Gain, t.FanIn = safetensors.BF16, KindGaussBF16, GainRouter, cfg.HiddenSize
		case model.RoleCorrectionBias:
			t.DType, t.Kind, t.Gain, t.FanIn = safetensors.F32, KindGaussF32, GainCorrection, 1
		default:
			return nil, fmt.Errorf("tensor %s: role %d has no synthetic generator", s.Name, s.Role)
		}
		out = append(out, t.withParam())
	}
	for _, l := range lins {
		if l.MTP {
			continue
		}
		out2, err := linearTensors(cfg, l)
		if err != nil {
			return nil, err
		}
		out = append(out, out2...)
	}
	sort.SliceStable(out, func(i, j int) bool {
		li, lj := layerOrder(cfg, out[i].Name), layerOrder(cfg, out[j].Name)
		if li != lj {
			return li < lj
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

func (t Tensor) withParam() Tensor {
	switch t.Kind {
	case KindScale:
		t.Param = ScaleBase(t.Gain, t.FanIn)
	case KindGaussBF16, KindGaussF32:
		t.Param = GaussStep(t.Gain, t.FanIn)
	}
	return t
}

func linearTensors(cfg *model.Config, l model.LinearSpec) ([]Tensor, error) {
	out, in := int64(l.Out), int64(l.In)
	if l.Component == model.CompLMHead {
		t := Tensor{Name: l.Module + ".weight", DType: safetensors.BF16, Shape: []int64{out, in}, Kind: KindGaussBF16, Gain: GainLMHead, FanIn: l.In}
		return []Tensor{t.withParam()}, nil
	}
	if q := cfg.Quantization; q == nil || q.Ignored(l.Module) {
		return nil, fmt.Errorf("linear %s: synthetic linears are FP8, but the config does not quantize it", l.Module)
	}
	ts := []Tensor{
		{Name: l.Module + ".weight", DType: safetensors.F8_E4M3, Shape: []int64{out, in}, Kind: KindFP8},
		Tensor{Name: l.Module + ".weight_scale", DType: safetensors.F32, Shape: []int64{out, 1}, Kind: KindScale, Gain: linearGain(l), FanIn: l.In}.withParam(),
	}
	if l.HasBias {
		ts = append(ts, Tensor{Name: l.Module + ".bias", DType: safetensors.BF16, Shape: []int64{out}, Kind: KindGaussBF16, Gain: GainBias, FanIn: 1}.withParam())
	}
	return ts, nil
}

// linearGain is the output RMS a linear's row scales aim at.
func linearGain(l model.LinearSpec) float64 {
	switch {
	case strings.HasSuffix(l.Module, ".o_proj"):
		return GainOProj
	case strings.HasSuffix(l.Module, ".down_proj"):
		switch l.Component {
		case model.CompExperts:
			return GainExpertDown
		case model.CompShared:
			return GainSharedDown
		}
		return GainDenseDown
	}
	return GainProj
}

// layerOrder sorts the embedding first, then layers, then the rest.
func layerOrder(cfg *model.Config, name string) int {
	if name == model.EmbedName {
		return -1
	}
	var l int
	if _, err := fmt.Sscanf(name, "model.layers.%d.", &l); err == nil {
		return l
	}
	return cfg.NumHiddenLayers + cfg.NumNextNPredictLayers
}
