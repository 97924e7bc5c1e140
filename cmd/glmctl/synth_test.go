package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
)

// The CI run of the synthetic model: `glmctl synth` writes 2 layers of rank
// 0/8 (1 dense, 1 MoE: ~0.94 GB), inspect passes on it, and the CPU backend
// generates the same tokens from that checkpoint as from --synthetic with
// the same spec. The CPU backend holds ~3 GB of float32 weights; memory is
// returned to the OS between the runs.
func TestSynthCheckpointAndSyntheticGenerate(t *testing.T) {
	if testing.Short() {
		t.Skip("writes and loads a 0.94 GB checkpoint")
	}
	dir := filepath.Join(t.TempDir(), "glm-2l")
	spec := []string{"--rank", "0/8", "--layers", "2", "--dense-layers", "1"}
	out, errOut, code := runCLI(t, append(append([]string{"synth", "glm-4.7"}, spec...), "--out", dir, "--max-shard-bytes", "400000000")...)
	if code != 0 {
		t.Fatalf("synth: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"Wrote " + dir, "rank 0/8, 2 layers (1 dense), seed 1", "167 tensors", "3 shard(s)",
		"2 (1 dense, 1 MoE) + 0 MTP", "20 routed, top-1, 1 shared", "12 q heads, 1 kv heads", "5120 / 18944", "Verdict: OK"} {
		if !strings.Contains(out, want) {
			t.Errorf("synth output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(errOut, "synth: generating") {
		t.Errorf("no progress lines on a non-terminal: %q", errOut)
	}
	out, errOut, code = runCLI(t, "inspect", dir, "--tp", "1", "--ep", "1", "--max-rows", "3")
	if code != 0 || !strings.Contains(out, "Verdict: OK") {
		t.Fatalf("inspect: exit %d: %s\n%s", code, errOut, out)
	}

	gen := func(args ...string) generationResult {
		t.Helper()
		defer debug.FreeOSMemory()
		base := []string{"generate", "--backend", "cpu", "--threads", "2", "--kv-blocks", "8", "--prompt-ids", "11,7,4000,123,18000",
			"--max-tokens", "3", "--temperature", "0", "--json", "--log-level", "warn"}
		out, errOut, code := runCLI(t, append(base, args...)...)
		if code != 0 {
			t.Fatalf("generate %v: exit %d: %s", args, code, errOut)
		}
		var r generationResult
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("bad JSON %q: %v", out, err)
		}
		return r
	}
	fromCkpt := gen("--model", dir)
	fromSynth := gen(append([]string{"--synthetic", "glm-4.7"}, spec...)...)
	if len(fromCkpt.TokenIDs) != 3 || fromCkpt.FinishReason != "length" || fromCkpt.Text != "" {
		t.Fatalf("checkpoint: %+v", fromCkpt)
	}
	if !slices.Equal(fromCkpt.TokenIDs, fromSynth.TokenIDs) {
		t.Errorf("greedy tokens: checkpoint %v, --synthetic %v", fromCkpt.TokenIDs, fromSynth.TokenIDs)
	}
	t.Logf("greedy tokens %v", fromCkpt.TokenIDs)

	// A non-empty directory is refused without --force, and --force
	// replaces the checkpoint (here: one shard instead of three).
	_, errOut, code = runCLI(t, "synth", "glm-4.7", "--rank", "0/8", "--layers", "1", "--out", dir)
	if code == 0 || !strings.Contains(errOut, "not empty") || !strings.Contains(errOut, "--force") {
		t.Errorf("synth into a non-empty directory: exit %d, %q", code, errOut)
	}
	keep := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(keep, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = runCLI(t, "synth", "glm-4.7", "--rank", "7/8", "--layers", "1", "--out", dir, "--force")
	if code != 0 || !strings.Contains(out, "Verdict: OK") || !strings.Contains(out, "1 shard(s)") {
		t.Fatalf("synth --force: exit %d: %s\n%s", code, errOut, out)
	}
	if shards, _ := filepath.Glob(filepath.Join(dir, "model-*.safetensors")); len(shards) != 1 {
		t.Errorf("after --force: shards %v", shards)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("--force removed a file that is not part of a checkpoint: %v", err)
	}
}

// Flag validation: every mistake is refused before any weight is made.
func TestSyntheticFlagErrors(t *testing.T) {
	tmp := t.TempDir()
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"generate", "--backend", "cpu", "--synthetic", "glm-5", "--prompt-ids", "1"}, []string{`--synthetic "glm-5": unknown base model (known: glm-4.7)`}},
		{[]string{"generate", "--backend", "cpu", "--synthetic", "glm-4.7", "--rank", "3/7", "--prompt-ids", "1"}, []string{"--rank 3/7: 7 does not divide 96 attention heads"}},
		{[]string{"generate", "--backend", "cpu", "--synthetic", "glm-4.7", "--rank", "8/8", "--prompt-ids", "1"}, []string{`--rank "8/8": want 0 <= r < N`}},
		{[]string{"generate", "--backend", "cpu", "--synthetic", "glm-4.7", "--rank", "x", "--prompt-ids", "1"}, []string{`--rank "x": want r/N`}},
		{[]string{"generate", "--backend", "cpu", "--synthetic", "glm-4.7", "--layers", "93", "--prompt-ids", "1"}, []string{"--layers 93: must be in 1..92"}},
		{[]string{"generate", "--backend", "cpu", "--synthetic", "glm-4.7", "--layers", "2", "--dense-layers", "3", "--prompt-ids", "1"}, []string{"--dense-layers 3: more than the 2 layers kept"}},
		{[]string{"generate", "--backend", "cpu", "--synthetic", "glm-4.7", "--model", tinyDir, "--prompt-ids", "1"}, []string{"--synthetic glm-4.7 and --model", "choose one"}},
		{[]string{"generate", "--backend", "cpu", "--model", tinyDir, "--rank", "0/8", "--prompt-ids", "1"}, []string{"--rank: only means something with --synthetic"}},
		{[]string{"generate", "--backend", "cpu", "--model", tinyDir, "--layers", "2", "--prompt-ids", "1"}, []string{"--layers: only means something with --synthetic"}},
		{[]string{"generate", "--backend", "cpu", "--synthetic", "glm-4.7", "--rank", "0/8", "hello"}, []string{"no tokenizer", "--prompt-ids"}},
		{[]string{"generate", "--backend", "cpu", "--synthetic", "glm-4.7", "--rank", "0/8", "--chat", "hello"}, []string{"no tokenizer"}},
		// The CPU backend refuses the whole model before writing 355 GB.
		{[]string{"generate", "--backend", "cpu", "--synthetic", "glm-4.7", "--prompt-ids", "1"}, []string{"float32", "use --rank and --layers"}},
		{[]string{"bench", "--backend", "cpu", "--synthetic", "glm-4.7", "--rank", "0/3"}, []string{"--rank 0/3: 3 does not divide 8 key-value heads"}},
		{[]string{"bench", "--backend", "cpu", "--synthetic-seed", "5"}, []string{"--synthetic-seed: only means something with --synthetic"}},
		{[]string{"serve", "--backend", "cpu", "--synthetic", "glm-4.7", "--rank", "0/8"}, []string{"--synthetic", "give --tokenizer DIR"}},
		{[]string{"serve", "--backend", "cpu", "--synthetic", "glm-4.7", "--rank", "0/8", "--model", tinyDir, "--tokenizer", tinyDir}, []string{"choose one"}},
		{[]string{"synth", "glm-4.7", "--rank", "0/8"}, []string{"--out: a directory to write is required"}},
		{[]string{"synth", "glm-4.7", "--rank", "0/6", "--out", tmp}, []string{"--rank 0/6: 6 does not divide 8 key-value heads"}},
		{[]string{"synth", "llama", "--out", tmp}, []string{"unknown base model"}},
		{[]string{"synth", "glm-4.7", "--rank", "0/8", "--out", tmp, "--max-shard-bytes", "0"}, []string{"--max-shard-bytes: 0 must be > 0"}},
		{[]string{"synth", "--out", tmp}, []string{"accepts 1 arg(s)"}},
	}
	for _, tt := range tests {
		_, errOut, code := runCLI(t, tt.args...)
		if code == 0 {
			t.Errorf("%v: exit 0", tt.args)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%v: stderr %q lacks %q", tt.args, errOut, w)
			}
		}
	}
	if entries, _ := os.ReadDir(tmp); len(entries) != 0 {
		t.Errorf("a refused synth wrote %d entries", len(entries))
	}
}
