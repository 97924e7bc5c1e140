package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
)

var quiet = slog.New(slog.DiscardHandler)

// Start runs the loop past the caller's context: cancelling it leaves the
// engine serving; stop ends the loop (nil: stop asked), and is idempotent.
func TestStartStop(t *testing.T) {
	f := newFake(4, 64)
	ctx, cancel := context.WithCancel(context.Background())
	e, stop, err := Start(ctx, f, Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if c := collect(t, mustSubmit(t, e, &Request{PromptTokens: []int32{1, 2, 3}, MaxTokens: 4})); c.Finish != FinishLength || len(c.Tokens) != 4 {
		t.Fatalf("after the caller's context ended: %q with %d tokens", c.Finish, len(c.Tokens))
	}
	if err := stop(); err != nil {
		t.Fatalf("stop = %v, want nil", err)
	}
	if err := stop(); err != nil {
		t.Fatalf("second stop = %v, want nil", err)
	}
	if _, err := e.Submit(context.Background(), &Request{PromptTokens: []int32{1}}); !errors.Is(err, ErrEngineStopped) {
		t.Fatalf("submit after stop: %v", err)
	}
}

// A fatal backend error is what stop reports; an invalid config is Start's error.
func TestStartStopErrors(t *testing.T) {
	f := newFake(4, 64)
	f.block = func(context.Context, int, *StepBatch) error { return fmt.Errorf("%w: device lost", ErrBackendFatal) }
	e, stop, err := Start(context.Background(), f, Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	s := mustSubmit(t, e, &Request{PromptTokens: []int32{1}, MaxTokens: 2})
	if _, err := s.Collect(); !errors.Is(err, ErrBackendFatal) {
		t.Fatalf("request: %v, want ErrBackendFatal", err)
	}
	if err := stop(); !errors.Is(err, ErrBackendFatal) {
		t.Fatalf("stop = %v, want ErrBackendFatal", err)
	}
	if _, _, err := Start(context.Background(), f, Config{MaxSeqs: -1, Logger: quiet}); err == nil {
		t.Fatal("Start accepted MaxSeqs -1")
	}
}
