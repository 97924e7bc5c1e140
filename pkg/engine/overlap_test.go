package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// stepAwareDetok decodes like mapDetok and counts its calls made while the
// fake backend is inside a step (inStep) and outside one.
type stepAwareDetok struct {
	m                 mapDetok
	inStep            *atomic.Bool
	during, elsewhere atomic.Int64
	failOn            int32 // a token id whose decode fails (0: none)
	// waitStep: each call first waits (20 ms at most) for the backend to be
	// in a step, so a decode started just before the step (the helper starts
	// right before Backend.Step) is not miscounted; a decode between steps
	// (a request's last token) waits it out.
	waitStep bool
}

func (d *stepAwareDetok) Decode(ids []int32) (string, error) {
	for deadline := time.Now().Add(20 * time.Millisecond); d.waitStep && !d.inStep.Load() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Microsecond)
	}
	if d.inStep.Load() {
		d.during.Add(1)
	} else {
		d.elsewhere.Add(1)
	}
	for _, id := range ids {
		if d.failOn != 0 && id == d.failOn {
			return "", errors.New("no piece for this id")
		}
	}
	return d.m.Decode(ids)
}

// detokPieces maps the fake's tokens (seqTokens: 0..89) to text pieces.
func detokPieces() mapDetok {
	m := mapDetok{}
	for i := int32(0); i < 100; i++ {
		m[i] = string(rune('a'+i%26)) + "."
	}
	return m
}

// overlapBackend marks its steps in inStep; with expect, it makes each step
// after the first wait (bounded) until the detokenizer has been called
// during it expect(step) times, and counts the steps that saw that (overlapped): a
// loop that decodes the previous step's text while the step runs is seen
// doing so in every step; one that decodes between steps in none (each step
// then waits out the bound).
func overlapBackend(d *stepAwareDetok, inStep *atomic.Bool, overlapped *atomic.Int64, expect func(step int) int64) *fakeBackend {
	f := newFake(4, 256)
	f.next = func(s *StepSeq) int32 { return int32(10 + s.SampleIndex%50) }
	f.block = func(ctx context.Context, step int, b *StepBatch) error {
		inStep.Store(true)
		defer inStep.Store(false)
		if expect == nil {
			return nil
		}
		want := expect(step)
		before := d.during.Load()
		deadline := time.Now().Add(200 * time.Millisecond)
		for step > 1 && d.during.Load()-before < want && time.Now().Before(deadline) {
			time.Sleep(20 * time.Microsecond)
		}
		if step > 1 && d.during.Load()-before >= want {
			overlapped.Add(1)
		}
		return nil
	}
	return f
}

// The text of a step's sampled tokens is decoded while the next step runs
// (overlap.go), and every stream still gets its tokens' text in order.
func TestTextDecodedWhileNextStepRuns(t *testing.T) {
	const reqs, outLen = 6, 12
	inStep := &atomic.Bool{}
	d := &stepAwareDetok{m: detokPieces(), inStep: inStep, waitStep: true}
	var overlapped atomic.Int64
	// Step 1 prefills and samples every request's first token; step k
	// decodes the text of step k-1's tokens: one decode for a first token
	// (its window before is empty), two for the others (text.go). A
	// request's last token ends it and is decoded at once.
	f := overlapBackend(d, inStep, &overlapped, func(step int) int64 {
		if step == 2 {
			return reqs
		}
		return 2 * reqs
	})
	e := newEngine(t, f, Config{Detokenizer: d})
	var streams []*Stream
	for i := 0; i < reqs; i++ {
		streams = append(streams, mustSubmit(t, e, &Request{PromptTokens: seqTokens(i, 5), MaxTokens: outLen}))
	}
	startEngine(t, e, f)
	for _, s := range streams {
		c := collect(t, s)
		if c.Finish != FinishLength || len(c.Tokens) != outLen {
			t.Fatalf("request %d: finish %q after %d tokens, want length after %d", s.ID, c.Finish, len(c.Tokens), outLen)
		}
		want, err := d.m.Decode(c.Tokens)
		if err != nil {
			t.Fatal(err)
		}
		if c.Text != want {
			t.Fatalf("request %d: text %q, want %q (the tokens' text in order)", s.ID, c.Text, want)
		}
	}
	waitIdle(t, e)
	st := e.Stats()
	if want := uint64(reqs * (outLen - 1)); st.TextOverlapped != want {
		t.Errorf("TextOverlapped = %d, want %d (every token but each request's last)", st.TextOverlapped, want)
	}
	if got := overlapped.Load(); got != outLen-1 || st.Steps != outLen {
		t.Errorf("%d of %d steps saw the previous step's text decoded while they ran, want %d of %d",
			got, st.Steps, outLen-1, outLen)
	}
}

// A request cancelled while its last token's text is pending still gets that
// token's text before its final event; a request with stop strings stops
// where its text says.
func TestPendingTextBeforeCancelAndStopStrings(t *testing.T) {
	inStep := &atomic.Bool{}
	d := &stepAwareDetok{m: detokPieces(), inStep: inStep}
	f := overlapBackend(d, inStep, &atomic.Int64{}, nil)
	var cancelAt atomic.Int64
	var victim atomic.Pointer[Stream]
	inner := f.block
	f.block = func(ctx context.Context, step int, b *StepBatch) error {
		if int64(step) == cancelAt.Load() {
			victim.Load().Cancel()
		}
		return inner(ctx, step, b)
	}
	e := newEngine(t, f, Config{Detokenizer: d})
	cancelAt.Store(5)
	v := mustSubmit(t, e, &Request{PromptTokens: seqTokens(0, 3), MaxTokens: 40})
	victim.Store(v)
	stopper := mustSubmit(t, e, &Request{PromptTokens: seqTokens(3, 3), MaxTokens: 40, StopStrings: []string{"o.p."}})
	startEngine(t, e, f)
	c := collect(t, v)
	if c.Finish != FinishCancelled {
		t.Fatalf("victim: finish %q, want cancelled", c.Finish)
	}
	want, _ := d.m.Decode(c.Tokens)
	if len(c.Tokens) == 0 || c.Text != want {
		t.Fatalf("victim: %d tokens, text %q, want %q", len(c.Tokens), c.Text, want)
	}
	s := collect(t, stopper)
	if s.Finish != FinishStop || s.StopString != "o.p." || strings.Contains(s.Text, "o.p.") {
		t.Fatalf("stopper: finish %q stop %q text %q, want stop at \"o.p.\" with the text before it", s.Finish, s.StopString, s.Text)
	}
}

// A token whose text cannot be decoded while the next step runs ends its
// request with an error naming the detokenizer; the others go on, and every
// KV block is freed (startEngine's check).
func TestPendingTextErrorFailsItsRequest(t *testing.T) {
	inStep := &atomic.Bool{}
	d := &stepAwareDetok{m: detokPieces(), inStep: inStep, failOn: 14}
	f := overlapBackend(d, inStep, &atomic.Int64{}, nil)
	f.next = func(s *StepSeq) int32 {
		if s.SeqID == 1 && s.SampleIndex == 4 {
			return 14
		}
		return 20
	}
	e := newEngine(t, f, Config{Detokenizer: d})
	bad := mustSubmit(t, e, &Request{PromptTokens: seqTokens(0, 3), MaxTokens: 10})
	good := mustSubmit(t, e, &Request{PromptTokens: seqTokens(5, 3), MaxTokens: 10})
	if bad.ID != 1 {
		t.Fatalf("first request id %d, want 1", bad.ID)
	}
	startEngine(t, e, f)
	var last Event
	var tokens []int32
	for ev := range bad.Events() {
		if ev.HasToken {
			tokens = append(tokens, ev.Token)
		}
		last = ev
	}
	if last.Finish != FinishError || last.Err == nil || !strings.Contains(last.Err.Error(), "detokenize") {
		t.Fatalf("bad: final event finish %q err %v, want an error from the detokenizer", last.Finish, last.Err)
	}
	if len(tokens) != 5 || tokens[4] != 14 {
		t.Fatalf("bad: tokens %v, want 4 tokens then 14 (the undecodable one)", tokens)
	}
	g := collect(t, good)
	if g.Finish != FinishLength || len(g.Tokens) != 10 {
		t.Fatalf("good: finish %q after %d tokens", g.Finish, len(g.Tokens))
	}
}

// Config.TextBetweenSteps: every token's text is decoded before the next
// step, and the streams get the same text.
func TestTextBetweenStepsOption(t *testing.T) {
	inStep := &atomic.Bool{}
	d := &stepAwareDetok{m: detokPieces(), inStep: inStep}
	f := overlapBackend(d, inStep, &atomic.Int64{}, nil)
	e := newEngine(t, f, Config{Detokenizer: d, TextBetweenSteps: true})
	s := mustSubmit(t, e, &Request{PromptTokens: seqTokens(0, 5), MaxTokens: 8})
	startEngine(t, e, f)
	c := collect(t, s)
	want, _ := d.m.Decode(c.Tokens)
	if c.Finish != FinishLength || len(c.Tokens) != 8 || c.Text != want {
		t.Fatalf("finish %q, %d tokens, text %q; want length, 8, %q", c.Finish, len(c.Tokens), c.Text, want)
	}
	waitIdle(t, e)
	if st := e.Stats(); st.TextOverlapped != 0 || d.during.Load() != 0 {
		t.Fatalf("TextOverlapped %d, decodes during steps %d: want none", st.TextOverlapped, d.during.Load())
	}
}

// Stop strings with the text decoded during the next step: the request ends
// at the token that completed the stop string — found by the helper while
// the next step runs (that step's token for it is dropped), or by finish
// when a cancel arrives first — with exactly the completion it gets when
// the text is decoded between steps.
func TestPendingTextStopStringsMatchBetweenSteps(t *testing.T) {
	detok := mapDetok{1: "Hel", 2: "lo", 3: " wor", 4: "ld", 5: "!", 6: "x"}
	cases := []struct {
		name     string
		out      []int32
		stops    []string
		cancelAt int // the fake's step number in which the request is cancelled (0: none)
		max      int
		extra    int // steps the request runs beyond the between-steps run
	}{
		// The stop string completes with the third token (step 3); the
		// helper finds it during step 4, whose token is dropped.
		{"found while the next step runs", []int32{1, 2, 3, 4, 5, 5, 5}, []string{"o wo"}, 0, 0, 1},
		// Cancelled during step 3: the loop's finish decodes the pending
		// third token first and finds the stop string.
		{"found by finish before a cancel", []int32{1, 2, 3, 4, 5, 5, 5}, []string{"o wo"}, 3, 0, 0},
		{"held text released at the length limit", []int32{1, 2, 3, 6, 6}, []string{"worlx", "lo!"}, 0, 5, 0},
		{"two stop strings, the earliest wins", []int32{1, 2, 3, 4, 5, 6}, []string{"ld!", "lo w"}, 0, 0, 1},
	}
	run := func(t *testing.T, between bool, out []int32, stops []string, cancelAt, max int) (Completion, int) {
		f := newFake(4, 64)
		f.next = func(s *StepSeq) int32 {
			if s.SampleIndex < len(out) {
				return out[s.SampleIndex]
			}
			return 6
		}
		var victim atomic.Pointer[Stream]
		f.block = func(ctx context.Context, step int, b *StepBatch) error {
			if step == cancelAt {
				victim.Load().Cancel()
			}
			return nil
		}
		e := newEngine(t, f, Config{Detokenizer: detok, TextBetweenSteps: between})
		s := mustSubmit(t, e, &Request{PromptTokens: []int32{1}, StopStrings: stops, MaxTokens: max})
		victim.Store(s)
		startEngine(t, e, f)
		c := collect(t, s)
		waitIdle(t, e)
		return c, len(f.recorded())
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want, stepsBetween := run(t, true, tc.out, tc.stops, tc.cancelAt, tc.max)
			got, stepsOverlap := run(t, false, tc.out, tc.stops, tc.cancelAt, tc.max)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("text during the next step:\n  %+v\nbetween steps:\n  %+v", got, want)
			}
			if got.Usage.CompletionTokens != len(got.Tokens) {
				t.Fatalf("usage counts %d completion tokens, the stream had %d", got.Usage.CompletionTokens, len(got.Tokens))
			}
			if stepsOverlap != stepsBetween+tc.extra {
				t.Fatalf("%d steps, want %d (between steps: %d)", stepsOverlap, stepsBetween+tc.extra, stepsBetween)
			}
			t.Logf("%s: finish %q stop %q after %d tokens; %d steps (between steps: %d)",
				tc.name, got.Finish, got.StopString, len(got.Tokens), stepsOverlap, stepsBetween)
		})
	}
}
