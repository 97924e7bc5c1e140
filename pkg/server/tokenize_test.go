package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/glmctl/glmctl/pkg/server/openai"
)

// /tokenize and /detokenize in vLLM's shapes, through the served handlers
// (the byte tokenizer: one id per byte, GLM markers as their own ids).
func TestTokenizeDetokenize(t *testing.T) {
	ts := startServer(t, func(o *Options, _ *scriptBackend) { o.APIKey = "k" })
	auth := []string{"Authorization", "Bearer k"}

	code, _, body := ts.post(t, "/tokenize", `{"model":"glm-test","prompt":"hi<|user|>"}`, auth...)
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	tr := decode[openai.TokenizeResponse](t, body)
	if want := []int32{'h', 'i', fakeUser}; !equalIDs(tr.Tokens, want) || tr.Count != 3 || tr.MaxModelLen != ts.lim.MaxModelLen || tr.MaxModelLen <= 0 {
		t.Fatalf("tokenize: %s", body)
	}

	// The chat shape renders the template: with the generation prompt the
	// ids end with <|assistant|>, without it they do not.
	withGen := decode[openai.TokenizeResponse](t, mustPost(t, ts, "/tokenize", `{"messages":[{"role":"user","content":"hey"}]}`, auth...))
	noGen := decode[openai.TokenizeResponse](t, mustPost(t, ts, "/tokenize", `{"messages":[{"role":"user","content":"hey"}],"add_generation_prompt":false,"return_token_strs":true}`, auth...))
	if withGen.Count <= noGen.Count || !strings.Contains(byteTokenizer{}.decode(withGen.Tokens, false), "<|assistant|>") ||
		strings.Contains(byteTokenizer{}.decode(noGen.Tokens, false), "<|assistant|>") {
		t.Fatalf("chat tokenize: with generation prompt %v, without %v", withGen.Tokens, noGen.Tokens)
	}
	if len(noGen.TokenStrs) != noGen.Count || noGen.TokenStrs[0] != "[gMASK]" {
		t.Errorf("token_strs %q", noGen.TokenStrs)
	}

	// Detokenize is the inverse, special tokens kept.
	code, _, body = ts.post(t, "/detokenize", `{"tokens":[104,105,260]}`, auth...)
	if code != http.StatusOK || decode[openai.DetokenizeResponse](t, body).Prompt != "hi" {
		// byteTokenizer has no SpecialDecoder: Decode drops <|user|>.
		t.Fatalf("detokenize: %d %s", code, body)
	}

	for _, tc := range []struct{ path, body, param, msg string }{
		{"/tokenize", `{}`, "prompt", "prompt (a string) or messages is required"},
		{"/tokenize", `{"prompt":"a","messages":[{"role":"user","content":"b"}]}`, "messages", "not both"},
		{"/tokenize", `{"prompt":[1,2]}`, "prompt", "expected a string"},
		{"/tokenize", `{"messages":[]}`, "messages", "must not be empty"},
		{"/tokenize", `{"messages":[{"role":"user","content":5}]}`, "messages[0].content", "messages[0].content"},
		{"/tokenize", `{"prompt":"a","add_generation_prompt":true}`, "add_generation_prompt", "applies to messages"},
		{"/tokenize", `{"model":"other","prompt":"a"}`, "model", "does not exist"},
		{"/tokenize", `[1]`, "", "JSON object"},
		{"/detokenize", `{}`, "tokens", "tokens (an array of token ids) is required"},
		{"/detokenize", `{"tokens":"abc"}`, "tokens", "array of integer token ids"},
		{"/detokenize", `{"tokens":[1,-2]}`, "tokens", "tokens[1]: token id -2 is out of range"},
		{"/detokenize", `{"tokens":[1,300]}`, "tokens", "tokens[1]: token id 300 is outside the vocabulary (size 300)"},
	} {
		code, _, body := ts.post(t, tc.path, tc.body, auth...)
		want := http.StatusBadRequest
		if tc.param == "model" {
			want = http.StatusNotFound
		}
		e := decode[openai.ErrorResponse](t, body)
		if code != want || !strings.Contains(e.Error.Message, tc.msg) || (tc.param != "" && (e.Error.Param == nil || *e.Error.Param != tc.param)) {
			t.Errorf("%s %s: status %d, body %s; want %d naming %q with %q", tc.path, tc.body, code, body, want, tc.param, tc.msg)
		}
	}

	// The API key guards both; without it: 401.
	if code, _, _ := ts.post(t, "/tokenize", `{"prompt":"a"}`); code != http.StatusUnauthorized {
		t.Errorf("tokenize without the key: %d", code)
	}
	if code, _, _ := ts.post(t, "/detokenize", `{"tokens":[1]}`); code != http.StatusUnauthorized {
		t.Errorf("detokenize without the key: %d", code)
	}
	if code, _ := ts.get(t, "/tokenize", auth...); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /tokenize: %d", code)
	}
}

func mustPost(t *testing.T, ts *testServer, path, body string, hdr ...string) []byte {
	t.Helper()
	code, _, b := ts.post(t, path, body, hdr...)
	if code != http.StatusOK {
		t.Fatalf("%s %s: %d %s", path, body, code, b)
	}
	return b
}

func equalIDs(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// /health is 200 while ready and 503 before the engine runs or once it
// drains; /version reports the options' version and commit. Both stay open
// with an API key.
func TestHealthAndVersion(t *testing.T) {
	ts := startServer(t, func(o *Options, _ *scriptBackend) { o.APIKey = "k"; o.Version = "1.2.3"; o.Commit = "abc123" })
	if code, body := ts.get(t, "/health"); code != http.StatusOK || len(body) != 0 {
		t.Fatalf("/health while serving: %d %q", code, body)
	}
	code, body := ts.get(t, "/version")
	if v := decode[openai.VersionResponse](t, body); code != http.StatusOK || v.Version != "1.2.3" || v.Commit != "abc123" {
		t.Fatalf("/version: %d %s", code, body)
	}
	ts.draining.Store(true)
	if code, body := ts.get(t, "/health"); code != http.StatusServiceUnavailable || !strings.Contains(string(body), "shutting down") {
		t.Errorf("/health while draining: %d %q", code, body)
	}
	ts.draining.Store(false)

	// A server whose engine never started (Serve not called): 503, and
	// /version says "dev" when no version is set.
	s, err := New(Options{Backend: &scriptBackend{numBlocks: 64, maxCtx: 256}, Tokenizer: byteTokenizer{}, ModelName: "m"})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/health", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "engine not running") {
		t.Errorf("/health before Serve: %d %q", rec.Code, rec.Body.String())
	}
	rec = httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/version", nil))
	if v := decode[openai.VersionResponse](t, rec.Body.Bytes()); v.Version != "dev" || v.Commit != "" {
		t.Errorf("/version without a version: %s", rec.Body.String())
	}
}
