package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/tokenizer/chat"
)

// byteTokenizer is a test tokenizer: ids 0..255 are bytes, then the GLM
// markers. Like the real vocabulary, role and control markers are special
// (skipped by Decode) and the markup the output parser reads is not.
type byteTokenizer struct{}

var fakeMarkers = []struct {
	text    string
	special bool
}{
	{"<|endoftext|>", true}, {"[gMASK]", true}, {"<sop>", true}, {"<|system|>", true}, {"<|user|>", true},
	{"<|assistant|>", true}, {"<|observation|>", true}, {"<think>", false}, {"</think>", false},
	{"<tool_call>", false}, {"</tool_call>", false}, {"<arg_key>", false}, {"</arg_key>", false},
	{"<arg_value>", false}, {"</arg_value>", false}, {"<tool_response>", false}, {"</tool_response>", false},
}

const (
	fakeVocab = 300
	fakeEOS   = 256 // <|endoftext|>
	fakeUser  = 260 // <|user|>
)

func (byteTokenizer) Encode(text string) ([]int32, error) {
	var ids []int32
	for i := 0; i < len(text); {
		matched := false
		for j, m := range fakeMarkers {
			if strings.HasPrefix(text[i:], m.text) {
				ids = append(ids, int32(256+j))
				i += len(m.text)
				matched = true
				break
			}
		}
		if !matched {
			ids = append(ids, int32(text[i]))
			i++
		}
	}
	return ids, nil
}

func (t byteTokenizer) Decode(ids []int32) (string, error) { return t.decode(ids, true), nil }

func (t byteTokenizer) TokenText(id int32) string { return t.decode([]int32{id}, false) }

func (byteTokenizer) decode(ids []int32, skipSpecial bool) string {
	var b []byte
	for _, id := range ids {
		switch {
		case id < 256:
			b = append(b, byte(id))
		case int(id-256) < len(fakeMarkers):
			m := fakeMarkers[id-256]
			if !m.special || !skipSpecial {
				b = append(b, m.text...)
			}
		}
	}
	return string(b)
}

// disconnectStepDelay is the step time of the client-disconnect tests: their
// requests (400 tokens) would run 10 s, far longer than a closed connection
// takes to cancel them even under -race on a loaded 2-core machine, so a
// request that finishes with "length" means the cancellation was lost (as it
// was, about 1 run in 200, before engine.Stream.forward stopped disarming its
// Cancel hook: TestCloseAlwaysCancels).
const disconnectStepDelay = 25 * time.Millisecond

// scriptBackend is a deterministic engine.Backend. A prompt holding
// "SCRIPT:<name>" (the last one, in a conversation) makes the model write
// scripts[name] and then <|user|>;
// any other prompt gets letters that depend on the seed (so seeded
// requests reproduce and unseeded ones differ), until max_tokens.
type scriptBackend struct {
	delay     time.Duration // per step, to make streams take real time
	numBlocks int
	maxCtx    int
	scripts   map[string]string
	steps     atomic.Int64
	failNext  atomic.Bool // the next step fails
}

func (b *scriptBackend) Info() engine.BackendInfo {
	return engine.BackendInfo{Name: "script", Device: "test", VocabSize: fakeVocab, MaxContext: b.maxCtx,
		KVBlockSize: 16, NumKVBlocks: b.numBlocks}
}

func (b *scriptBackend) Close() error { return nil }

func (b *scriptBackend) Step(ctx context.Context, batch *engine.StepBatch) ([]engine.SeqResult, error) {
	b.steps.Add(1)
	if b.delay > 0 {
		select {
		case <-time.After(b.delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if b.failNext.CompareAndSwap(true, false) {
		return nil, errors.New("injected backend failure")
	}
	out := make([]engine.SeqResult, len(batch.Seqs))
	for i, s := range batch.Seqs {
		out[i].SeqID = s.SeqID
		if !s.Sample {
			continue
		}
		out[i].Token = b.next(s)
		out[i].Logprob = -0.25 * float32(1+s.SampleIndex%3)
		for k := 0; k < s.Sampling.TopLogprobs; k++ {
			out[i].TopLogprobs = append(out[i].TopLogprobs, engine.TokenLogprob{Token: int32('a' + k), Logprob: -float32(k+1) * 0.5})
		}
	}
	return out, nil
}

func (b *scriptBackend) next(s engine.StepSeq) int32 {
	prompt := byteTokenizer{}.decode(s.PromptTokens, false)
	if i := strings.LastIndex(prompt, "SCRIPT:"); i >= 0 {
		name := prompt[i+len("SCRIPT:"):]
		if j := strings.IndexAny(name, " <"); j >= 0 {
			name = name[:j]
		}
		ids, _ := byteTokenizer{}.Encode(b.scripts[name])
		if s.SampleIndex < len(ids) {
			return ids[s.SampleIndex]
		}
		return fakeUser
	}
	if s.Sampling.Greedy() {
		return int32('a' + s.SampleIndex%26)
	}
	return int32('a' + uint64(s.Sampling.Seed+int64(s.SampleIndex)*7)%26)
}

// testServer is a Server serving on a loopback port.
type testServer struct {
	*Server
	url     string
	backend *scriptBackend
	logs    *syncBuffer
	stop    context.CancelFunc
	done    chan error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startServer starts a server on the script backend; edit adjusts the
// options first. It is stopped at the end of the test, and must then return
// nil.
func startServer(t testing.TB, edit func(*Options, *scriptBackend)) *testServer {
	t.Helper()
	be := &scriptBackend{numBlocks: 512, maxCtx: 2048, scripts: map[string]string{
		"think":  "Let me think.</think>Hello!",
		"tool":   "I should call it.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>",
		"plain":  "Just an answer.",
		"stopme": "one two STOP three",
	}}
	logs := &syncBuffer{}
	opts := Options{
		Backend:   be,
		Tokenizer: byteTokenizer{},
		Chat:      GLMChat{Variant: chat.GLM47},
		ModelName: "glm-test",
		Engine:    engine.Config{MaxSeqs: 16, EOSTokenIDs: []int32{fakeEOS, fakeUser}},
		Logger:    slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	if edit != nil {
		edit(&opts, be)
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{Server: s, url: "http://" + ln.Addr().String(), backend: be, logs: logs, stop: cancel, done: make(chan error, 1)}
	go func() { ts.done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-ts.done:
			if err != nil {
				t.Errorf("Serve returned %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("Serve did not return after cancel")
		}
	})
	return ts
}

// post sends a JSON body and returns the status, headers and body.
func (ts *testServer) post(t testing.TB, path, body string, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, ts.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

func (ts *testServer) get(t testing.TB, path string, hdr ...string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, ts.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// readSSE reads a whole event stream and checks its framing: every event is
// "data: ..." followed by a blank line, the last is [DONE]. It returns the
// JSON payloads.
func readSSE(t testing.TB, body []byte) []json.RawMessage {
	t.Helper()
	var out []json.RawMessage
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	sawDone := false
	for sc.Scan() {
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("SSE line %q does not start with \"data: \"", line)
		}
		if !sc.Scan() || sc.Text() != "" {
			t.Fatalf("SSE event %q is not followed by a blank line", line)
		}
		if sawDone {
			t.Fatalf("event after [DONE]: %q", line)
		}
		if data == "[DONE]" {
			sawDone = true
			continue
		}
		if !json.Valid([]byte(data)) {
			t.Fatalf("SSE data is not JSON: %q", data)
		}
		out = append(out, json.RawMessage(data))
	}
	if !sawDone {
		t.Fatalf("stream did not end with data: [DONE]; body:\n%s", body)
	}
	return out
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitForEngine polls cond on the engine's stats until it holds or the
// deadline passes; on timeout the last stats are part of the failure.
func waitForEngine(t testing.TB, s *Server, what string, d time.Duration, cond func(engine.Stats) bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		st := s.Engine().Stats()
		if cond(st) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; engine stats %+v", d, what, st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// idle reports whether the engine holds no requests and no KV blocks.
func idle(s *Server) bool {
	st := s.Engine().Stats()
	return st.Running == 0 && st.Waiting == 0 && st.KVBlocksUsed == 0
}

// checkDisconnectCancels sends a request for 400 tokens to path on a raw
// connection, streamed and not, waits until it runs (the streamed one until
// a line holding marker arrives), closes the connection and requires the
// request to be cancelled and its KV blocks freed. bodyFmt takes the
// "stream" value (%v). The server must step at disconnectStepDelay.
func checkDisconnectCancels(t *testing.T, ts *testServer, path, bodyFmt, marker string) {
	t.Helper()
	for _, stream := range []bool{true, false} {
		before := ts.Engine().Stats().FinishedCancelled
		conn, err := net.Dial("tcp", strings.TrimPrefix(ts.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		body := fmt.Sprintf(bodyFmt, stream)
		fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", path, len(body), body)
		if stream {
			r := bufio.NewReader(conn)
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(line, marker) {
					break
				}
			}
		} else {
			waitFor(t, "request running", 5*time.Second, func() bool { return ts.Engine().Stats().Running == 1 })
		}
		conn.Close()
		// 20 s: under -race on a loaded 2-core CI machine this has taken over
		// 5 s (2026-11-24).
		waitForEngine(t, ts.Server, path+": cancelled request to free its blocks", 20*time.Second, func(st engine.Stats) bool {
			return st.Running == 0 && st.Waiting == 0 && st.KVBlocksUsed == 0 && st.FinishedCancelled == before+1
		})
	}
}
