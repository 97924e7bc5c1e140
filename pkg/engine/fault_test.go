package engine_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/glmctl/glmctl/internal/faultinject"
	"github.com/glmctl/glmctl/pkg/engine"
)

// faultRun is an engine on the toy model behind a fault-injecting wrapper.
type faultRun struct {
	eng    *engine.Engine
	fb     *faultinject.Backend
	toy    *toyModel
	cancel context.CancelFunc
	done   chan error
	start  func() // starts the loop; call once
}

func startFaulty(t *testing.T, cfg engine.Config, faults ...faultinject.Fault) *faultRun {
	t.Helper()
	toy := newToy(4, 64)
	fb := faultinject.Wrap(toy, faults...)
	cfg.Logger = slog.New(slog.DiscardHandler)
	e, err := engine.New(fb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &faultRun{eng: e, fb: fb, toy: toy, cancel: cancel, done: make(chan error, 1)}
	r.start = func() { go func() { r.done <- e.Run(ctx) }() }
	t.Cleanup(cancel)
	return r
}

// outcome is how one request ended.
type outcome struct {
	c   engine.Completion
	err error
}

// finishAll reads every stream to its end; a stream that does not end within
// 10 s is a lost or hung request.
func finishAll(t *testing.T, sts []*engine.Stream) []outcome {
	t.Helper()
	out := make([]outcome, len(sts))
	ch := make(chan int, len(sts))
	for i, s := range sts {
		go func() {
			out[i].c, out[i].err = s.Collect()
			ch <- i
		}()
	}
	deadline := time.After(10 * time.Second)
	for range sts {
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("a request did not finish within 10 s (lost or hung)")
		}
	}
	return out
}

// checkNoLeaks stops the engine, then checks that every KV block is free and
// that the goroutines started since before returned to their count.
func (r *faultRun) checkNoLeaks(t *testing.T, goroutinesBefore int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for s := r.eng.Stats(); s.Waiting+s.Running > 0 && time.Now().Before(deadline); s = r.eng.Stats() {
		time.Sleep(time.Millisecond)
	}
	if s := r.eng.Stats(); s.KVBlocksUsed != 0 || s.Waiting+s.Running != 0 {
		t.Errorf("%d KV blocks used, %d waiting, %d running after every request ended", s.KVBlocksUsed, s.Waiting, s.Running)
	}
	r.cancel()
	<-r.done
	r.done <- nil // later readers do not block
	checkGoroutines(t, goroutinesBefore)
	r.toy.mu.Lock()
	defer r.toy.mu.Unlock()
	if r.toy.violation != nil {
		t.Errorf("toy model saw a fault: %v", r.toy.violation)
	}
}

// checkGoroutines waits (bounded) for the goroutine count to come back to
// before; more means a leaked stream forwarder, watcher or loop.
func checkGoroutines(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	n := runtime.NumGoroutine()
	for n > before && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
	if n > before {
		buf := make([]byte, 1<<16)
		buf = buf[:runtime.Stack(buf, true)]
		t.Errorf("%d goroutines, %d before: leak\n%s", n, before, buf)
	}
}

func submitMany(t *testing.T, e *engine.Engine, n, maxTokens int) []*engine.Stream {
	t.Helper()
	sts := make([]*engine.Stream, n)
	for i := range sts {
		prompt := make([]int32, 3+i)
		for j := range prompt {
			prompt[j] = int32((i*7 + j) % toyVocab)
		}
		sts[i] = mustSubmit(t, e, &engine.Request{PromptTokens: prompt, MaxTokens: maxTokens, IgnoreEOS: true,
			Label: fmt.Sprintf("r%d", i)})
	}
	return sts
}

// A failing, panicking or NaN step fails the requests it hits with an error
// event, frees their blocks, and the engine keeps serving the others and
// later requests.
func TestFaultStepFailsOnlyItsRequests(t *testing.T) {
	for _, tc := range []struct {
		kind    faultinject.Kind
		wantErr error
		// wantFailed: how many of the requests fail (-1: at least one).
		wantFailed int
		stat       func(engine.Stats) uint64
	}{
		{faultinject.Fail, faultinject.Injected, -1, func(s engine.Stats) uint64 { return s.StepErrors }},
		{faultinject.Panic, engine.ErrStepPanic, -1, func(s engine.Stats) uint64 { return s.StepPanics }},
		{faultinject.NaN, engine.ErrNonFiniteLogits, 1, func(s engine.Stats) uint64 { return s.NonFiniteLogits }},
	} {
		t.Run(tc.kind.String(), func(t *testing.T) {
			before := runtime.NumGoroutine()
			cfg := engine.DefaultConfig()
			cfg.MaxBatchedTokens = 16
			cfg.MaxSeqs = 2 // two requests per step: the fault hits a subset
			r := startFaulty(t, cfg, faultinject.Fault{Kind: tc.kind, Step: 4, Seq: 1})
			sts := submitMany(t, r.eng, 6, 8)
			r.start()
			failed := 0
			for i, o := range finishAll(t, sts) {
				switch o.c.Finish {
				case engine.FinishError:
					failed++
					if !errors.Is(o.err, tc.wantErr) {
						t.Errorf("request %d: error %v, want one wrapping %v", i, o.err, tc.wantErr)
					}
				case engine.FinishLength:
					if len(o.c.Tokens) != 8 || o.err != nil {
						t.Errorf("request %d: %d tokens, err %v", i, len(o.c.Tokens), o.err)
					}
				default:
					t.Errorf("request %d: finish %q", i, o.c.Finish)
				}
			}
			if failed == 0 || (tc.wantFailed > 0 && failed != tc.wantFailed) {
				t.Errorf("%d requests failed, want %d", failed, tc.wantFailed)
			}
			if failed == len(sts) {
				t.Errorf("every request failed; the fault should hit one step only")
			}
			if got := tc.stat(r.eng.Stats()); got != 1 {
				t.Errorf("failure counter = %d, want 1", got)
			}
			// Still serving.
			c := collect(t, mustSubmit(t, r.eng, &engine.Request{PromptTokens: []int32{1, 2, 3}, MaxTokens: 4, IgnoreEOS: true}))
			if c.Finish != engine.FinishLength || len(c.Tokens) != 4 {
				t.Errorf("request after the fault: finish %q, %d tokens", c.Finish, len(c.Tokens))
			}
			if r.fb.Hits(tc.kind) != 1 {
				t.Errorf("fault injected %d times", r.fb.Hits(tc.kind))
			}
			r.checkNoLeaks(t, before)
		})
	}
}

// A fatal backend error fails every request (those of the step with the
// error, the others with ErrEngineStopped wrapping it), stops the loop with
// the error, and refuses later requests.
func TestFaultFatalStopsEngine(t *testing.T) {
	before := runtime.NumGoroutine()
	r := startFaulty(t, engine.Config{MaxBatchedTokens: 8, MaxSeqs: 2}, faultinject.Fault{Kind: faultinject.Fatal, Step: 3})
	sts := submitMany(t, r.eng, 5, 8)
	r.start()
	for i, o := range finishAll(t, sts) {
		if o.c.Finish != engine.FinishError || !errors.Is(o.err, engine.ErrBackendFatal) {
			t.Errorf("request %d: finish %q, err %v; want error wrapping ErrBackendFatal", i, o.c.Finish, o.err)
		}
	}
	select {
	case err := <-r.done:
		if !errors.Is(err, engine.ErrBackendFatal) {
			t.Errorf("Run returned %v, want ErrBackendFatal", err)
		}
		r.done <- err
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after a fatal error")
	}
	if _, err := r.eng.Submit(context.Background(), &engine.Request{PromptTokens: []int32{1}}); !errors.Is(err, engine.ErrEngineStopped) {
		t.Errorf("Submit after a fatal error: %v, want ErrEngineStopped", err)
	}
	if s := r.eng.Stats(); s.FatalErrors != 1 || s.KVBlocksUsed != 0 {
		t.Errorf("fatal errors %d, KV blocks used %d", s.FatalErrors, s.KVBlocksUsed)
	}
	r.checkNoLeaks(t, before)
}

// A stalled step delays requests but loses none.
func TestFaultStallLosesNothing(t *testing.T) {
	before := runtime.NumGoroutine()
	r := startFaulty(t, engine.DefaultConfig(), faultinject.Fault{Kind: faultinject.Stall, Step: 2, Stall: 200 * time.Millisecond})
	r.start()
	for i, o := range finishAll(t, submitMany(t, r.eng, 4, 6)) {
		if o.err != nil || o.c.Finish != engine.FinishLength {
			t.Errorf("request %d: finish %q, err %v", i, o.c.Finish, o.err)
		}
	}
	r.checkNoLeaks(t, before)
}

// Blocks of a request that ended with non-finite logits never serve another
// request from the prefix cache: they may hold NaN.
func TestFaultNaNBlocksLeavePrefixCache(t *testing.T) {
	before := runtime.NumGoroutine()
	cfg := engine.DefaultConfig()
	cfg.MaxBatchedTokens = 8 // the 16-token prompt takes two prefill steps
	r := startFaulty(t, cfg, faultinject.Fault{Kind: faultinject.NaN, Step: 2})
	r.start()
	prompt := make([]int32, 16)
	for i := range prompt {
		prompt[i] = int32(i + 1)
	}
	o := finishAll(t, []*engine.Stream{mustSubmit(t, r.eng, &engine.Request{PromptTokens: prompt, MaxTokens: 4})})[0]
	if !errors.Is(o.err, engine.ErrNonFiniteLogits) {
		t.Fatalf("first request: finish %q, err %v; want non-finite logits", o.c.Finish, o.err)
	}
	c := collect(t, mustSubmit(t, r.eng, &engine.Request{PromptTokens: prompt, MaxTokens: 4, IgnoreEOS: true}))
	if c.Usage.CachedPromptTokens != 0 {
		t.Errorf("second request reused %d cached prompt tokens of the failed one", c.Usage.CachedPromptTokens)
	}
	r.checkNoLeaks(t, before)
}
