package engine

// Output processing overlapped with the next step. Turning a sampled token
// into event text costs two detokenizer calls (text.go: the window before
// and after it) — through the Rust tokenizer ~2-4 µs each — so at 64 running
// sequences ~0.5 ms of the step loop's time between two backend steps went
// to text the next step does not depend on (serving 64 streams on an H200:
// 2% of the throughput, docs/perf.md 2026-11-29 twentieth session). A
// sequence without a constraint that does not speculate and does not end at
// this token takes its token now and leaves the text for later: its token
// event waits in pendingEv and is decoded and delivered by a helper goroutine
// while the next Backend.Step runs (startTextHelper), or, if the loop
// touches the sequence first (finish), right then (flushText). Events stay
// in order per stream: a sequence has at most one pending event, and nothing
// else is emitted for it before that one goes. A stop string found in the
// pending text ends the request at that token, as vLLM's asynchronous
// scheduling does: the next step has already run it once more, and that
// token is dropped (never emitted or counted in its usage).

// deferText reports whether the text of seq's sampled token may be decoded
// after the next step is launched (see the file comment).
func (e *Engine) deferText(seq *sequence) bool {
	return !e.cfg.TextBetweenSteps && seq.text != nil && seq.constraint == nil && !seq.speculate && !seq.textPending
}

// decodePending takes seq's pending token event and decodes its text: the
// event with its text, or with the text before a stop string it completes
// and StopString (stopped), or a detokenizer error (the text empty).
func (seq *sequence) decodePending() (ev Event, stopped bool, err error) {
	ev = seq.pendingEv
	seq.textPending, seq.pendingEv = false, Event{}
	text, stop, err := seq.text.push(ev.Token)
	if err != nil {
		return ev, false, err
	}
	ev.Text = text
	if stop != "" {
		ev.StopString = stop
		return ev, true, nil
	}
	return ev, false, nil
}

// flushText decodes and emits seq's pending token event now (the step loop's
// goroutine, no helper running). If its text completes a stop string the
// event is returned instead, for the caller to end the request with; a
// detokenizer error likewise.
func (e *Engine) flushText(seq *sequence) (ev Event, stopped bool, err error) {
	ev, stopped, err = seq.decodePending()
	if err != nil || stopped {
		return ev, stopped, err
	}
	e.emit(seq, ev)
	return Event{}, false, nil
}

// textEnd is a pending event that ends its request: its text completed a
// stop string (err nil) or could not be decoded.
type textEnd struct {
	seq *sequence
	ev  Event
	err error
}

// startTextHelper decodes the pending token events (e.deferred) on another
// goroutine and pushes each to its stream; the returned join waits for it
// and finishes the requests whose text completed a stop string or failed. Between the two the step loop
// must touch no pending sequence's text or stream: it only runs the backend
// step (callStep), which reads the batch.
func (e *Engine) startTextHelper() (join func()) {
	items := e.deferred
	if len(items) == 0 {
		return func() {}
	}
	e.deferred = e.deferredSpare[:0]
	e.deferredSpare = nil
	var ends []textEnd
	decoded := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, seq := range items {
			if !seq.textPending {
				continue // finished (and flushed) before the step
			}
			ev, stopped, err := seq.decodePending()
			if err == nil {
				decoded++
			}
			if err != nil || stopped {
				ends = append(ends, textEnd{seq, ev, err})
				continue
			}
			seq.stream.q.push([]Event{ev})
		}
	}()
	return func() {
		<-done
		// The step just run computed these sequences once more; finished
		// now, their results of it are skipped.
		for _, end := range ends {
			if end.seq.state == seqFinished {
				continue
			}
			if end.err != nil {
				e.finish(end.seq, end.ev, FinishError, end.err)
			} else {
				e.finish(end.seq, end.ev, FinishStop, nil)
			}
		}
		e.stats.TextOverlapped += uint64(decoded)
		clear(items)
		e.deferredSpare = items[:0] // the next step's list
	}
}
