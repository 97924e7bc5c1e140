package main

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/glmctl/glmctl/internal/ckptedit"
)

// A NaN in one weight scale: inspect used to say "Verdict: OK" and generate
// panicked in the router (index out of range [-1]). Now inspect fails naming
// the tensor and shard, and generate refuses to load, with no panic.
func TestBadValues(t *testing.T) {
	const src = "../../testdata/models/tiny-f32"
	nan := float32(math.NaN())
	for _, tc := range []struct {
		name    string
		tensor  string
		elems   []int
		v       float32
		args    []string
		want    []string
		wantOut string // also in stdout when set
	}{
		{"inspect: NaN scale", "model.layers.1.mlp.experts.3.gate_proj.weight_scale", []int{0}, nan,
			[]string{"inspect"}, []string{"model.layers.1.mlp.experts.3.gate_proj.weight_scale", "non-finite", "finite and > 0"}, "Values checked: scales, norms and biases"},
		{"inspect: Inf norm", "model.layers.0.input_layernorm.weight", []int{1}, float32(math.Inf(1)),
			[]string{"inspect"}, []string{"model.layers.0.input_layernorm.weight", "must be finite"}, ""},
		{"inspect --verify: NaN in an expert weight", "model.layers.1.mlp.experts.1.down_proj.weight", []int{7, 9}, nan,
			[]string{"inspect", "--verify"}, []string{"model.layers.1.mlp.experts.1.down_proj.weight", "2 of", "NaN or Inf"}, "Values checked: every tensor"},
		{"inspect --verify: all-zero weight", "model.layers.1.self_attn.k_proj.weight", nil, 0,
			[]string{"inspect", "--verify"}, []string{"model.layers.1.self_attn.k_proj.weight", "all-zero"}, ""},
		{"generate: NaN scale", "model.layers.1.mlp.shared_experts.up_proj.weight_scale", []int{2}, nan,
			[]string{"generate", "--backend", "cpu", "--prompt-ids", "1,2,3", "--max-tokens", "2", "--temperature", "0"},
			[]string{"model.layers.1.mlp.shared_experts.up_proj.weight_scale", "element 2 = NaN", ".safetensors"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := ckptedit.Copy(dir, src); err != nil {
				t.Fatal(err)
			}
			if err := ckptedit.Set(dir, tc.tensor, tc.elems, tc.v); err != nil {
				t.Fatal(err)
			}
			args := append([]string{}, tc.args...)
			if args[0] == "inspect" {
				args = append(args, dir, "--tp", "1", "--ep", "1")
			} else {
				args = append(args, "--model", dir)
			}
			out, errOut, code := runCLI(t, args...)
			if code == 0 || code == 2 && strings.Contains(errOut, "panic") {
				t.Fatalf("exit %d; stderr:\n%s", code, tail(errOut, 2000))
			}
			shard, err := ckptedit.ShardOf(dir, tc.tensor)
			if err != nil {
				t.Fatal(err)
			}
			all := out + errOut
			for _, w := range append(tc.want, filepath.Base(shard)) {
				if !strings.Contains(all, w) {
					t.Errorf("output does not name %q:\nstdout tail: %s\nstderr: %s", w, tail(out, 800), tail(errOut, 800))
				}
			}
			if tc.wantOut != "" && !strings.Contains(out, tc.wantOut) {
				t.Errorf("stdout lacks %q", tc.wantOut)
			}
		})
	}
	// The bundled models pass a full scan.
	out, errOut, code := runCLI(t, "inspect", src, "--tp", "1", "--ep", "1", "--verify")
	if code != 0 || !strings.Contains(out, "Verdict: OK") || !strings.Contains(out, "Values checked: every tensor") {
		t.Errorf("inspect --verify %s: exit %d\n%s\n%s", src, code, tail(out, 800), errOut)
	}
}
