package server

import (
	"bufio"
	"fmt"
	"github.com/glmctl/glmctl/pkg/engine"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/glmctl/glmctl/pkg/server/openai"
)

// nPrompt is long enough (40 tokens, blocks of 16) for the copies of n to
// find two full blocks of it in the prefix cache.
var nPrompt = strings.Repeat("0123456789", 4)

func chatText(m openai.ResponseMessage) string {
	return deref(m.ReasoningContent) + "|" + deref(m.Content)
}

// streamedChat reads an n-choice chat stream: per choice its text, finish
// reason and logprob count, and the usage chunk.
func streamedChat(t *testing.T, body []byte, n int) ([]string, []string, []int, *openai.Usage) {
	t.Helper()
	events := readSSE(t, body)
	reasoning, content := make([]strings.Builder, n), make([]strings.Builder, n)
	finish, lps, roles := make([]string, n), make([]int, n), make([]int, n)
	var usage *openai.Usage
	for i, raw := range events {
		ch := decode[openai.ChatCompletionChunk](t, raw)
		if ch.Usage != nil {
			if i != len(events)-1 || len(ch.Choices) != 0 {
				t.Fatalf("usage chunk %d of %d: %s", i, len(events), raw)
			}
			usage = ch.Usage
			continue
		}
		if len(ch.Choices) != 1 {
			t.Fatalf("chunk with %d choices: %s", len(ch.Choices), raw)
		}
		c := ch.Choices[0]
		if c.Index < 0 || c.Index >= n {
			t.Fatalf("choice index %d out of range: %s", c.Index, raw)
		}
		if finish[c.Index] != "" {
			t.Errorf("chunk of choice %d after its finish reason: %s", c.Index, raw)
		}
		if c.Delta.Role == "assistant" {
			roles[c.Index]++
		} else {
			reasoning[c.Index].WriteString(deref(c.Delta.ReasoningContent))
			content[c.Index].WriteString(deref(c.Delta.Content))
		}
		if c.FinishReason != nil {
			finish[c.Index] = *c.FinishReason
		}
		if c.Logprobs != nil {
			lps[c.Index] += len(c.Logprobs.Content)
		}
	}
	texts := make([]string, n)
	for i := range n {
		if roles[i] != 1 || finish[i] == "" {
			t.Errorf("choice %d: %d role chunks, finish %q", i, roles[i], finish[i])
		}
		texts[i] = reasoning[i].String() + "|" + content[i].String()
	}
	return texts, finish, lps, usage
}

func TestNChoices(t *testing.T) {
	for _, caching := range []bool{false, true} {
		t.Run(fmt.Sprintf("prefix caching %v", caching), func(t *testing.T) {
			ts := startServer(t, func(o *Options, _ *scriptBackend) { o.Engine.PrefixCaching = caching })
			msgs := `"messages":[{"role":"user","content":"` + nPrompt + `"}]`
			chatBody := func(n, seed int, extra string) string {
				return fmt.Sprintf(`{%s,"n":%d,"seed":%d,"temperature":0.8,"max_tokens":6,"logprobs":true%s}`, msgs, n, seed, extra)
			}
			one := func(seed int) (string, *openai.Usage) {
				code, _, body := ts.post(t, "/v1/chat/completions", chatBody(1, seed, ""))
				if code != 200 {
					t.Fatalf("%d %s", code, body)
				}
				r := decode[openai.ChatCompletion](t, body)
				return chatText(r.Choices[0].Message), r.Usage
			}
			single := []string{}
			var singleUsage *openai.Usage
			for i := range 3 {
				txt, u := one(100 + i)
				single, singleUsage = append(single, txt), u
			}
			hitsBefore := ts.Engine().Stats().PrefixHitTokens

			// Non-streamed: choice i is what seed 100+i gives alone.
			code, _, body := ts.post(t, "/v1/chat/completions", chatBody(3, 100, ""))
			if code != 200 {
				t.Fatalf("%d %s", code, body)
			}
			r := decode[openai.ChatCompletion](t, body)
			if len(r.Choices) != 3 {
				t.Fatalf("%d choices: %s", len(r.Choices), body)
			}
			for i, c := range r.Choices {
				if c.Index != i || c.FinishReason != "length" || c.Logprobs == nil || len(c.Logprobs.Content) != 6 {
					t.Errorf("choice %d: index %d finish %q logprobs %v", i, c.Index, c.FinishReason, c.Logprobs)
				}
				if got := chatText(c.Message); got != single[i] {
					t.Errorf("choice %d = %q, want %q (seed %d alone)", i, got, single[i], 100+i)
				}
			}
			if single[0] == single[1] || single[1] == single[2] {
				t.Errorf("seeded choices should differ: %q", single)
			}
			u := r.Usage
			if u.PromptTokens != singleUsage.PromptTokens || u.CompletionTokens != 18 || u.TotalTokens != u.PromptTokens+18 {
				t.Errorf("usage %+v: want the prompt counted once (%d) and 3×6 completion tokens", u, singleUsage.PromptTokens)
			}
			// The copies share the prompt's KV when prefix caching is on.
			// (Choice 0 itself may hit the earlier single requests' blocks.)
			if hits := ts.Engine().Stats().PrefixHitTokens - hitsBefore; caching && hits < 2*uint64(u.PromptTokens/16*16) {
				t.Errorf("prefix cache hits %d: the 2 copies should reuse the prompt's full blocks", hits)
			}

			// Streamed, with usage: the same choices.
			code, _, body = ts.post(t, "/v1/chat/completions", chatBody(3, 100, `,"stream":true,"stream_options":{"include_usage":true}`))
			if code != 200 {
				t.Fatalf("%d %s", code, body)
			}
			texts, finish, lps, su := streamedChat(t, body, 3)
			for i := range 3 {
				if texts[i] != single[i] || finish[i] != "length" || lps[i] != 6 {
					t.Errorf("streamed choice %d: %q finish %q, %d logprobs; want %q", i, texts[i], finish[i], lps[i], single[i])
				}
			}
			if su == nil || su.PromptTokens != u.PromptTokens || su.CompletionTokens != 18 || su.TotalTokens != u.TotalTokens {
				t.Errorf("stream usage %+v, want %+v", su, u)
			}

			// Completions: 2 prompts × n=2; choice p*2+j is copy j of prompt p.
			cbody := `{"prompt":["` + nPrompt + `","abc"],"n":2,"seed":7,"temperature":0.8,"max_tokens":4,"logprobs":1,"echo":false}`
			code, _, body = ts.post(t, "/v1/completions", cbody)
			if code != 200 {
				t.Fatalf("%d %s", code, body)
			}
			cr := decode[openai.Completion](t, body)
			if len(cr.Choices) != 4 {
				t.Fatalf("%d choices: %s", len(cr.Choices), body)
			}
			for i, c := range cr.Choices {
				if c.Index != i || deref(c.FinishReason) != "length" || c.Logprobs == nil || len(c.Logprobs.Tokens) != 4 {
					t.Errorf("completion choice %d: %+v", i, c)
				}
			}
			if cr.Choices[0].Text == cr.Choices[1].Text {
				t.Errorf("seeded copies should differ: %q", cr.Choices[0].Text)
			}
			if cr.Usage.PromptTokens != len(nPrompt)+3 || cr.Usage.CompletionTokens != 16 {
				t.Errorf("completion usage %+v, want prompt %d completion 16", cr.Usage, len(nPrompt)+3)
			}
			code, _, body = ts.post(t, "/v1/completions", strings.TrimSuffix(cbody, "}")+`,"stream":true,"stream_options":{"include_usage":true}}`)
			if code != 200 {
				t.Fatalf("%d %s", code, body)
			}
			events := readSSE(t, body)
			stexts, sfinish := make([]string, 4), make([]string, 4)
			var cu *openai.Usage
			for _, raw := range events {
				c := decode[openai.Completion](t, raw)
				if c.Usage != nil {
					cu = c.Usage
					continue
				}
				for _, ch := range c.Choices {
					if sfinish[ch.Index] != "" {
						t.Errorf("chunk of choice %d after its finish: %s", ch.Index, raw)
					}
					stexts[ch.Index] += ch.Text
					sfinish[ch.Index] = deref(ch.FinishReason)
				}
			}
			for i := range 4 {
				if stexts[i] != cr.Choices[i].Text || sfinish[i] != "length" {
					t.Errorf("streamed completion choice %d: %q %q, want %q", i, stexts[i], sfinish[i], cr.Choices[i].Text)
				}
			}
			if cu == nil || cu.PromptTokens != cr.Usage.PromptTokens || cu.CompletionTokens != 16 {
				t.Errorf("stream usage %+v, want %+v", cu, cr.Usage)
			}

			// Greedy choices are all the same.
			code, _, body = ts.post(t, "/v1/completions", `{"prompt":"q","n":2,"temperature":0,"max_tokens":5}`)
			g := decode[openai.Completion](t, body)
			if code != 200 || len(g.Choices) != 2 || g.Choices[0].Text != g.Choices[1].Text {
				t.Errorf("greedy n=2: %d %s", code, body)
			}
			waitFor(t, "engine idle", 5*time.Second, func() bool { return idle(ts.Server) })
		})
	}
}

// A client that goes away cancels every choice, and a failed step fails the
// request.
func TestNChoicesCancelAndFail(t *testing.T) {
	ts := startServer(t, func(o *Options, b *scriptBackend) {
		o.Engine.PrefixCaching = true
		b.delay = disconnectStepDelay
	})
	before := ts.Engine().Stats().FinishedCancelled
	conn, err := net.Dial("tcp", strings.TrimPrefix(ts.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	body := `{"messages":[{"role":"user","content":"` + nPrompt + `"}],"n":3,"max_tokens":400,"stream":true}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	rd := bufio.NewReader(conn)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, "reasoning_content") {
			break
		}
	}
	waitFor(t, "all choices running", 5*time.Second, func() bool { return ts.Engine().Stats().Running == 3 })
	conn.Close()
	// 20 s: under -race on a loaded 2-core CI machine the cancellation has
	// taken over 5 s twice (2026-11-24).
	waitForEngine(t, ts.Server, "the 3 choices cancelled", 20*time.Second, func(st engine.Stats) bool {
		return st.Running == 0 && st.Waiting == 0 && st.KVBlocksUsed == 0 && st.FinishedCancelled == before+3
	})

	ts.backend.failNext.Store(true)
	code, _, resp := ts.post(t, "/v1/completions", `{"prompt":"x","n":2,"max_tokens":3}`)
	if code != 500 || !strings.Contains(string(resp), "injected backend failure") {
		t.Errorf("status %d: %s", code, resp)
	}
	code, _, resp = ts.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"n":2,"max_tokens":3}`)
	if code != 200 || len(decode[openai.ChatCompletion](t, resp).Choices) != 2 {
		t.Errorf("after a failure: %d %s", code, resp)
	}
	waitFor(t, "engine idle", 5*time.Second, func() bool { return idle(ts.Server) })
}

// With prefix caching, the copies of n are submitted once the first copy's
// prefill is done, so they find the prompt's full blocks in the cache.
func TestNChoicesSharePrompt(t *testing.T) {
	ts := startServer(t, func(o *Options, _ *scriptBackend) { o.Engine.PrefixCaching = true })
	code, _, body := ts.post(t, "/v1/completions", `{"prompt":"`+nPrompt+`","n":3,"max_tokens":4,"temperature":0}`)
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	r := decode[openai.Completion](t, body)
	// 40 prompt tokens: two full blocks of 16, found by each of the 2 copies.
	if st := ts.Engine().Stats(); st.PrefixHitTokens != 2*32 || st.PromptTokens != 3*40 {
		t.Errorf("prefix cache hits %d tokens (prompts %d), want 64", st.PrefixHitTokens, st.PromptTokens)
	}
	if r.Usage.PromptTokens != 40 || r.Usage.CompletionTokens != 12 || r.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("usage %+v", r.Usage)
	}
}
