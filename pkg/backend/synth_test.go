package backend

import (
	"context"
	"strings"
	"testing"

	"github.com/glmctl/glmctl/pkg/synth"
)

func TestOpenSyntheticErrors(t *testing.T) {
	small := &synth.Spec{Base: "glm-4.7", Rank: 0, Ranks: 8, Layers: 1, DenseLayers: -1}
	whole := &synth.Spec{Base: "glm-4.7", DenseLayers: -1}
	tests := []struct {
		name, backend, dir string
		spec               *synth.Spec
		want               []string
	}{
		{"directory and synthetic", CPU, tinyModel, small, []string{"model directory", "choose one"}},
		// Refused before any checkpoint is written: 355B float32 parameters.
		{"cpu whole model", CPU, "", whole, []string{"cpu backend", "float32", "use --rank and --layers"}},
		{"cuda missing library", CUDA, "", small, []string{"/nonexistent/libglmcuda.so"}},
	}
	for _, tt := range tests {
		_, err := Open(context.Background(), tt.backend, tt.dir, Options{Synthetic: tt.spec, LibPath: "/nonexistent/libglmcuda.so"})
		if err == nil {
			t.Errorf("%s: Open succeeded", tt.name)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q lacks %q", tt.name, err, w)
			}
		}
	}
}
