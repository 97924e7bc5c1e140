package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/glmctl/glmctl/pkg/backend/cpu"
	"github.com/glmctl/glmctl/pkg/server"
	"github.com/glmctl/glmctl/pkg/tokenizer"
)

// recordingTokenizer keeps the ids of the last prompt the server encoded.
type recordingTokenizer struct {
	tokenizer.ServerTokenizer
	mu   sync.Mutex
	last []int32
}

func (r *recordingTokenizer) Encode(text string) ([]int32, error) {
	ids, err := r.ServerTokenizer.Encode(text)
	r.mu.Lock()
	r.last = slices.Clone(ids)
	r.mu.Unlock()
	return ids, err
}

func (r *recordingTokenizer) lastIDs() []int32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// TestGenerateChatPromptMatchesServer: the same messages give the same
// prompt ids from `glmctl generate --chat` (its --json prompt_token_ids) and
// from the server's /v1/chat/completions (the ids its handler encodes), with
// and without a system message and thinking.
func TestGenerateChatPromptMatchesServer(t *testing.T) {
	tok, err := tokenizer.Load(tinyDir)
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	be, err := cpu.Open(tinyDir, cpu.Options{NumKVBlocks: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	rec := &recordingTokenizer{ServerTokenizer: tokenizer.ServerTokenizer{Tok: tok}}
	srv, err := server.New(server.Options{Backend: be, Tokenizer: rec, Chat: server.GLMChat{Variant: tok.Variant},
		ModelName: "tiny", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	url := "http://" + ln.Addr().String() + "/v1/chat/completions"

	cases := []struct {
		system, user string
		thinking     bool
	}{
		{"", "Hi", true},
		{"", "Hi", false},
		{"You are terse.", "What is 2+2? Answer in 北京 style.", true},
		{"You are terse.", "<|user|> looks special", false},
	}
	for _, tc := range cases {
		args := []string{"--chat", tc.user, "--max-tokens", "1", "--thinking=" + strconv.FormatBool(tc.thinking)}
		msgs := `{"role":"user","content":` + mustJSON(tc.user) + `}`
		if tc.system != "" {
			args = append(args, "--system", tc.system)
			msgs = `{"role":"system","content":` + mustJSON(tc.system) + `},` + msgs
		}
		gen := generateJSON(t, args...).PromptTokenIDs

		body := `{"model":"tiny","max_tokens":1,"messages":[` + msgs + `],"chat_template_kwargs":{"enable_thinking":` + strconv.FormatBool(tc.thinking) + `}}`
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%+v: chat completion %d: %s", tc, resp.StatusCode, b)
		}
		if got := rec.lastIDs(); len(gen) == 0 || !slices.Equal(gen, got) {
			t.Errorf("%+v: generate prompt ids %v, server prompt ids %v", tc, gen, got)
		}
	}
}
