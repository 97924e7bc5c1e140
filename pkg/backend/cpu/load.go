package cpu

import (
	"errors"
	"fmt"
	"strings"

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
	mtp       *mtpWeights // nil unless Options.DraftTokens > 0
}

// mtpWeights is the MTP ("nextn") layer, layer num_hidden_layers of the
// checkpoint (docs/speculative.md). Its own embed_tokens and
// shared_head.head are never loaded: the main embedding and lm_head serve.
type mtpWeights struct {
	enorm, hnorm []float32
	headNorm     []float32 // shared_head.norm
	ehProj       linear    // [H][2H], input [embedding ; hidden]
	layer        layerWeights
}

// loader reads bound tensors of an open checkpoint into float32.
type loader struct {
	ck   *safetensors.Checkpoint
	bind *model.Binding
	fp8  bool
	// mtp: the MTP layer is loaded too (its tensors count in the sizes).
	mtp bool
	// onLoad reports the bytes read of total (nil: nobody asked).
	onLoad      func(done, total int64)
	done, total int64
}

func loadWeights(dir string, cfg *model.Config, fp8, mtp bool, onLoad func(done, total int64)) (*weights, error) {
	ck, bind, err := model.OpenBound(dir, cfg)
	if err != nil {
		return nil, err
	}
	// Every tensor is copied into float32 slices; the mapping is not kept.
	defer ck.Close()
	if err := bind.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	if mtp {
		if err := mtpBindErr(cfg, bind); err != nil {
			return nil, fmt.Errorf("%s: %w", dir, err)
		}
	}
	// Scales, norms and biases: a NaN or a zero scale there poisons every
	// token, so refuse the checkpoint now, naming tensor and shard. (The
	// MTP layer's are not checked: it only proposes drafts, and bad drafts
	// cost speed, never correctness.)
	if err := weightcheck.Check(ck, bind); err != nil {
		return nil, err
	}
	if need := weightBytes(cfg, bind, mtp); need > MaxWeightBytes {
		return nil, fmt.Errorf("%s: the CPU backend holds weights as float32 and would need %d bytes, over its limit of %d (it is meant for small models; use the CUDA backend)",
			dir, need, int64(MaxWeightBytes))
	}
	ld := &loader{ck: ck, bind: bind, fp8: fp8, mtp: mtp, onLoad: onLoad}
	if onLoad != nil {
		ld.total = readBytes(cfg, bind, mtp)
	}
	return ld.load(cfg)
}

// mtpBindErr reports the binding problems of the MTP layer the backend
// loads (layer num_hidden_layers), naming each tensor. The layer's own
// embedding and head, which are never read, and unexpected extra tensors
// do not count.
func mtpBindErr(cfg *model.Config, bind *model.Binding) error {
	var errs []error
	for _, p := range bind.Problems {
		if !p.MTP || !loadsMTPTensor(cfg, p.Tensor) || strings.HasPrefix(p.Msg, "unexpected tensor") {
			continue
		}
		errs = append(errs, errors.New(p.String()))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("speculative decoding (DraftTokens > 0) needs the MTP layer %s.*, and the checkpoint's does not match the architecture:\n%w",
		model.LayerPrefix(cfg.NumHiddenLayers), errors.Join(errs...))
}

func isMTP(cfg *model.Config, name string) bool {
	var l int
	if _, err := fmt.Sscanf(name, "model.layers.%d.", &l); err == nil {
		return l >= cfg.NumHiddenLayers
	}
	return false
}

// loadsMTPTensor reports whether name is a tensor of the MTP layer the
// backend reads: layer num_hidden_layers, without its embed_tokens and
// shared_head.head (docs/speculative.md).
func loadsMTPTensor(cfg *model.Config, name string) bool {
	p := model.LayerPrefix(cfg.NumHiddenLayers) + "."
	if !strings.HasPrefix(name, p) {
		return false
	}
	rest := name[len(p):]
	return !strings.HasPrefix(rest, "embed_tokens.") && !strings.HasPrefix(rest, "shared_head.head.")
}

// loaded reports whether the loader reads tensor name: every main-model
// tensor, and the used MTP tensors when mtp is set.
func loaded(cfg *model.Config, name string, mtp bool) bool {
	if !isMTP(cfg, name) {
		return true
	}
	return mtp && loadsMTPTensor(cfg, name)
}

// weightBytes is the float32 size of every tensor the loader reads.
func weightBytes(cfg *model.Config, bind *model.Binding, mtp bool) int64 {
	var n int64
	for _, t := range bind.Tensors {
		if loaded(cfg, t.Name, mtp) {
			n += t.NumElements()
		}
	}
	for _, l := range bind.Linears {
		if loaded(cfg, l.Weight.Name, mtp) {
			n += l.Weight.NumElements()
		}
	}
	return 4 * n
}

// readBytes is the checkpoint size of every tensor the loader reads (for
// progress).
func readBytes(cfg *model.Config, bind *model.Binding, mtp bool) int64 {
	var n int64
	for _, t := range bind.Tensors {
		if loaded(cfg, t.Name, mtp) {
			n += t.ByteSize()
		}
	}
	for _, l := range bind.Linears {
		if !loaded(cfg, l.Weight.Name, mtp) {
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
	if ld.mtp {
		if w.mtp, err = ld.mtpLayer(cfg); err != nil {
			return nil, fmt.Errorf("MTP layer (DraftTokens > 0): %w", err)
		}
	}
	return w, nil
}

// mtpLayer loads the MTP layer: its norms, eh_proj and a full MoE decoder
// layer (the same loading as the main layers'). eh_proj is unquantized in
// the FP8 release, so it is a plain float32 linear; were it FP8, ld.linear
// would treat it like any quantized linear.
func (ld *loader) mtpLayer(cfg *model.Config) (*mtpWeights, error) {
	H, L := cfg.HiddenSize, cfg.NumHiddenLayers
	p := model.LayerPrefix(L)
	m := &mtpWeights{}
	var err error
	for _, x := range []struct {
		dst  *[]float32
		name string
	}{{&m.enorm, ".enorm.weight"}, {&m.hnorm, ".hnorm.weight"}, {&m.headNorm, ".shared_head.norm.weight"}} {
		if *x.dst, err = ld.tensor(p+x.name, H); err != nil {
			return nil, err
		}
	}
	if m.ehProj, err = ld.linear(p + ".eh_proj"); err != nil {
		return nil, err
	}
	if m.ehProj.out != H || m.ehProj.in != 2*H {
		return nil, fmt.Errorf("linear %s.eh_proj: shape [%d %d], want [%d %d]", p, m.ehProj.out, m.ehProj.in, H, 2*H)
	}
	if err := ld.layer(cfg, L, &m.layer); err != nil {
		return nil, err
	}
	if m.layer.moe == nil {
		// IsMoELayer holds for every index >= first_k_dense_replace.
		return nil, fmt.Errorf("layer %s is not a MoE layer (first_k_dense_replace %d)", p, cfg.FirstKDenseReplace)
	}
	return m, nil
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
