package server

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/glmctl/glmctl/internal/faultinject"
	"github.com/glmctl/glmctl/pkg/engine"
)

// faultServer starts a server whose backend has faults.
func faultServer(t *testing.T, faults ...faultinject.Fault) (*testServer, *faultinject.Backend) {
	t.Helper()
	var fb *faultinject.Backend
	ts := startServer(t, func(o *Options, b *scriptBackend) {
		b.delay = time.Millisecond
		fb = faultinject.Wrap(o.Backend, faults...)
		o.Backend = fb
		o.StallTimeout = 150 * time.Millisecond
		o.Engine.MaxSeqs = 2 // a step holds two requests: a fault hits a subset
	})
	return ts, fb
}

// reply is one client's view of a request.
type reply struct {
	stream bool
	code   int
	body   string
	err    error // transport error: no HTTP response at all
}

// errored reports whether the reply carries an OpenAI-style error: a non-200
// status with an "error" body, or an SSE error event before [DONE].
func (r reply) errored() bool {
	return strings.Contains(r.body, `"error":{`)
}

// fire sends n completions at once, alternating streaming and not, and
// returns every reply; a request without a reply within 10 s fails the test.
func fire(t *testing.T, ts *testServer, n, maxTokens int) []reply {
	t.Helper()
	out := make([]reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			stream := i%2 == 1
			body := fmt.Sprintf(`{"prompt":"request %d","max_tokens":%d,"stream":%v,"ignore_eos":true}`, i, maxTokens, stream)
			// Not ts.post: t.Fatal must not be called off the test goroutine.
			out[i] = reply{stream: stream}
			resp, err := http.Post(ts.url+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				out[i].err = err
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			out[i].code, out[i].body, out[i].err = resp.StatusCode, string(b), err
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a request got no reply within 10 s (lost or hung)")
	}
	return out
}

// checkReply checks that a reply is complete: a 200 with a full completion,
// a 500 with an error body, or a stream that ends with [DONE] after either
// a finish reason or an error event.
func checkReply(t *testing.T, i int, r reply) {
	t.Helper()
	switch {
	case r.err != nil:
		t.Errorf("request %d: no reply: %v", i, r.err)
	case r.stream && r.code == http.StatusOK:
		events := readSSE(t, []byte(r.body))
		last := string(events[len(events)-1])
		if !strings.Contains(last, `"finish_reason":"length"`) && !strings.Contains(last, `"error":{`) {
			t.Errorf("request %d: stream ends with %s", i, last)
		}
	case r.code == http.StatusOK:
		if !strings.Contains(r.body, `"finish_reason":"length"`) {
			t.Errorf("request %d: 200 without a finish: %s", i, r.body)
		}
	case r.code == http.StatusInternalServerError || r.code == http.StatusServiceUnavailable:
		if !r.errored() {
			t.Errorf("request %d: %d without an error body: %s", i, r.code, r.body)
		}
	default:
		t.Errorf("request %d: status %d: %s", i, r.code, r.body)
	}
}

// A step that fails, panics or yields NaN logits fails only its requests,
// each with an error the client sees; every other request completes, no KV
// block stays used, the counter shows on /metrics, and the server goes on
// answering.
func TestFaultServerKeepsServing(t *testing.T) {
	for _, tc := range []struct {
		kind   faultinject.Kind
		metric string
		msg    string
	}{
		{faultinject.Fail, `glmctl_engine_step_failures_total{kind="error"} 1`, "injected fault"},
		{faultinject.Panic, `glmctl_engine_step_failures_total{kind="panic"} 1`, "backend step panicked"},
		{faultinject.NaN, `glmctl_engine_nonfinite_logits_total 1`, "non-finite logits"},
	} {
		t.Run(tc.kind.String(), func(t *testing.T) {
			before := runtime.NumGoroutine()
			ts, fb := faultServer(t, faultinject.Fault{Kind: tc.kind, Step: 6})
			replies := fire(t, ts, 8, 12)
			failed := 0
			for i, r := range replies {
				checkReply(t, i, r)
				if r.errored() {
					failed++
					if !strings.Contains(r.body, tc.msg) {
						t.Errorf("request %d: error does not say %q: %s", i, tc.msg, r.body)
					}
				}
			}
			if fb.Hits(tc.kind) != 1 || failed == 0 || failed == len(replies) {
				t.Errorf("fault hit %d times; %d of %d requests failed", fb.Hits(tc.kind), failed, len(replies))
			}
			if tc.kind == faultinject.NaN && failed != 1 {
				t.Errorf("NaN logits of one sequence failed %d requests", failed)
			}
			waitFor(t, "every KV block free", 5*time.Second, func() bool { return idle(ts.Server) })
			if code, body := ts.get(t, "/readyz"); code != 200 {
				t.Errorf("/readyz after the fault: %d %s", code, body)
			}
			if code, _, body := ts.post(t, "/v1/completions", `{"prompt":"after","max_tokens":3}`); code != 200 {
				t.Errorf("request after the fault: %d %s", code, body)
			}
			if _, m := ts.get(t, "/metrics"); !strings.Contains(string(m), tc.metric) {
				t.Errorf("/metrics lacks %q", tc.metric)
			}
			if !strings.Contains(ts.logs.String(), `"request_ids":[`) && tc.kind != faultinject.NaN {
				t.Errorf("the failure log names no request ids:\n%s", ts.logs.String())
			}
			ts.stop()
			if err := <-ts.done; err != nil {
				t.Errorf("Serve: %v", err)
			}
			ts.done <- nil
			http.DefaultClient.CloseIdleConnections()
			checkServerGoroutines(t, before)
		})
	}
}

// A stalled step makes /readyz fail while it lasts; every request still
// completes, and readiness comes back.
func TestFaultServerStall(t *testing.T) {
	ts, _ := faultServer(t, faultinject.Fault{Kind: faultinject.Stall, Step: 3, Stall: 1500 * time.Millisecond})
	var replies []reply
	done := make(chan struct{})
	go func() { replies = fire(t, ts, 4, 6); close(done) }()
	waitFor(t, "/readyz to report the stall", 5*time.Second, func() bool {
		code, body := ts.get(t, "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(string(body), "no progress")
	})
	<-done
	for i, r := range replies {
		checkReply(t, i, r)
		if r.errored() {
			t.Errorf("request %d failed after a stall: %s", i, r.body)
		}
	}
	waitFor(t, "/readyz to recover", 5*time.Second, func() bool {
		code, _ := ts.get(t, "/readyz")
		return code == http.StatusOK
	})
}

// A fatal (sticky) backend error: every client gets an error reply, /readyz
// fails, and Serve returns an error wrapping engine.ErrBackendFatal (the
// command exits non-zero so that a supervisor restarts it).
func TestFaultServerFatal(t *testing.T) {
	ts, _ := faultServer(t, faultinject.Fault{Kind: faultinject.Fatal, Step: 4})
	answered := 0
	for i, r := range fire(t, ts, 6, 50) {
		// A client that connects as the fatal step stops the server finds it
		// gone: refused, or accepted by the kernel's listen backlog and then
		// closed unread (EOF, reset). That is not a lost request as long as
		// every request the engine admitted got a reply (checked below).
		if r.err != nil && (strings.Contains(r.err.Error(), "connection refused") ||
			strings.Contains(r.err.Error(), "EOF") || strings.Contains(r.err.Error(), "connection reset")) {
			continue
		}
		answered++
		checkReply(t, i, r)
		if !r.errored() {
			t.Errorf("request %d completed across a fatal error: %d %s", i, r.code, r.body)
		}
	}
	if answered < 1 {
		t.Errorf("none of the 6 requests reached the server (%d): the fatal step cannot have run", answered)
	}
	var err error
	select {
	case err = <-ts.done:
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after a fatal backend error")
	}
	ts.done <- nil // for the cleanup
	if !errors.Is(err, engine.ErrBackendFatal) {
		t.Errorf("Serve returned %v, want an error wrapping ErrBackendFatal", err)
	}
	if !ts.draining.Load() || ts.engineUp.Load() {
		t.Error("server still ready after a fatal error")
	}
	if logs := ts.logs.String(); !strings.Contains(logs, `"fatal":true`) || !strings.Contains(logs, `"request_ids":[`) {
		t.Errorf("logs do not record the fatal step with its request ids:\n%s", logs)
	}
	if st := ts.Engine().Stats(); st.KVBlocksUsed != 0 || st.FatalErrors != 1 {
		t.Errorf("after a fatal error: %d KV blocks used, %d fatal errors", st.KVBlocksUsed, st.FatalErrors)
	} else if st.RequestsSubmitted > uint64(answered) {
		t.Errorf("%d requests reached the engine but only %d clients got a reply: some were lost", st.RequestsSubmitted, answered)
	}
}

// A streamed request whose logits turn non-finite ends with an SSE error
// event (then [DONE]), never with a made-up token.
func TestFaultServerNaNStream(t *testing.T) {
	ts, _ := faultServer(t, faultinject.Fault{Kind: faultinject.NaN, Step: 4})
	code, _, body := ts.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":20,"stream":true}`)
	if code != 200 {
		t.Fatalf("status %d: %s", code, body)
	}
	events := readSSE(t, body)
	last := string(events[len(events)-1])
	if !strings.Contains(last, `"error":{`) || !strings.Contains(last, "non-finite logits") || !strings.Contains(last, `"type":"server_error"`) {
		t.Errorf("last event %s, want a server_error naming non-finite logits", last)
	}
	code, _, body = ts.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":5}`)
	if code != 200 {
		t.Errorf("next request: %d %s", code, body)
	}
}

// checkServerGoroutines waits (bounded) for the goroutine count to come back
// to before.
func checkServerGoroutines(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	n := runtime.NumGoroutine()
	for n > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
	if n > before {
		buf := make([]byte, 1<<16)
		t.Errorf("%d goroutines, %d before: leak\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}

// Steps that keep failing make /readyz fail (each one failing only its own
// requests), naming the latest error; a step that succeeds makes the server
// ready again at once, and with no traffic so does the cooldown. A single
// failing step does not (TestFaultServerKeepsServing).
func TestFaultServerFailingStepsNotReady(t *testing.T) {
	start := func(t *testing.T, cooldown time.Duration, faults ...faultinject.Fault) *testServer {
		return startServer(t, func(o *Options, b *scriptBackend) {
			o.Backend = faultinject.Wrap(o.Backend, faults...)
			o.MaxFailedSteps = 3
			o.FailedStepsCooldown = cooldown
		})
	}
	failOne := func(t *testing.T, ts *testServer, i int) {
		t.Helper()
		if code, _, body := ts.post(t, "/v1/completions", fmt.Sprintf(`{"prompt":"r%d","max_tokens":2}`, i)); code != http.StatusInternalServerError {
			t.Fatalf("request %d: %d %s, want a 500 from the injected fault", i, code, body)
		}
	}
	notReady := func(t *testing.T, ts *testServer) {
		t.Helper()
		for _, path := range []string{"/readyz", "/health"} {
			code, body := ts.get(t, path)
			if code != http.StatusServiceUnavailable || !strings.Contains(string(body), "the last 3 engine steps failed") ||
				!strings.Contains(string(body), "injected fault") {
				t.Errorf("%s after 3 failed steps: %d %q", path, code, body)
			}
		}
	}
	t.Run("a successful step clears it", func(t *testing.T) {
		ts := start(t, time.Hour, faultinject.Fault{Kind: faultinject.Fail, Step: 1},
			faultinject.Fault{Kind: faultinject.Fail, Step: 2}, faultinject.Fault{Kind: faultinject.Fail, Step: 3})
		for i := range 2 {
			failOne(t, ts, i)
		}
		if code, body := ts.get(t, "/readyz"); code != http.StatusOK {
			t.Errorf("/readyz after 2 failed steps: %d %s", code, body)
		}
		failOne(t, ts, 2)
		notReady(t, ts)
		if code, _, body := ts.post(t, "/v1/completions", `{"prompt":"after","max_tokens":2}`); code != http.StatusOK {
			t.Fatalf("request after the faults: %d %s", code, body)
		}
		if code, body := ts.get(t, "/readyz"); code != http.StatusOK {
			t.Errorf("/readyz after a successful step: %d %s", code, body)
		}
	})
	t.Run("the cooldown clears it", func(t *testing.T) {
		ts := start(t, 300*time.Millisecond, faultinject.Fault{Kind: faultinject.Fail, Step: 1, Every: 1})
		for i := range 3 {
			failOne(t, ts, i)
		}
		notReady(t, ts)
		waitFor(t, "/readyz after the cooldown", 5*time.Second, func() bool {
			code, _ := ts.get(t, "/readyz")
			return code == http.StatusOK
		})
	})
}
