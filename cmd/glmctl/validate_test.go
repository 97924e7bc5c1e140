package main

import (
	"encoding/json"
	"strings"
	"testing"
)

const tinyF32 = "../../testdata/models/tiny-f32"

func TestValidate(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		code     int
		stdout   []string
		stderr   []string
		noStdout []string
	}{
		{
			name:   "default golden passes on the exact path",
			args:   []string{"validate", "--model", tinyF32, "--backend", "cpu"},
			code:   0,
			stdout: []string{"Golden " + tinyF32 + ".golden.json", "exact float32 path", "REL L2", "PASS: 6 of 6 cases passed"},
		},
		{
			// scripts/make_long_golden.py: 3,000 tokens from the numpy float64
			// reference (RoPE and attention over thousands of positions).
			name:   "long-context golden passes on the exact path",
			args:   []string{"validate", "--model", tinyF32, "--backend", "cpu", "--golden", tinyF32 + ".long.golden.json"},
			code:   0,
			stdout: []string{"exact float32 path", "PASS: 1 of 1 cases passed"},
		},
		{
			// The tiny models are conditioned so that FP8 activations meet
			// issue 3's criterion against the float32 goldens (docs/validation.md).
			name: "FP8 activations pass the float32 golden with the FP8 tolerances and the FP8 golden",
			args: []string{"validate", "--model", tinyF32, "--backend", "cpu", "--fp8-activations"},
			code: 0,
			stdout: []string{"FP8 activations path", "relative L2 <= 0.03", "reference margin > 0.05", "PASS: 6 of 6 cases passed",
				"Golden " + tinyF32 + ".fp8.golden.json", "relative L2 <= 0.02", "cases within 1e-05 (want at least 50%)", "PASS: 30 of 30 cases passed"},
		},
		{
			name:     "the exact path does not pick the FP8 golden",
			args:     []string{"validate", "--model", tinyF32, "--backend", "cpu"},
			code:     0,
			noStdout: []string{".fp8.golden.json"},
		},
		{
			name:   "an FP8 golden on the exact path is refused",
			args:   []string{"validate", "--model", tinyF32, "--backend", "cpu", "--golden", tinyF32 + ".fp8.golden.json"},
			code:   1,
			stderr: []string{"golden file " + tinyF32 + ".fp8.golden.json holds the GPU's FP8 arithmetic", "--fp8-activations"},
		},
		{
			name:   "a tolerance nobody meets fails with exit 2 naming the worst case",
			args:   []string{"validate", "--model", tinyF32, "--golden", tinyF32 + ".golden.json", "--tolerance", "1e-12"},
			code:   2,
			stdout: []string{"FAIL: 0 of 6 cases passed", "relative L2 error"},
			stderr: []string{"6 of 6 cases failed; worst is case", "> 1e-12"},
		},
		{
			name:     "golden of another model",
			args:     []string{"validate", "--model", tinyF32, "--golden", "../../testdata/models/tiny-bf16g.golden.json"},
			code:     1,
			stderr:   []string{"golden file ../../testdata/models/tiny-bf16g.golden.json was made for model tiny-bf16g, not tiny-f32"},
			noStdout: []string{"PASS"},
		},
		{
			name:   "cuda without a built library",
			args:   []string{"validate", "--model", tinyF32, "--backend", "cuda", "--cuda-lib", "/nonexistent/libglmcuda.so"},
			code:   1,
			stderr: []string{"--backend cuda", "/nonexistent/libglmcuda.so"},
		},
		{
			name:   "unknown backend",
			args:   []string{"validate", "--model", tinyF32, "--backend", "tpu"},
			code:   1,
			stderr: []string{`--backend tpu`, "want one of auto, cpu, cuda"},
		},
		{
			name:   "model required",
			args:   []string{"validate"},
			code:   1,
			stderr: []string{"--model: a model directory is required"},
		},
		{
			name:   "missing golden file",
			args:   []string{"validate", "--model", tinyF32, "--golden", "nope.json"},
			code:   1,
			stderr: []string{"read golden file", "nope.json"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code := runCLI(t, append(tt.args, "--log-level", "warn")...)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.code, out, errOut)
			}
			for _, s := range tt.stdout {
				if !strings.Contains(out, s) {
					t.Errorf("stdout lacks %q:\n%s", s, out)
				}
			}
			for _, s := range tt.stderr {
				if !strings.Contains(errOut, s) {
					t.Errorf("stderr lacks %q:\n%s", s, errOut)
				}
			}
			for _, s := range tt.noStdout {
				if strings.Contains(out, s) {
					t.Errorf("stdout has %q:\n%s", s, out)
				}
			}
		})
	}
}

func TestValidateJSON(t *testing.T) {
	out, errOut, code := runCLI(t, "validate", "--model", tinyF32, "--json", "--log-level", "warn")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc struct {
		Backend string `json:"backend"`
		Pass    bool   `json:"pass"`
		Reports []struct {
			Model      string `json:"model"`
			Tolerances struct {
				MaxRelL2 float64 `json:"max_rel_l2"`
			} `json:"tolerances"`
			Cases []struct {
				RelL2 float64 `json:"rel_l2"`
				Pass  bool    `json:"pass"`
			} `json:"cases"`
		} `json:"reports"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if !doc.Pass || doc.Backend != "cpu" || len(doc.Reports) != 1 || doc.Reports[0].Model != "tiny-f32" ||
		len(doc.Reports[0].Cases) != 6 || doc.Reports[0].Tolerances.MaxRelL2 != 1e-4 {
		t.Fatalf("report %+v", doc)
	}
	for i, c := range doc.Reports[0].Cases {
		if !c.Pass || c.RelL2 > 1e-4 {
			t.Errorf("case %d: %+v", i, c)
		}
	}
}
