// Package inspect builds the report of `glmctl inspect`: what a model
// directory holds, what it costs in memory, and whether it is usable.
package inspect

import (
	"errors"
	"fmt"
	"regexp"
	"sort"

	"github.com/glmctl/glmctl/pkg/model"
	"github.com/glmctl/glmctl/pkg/safetensors"
	"github.com/glmctl/glmctl/pkg/weightcheck"
)

// Options select what the report covers.
type Options struct {
	Filter      *regexp.Regexp // tensors to list (nil = all)
	TP, EP      int
	KVTokens    int64
	KVElemBytes int
	// Verify scans every byte of every tensor (non-finite values, all-zero
	// tensors, scales <= 0) instead of only the scales, norms and biases;
	// Progress, if set, follows the scan.
	Verify   bool
	Progress weightcheck.Progress
}

// Summary is the architecture at a glance.
type Summary struct {
	Architecture   string   `json:"architecture"`
	ModelType      string   `json:"model_type"`
	Layers         int      `json:"layers"`
	DenseLayers    int      `json:"dense_layers"`
	MoELayers      int      `json:"moe_layers"`
	MTPLayers      int      `json:"mtp_layers"`
	Experts        int      `json:"experts"`
	ExpertsPerTok  int      `json:"experts_per_token"`
	SharedExperts  int      `json:"shared_experts"`
	NGroup         int      `json:"n_group"`
	TopKGroup      int      `json:"topk_group"`
	Heads          int      `json:"attention_heads"`
	KVHeads        int      `json:"kv_heads"`
	HeadDim        int      `json:"head_dim"`
	RotaryDim      int      `json:"rotary_dim"`
	Hidden         int      `json:"hidden_size"`
	Vocab          int      `json:"vocab_size"`
	Context        int      `json:"context_length"`
	Quantization   string   `json:"quantization"`
	QuantizedLins  int      `json:"quantized_linears"`
	PlainLins      int      `json:"unquantized_linears"`
	ScaleDTypes    []string `json:"scale_dtypes"`
	Shards         int      `json:"shards"`
	ShardsMissing  int      `json:"shards_missing"`
	ShapesFromData bool     `json:"shapes_from_headers"`
}

// Tensor is one row of the tensor table.
type Tensor struct {
	Name  string  `json:"name"`
	DType string  `json:"dtype,omitempty"`
	Shape []int64 `json:"shape,omitempty"`
	Bytes int64   `json:"bytes"`
	Shard string  `json:"shard"`
}

// DTypeTotal is the count and size of tensors of one dtype.
type DTypeTotal struct {
	DType   string `json:"dtype"`
	Tensors int    `json:"tensors"`
	Bytes   int64  `json:"bytes"`
}

// Report is everything inspect prints.
type Report struct {
	Dir          string            `json:"dir"`
	Summary      Summary           `json:"summary"`
	Tensors      []Tensor          `json:"tensors"`
	ByDType      []DTypeTotal      `json:"totals_by_dtype"`
	Accounting   model.Accounting  `json:"accounting"`
	ActiveParams int64             `json:"active_params_per_token"`
	Plan         *model.MemoryPlan `json:"memory_plan,omitempty"`
	PlanError    string            `json:"memory_plan_error,omitempty"`
	// GPUCheck holds Plan against the GPUs present (CheckGPUs; set by the
	// caller, nil when not run).
	GPUCheck *GPUCheck `json:"gpu_check,omitempty"`
	// Values says which tensor values were checked: "scales, norms and
	// biases" (always, when every shard is present), "every tensor"
	// (Verify), or "" (shards missing or the checkpoint does not bind).
	Values   string                `json:"values_checked"`
	Findings []weightcheck.Finding `json:"value_findings,omitempty"`
	Problems []string              `json:"problems"`
	Warnings []string              `json:"warnings"`
	OK       bool                  `json:"ok"`
}

// Run inspects a model directory. It returns an error only when the
// directory cannot be read at all (no config, an invalid shard file);
// everything else wrong with the checkpoint lands in Report.Problems.
func Run(dir string, o Options) (*Report, error) {
	cfg, err := model.LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	ck, err := safetensors.Open(dir, safetensors.OpenOptions{HeadersOnly: true, AllowMissing: true})
	if err != nil {
		return nil, err
	}
	defer ck.Close()

	r := &Report{Dir: dir}
	tensors := map[string]*safetensors.TensorInfo{}
	for name, t := range ck.Tensors {
		tensors[name] = t
	}
	// Names the index lists in missing shards are known by name only.
	if ck.Index != nil {
		for name, shard := range ck.Index.WeightMap {
			if _, ok := tensors[name]; !ok {
				tensors[name] = &safetensors.TensorInfo{Name: name, File: shard}
			}
		}
	}
	for _, p := range ck.Problems {
		r.Problems = append(r.Problems, p.Error())
	}
	b := model.Bind(cfg, tensors)
	for _, p := range b.Problems {
		if p.MTP {
			r.Warnings = append(r.Warnings, p.String())
		} else {
			r.Problems = append(r.Problems, p.String())
		}
	}
	r.Accounting = model.Account(cfg, b)
	r.ActiveParams = model.ActiveParamsPerToken(cfg, r.Accounting)
	tp, ep := o.TP, o.EP
	if tp <= 0 {
		tp = 1
	}
	if ep <= 0 {
		ep = 1
	}
	plan, err := model.Plan(cfg, b, model.PlanOptions{TP: tp, EP: ep, KVTokens: o.KVTokens, KVElemBytes: o.KVElemBytes})
	if err != nil {
		r.PlanError = err.Error()
	} else {
		r.Plan = &plan
	}

	q, u, sd := b.Summary()
	s := Summary{
		Architecture: firstOr(cfg.Architectures, "Glm4MoeForCausalLM"), ModelType: cfg.ModelType,
		Layers: cfg.NumHiddenLayers, DenseLayers: cfg.NumDenseLayers(), MoELayers: cfg.NumMoELayers(), MTPLayers: cfg.NumNextNPredictLayers,
		Experts: cfg.NRoutedExperts, ExpertsPerTok: cfg.NumExpertsPerTok, SharedExperts: cfg.NSharedExperts, NGroup: cfg.NGroup, TopKGroup: cfg.TopKGroup,
		Heads: cfg.NumAttentionHeads, KVHeads: cfg.NumKeyValueHeads, HeadDim: cfg.HeadDim, RotaryDim: cfg.RotaryDim(),
		Hidden: cfg.HiddenSize, Vocab: cfg.VocabSize, Context: cfg.MaxPositionEmbeddings,
		Quantization: "none (unquantized)", QuantizedLins: q, PlainLins: u, ScaleDTypes: sd,
		ShardsMissing: len(ck.Missing), ShapesFromData: b.ShapesKnown,
	}
	if cfg.Quantization != nil {
		s.Quantization = cfg.Quantization.Describe()
	}
	if ck.Index != nil {
		s.Shards = len(ck.Index.Shards())
	} else {
		s.Shards = 1
	}
	r.Summary = s

	names := make([]string, 0, len(tensors))
	for n := range tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	dt := map[string]*DTypeTotal{}
	for _, n := range names {
		t := tensors[n]
		key := string(t.DType)
		if key == "" {
			key = "unknown (shard missing)"
		}
		if dt[key] == nil {
			dt[key] = &DTypeTotal{DType: key}
		}
		dt[key].Tensors++
		var bytes int64
		if t.DType != "" {
			bytes = t.ByteSize()
		}
		dt[key].Bytes += bytes
		if o.Filter != nil && !o.Filter.MatchString(n) {
			continue
		}
		r.Tensors = append(r.Tensors, Tensor{Name: n, DType: string(t.DType), Shape: t.Shape, Bytes: bytes, Shard: t.File})
	}
	for _, k := range sortedKeys(dt) {
		r.ByDType = append(r.ByDType, *dt[k])
	}
	if len(r.Problems) == 0 && len(ck.Missing) == 0 {
		if err := r.checkValues(dir, b, o); err != nil {
			return nil, err
		}
	}
	r.OK = len(r.Problems) == 0
	return r, nil
}

// checkValues reads tensor values (the checkpoint is complete and binds):
// the small scale, norm and bias tensors, or every tensor with o.Verify.
func (r *Report) checkValues(dir string, b *model.Binding, o Options) error {
	ck, err := safetensors.Open(dir, safetensors.OpenOptions{})
	if err != nil {
		return err
	}
	defer ck.Close()
	var fs []weightcheck.Finding
	if o.Verify {
		r.Values = "every tensor"
		fs, err = weightcheck.Verify(ck, b, o.Progress)
	} else {
		r.Values = "scales, norms and biases"
		fs, err = weightcheck.Small(ck, b)
	}
	if err != nil {
		return err
	}
	r.Findings = fs
	for _, f := range fs {
		if f.Warning {
			r.Warnings = append(r.Warnings, f.String())
		} else {
			r.Problems = append(r.Problems, f.String())
		}
	}
	return nil
}

// Err returns nil for a usable checkpoint, else an error summarising the
// problems.
func (r *Report) Err() error {
	if r.OK {
		return nil
	}
	errs := make([]error, 0, len(r.Problems))
	for _, p := range r.Problems {
		errs = append(errs, errors.New(p))
	}
	return fmt.Errorf("%s: %d problem(s), first: %w", r.Dir, len(r.Problems), errs[0])
}

func firstOr(s []string, def string) string {
	if len(s) > 0 {
		return s[0]
	}
	return def
}

func sortedKeys[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for s := range m {
		k = append(k, s)
	}
	sort.Strings(k)
	return k
}
