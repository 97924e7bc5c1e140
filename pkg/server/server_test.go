package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/server/openai"
)

const weatherTool = `{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}}`

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %T: %v\nbody: %s", v, err, b)
	}
	return v
}

func TestChatCompletion(t *testing.T) {
	ts := startServer(t, nil)
	cases := []struct {
		name          string
		body          string
		wantReasoning string
		wantContent   *string
		wantCalls     []openai.ToolCall
		wantFinish    string
	}{
		{"thinking on", `{"model":"glm-test","messages":[{"role":"user","content":"SCRIPT:think"}]}`,
			"Let me think.", ptr("Hello!"), nil, "stop"},
		{"thinking off: all content", `{"messages":[{"role":"user","content":"SCRIPT:plain"}],"chat_template_kwargs":{"enable_thinking":false}}`,
			"", ptr("Just an answer."), nil, "stop"},
		{"tool call", `{"messages":[{"role":"user","content":[{"type":"text","text":"SCRIPT:tool"}]}],"tools":[` + weatherTool + `]}`,
			"I should call it.", nil,
			[]openai.ToolCall{{Type: "function", Function: openai.FunctionCall{Name: "get_weather", Arguments: `{"city":"Paris","days":3}`}}}, "tool_calls"},
		{"max_tokens cuts", `{"messages":[{"role":"user","content":"SCRIPT:think"}],"max_tokens":3}`,
			"Let", ptr(""), nil, "length"},
		{"stop string", `{"messages":[{"role":"system","content":"x"},{"role":"user","content":"SCRIPT:stopme"}],"stop":["STOP"],"chat_template_kwargs":{"enable_thinking":false}}`,
			"", ptr("one two "), nil, "stop"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, hdr, body := ts.post(t, "/v1/chat/completions", tc.body)
			if code != http.StatusOK {
				t.Fatalf("status %d: %s", code, body)
			}
			c := decode[openai.ChatCompletion](t, body)
			if rid := hdr.Get(RequestIDHeader); rid == "" || c.ID != "chatcmpl-"+rid {
				t.Errorf("id %q, request id header %q", c.ID, rid)
			}
			if c.Object != "chat.completion" || c.Model != "glm-test" || len(c.Choices) != 1 || c.Usage == nil {
				t.Fatalf("shape: %s", body)
			}
			m := c.Choices[0].Message
			if got := deref(m.ReasoningContent); got != tc.wantReasoning {
				t.Errorf("reasoning %q, want %q", got, tc.wantReasoning)
			}
			if (m.Content == nil) != (tc.wantContent == nil) || (m.Content != nil && *m.Content != *tc.wantContent) {
				t.Errorf("content %v, want %v", show(m.Content), show(tc.wantContent))
			}
			if len(m.ToolCalls) != len(tc.wantCalls) {
				t.Fatalf("tool calls %+v, want %+v", m.ToolCalls, tc.wantCalls)
			}
			for i, want := range tc.wantCalls {
				got := m.ToolCalls[i]
				if !strings.HasPrefix(got.ID, "call_") || got.Index != nil || got.Type != want.Type || got.Function != want.Function {
					t.Errorf("tool call %d: %+v, want %+v", i, got, want)
				}
			}
			if c.Choices[0].FinishReason != tc.wantFinish {
				t.Errorf("finish %q, want %q", c.Choices[0].FinishReason, tc.wantFinish)
			}
			u := c.Usage
			if u.PromptTokens == 0 || u.CompletionTokens == 0 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
				t.Errorf("usage %+v", u)
			}
		})
	}
	waitFor(t, "engine idle", 5*time.Second, func() bool { return idle(ts.Server) })
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func show(p *string) string {
	if p == nil {
		return "null"
	}
	return fmt.Sprintf("%q", *p)
}

// A streamed chat answer carries the same text as the non-streamed one,
// split into deltas: role first, then reasoning and content, the finish
// reason, the usage chunk, then [DONE].
func TestChatStream(t *testing.T) {
	ts := startServer(t, nil)
	for _, script := range []string{"think", "tool"} {
		t.Run(script, func(t *testing.T) {
			base := `"messages":[{"role":"user","content":"SCRIPT:` + script + `"}],"tools":[` + weatherTool + `],"logprobs":true,"top_logprobs":2`
			_, _, whole := ts.post(t, "/v1/chat/completions", "{"+base+"}")
			want := decode[openai.ChatCompletion](t, whole)

			code, hdr, body := ts.post(t, "/v1/chat/completions", "{"+base+`,"stream":true,"stream_options":{"include_usage":true}}`)
			if code != http.StatusOK || !strings.HasPrefix(hdr.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("status %d, content type %q: %s", code, hdr.Get("Content-Type"), body)
			}
			events := readSSE(t, body)
			var reasoning, content strings.Builder
			var calls []openai.ToolCall
			var lps []openai.TokenLogprob
			var finish string
			var usage *openai.Usage
			for i, raw := range events {
				ch := decode[openai.ChatCompletionChunk](t, raw)
				if ch.Object != "chat.completion.chunk" || ch.ID != "chatcmpl-"+hdr.Get(RequestIDHeader) {
					t.Fatalf("chunk %d: %s", i, raw)
				}
				if ch.Usage != nil {
					if i != len(events)-1 || len(ch.Choices) != 0 {
						t.Fatalf("usage chunk %d of %d has %d choices", i, len(events), len(ch.Choices))
					}
					usage = ch.Usage
					continue
				}
				d := ch.Choices[0].Delta
				if i == 0 && (d.Role != "assistant" || d.Content == nil || *d.Content != "") {
					t.Errorf("first chunk should announce the role: %s", raw)
				}
				if finish != "" {
					t.Errorf("chunk after the finish reason: %s", raw)
				}
				if ch.Choices[0].FinishReason != nil {
					finish = *ch.Choices[0].FinishReason
				}
				reasoning.WriteString(deref(d.ReasoningContent))
				content.WriteString(deref(d.Content))
				for _, c := range d.ToolCalls {
					if c.Index == nil || *c.Index != len(calls) {
						t.Errorf("tool call delta index %v, want %d", c.Index, len(calls))
					}
					c.Index, c.ID = nil, ""
					calls = append(calls, c)
				}
				if lp := ch.Choices[0].Logprobs; lp != nil {
					lps = append(lps, lp.Content...)
				}
			}
			wm := want.Choices[0].Message
			if reasoning.String() != deref(wm.ReasoningContent) || content.String() != deref(wm.Content) {
				t.Errorf("stream gave reasoning %q content %q; whole response %q %q", reasoning.String(), content.String(), deref(wm.ReasoningContent), deref(wm.Content))
			}
			if len(calls) != len(wm.ToolCalls) {
				t.Fatalf("stream tool calls %+v, whole %+v", calls, wm.ToolCalls)
			}
			for i := range calls {
				if calls[i].Function != wm.ToolCalls[i].Function {
					t.Errorf("tool call %d: stream %+v, whole %+v", i, calls[i], wm.ToolCalls[i])
				}
			}
			if finish != want.Choices[0].FinishReason {
				t.Errorf("finish %q, whole %q", finish, want.Choices[0].FinishReason)
			}
			if usage == nil || usage.PromptTokens != want.Usage.PromptTokens || usage.CompletionTokens != want.Usage.CompletionTokens ||
				usage.TotalTokens != usage.PromptTokens+usage.CompletionTokens {
				t.Errorf("usage %+v, whole %+v", usage, want.Usage)
			}
			// Logprobs: one per generated token but the stop token, each with
			// two alternatives.
			if len(lps) != usage.CompletionTokens-1 || len(lps) != len(want.Choices[0].Logprobs.Content) {
				t.Errorf("%d logprobs in stream, %d whole, %d completion tokens", len(lps), len(want.Choices[0].Logprobs.Content), usage.CompletionTokens)
			}
			for _, lp := range lps {
				if len(lp.TopLogprobs) != 2 || lp.Logprob >= 0 || string(rune(lp.Bytes[0])) != lp.Token[:1] {
					t.Fatalf("logprob entry %+v", lp)
				}
			}
		})
	}
}

func TestCompletions(t *testing.T) {
	ts := startServer(t, nil)
	t.Run("string prompt with logprobs", func(t *testing.T) {
		code, _, body := ts.post(t, "/v1/completions", `{"prompt":"abc","max_tokens":5,"temperature":0,"logprobs":1}`)
		if code != 200 {
			t.Fatalf("%d %s", code, body)
		}
		c := decode[openai.Completion](t, body)
		ch := c.Choices[0]
		if c.Object != "text_completion" || ch.Text != "abcde" || deref(ch.FinishReason) != "length" {
			t.Fatalf("got %s", body)
		}
		lp := ch.Logprobs
		if lp == nil || len(lp.Tokens) != 5 || strings.Join(lp.Tokens, "") != "abcde" || len(lp.TopLogprobs[0]) != 1 ||
			fmt.Sprint(lp.TextOffset) != "[0 1 2 3 4]" {
			t.Errorf("logprobs %+v", lp)
		}
		if c.Usage.PromptTokens != 3 || c.Usage.CompletionTokens != 5 {
			t.Errorf("usage %+v", c.Usage)
		}
	})
	t.Run("token ids, echo, default max_tokens", func(t *testing.T) {
		code, _, body := ts.post(t, "/v1/completions", `{"prompt":[72,105],"echo":true,"temperature":0}`)
		if code != 200 {
			t.Fatalf("%d %s", code, body)
		}
		c := decode[openai.Completion](t, body)
		if want := "Hi" + "abcdefghijklmnop"; c.Choices[0].Text != want || c.Usage.CompletionTokens != DefaultCompletionMaxTokens {
			t.Errorf("text %q (want %q), usage %+v", c.Choices[0].Text, want, c.Usage)
		}
	})
	t.Run("several prompts", func(t *testing.T) {
		code, _, body := ts.post(t, "/v1/completions", `{"prompt":["x","SCRIPT:plain"],"max_tokens":40,"temperature":0}`)
		if code != 200 {
			t.Fatalf("%d %s", code, body)
		}
		c := decode[openai.Completion](t, body)
		if len(c.Choices) != 2 || c.Choices[0].Index != 0 || c.Choices[1].Index != 1 ||
			len(c.Choices[0].Text) != 40 || c.Choices[1].Text != "Just an answer." || deref(c.Choices[1].FinishReason) != "stop" {
			t.Fatalf("got %s", body)
		}
		if c.Usage.PromptTokens != 1+len("SCRIPT:plain") || c.Usage.CompletionTokens != 40+len("Just an answer.")+1 {
			t.Errorf("usage %+v", c.Usage)
		}
	})
	t.Run("stream, two prompts, usage", func(t *testing.T) {
		code, _, body := ts.post(t, "/v1/completions", `{"prompt":[[97],[98]],"max_tokens":4,"temperature":0,"stream":true,"stream_options":{"include_usage":true},"logprobs":0}`)
		if code != 200 {
			t.Fatalf("%d %s", code, body)
		}
		texts := map[int]string{}
		finishes := map[int]string{}
		var usage *openai.Usage
		for _, raw := range readSSE(t, body) {
			c := decode[openai.Completion](t, raw)
			if c.Usage != nil {
				usage = c.Usage
				continue
			}
			ch := c.Choices[0]
			texts[ch.Index] += ch.Text
			if ch.FinishReason != nil {
				finishes[ch.Index] = *ch.FinishReason
			}
			if ch.Text != "" && (ch.Logprobs == nil || len(ch.Logprobs.Tokens) != 1 || len(ch.Logprobs.TopLogprobs[0]) != 0) {
				t.Errorf("chunk logprobs: %s", raw)
			}
		}
		if texts[0] != "abcd" || texts[1] != "abcd" || finishes[0] != "length" || finishes[1] != "length" {
			t.Errorf("texts %v finishes %v", texts, finishes)
		}
		if usage == nil || usage.PromptTokens != 2 || usage.CompletionTokens != 8 {
			t.Errorf("usage %+v", usage)
		}
	})
}

// The same seed gives the same tokens; a different one other tokens.
func TestSeedReproducible(t *testing.T) {
	ts := startServer(t, nil)
	text := func(seed int) string {
		_, _, body := ts.post(t, "/v1/completions", fmt.Sprintf(`{"prompt":"q","max_tokens":8,"temperature":0.8,"seed":%d}`, seed))
		return decode[openai.Completion](t, body).Choices[0].Text
	}
	a, b, c := text(11), text(11), text(12)
	if a != b || a == c {
		t.Errorf("seed 11: %q, %q; seed 12: %q", a, b, c)
	}
}

func TestErrors(t *testing.T) {
	ts := startServer(t, func(o *Options, _ *scriptBackend) { o.MaxBodyBytes = 4096 })
	big := `{"prompt":"` + strings.Repeat("x", 5000) + `"}`
	cases := []struct {
		name, path, body string
		status           int
		param            string
		msg              string
	}{
		{"not json", "/v1/chat/completions", `{"messages":`, 400, "", "invalid JSON"},
		{"array body", "/v1/chat/completions", `[1,2]`, 400, "", "JSON object"},
		{"temperature string", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}`, 400, "temperature", "number"},
		{"messages not array", "/v1/chat/completions", `{"messages":"hi"}`, 400, "messages", "array"},
		{"content number", "/v1/chat/completions", `{"messages":[{"role":"user","content":5}]}`, 400, "messages[0].content", "string"},
		{"role missing", "/v1/chat/completions", `{"messages":[{"content":"x"}]}`, 400, "messages[0].role", "required"},
		{"image part", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "messages[0].content[0].type", "text only"},
		{"include_usage type", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":"yes"}}`, 400, "stream_options.include_usage", "boolean"},
		{"n=0", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"n":0}`, 400, "n", "[1, 16]"},
		{"n too large", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"n":17}`, 400, "n", "[1, 16]"},
		{"completions n too large", "/v1/completions", `{"prompt":"x","n":100}`, 400, "n", "[1, 16]"},
		{"top_p 0", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"top_p":0}`, 400, "top_p", "(0, 1]"},
		{"max_tokens beyond context", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":100000}`, 400, "max_tokens", "maximum context length is 2048"},
		{"prompt too long", "/v1/completions", `{"prompt":"` + strings.Repeat("y", 2100) + `"}`, 400, "prompt", "maximum context length"},
		{"token id out of vocab", "/v1/completions", `{"prompt":[1,299,300]}`, 400, "prompt", "outside the vocabulary"},
		{"tool_choice required", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"tool_choice":"required"}`, 400, "tool_choice", "needs tools"},
		{"speculative without a draft model", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"speculative":true}`, 400, "speculative", "not enabled on this server"},
		{"completions speculative without a draft model", "/v1/completions", `{"prompt":"x","speculative":true}`, 400, "speculative", "--speculative mtp"},
		{"unknown model", "/v1/completions", `{"model":"gpt-4","prompt":"x"}`, 404, "model", "does not exist"},
		{"body too large", "/v1/completions", big, 413, "", "limit of 4096 bytes"},
		{"unknown route", "/v1/embeddings", `{}`, 404, "", "no route"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, hdr, body := ts.post(t, tc.path, tc.body)
			if code != tc.status {
				t.Fatalf("status %d, want %d: %s", code, tc.status, body)
			}
			if hdr.Get(RequestIDHeader) == "" || !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") {
				t.Errorf("headers %v", hdr)
			}
			e := decode[openai.ErrorResponse](t, body)
			if deref(e.Error.Param) != tc.param || !strings.Contains(e.Error.Message, tc.msg) || e.Error.Type == "" {
				t.Errorf("error %+v (param %q), want param %q and message containing %q", e.Error, deref(e.Error.Param), tc.param, tc.msg)
			}
		})
	}
	if code, body := ts.get(t, "/v1/chat/completions"); code != 405 || !strings.Contains(string(body), "POST") {
		t.Errorf("GET on the chat route: %d %s", code, body)
	}
	waitFor(t, "engine idle", 5*time.Second, func() bool { return idle(ts.Server) })
}

func TestAPIKey(t *testing.T) {
	ts := startServer(t, func(o *Options, _ *scriptBackend) { o.APIKey = "s3cret" })
	for _, tc := range []struct {
		hdr  []string
		want int
	}{
		{nil, 401},
		{[]string{"Authorization", "Bearer wrong"}, 401},
		{[]string{"Authorization", "s3cret"}, 401},
		{[]string{"Authorization", "Bearer s3cret"}, 200},
	} {
		code, body := ts.get(t, "/v1/models", tc.hdr...)
		if code != tc.want {
			t.Errorf("headers %v: status %d, want %d (%s)", tc.hdr, code, tc.want, body)
		}
		if code == 401 && decode[openai.ErrorResponse](t, body).Error.Code == nil {
			t.Errorf("401 body lacks a code: %s", body)
		}
	}
	code, _, _ := ts.post(t, "/v1/completions", `{"prompt":"x","max_tokens":1}`)
	if code != 401 {
		t.Errorf("completions without key: %d", code)
	}
	// Probes, metrics and paths outside /v1 stay open.
	for _, tc := range []struct {
		path string
		want int
	}{{"/healthz", 200}, {"/readyz", 200}, {"/metrics", 200}, {"/nothing", 404}, {"/v1/nothing", 401}} {
		if code, _ := ts.get(t, tc.path); code != tc.want {
			t.Errorf("%s without key: %d, want %d", tc.path, code, tc.want)
		}
	}
}

func TestModelsAndProbes(t *testing.T) {
	ts := startServer(t, nil)
	code, body := ts.get(t, "/v1/models")
	list := decode[openai.ModelList](t, body)
	if code != 200 || list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != "glm-test" || list.Data[0].MaxModelLen != 2048 {
		t.Errorf("models: %d %s", code, body)
	}
	if code, _ := ts.get(t, "/v1/models/glm-test"); code != 200 {
		t.Errorf("model by id: %d", code)
	}
	if code, _ := ts.get(t, "/v1/models/other"); code != 404 {
		t.Errorf("unknown model by id: %d", code)
	}
	if code, body := ts.get(t, "/healthz"); code != 200 || string(body) != "ok\n" {
		t.Errorf("healthz %d %q", code, body)
	}
	if code, body := ts.get(t, "/readyz"); code != 200 {
		t.Errorf("readyz %d %q", code, body)
	}
}

// A full queue answers 429 with Retry-After.
func TestQueueFull(t *testing.T) {
	ts := startServer(t, func(o *Options, b *scriptBackend) {
		o.Engine.MaxSeqs, o.Engine.MaxQueue = 1, 1
		o.RetryAfter = 2 * time.Second
		b.delay = 2 * time.Millisecond
	})
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for range 8 {
		wg.Go(func() {
			code, hdr, body := ts.post(t, "/v1/completions", `{"prompt":"x","max_tokens":20}`)
			mu.Lock()
			codes[code]++
			mu.Unlock()
			if code == 429 && (hdr.Get("Retry-After") != "2" || !strings.Contains(string(body), "rate_limit_exceeded")) {
				t.Errorf("429 without Retry-After 2 or code: %v %s", hdr, body)
			}
		})
	}
	wg.Wait()
	if codes[429] == 0 || codes[200] == 0 || codes[200]+codes[429] != 8 {
		t.Errorf("status counts %v: want some 200 and some 429, nothing else", codes)
	}
	waitFor(t, "engine idle", 5*time.Second, func() bool { return idle(ts.Server) })
}

// A client that disconnects mid-stream cancels its request: the engine
// frees its KV blocks and counts it cancelled.
func TestDisconnectCancels(t *testing.T) {
	ts := startServer(t, func(_ *Options, b *scriptBackend) { b.delay = disconnectStepDelay })
	checkDisconnectCancels(t, ts, "/v1/chat/completions",
		`{"messages":[{"role":"user","content":"go"}],"max_tokens":400,"stream":%v}`, "reasoning_content")
}

// On shutdown, requests that finish within the deadline complete; those
// that do not get an error event, and Serve returns nil either way.
func TestGracefulShutdown(t *testing.T) {
	for _, tc := range []struct {
		name      string
		maxTokens int
		wantDone  bool
	}{
		{"drained", 30, true},
		{"cancelled at deadline", 5000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, func(o *Options, b *scriptBackend) {
				o.ShutdownTimeout = 300 * time.Millisecond
				b.delay = 3 * time.Millisecond
				b.maxCtx, b.numBlocks = 8192, 1024
			})
			type result struct {
				code int
				body []byte
			}
			res := make(chan result, 1)
			go func() {
				code, _, body := ts.post(t, "/v1/completions", fmt.Sprintf(`{"prompt":"x","max_tokens":%d,"stream":true}`, tc.maxTokens))
				res <- result{code, body}
			}()
			waitFor(t, "request running", 5*time.Second, func() bool { return ts.Engine().Stats().Running == 1 })
			ts.stop()
			waitFor(t, "readyz to fail while draining", 2*time.Second, func() bool { return ts.draining.Load() })
			var r result
			select {
			case r = <-res:
			case <-time.After(10 * time.Second):
				t.Fatal("request hung during shutdown")
			}
			select {
			case err := <-ts.done:
				if err != nil {
					t.Fatalf("Serve: %v", err)
				}
				ts.done <- nil // for the cleanup check
			case <-time.After(10 * time.Second):
				t.Fatal("Serve did not return")
			}
			events := readSSE(t, r.body)
			last := string(events[len(events)-1])
			if tc.wantDone && !strings.Contains(last, `"finish_reason":"length"`) {
				t.Errorf("drained request should finish normally; last event %s", last)
			}
			if !tc.wantDone && !strings.Contains(last, `"error"`) {
				t.Errorf("request cut at the deadline should end with an error event; last event %s", last)
			}
			if _, err := http.Get(ts.url + "/healthz"); err == nil {
				t.Error("server still accepts connections after shutdown")
			}
		})
	}
}

// A backend failure fails the requests of that step with 500, and the
// server keeps serving.
func TestBackendFailure(t *testing.T) {
	ts := startServer(t, nil)
	ts.backend.failNext.Store(true)
	code, _, body := ts.post(t, "/v1/completions", `{"prompt":"x","max_tokens":3}`)
	if code != 500 || !strings.Contains(string(body), "injected backend failure") {
		t.Errorf("status %d: %s", code, body)
	}
	if code, _, body := ts.post(t, "/v1/completions", `{"prompt":"x","max_tokens":3}`); code != 200 {
		t.Errorf("after a failure: %d %s", code, body)
	}
	if st := ts.Engine().Stats(); st.FinishedError != 1 {
		t.Errorf("finished with error: %d", st.FinishedError)
	}
}

// One JSON log line per API request, with the generation fields.
func TestRequestLog(t *testing.T) {
	ts := startServer(t, nil)
	_, hdr, _ := ts.post(t, "/v1/completions", `{"prompt":"hello","max_tokens":6}`, RequestIDHeader, "my-req-1")
	if hdr.Get(RequestIDHeader) != "my-req-1" {
		t.Errorf("client request id not echoed: %q", hdr.Get(RequestIDHeader))
	}
	ts.post(t, "/v1/chat/completions", `{"messages":[],"max_tokens":6}`)
	ts.get(t, "/healthz") // debug level: not logged
	var lines []map[string]any
	waitFor(t, "two request log lines", 2*time.Second, func() bool {
		lines = lines[:0]
		for _, l := range strings.Split(strings.TrimSpace(ts.logs.String()), "\n") {
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("log line is not JSON: %q", l)
			}
			if m["msg"] == "request" {
				lines = append(lines, m)
			}
		}
		return len(lines) >= 2
	})
	if len(lines) != 2 {
		t.Fatalf("%d request lines: %v", len(lines), lines)
	}
	ok := lines[0]
	if ok["request_id"] != "my-req-1" || ok["status"] != 200.0 || ok["prompt_tokens"] != 5.0 || ok["completion_tokens"] != 6.0 ||
		ok["finish_reason"] != "length" || ok["ttft_ms"].(float64) <= 0 || ok["tokens_per_s"].(float64) <= 0 {
		t.Errorf("log line %v", ok)
	}
	bad := lines[1]
	if bad["status"] != 400.0 || !strings.Contains(bad["error"].(string), "messages") {
		t.Errorf("log line %v", bad)
	}
}

func TestNewValidates(t *testing.T) {
	good := Options{Backend: &scriptBackend{numBlocks: 8, maxCtx: 64}, Tokenizer: byteTokenizer{}, ModelName: "m"}
	for _, tc := range []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"no backend", func(o *Options) { o.Backend = nil }, "Backend"},
		{"no tokenizer", func(o *Options) { o.Tokenizer = nil }, "Tokenizer"},
		{"no name", func(o *Options) { o.ModelName = "" }, "ModelName"},
		{"negative body", func(o *Options) { o.MaxBodyBytes = -1 }, "max body"},
		{"bad engine config", func(o *Options) { o.Engine.MaxModelLen = 1 << 20 }, "max model len"},
	} {
		o := good
		tc.edit(&o)
		if _, err := New(o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one naming %q", tc.name, err, tc.want)
		}
	}
	if _, err := New(good); err != nil {
		t.Errorf("good options: %v", err)
	}
	_ = engine.ErrQueueFull
}

func ptr[T any](v T) *T { return &v }

// /readyz fails when work is pending and no step has finished for longer
// than the stall timeout, and recovers once steps resume.
func TestProgressWatch(t *testing.T) {
	var p progressWatch
	t0 := time.Unix(1000, 0)
	busy := engine.Stats{Running: 1, Steps: 5}
	p.observe(busy, t0)
	if p.stalled(t0.Add(30*time.Second), time.Minute) {
		t.Error("stalled after 30 s with a 1 min limit")
	}
	p.observe(busy, t0.Add(50*time.Second)) // no step since t0
	if !p.stalled(t0.Add(61*time.Second), time.Minute) {
		t.Error("not stalled after 61 s without a step")
	}
	p.observe(engine.Stats{Running: 1, Steps: 6}, t0.Add(62*time.Second))
	if p.stalled(t0.Add(63*time.Second), time.Minute) {
		t.Error("still stalled after a step")
	}
	p.observe(engine.Stats{Steps: 6}, t0.Add(200*time.Second)) // idle: nothing to do is progress
	if p.stalled(t0.Add(201*time.Second), time.Minute) {
		t.Error("an idle engine counts as stalled")
	}
}
