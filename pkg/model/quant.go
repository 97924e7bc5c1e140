package model

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// QuantConfig is config.json's quantization_config in the compressed-tensors
// form (docs/model.md §1.2).
type QuantConfig struct {
	QuantMethod        string                 `json:"quant_method"`
	Format             string                 `json:"format"`
	QuantizationStatus string                 `json:"quantization_status"`
	ConfigGroups       map[string]QuantGroup  `json:"config_groups"`
	Ignore             []string               `json:"ignore"`
	KVCacheScheme      map[string]interface{} `json:"kv_cache_scheme"`
	// GlobalCompressionRatio may be a number or null.
	GlobalCompressionRatio *float64 `json:"global_compression_ratio"`

	ignoreRes []*regexp.Regexp // compiled "re:" patterns, in Ignore order
}

// QuantGroup is one entry of config_groups.
type QuantGroup struct {
	Targets           []string   `json:"targets"`
	Weights           *QuantArgs `json:"weights"`
	InputActivations  *QuantArgs `json:"input_activations"`
	OutputActivations *QuantArgs `json:"output_activations"`
	Format            string     `json:"format"`
}

// QuantArgs are compressed-tensors QuantizationArgs.
type QuantArgs struct {
	NumBits        int     `json:"num_bits"`
	Type           string  `json:"type"`     // "float" or "int"
	Strategy       string  `json:"strategy"` // tensor, channel, group, block, token
	Symmetric      bool    `json:"symmetric"`
	Dynamic        any     `json:"dynamic"` // bool, or "local" in newer releases
	GroupSize      *int    `json:"group_size"`
	BlockStructure []int   `json:"block_structure"`
	Observer       *string `json:"observer"`
	ActOrder       any     `json:"actorder"`
}

// IsDynamic reports whether the args ask for scales computed at run time.
func (a *QuantArgs) IsDynamic() bool {
	switch v := a.Dynamic.(type) {
	case bool:
		return v
	case string:
		return v != "" && v != "false"
	}
	return false
}

// Weight strategies understood by the loader.
const (
	StrategyTensor  = "tensor"
	StrategyChannel = "channel"
	StrategyBlock   = "block"
	StrategyGroup   = "group"
	StrategyToken   = "token"
)

// Validate checks the parts of quantization_config that decide how tensors
// are read, and compiles the ignore patterns.
func (q *QuantConfig) Validate() error {
	if q.QuantMethod != "compressed-tensors" {
		return fmt.Errorf("quant_method: %q is not supported (want compressed-tensors)", q.QuantMethod)
	}
	if len(q.ConfigGroups) == 0 {
		return fmt.Errorf("config_groups: empty")
	}
	for _, name := range q.groupNames() {
		g := q.ConfigGroups[name]
		if g.Weights == nil {
			return fmt.Errorf("config_groups.%s.weights: missing", name)
		}
		w := g.Weights
		if w.NumBits != 8 || w.Type != "float" {
			return fmt.Errorf("config_groups.%s.weights: %d-bit %q is not supported (want 8-bit float)", name, w.NumBits, w.Type)
		}
		switch w.Strategy {
		case StrategyChannel, StrategyTensor:
		case StrategyBlock:
			if len(w.BlockStructure) != 2 || w.BlockStructure[0] <= 0 || w.BlockStructure[1] <= 0 {
				return fmt.Errorf("config_groups.%s.weights.block_structure: want two positive sizes, got %v", name, w.BlockStructure)
			}
		default:
			return fmt.Errorf("config_groups.%s.weights.strategy: %q is not supported (want channel, tensor or block)", name, w.Strategy)
		}
		if !w.Symmetric {
			return fmt.Errorf("config_groups.%s.weights.symmetric: asymmetric FP8 weights are not supported", name)
		}
		if a := g.InputActivations; a != nil {
			if a.NumBits != 8 || a.Type != "float" {
				return fmt.Errorf("config_groups.%s.input_activations: %d-bit %q is not supported (want 8-bit float)", name, a.NumBits, a.Type)
			}
			switch a.Strategy {
			case StrategyToken, StrategyTensor, StrategyGroup:
			default:
				return fmt.Errorf("config_groups.%s.input_activations.strategy: %q is not supported", name, a.Strategy)
			}
		}
	}
	q.ignoreRes = q.ignoreRes[:0]
	for i, pat := range q.Ignore {
		if re, ok := strings.CutPrefix(pat, "re:"); ok {
			c, err := regexp.Compile("^(?:" + re + ")")
			if err != nil {
				return fmt.Errorf("ignore[%d]: bad pattern %q: %w", i, pat, err)
			}
			q.ignoreRes = append(q.ignoreRes, c)
		}
	}
	return nil
}

func (q *QuantConfig) groupNames() []string {
	names := make([]string, 0, len(q.ConfigGroups))
	for n := range q.ConfigGroups {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// WeightScheme returns the weight args of the first config group (GLM-4.x
// FP8 releases have exactly one group, targeting Linear).
func (q *QuantConfig) WeightScheme() *QuantArgs {
	for _, n := range q.groupNames() {
		return q.ConfigGroups[n].Weights
	}
	return nil
}

// ActivationScheme returns the input-activation args of the first config
// group, or nil for weight-only quantization.
func (q *QuantConfig) ActivationScheme() *QuantArgs {
	for _, n := range q.groupNames() {
		return q.ConfigGroups[n].InputActivations
	}
	return nil
}

// Ignored reports whether the module (a tensor name without its
// ".weight"/".weight_scale" suffix, e.g. "model.layers.3.mlp.gate") is listed
// in the ignore list, either exactly or through a "re:" pattern
// (compressed-tensors matches patterns from the start of the name).
func (q *QuantConfig) Ignored(module string) bool {
	for _, p := range q.Ignore {
		if !strings.HasPrefix(p, "re:") && p == module {
			return true
		}
	}
	for _, re := range q.ignoreRes {
		if re.MatchString(module) {
			return true
		}
	}
	return false
}

// Describe is a one-line human summary of the scheme.
func (q *QuantConfig) Describe() string {
	w := q.WeightScheme()
	if w == nil {
		return q.QuantMethod
	}
	s := fmt.Sprintf("%s FP8 E4M3 weights (%s", q.QuantMethod, w.Strategy)
	if w.Strategy == StrategyBlock {
		s += fmt.Sprintf(" %dx%d", w.BlockStructure[0], w.BlockStructure[1])
	}
	s += ")"
	if a := q.ActivationScheme(); a != nil {
		kind := "static"
		if a.IsDynamic() {
			kind = "dynamic"
		}
		s += fmt.Sprintf(", %s per-%s FP8 activations", kind, a.Strategy)
	} else {
		s += ", weight-only"
	}
	return s
}
