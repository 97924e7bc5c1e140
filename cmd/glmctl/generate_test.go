package main

import (
	"context"
	"encoding/json"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/glmctl/glmctl/pkg/backend/cpu"
	"github.com/glmctl/glmctl/pkg/engine"
)

const tinyDir = "../../testdata/models/tiny-f32"

func generateJSON(t *testing.T, args ...string) generationResult {
	t.Helper()
	out, errOut, code := runCLI(t, append([]string{"generate", "--model", tinyDir, "--backend", "cpu", "--json"}, args...)...)
	if code != 0 {
		t.Fatalf("generate %v: exit %d: %s", args, code, errOut)
	}
	var r generationResult
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("bad JSON %q: %v", out, err)
	}
	return r
}

func TestGenerateJSONGreedyAndSeeds(t *testing.T) {
	a := generateJSON(t, "--prompt-ids", "11,22,33", "--temperature", "0", "--max-tokens", "8", "--ignore-eos")
	b := generateJSON(t, "--prompt-ids", "11,22,33", "--temperature", "0", "--max-tokens", "8", "--ignore-eos")
	if len(a.TokenIDs) != 8 || a.CompletionTokens != 8 || a.PromptTokens != 3 || a.FinishReason != "length" || a.Backend != "cpu" {
		t.Fatalf("greedy result %+v", a)
	}
	if !slices.Equal(a.TokenIDs, b.TokenIDs) {
		t.Fatalf("greedy not deterministic: %v vs %v", a.TokenIDs, b.TokenIDs)
	}
	s1 := generateJSON(t, "hello world", "--seed", "42", "--max-tokens", "10", "--ignore-eos")
	s2 := generateJSON(t, "hello world", "--seed", "42", "--max-tokens", "10", "--ignore-eos")
	if s1.Seed != 42 || !slices.Equal(s1.TokenIDs, s2.TokenIDs) || s1.Text != s2.Text {
		t.Fatalf("seed 42 did not reproduce: %+v vs %+v", s1, s2)
	}
	if len(s1.PromptTokenIDs) == 0 || s1.Text == "" {
		t.Fatalf("text prompt: %+v", s1)
	}
}

func TestGenerateChatParsesReasoning(t *testing.T) {
	// Thinking on: the prompt ends with <think>, so what the model writes is
	// reasoning until it writes </think>.
	r := generateJSON(t, "--chat", "Hi", "--max-tokens", "12", "--seed", "5", "--ignore-eos")
	if r.Chat == nil || r.Chat.ReasoningContent == "" || r.Text == "" {
		t.Fatalf("chat output not parsed: %+v", r)
	}
	if !strings.HasPrefix(r.Text, r.Chat.ReasoningContent[:1]) {
		t.Errorf("reasoning %q does not start the text %q", r.Chat.ReasoningContent, r.Text)
	}
	// Thinking off: the prompt closes </think>; everything is content.
	r = generateJSON(t, "--chat", "--thinking=false", "Hi", "--max-tokens", "12", "--seed", "5", "--ignore-eos")
	if r.Chat == nil || r.Chat.ReasoningContent != "" {
		t.Fatalf("thinking off still produced reasoning: %+v", r.Chat)
	}
}

func TestGenerateStreamsTextAndStats(t *testing.T) {
	out, errOut, code := runCLI(t, "generate", "--model", tinyDir, "--backend", "cpu", "--chat", "--system", "be brief", "Hi there", "--max-tokens", "12", "--seed", "3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if strings.TrimSpace(out) == "" {
		t.Fatal("no text on stdout")
	}
	for _, want := range []string{"[cpu] prompt", "TTFT", "tokens/s", "seed 3"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stats line lacks %q: %q", want, errOut)
		}
	}
}

func TestGenerateBadInput(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--prompt-ids", "1,x"}, "--prompt-ids"},
		{[]string{"--prompt-ids", "1,2", "text too"}, "not both"},
		{[]string{}, "no prompt"},
		{[]string{"hi", "--top-p", "2"}, "top_p"},
		{[]string{"hi", "--max-tokens", "0"}, "--max-tokens"},
		{[]string{"hi", "--backend", "tpu"}, "--backend"},
		{[]string{"--prompt-ids", "5000"}, "5000"},
	}
	for _, tc := range cases {
		_, errOut, code := runCLI(t, append([]string{"generate", "--model", tinyDir}, tc.args...)...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want it to mention %q", tc.args, code, errOut, tc.want)
		}
	}
	_, errOut, code := runCLI(t, "generate", "--model", t.TempDir(), "hi")
	if code == 0 || !strings.Contains(errOut, "tokenizer") {
		t.Errorf("model dir without tokenizer: exit %d, %q", code, errOut)
	}
}

// Ctrl-C cancels the command's context: the request ends "cancelled" and
// what was produced is still returned.
func TestStreamGenerationStopsOnCancel(t *testing.T) {
	be, err := cpu.Open(tinyDir, cpu.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	eng, stop, err := engine.Start(context.Background(), be, engine.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	res, err := streamGeneration(ctx, eng, &engine.Request{PromptTokens: []int32{1, 2}, MaxTokens: 3000, IgnoreEOS: true}, plainSink{w: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	if res.FinishReason != string(engine.FinishCancelled) || len(res.TokenIDs) == 0 || len(res.TokenIDs) >= 3000 {
		t.Fatalf("finish %q after %d tokens", res.FinishReason, len(res.TokenIDs))
	}
}

// --speculative mtp on the CPU backend gives the greedy tokens of plain
// decoding (the MTP layer only drafts; the model verifies), and the flags are
// checked.
func TestGenerateSpeculative(t *testing.T) {
	args := []string{"--prompt-ids", "11,22,33,44", "--temperature", "0", "--max-tokens", "24", "--ignore-eos"}
	plain := generateJSON(t, args...)
	for _, k := range []string{"1", "3"} {
		spec := generateJSON(t, append(args, "--speculative", "mtp", "--draft-tokens", k)...)
		if !slices.Equal(spec.TokenIDs, plain.TokenIDs) {
			t.Errorf("--draft-tokens %s: %v, plain %v", k, spec.TokenIDs, plain.TokenIDs)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--speculative", "eagle"}, `--speculative "eagle": want mtp`},
		{[]string{"--draft-tokens", "2"}, "--draft-tokens: only means something with --speculative mtp"},
		{[]string{"--speculative", "mtp", "--draft-tokens", "0"}, "--draft-tokens 0: want 1..8"},
	} {
		_, errOut, code := runCLI(t, append([]string{"generate", "--model", tinyDir, "--backend", "cpu", "--prompt-ids", "1,2"}, tc.args...)...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", tc.args, code, errOut, tc.want)
		}
	}
}
