package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Endpoints the generator drives.
const (
	EndpointCompletions = "/v1/completions"
	EndpointChat        = "/v1/chat/completions"
)

// client sends one benchmark request and follows its stream.
type client struct {
	http        *http.Client
	base        string // scheme://host[:port][/prefix], without /v1
	endpoint    string
	model       string
	apiKey      string
	ignoreEOS   bool
	temperature float64
	timeout     time.Duration
}

func (c *client) body(p Prompt) ([]byte, error) {
	b := map[string]any{
		"model":          c.model,
		"max_tokens":     p.OutputLen,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
		"temperature":    c.temperature,
	}
	if c.ignoreEOS {
		// Hints that make the server produce exactly max_tokens: vLLM and
		// glmctl take ignore_eos, vLLM also min_tokens; others ignore them.
		b["ignore_eos"] = true
		b["min_tokens"] = p.OutputLen
	}
	if c.endpoint == EndpointChat {
		b["messages"] = []map[string]string{{"role": "user", "content": p.Text}}
		b["max_completion_tokens"] = p.OutputLen
	} else {
		b["prompt"] = p.Text
	}
	return json.Marshal(b)
}

func (c *client) newRequest(ctx context.Context, method, path string, body []byte) (*http.Request, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, r)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	return req, nil
}

// streamChunk is the part of a completions or chat stream chunk the
// generator reads.
type streamChunk struct {
	Choices []struct {
		Text  *string `json:"text"`
		Delta *struct {
			Content          *string         `json:"content"`
			ReasoningContent *string         `json:"reasoning_content"`
			Reasoning        *string         `json:"reasoning"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// hasText reports whether the chunk carries generated output.
func (ch *streamChunk) hasText() bool {
	for _, c := range ch.Choices {
		if c.Text != nil && *c.Text != "" {
			return true
		}
		if d := c.Delta; d != nil {
			if d.Content != nil && *d.Content != "" || d.ReasoningContent != nil && *d.ReasoningContent != "" ||
				d.Reasoning != nil && *d.Reasoning != "" || len(d.ToolCalls) > 0 && !bytes.Equal(d.ToolCalls, []byte("null")) {
				return true
			}
		}
	}
	return false
}

func (ch *streamChunk) finished() bool {
	for _, c := range ch.Choices {
		if c.FinishReason != nil && *c.FinishReason != "" {
			return true
		}
	}
	return false
}

// errorMessage reads an OpenAI error body ({"error": {"message": ...}} or
// {"error": "..."}), else returns the raw text, shortened.
func errorMessage(raw []byte) string {
	var e struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(raw, &e) == nil && len(e.Error) > 0 {
		raw = e.Error
	}
	var obj struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &obj) == nil && obj.Message != "" {
		return obj.Message
	}
	var s string
	if json.Unmarshal(raw, &s) == nil && s != "" {
		return s
	}
	t := strings.TrimSpace(string(raw))
	if len(t) > 300 {
		t = t[:300] + "..."
	}
	return t
}

// do sends p and follows the stream to its end. runStart anchors StartMs.
// A request cut off by ctx (an interrupt) is recorded as cancelled.
func (c *client) do(ctx context.Context, p Prompt, index int, runStart time.Time) Record {
	rec := Record{Index: index, PromptTokens: p.Tokens, MaxTokens: p.OutputLen}
	body, err := c.body(p)
	if err != nil {
		rec.Failure, rec.Error = FailConnection, err.Error()
		return rec
	}
	rctx := ctx
	if c.timeout > 0 {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	start := time.Now()
	rec.StartMs = ms(start.Sub(runStart))
	fail := func(kind string, err error) Record {
		rec.E2EMs = ms(time.Since(start))
		switch {
		case ctx.Err() != nil:
			rec.Failure, rec.Error = failCancelled, "interrupted"
		case rctx.Err() != nil:
			rec.Failure, rec.Error = FailTimeout, fmt.Sprintf("no complete response within %s", c.timeout)
		default:
			rec.Failure, rec.Error = kind, err.Error()
		}
		return rec
	}
	req, err := c.newRequest(rctx, http.MethodPost, c.endpoint, body)
	if err != nil {
		return fail(FailConnection, err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fail(FailConnection, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fail(fmt.Sprintf("%s_%d", FailHTTP, resp.StatusCode), fmt.Errorf("HTTP %d: %s", resp.StatusCode, errorMessage(b)))
	}
	var (
		last     time.Time
		finished bool // a finish_reason was seen
	)
	r := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, rerr := r.ReadBytes('\n')
		data, isData := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:"))
		data = bytes.TrimSpace(data)
		if isData && string(data) == "[DONE]" {
			break
		}
		if isData {
			var ch streamChunk
			if err := json.Unmarshal(data, &ch); err != nil {
				return fail(FailStream, fmt.Errorf("a stream event is not JSON: %.200s", data))
			}
			if len(ch.Error) > 0 && !bytes.Equal(ch.Error, []byte("null")) {
				return fail(FailStream, fmt.Errorf("error event: %s", errorMessage(ch.Error)))
			}
			now := time.Now()
			if ch.hasText() {
				if rec.Chunks == 0 {
					rec.TTFTMs = ms(now.Sub(start))
				} else {
					rec.ITLMs = append(rec.ITLMs, ms(now.Sub(last)))
				}
				last = now
				rec.Chunks++
			}
			finished = finished || ch.finished()
			if u := ch.Usage; u != nil {
				rec.OutputTokens, rec.OutputFromUsage = u.CompletionTokens, true
				if u.PromptTokens > 0 {
					rec.PromptTokens = u.PromptTokens
				}
			}
		} // other lines: blank separators, comments, "event:" lines
		if rerr == nil {
			continue
		}
		if !errors.Is(rerr, io.EOF) {
			return fail(FailStream, fmt.Errorf("reading the stream: %w", rerr))
		}
		if !finished {
			return fail(FailStream, errors.New("the stream ended without a finish_reason or [DONE]"))
		}
		break // a finish_reason came, then the server closed without [DONE]: accepted
	}
	rec.E2EMs = ms(time.Since(start))
	if rec.Chunks == 0 {
		return fail(FailEmpty, errors.New("the stream ended without any generated text"))
	}
	if !rec.OutputFromUsage {
		rec.OutputTokens = rec.Chunks
	}
	rec.OK = true
	return rec
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
