package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/server"
	"github.com/glmctl/glmctl/pkg/tokenizer"
	"github.com/glmctl/glmctl/pkg/tokenizer/chat"
)

func (a *app) newGenerateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "generate [PROMPT]",
		Short: "Generate a completion and stream it to stdout",
		Long: `generate runs one request through the engine (continuous-batching scheduler, paged KV
cache, sampling) on the chosen backend and streams the text to stdout as it is produced.
A statistics line (prompt tokens, time to first token, tokens/s) goes to stderr.
The prompt is text (tokenized with the model's tokenizer.json), a chat message with --chat,
or raw token ids with --prompt-ids. Ctrl-C stops generation cleanly.
--synthetic runs full-size synthetic weights instead of a model directory (docs/synthetic.md);
such a model has no tokenizer: give --prompt-ids, and the output is token ids.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			prompt := ""
			if len(args) == 1 {
				prompt = args[0]
			}
			return a.runGenerate(cmd.Context(), prompt)
		},
	}
	f := cmd.Flags()
	f.String("model", "testdata/models/tiny-f32", "model directory")
	addBackendFlags(f)
	addSpeculativeFlags(f)
	addSyntheticFlags(f)
	f.String("prompt-ids", "", "comma-separated prompt token ids (instead of text)")
	f.Bool("chat", false, "wrap the prompt as a user message in the model's chat template")
	f.String("system", "", "system message (with --chat)")
	f.Bool("thinking", true, "with --chat: let the model think first (GLM-4.7 thinking mode)")
	f.Float32("temperature", 1.0, "sampling temperature; 0 = greedy")
	f.Float32("top-p", 1.0, "nucleus sampling mass (1 = off)")
	f.Int("top-k", 0, "keep the k most likely tokens (0 = off)")
	f.Float32("min-p", 0, "drop tokens below min-p × the top probability (0 = off)")
	f.Float32("repetition-penalty", 1.0, "repetition penalty over prompt and output (1 = off)")
	f.Float32("frequency-penalty", 0, "OpenAI frequency penalty")
	f.Float32("presence-penalty", 0, "OpenAI presence penalty")
	f.Int("max-tokens", 256, "most tokens to generate")
	f.Int64("seed", -1, "sampling seed (-1 = random, reported in --json)")
	f.StringArray("stop", nil, "stop string (repeatable)")
	f.Bool("ignore-eos", false, "do not stop at the model's end-of-sequence tokens")
	f.Bool("json", false, "print one JSON object (text, token ids, usage, timings) instead of streaming")
	f.Int("max-batched-tokens", engine.DefaultMaxBatchedTokens, "per-step token budget (prefill chunk size)")
	addPrefillWithDecodeFlag(f)
	return cmd
}

// generationResult is the --json output of generate.
type generationResult struct {
	Text             string  `json:"text"`
	TokenIDs         []int32 `json:"token_ids"`
	PromptTokenIDs   []int32 `json:"prompt_token_ids"`
	FinishReason     string  `json:"finish_reason"`
	PromptTokens     int     `json:"prompt_tokens"`
	CompletionTokens int     `json:"completion_tokens"`
	Seed             int64   `json:"seed"`
	TTFTMillis       float64 `json:"ttft_ms"`
	TokensPerSecond  float64 `json:"tokens_per_s"`
	Backend          string  `json:"backend"`
	// Speculative decoding (--speculative mtp): draft tokens the model
	// verified and accepted.
	DraftsVerified uint64 `json:"drafts_verified,omitempty"`
	DraftsAccepted uint64 `json:"drafts_accepted,omitempty"`
	// Chat is the parsed output of --chat: reasoning, answer, tool calls.
	Chat *chatOutput `json:"chat,omitempty"`
}

// chatOutput is the --json form of a parsed chat answer.
type chatOutput struct {
	ReasoningContent string                `json:"reasoning_content"`
	Content          string                `json:"content"`
	ToolCalls        []chat.ParsedToolCall `json:"tool_calls,omitempty"`
}

func parseTokenIDs(s string) ([]int32, error) {
	var ids []int32
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		v, err := strconv.ParseInt(part, 10, 32)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("--prompt-ids: entry %d (%q) is not a non-negative token id", i, part)
		}
		ids = append(ids, int32(v))
	}
	if len(ids) == 0 {
		return nil, errors.New("--prompt-ids: no token ids given")
	}
	return ids, nil
}

// samplingFromFlags reads the sampling flags.
func (a *app) samplingFromFlags() engine.SamplingParams {
	v := a.v
	p := engine.SamplingParams{
		Temperature:       float32(v.GetFloat64("temperature")),
		TopK:              v.GetInt("top-k"),
		TopP:              float32(v.GetFloat64("top-p")),
		MinP:              float32(v.GetFloat64("min-p")),
		RepetitionPenalty: float32(v.GetFloat64("repetition-penalty")),
		FrequencyPenalty:  float32(v.GetFloat64("frequency-penalty")),
		PresencePenalty:   float32(v.GetFloat64("presence-penalty")),
	}
	if seed := v.GetInt64("seed"); seed >= 0 {
		p.Seed, p.HasSeed = seed, true
	}
	return p
}

// textSink receives generated text as it arrives.
type textSink interface{ write(text string) error }

// plainSink writes text as is (nothing when quiet).
type plainSink struct {
	w     io.Writer
	quiet bool
}

func (p plainSink) write(text string) error {
	if p.quiet {
		return nil
	}
	_, err := io.WriteString(p.w, text)
	return err
}

// chatSink splits chat output into reasoning, answer and tool calls as it
// streams, and shows the reasoning apart, as ollama does.
type chatSink struct {
	w        io.Writer
	quiet    bool
	p        server.OutputParser
	result   chat.Result
	thinking bool // inside the shown "Thinking..." block
}

func (c *chatSink) write(text string) error { return c.show(c.p.Add(text)) }

func (c *chatSink) finish() error {
	if err := c.show(c.p.Finish()); err != nil {
		return err
	}
	if c.thinking && !c.quiet {
		_, err := io.WriteString(c.w, "\n...done thinking.\n\n")
		return err
	}
	return nil
}

func (c *chatSink) show(events []chat.Event) error {
	c.result.Add(events...)
	if c.quiet {
		return nil
	}
	for _, ev := range events {
		var s string
		switch ev.Kind {
		case chat.EventReasoning:
			if !c.thinking {
				c.thinking = true
				s = "Thinking...\n"
			}
			s += ev.Text
		case chat.EventContent:
			if c.thinking {
				c.thinking = false
				s = "\n...done thinking.\n\n"
			}
			s += ev.Text
		case chat.EventToolCall:
			s = fmt.Sprintf("\n[tool call %s %s]\n", ev.ToolCall.Name, ev.ToolCall.Arguments)
		}
		if _, err := io.WriteString(c.w, s); err != nil {
			return err
		}
	}
	return nil
}

// streamGeneration submits req to a running engine and writes text deltas
// to sink as they arrive. It returns when the request ends;
// cancelling ctx cancels the request and still returns what was produced.
func streamGeneration(ctx context.Context, eng *engine.Engine, req *engine.Request, sink textSink) (*generationResult, error) {
	start := time.Now()
	// Cancel through the stream rather than the Submit context: Cancel still
	// delivers the final "cancelled" event with usage.
	st, err := eng.Submit(context.WithoutCancel(ctx), req)
	if err != nil {
		return nil, err
	}
	defer st.Cancel()
	stopWatch := context.AfterFunc(ctx, st.Cancel)
	defer stopWatch()
	res := &generationResult{PromptTokenIDs: req.PromptTokens, PromptTokens: len(req.PromptTokens)}
	var first time.Time
	var text strings.Builder
	for ev := range st.Events() {
		if ev.HasToken {
			if first.IsZero() {
				first = time.Now()
			}
			res.TokenIDs = append(res.TokenIDs, ev.Token)
		}
		if ev.Text != "" {
			text.WriteString(ev.Text)
			if err := sink.write(ev.Text); err != nil {
				return nil, fmt.Errorf("write output: %w", err)
			}
		}
		if ev.Finish != "" {
			res.FinishReason = string(ev.Finish)
			res.PromptTokens = ev.Usage.PromptTokens
			res.CompletionTokens = ev.Usage.CompletionTokens
			if ev.Finish == engine.FinishError {
				return res, fmt.Errorf("generation failed: %w", ev.Err)
			}
		}
	}
	end := time.Now()
	res.Text = text.String()
	res.Seed = st.Seed
	if !first.IsZero() {
		res.TTFTMillis = float64(first.Sub(start).Microseconds()) / 1000
		if n := len(res.TokenIDs); n > 1 {
			res.TokensPerSecond = float64(n-1) / end.Sub(first).Seconds()
		}
	}
	return res, nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// generateChatPrompt is the chat prompt of generate --chat: an optional
// system message and the user's prompt, thinking as asked.
func generateChatPrompt(system, prompt string, thinking bool) server.ChatPrompt {
	var msgs []chat.Message
	if system != "" {
		msgs = append(msgs, chat.Message{Role: "system", Content: chat.Content(system)})
	}
	msgs = append(msgs, chat.Message{Role: "user", Content: chat.Content(prompt)})
	return server.ChatPrompt{Messages: msgs, EnableThinking: &thinking}
}

// encodeChat renders and encodes a chat prompt exactly as the server's chat
// endpoints do (server.EncodeChat with the directory's GLM chat format).
func encodeChat(tok *tokenizer.Bundle, cp server.ChatPrompt) ([]int32, error) {
	if tok.Variant == chat.VariantUnknown {
		return nil, fmt.Errorf("encode chat: %s has no GLM chat template (chat_template.jinja or tokenizer_config.json chat_template)", tok.Dir)
	}
	ids, _, err := server.EncodeChat(server.GLMChat{Variant: tok.Variant}, tokenizer.ServerTokenizer{Tok: tok}, cp)
	if re := (*server.RenderError)(nil); errors.As(err, &re) {
		return nil, re.Err
	} else if err != nil {
		return nil, fmt.Errorf("encode chat: %w", err)
	}
	return ids, nil
}

func (a *app) runGenerate(ctx context.Context, prompt string) error {
	v := a.v
	src, err := a.modelFromFlags()
	if err != nil {
		return err
	}
	dir := src.dir
	var ids []int32
	var tok *tokenizer.Bundle
	var chatPrompt *server.ChatPrompt // set with --chat
	if s := v.GetString("prompt-ids"); s != "" {
		if prompt != "" {
			return errors.New("give either a PROMPT or --prompt-ids, not both")
		}
		if ids, err = parseTokenIDs(s); err != nil {
			return err
		}
	}
	if src.spec != nil && ids == nil {
		return errNoTokenizer
	}
	// The tokenizer is needed for text prompts and to show text; with
	// --prompt-ids a model directory without one still generates ids.
	if src.spec == nil {
		tok, err = tokenizer.Load(dir)
		if err != nil && ids == nil {
			return fmt.Errorf("load tokenizer: %w", err)
		}
	}
	if tok != nil {
		defer tok.Close()
	}
	if ids == nil {
		if prompt == "" {
			return errors.New("no prompt: give PROMPT or --prompt-ids")
		}
		if v.GetBool("chat") {
			cp := generateChatPrompt(v.GetString("system"), prompt, v.GetBool("thinking"))
			chatPrompt = &cp
			if ids, err = encodeChat(tok, cp); err != nil {
				return err
			}
		} else if ids, err = tok.Encode(prompt, false); err != nil {
			return fmt.Errorf("tokenize prompt: %w", err)
		}
		if len(ids) == 0 {
			return errors.New("the prompt tokenizes to no tokens")
		}
	}

	be, err := a.open(ctx, src)
	if err != nil {
		return err
	}
	defer be.Close()
	cfg := engine.DefaultConfig()
	cfg.MaxBatchedTokens = v.GetInt("max-batched-tokens")
	cfg.MaxPrefillWithDecode = v.GetInt("max-prefill-with-decode")
	if cfg.DraftTokens, cfg.DraftMaxBatch, err = a.speculative(); err != nil {
		return err
	}
	cfg.Logger = a.log
	if tok != nil {
		// Chat output keeps </think>, <tool_call>... for the parser.
		cfg.Detokenizer = tokenizer.Detokenizer{Tok: tok, KeepSpecial: chatPrompt != nil}
		cfg.EOSTokenIDs = tok.StopIDs
	}
	eng, stopEngine, err := engine.Start(ctx, be, cfg)
	if err != nil {
		return err
	}
	defer stopEngine()

	req := &engine.Request{
		PromptTokens: ids,
		Sampling:     a.samplingFromFlags(),
		MaxTokens:    v.GetInt("max-tokens"),
		StopStrings:  v.GetStringSlice("stop"),
		IgnoreEOS:    v.GetBool("ignore-eos"),
	}
	if req.MaxTokens <= 0 {
		return fmt.Errorf("--max-tokens: must be > 0, got %d", req.MaxTokens)
	}
	if len(req.StopStrings) > 0 && tok == nil {
		return errors.New("--stop needs the model's tokenizer.json")
	}
	asJSON := v.GetBool("json")
	var sink textSink = plainSink{w: a.out, quiet: asJSON || tok == nil}
	var cs *chatSink
	if chatPrompt != nil {
		cs = &chatSink{w: a.out, quiet: asJSON, p: server.GLMChat{Variant: tok.Variant}.NewParser(chatPrompt.ParserOptions())}
		sink = cs
	}
	res, err := streamGeneration(ctx, eng, req, sink)
	if err != nil {
		return err
	}
	if cs != nil {
		if err := cs.finish(); err != nil {
			return err
		}
		res.Chat = &chatOutput{ReasoningContent: cs.result.Reasoning, Content: cs.result.Content, ToolCalls: cs.result.ToolCalls}
	}
	res.Backend = be.Info().Name
	st := eng.Stats()
	res.DraftsVerified, res.DraftsAccepted = st.DraftsVerified, st.DraftsAccepted
	if asJSON {
		return writeJSON(a.out, res)
	}
	if tok == nil {
		fmt.Fprintln(a.out, strings.Trim(strings.Join(strings.Fields(fmt.Sprint(res.TokenIDs)), ","), "[]"))
	} else {
		fmt.Fprintln(a.out)
	}
	drafts := ""
	if res.DraftsVerified > 0 {
		drafts = fmt.Sprintf(", drafts accepted %d of %d (%.0f%%)", res.DraftsAccepted, res.DraftsVerified,
			100*float64(res.DraftsAccepted)/float64(res.DraftsVerified))
	}
	fmt.Fprintf(a.errOut, "[%s] prompt %d tokens, generated %d, TTFT %.1f ms, %.1f tokens/s%s, finish %s, seed %d\n",
		res.Backend, res.PromptTokens, res.CompletionTokens, res.TTFTMillis, res.TokensPerSecond, drafts, res.FinishReason, res.Seed)
	return nil
}
