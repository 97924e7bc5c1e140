package cuda

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/synth"
)

// The fake runtime records glmrt_synthesize's seed (as workspace_bytes) and
// counts it as one tensor (kv_bytes): the Go side must create the engine of
// the derived config and pass the effective seed, then finalize.
func TestOpenSynthetic(t *testing.T) {
	spec := synth.Spec{Base: "glm-4.7", Rank: 3, Ranks: 8, Layers: 2, DenseLayers: 1, Seed: 42}
	b, err := OpenSynthetic(context.Background(), spec, Options{LibPath: fake(t), KVBlockSize: 16, NumKVBlocks: 32, MaxSeqs: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	info := b.Info()
	want := engine.BackendInfo{Name: "cuda", Device: "fake GPU (sm_00, 0 GiB) x1", VocabSize: 151552 / 8, MaxContext: 202752, KVBlockSize: 16, NumKVBlocks: 32, MaxBatchSeqs: 4, MaxStepTokens: 8192, TokenMasks: true, LateMasks: true}
	if info != want {
		t.Errorf("Info = %+v, want %+v", info, want)
	}
	rt := b.RuntimeInfo()
	if rt.WorkspaceBytes != int64(spec.EffectiveSeed()) || rt.KVBytes != 1 || rt.WeightBytes != 0 {
		t.Errorf("runtime saw seed %d in %d tensor(s) (%d bytes loaded), want seed %d through glmrt_synthesize alone",
			uint64(rt.WorkspaceBytes), rt.KVBytes, rt.WeightBytes, spec.EffectiveSeed())
	}
	res, err := b.Step(context.Background(), &engine.StepBatch{Seqs: []engine.StepSeq{{SeqID: 1, Tokens: []int32{1, 2, 3}, BlockTable: []int32{0}, Sample: true}}})
	if err != nil || len(res) != 1 {
		t.Fatalf("step: %v, %v", res, err)
	}
}

func TestOpenSyntheticErrors(t *testing.T) {
	tests := []struct {
		name string
		spec synth.Spec
		o    Options
		want string
	}{
		{"unknown base", synth.Spec{Base: "glm-9", DenseLayers: -1}, Options{LibPath: fake(t)}, `unknown base model`},
		{"rank does not divide", synth.Spec{Base: "glm-4.7", Rank: 1, Ranks: 3, DenseLayers: -1}, Options{LibPath: fake(t)}, "3 does not divide 8 key-value heads"},
		{"runtime refuses", synth.Spec{Base: "glm-4.7", Rank: 0, Ranks: 8, Layers: 1, DenseLayers: -1}, Options{LibPath: fake(t), KVBlockSize: 4096}, "kv_block_size 4096 > 1024"},
		{"no library", synth.Spec{Base: "glm-4.7", Rank: 0, Ranks: 8, Layers: 1, DenseLayers: -1}, Options{LibPath: "/nonexistent/libglmcuda.so"}, "cannot open shared object file"},
	}
	for _, tt := range tests {
		_, err := OpenSynthetic(context.Background(), tt.spec, tt.o)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error containing %q", tt.name, err, tt.want)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	spec := synth.Spec{Base: "glm-4.7", Rank: 0, Ranks: 8, Layers: 1, DenseLayers: -1}
	if _, err := OpenSynthetic(ctx, spec, Options{LibPath: fake(t)}); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled context: %v", err)
	}
}
