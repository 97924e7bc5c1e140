package model

import (
	"fmt"
	"strings"

	"github.com/glmctl/glmctl/pkg/safetensors"
)

// ComponentCount is the parameter and byte count of one component.
type ComponentCount struct {
	Component Component `json:"component"`
	Params    int64     `json:"params"` // weights, biases, norms, router (scales are not parameters)
	Bytes     int64     `json:"bytes"`  // everything stored, scales included
}

// Accounting is the parameter and byte breakdown of a checkpoint.
type Accounting struct {
	Components []ComponentCount `json:"components"`  // in Components order; CompMTP last
	MainParams int64            `json:"main_params"` // everything plain inference uses
	MainBytes  int64            `json:"main_bytes"`
	MTPParams  int64            `json:"mtp_params"` // the nextn layer(s), counted apart
	MTPBytes   int64            `json:"mtp_bytes"`
	// Assumed is true when some dtypes were not read from shard headers
	// and were inferred from quantization_config (FP8 linears, F32 scales,
	// BF16 otherwise).
	Assumed bool `json:"dtypes_assumed"`
}

// dtypeOf returns the dtype of a bound tensor, or the assumed one.
func dtypeOf(t *safetensors.TensorInfo, assumed safetensors.DType, flag *bool) safetensors.DType {
	if t != nil && t.DType != "" {
		return t.DType
	}
	*flag = true
	return assumed
}

// linearDTypes decides weight and scale dtypes of a linear (scale "" when
// unquantized), from the binding when known, else from quantization_config.
func linearDTypes(cfg *Config, b *Binding, spec LinearSpec, assumed *bool) (w, s safetensors.DType) {
	var bl *BoundLinear
	if b != nil {
		bl = b.Linears[spec.Module]
	}
	if bl != nil && bl.Weight.DType != "" {
		w = bl.Weight.DType
		if bl.Scale != nil {
			s = bl.Scale.DType
		}
		return w, s
	}
	*assumed = true
	q := cfg.Quantization
	if bl != nil {
		// Known by name only: quantized iff the index lists a scale.
		if bl.Scale != nil {
			return safetensors.F8_E4M3, safetensors.F32
		}
		return safetensors.BF16, ""
	}
	if q != nil && !q.Ignored(spec.Module) && spec.Component != CompLMHead {
		return safetensors.F8_E4M3, safetensors.F32
	}
	return safetensors.BF16, ""
}

// scaleElems is the number of scale elements of a quantized linear.
func scaleElems(cfg *Config, b *Binding, spec LinearSpec) int64 {
	if b != nil {
		if bl := b.Linears[spec.Module]; bl != nil && bl.Scale != nil && bl.Scale.DType != "" {
			return bl.Scale.NumElements()
		}
	}
	if q := cfg.Quantization; q != nil {
		if w := q.WeightScheme(); w != nil {
			switch w.Strategy {
			case StrategyTensor:
				return 1
			case StrategyBlock:
				br, bc := int64(w.BlockStructure[0]), int64(w.BlockStructure[1])
				return ((int64(spec.Out) + br - 1) / br) * ((int64(spec.In) + bc - 1) / bc)
			}
		}
	}
	return int64(spec.Out)
}

// Account counts parameters and bytes per component. b may be nil (config
// alone); tensors absent from b are counted with assumed dtypes, except
// optional MTP tensors, which count only when present.
func Account(cfg *Config, b *Binding) Accounting {
	var a Accounting
	byComp := map[Component]*ComponentCount{}
	for _, c := range Components {
		byComp[c] = &ComponentCount{Component: c}
	}
	add := func(c Component, params, bytes int64) {
		byComp[c].Params += params
		byComp[c].Bytes += bytes
	}
	lins, tens := cfg.Architecture()
	for _, spec := range tens {
		var t *safetensors.TensorInfo
		if b != nil {
			t = b.Tensors[spec.Name]
		}
		if spec.Optional && t == nil {
			continue
		}
		n := int64(1)
		for _, d := range spec.Shape {
			n *= d
		}
		assumed := safetensors.BF16
		if spec.Role == RoleCorrectionBias {
			assumed = safetensors.F32
		}
		dt := dtypeOf(t, assumed, &a.Assumed)
		add(spec.Component, n, n*int64(dt.Size()))
	}
	for _, spec := range lins {
		if spec.Optional && (b == nil || b.Linears[spec.Module] == nil) {
			continue
		}
		w, s := linearDTypes(cfg, b, spec, &a.Assumed)
		n := int64(spec.Out) * int64(spec.In)
		bytes := n * int64(w.Size())
		if s != "" {
			bytes += scaleElems(cfg, b, spec) * int64(s.Size())
		}
		params := n
		if spec.HasBias {
			params += int64(spec.Out)
			bd := safetensors.BF16
			if b != nil {
				if bl := b.Linears[spec.Module]; bl != nil && bl.Bias != nil && bl.Bias.DType != "" {
					bd = bl.Bias.DType
				}
			}
			bytes += int64(spec.Out) * int64(bd.Size())
		}
		add(spec.Component, params, bytes)
	}
	for _, c := range Components {
		cc := *byComp[c]
		a.Components = append(a.Components, cc)
		if c == CompMTP {
			a.MTPParams += cc.Params
			a.MTPBytes += cc.Bytes
		} else {
			a.MainParams += cc.Params
			a.MainBytes += cc.Bytes
		}
	}
	return a
}

// ActiveParamsPerToken is the number of parameters one token touches in the
// main model (top-k routed experts plus everything dense), embedding and
// lm_head included.
func ActiveParamsPerToken(cfg *Config, a Accounting) int64 {
	var active int64
	for _, cc := range a.Components {
		switch cc.Component {
		case CompMTP:
		case CompExperts:
			if cfg.NRoutedExperts > 0 {
				active += cc.Params / int64(cfg.NRoutedExperts) * int64(cfg.NumExpertsPerTok)
			}
		default:
			active += cc.Params
		}
	}
	return active
}

// PlanOptions describe a deployment for the per-GPU memory plan.
type PlanOptions struct {
	TP          int   `json:"tp"`            // tensor-parallel ranks (= GPUs)
	EP          int   `json:"ep"`            // expert-parallel group size; must divide TP
	KVTokens    int64 `json:"kv_tokens"`     // tokens of KV cache to hold (whole deployment)
	KVElemBytes int   `json:"kv_elem_bytes"` // 2 for BF16 KV, 1 for FP8 KV
	IncludeMTP  bool  `json:"include_mtp"`   // also place the MTP layer (sharing embedding and head)
}

// PlanRow is one line of the per-GPU memory plan.
type PlanRow struct {
	Item  string `json:"item"`
	Bytes int64  `json:"bytes"`
}

// MemoryPlan is the per-GPU memory need of a TP/EP deployment.
type MemoryPlan struct {
	Opts               PlanOptions `json:"options"`
	Rows               []PlanRow   `json:"rows"`                       // weights by item, per GPU
	WeightBytes        int64       `json:"weight_bytes"`               // per GPU
	KVBytesPerTokenGPU int64       `json:"kv_bytes_per_token_per_gpu"` // per GPU per cached token
	KVHeadsPerGPU      int         `json:"kv_heads_per_gpu"`
	KVBytes            int64       `json:"kv_bytes"`    // per GPU for Opts.KVTokens
	Total              int64       `json:"total_bytes"` // WeightBytes + KVBytes
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// Plan computes the per-GPU memory of the deployment: attention, dense MLP,
// shared experts and lm_head tensor-parallel (vocab-parallel embedding and
// head), routed experts expert-parallel over EP ranks and tensor-parallel
// over TP/EP within each (docs/model.md §7.1); router and norms replicated. The
// busiest GPU is reported (ceil division). Dtypes come from the binding
// when known, else from quantization_config.
func Plan(cfg *Config, b *Binding, o PlanOptions) (MemoryPlan, error) {
	if o.TP <= 0 {
		return MemoryPlan{}, fmt.Errorf("tp: must be >= 1, got %d", o.TP)
	}
	if o.EP <= 0 {
		o.EP = 1
	}
	if o.TP%o.EP != 0 {
		return MemoryPlan{}, fmt.Errorf("ep: %d must divide tp %d", o.EP, o.TP)
	}
	if cfg.NRoutedExperts > 0 && cfg.NRoutedExperts%o.EP != 0 {
		return MemoryPlan{}, fmt.Errorf("ep: %d must divide n_routed_experts %d", o.EP, cfg.NRoutedExperts)
	}
	if cfg.NumAttentionHeads%o.TP != 0 {
		return MemoryPlan{}, fmt.Errorf("tp: %d must divide num_attention_heads %d", o.TP, cfg.NumAttentionHeads)
	}
	if o.KVElemBytes == 0 {
		o.KVElemBytes = 2
	}
	if o.KVTokens < 0 {
		return MemoryPlan{}, fmt.Errorf("kv-tokens: must be >= 0, got %d", o.KVTokens)
	}
	tp := int64(o.TP)
	expertTP := int64(o.TP / o.EP) // ways each expert is split
	kvHeads := int64(cfg.NumKeyValueHeads)
	kvHeadsPerGPU := ceilDiv(kvHeads, tp) // replicated when tp > kv heads
	qHeadsPerGPU := int64(cfg.NumAttentionHeads) / tp
	D := int64(cfg.HeadDim)

	var dummy bool
	rows := map[string]int64{}
	order := []string{"embedding (vocab-parallel)", "lm_head (vocab-parallel)", "attention", "dense MLP", "routed experts", "shared experts", "router (replicated)", "norms (replicated)", "MTP layer"}
	// linBytes places a linear with `outRows` of its output rows and `inCols`
	// of its input columns on this GPU; scales follow the rows.
	linBytes := func(spec LinearSpec, outRows, inCols int64) int64 {
		w, s := linearDTypes(cfg, b, spec, &dummy)
		n := outRows * inCols * int64(w.Size())
		if s != "" {
			full := scaleElems(cfg, b, spec)
			if full == int64(spec.Out) {
				n += outRows * int64(s.Size())
			} else {
				n += full * int64(s.Size()) // tensor/block scales: keep all (small)
			}
		}
		if spec.HasBias {
			n += outRows * 2
		}
		return n
	}
	lins, tens := cfg.Architecture()
	expertsPerRank := int64(0)
	if cfg.NRoutedExperts > 0 {
		expertsPerRank = int64(cfg.NRoutedExperts / o.EP)
	}
	for _, spec := range lins {
		if spec.MTP && !o.IncludeMTP {
			continue
		}
		out, in := int64(spec.Out), int64(spec.In)
		item := ""
		var bytes int64
		switch {
		case spec.Component == CompLMHead:
			item, bytes = "lm_head (vocab-parallel)", linBytes(spec, ceilDiv(out, tp), in)
		case spec.MTP && (hasSuffix(spec.Module, ".shared_head.head")):
			continue // MTP reuses the main lm_head
		case spec.Component == CompAttention || (spec.MTP && isAttn(spec.Module)):
			item = "attention"
			switch {
			case hasSuffix(spec.Module, ".q_proj"):
				bytes = linBytes(spec, qHeadsPerGPU*D, in)
			case hasSuffix(spec.Module, ".k_proj"), hasSuffix(spec.Module, ".v_proj"):
				bytes = linBytes(spec, kvHeadsPerGPU*D, in)
			default: // o_proj: input columns split by heads
				bytes = linBytes(spec, out, qHeadsPerGPU*D)
			}
		case spec.Component == CompExperts || (spec.MTP && isExpert(spec.Module)):
			item = "routed experts"
			// Only experts owned by rank 0's EP group count; each of them is
			// split expertTP ways along the intermediate dimension.
			if expertIndex(spec.Module) >= expertsPerRank {
				continue
			}
			if hasSuffix(spec.Module, ".down_proj") {
				bytes = linBytes(spec, out, ceilDiv(in, expertTP))
			} else {
				bytes = linBytes(spec, ceilDiv(out, expertTP), in)
			}
		default: // dense MLP, shared experts, MTP eh_proj
			switch {
			case spec.Component == CompShared || (spec.MTP && containsStr(spec.Module, ".shared_experts.")):
				item = "shared experts"
			case spec.Component == CompDenseMLP:
				item = "dense MLP"
			default:
				item = "MTP layer"
			}
			switch {
			case hasSuffix(spec.Module, ".down_proj"), hasSuffix(spec.Module, ".eh_proj"):
				bytes = linBytes(spec, out, ceilDiv(in, tp))
			default:
				bytes = linBytes(spec, ceilDiv(out, tp), in)
			}
		}
		if spec.MTP {
			item = "MTP layer"
		}
		rows[item] += bytes
	}
	for _, spec := range tens {
		if spec.MTP && !o.IncludeMTP {
			continue
		}
		var t *safetensors.TensorInfo
		if b != nil {
			t = b.Tensors[spec.Name]
		}
		assumed := safetensors.BF16
		if spec.Role == RoleCorrectionBias {
			assumed = safetensors.F32
		}
		dt := dtypeOf(t, assumed, &dummy)
		n := int64(1)
		for _, d := range spec.Shape {
			n *= d
		}
		item := "norms (replicated)"
		switch spec.Role {
		case RoleEmbedding:
			if spec.MTP {
				continue // MTP reuses the main embedding
			}
			item = "embedding (vocab-parallel)"
			n = ceilDiv(spec.Shape[0], tp) * spec.Shape[1]
		case RoleRouter, RoleCorrectionBias:
			item = "router (replicated)"
		}
		if spec.MTP {
			item = "MTP layer"
		}
		rows[item] += n * int64(dt.Size())
	}
	p := MemoryPlan{Opts: o, KVHeadsPerGPU: int(kvHeadsPerGPU)}
	for _, it := range order {
		if v, ok := rows[it]; ok {
			p.Rows = append(p.Rows, PlanRow{Item: it, Bytes: v})
			p.WeightBytes += v
		}
	}
	layers := int64(cfg.NumHiddenLayers)
	if o.IncludeMTP {
		layers += int64(cfg.NumNextNPredictLayers)
	}
	p.KVBytesPerTokenGPU = layers * 2 * kvHeadsPerGPU * D * int64(o.KVElemBytes)
	p.KVBytes = p.KVBytesPerTokenGPU * o.KVTokens
	p.Total = p.WeightBytes + p.KVBytes
	return p, nil
}

func hasSuffix(s, suf string) bool { return strings.HasSuffix(s, suf) }

func containsStr(s, sub string) bool { return strings.Contains(s, sub) }

func isAttn(module string) bool   { return containsStr(module, ".self_attn.") }
func isExpert(module string) bool { return containsStr(module, ".mlp.experts.") }

// expertIndex extracts e from "model.layers.L.mlp.experts.e.xxx", or -1.
func expertIndex(module string) int64 {
	var l, e int64
	var rest string
	if _, err := fmt.Sscanf(module, "model.layers.%d.mlp.experts.%d.%s", &l, &e, &rest); err != nil {
		return -1
	}
	return e
}
