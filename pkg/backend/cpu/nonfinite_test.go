package cpu_test

import (
	"errors"
	"math"
	"path/filepath"
	"testing"

	"github.com/glmctl/glmctl/internal/ckptedit"
	"github.com/glmctl/glmctl/pkg/backend/cpu"
	"github.com/glmctl/glmctl/pkg/engine"
)

// A NaN in one token's embedding row makes every router score of that token
// NaN in the first MoE layer. The step must not panic (it used to, with
// index out of range [-1] in the router's top-k): the sequence holding the
// token gets an error wrapping engine.ErrNonFiniteLogits, and a sequence
// sharing the batch still gets its token, the same as alone.
func TestNaNTokenFailsOnlyItsSequence(t *testing.T) {
	dir := t.TempDir()
	if err := ckptedit.Copy(dir, filepath.Join(modelsDir, "tiny-f32")); err != nil {
		t.Fatal(err)
	}
	const bad = 7
	const hidden = 256 // tiny-f32 hidden_size: row `bad` of embed_tokens
	elems := make([]int, hidden)
	for i := range elems {
		elems[i] = bad*hidden + i
	}
	if err := ckptedit.Set(dir, "model.embed_tokens.weight", elems, float32(math.NaN())); err != nil {
		t.Fatal(err)
	}
	for _, fp8 := range []bool{false, true} {
		be, err := cpu.Open(dir, cpu.Options{NumKVBlocks: 16, FP8Activations: fp8})
		if err != nil {
			t.Fatal(err)
		}
		good := engine.StepSeq{SeqID: 1, Tokens: []int32{1, 2, 3}, BlockTable: blocks(0), Sample: true, PromptTokens: []int32{1, 2, 3}}
		poisoned := engine.StepSeq{SeqID: 2, Tokens: []int32{1, bad, 3}, BlockTable: blocks(1), Sample: true, PromptTokens: []int32{1, bad, 3}}
		alone := step(t, be, good)
		both := step(t, be, good, poisoned)
		if both[0].Err != nil || both[0].Token != alone[0].Token {
			t.Errorf("fp8=%v: clean sequence: token %d err %v, alone %d", fp8, both[0].Token, both[0].Err, alone[0].Token)
		}
		if !errors.Is(both[1].Err, engine.ErrNonFiniteLogits) {
			t.Errorf("fp8=%v: poisoned sequence: token %d err %v, want ErrNonFiniteLogits", fp8, both[1].Token, both[1].Err)
		}
		be.Close()
	}
}
