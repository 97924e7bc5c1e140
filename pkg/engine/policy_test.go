package engine

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

type stepShape struct {
	id       uint64
	start, n int
	sample   bool
}

func shapes(b StepBatch) []stepShape {
	var out []stepShape
	for _, s := range b.Seqs {
		out = append(out, stepShape{s.SeqID, s.StartPos, len(s.Tokens), s.Sample})
	}
	return out
}

// checkShapes fails t unless the recorded steps have exactly the shapes want.
func checkShapes(t *testing.T, got []StepBatch, want [][]stepShape) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d steps, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if g := shapes(got[i]); !slices.Equal(g, want[i]) {
			t.Fatalf("step %d: %+v, want %+v", i+1, g, want[i])
		}
	}
}

func TestChunkedPrefillWithinBudget(t *testing.T) {
	f := newFake(4, 64)
	e := newEngine(t, f, Config{MaxBatchedTokens: 8})
	s := mustSubmit(t, e, &Request{PromptTokens: seqTokens(0, 20), MaxTokens: 3})
	startEngine(t, e, f)
	c := collect(t, s)
	if c.Finish != FinishLength || len(c.Tokens) != 3 {
		t.Fatalf("finish %q with %d tokens, want length with 3", c.Finish, len(c.Tokens))
	}
	want := [][]stepShape{
		{{1, 0, 8, false}},
		{{1, 8, 8, false}},
		{{1, 16, 4, true}},
		{{1, 20, 1, true}},
		{{1, 21, 1, true}},
	}
	got := f.recorded()
	checkShapes(t, got, want)
	// The chunks carried the prompt in order.
	var fed []int32
	for _, b := range got[:3] {
		fed = append(fed, b.Seqs[0].Tokens...)
	}
	if !slices.Equal(fed, seqTokens(0, 20)) {
		t.Fatalf("prefill chunks carried %v", fed)
	}
}

func TestDecodesFirstThenPrefill(t *testing.T) {
	f := newFake(4, 64)
	e := newEngine(t, f, Config{MaxBatchedTokens: 10})
	a := mustSubmit(t, e, &Request{PromptTokens: seqTokens(0, 4), MaxTokens: 5})
	b := mustSubmit(t, e, &Request{PromptTokens: seqTokens(10, 30), MaxTokens: 2})
	startEngine(t, e, f)
	collect(t, a)
	collect(t, b)
	want := [][]stepShape{
		{{1, 0, 4, true}, {2, 0, 6, false}},
		{{1, 4, 1, true}, {2, 6, 9, false}},
		{{1, 5, 1, true}, {2, 15, 9, false}},
		{{1, 6, 1, true}, {2, 24, 6, true}},
		{{1, 7, 1, true}, {2, 30, 1, true}},
	}
	checkShapes(t, f.recorded(), want)
}

// While a sequence decodes, a step's prefill tokens stay within
// MaxPrefillWithDecode; once nothing decodes, a chunk takes the whole budget.
func TestPrefillCappedWhileDecoding(t *testing.T) {
	f := newFake(4, 64)
	e := newEngine(t, f, Config{MaxBatchedTokens: 16, MaxPrefillWithDecode: 4})
	a := mustSubmit(t, e, &Request{PromptTokens: seqTokens(0, 4), MaxTokens: 5})
	b := mustSubmit(t, e, &Request{PromptTokens: seqTokens(10, 40), MaxTokens: 2})
	startEngine(t, e, f)
	collect(t, a)
	collect(t, b)
	want := [][]stepShape{
		{{1, 0, 4, true}, {2, 0, 12, false}}, // nothing decodes yet: the whole budget
		{{1, 4, 1, true}, {2, 12, 4, false}},
		{{1, 5, 1, true}, {2, 16, 4, false}},
		{{1, 6, 1, true}, {2, 20, 4, false}},
		{{1, 7, 1, true}, {2, 24, 4, false}},
		{{2, 28, 12, true}}, // A finished: B's last chunk takes the budget again
		{{2, 40, 1, true}},
	}
	checkShapes(t, f.recorded(), want)
}

func TestFCFSHeadBlocksLaterRequests(t *testing.T) {
	// 8 blocks of 4 tokens. A holds 4-5 blocks; B needs 5 and must wait; C
	// needs 1 and would fit, but may not overtake B.
	f := newFake(4, 8)
	e := newEngine(t, f, Config{MaxBatchedTokens: 64})
	a := mustSubmit(t, e, &Request{PromptTokens: seqTokens(0, 16), MaxTokens: 4})
	b := mustSubmit(t, e, &Request{PromptTokens: seqTokens(20, 20), MaxTokens: 2})
	c := mustSubmit(t, e, &Request{PromptTokens: seqTokens(50, 4), MaxTokens: 2})
	startEngine(t, e, f)
	for _, s := range []*Stream{a, b, c} {
		if got := collect(t, s); got.Finish != FinishLength {
			t.Fatalf("request %d finished %q", s.ID, got.Finish)
		}
	}
	first := map[uint64]int{}
	for i, batch := range f.recorded() {
		for _, s := range batch.Seqs {
			if _, ok := first[s.SeqID]; !ok {
				first[s.SeqID] = i
			}
		}
	}
	if first[a.ID] != 0 || first[b.ID] == 0 {
		t.Fatalf("first steps %v: A should run alone first", first)
	}
	if first[c.ID] < first[b.ID] {
		t.Fatalf("C (step %d) overtook B (step %d)", first[c.ID], first[b.ID])
	}
	if p := e.Stats().Preemptions; p != 0 {
		t.Fatalf("%d preemptions; none needed", p)
	}
}

func TestPreemptsNewestAndRecomputes(t *testing.T) {
	// 6 blocks of 4: two sequences each growing to 5 blocks cannot coexist.
	f := newFake(4, 6)
	f.next = func(s *StepSeq) int32 { return int32(10*s.SeqID) + int32(s.SampleIndex) }
	e := newEngine(t, f, Config{MaxBatchedTokens: 64})
	a := mustSubmit(t, e, &Request{PromptTokens: seqTokens(0, 8), MaxTokens: 12})
	b := mustSubmit(t, e, &Request{PromptTokens: seqTokens(30, 8), MaxTokens: 12})
	startEngine(t, e, f)
	ca, cb := collect(t, a), collect(t, b)
	for _, c := range []struct {
		id  uint64
		out []int32
	}{{a.ID, ca.Tokens}, {b.ID, cb.Tokens}} {
		var want []int32
		for i := range 12 {
			want = append(want, int32(10*c.id)+int32(i))
		}
		if !slices.Equal(c.out, want) {
			t.Fatalf("request %d tokens %v, want %v (sample index must continue across preemption)", c.id, c.out, want)
		}
	}
	if e.Stats().Preemptions == 0 {
		t.Fatal("no preemption happened")
	}
	// A (oldest) is never preempted: its start positions only increase.
	// B restarts from position 0 with its prompt and output so far.
	lastA, lastB := -1, -1
	restarted := false
	for i, batch := range f.recorded() {
		for _, s := range batch.Seqs {
			switch s.SeqID {
			case a.ID:
				if s.StartPos <= lastA {
					t.Fatalf("step %d: A restarted at %d after %d", i+1, s.StartPos, lastA)
				}
				lastA = s.StartPos
			case b.ID:
				if s.StartPos < lastB {
					if s.StartPos != 0 || !s.Sample || len(s.Tokens) <= 8 {
						t.Fatalf("step %d: B resumed with %+v", i+1, s)
					}
					if want := append(seqTokens(30, 8), s.OutputTokens...); !slices.Equal(s.Tokens, want) {
						t.Fatalf("step %d: B recomputed %v, want prompt+output %v", i+1, s.Tokens, want)
					}
					restarted = true
				}
				lastB = s.StartPos
			}
		}
	}
	if !restarted {
		t.Fatal("B was never recomputed")
	}
}

func TestManyRequestsNoDeadlock(t *testing.T) {
	// 16 blocks of 4 = 64 tokens; max model len follows the KV capacity.
	f := newFake(4, 16)
	e := newEngine(t, f, Config{MaxBatchedTokens: 16, MaxSeqs: 4})
	if got := e.Limits().MaxModelLen; got != 64 {
		t.Fatalf("max model len %d, want 64 (KV capacity)", got)
	}
	r := rand.New(rand.NewPCG(7, 8))
	type job struct {
		s                 *Stream
		prompt, maxTokens int
	}
	var jobs []job
	for i := range 40 {
		p, m := 1+r.IntN(40), 1+r.IntN(40)
		jobs = append(jobs, job{mustSubmit(t, e, &Request{PromptTokens: seqTokens(i, p), MaxTokens: m}), p, m})
	}
	startEngine(t, e, f)
	for _, j := range jobs {
		c := collect(t, j.s)
		want := min(j.maxTokens, 64-j.prompt)
		if c.Finish != FinishLength || len(c.Tokens) != want {
			t.Fatalf("request %d (prompt %d, max %d): %q with %d tokens, want length with %d",
				j.s.ID, j.prompt, j.maxTokens, c.Finish, len(c.Tokens), want)
		}
		if c.Usage.PromptTokens != j.prompt || c.Usage.CompletionTokens != want {
			t.Fatalf("request %d usage %+v", j.s.ID, c.Usage)
		}
	}
	for i, b := range f.recorded() {
		if b.NumTokens() > 16 || len(b.Seqs) > 4 {
			t.Fatalf("step %d: %d tokens, %d seqs exceed the budget 16 / 4", i+1, b.NumTokens(), len(b.Seqs))
		}
	}
	if e.Stats().Preemptions == 0 {
		t.Fatal("expected preemptions under this KV budget")
	}
}

func TestRejectsInvalidRequests(t *testing.T) {
	f := newFake(4, 8) // 32 tokens of KV
	e := newEngine(t, f, Config{MaxModelLen: 1000})
	cases := []struct {
		name string
		req  *Request
		want string
	}{
		{"nil", nil, "nil request"},
		{"empty prompt", &Request{}, "prompt is empty"},
		{"never fits", &Request{PromptTokens: seqTokens(0, 33)}, "prompt has 33 tokens; the limit is 32"},
		{"token range", &Request{PromptTokens: []int32{1, 100}}, "prompt token 100 at index 1 is outside the vocabulary (size 100)"},
		{"max tokens", &Request{PromptTokens: []int32{1}, MaxTokens: -1}, "max_tokens -1"},
		{"sampling", &Request{PromptTokens: []int32{1}, Sampling: SamplingParams{TopP: 2}}, "top_p"},
		{"stop id", &Request{PromptTokens: []int32{1}, StopTokenIDs: []int32{-3}}, "stop token id -3"},
		{"empty stop string", &Request{PromptTokens: []int32{1}, StopStrings: []string{""}}, "stop string 0 is empty"},
		{"stop without detokenizer", &Request{PromptTokens: []int32{1}, StopStrings: []string{"x"}}, "need a detokenizer"},
		{"too many stops", &Request{PromptTokens: []int32{1}, StopStrings: make([]string, MaxStopStrings+1)}, "the limit is 64"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.Submit(context.Background(), tc.req)
			if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalidRequest containing %q", err, tc.want)
			}
		})
	}
	// The largest prompt that fits does run, and stops at the context limit.
	startEngine(t, e, f)
	c := collect(t, mustSubmit(t, e, &Request{PromptTokens: seqTokens(0, 32)}))
	if c.Finish != FinishLength || len(c.Tokens) != 1 {
		t.Fatalf("32-token prompt: %q with %d tokens, want length with 1", c.Finish, len(c.Tokens))
	}
}

func TestConfigErrors(t *testing.T) {
	cases := []struct {
		name string
		info BackendInfo
		cfg  Config
		want string
	}{
		{"block size", BackendInfo{VocabSize: 10, NumKVBlocks: 4}, Config{}, "KV block size 0"},
		{"blocks", BackendInfo{VocabSize: 10, KVBlockSize: 4}, Config{}, "0 KV blocks"},
		{"vocab", BackendInfo{KVBlockSize: 4, NumKVBlocks: 4}, Config{}, "vocab size 0"},
		{"too many blocks", BackendInfo{VocabSize: 10, KVBlockSize: 4, NumKVBlocks: 4}, Config{NumKVBlocks: 5}, "KV blocks 5 must be in [0, 4]"},
		{"model len", BackendInfo{VocabSize: 10, KVBlockSize: 4, NumKVBlocks: 4, MaxContext: 100}, Config{MaxModelLen: 101}, "exceeds the backend's max context 100"},
		{"eos", BackendInfo{VocabSize: 10, KVBlockSize: 4, NumKVBlocks: 4}, Config{EOSTokenIDs: []int32{10}}, "EOS token id 10"},
		{"budget", BackendInfo{VocabSize: 10, KVBlockSize: 4, NumKVBlocks: 4}, Config{MaxBatchedTokens: -1}, "max batched tokens -1"},
		{"budget over the backend's", BackendInfo{Name: "gpu", VocabSize: 10, KVBlockSize: 4, NumKVBlocks: 4, MaxStepTokens: 2048}, Config{MaxBatchedTokens: 4096}, "max batched tokens 4096 exceed the gpu backend's limit of 2048"},
		{"prefill with decode", BackendInfo{VocabSize: 10, KVBlockSize: 4, NumKVBlocks: 4}, Config{MaxPrefillWithDecode: -2}, "max prefill with decode -2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeBackend{info: tc.info}
			_, err := New(f, tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
	f := &fakeBackend{info: BackendInfo{VocabSize: 10, KVBlockSize: 16, NumKVBlocks: 100, MaxContext: 4096, MaxBatchSeqs: 8}}
	e := newEngine(t, f, Config{NumKVBlocks: 10})
	want := Limits{BlockSize: 16, NumKVBlocks: 10, MaxBatchedTokens: DefaultMaxBatchedTokens, MaxPrefillWithDecode: DefaultMaxPrefillWithDecode,
		MaxSeqs: 8, MaxModelLen: 160, VocabSize: 10}
	if got := e.Limits(); got != want {
		t.Fatalf("limits %+v, want %+v", got, want)
	}
	// The default budget shrinks to the backend's step limit, and the cap
	// for steps that decode to the budget.
	f = &fakeBackend{info: BackendInfo{VocabSize: 10, KVBlockSize: 16, NumKVBlocks: 100, MaxContext: 4096, MaxStepTokens: 1024}}
	e = newEngine(t, f, Config{})
	if got := e.Limits(); got.MaxBatchedTokens != 1024 || got.MaxPrefillWithDecode != 1024 {
		t.Fatalf("limits %+v, want a budget and a prefill-with-decode cap of 1024 (the backend's step limit)", got)
	}
}

func TestCancelMidStreamFreesBlocks(t *testing.T) {
	f := newFake(4, 64)
	release := make(chan struct{})
	f.block = func(ctx context.Context, step int, _ *StepBatch) error {
		if step > 3 { // step 4 stays in flight until the test releases it
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	e := newEngine(t, f, Config{})
	startEngine(t, e, f)
	s := mustSubmit(t, e, &Request{PromptTokens: seqTokens(0, 10)})
	for range 3 {
		if ev := <-s.Events(); !ev.HasToken || ev.Finish != "" {
			t.Fatalf("unexpected event %+v", ev)
		}
	}
	if e.Stats().KVBlocksUsed == 0 {
		t.Fatal("a running request should hold blocks")
	}
	s.Cancel()
	close(release)
	c := collect(t, s)
	if c.Finish != FinishCancelled {
		t.Fatalf("finish %q, want cancelled", c.Finish)
	}
	if st := e.Stats(); st.KVBlocksUsed != 0 || st.Running != 0 || st.FinishedCancelled != 1 {
		t.Fatalf("after the final event: %d blocks used, %d running, %d cancelled", st.KVBlocksUsed, st.Running, st.FinishedCancelled)
	}
	s.Cancel() // after the end: no effect
}

func TestCancelWhileWaitingAndByContext(t *testing.T) {
	f := newFake(4, 64)
	var e *Engine
	// The request cancelled by its context (prompt [77]) does not get past
	// one step until its cancellation has reached the engine.
	f.block = func(ctx context.Context, step int, b *StepBatch) error {
		if b.Seqs[0].PromptTokens[0] != 77 {
			return nil
		}
		for ctx.Err() == nil {
			e.mu.Lock()
			n := len(e.cancels)
			e.mu.Unlock()
			if n > 0 {
				return nil
			}
			time.Sleep(100 * time.Microsecond)
		}
		return ctx.Err()
	}
	e = newEngine(t, f, Config{MaxSeqs: 1, MaxQueue: 2})
	long := mustSubmit(t, e, &Request{PromptTokens: seqTokens(0, 4), MaxTokens: 200})
	waiting := mustSubmit(t, e, &Request{PromptTokens: seqTokens(0, 4), MaxTokens: 5})
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := e.Submit(ctx, &Request{PromptTokens: []int32{1}}); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("third submit: %v, want ErrQueueFull", err)
	}
	waiting.Cancel()
	startEngine(t, e, f)
	if c := collect(t, waiting); c.Finish != FinishCancelled || len(c.Tokens) != 0 {
		t.Fatalf("waiting request: %q with %d tokens", c.Finish, len(c.Tokens))
	}
	// The cancelled waiter no longer counts against MaxQueue.
	byCtx, err := e.Submit(ctx, &Request{PromptTokens: []int32{77}, MaxTokens: 1000})
	if err != nil {
		t.Fatalf("submit after cancel: %v", err)
	}
	cancel()
	for range byCtx.Events() { // closes, with or without the final event
	}
	if c := collect(t, long); c.Finish != FinishLength || len(c.Tokens) != 200 {
		t.Fatalf("long request: %q with %d tokens", c.Finish, len(c.Tokens))
	}
	waitIdle(t, e)
	if st := e.Stats(); st.FinishedCancelled != 2 || st.RequestsRejected != 1 {
		t.Fatalf("stats %+v: want 2 cancelled, 1 rejected", st)
	}
}

func TestFinishReasonsAndUsage(t *testing.T) {
	f := newFake(4, 64)
	f.next = func(s *StepSeq) int32 { return int32(20 + s.SampleIndex) } // 20, 21, 22, ...
	e := newEngine(t, f, Config{EOSTokenIDs: []int32{23}, MaxModelLen: 40})
	cases := []struct {
		name      string
		req       Request
		finish    FinishReason
		tokens    int
		stopToken int32
	}{
		{"eos", Request{PromptTokens: seqTokens(0, 5)}, FinishStop, 4, 23},
		{"request stop id first", Request{PromptTokens: seqTokens(0, 5), StopTokenIDs: []int32{21}}, FinishStop, 2, 21},
		{"ignore eos", Request{PromptTokens: seqTokens(0, 5), IgnoreEOS: true, MaxTokens: 6}, FinishLength, 6, -1},
		{"max tokens before eos", Request{PromptTokens: seqTokens(0, 5), MaxTokens: 2}, FinishLength, 2, -1},
		{"context limit", Request{PromptTokens: seqTokens(0, 37), IgnoreEOS: true}, FinishLength, 3, -1},
	}
	var streams []*Stream
	for _, tc := range cases {
		streams = append(streams, mustSubmit(t, e, &tc.req))
	}
	startEngine(t, e, f)
	for i, tc := range cases {
		c := collect(t, streams[i])
		if c.Finish != tc.finish || len(c.Tokens) != tc.tokens || c.StopToken != tc.stopToken {
			t.Errorf("%s: %q, %d tokens, stop token %d; want %q, %d, %d", tc.name, c.Finish, len(c.Tokens), c.StopToken, tc.finish, tc.tokens, tc.stopToken)
		}
		if c.Usage.CompletionTokens != tc.tokens || c.Usage.PromptTokens != len(tc.req.PromptTokens) {
			t.Errorf("%s: usage %+v", tc.name, c.Usage)
		}
	}
	st := e.Stats()
	if st.FinishedStop != 2 || st.FinishedLength != 3 || st.GeneratedTokens != 4+2+6+2+3 || st.RequestsSubmitted != 5 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLogprobsAndLogitsPassThrough(t *testing.T) {
	f := newFake(4, 64)
	e := newEngine(t, f, Config{})
	s := mustSubmit(t, e, &Request{PromptTokens: []int32{1, 2}, MaxTokens: 3, ReturnLogits: true,
		Sampling: SamplingParams{Logprobs: true}})
	startEngine(t, e, f)
	c := collect(t, s)
	if len(c.Logprobs) != 3 || len(c.Logits) != 3 {
		t.Fatalf("%d logprobs, %d logits; want 3 each", len(c.Logprobs), len(c.Logits))
	}
	for i, l := range c.Logits {
		if len(l) != 1 || l[0] != float32(i) {
			t.Fatalf("logits of token %d = %v, want the backend's [%d]", i, l, i)
		}
	}
}

func TestBackendErrorFailsOnlyItsBatch(t *testing.T) {
	f := newFake(4, 64)
	f.failStep = 2
	e := newEngine(t, f, Config{})
	s1 := mustSubmit(t, e, &Request{PromptTokens: []int32{1, 2, 3}, MaxTokens: 5})
	startEngine(t, e, f)
	c, err := s1.Collect()
	if c.Finish != FinishError || err == nil || !strings.Contains(err.Error(), "backend step: injected failure") {
		t.Fatalf("finish %q err %v, want error from the backend", c.Finish, err)
	}
	s2 := mustSubmit(t, e, &Request{PromptTokens: []int32{1, 2, 3}, MaxTokens: 5})
	if c := collect(t, s2); c.Finish != FinishLength || len(c.Tokens) != 5 {
		t.Fatalf("request after the failure: %q with %d tokens", c.Finish, len(c.Tokens))
	}
}

func TestRunStopFailsOutstanding(t *testing.T) {
	f := newFake(4, 64)
	f.block = func(ctx context.Context, step int, _ *StepBatch) error {
		if step > 1 { // hold the request in flight until Run is stopped
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}
	e := newEngine(t, f, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	s := mustSubmit(t, e, &Request{PromptTokens: []int32{1}}) // runs to the context limit
	<-s.Events()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run returned %v", err)
	}
	c, err := s.Collect()
	if c.Finish != FinishError || !errors.Is(err, ErrEngineStopped) {
		t.Fatalf("outstanding request: %q, %v", c.Finish, err)
	}
	if _, err := e.Submit(context.Background(), &Request{PromptTokens: []int32{1}}); !errors.Is(err, ErrEngineStopped) {
		t.Fatalf("submit after stop: %v", err)
	}
	if err := e.Run(context.Background()); err == nil {
		t.Fatal("second Run succeeded")
	}
	if st := e.Stats(); st.KVBlocksUsed != 0 {
		t.Fatalf("%d blocks used after stop", st.KVBlocksUsed)
	}
}

// mapDetok decodes each id to a fixed piece of bytes; incomplete UTF-8 at the
// end renders as U+FFFD, like a byte-level BPE decoder.
type mapDetok map[int32]string

func (m mapDetok) Decode(ids []int32) (string, error) {
	var b strings.Builder
	for _, id := range ids {
		piece, ok := m[id]
		if !ok {
			return "", errors.New("unknown id")
		}
		b.WriteString(piece)
	}
	return strings.ToValidUTF8(b.String(), "\uFFFD"), nil
}

func TestStopStringsThroughEngine(t *testing.T) {
	detok := mapDetok{1: "Hel", 2: "lo", 3: " wor", 4: "ld", 5: "!", 6: "\xe2\x82", 7: "\xac", 9: "<eos>"}
	script := map[uint64][]int32{}
	f := newFake(4, 64)
	f.next = func(s *StepSeq) int32 {
		out := script[s.SeqID]
		if s.SampleIndex < len(out) {
			return out[s.SampleIndex]
		}
		return 5
	}
	e := newEngine(t, f, Config{Detokenizer: detok, EOSTokenIDs: []int32{9}})
	cases := []struct {
		name   string
		out    []int32
		stops  []string
		max    int
		text   string
		stop   string
		finish FinishReason
	}{
		{"across tokens", []int32{1, 2, 3, 4, 5}, []string{"o wo"}, 0, "Hell", "o wo", FinishStop},
		{"held then released", []int32{1, 2, 3, 4}, []string{"low"}, 4, "Hello world", "", FinishLength},
		{"earliest wins", []int32{1, 2, 3, 4, 5}, []string{"world", "llo"}, 0, "He", "llo", FinishStop},
		{"multibyte split", []int32{1, 6, 7, 5}, []string{"€!"}, 0, "Hel", "€!", FinishStop},
		{"stop token not decoded", []int32{1, 6, 7, 9}, nil, 0, "Hel€", "", FinishStop},
		{"flush held text at eos", []int32{1, 2, 9}, []string{"lo!"}, 0, "Hello", "", FinishStop},
	}
	var streams []*Stream
	for _, tc := range cases {
		s := mustSubmit(t, e, &Request{PromptTokens: []int32{1}, StopStrings: tc.stops, MaxTokens: tc.max})
		script[s.ID] = tc.out
		streams = append(streams, s)
	}
	startEngine(t, e, f)
	for i, tc := range cases {
		var text strings.Builder
		var last Event
		for ev := range streams[i].Events() {
			if strings.ContainsRune(ev.Text, '\uFFFD') {
				t.Errorf("%s: event text %q has a broken character", tc.name, ev.Text)
			}
			text.WriteString(ev.Text)
			last = ev
		}
		if text.String() != tc.text || last.StopString != tc.stop || last.Finish != tc.finish {
			t.Errorf("%s: text %q stop %q finish %q; want %q %q %q", tc.name, text.String(), last.StopString, last.Finish, tc.text, tc.stop, tc.finish)
		}
	}
}

// Close, from the reader's side, always reaches the engine: every request
// closed after its first event is cancelled, none runs on to max_tokens.
// (Stream.forward used to disarm the context's Cancel hook when it woke on
// the closed context before the hook had run: a context closes its Done
// channel before it runs its children's AfterFunc hooks. The request then
// generated to the end for nobody.)
func TestCloseAlwaysCancels(t *testing.T) {
	f := newFake(4, 256)
	f.block = func(ctx context.Context, step int, b *StepBatch) error {
		time.Sleep(200 * time.Microsecond) // a request of 2,000 tokens runs 0.4 s
		return nil
	}
	e := newEngine(t, f, Config{MaxSeqs: 8})
	startEngine(t, e, f)
	const n = 200
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			st, err := e.Submit(context.Background(), &Request{PromptTokens: seqTokens(i, 3), MaxTokens: 2000})
			if err != nil {
				t.Errorf("submit %d: %v", i, err)
				return
			}
			<-st.Events() // the first token: the request runs
			st.Close()
		})
	}
	wg.Wait()
	waitIdle(t, e)
	if st := e.Stats(); st.FinishedCancelled != n || st.FinishedLength != 0 {
		t.Fatalf("%d requests closed by their readers: %d cancelled, %d ran to max_tokens", n, st.FinishedCancelled,
			st.FinishedLength)
	}
}
