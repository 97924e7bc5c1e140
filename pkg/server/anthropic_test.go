package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/glmctl/glmctl/pkg/server/anthropic"
	"github.com/glmctl/glmctl/pkg/tokenizer/chat"
)

const anthropicWeatherTool = `{"name":"get_weather","description":"Weather","input_schema":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}`

// wireMessage is a response message as a client decodes it.
type wireMessage struct {
	ID           string                   `json:"id"`
	Type         string                   `json:"type"`
	Role         string                   `json:"role"`
	Model        string                   `json:"model"`
	Content      []anthropic.ContentBlock `json:"content"`
	StopReason   *string                  `json:"stop_reason"`
	StopSequence *string                  `json:"stop_sequence"`
	Usage        anthropic.Usage          `json:"usage"`
}

func TestMessages(t *testing.T) {
	ts := startServer(t, nil)
	cases := []struct {
		name       string
		body       string
		want       string // the content blocks, as JSON
		wantStop   string
		wantSeq    string
		wantOutput int // output tokens, when fixed
	}{
		{"thinking on by default", `{"model":"glm-test","max_tokens":100,"messages":[{"role":"user","content":"SCRIPT:think"}]}`,
			`[{"type":"thinking","thinking":"Let me think.","signature":""},{"type":"text","text":"Hello!"}]`, "end_turn", "", 0},
		{"thinking disabled: text only", `{"max_tokens":100,"thinking":{"type":"disabled"},"system":"Be brief.","messages":[{"role":"user","content":"SCRIPT:plain"}]}`,
			`[{"type":"text","text":"Just an answer."}]`, "end_turn", "", 0},
		{"tool use", `{"max_tokens":200,"thinking":{"type":"enabled","budget_tokens":1024},"tools":[` + anthropicWeatherTool + `],"tool_choice":{"type":"auto"},
			"messages":[{"role":"user","content":[{"type":"text","text":"SCRIPT:tool"}]}]}`,
			`[{"type":"thinking","thinking":"I should call it.","signature":""},{"type":"tool_use","id":"*","name":"get_weather","input":{"city":"Paris","days":3}}]`, "tool_use", "", 0},
		{"max_tokens", `{"max_tokens":3,"messages":[{"role":"user","content":"SCRIPT:think"}]}`,
			`[{"type":"thinking","thinking":"Let","signature":""}]`, "max_tokens", "", 3},
		{"stop sequence", `{"max_tokens":100,"stop_sequences":["NEVER","STOP"],"thinking":{"type":"disabled"},"messages":[{"role":"user","content":"SCRIPT:stopme"}]}`,
			`[{"type":"text","text":"one two "}]`, "stop_sequence", "STOP", 0},
		{"multi-turn with a tool result", `{"max_tokens":100,"thinking":{"type":"disabled"},"tools":[` + anthropicWeatherTool + `],"messages":[
			{"role":"user","content":"weather?"},
			{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":""},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},
			{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"21C"},{"type":"text","text":"SCRIPT:plain"}]}]}`,
			`[{"type":"text","text":"Just an answer."}]`, "end_turn", "", 0},
		{"prefill", `{"max_tokens":5,"temperature":0,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"The answer:"}]}`,
			`[{"type":"text","text":"abcde"}]`, "max_tokens", "", 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, hdr, body := ts.post(t, "/v1/messages", tc.body)
			if code != http.StatusOK {
				t.Fatalf("status %d: %s", code, body)
			}
			m := decode[wireMessage](t, body)
			if rid := hdr.Get("Request-Id"); rid == "" || rid != hdr.Get(RequestIDHeader) || m.ID != "msg_"+rid {
				t.Errorf("id %q, request-id %q", m.ID, rid)
			}
			if m.Type != "message" || m.Role != "assistant" || m.Model != "glm-test" {
				t.Errorf("shape: %s", body)
			}
			for i := range m.Content {
				if m.Content[i].Type == "tool_use" {
					if !strings.HasPrefix(m.Content[i].ID, "toolu_") {
						t.Errorf("tool_use id %q", m.Content[i].ID)
					}
					m.Content[i].ID = "*"
				}
			}
			if got, _ := json.Marshal(m.Content); string(got) != tc.want {
				t.Errorf("content %s\n   want %s", got, tc.want)
			}
			if deref(m.StopReason) != tc.wantStop || deref(m.StopSequence) != tc.wantSeq {
				t.Errorf("stop %q %q, want %q %q", deref(m.StopReason), deref(m.StopSequence), tc.wantStop, tc.wantSeq)
			}
			if m.Usage.InputTokens == 0 || m.Usage.OutputTokens == 0 || (tc.wantOutput > 0 && m.Usage.OutputTokens != tc.wantOutput) {
				t.Errorf("usage %+v", m.Usage)
			}
			// count_tokens counts the same prompt.
			code, _, cb := ts.post(t, "/v1/messages/count_tokens", tc.body)
			if n := decode[anthropic.CountTokensResponse](t, cb); code != 200 || n.InputTokens != m.Usage.InputTokens {
				t.Errorf("count_tokens %d %s, usage.input_tokens %d", code, cb, m.Usage.InputTokens)
			}
		})
	}
	// Tools, thinking and tool_choice change the prompt as the chat template
	// renders them.
	count := func(body string) int {
		code, _, b := ts.post(t, "/v1/messages/count_tokens", body)
		if code != 200 {
			t.Fatalf("count_tokens %d %s", code, b)
		}
		return decode[anthropic.CountTokensResponse](t, b).InputTokens
	}
	const q = `"messages":[{"role":"user","content":"hi"}]`
	plain, tools := count(`{`+q+`}`), count(`{`+q+`,"tools":[`+anthropicWeatherTool+`]}`)
	if none := count(`{` + q + `,"tools":[` + anthropicWeatherTool + `],"tool_choice":{"type":"none"}}`); tools <= plain+20 || none != plain {
		t.Errorf("count_tokens: plain %d, with tools %d, tool_choice none %d", plain, tools, none)
	}
	if off := count(`{` + q + `,"thinking":{"type":"disabled"}}`); off != plain {
		t.Errorf("thinking off %d tokens, on %d: </think> and <think> are one token each", off, plain)
	}
	// A prefill ends the prompt after the generation prompt, thinking off.
	prompt, err := chat.Render(chat.GLM47, []chat.Message{{Role: "user", Content: "q"}}, chat.Options{AddGenerationPrompt: true, EnableThinking: ptr(false)})
	if err != nil {
		t.Fatal(err)
	}
	ids, _ := byteTokenizer{}.Encode(prompt + "The answer:")
	if n := count(`{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"The answer:"}]}`); n != len(ids) || !strings.HasSuffix(prompt, "<|assistant|></think>") {
		t.Errorf("prefill prompt: %d tokens, want %d (%q + prefill)", n, len(ids), prompt)
	}
	waitFor(t, "engine idle", 5*time.Second, func() bool { return idle(ts.Server) })
}

// sseEvent is one named server-sent event.
type sseEvent struct {
	name string
	data json.RawMessage
}

// readNamedSSE reads an Anthropic event stream and checks its framing: each
// event is "event: NAME", "data: JSON" and a blank line, and NAME equals
// the data's "type".
func readNamedSSE(t testing.TB, body []byte) []sseEvent {
	t.Helper()
	var out []sseEvent
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		name, ok := strings.CutPrefix(sc.Text(), "event: ")
		if !ok {
			t.Fatalf("SSE line %q does not start with \"event: \"", sc.Text())
		}
		if !sc.Scan() {
			t.Fatalf("event %s without data", name)
		}
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || !json.Valid([]byte(data)) {
			t.Fatalf("event %s: bad data line %q", name, sc.Text())
		}
		if !sc.Scan() || sc.Text() != "" {
			t.Fatalf("event %s is not followed by a blank line", name)
		}
		var typ struct{ Type string }
		_ = json.Unmarshal([]byte(data), &typ)
		if typ.Type != name {
			t.Fatalf("event %q carries type %q", name, typ.Type)
		}
		out = append(out, sseEvent{name, json.RawMessage(data)})
	}
	return out
}

// streamEvent is any stream event, decoded.
type streamEvent struct {
	Type         string                 `json:"type"`
	Index        int                    `json:"index"`
	Message      *wireMessage           `json:"message"`
	ContentBlock anthropic.ContentBlock `json:"content_block"`
	Delta        struct {
		Type         string  `json:"type"`
		Text         string  `json:"text"`
		Thinking     string  `json:"thinking"`
		PartialJSON  string  `json:"partial_json"`
		StopReason   *string `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
	} `json:"delta"`
	Usage *anthropic.Usage `json:"usage"`
	Error *struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// assembleStream checks the order of Anthropic's events — message_start,
// ping, then per block start, deltas of the block's kind, stop, then
// message_delta and message_stop — and rebuilds the message they describe.
func assembleStream(t *testing.T, events []sseEvent) wireMessage {
	t.Helper()
	var m wireMessage
	open := -1
	jsonBuf := map[int]string{}
	state := "start"
	for i, raw := range events {
		ev := decode[streamEvent](t, raw.data)
		bad := func() { t.Fatalf("event %d %s in state %s: %s", i, ev.Type, state, raw.data) }
		switch ev.Type {
		case "message_start":
			if state != "start" || ev.Message == nil || ev.Message.StopReason != nil || len(ev.Message.Content) != 0 || ev.Message.Usage.InputTokens == 0 {
				bad()
			}
			m, state = *ev.Message, "blocks"
		case "ping":
			if state == "start" || state == "done" {
				bad()
			}
		case "content_block_start":
			if state != "blocks" || open != -1 || ev.Index != len(m.Content) {
				bad()
			}
			b := ev.ContentBlock
			if (b.Type == "text" && b.Text != "") || (b.Type == "thinking" && b.Thinking != "") || (b.Type == "tool_use" && string(b.Input) != "{}") {
				bad()
			}
			m.Content, open = append(m.Content, b), ev.Index
			if b.Type == "tool_use" {
				m.Content[open].Input = nil
			}
		case "content_block_delta":
			if state != "blocks" || ev.Index != open {
				bad()
			}
			b := &m.Content[open]
			switch {
			case ev.Delta.Type == "text_delta" && b.Type == "text":
				b.Text += ev.Delta.Text
			case ev.Delta.Type == "thinking_delta" && b.Type == "thinking":
				b.Thinking += ev.Delta.Thinking
			case ev.Delta.Type == "input_json_delta" && b.Type == "tool_use":
				jsonBuf[open] += ev.Delta.PartialJSON
			default:
				bad()
			}
		case "content_block_stop":
			if state != "blocks" || ev.Index != open {
				bad()
			}
			if m.Content[open].Type == "tool_use" {
				m.Content[open].Input = json.RawMessage(jsonBuf[open])
			}
			open = -1
		case "message_delta":
			if state != "blocks" || open != -1 || ev.Delta.StopReason == nil || ev.Usage == nil {
				bad()
			}
			m.StopReason, m.StopSequence = ev.Delta.StopReason, ev.Delta.StopSequence
			m.Usage.OutputTokens = ev.Usage.OutputTokens
			state = "delta"
		case "message_stop":
			if state != "delta" || i != len(events)-1 {
				bad()
			}
			state = "done"
		default:
			bad()
		}
	}
	if state != "done" {
		t.Fatalf("stream ended in state %s", state)
	}
	return m
}

// A streamed answer carries the same blocks, stop reason and usage as the
// non-streamed one, in Anthropic's event order.
func TestMessagesStream(t *testing.T) {
	ts := startServer(t, nil)
	for _, tc := range []struct{ name, body string }{
		{"thinking", `"messages":[{"role":"user","content":"SCRIPT:think"}]`},
		{"tool", `"messages":[{"role":"user","content":"SCRIPT:tool"}],"tools":[` + anthropicWeatherTool + `]`},
		{"stop sequence", `"messages":[{"role":"user","content":"SCRIPT:stopme"}],"stop_sequences":["STOP"],"thinking":{"type":"disabled"}`},
		{"max_tokens", `"messages":[{"role":"user","content":"SCRIPT:think"}],"max_tokens":6`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := tc.body
			if !strings.Contains(base, "max_tokens") {
				base += `,"max_tokens":200`
			}
			_, _, whole := ts.post(t, "/v1/messages", "{"+base+"}")
			want := decode[wireMessage](t, whole)
			code, hdr, body := ts.post(t, "/v1/messages", "{"+base+`,"stream":true}`)
			if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("status %d, content type %q: %s", code, hdr.Get("Content-Type"), body)
			}
			got := assembleStream(t, readNamedSSE(t, body))
			if got.ID != "msg_"+hdr.Get(RequestIDHeader) {
				t.Errorf("id %q", got.ID)
			}
			for _, m := range []*wireMessage{&got, &want} {
				m.ID = ""
				for i := range m.Content {
					if m.Content[i].Type == "tool_use" {
						m.Content[i].ID = "*"
					}
				}
			}
			g, _ := json.Marshal(got)
			w, _ := json.Marshal(want)
			if string(g) != string(w) {
				t.Errorf("stream assembles to\n %s\nwhole answer\n %s", g, w)
			}
		})
	}
	waitFor(t, "engine idle", 5*time.Second, func() bool { return idle(ts.Server) })
}

func TestMessagesErrors(t *testing.T) {
	ts := startServer(t, func(o *Options, _ *scriptBackend) { o.MaxBodyBytes = 4096 })
	const msg = `"messages":[{"role":"user","content":"x"}]`
	for _, tc := range []struct {
		name, path, body string
		status           int
		typ, contains    string
	}{
		{"not json", "/v1/messages", `{"max_tokens":`, 400, "invalid_request_error", "invalid JSON"},
		{"max_tokens missing", "/v1/messages", `{` + msg + `}`, 400, "invalid_request_error", "max_tokens: field required"},
		{"image", "/v1/messages", `{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`, 400, "invalid_request_error", "messages.0.content.0.type"},
		{"tool_choice any without tools", "/v1/messages", `{"max_tokens":5,` + msg + `,"tool_choice":{"type":"any"}}`, 400, "invalid_request_error", "needs tools"},
		{"max_tokens beyond context", "/v1/messages", `{"max_tokens":100000,` + msg + `}`, 400, "invalid_request_error", "maximum context length is 2048"},
		{"unknown model", "/v1/messages", `{"model":"claude-x","max_tokens":5,` + msg + `}`, 404, "not_found_error", "does not exist"},
		{"body too large", "/v1/messages", `{"max_tokens":5,"system":"` + strings.Repeat("x", 5000) + `",` + msg + `}`, 413, "request_too_large", "limit of 4096 bytes"},
		{"count_tokens: bad messages", "/v1/messages/count_tokens", `{"messages":[]}`, 400, "invalid_request_error", "messages"},
		{"count_tokens: unknown model", "/v1/messages/count_tokens", `{"model":"claude-x",` + msg + `}`, 404, "not_found_error", "does not exist"},
		{"unknown route under /v1/messages", "/v1/messages/batches", `{}`, 404, "not_found_error", "no route"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, hdr, body := ts.post(t, tc.path, tc.body)
			if code != tc.status || !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") {
				t.Fatalf("status %d, want %d: %s", code, tc.status, body)
			}
			e := decode[anthropic.ErrorResponse](t, body)
			if e.Type != "error" || e.Error.Type != tc.typ || !strings.Contains(e.Error.Message, tc.contains) {
				t.Errorf("error %s, want type %s and message containing %q", body, tc.typ, tc.contains)
			}
		})
	}
	if code, body := ts.get(t, "/v1/messages"); code != 405 || decode[anthropic.ErrorResponse](t, body).Error.Type != "invalid_request_error" {
		t.Errorf("GET /v1/messages: %d %s", code, body)
	}
	waitFor(t, "engine idle", 5*time.Second, func() bool { return idle(ts.Server) })
}

// x-api-key works on every API route (as Authorization: Bearer does); a
// missing or wrong key on /v1/messages is a 401 in Anthropic's shape.
func TestMessagesAPIKey(t *testing.T) {
	ts := startServer(t, func(o *Options, _ *scriptBackend) { o.APIKey = "s3cret" })
	const body = `{"max_tokens":2,"messages":[{"role":"user","content":"x"}]}`
	for _, tc := range []struct {
		hdr  []string
		want int
	}{
		{nil, 401},
		{[]string{"X-Api-Key", "wrong"}, 401},
		{[]string{"X-Api-Key", ""}, 401},
		{[]string{"X-Api-Key", "s3cret"}, 200},
		{[]string{"Authorization", "Bearer s3cret"}, 200},
		{[]string{"Authorization", "Bearer wrong", "X-Api-Key", "s3cret"}, 200},
	} {
		for _, path := range []string{"/v1/messages", "/v1/messages/count_tokens"} {
			code, _, b := ts.post(t, path, body, tc.hdr...)
			if code != tc.want {
				t.Errorf("%s %v: status %d, want %d (%s)", path, tc.hdr, code, tc.want, b)
			}
			if code == 401 {
				e := decode[anthropic.ErrorResponse](t, b)
				if e.Type != "error" || e.Error.Type != "authentication_error" || !strings.Contains(e.Error.Message, "x-api-key") {
					t.Errorf("401 body %s", b)
				}
			}
		}
	}
	if code, _ := ts.get(t, "/v1/models", "X-Api-Key", "s3cret"); code != 200 {
		t.Errorf("x-api-key on /v1/models: %d", code)
	}
}

// A client that disconnects cancels its messages request, streamed or not.
func TestMessagesDisconnectCancels(t *testing.T) {
	ts := startServer(t, func(_ *Options, b *scriptBackend) { b.delay = disconnectStepDelay })
	checkDisconnectCancels(t, ts, "/v1/messages", `{"messages":[{"role":"user","content":"go"}],"max_tokens":400,"stream":%v}`,
		"thinking_delta")
}

// A backend failure mid-stream ends the stream with an Anthropic error
// event; without streaming it is a 500 api_error.
func TestMessagesBackendFailure(t *testing.T) {
	ts := startServer(t, nil)
	ts.backend.failNext.Store(true)
	code, _, body := ts.post(t, "/v1/messages", `{"max_tokens":5,"messages":[{"role":"user","content":"x"}]}`)
	if e := decode[anthropic.ErrorResponse](t, body); code != 500 || e.Error.Type != "api_error" {
		t.Errorf("%d %s", code, body)
	}
	ts.backend.failNext.Store(true)
	code, _, body = ts.post(t, "/v1/messages", `{"max_tokens":5,"stream":true,"messages":[{"role":"user","content":"x"}]}`)
	events := readNamedSSE(t, body)
	last := events[len(events)-1]
	if code != 200 || last.name != "error" || !strings.Contains(string(last.data), `"api_error"`) {
		t.Errorf("stream ended with %s %s", last.name, last.data)
	}
	waitFor(t, "engine idle", 5*time.Second, func() bool { return idle(ts.Server) })
}

// Each messages request logs one line with the token accounting.
func TestMessagesRequestLog(t *testing.T) {
	ts := startServer(t, nil)
	ts.post(t, "/v1/messages", `{"max_tokens":4,"temperature":0,"messages":[{"role":"user","content":"x"}]}`)
	ts.post(t, "/v1/messages/count_tokens", `{"messages":[{"role":"user","content":"x"}]}`)
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(ts.logs.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "request" {
			lines = append(lines, m)
		}
	}
	if len(lines) != 2 {
		t.Fatalf("%d request lines:\n%s", len(lines), ts.logs.String())
	}
	m := lines[0]
	if m["path"] != "/v1/messages" || m["status"] != float64(200) || m["completion_tokens"] != float64(4) || m["finish_reason"] != "max_tokens" ||
		m["prompt_tokens"] == float64(0) || m["ttft_ms"] == nil {
		t.Errorf("messages log line %v", m)
	}
	if lines[1]["path"] != "/v1/messages/count_tokens" || lines[1]["status"] != float64(200) {
		t.Errorf("count_tokens log line %v", lines[1])
	}
}

// TestAnthropicClientScripted runs the official anthropic Python client
// (scripts/anthropic_client_test.py --scripted) against this server on the
// scripted backend, whose "SCRIPT:" prompts make the model think, call a
// tool or hit a stop sequence: the parts a tiny random model cannot show.
// cmd/glmctl's serve test runs the same script against the real glmctl
// serve on the tiny model.
func TestAnthropicClientScripted(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is not installed: this test runs the official anthropic client; run the tests through `make test`, which puts the project's virtual environment (scripts/requirements-test.txt) first on PATH")
	}
	if out, err := exec.Command(py, "-c", "import anthropic").CombinedOutput(); err != nil {
		t.Fatalf("the anthropic Python package is missing from %s: run the tests through `make test` (it installs scripts/requirements-test.txt into $GLMCTL_CACHE/venv and puts it first on PATH) (%v: %s)", py, err, out)
	}
	ts := startServer(t, func(o *Options, b *scriptBackend) {
		o.APIKey = "test-key"
		// So that a stream closed early is still running when the close
		// arrives: its request asks for the rest of the context (~2,000
		// tokens, 10 s at 5 ms a step).
		b.delay = 5 * time.Millisecond
	})
	cmd := exec.Command(py, "../../scripts/anthropic_client_test.py", "--scripted", "--base-url", ts.url, "--api-key", "test-key", "--model", "glm-test")
	out, err := cmd.CombinedOutput()
	t.Logf("anthropic client:\n%s", out)
	if err != nil {
		t.Fatalf("anthropic client test failed: %v", err)
	}
	if !strings.Contains(string(out), " checks passed") || strings.Contains(string(out), "FAIL") {
		t.Errorf("not every check passed")
	}
	waitFor(t, "engine idle", 5*time.Second, func() bool { return idle(ts.Server) })
}

// FuzzMessagesHandler posts bodies to /v1/messages through the real handler:
// the answer is a message or an Anthropic error body, or a stream that ends
// with message_stop (or an error event); never a 5xx.
func FuzzMessagesHandler(f *testing.F) {
	ts := startServer(f, func(_ *Options, b *scriptBackend) { b.maxCtx = 256 })
	for _, s := range []string{
		`{"max_tokens":30,"messages":[{"role":"user","content":"SCRIPT:think"}]}`,
		`{"max_tokens":100,"messages":[{"role":"user","content":"SCRIPT:tool"}],"tools":[` + anthropicWeatherTool + `],"stream":true}`,
		`{"max_tokens":40,"messages":[{"role":"user","content":"SCRIPT:stopme"}],"stop_sequences":["STOP"],"thinking":{"type":"disabled"},"stream":true}`,
		`{"max_tokens":3,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"f","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"1"}]}]}`,
		`{"max_tokens":3,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"pre"}],"stream":true}`,
		`{"max_tokens":100000,"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"other","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`,
		`{"max_tokens":1,"messages":[{"role":"user","content":"x"}],"temperature":"x"}`,
		`{"messages":[null,{}]}`, `[]`,
	} {
		f.Add([]byte(s))
	}
	h := ts.Handler()
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/messages", bytes.NewReader(body)))
		res := rec.Result()
		out := rec.Body.Bytes()
		switch res.StatusCode {
		case http.StatusOK, http.StatusBadRequest, http.StatusNotFound, http.StatusTooManyRequests:
		default:
			t.Fatalf("status %d for %q: %s", res.StatusCode, body, out)
		}
		if strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
			events := readNamedSSE(t, out)
			if last := events[len(events)-1].name; last != "message_stop" && last != "error" {
				t.Fatalf("stream for %q ends with %s", body, last)
			}
			return
		}
		var v struct {
			Type  string          `json:"type"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("body is not a JSON object for %q: %s", body, out)
		}
		if (v.Type == "error") == (res.StatusCode == http.StatusOK) || (v.Type != "error" && v.Type != "message") {
			t.Fatalf("status %d with body %s", res.StatusCode, out)
		}
	})
}
