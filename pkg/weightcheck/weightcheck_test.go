package weightcheck_test

import (
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/glmctl/glmctl/internal/ckptedit"
	"github.com/glmctl/glmctl/pkg/model"
	"github.com/glmctl/glmctl/pkg/safetensors"
	"github.com/glmctl/glmctl/pkg/weightcheck"
)

const models = "../../testdata/models"

func damaged(t *testing.T, tensor string, elems []int, v float32) string {
	t.Helper()
	dir := t.TempDir()
	if err := ckptedit.Copy(dir, filepath.Join(models, "tiny-f32")); err != nil {
		t.Fatal(err)
	}
	if tensor != "" {
		if err := ckptedit.Set(dir, tensor, elems, v); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func open(t *testing.T, dir string) (*safetensors.Checkpoint, *model.Binding) {
	t.Helper()
	cfg, err := model.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.Open(dir, safetensors.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	return ck, model.Bind(cfg, ck.Tensors)
}

// The load-time check refuses a bad scale, norm or bias and names the tensor
// and its shard; the bundled models pass.
func TestCheck(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, tc := range []struct {
		name   string
		tensor string
		v      float32
		want   string // "" = passes
	}{
		{"clean", "", 0, ""},
		{"NaN scale", "model.layers.1.mlp.experts.0.down_proj.weight_scale", nan, "weight scale must be finite and > 0"},
		{"zero scale", "model.layers.0.self_attn.q_proj.weight_scale", 0, "= 0 (a weight scale must be finite and > 0)"},
		{"negative scale", "model.layers.0.mlp.gate_proj.weight_scale", -1, "= -1"},
		{"Inf norm", "model.layers.1.input_layernorm.weight", inf, "norm weight must be finite"},
		{"NaN final norm", "model.norm.weight", nan, "norm weight must be finite"},
		{"NaN router bias", "model.layers.1.mlp.gate.e_score_correction_bias", nan, "bias must be finite"},
		{"NaN attention bias", "model.layers.0.self_attn.q_proj.bias", nan, "bias must be finite"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := damaged(t, tc.tensor, []int{3}, tc.v)
			ck, b := open(t, dir)
			if err := b.Err(); err != nil {
				t.Fatal(err)
			}
			err := weightcheck.Check(ck, b)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("clean model: %v", err)
				}
				return
			}
			shard, _ := ckptedit.ShardOf(dir, tc.tensor)
			if !errors.Is(err, weightcheck.ErrBadValue) || !strings.Contains(err.Error(), tc.tensor) ||
				!strings.Contains(err.Error(), shard) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "element 3") {
				t.Fatalf("error %v; want one naming %s, %s, element 3 and %q", err, tc.tensor, shard, tc.want)
			}
			if err := weightcheck.CheckDir(dir); !errors.Is(err, weightcheck.ErrBadValue) {
				t.Errorf("CheckDir: %v", err)
			}
		})
	}
}

// Verify finds non-finite values in any tensor (weights included), all-zero
// tensors, and reports progress up to the total size.
func TestVerify(t *testing.T) {
	nan := float32(math.NaN())
	for _, tc := range []struct {
		name   string
		tensor string
		elems  []int
		v      float32
		kind   string
	}{
		{"clean", "", nil, 0, ""},
		{"NaN in an FP8 weight", "model.layers.1.mlp.experts.2.up_proj.weight", []int{100}, nan, "non-finite"},
		{"NaN in a BF16 embedding", "model.embed_tokens.weight", []int{5}, nan, "non-finite"},
		{"all-zero weight", "model.layers.1.self_attn.o_proj.weight", nil, 0, "all-zero"},
		{"NaN scale", "model.layers.1.self_attn.o_proj.weight_scale", []int{0}, nan, "non-finite"},
		{"negative scale", "model.layers.1.self_attn.o_proj.weight_scale", []int{0}, -2, "bad-scale"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ck, b := open(t, damaged(t, tc.tensor, tc.elems, tc.v))
			var last, total int64
			fs, err := weightcheck.Verify(ck, b, func(done, tot int64) { last, total = done, tot })
			if err != nil {
				t.Fatal(err)
			}
			if total == 0 || last != total {
				t.Errorf("progress ended at %d of %d bytes", last, total)
			}
			var hard []weightcheck.Finding
			for _, f := range fs {
				if !f.Warning {
					hard = append(hard, f)
				}
			}
			if tc.kind == "" {
				if len(hard) != 0 {
					t.Fatalf("clean model: %v", hard)
				}
				return
			}
			if len(hard) != 1 || hard[0].Tensor != tc.tensor || hard[0].Kind != tc.kind || hard[0].Shard == "" {
				t.Fatalf("findings %v; want one %s in %s", hard, tc.kind, tc.tensor)
			}
		})
	}
}
