package server

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/glmctl/glmctl/pkg/server/openai"
)

const responsesWeatherTool = `{"type":"function","name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]},"strict":true}`

// wireResponse is a response object as a client decodes it (the fields the
// tests look at).
type wireResponse struct {
	ID                string          `json:"id"`
	Object            string          `json:"object"`
	CreatedAt         int64           `json:"created_at"`
	Status            string          `json:"status"`
	Error             json.RawMessage `json:"error"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	Instructions    *string           `json:"instructions"`
	MaxOutputTokens *int              `json:"max_output_tokens"`
	Model           string            `json:"model"`
	Output          []wireItem        `json:"output"`
	Temperature     *float64          `json:"temperature"`
	ToolChoice      json.RawMessage   `json:"tool_choice"`
	Tools           []json.RawMessage `json:"tools"`
	Store           bool              `json:"store"`
	Usage           *struct {
		InputTokens        int `json:"input_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		OutputTokens        int `json:"output_tokens"`
		OutputTokensDetails struct {
			ReasoningTokens int `json:"reasoning_tokens"`
		} `json:"output_tokens_details"`
		TotalTokens int `json:"total_tokens"`
	} `json:"usage"`
	Metadata map[string]string `json:"metadata"`
}

// wireItem is an output item as a client decodes it.
type wireItem struct {
	ID      string     `json:"id"`
	Type    string     `json:"type"`
	Status  string     `json:"status"`
	Role    string     `json:"role,omitempty"`
	Content []wirePart `json:"content,omitempty"`
	CallID  string     `json:"call_id,omitempty"`
	Name    string     `json:"name,omitempty"`
	Args    string     `json:"arguments,omitempty"`
}

type wirePart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// summary is the output without ids, as compact JSON: what the tests
// compare.
func (r wireResponse) summary(t *testing.T) string {
	t.Helper()
	items := make([]wireItem, len(r.Output))
	for i, it := range r.Output {
		prefix := map[string]string{"message": "msg_", "reasoning": "rs_", "function_call": "fc_"}[it.Type]
		if !strings.HasPrefix(it.ID, prefix) || (it.Type == "function_call" && !strings.HasPrefix(it.CallID, "call_")) {
			t.Errorf("item %d: %s id %q call_id %q", i, it.Type, it.ID, it.CallID)
		}
		it.ID = ""
		if it.CallID != "" {
			it.CallID = "*"
		}
		items[i] = it
	}
	b, _ := json.Marshal(items)
	return string(b)
}

func TestResponses(t *testing.T) {
	ts := startServer(t, nil)
	cases := []struct {
		name      string
		body      string
		want      string // the output, without ids
		status    string
		output    int // output tokens, when fixed
		reasoning int // reasoning tokens: those that wrote the reasoning text
	}{
		{"string input, thinking on by default", `{"model":"glm-test","input":"SCRIPT:think"}`,
			`[{"id":"","type":"reasoning","status":"completed","content":[{"type":"reasoning_text","text":"Let me think."}]},` +
				`{"id":"","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hello!"}]}]`,
			"completed", 21, 13},
		{"reasoning effort none: the answer only", `{"instructions":"Be brief.","reasoning":{"effort":"none"},"input":"SCRIPT:plain"}`,
			`[{"id":"","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Just an answer."}]}]`,
			"completed", 16, 0},
		{"content parts are joined as the chat template joins them", `{"reasoning":{"effort":"none"},"input":[
			{"type":"message","role":"developer","content":[{"type":"input_text","text":"Be brief."}]},
			{"role":"user","content":[{"type":"input_text","text":"SCRIPT:"},{"type":"input_text","text":"plain"}]}]}`,
			`[{"id":"","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Just an answer."}]}]`,
			"completed", 16, 0},
		{"function call", `{"tools":[` + responsesWeatherTool + `],"tool_choice":"auto","reasoning":{"effort":"high"},
			"input":[{"role":"user","content":[{"type":"input_text","text":"SCRIPT:tool"}]}]}`,
			`[{"id":"","type":"reasoning","status":"completed","content":[{"type":"reasoning_text","text":"I should call it."}]},` +
				`{"id":"","type":"function_call","status":"completed","call_id":"*","name":"get_weather","arguments":"{\"city\":\"Paris\",\"days\":3}"}]`,
			"completed", 54, 17},
		{"max_output_tokens: incomplete", `{"max_output_tokens":3,"input":"SCRIPT:think"}`,
			`[{"id":"","type":"reasoning","status":"incomplete","content":[{"type":"reasoning_text","text":"Let"}]}]`,
			"incomplete", 3, 3},
		{"a function call round trip", `{"reasoning":{"effort":"none"},"tools":[` + responsesWeatherTool + `],"input":[
			{"role":"user","content":"weather?"},
			{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"hm"}]},
			{"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
			{"type":"function_call_output","call_id":"call_1","output":"21C"},
			{"role":"user","content":"SCRIPT:plain"}]}`,
			`[{"id":"","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Just an answer."}]}]`,
			"completed", 16, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, hdr, body := ts.post(t, "/v1/responses", tc.body)
			if code != http.StatusOK || !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") {
				t.Fatalf("status %d: %s", code, body)
			}
			r := decode[wireResponse](t, body)
			if r.ID != "resp_"+hdr.Get(RequestIDHeader) || r.Object != "response" || r.Model != "glm-test" || r.Store || time.Since(time.Unix(r.CreatedAt, 0)) > time.Minute {
				t.Errorf("shape: %s", body)
			}
			if got := r.summary(t); got != tc.want {
				t.Errorf("output %s\n  want %s", got, tc.want)
			}
			if r.Status != tc.status || (tc.status == "incomplete") != (r.IncompleteDetails != nil && r.IncompleteDetails.Reason == "max_output_tokens") {
				t.Errorf("status %q, incomplete_details %+v", r.Status, r.IncompleteDetails)
			}
			u := r.Usage
			if u == nil || u.InputTokens == 0 || u.OutputTokens == 0 || u.TotalTokens != u.InputTokens+u.OutputTokens ||
				(tc.output > 0 && (u.OutputTokens != tc.output || u.OutputTokensDetails.ReasoningTokens != tc.reasoning)) {
				t.Errorf("usage %+v", u)
			}
		})
	}
	// What the response repeats of the request.
	_, _, body := ts.post(t, "/v1/responses", `{"instructions":"Be brief.","max_output_tokens":2,"temperature":0,"metadata":{"k":"v"},"tools":[`+responsesWeatherTool+`],"tool_choice":"none","input":"x"}`)
	r := decode[wireResponse](t, body)
	if deref(r.Instructions) != "Be brief." || r.MaxOutputTokens == nil || *r.MaxOutputTokens != 2 || r.Temperature == nil || *r.Temperature != 0 ||
		r.Metadata["k"] != "v" || string(r.ToolChoice) != `"none"` || len(r.Tools) != 1 || string(r.Error) != "null" {
		t.Errorf("echo: %s", body)
	}
	waitFor(t, "engine idle", 5*time.Second, func() bool { return idle(ts.Server) })
}

// A Responses request renders the same prompt as the chat completions
// request that says the same: the same system text, turns, reasoning,
// tool calls, tool results and tools.
func TestResponsesPromptMatchesChat(t *testing.T) {
	ts := startServer(t, nil)
	const chatTool = `{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}}`
	for _, tc := range []struct{ name, responses, chat string }{
		{"instructions and a question",
			`{"instructions":"Be brief.","input":"hi","max_output_tokens":1}`,
			`{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}],"max_tokens":1}`},
		{"thinking off",
			`{"reasoning":{"effort":"none"},"input":"hi","max_output_tokens":1}`,
			`{"chat_template_kwargs":{"enable_thinking":false},"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`},
		{"a tool round trip",
			`{"tools":[` + responsesWeatherTool + `],"max_output_tokens":1,"input":[{"role":"developer","content":"dev"},{"role":"user","content":"weather?"},
				{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"hm"}]},
				{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Let me look."}]},
				{"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
				{"type":"function_call_output","call_id":"call_1","output":"21C"}]}`,
			`{"tools":[` + chatTool + `],"max_tokens":1,"messages":[{"role":"developer","content":"dev"},{"role":"user","content":"weather?"},
				{"role":"assistant","reasoning_content":"hm","content":"Let me look.","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
				{"role":"tool","tool_call_id":"call_1","content":"21C"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, rb := ts.post(t, "/v1/responses", tc.responses)
			code2, _, cb := ts.post(t, "/v1/chat/completions", tc.chat)
			if code != 200 || code2 != 200 {
				t.Fatalf("%d %s / %d %s", code, rb, code2, cb)
			}
			r, c := decode[wireResponse](t, rb), decode[openai.ChatCompletion](t, cb)
			if r.Usage.InputTokens != c.Usage.PromptTokens {
				t.Errorf("responses prompt %d tokens, chat %d", r.Usage.InputTokens, c.Usage.PromptTokens)
			}
		})
	}
}

// responsesStream reads a Responses event stream: each event is
// "event: TYPE", "data: JSON" with that type, and a blank line; sequence
// numbers count from 0.
func responsesStream(t testing.TB, body []byte) []sseEvent {
	t.Helper()
	events := readNamedSSE(t, body)
	for i, e := range events {
		var h struct {
			SequenceNumber *int `json:"sequence_number"`
		}
		if err := json.Unmarshal(e.data, &h); err != nil || h.SequenceNumber == nil || *h.SequenceNumber != i {
			t.Fatalf("event %d (%s) has sequence_number %v", i, e.name, h.SequenceNumber)
		}
	}
	return events
}

// responsesEvent is any Responses stream event, decoded.
type responsesEvent struct {
	Type         string        `json:"type"`
	Response     *wireResponse `json:"response"`
	OutputIndex  int           `json:"output_index"`
	ContentIndex int           `json:"content_index"`
	ItemID       string        `json:"item_id"`
	Item         *wireItem     `json:"item"`
	Part         *wirePart     `json:"part"`
	Delta        string        `json:"delta"`
	Text         string        `json:"text"`
	Arguments    string        `json:"arguments"`
}

// assembleResponsesStream checks the order of the Responses events —
// response.created, response.in_progress, then per item output_item.added,
// (content_part.added, deltas of the item's kind, text done, content_part.done
// | function_call_arguments.delta and .done), output_item.done, then
// response.completed or response.incomplete — and returns the final
// response, whose output must equal the items the events built.
func assembleResponsesStream(t *testing.T, events []sseEvent) wireResponse {
	t.Helper()
	var items []wireItem
	var id string
	state := "start"
	for i, raw := range events {
		ev := decode[responsesEvent](t, raw.data)
		bad := func() { t.Fatalf("event %d %s in state %s: %s", i, ev.Type, state, raw.data) }
		cur := func() *wireItem {
			if len(items) == 0 || ev.OutputIndex != len(items)-1 || (ev.ItemID != "" && ev.ItemID != items[len(items)-1].ID) || ev.ContentIndex != 0 {
				bad()
			}
			return &items[len(items)-1]
		}
		switch ev.Type {
		case "response.created", "response.in_progress":
			if (ev.Type == "response.created") != (state == "start") || (state != "start" && state != "created") || ev.Response == nil ||
				ev.Response.Status != "in_progress" || len(ev.Response.Output) != 0 || ev.Response.Usage != nil {
				bad()
			}
			if id != "" && ev.Response.ID != id {
				bad()
			}
			id, state = ev.Response.ID, map[string]string{"response.created": "created", "response.in_progress": "items"}[ev.Type]
		case "response.output_item.added":
			it := ev.Item
			if state != "items" || it == nil || ev.OutputIndex != len(items) || it.Status != "in_progress" || len(it.Content) != 0 || it.Args != "" {
				bad()
			}
			items = append(items, *it)
			state = map[string]string{"message": "part", "reasoning": "part", "function_call": "args"}[it.Type]
		case "response.content_part.added":
			it := cur()
			want := map[string]string{"message": "output_text", "reasoning": "reasoning_text"}[it.Type]
			if state != "part" || ev.Part == nil || ev.Part.Type != want || ev.Part.Text != "" {
				bad()
			}
			it.Content, state = []wirePart{*ev.Part}, "text"
		case "response.output_text.delta", "response.reasoning_text.delta":
			it := cur()
			if state != "text" || (it.Type == "message") != (ev.Type == "response.output_text.delta") {
				bad()
			}
			it.Content[0].Text += ev.Delta
		case "response.output_text.done", "response.reasoning_text.done":
			it := cur()
			if state != "text" || (it.Type == "message") != (ev.Type == "response.output_text.done") || ev.Text != it.Content[0].Text {
				bad()
			}
			state = "text done"
		case "response.content_part.done":
			it := cur()
			if state != "text done" || ev.Part == nil || *ev.Part != it.Content[0] {
				bad()
			}
			state = "item done"
		case "response.function_call_arguments.delta":
			it := cur()
			if state != "args" || it.Type != "function_call" {
				bad()
			}
			it.Args += ev.Delta
		case "response.function_call_arguments.done":
			it := cur()
			if state != "args" || ev.Arguments != it.Args {
				bad()
			}
			state = "item done"
		case "response.output_item.done":
			it := cur()
			built, _ := json.Marshal(*it)
			it.Status = ev.Item.Status
			done, _ := json.Marshal(*ev.Item)
			if b, _ := json.Marshal(*it); state != "item done" || string(b) != string(done) || ev.Item.Status == "in_progress" {
				t.Fatalf("event %d: item done %s, the events built %s", i, done, built)
			}
			state = "items"
		case "response.completed", "response.incomplete":
			r := ev.Response
			if state != "items" || i != len(events)-1 || r == nil || r.ID != id || r.Status != strings.TrimPrefix(ev.Type, "response.") || r.Usage == nil {
				bad()
			}
			got, _ := json.Marshal(items)
			want, _ := json.Marshal(r.Output)
			if string(got) != string(want) {
				t.Fatalf("the events built %s\nthe final response holds %s", got, want)
			}
			return *r
		default:
			bad()
		}
	}
	t.Fatalf("stream ended in state %s", state)
	return wireResponse{}
}

// A streamed answer builds the same output, status and usage as the
// non-streamed one, in OpenAI's event order.
func TestResponsesStream(t *testing.T) {
	ts := startServer(t, nil)
	for _, tc := range []struct{ name, body string }{
		{"thinking", `"input":"SCRIPT:think"`},
		{"function call", `"input":"SCRIPT:tool","tools":[` + responsesWeatherTool + `]`},
		{"no thinking", `"input":"SCRIPT:plain","reasoning":{"effort":"none"}`},
		{"max_output_tokens", `"input":"SCRIPT:think","max_output_tokens":16`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, whole := ts.post(t, "/v1/responses", "{"+tc.body+"}")
			want := decode[wireResponse](t, whole)
			code, hdr, body := ts.post(t, "/v1/responses", "{"+tc.body+`,"stream":true}`)
			if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("status %d, content type %q: %s", code, hdr.Get("Content-Type"), body)
			}
			got := assembleResponsesStream(t, responsesStream(t, body))
			if got.ID != "resp_"+hdr.Get(RequestIDHeader) {
				t.Errorf("id %q", got.ID)
			}
			if g, w := got.summary(t), want.summary(t); g != w || got.Status != want.Status || *got.Usage != *want.Usage {
				t.Errorf("stream: %s %s %+v\nwhole:  %s %s %+v", got.Status, g, *got.Usage, want.Status, w, *want.Usage)
			}
		})
	}
	waitFor(t, "engine idle", 5*time.Second, func() bool { return idle(ts.Server) })
}

func TestResponsesErrors(t *testing.T) {
	ts := startServer(t, func(o *Options, _ *scriptBackend) { o.MaxBodyBytes = 4096 })
	for _, tc := range []struct {
		name, body      string
		status          int
		typ, param, has string
	}{
		{"not json", `{"input":`, 400, "invalid_request_error", "", "invalid JSON"},
		{"input missing", `{"model":"glm-test"}`, 400, "invalid_request_error", "input", "field required"},
		{"input wrong type", `{"input":{"role":"user"}}`, 400, "invalid_request_error", "input", "string or an array"},
		{"temperature wrong type", `{"input":"x","temperature":"hot"}`, 400, "invalid_request_error", "temperature", "number"},
		{"unknown item type", `{"input":[{"type":"computer_call_output","call_id":"c"}]}`, 400, "invalid_request_error", "input[0].type", "not supported"},
		{"image", `{"input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]}`, 400, "invalid_request_error", "input[0].content[0].type", "text only"},
		{"store true", `{"input":"x","store":true}`, 400, "invalid_request_error", "store", "stores no responses"},
		{"previous_response_id", `{"input":"x","previous_response_id":"resp_1"}`, 400, "invalid_request_error", "previous_response_id", "not supported"},
		{"hosted tool", `{"input":"x","tools":[{"type":"file_search","vector_store_ids":["v"]}]}`, 400, "invalid_request_error", "tools[0].type", "hosted tools"},
		{"tool_choice required without tools", `{"input":"x","tool_choice":"required"}`, 400, "invalid_request_error", "tool_choice", "needs tools"},
		{"structured output without a grammar vocabulary", `{"input":"x","text":{"format":{"type":"json_schema","name":"x","schema":{}}}}`, 400, "invalid_request_error", "text.format.schema", "structured outputs are not available"},
		{"max_output_tokens beyond context", `{"input":"x","max_output_tokens":100000}`, 400, "invalid_request_error", "max_output_tokens", "maximum context length is 2048"},
		{"unknown model", `{"model":"gpt-x","input":"x"}`, 404, "invalid_request_error", "model", "does not exist"},
		{"body too large", `{"input":"` + strings.Repeat("x", 5000) + `"}`, 413, "invalid_request_error", "", "limit of 4096 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, hdr, body := ts.post(t, "/v1/responses", tc.body)
			if code != tc.status || !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") {
				t.Fatalf("status %d, want %d: %s", code, tc.status, body)
			}
			var e struct {
				Error *struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    *string `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil || e.Error == nil {
				t.Fatalf("not an OpenAI error body: %s", body)
			}
			if e.Error.Type != tc.typ || deref(e.Error.Param) != tc.param || !strings.Contains(e.Error.Message, tc.has) {
				t.Errorf("error %s, want type %s, param %q, message containing %q", body, tc.typ, tc.param, tc.has)
			}
		})
	}
	for _, method := range []string{http.MethodGet, http.MethodDelete} {
		req, _ := http.NewRequest(method, ts.url+"/v1/responses", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
			t.Errorf("%s /v1/responses: %d, Allow %q", method, resp.StatusCode, resp.Header.Get("Allow"))
		}
	}
	if code, body := ts.get(t, "/v1/responses/resp_1"); code != 404 || !strings.Contains(string(body), "no route") {
		t.Errorf("GET /v1/responses/resp_1: %d %s", code, body)
	}
	waitFor(t, "engine idle", 5*time.Second, func() bool { return idle(ts.Server) })
}

// A client that disconnects cancels its Responses request, streamed or not.
func TestResponsesDisconnectCancels(t *testing.T) {
	ts := startServer(t, func(_ *Options, b *scriptBackend) { b.delay = disconnectStepDelay })
	checkDisconnectCancels(t, ts, "/v1/responses", `{"input":"go","max_output_tokens":400,"stream":%v}`,
		"response.reasoning_text.delta")
}

// A backend failure is a 500 server_error; mid-stream, the open item is
// closed as incomplete and the stream ends with response.failed carrying
// the error.
func TestResponsesBackendFailure(t *testing.T) {
	ts := startServer(t, func(_ *Options, b *scriptBackend) { b.delay = 5 * time.Millisecond })
	ts.backend.failNext.Store(true)
	code, _, body := ts.post(t, "/v1/responses", `{"max_output_tokens":5,"input":"x"}`)
	if e := decode[openai.ErrorResponse](t, body); code != 500 || e.Error.Type != "server_error" {
		t.Errorf("%d %s", code, body)
	}
	// Fail a step once a few tokens of reasoning were sent.
	type result struct {
		code int
		body []byte
		err  error
	}
	done := make(chan result, 1)
	steps := ts.backend.steps.Load()
	go func() {
		resp, err := http.Post(ts.url+"/v1/responses", "application/json", strings.NewReader(`{"max_output_tokens":200,"stream":true,"input":"x"}`))
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		done <- result{resp.StatusCode, b, err}
	}()
	waitFor(t, "a few tokens", 10*time.Second, func() bool { return ts.backend.steps.Load() > steps+4 })
	ts.backend.failNext.Store(true)
	res := <-done
	if res.err != nil || res.code != 200 {
		t.Fatalf("%d %v", res.code, res.err)
	}
	events := responsesStream(t, res.body)
	last := decode[responsesEvent](t, events[len(events)-1].data)
	if last.Type != "response.failed" || last.Response == nil || last.Response.Status != "failed" ||
		!strings.Contains(string(last.Response.Error), `"code":"server_error"`) || !strings.Contains(string(last.Response.Error), "injected backend failure") {
		t.Errorf("stream ended with %s", events[len(events)-1].data)
	}
	if prev := decode[responsesEvent](t, events[len(events)-2].data); prev.Type != "response.output_item.done" || prev.Item.Status != "incomplete" {
		t.Errorf("the open item was not closed as incomplete: %s", events[len(events)-2].data)
	}
	waitFor(t, "engine idle", 5*time.Second, func() bool { return idle(ts.Server) })
}

// Each Responses request logs one line with the token accounting.
func TestResponsesRequestLog(t *testing.T) {
	ts := startServer(t, nil)
	ts.post(t, "/v1/responses", `{"max_output_tokens":4,"temperature":0,"input":"x"}`)
	ts.post(t, "/v1/responses", `{"stream":true,"tools":[`+responsesWeatherTool+`],"input":"SCRIPT:tool"}`)
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
	for i, want := range []struct {
		stream bool
		finish string
	}{{false, "length"}, {true, "tool_calls"}} {
		m := lines[i]
		if m["path"] != "/v1/responses" || m["status"] != float64(200) || m["stream"] != want.stream || m["finish_reason"] != want.finish ||
			m["prompt_tokens"] == float64(0) || m["completion_tokens"] == float64(0) || m["ttft_ms"] == nil {
			t.Errorf("log line %d: %v", i, m)
		}
	}
}

// TestOpenAIResponsesClientScripted runs the official openai Python client
// (scripts/openai_responses_client_test.py --scripted) against this server
// on the scripted backend, whose "SCRIPT:" prompts make the model think,
// call a function or answer plainly: the parts a tiny random model cannot
// show. cmd/glmctl's serve test runs the same script against the real
// glmctl serve on the tiny model.
func TestOpenAIResponsesClientScripted(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is not installed: this test runs the official openai client; run the tests through `make test`, which puts the project's virtual environment (scripts/requirements-test.txt) first on PATH")
	}
	if out, err := exec.Command(py, "-c", "import openai").CombinedOutput(); err != nil {
		t.Fatalf("the openai Python package is missing from %s: run the tests through `make test` (it installs scripts/requirements-test.txt into $GLMCTL_CACHE/venv and puts it first on PATH) (%v: %s)", py, err, out)
	}
	ts := startServer(t, func(o *Options, b *scriptBackend) {
		o.APIKey = "test-key"
		// So that a stream closed early is still running when the close
		// arrives: its request asks for the rest of the context (~2,000
		// tokens, 10 s at 5 ms a step).
		b.delay = 5 * time.Millisecond
	})
	cmd := exec.Command(py, "../../scripts/openai_responses_client_test.py", "--scripted", "--base-url", ts.url, "--api-key", "test-key", "--model", "glm-test")
	out, err := cmd.CombinedOutput()
	t.Logf("openai client (Responses API):\n%s", out)
	if err != nil {
		t.Fatalf("openai Responses client test failed: %v\nserver log:\n%s", err, ts.logs.String())
	}
	if !strings.Contains(string(out), " checks passed") || strings.Contains(string(out), "FAIL") {
		t.Errorf("not every check passed")
	}
	waitFor(t, "engine idle", 5*time.Second, func() bool { return idle(ts.Server) })
}

// FuzzResponsesHandler posts bodies to /v1/responses through the real
// handler: the answer is a response or an OpenAI error body, or a stream
// that ends with response.completed, response.incomplete or
// response.failed; never a 5xx.
func FuzzResponsesHandler(f *testing.F) {
	ts := startServer(f, func(_ *Options, b *scriptBackend) { b.maxCtx = 256 })
	for _, s := range []string{
		`{"input":"SCRIPT:think","max_output_tokens":30}`,
		`{"input":"SCRIPT:tool","tools":[` + responsesWeatherTool + `],"stream":true}`,
		`{"input":[{"role":"user","content":[{"type":"input_text","text":"SCRIPT:plain"}]}],"reasoning":{"effort":"none"},"stream":true}`,
		`{"input":[{"type":"function_call","call_id":"a","name":"f","arguments":"{\"a\":1}"},{"type":"function_call_output","call_id":"a","output":"1"}],"max_output_tokens":3}`,
		`{"input":"x","max_output_tokens":100000}`,
		`{"model":"other","input":"x"}`,
		`{"input":"x","temperature":"x"}`,
		`{"input":[null,{}]}`, `[]`, `{"input":"x","store":true}`,
	} {
		f.Add([]byte(s))
	}
	h := ts.Handler()
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/responses", bytes.NewReader(body)))
		res := rec.Result()
		out := rec.Body.Bytes()
		switch res.StatusCode {
		case http.StatusOK, http.StatusBadRequest, http.StatusNotFound, http.StatusTooManyRequests:
		default:
			t.Fatalf("status %d for %q: %s", res.StatusCode, body, out)
		}
		if strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
			events := responsesStream(t, out)
			switch last := events[len(events)-1].name; last {
			case "response.completed", "response.incomplete", "response.failed":
			default:
				t.Fatalf("stream for %q ends with %s", body, last)
			}
			return
		}
		var v struct {
			Object string          `json:"object"`
			Error  json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("body is not a JSON object for %q: %s", body, out)
		}
		if ok := res.StatusCode == http.StatusOK; ok != (v.Object == "response") || ok == (len(v.Error) > 0 && string(v.Error) != "null") {
			t.Fatalf("status %d with body %s", res.StatusCode, out)
		}
	})
}
