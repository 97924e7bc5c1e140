package server

import (
	"encoding/json"
	"testing"

	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/server/openai"
	"github.com/glmctl/glmctl/pkg/tokenizer/chat"
)

func TestToSamplingParams(t *testing.T) {
	d := SamplingDefaults{Temperature: 0.6, TopP: 0.95, TopK: 40}
	f := func(v float64) *float64 { return &v }
	i := func(v int) *int { return &v }
	seed := int64(-7)
	cases := []struct {
		name string
		in   openai.Sampling
		want engine.SamplingParams
	}{
		{"defaults", openai.Sampling{}, engine.SamplingParams{Temperature: 0.6, TopP: 0.95, TopK: 40}},
		{"all given", openai.Sampling{Temperature: f(0), TopP: f(0.5), TopK: i(5), MinP: f(0.1), PresencePenalty: f(1),
			FrequencyPenalty: f(-1), RepetitionPenalty: f(1.2), Seed: &seed},
			engine.SamplingParams{Temperature: 0, TopP: 0.5, TopK: 5, MinP: 0.1, PresencePenalty: 1, FrequencyPenalty: -1,
				RepetitionPenalty: 1.2, Seed: -7, HasSeed: true}},
		{"top_k -1 is off", openai.Sampling{TopK: i(-1)}, engine.SamplingParams{Temperature: 0.6, TopP: 0.95, TopK: 0}},
	}
	for _, tc := range cases {
		if got := toSamplingParams(tc.in, d, false, 0); got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
	if got := toSamplingParams(openai.Sampling{}, d, true, 3); !got.Logprobs || got.TopLogprobs != 3 {
		t.Errorf("logprobs not passed: %+v", got)
	}
}

func TestToSpeculation(t *testing.T) {
	on, off := true, false
	for _, tc := range []struct {
		in   *bool
		want engine.Speculation
	}{
		{nil, engine.SpeculationDefault},
		{&on, engine.SpeculationOn},
		{&off, engine.SpeculationOff},
	} {
		if got := toSpeculation(tc.in); got != tc.want {
			t.Errorf("toSpeculation(%v) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestToFinishReason(t *testing.T) {
	for _, tc := range []struct {
		f     engine.FinishReason
		tools bool
		want  string
	}{
		{engine.FinishStop, false, "stop"},
		{engine.FinishStop, true, "tool_calls"},
		{engine.FinishLength, true, "length"},
		{engine.FinishLength, false, "length"},
	} {
		if got := toFinishReason(tc.f, tc.tools); got != tc.want {
			t.Errorf("%s tools=%v: %q, want %q", tc.f, tc.tools, got, tc.want)
		}
	}
}

func TestToChatMessages(t *testing.T) {
	rc := "thought"
	in := []openai.Message{
		{Role: "system", Content: "s"},
		{Role: "assistant", Content: "", ReasoningContent: &rc, ToolCalls: []openai.MessageToolCall{{ID: "c1", Name: "f", Arguments: json.RawMessage(`{"a":1}`)}}},
		{Role: "tool", Content: "42", ToolCallID: "c1"},
	}
	out := toChatMessages(in)
	if len(out) != 3 || out[0].Role != "system" || string(out[0].Content) != "s" {
		t.Fatalf("got %+v", out)
	}
	tc := out[1].ToolCalls
	if *out[1].ReasoningContent != "thought" || len(tc) != 1 || tc[0].Function.Name != "f" || string(tc[0].Function.Arguments) != `{"a":1}` || tc[0].Type != "function" {
		t.Errorf("assistant: %+v", out[1])
	}
	if out[2].ToolCallID != "c1" || string(out[2].Content) != "42" {
		t.Errorf("tool: %+v", out[2])
	}
	// The converted messages render with the real GLM-4.7 template.
	got, err := chat.Render(chat.GLM47, out, chat.Options{AddGenerationPrompt: true})
	want := "[gMASK]<sop><|system|>s<|assistant|><think>thought</think><tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value></tool_call><|observation|><tool_response>42</tool_response><|assistant|><think>"
	if err != nil || got != want {
		t.Errorf("render:\n got %q (%v)\nwant %q", got, err, want)
	}
}

func TestToolObjects(t *testing.T) {
	tools := []openai.Tool{{Name: "a", Raw: json.RawMessage(`{"type":"function"}`)}}
	if got := toolObjects(tools, openai.ToolChoiceAuto); len(got) != 1 || string(got[0]) != `{"type":"function"}` {
		t.Errorf("auto: %s", got)
	}
	if got := toolObjects(tools, openai.ToolChoiceNone); got != nil {
		t.Errorf("none should hide the tools: %s", got)
	}
}

func TestToChatPiecesAndCompletion(t *testing.T) {
	ids := 0
	newID := func() string { ids++; return "call_x" }
	evs := []chat.Event{
		{Kind: chat.EventReasoning, Text: "a"}, {Kind: chat.EventReasoning, Text: "b"},
		{Kind: chat.EventContent, Text: ""},
		{Kind: chat.EventToolCall, ToolCall: &chat.ParsedToolCall{Index: 0, Name: "f", Arguments: `{"x":1}`}},
	}
	pieces := toChatPieces(evs, newID)
	if len(pieces) != 2 || pieces[0].text != "ab" || pieces[1].call == nil || *pieces[1].call.Index != 0 || ids != 1 {
		t.Fatalf("pieces %+v", pieces)
	}
	d := toDelta(pieces[1])
	if len(d.ToolCalls) != 1 || d.ToolCalls[0].Function.Arguments != `{"x":1}` || d.Content != nil {
		t.Errorf("delta %+v", d)
	}
	var r chatResult
	r.add(pieces)
	c := toChatCompletion(meta{id: "i", model: "m", created: 5}, []openai.ChatChoice{toChatChoice(0, &r, "tool_calls", false)},
		toUsage(1, engine.Usage{PromptTokens: 3, CompletionTokens: 2, CachedPromptTokens: 1}))
	msg := c.Choices[0].Message
	if msg.Content != nil || *msg.ReasoningContent != "ab" || len(msg.ToolCalls) != 1 || msg.ToolCalls[0].Index != nil {
		t.Errorf("message %+v: content must be null with only tool calls, and no index", msg)
	}
	if c.Usage.TotalTokens != 5 || c.Usage.PromptTokensDetails.CachedTokens != 1 || c.Choices[0].Logprobs != nil {
		t.Errorf("completion %+v", c)
	}
	b, _ := json.Marshal(c)
	var raw map[string]any
	_ = json.Unmarshal(b, &raw)
	if m := raw["choices"].([]any)[0].(map[string]any)["message"].(map[string]any); m["content"] != nil {
		t.Errorf("content should encode as null: %s", b)
	}
}

func TestLogprobConversion(t *testing.T) {
	text := func(id int32) string { return string(rune(id)) }
	ev := engine.Event{HasToken: true, Token: 'h', Logprob: -0.5, StopToken: -1,
		TopLogprobs: []engine.TokenLogprob{{Token: 'h', Logprob: -0.5}, {Token: 'i', Logprob: -2}, {Token: 'j', Logprob: -3}}}
	lp := toTokenLogprob(ev, 2, text)
	if lp.Token != "h" || lp.Logprob != -0.5 || len(lp.Bytes) != 1 || lp.Bytes[0] != 'h' || len(lp.TopLogprobs) != 2 || lp.TopLogprobs[1].Token != "i" {
		t.Errorf("chat logprob %+v", lp)
	}
	cl := newCompletionLogprobs(3)
	ev.Text = "h"
	cl.add(ev, 1, text)
	cl.add(engine.Event{HasToken: true, Token: 'i', Logprob: float32(negInf()), Text: "i"}, 0, text)
	if len(cl.lp.Tokens) != 2 || cl.lp.TextOffset[0] != 3 || cl.lp.TextOffset[1] != 4 || cl.lp.TokenLogprobs[1] != -9999 || len(cl.lp.TopLogprobs[0]) != 1 {
		t.Errorf("completion logprobs %+v", cl.lp)
	}
	if !hasVisibleToken(ev) || hasVisibleToken(engine.Event{HasToken: true, Token: 5, StopToken: 5}) {
		t.Error("the stop token must not count as output")
	}
}

func negInf() float64 { var z float64; return -1 / z }

func TestToUsageChoices(t *testing.T) {
	u := func(p, c, cached int) engine.Usage {
		return engine.Usage{PromptTokens: p, CompletionTokens: c, CachedPromptTokens: cached}
	}
	for _, tc := range []struct {
		name                          string
		n                             int
		us                            []engine.Usage
		prompt, completion, cachedTok int
	}{
		{"one", 1, []engine.Usage{u(10, 5, 2)}, 10, 5, 2},
		{"n=0 acts as 1", 0, []engine.Usage{u(10, 5, 2)}, 10, 5, 2},
		{"prompts summed", 1, []engine.Usage{u(10, 5, 0), u(7, 3, 1)}, 17, 8, 1},
		{"n=3 prompt once", 3, []engine.Usage{u(10, 5, 0), u(10, 4, 10), u(10, 6, 10)}, 10, 15, 0},
		{"2 prompts n=2", 2, []engine.Usage{u(10, 1, 0), u(10, 2, 10), u(7, 3, 4), u(7, 4, 7)}, 17, 10, 4},
		{"none", 2, nil, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := toUsage(tc.n, tc.us...)
			if got.PromptTokens != tc.prompt || got.CompletionTokens != tc.completion || got.TotalTokens != tc.prompt+tc.completion ||
				got.PromptTokensDetails.CachedTokens != tc.cachedTok {
				t.Errorf("usage %+v (cached %d), want prompt %d completion %d cached %d", got, got.PromptTokensDetails.CachedTokens,
					tc.prompt, tc.completion, tc.cachedTok)
			}
		})
	}
}

func TestChoiceRequests(t *testing.T) {
	seeded := &engine.Request{Label: "a", PromptTokens: []int32{1, 2}, Sampling: engine.SamplingParams{Temperature: 1, Seed: 40, HasSeed: true}}
	unseeded := &engine.Request{Label: "b", PromptTokens: []int32{3}, Sampling: engine.SamplingParams{Temperature: 1}}
	type want struct {
		prompt  int32
		seed    int64
		hasSeed bool
	}
	for _, tc := range []struct {
		name    string
		prompts []*engine.Request
		n       int
		want    []want
	}{
		{"n=1", []*engine.Request{seeded}, 1, []want{{1, 40, true}}},
		{"seeded n=3", []*engine.Request{seeded}, 3, []want{{1, 40, true}, {1, 41, true}, {1, 42, true}}},
		{"unseeded n=2", []*engine.Request{unseeded}, 2, []want{{3, 0, false}, {3, 0, false}}},
		{"2 prompts n=2", []*engine.Request{seeded, unseeded}, 2, []want{{1, 40, true}, {1, 41, true}, {3, 0, false}, {3, 0, false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := choiceRequests(tc.prompts, tc.n)
			if len(got) != len(tc.want) {
				t.Fatalf("%d requests, want %d", len(got), len(tc.want))
			}
			for i, w := range tc.want {
				g := got[i]
				if g.PromptTokens[0] != w.prompt || g.Sampling.Seed != w.seed || g.Sampling.HasSeed != w.hasSeed || g.Sampling.Temperature != 1 {
					t.Errorf("choice %d: %+v, want %+v", i, g, w)
				}
			}
			if seeded.Sampling.Seed != 40 {
				t.Fatal("the caller's request was changed")
			}
		})
	}
}

func TestChatChoiceIndex(t *testing.T) {
	var r chatResult
	r.add([]chatPiece{{kind: chat.EventContent, text: "hi"}})
	m := meta{id: "i", model: "m", created: 5}
	for _, tc := range []struct {
		index    int
		logprobs bool
	}{{0, false}, {2, true}} {
		c := toChatChoice(tc.index, &r, "stop", tc.logprobs)
		if c.Index != tc.index || *c.Message.Content != "hi" || (c.Logprobs != nil) != tc.logprobs {
			t.Errorf("choice %+v", c)
		}
		fin := "length"
		ch := toChatChunk(m, tc.index, openai.Delta{}, nil, tc.logprobs, &fin)
		if len(ch.Choices) != 1 || ch.Choices[0].Index != tc.index || *ch.Choices[0].FinishReason != "length" || (ch.Choices[0].Logprobs != nil) != tc.logprobs {
			t.Errorf("chunk %+v", ch)
		}
	}
	if c := toChatCompletion(m, nil, nil); c.Choices == nil {
		t.Error("choices must encode as []")
	}
}
