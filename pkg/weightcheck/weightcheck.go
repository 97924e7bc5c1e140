// Package weightcheck checks the values of a checkpoint's tensors, which
// header validation (pkg/safetensors) and binding (pkg/model) do not look at.
//
// Check runs at every load: it reads only the small tensors whose damage
// silently poisons every token — FP8 weight scales (must be finite and > 0),
// norm weights and biases (must be finite) — a few MB for GLM-4.7. Verify
// scans every byte of every tensor for non-finite values and all-zero
// tensors (inspect --verify). Errors and findings name the tensor and shard.
package weightcheck

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/glmctl/glmctl/pkg/model"
	"github.com/glmctl/glmctl/pkg/safetensors"
)

// ErrBadValue is wrapped by every value problem Check reports.
var ErrBadValue = errors.New("bad tensor value")

// Role is what a checked tensor is, which decides its rule.
type Role int

const (
	RoleScale Role = iota // FP8 weight scale: finite and > 0
	RoleNorm              // norm weight: finite
	RoleBias              // bias or e_score_correction_bias: finite
)

func (r Role) String() string {
	switch r {
	case RoleScale:
		return "weight scale"
	case RoleNorm:
		return "norm weight"
	default:
		return "bias"
	}
}

// Target is one tensor Check reads.
type Target struct {
	Name string
	Role Role
}

// Targets lists the tensors Check reads for a binding: the scales of the
// quantized linears, the biases of every linear, and plain tensors that are
// norms or biases. Tensors of the MTP layer (not loaded for plain inference)
// are left out unless mtp is set. The list is sorted by name.
func Targets(b *model.Binding, mtp bool) []Target {
	var out []Target
	add := func(t *safetensors.TensorInfo, r Role) {
		if t == nil || (!mtp && isMTP(b.Config, t.Name)) {
			return
		}
		out = append(out, Target{t.Name, r})
	}
	for _, bl := range b.Linears {
		add(bl.Scale, RoleScale)
		add(bl.Bias, RoleBias)
	}
	for name, t := range b.Tensors {
		switch {
		case strings.HasSuffix(name, "norm.weight"):
			add(t, RoleNorm)
		case strings.HasSuffix(name, ".bias") || strings.HasSuffix(name, "_bias"):
			add(t, RoleBias)
		}
	}
	slices.SortFunc(out, func(a, b Target) int { return strings.Compare(a.Name, b.Name) })
	return slices.CompactFunc(out, func(a, b Target) bool { return a.Name == b.Name })
}

func isMTP(cfg *model.Config, name string) bool {
	var l int
	if _, err := fmt.Sscanf(name, "model.layers.%d.", &l); err == nil && cfg != nil {
		return l >= cfg.NumHiddenLayers
	}
	return false
}

// Check reads every target of b in ck (MTP layer excluded) and returns an
// error (wrapping ErrBadValue) listing each bad tensor: how many elements,
// the first bad one and its value, the rule, the tensor and its shard.
func Check(ck *safetensors.Checkpoint, b *model.Binding) error {
	fs, err := Small(ck, b)
	if err != nil {
		return err
	}
	if len(fs) == 0 {
		return nil
	}
	errs := make([]error, 0, len(fs))
	for _, f := range fs {
		errs = append(errs, fmt.Errorf("%w: tensor %q in shard %s: %s", ErrBadValue, f.Tensor, f.Shard, f.Detail))
	}
	const show = 10
	if n := len(errs); n > show {
		errs = append(errs[:show], fmt.Errorf("... and %d more tensors", n-show))
	}
	return fmt.Errorf("checkpoint %s: %d tensor(s) with bad values (damaged or mis-converted checkpoint):\n%w", ck.Dir, len(fs), errors.Join(errs...))
}

// Small is Check's scan as findings (kind "non-finite" or "bad-scale").
// Targets whose dtype it cannot decode are skipped (binding rejects them).
func Small(ck *safetensors.Checkpoint, b *model.Binding) ([]Finding, error) {
	var out []Finding
	var buf []float32
	for _, tg := range Targets(b, false) {
		info := ck.Tensors[tg.Name]
		if info == nil {
			continue
		}
		data, err := ck.Data(tg.Name)
		if err != nil {
			return out, err
		}
		n := int(info.NumElements())
		if cap(buf) < n {
			buf = make([]float32, n)
		}
		buf = buf[:n]
		if err := safetensors.DecodeFloat32s(info.DType, data, buf); err != nil {
			continue
		}
		if kind, msg := checkValues(buf, tg.Role); msg != "" {
			out = append(out, Finding{Tensor: tg.Name, Shard: info.File, Kind: kind, Detail: msg})
		}
	}
	return out, nil
}

// checkValues returns the kind and description of what is wrong with vals
// under the rule of r, or "", "".
func checkValues(vals []float32, r Role) (kind, msg string) {
	bad, first, nonFinite := 0, -1, false
	for i, v := range vals {
		fin := !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0)
		if fin && (r != RoleScale || v > 0) {
			continue
		}
		if first < 0 {
			first = i
		}
		nonFinite = nonFinite || !fin
		bad++
	}
	if bad == 0 {
		return "", ""
	}
	rule, kind := "must be finite", "non-finite"
	if r == RoleScale {
		rule = "must be finite and > 0"
		if !nonFinite {
			kind = "bad-scale"
		}
	}
	return kind, fmt.Sprintf("%d of %d elements bad, the first is element %d = %v (a %s %s)", bad, len(vals), first, vals[first], r, rule)
}

// CheckDir runs Check on the checkpoint in dir. A directory that does not
// bind (missing or mis-shaped tensors) passes: the loader reports those
// problems itself, with more context.
func CheckDir(dir string) error {
	cfg, err := model.LoadConfig(dir)
	if err != nil {
		return err
	}
	ck, b, err := model.OpenBound(dir, cfg)
	if err != nil {
		return err
	}
	defer ck.Close()
	if b.Err() != nil {
		return nil
	}
	return Check(ck, b)
}
