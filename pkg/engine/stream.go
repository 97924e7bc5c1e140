package engine

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
)

// Stream is the caller's handle on a submitted request.
//
// Events arrive on Events() in order; the last one has Finish set, then the
// channel is closed. The engine never blocks on a slow reader: events queue
// inside the Stream. If the Submit context ends, or Close is called, the
// request is cancelled and the channel is closed promptly, possibly without
// the final event (the reader is assumed gone). Cancel stops the request but
// still delivers the final "cancelled" event.
type Stream struct {
	// ID is the engine's request id (also the backend SeqID).
	ID uint64
	// Seed is the sampling seed in effect: the request's own, or one the
	// engine drew at Submit. Resubmitting with it reproduces the tokens.
	Seed int64

	events chan Event
	q      eventQueue

	ctx       context.Context // ends when the Submit context ends or Close is called
	closeCtx  context.CancelFunc
	stopWatch func() bool // stops the ctx -> Cancel hook

	cancelled atomic.Bool
	eng       *Engine
	seq       *sequence
}

// Events returns the event channel.
func (s *Stream) Events() <-chan Event { return s.events }

// Cancel asks the engine to stop the request. Its blocks are freed at the
// next step boundary, before the final event (Finish "cancelled") is
// delivered. Cancel after the request finished does nothing.
func (s *Stream) Cancel() {
	if s.cancelled.CompareAndSwap(false, true) {
		s.eng.requestCancel(s.seq)
	}
}

// Close cancels the request and stops delivering events; the channel is
// closed soon after. Use it when the reader goes away.
func (s *Stream) Close() { s.closeCtx() }

// forward moves queued events to the channel until the final event is
// delivered or the stream's context ends.
func (s *Stream) forward() {
	defer func() {
		s.stopWatch()
		// The reader went away (Close, or the Submit context ended): make
		// sure the engine hears it. The ctx -> Cancel hook alone can miss it:
		// a context closes its Done channel before it runs the AfterFunc
		// hooks of its children, so this goroutine, woken by Done, could call
		// stopWatch first and disarm the hook, and the request would then
		// run on to max_tokens for nobody (seen as a cancelled HTTP request
		// whose engine request finished with "length", about 1 run in 5 of
		// a client test under -race). Cancel is idempotent.
		if s.ctx.Err() != nil {
			s.Cancel()
		}
		s.closeCtx()
		close(s.events)
	}()
	for {
		ev, ok := s.q.pop(s.ctx)
		if !ok {
			return
		}
		select {
		case s.events <- ev:
		case <-s.ctx.Done():
			s.q.abandon()
			return
		}
		if ev.Finish != "" {
			return
		}
	}
}

// eventQueue is an unbounded FIFO between the step loop and the forwarder.
type eventQueue struct {
	mu        sync.Mutex
	items     []Event
	abandoned bool
	notify    chan struct{} // capacity 1
}

func (q *eventQueue) push(evs []Event) {
	q.mu.Lock()
	if q.abandoned {
		q.mu.Unlock()
		return
	}
	q.items = append(q.items, evs...)
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// pop waits for the next event; ok is false once ctx ends.
func (q *eventQueue) pop(ctx context.Context) (Event, bool) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			ev := q.items[0]
			q.items[0] = Event{}
			q.items = q.items[1:]
			q.mu.Unlock()
			return ev, true
		}
		q.mu.Unlock()
		select {
		case <-q.notify:
		case <-ctx.Done():
			q.abandon()
			return Event{}, false
		}
	}
}

func (q *eventQueue) abandon() {
	q.mu.Lock()
	q.abandoned = true
	q.items = nil
	q.mu.Unlock()
}

// Completion is a whole request's output, gathered by Collect.
type Completion struct {
	Tokens      []int32
	Text        string
	Logprobs    []float32        // one per token, when requested
	TopLogprobs [][]TokenLogprob // one per token, when requested
	Logits      [][]float32      // one per token, with Request.ReturnLogits
	Finish      FinishReason
	StopToken   int32 // -1 unless a stop token ended the request
	StopString  string
	Usage       Usage
}

// Collect reads the stream to its end. It returns the event's error for
// Finish "error", and an error if the stream closed without a final event
// (its context ended).
func (s *Stream) Collect() (Completion, error) {
	c := Completion{StopToken: -1}
	var text strings.Builder
	for ev := range s.events {
		if ev.HasToken {
			c.Tokens = append(c.Tokens, ev.Token)
			if s.seq.params.WantsLogprobs() {
				c.Logprobs = append(c.Logprobs, ev.Logprob)
				c.TopLogprobs = append(c.TopLogprobs, ev.TopLogprobs)
			}
			if ev.Logits != nil {
				c.Logits = append(c.Logits, ev.Logits)
			}
		}
		text.WriteString(ev.Text)
		if ev.Finish != "" {
			c.Text = text.String()
			c.Finish, c.StopToken, c.StopString, c.Usage = ev.Finish, ev.StopToken, ev.StopString, ev.Usage
			if ev.Err != nil {
				return c, fmt.Errorf("request %d: %w", s.ID, ev.Err)
			}
			return c, nil
		}
	}
	c.Text = text.String()
	return c, fmt.Errorf("request %d: stream closed before the request finished: %w", s.ID, context.Cause(s.ctx))
}
