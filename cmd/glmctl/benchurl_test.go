package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/glmctl/glmctl/pkg/backend/cpu"
	"github.com/glmctl/glmctl/pkg/loadgen"
	"github.com/glmctl/glmctl/pkg/server"
	"github.com/glmctl/glmctl/pkg/server/openai"
	"github.com/glmctl/glmctl/pkg/tokenizer"
	"github.com/glmctl/glmctl/pkg/tokenizer/chat"
)

// bench --url against a real `glmctl serve` on the tiny model: both
// endpoints, concurrency and rate runs, a dataset file, SLOs, the result
// file, and the utility routes of the same server.
func TestBenchURL(t *testing.T) {
	bin := buildGlmctl(t)
	p := startServe(t, bin, nil, "--kv-blocks", "256", "--api-key", "k3y", "--log-level", "warn")
	t.Setenv("OPENAI_API_KEY", "k3y")
	bench := func(t *testing.T, args ...string) loadgen.Report {
		t.Helper()
		out, errOut, code := runCLI(t, append([]string{"bench", "--url", p.url, "--json", "--log-level", "warn"}, args...)...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var rep loadgen.Report
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("bad JSON %q: %v", out, err)
		}
		return rep
	}

	t.Run("completions at concurrency, with SLOs", func(t *testing.T) {
		result := filepath.Join(t.TempDir(), "result.json")
		rep := bench(t, "--concurrency", "1,3", "--requests", "6", "--input-len", "20", "--output-len", "6",
			"--slo", "ttft=1h,tpot=1h", "--result-json", result)
		h := rep.Header
		if h.Model != "tiny-f32" || h.Endpoint != "/v1/completions" || !strings.HasPrefix(h.ServerVersion, "dev (commit ") ||
			!strings.Contains(h.Prompts, "cut to exactly that many tokens") || h.SLO == nil || h.SLO.TTFTMs != 3.6e6 {
			t.Errorf("header %+v", h)
		}
		if len(rep.Runs) != 2 {
			t.Fatalf("%d runs", len(rep.Runs))
		}
		for _, r := range rep.Runs {
			// ignore_eos: every request yields exactly max_tokens; prompts
			// were cut to 20 tokens by the server's own tokenizer.
			if r.Completed != 6 || r.Failed != 0 || r.OutputTokens != 36 || r.OutputCounted || r.MeanInputTokens < 18 || r.MeanInputTokens > 22 ||
				r.PromptTokens < 6*18 || !(r.TTFTMs.P50 > 0) || !(r.TPOTMs.P50 > 0) || !(r.ITLMs.P50 > 0) || !(r.OutputTokensPerSecond > 0) {
				t.Errorf("conc %d: %+v", r.Concurrency, r)
			}
			if g := r.Goodput; g == nil || g.Good != 6 || g.Fraction != 1 {
				t.Errorf("conc %d: goodput %+v", r.Concurrency, r.Goodput)
			}
			if r.Records != nil {
				t.Error("--json carries no per-request records")
			}
		}
		var full loadgen.Report
		b, err := os.ReadFile(result)
		if err != nil || json.Unmarshal(b, &full) != nil || len(full.Runs) != 2 || len(full.Runs[1].Records) != 6 || !full.Runs[1].Records[0].OutputFromUsage {
			t.Fatalf("result file: %v %s", err, b)
		}
	})

	t.Run("chat at a request rate, impossible SLO", func(t *testing.T) {
		rep := bench(t, "--endpoint", "/v1/chat/completions", "--request-rate", "50", "--requests", "5",
			"--input-len", "12", "--output-len", "5", "--range-ratio", "0.3", "--slo", "ttft=1us")
		r := rep.Runs[0]
		if r.RequestRate != 50 || r.Completed != 5 || float64(r.OutputTokens) != 5*r.MeanMaxTokens || r.PeakInFlight < 1 || !(r.E2EMs.P50 > 0) {
			t.Errorf("run %+v", r)
		}
		if g := r.Goodput; g == nil || g.Good != 0 || g.Fraction != 0 {
			t.Errorf("goodput %+v", r.Goodput)
		}
	})

	t.Run("dataset file", func(t *testing.T) {
		ds := filepath.Join(t.TempDir(), "prompts.jsonl")
		if err := writeFile(ds, `{"prompt": "Tell me a story.", "output_len": 3}
{"conversations": [{"from": "human", "value": "What is a GPU?"}, {"from": "gpt", "value": "A graphics processor."}]}
`); err != nil {
			t.Fatal(err)
		}
		rep := bench(t, "--dataset", ds, "--concurrency", "2", "--requests", "4", "--warmup", "0")
		r := rep.Runs[0]
		if r.Completed != 4 || r.Failed != 0 || !strings.Contains(rep.Header.Prompts, "2 prompts from") {
			t.Fatalf("run %+v, header %+v", r, rep.Header)
		}
		// Output lengths: 3 from the entry, the reply's token count for the
		// ShareGPT one; each prompt used twice.
		if r.MeanMaxTokens <= 3 || r.OutputTokens != int64(4*r.MeanMaxTokens) {
			t.Errorf("mean max tokens %v, output tokens %d", r.MeanMaxTokens, r.OutputTokens)
		}
	})

	t.Run("text and markdown", func(t *testing.T) {
		out, errOut, code := runCLI(t, "bench", "--url", p.url, "--concurrency", "2", "--requests", "2", "--input-len", "8", "--output-len", "3", "--log-level", "warn")
		if code != 0 || !strings.Contains(out, "TTFT ms p50/p90/p99") || !strings.Contains(out, "ITL ms p50/p90/p99") || !strings.Contains(out, "2/2") {
			t.Errorf("exit %d, text:\n%s\n%s", code, out, errOut)
		}
		out, _, code = runCLI(t, "bench", "--url", p.url, "--concurrency", "1", "--requests", "1", "--input-len", "8", "--output-len", "3", "--markdown", "--log-level", "warn")
		if code != 0 || !strings.Contains(out, "| conc | ok/sent |") || !strings.Contains(out, "- server: http://") {
			t.Errorf("markdown:\n%s", out)
		}
	})

	t.Run("wrong key: every request fails, named", func(t *testing.T) {
		out, errOut, code := runCLI(t, "bench", "--url", p.url, "--api-key", "wrong", "--model", "tiny-f32", "--concurrency", "1", "--requests", "2", "--warmup", "0", "--log-level", "warn")
		if code == 0 || !strings.Contains(out, "http_401 2") || !strings.Contains(errOut, "every request failed") {
			t.Errorf("exit %d\n%s\n%s", code, out, errOut)
		}
	})

	t.Run("utility routes", func(t *testing.T) {
		for path, want := range map[string]int{"/health": 200, "/version": 200} {
			resp, err := http.Get(p.url + path)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != want || (path == "/version" && !strings.Contains(string(b), `"version":"dev"`)) {
				t.Errorf("%s: %d %s", path, resp.StatusCode, b)
			}
		}
	})
}

// Flags of the in-process mode are refused with --url and the other way
// round, before anything runs.
func TestBenchURLFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--url", "http://127.0.0.1:9", "--backend", "cpu", "--max-seqs", "4"}, "--backend, --max-seqs: does not apply with --url"},
		{[]string{"--url", "http://127.0.0.1:9", "--batches", "1"}, "--batches: does not apply with --url"},
		{[]string{"--url", "http://127.0.0.1:9", "--concurrency", "2", "--request-rate", "1"}, "choose one"},
		{[]string{"--url", "http://127.0.0.1:9", "--request-rate", "1,x"}, `--request-rate: entry 1 ("x")`},
		{[]string{"--url", "http://127.0.0.1:9", "--slo", "ttft=soon"}, "--slo"},
		{[]string{"--url", "http://127.0.0.1:9", "--dataset", "/nonexistent.jsonl"}, "--dataset"},
		{[]string{"--url", "http://127.0.0.1:9", "--endpoint", "/v1/embeddings"}, "--endpoint"},
		{[]string{"--url", "http://127.0.0.1:9", "--json", "--markdown"}, "choose one"},
		{[]string{"--url", "http://127.0.0.1:9", "--model", "m"}, "every warm-up request failed; first: Post"},
		{[]string{"--url", "not a url"}, "--url"},
		{[]string{"--request-rate", "2"}, "--request-rate: only means something with --url"},
		{[]string{"--slo", "ttft=1s"}, "--slo: only means something with --url"},
	} {
		_, errOut, code := runCLI(t, append([]string{"bench", "--log-level", "warn"}, tc.args...)...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %q", tc.args, code, errOut, tc.want)
		}
	}
}

// /tokenize and /detokenize through the real server handlers with the tiny
// model's tokenizer and chat template; /health is 503 while the engine does
// not run (Serve not called).
func TestServeTokenizeTinyTokenizer(t *testing.T) {
	tok, err := tokenizer.Load(tinyModel)
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	be, err := cpu.Open(tinyModel, cpu.Options{NumKVBlocks: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	srv, err := server.New(server.Options{Backend: be, Tokenizer: tokenizer.ServerTokenizer{Tok: tok}, Chat: server.GLMChat{Variant: tok.Variant},
		ModelName: "tiny", Version: "v9", Commit: "c0ffee"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	post := func(path, body string) (int, []byte) {
		resp, err := http.Post(ts.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}

	text := "Hello, world! Benchmarks count tokens."
	want, err := tok.Encode(text, false)
	if err != nil {
		t.Fatal(err)
	}
	code, b := post("/tokenize", `{"model":"tiny","prompt":"`+text+`","return_token_strs":true}`)
	var tr openai.TokenizeResponse
	if code != 200 || json.Unmarshal(b, &tr) != nil || tr.Count != len(want) || len(tr.TokenStrs) != len(want) || tr.MaxModelLen <= 0 {
		t.Fatalf("tokenize: %d %s", code, b)
	}
	for i := range want {
		if tr.Tokens[i] != want[i] {
			t.Fatalf("tokens %v, want %v", tr.Tokens, want)
		}
	}
	idsJSON, _ := json.Marshal(tr.Tokens)
	code, b = post("/detokenize", `{"tokens":`+string(idsJSON)+`}`)
	var dr openai.DetokenizeResponse
	if code != 200 || json.Unmarshal(b, &dr) != nil || dr.Prompt != text {
		t.Fatalf("detokenize: %d %s", code, b)
	}

	// The chat shape is exactly what the chat endpoint would feed the engine.
	msgs := []chat.Message{{Role: "user", Content: "Hi"}}
	chatIDs, _, err := tok.EncodeChat(msgs, chat.Options{AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	code, b = post("/tokenize", `{"messages":[{"role":"user","content":"Hi"}]}`)
	if json.Unmarshal(b, &tr) != nil || code != 200 || tr.Count != len(chatIDs) {
		t.Fatalf("chat tokenize: %d %s, want %d ids", code, b, len(chatIDs))
	}
	// Special tokens are kept by /detokenize, as vLLM does.
	code, b = post("/detokenize", `{"tokens":`+mustJSON(chatIDs)+`}`)
	if code != 200 || json.Unmarshal(b, &dr) != nil || !strings.Contains(dr.Prompt, "<|user|>Hi<|assistant|>") {
		t.Errorf("chat detokenize: %d %s", code, b)
	}

	vocab := be.Info().VocabSize
	code, b = post("/detokenize", `{"tokens":[1,`+mustJSON(vocab)+`]}`)
	if code != 400 || !strings.Contains(string(b), "is outside the vocabulary") {
		t.Errorf("id out of range: %d %s", code, b)
	}
	resp, err := http.Get(ts.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/health without a running engine: %d", resp.StatusCode)
	}
	resp, err = http.Get(ts.URL + "/version")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != `{"version":"v9","commit":"c0ffee"}`+"\n" {
		t.Errorf("/version: %s", b)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
