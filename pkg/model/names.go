package model

import "fmt"

// Tensor names of the GLM-4.x MoE checkpoint layout (docs/model.md §2).
const (
	EmbedName     = "model.embed_tokens.weight"
	FinalNormName = "model.norm.weight"
	LMHeadModule  = "lm_head"
)

// LayerPrefix is the name prefix of decoder layer l ("model.layers.<l>").
func LayerPrefix(l int) string { return fmt.Sprintf("model.layers.%d", l) }

// ExpertPrefix is the module prefix of routed expert e in layer l.
func ExpertPrefix(l, e int) string { return fmt.Sprintf("model.layers.%d.mlp.experts.%d", l, e) }

// Component groups tensors for accounting.
type Component string

// Components, in report order.
const (
	CompEmbedding Component = "embedding"
	CompAttention Component = "attention"
	CompNorms     Component = "norms"
	CompDenseMLP  Component = "dense_mlp"
	CompRouter    Component = "router"
	CompExperts   Component = "routed_experts"
	CompShared    Component = "shared_experts"
	CompLMHead    Component = "lm_head"
	CompMTP       Component = "mtp"
)

// Components lists every component in report order.
var Components = []Component{CompEmbedding, CompAttention, CompNorms, CompDenseMLP, CompRouter, CompExperts, CompShared, CompLMHead, CompMTP}

// TensorRole says what a tensor is, which decides which dtypes it may have.
type TensorRole int

// Roles.
const (
	RoleLinearWeight   TensorRole = iota // FP8 (with a scale) or BF16/F16/F32
	RoleLinearScale                      // F32 or BF16, [out,1] for channel strategy
	RoleBias                             // q/k/v bias
	RoleNorm                             // RMSNorm weight
	RoleEmbedding                        // embedding table
	RoleRouter                           // router gate weight
	RoleCorrectionBias                   // e_score_correction_bias
)

// LinearSpec is one linear module of the architecture.
type LinearSpec struct {
	Module    string // e.g. "model.layers.0.self_attn.q_proj"
	Out, In   int
	HasBias   bool
	Component Component
	MTP       bool // part of the MTP (nextn) layer, not used by plain inference
	Optional  bool // may be absent (MTP copies of embedding/head that engines share)
}

// TensorSpec is one plain (non-linear) tensor the architecture expects.
type TensorSpec struct {
	Name      string
	Shape     []int64
	Role      TensorRole
	Component Component
	MTP       bool
	Optional  bool
}

// Architecture lists every linear module and plain tensor the config implies,
// including the MTP layers (marked MTP).
func (c *Config) Architecture() ([]LinearSpec, []TensorSpec) {
	var lins []LinearSpec
	var tens []TensorSpec
	H := c.HiddenSize
	tens = append(tens, TensorSpec{Name: EmbedName, Shape: []int64{int64(c.VocabSize), int64(H)}, Role: RoleEmbedding, Component: CompEmbedding})
	tens = append(tens, TensorSpec{Name: FinalNormName, Shape: []int64{int64(H)}, Role: RoleNorm, Component: CompNorms})
	lins = append(lins, LinearSpec{Module: LMHeadModule, Out: c.VocabSize, In: H, Component: CompLMHead})
	total := c.NumHiddenLayers + c.NumNextNPredictLayers
	for l := 0; l < total; l++ {
		mtp := l >= c.NumHiddenLayers
		l1, t1 := c.layerArchitecture(l, mtp)
		lins = append(lins, l1...)
		tens = append(tens, t1...)
	}
	return lins, tens
}

func (c *Config) layerArchitecture(l int, mtp bool) ([]LinearSpec, []TensorSpec) {
	var lins []LinearSpec
	var tens []TensorSpec
	H := c.HiddenSize
	p := LayerPrefix(l)
	comp := func(cmp Component) Component {
		if mtp {
			return CompMTP
		}
		return cmp
	}
	norm := func(name string, n int) {
		tens = append(tens, TensorSpec{Name: name, Shape: []int64{int64(n)}, Role: RoleNorm, Component: comp(CompNorms), MTP: mtp})
	}
	lin := func(module string, out, in int, bias bool, cmp Component) {
		lins = append(lins, LinearSpec{Module: module, Out: out, In: in, HasBias: bias, Component: comp(cmp), MTP: mtp})
	}
	norm(p+".input_layernorm.weight", H)
	norm(p+".post_attention_layernorm.weight", H)
	a := p + ".self_attn"
	lin(a+".q_proj", c.QueryDim(), H, c.AttentionBias, CompAttention)
	lin(a+".k_proj", c.KVDim(), H, c.AttentionBias, CompAttention)
	lin(a+".v_proj", c.KVDim(), H, c.AttentionBias, CompAttention)
	lin(a+".o_proj", H, c.QueryDim(), false, CompAttention)
	if c.UseQKNorm {
		norm(a+".q_norm.weight", c.HeadDim)
		norm(a+".k_norm.weight", c.HeadDim)
	}
	m := p + ".mlp"
	if !c.IsMoELayer(l) {
		lin(m+".gate_proj", c.IntermediateSize, H, false, CompDenseMLP)
		lin(m+".up_proj", c.IntermediateSize, H, false, CompDenseMLP)
		lin(m+".down_proj", H, c.IntermediateSize, false, CompDenseMLP)
	} else {
		E, I := c.NRoutedExperts, c.MoEIntermediateSize
		tens = append(tens, TensorSpec{Name: m + ".gate.weight", Shape: []int64{int64(E), int64(H)}, Role: RoleRouter, Component: comp(CompRouter), MTP: mtp})
		tens = append(tens, TensorSpec{Name: m + ".gate.e_score_correction_bias", Shape: []int64{int64(E)}, Role: RoleCorrectionBias, Component: comp(CompRouter), MTP: mtp})
		for e := 0; e < E; e++ {
			x := ExpertPrefix(l, e)
			lin(x+".gate_proj", I, H, false, CompExperts)
			lin(x+".up_proj", I, H, false, CompExperts)
			lin(x+".down_proj", H, I, false, CompExperts)
		}
		if c.NSharedExperts > 0 {
			S := c.SharedIntermediateSize()
			lin(m+".shared_experts.gate_proj", S, H, false, CompShared)
			lin(m+".shared_experts.up_proj", S, H, false, CompShared)
			lin(m+".shared_experts.down_proj", H, S, false, CompShared)
		}
	}
	if mtp {
		norm(p+".enorm.weight", H)
		norm(p+".hnorm.weight", H)
		norm(p+".shared_head.norm.weight", H)
		lin(p+".eh_proj", H, 2*H, false, CompMTP)
		// The MTP layer's own head and embedding may be absent: engines reuse
		// the main model's (docs/model.md §2.2, §6).
		lins = append(lins, LinearSpec{Module: p + ".shared_head.head", Out: c.VocabSize, In: H, Component: CompMTP, MTP: true, Optional: true})
		tens = append(tens, TensorSpec{Name: p + ".embed_tokens.weight", Shape: []int64{int64(c.VocabSize), int64(H)}, Role: RoleEmbedding, Component: CompMTP, MTP: true, Optional: true})
	}
	return lins, tens
}
