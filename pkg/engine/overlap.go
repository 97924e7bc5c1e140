package engine

// Output processing overlapped with the next step. Turning a sampled token
// into event text costs two detokenizer calls (text.go: the window before
// and after it) — through the Rust tokenizer ~2-4 µs each — so at 64 running
// sequences ~0.5 ms of the step loop's time between two backend steps went
// to text the next step does not depend on (serving 64 streams on an H200:
// 2% of the throughput, docs/perf.md 2026-11-29 twentieth session). A sequence whose continuation
// the text cannot change (no stop strings, no constraint, not speculating,
// not ending at this token) takes its token now and leaves the text for
// later: its token event waits in pendingEv and is decoded and delivered by
// a helper goroutine while the next Backend.Step runs (startTextHelper),
// or, if the loop touches the sequence first (finish), right then
// (flushText). Events stay in order per stream: a sequence has at most one
// pending event, and nothing else is emitted for it before that one goes.

// deferText reports whether the text of seq's sampled token may be decoded
// after the next step is launched (see the file comment).
func (e *Engine) deferText(seq *sequence) bool {
	return !e.cfg.TextBetweenSteps && seq.text != nil && len(seq.text.stops) == 0 && seq.constraint == nil && !seq.speculate &&
		!seq.textPending
}

// flushText decodes and emits seq's pending token event now (the step loop's
// goroutine, no helper running). A detokenizer error is returned with the
// event (its text empty), for the caller to finish the request with.
func (e *Engine) flushText(seq *sequence) (Event, error) {
	ev := seq.pendingEv
	seq.textPending, seq.pendingEv = false, Event{}
	text, _, err := seq.text.push(ev.Token)
	if err != nil {
		return ev, err
	}
	ev.Text = text
	e.emit(seq, ev)
	return Event{}, nil
}

// textFailure is a pending event whose text the helper could not decode.
type textFailure struct {
	seq *sequence
	ev  Event
	err error
}

// startTextHelper decodes the pending token events (e.deferred) on another
// goroutine and pushes each to its stream; the returned join waits for it
// and finishes the requests whose text failed. Between the two the step loop
// must touch no pending sequence's text or stream: it only runs the backend
// step (callStep), which reads the batch.
func (e *Engine) startTextHelper() (join func()) {
	items := e.deferred
	if len(items) == 0 {
		return func() {}
	}
	e.deferred = e.deferredSpare[:0]
	e.deferredSpare = nil
	var failed []textFailure
	decoded := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, seq := range items {
			if !seq.textPending {
				continue // finished (and flushed) before the step
			}
			ev := seq.pendingEv
			seq.textPending, seq.pendingEv = false, Event{}
			text, _, err := seq.text.push(ev.Token)
			if err != nil {
				failed = append(failed, textFailure{seq, ev, err})
				continue
			}
			ev.Text = text
			seq.stream.q.push([]Event{ev})
			decoded++
		}
	}()
	return func() {
		<-done
		for _, f := range failed {
			if f.seq.state != seqFinished {
				e.finish(f.seq, f.ev, FinishError, f.err)
			}
		}
		e.stats.TextOverlapped += uint64(decoded)
		clear(items)
		e.deferredSpare = items[:0] // the next step's list
	}
}
