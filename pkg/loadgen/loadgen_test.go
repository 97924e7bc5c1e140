package loadgen

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeServer answers /v1/models and streams completions; behave picks what
// request n (counted from 0) gets. It has no /tokenize.
func fakeServer(t *testing.T, behave func(n int64, w http.ResponseWriter, r *http.Request)) *httptest.Server {
	t.Helper()
	var n atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `{"object":"list","data":[{"id":"fake-model"}]}`)
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // so that the server notices a client that hangs up
		behave(n.Add(1)-1, w, r)
	})
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return ts
}

// streamOK writes tokens chunks of one character, then usage when asked.
func streamOK(w http.ResponseWriter, tokens int, usage bool) {
	w.Header().Set("Content-Type", "text/event-stream")
	f := w.(http.Flusher)
	for i := range tokens {
		fin := "null"
		if i == tokens-1 {
			fin = `"length"`
		}
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"x\",\"finish_reason\":%s}]}\n\n", fin)
		f.Flush()
		time.Sleep(time.Millisecond)
	}
	if usage {
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":%d}}\n\n", tokens)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func baseConfig(url string) Config {
	return Config{URL: url, Endpoint: EndpointCompletions, Concurrency: []int{2}, Requests: 8, Warmup: 0,
		InputLen: 4, OutputLen: 4, Timeout: 5 * time.Second, KeepRecords: true}
}

// 500s, dropped streams and error events are failures by kind; the rest
// are measured.
func TestFailuresCounted(t *testing.T) {
	ts := fakeServer(t, func(n int64, w http.ResponseWriter, _ *http.Request) {
		switch n % 4 {
		case 0:
			streamOK(w, 4, true)
		case 1:
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, `{"error":{"message":"boom","type":"server_error"}}`)
		case 2: // one chunk, then the connection drops
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"x\"}]}\n\n")
			w.(http.Flusher).Flush()
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
		case 3:
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"x\"}]}\n\ndata: {\"error\":{\"message\":\"non-finite logits\"}}\n\ndata: [DONE]\n\n")
		}
	})
	rep, err := Run(context.Background(), baseConfig(ts.URL+"/v1"))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Header.Model != "fake-model" || !strings.Contains(rep.Header.Tokenizer, "none") {
		t.Errorf("header %+v", rep.Header)
	}
	r := rep.Runs[0]
	if r.Requests != 8 || r.Completed != 2 || r.Failed != 6 || r.Failures["http_500"] != 2 || r.Failures[FailStream] != 4 {
		t.Fatalf("run %+v", r.Stats)
	}
	if r.OutputTokens != 8 || r.PromptTokens != 6 || !(r.TTFTMs.P50 > 0) || !(r.TPOTMs.P50 > 0) || len(r.Records) != 8 {
		t.Errorf("measured %+v", r.Stats)
	}
	msgs := map[string]bool{}
	for _, rec := range r.Records {
		msgs[rec.Error] = true
	}
	for _, want := range []string{"HTTP 500: boom", "error event: non-finite logits"} {
		if !msgs[want] {
			t.Errorf("no record with error %q: %v", want, msgs)
		}
	}
	notes := strings.Join(rep.Notes(), "\n")
	if !strings.Contains(notes, "6 failed (stream_error 4, http_500 2); first: ") {
		t.Errorf("notes %q", notes)
	}
}

// Without usage the output tokens are the counted chunks; a request past
// --request-timeout is a timeout; an empty stream is "empty".
func TestCountedChunksTimeoutEmpty(t *testing.T) {
	ts := fakeServer(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		switch n % 3 {
		case 0:
			streamOK(w, 5, false)
		case 1:
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		case 2:
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
		}
	})
	cfg := baseConfig(ts.URL)
	cfg.Requests, cfg.Concurrency, cfg.Timeout = 3, []int{3}, 300*time.Millisecond
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Runs[0]
	if r.Completed != 1 || r.Failures[FailTimeout] != 1 || r.Failures[FailEmpty] != 1 || r.OutputTokens != 5 || !r.OutputCounted {
		t.Fatalf("run %+v", r.Stats)
	}
	if !strings.Contains(strings.Join(rep.Notes(), "\n"), "counted SSE chunks") {
		t.Errorf("notes %q", rep.Notes())
	}
}

// Every warm-up request failing stops the session with the first error.
func TestWarmupAllFail(t *testing.T) {
	ts := fakeServer(t, func(_ int64, w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":{"message":"model not loaded"}}`, http.StatusServiceUnavailable)
	})
	cfg := baseConfig(ts.URL)
	cfg.Warmup = 1
	if _, err := Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "every warm-up request failed; first: HTTP 503: model not loaded") {
		t.Fatalf("err %v", err)
	}
}

// An interrupt ends the session: what finished is reported, the cut-off
// requests are counted apart, and Run returns the context's error.
func TestInterrupt(t *testing.T) {
	ts := fakeServer(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		if n < 2 {
			streamOK(w, 3, true)
			return
		}
		<-r.Context().Done()
	})
	ctx, cancel := context.WithCancel(context.Background())
	cfg := baseConfig(ts.URL)
	cfg.Concurrency = []int{2, 4}
	cfg.Progress = &cancelAfter{n: 2, cancel: cancel}
	rep, err := Run(ctx, cfg)
	if err != context.Canceled || !rep.Interrupted || len(rep.Runs) != 1 {
		t.Fatalf("err %v, report %+v", err, rep)
	}
	r := rep.Runs[0]
	// Two workers: one cancels after the second request ends, the other is
	// then waiting on the third, which is cut off.
	if r.Completed != 2 || r.Failed != 0 || r.Cancelled != 1 {
		t.Fatalf("run %+v", r.Stats)
	}
}

type cancelAfter struct {
	n, done int
	cancel  func()
}

func (c *cancelAfter) Start(string, int) {}
func (c *cancelAfter) Finish()           {}
func (c *cancelAfter) Done(Record) {
	if c.done++; c.done == c.n {
		c.cancel()
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Endpoint = "/v1/embeddings" }, "--endpoint"},
		{func(c *Config) { c.RequestRates = []float64{1} }, "choose one"},
		{func(c *Config) { c.Concurrency = nil }, "give one"},
		{func(c *Config) { c.Concurrency = []int{0} }, "--concurrency: 0"},
		{func(c *Config) { c.Concurrency, c.RequestRates = nil, []float64{-1} }, "--request-rate"},
		{func(c *Config) { c.RangeRatio = 1 }, "--range-ratio"},
		{func(c *Config) { c.OutputLen = 0 }, "--output-len"},
		{func(c *Config) { c.URL = "localhost:8000" }, "--url"},
		{func(c *Config) { c.URL = "http://127.0.0.1:1" }, "cannot reach"},
	} {
		cfg := baseConfig("http://127.0.0.1:9")
		tc.edit(&cfg)
		if _, err := Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err %v, want %q", err, tc.want)
		}
	}
}
