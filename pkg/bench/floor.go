package bench

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"strings"

	"github.com/glmctl/glmctl/pkg/model"
	"github.com/glmctl/glmctl/pkg/safetensors"
)

// Memory bandwidths the floor divides by, in bytes per second.
const (
	// H200MeasuredBandwidth is the HBM read rate measured on one H200 (a
	// reduction over 8 GiB, docs/hardware.md §2); the spec sheet says 4.8e12.
	H200MeasuredBandwidth = 4.46e12
	// H200SpecBandwidth and H100SpecBandwidth are the SXM data-sheet figures
	// (docs/hardware.md §4.1).
	H200SpecBandwidth = 4.8e12
	H100SpecBandwidth = 3.35e12
	// H100EstimatedBandwidth scales the H100 SXM spec by the H200's
	// measured/spec ratio: a measured-equivalent estimate, not a measurement.
	H100EstimatedBandwidth = H100SpecBandwidth * H200MeasuredBandwidth / H200SpecBandwidth
	// CPUAssumedBandwidth is an assumed DRAM read rate for the CPU backend.
	CPUAssumedBandwidth = 20e9
)

// Bandwidth is the memory read rate the floor assumes, and where it comes from.
type Bandwidth struct {
	BytesPerSecond float64 `json:"bytes_per_s"`
	Source         string  `json:"source"`
}

// DefaultBandwidth picks the bandwidth for a backend ("cpu", "cuda") and its
// device description (engine.BackendInfo.Device). An unknown GPU is an
// error: the caller must pass the figure explicitly.
func DefaultBandwidth(backendName, device string) (Bandwidth, error) {
	if backendName == "cpu" {
		return Bandwidth{CPUAssumedBandwidth, "assumed 20 GB/s DRAM read for the CPU backend (not measured; set --hbm-bandwidth)"}, nil
	}
	switch {
	case strings.Contains(device, "H200"):
		return Bandwidth{H200MeasuredBandwidth, "H200 HBM read, measured 4.46 TB/s (docs/hardware.md §2)"}, nil
	case strings.Contains(device, "H100"):
		return Bandwidth{H100EstimatedBandwidth, "H100 SXM estimate 3.35 TB/s × 4.46/4.8 (H200 measured/spec ratio), not measured"}, nil
	}
	return Bandwidth{}, fmt.Errorf("no default memory bandwidth for backend %q device %q (known: H200, H100, cpu): set --hbm-bandwidth in bytes/s", backendName, device)
}

// ExpectedDistinctExperts is the expected number of distinct routed experts
// one MoE layer touches for batch tokens when each token picks topK of
// experts uniformly and independently: E·(1−(1−k/E)^B). Batch may be a
// mean (fractional); 0 or less touches none.
func ExpectedDistinctExperts(experts, topK int, batch float64) float64 {
	if experts <= 0 || topK <= 0 || batch <= 0 {
		return 0
	}
	if topK >= experts {
		return float64(experts)
	}
	e := float64(experts)
	return e * (1 - math.Pow(1-float64(topK)/e, batch))
}

// FloorOptions is the deployment the floor describes.
type FloorOptions struct {
	TP          int `json:"tp"`            // tensor-parallel GPUs
	EP          int `json:"ep"`            // expert-parallel group size (divides TP); 0 = TP
	KVElemBytes int `json:"kv_elem_bytes"` // 2 = BF16 KV (both backends now), 1 = FP8; 0 = 2
}

// FloorModel holds the per-GPU byte counts of one decode step of a model on
// a TP/EP deployment, taken from model.Plan and model.Account.
type FloorModel struct {
	Options FloorOptions `json:"options"`
	// FixedBytesPerGPU is read every step whatever the batch: attention,
	// dense MLP, shared experts, lm_head, router and norms (the plan's
	// weights minus embedding and routed experts).
	FixedBytesPerGPU int64 `json:"fixed_bytes_per_gpu"`
	// EmbeddingRowBytes is one embedding row (a token's lookup), whole.
	EmbeddingRowBytes float64 `json:"embedding_row_bytes"`
	// ExpertBytes is one routed expert of one layer, whole (all its shards):
	// the routed-experts component bytes / (experts × MoE layers).
	ExpertBytes float64 `json:"expert_bytes"`
	Experts     int     `json:"experts"`
	TopK        int     `json:"experts_per_token"`
	MoELayers   int     `json:"moe_layers"`
	// KVBytesPerTokenGPU is the KV cache of one context token on one GPU.
	KVBytesPerTokenGPU int64 `json:"kv_bytes_per_token_per_gpu"`
	// DTypesAssumed is true when some dtypes came from quantization_config
	// rather than shard headers (a config-only directory).
	DTypesAssumed bool `json:"dtypes_assumed"`
}

// Item names of model.Plan rows that a decode step does not read whole.
const (
	planRowEmbedding = "embedding (vocab-parallel)"
	planRowExperts   = "routed experts"
)

// NewFloorModel builds the floor model of cfg (b may be nil: dtypes assumed
// from quantization_config) on the deployment o.
func NewFloorModel(cfg *model.Config, b *model.Binding, o FloorOptions) (FloorModel, error) {
	if o.EP == 0 {
		o.EP = o.TP
	}
	if o.KVElemBytes == 0 {
		o.KVElemBytes = 2
	}
	if o.KVElemBytes < 0 || o.KVElemBytes > 4 {
		return FloorModel{}, fmt.Errorf("floor: KV element size %d bytes out of range [1, 4]", o.KVElemBytes)
	}
	plan, err := model.Plan(cfg, b, model.PlanOptions{TP: o.TP, EP: o.EP, KVElemBytes: o.KVElemBytes})
	if err != nil {
		return FloorModel{}, fmt.Errorf("floor plan: %w", err)
	}
	acc := model.Account(cfg, b)
	m := FloorModel{
		Options:            o,
		Experts:            cfg.NRoutedExperts,
		TopK:               cfg.NumExpertsPerTok,
		MoELayers:          cfg.NumMoELayers(),
		KVBytesPerTokenGPU: plan.KVBytesPerTokenGPU,
		DTypesAssumed:      acc.Assumed,
	}
	var embedPlan, expertsPlan int64
	var haveEmbed, haveExperts bool
	for _, r := range plan.Rows {
		switch r.Item {
		case planRowEmbedding:
			embedPlan, haveEmbed = r.Bytes, true
		case planRowExperts:
			expertsPlan, haveExperts = r.Bytes, true
		}
	}
	if !haveEmbed {
		return FloorModel{}, fmt.Errorf("floor: memory plan has no %q row", planRowEmbedding)
	}
	hasExperts := m.Experts > 0 && m.MoELayers > 0
	if hasExperts && !haveExperts {
		return FloorModel{}, fmt.Errorf("floor: memory plan has no %q row for %d experts × %d MoE layers", planRowExperts, m.Experts, m.MoELayers)
	}
	m.FixedBytesPerGPU = plan.WeightBytes - embedPlan - expertsPlan
	for _, c := range acc.Components {
		switch c.Component {
		case model.CompEmbedding:
			m.EmbeddingRowBytes = float64(c.Bytes) / float64(cfg.VocabSize)
		case model.CompExperts:
			if hasExperts {
				m.ExpertBytes = float64(c.Bytes) / float64(m.Experts*m.MoELayers)
			}
		}
	}
	return m, nil
}

// LoadFloorModel reads dir's config.json and, when present, its checkpoint
// headers (for real dtypes), and builds the floor model. A directory with
// config.json alone is accepted: dtypes are then assumed.
func LoadFloorModel(dir string, o FloorOptions) (FloorModel, *model.Config, error) {
	cfg, err := model.LoadConfig(dir)
	if err != nil {
		return FloorModel{}, nil, err
	}
	var b *model.Binding
	ck, err := safetensors.Open(dir, safetensors.OpenOptions{HeadersOnly: true, AllowMissing: true})
	switch {
	case err == nil:
		defer ck.Close()
		tensors := make(map[string]*safetensors.TensorInfo, len(ck.Tensors))
		for name, t := range ck.Tensors {
			tensors[name] = t
		}
		if ck.Index != nil { // names in missing shards: known by name only
			for name, shard := range ck.Index.WeightMap {
				if _, ok := tensors[name]; !ok {
					tensors[name] = &safetensors.TensorInfo{Name: name, File: shard}
				}
			}
		}
		b = model.Bind(cfg, tensors)
	case errors.Is(err, fs.ErrNotExist):
		// config.json only: dtypes come from quantization_config.
	default:
		return FloorModel{}, nil, fmt.Errorf("floor model %s: %w", dir, err)
	}
	m, err := NewFloorModel(cfg, b, o)
	if err != nil {
		return FloorModel{}, nil, fmt.Errorf("floor model %s: %w", dir, err)
	}
	return m, cfg, nil
}

// StepBytes is what one decode step reads on one GPU, by part.
type StepBytes struct {
	Fixed           float64 `json:"fixed"`
	RoutedExperts   float64 `json:"routed_experts"`
	Embedding       float64 `json:"embedding"`
	KV              float64 `json:"kv"`
	Total           float64 `json:"total"`
	DistinctExperts float64 `json:"distinct_experts_per_layer"`
}

// StepBytes is the bytes one decode step of batch sequences at mean context
// length context reads on one GPU of the deployment, with the expert load
// spread evenly (each GPU reads 1/TP of every touched expert's bytes, as with
// perfect EP balance). Routing imbalance under EP is not modelled, so at
// small batch the busiest GPU of a real EP deployment reads more than this.
func (m FloorModel) StepBytes(batch, context float64) StepBytes {
	tp := float64(m.Options.TP)
	s := StepBytes{Fixed: float64(m.FixedBytesPerGPU)}
	s.DistinctExperts = ExpectedDistinctExperts(m.Experts, m.TopK, batch)
	s.RoutedExperts = s.DistinctExperts * float64(m.MoELayers) * m.ExpertBytes / tp
	if batch > 0 {
		s.Embedding = batch * m.EmbeddingRowBytes / tp
		if context > 0 {
			s.KV = batch * context * float64(m.KVBytesPerTokenGPU)
		}
	}
	s.Total = s.Fixed + s.RoutedExperts + s.Embedding + s.KV
	return s
}

// Floor is the bandwidth floor of one decode step.
type Floor struct {
	Batch   float64   `json:"batch"`
	Context float64   `json:"context"`
	Bytes   StepBytes `json:"bytes_per_gpu"`
	// StepMs is the floor step time, which is also the floor TPOT: every
	// running sequence gets one token per step.
	StepMs          float64 `json:"step_ms"`
	TokensPerSecond float64 `json:"tokens_per_s"` // batch / step time, whole deployment
}

// Floor computes the step-time floor: bytes read on one GPU / bandwidth.
func (m FloorModel) Floor(batch, context, bytesPerSecond float64) (Floor, error) {
	switch {
	case !(bytesPerSecond > 0) || math.IsInf(bytesPerSecond, 0):
		return Floor{}, fmt.Errorf("floor: bandwidth %g bytes/s must be a positive number", bytesPerSecond)
	case !(batch > 0) || math.IsInf(batch, 0):
		return Floor{}, fmt.Errorf("floor: batch %g must be a positive number", batch)
	case context < 0 || math.IsNaN(context) || math.IsInf(context, 0):
		return Floor{}, fmt.Errorf("floor: context %g must be a number >= 0", context)
	case m.Options.TP <= 0:
		return Floor{}, fmt.Errorf("floor: model has TP %d; build it with NewFloorModel", m.Options.TP)
	}
	f := Floor{Batch: batch, Context: context, Bytes: m.StepBytes(batch, context)}
	sec := f.Bytes.Total / bytesPerSecond
	f.StepMs = sec * 1e3
	f.TokensPerSecond = batch / sec
	return f, nil
}
