package cpu

import (
	"fmt"

	"github.com/glmctl/glmctl/pkg/model"
	"github.com/glmctl/glmctl/pkg/safetensors"
	"github.com/glmctl/glmctl/pkg/weightcheck"
)

// linear is one linear module in memory: y = x·Wᵀ (+ bias).
type linear struct {
	name    string
	out, in int
	// w is [out][in]. On the exact path it holds the dequantized weights;
	// on the FP8-activation path, for a quantized module, the FP8 code values
	// themselves (exact in float32), with the row scales kept in scale.
	w []float32
	// scale is the per-row weight scale, set only on the FP8-activation path
	// for quantized modules; its presence means "quantize the input per
	// token and rescale the product".
	scale []float32
	bias  []float32 // [out] or nil
}

type mlpWeights struct{ gate, up, down linear }

type moeWeights struct {
	router     linear    // [E][H], float32 (upcast from BF16); never quantized
	correction []float32 // e_score_correction_bias [E]
	experts    []mlpWeights
	shared     *mlpWeights // nil when n_shared_experts = 0
}

type layerWeights struct {
	inNorm, postNorm []float32
	q, k, v, o       linear
	qNorm, kNorm     []float32 // nil when use_qk_norm is false
	dense            *mlpWeights
	moe              *moeWeights
}

type weights struct {
	embed     []float32 // [V][H]
	finalNorm []float32
	lmHead    linear
	layers    []layerWeights
}

// loader reads bound tensors of an open checkpoint into float32.
type loader struct {
	ck   *safetensors.Checkpoint
	bind *model.Binding
	fp8  bool
	// onLoad reports the bytes read of total (nil: nobody asked).
	onLoad      func(done, total int64)
	done, total int64
}

func loadWeights(dir string, cfg *model.Config, fp8 bool, onLoad func(done, total int64)) (*weights, error) {
	ck, bind, err := model.OpenBound(dir, cfg)
	if err != nil {
		return nil, err
	}
	// Every tensor is copied into float32 slices; the mapping is not kept.
	defer ck.Close()
	if err := bind.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	// Scales, norms and biases: a NaN or a zero scale there poisons every
	// token, so refuse the checkpoint now, naming tensor and shard.
	if err := weightcheck.Check(ck, bind); err != nil {
		return nil, err
	}
	if need := weightBytes(cfg, bind); need > MaxWeightBytes {
		return nil, fmt.Errorf("%s: the CPU backend holds weights as float32 and would need %d bytes, over its limit of %d (it is meant for small models; use the CUDA backend)",
			dir, need, int64(MaxWeightBytes))
	}
	ld := &loader{ck: ck, bind: bind, fp8: fp8, onLoad: onLoad}
	if onLoad != nil {
		ld.total = readBytes(cfg, bind)
	}
	return ld.load(cfg)
}

// weightBytes is the float32 size of every main-model tensor.
func weightBytes(cfg *model.Config, bind *model.Binding) int64 {
	var n int64
	for _, t := range bind.Tensors {
		if !isMTP(cfg, t.Name) {
			n += t.NumElements()
		}
	}
	for _, l := range bind.Linears {
		if !l.Spec.MTP {
			n += l.Weight.NumElements()
		}
	}
	return 4 * n
}

// readBytes is the checkpoint size of every main-model tensor the loader
// reads (for progress).
func readBytes(cfg *model.Config, bind *model.Binding) int64 {
	var n int64
	for _, t := range bind.Tensors {
		if !isMTP(cfg, t.Name) {
			n += t.ByteSize()
		}
	}
	for _, l := range bind.Linears {
		if l.Spec.MTP {
			continue
		}
		for _, t := range []*safetensors.TensorInfo{l.Weight, l.Bias, l.Scale} {
			if t != nil && (t != l.Scale || l.Quantized) {
				n += t.ByteSize()
			}
		}
	}
	return n
}

func isMTP(cfg *model.Config, name string) bool {
	var l int
	if _, err := fmt.Sscanf(name, "model.layers.%d.", &l); err == nil {
		return l >= cfg.NumHiddenLayers
	}
	return false
}

func (ld *loader) load(cfg *model.Config) (*weights, error) {
	H := cfg.HiddenSize
	w := &weights{}
	var err error
	if w.embed, err = ld.tensor(model.EmbedName, cfg.VocabSize*H); err != nil {
		return nil, err
	}
	if w.finalNorm, err = ld.tensor(model.FinalNormName, H); err != nil {
		return nil, err
	}
	if w.lmHead, err = ld.linear(model.LMHeadModule); err != nil {
		return nil, err
	}
	w.layers = make([]layerWeights, cfg.NumHiddenLayers)
	for l := range w.layers {
		if err := ld.layer(cfg, l, &w.layers[l]); err != nil {
			return nil, err
		}
	}
	return w, nil
}

func (ld *loader) layer(cfg *model.Config, l int, lw *layerWeights) error {
	H := cfg.HiddenSize
	p := model.LayerPrefix(l)
	var err error
	if lw.inNorm, err = ld.tensor(p+".input_layernorm.weight", H); err != nil {
		return err
	}
	if lw.postNorm, err = ld.tensor(p+".post_attention_layernorm.weight", H); err != nil {
		return err
	}
	for _, x := range []struct {
		dst  *linear
		name string
	}{{&lw.q, "q_proj"}, {&lw.k, "k_proj"}, {&lw.v, "v_proj"}, {&lw.o, "o_proj"}} {
		if *x.dst, err = ld.linear(p + ".self_attn." + x.name); err != nil {
			return err
		}
	}
	if cfg.UseQKNorm {
		if lw.qNorm, err = ld.tensor(p+".self_attn.q_norm.weight", cfg.HeadDim); err != nil {
			return err
		}
		if lw.kNorm, err = ld.tensor(p+".self_attn.k_norm.weight", cfg.HeadDim); err != nil {
			return err
		}
	}
	m := p + ".mlp"
	if !cfg.IsMoELayer(l) {
		lw.dense, err = ld.mlp(m)
		return err
	}
	E := cfg.NRoutedExperts
	mw := &moeWeights{experts: make([]mlpWeights, E)}
	mw.router = linear{name: m + ".gate", out: E, in: H}
	if mw.router.w, err = ld.tensor(m+".gate.weight", E*H); err != nil {
		return err
	}
	if mw.correction, err = ld.tensor(m+".gate.e_score_correction_bias", E); err != nil {
		return err
	}
	for e := range E {
		ex, err := ld.mlp(model.ExpertPrefix(l, e))
		if err != nil {
			return err
		}
		mw.experts[e] = *ex
	}
	if cfg.NSharedExperts > 0 {
		if mw.shared, err = ld.mlp(m + ".shared_experts"); err != nil {
			return err
		}
	}
	lw.moe = mw
	return nil
}

func (ld *loader) mlp(prefix string) (*mlpWeights, error) {
	var m mlpWeights
	var err error
	if m.gate, err = ld.linear(prefix + ".gate_proj"); err != nil {
		return nil, err
	}
	if m.up, err = ld.linear(prefix + ".up_proj"); err != nil {
		return nil, err
	}
	if m.down, err = ld.linear(prefix + ".down_proj"); err != nil {
		return nil, err
	}
	return &m, nil
}

// tensor decodes a checkpoint tensor to float32 and checks its element count.
func (ld *loader) tensor(name string, want int) ([]float32, error) {
	info, ok := ld.ck.Tensors[name]
	if !ok {
		return nil, fmt.Errorf("tensor %s: missing from checkpoint %s", name, ld.ck.Dir)
	}
	if n := info.NumElements(); n != int64(want) {
		return nil, fmt.Errorf("tensor %s (shard %s): %d elements (shape %v), want %d", name, info.File, n, info.Shape, want)
	}
	data, err := ld.ck.Data(name)
	if err != nil {
		return nil, fmt.Errorf("read tensor %s: %w", name, err)
	}
	dst := make([]float32, want)
	if err := safetensors.DecodeFloat32s(info.DType, data, dst); err != nil {
		return nil, fmt.Errorf("tensor %s (shard %s): %w", name, info.File, err)
	}
	if ld.onLoad != nil {
		ld.done += int64(len(data))
		ld.onLoad(ld.done, max(ld.total, ld.done))
	}
	return dst, nil
}

// linear loads a bound linear module. A quantized weight is dequantized in
// float32 (exact path) or kept as FP8 codes plus row scales (FP8 path).
func (ld *loader) linear(module string) (linear, error) {
	bl := ld.bind.Linear(module)
	if bl == nil {
		return linear{}, fmt.Errorf("linear %s: not bound in checkpoint %s", module, ld.ck.Dir)
	}
	out, in := bl.Spec.Out, bl.Spec.In
	l := linear{name: module, out: out, in: in}
	var err error
	if l.w, err = ld.tensor(bl.Weight.Name, out*in); err != nil {
		return linear{}, err
	}
	if bl.Bias != nil {
		if l.bias, err = ld.tensor(bl.Bias.Name, out); err != nil {
			return linear{}, err
		}
	}
	if !bl.Quantized {
		return l, nil
	}
	var rowScale []float32
	switch bl.ScaleStrategy {
	case model.StrategyChannel:
		if rowScale, err = ld.tensor(bl.Scale.Name, out); err != nil {
			return linear{}, err
		}
	case model.StrategyTensor:
		one, err := ld.tensor(bl.Scale.Name, 1)
		if err != nil {
			return linear{}, err
		}
		rowScale = make([]float32, out)
		for i := range rowScale {
			rowScale[i] = one[0]
		}
	default:
		return linear{}, fmt.Errorf("linear %s: weight_scale strategy %q (shape %v) is not supported by the CPU backend (want channel or tensor)",
			module, bl.ScaleStrategy, bl.Scale.Shape)
	}
	if ld.fp8 {
		l.scale = rowScale
		return l, nil
	}
	// float32(fp8) × float32(scale), one rounding in float32, as the
	// reference dequantizes.
	for r := range out {
		s := rowScale[r]
		row := l.w[r*in : (r+1)*in]
		for j := range row {
			row[j] *= s
		}
	}
	return l, nil
}
