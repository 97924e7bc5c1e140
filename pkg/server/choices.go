package server

import (
	"context"
	"errors"
	"sync"

	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/server/openai"
)

// choiceSet runs the engine requests of one API request: n choices per
// prompt, choice p*n+j being copy j of prompt p, and fans their events into
// one channel (in arrival order per choice).
//
// With n > 1 and prefix caching on, only the first copy of each prompt is
// submitted at first; the other copies are submitted when it delivers its
// first event. By then its prefill is done and the engine has offered the
// prompt's full KV blocks to the prefix cache, so the copies find them there
// and compute only the prompt's last (partial) block.
type choiceSet struct {
	s       *Server
	ctx     context.Context
	reqs    []*engine.Request // per choice
	n       int               // choices per prompt
	stagger bool
	events  chan indexedEvent

	mu      sync.Mutex
	done    chan struct{} // closed by close
	closed  bool
	streams []*engine.Stream
}

// indexedEvent is an event of choice index; closed means the stream ended
// without a final event (its context ended).
type indexedEvent struct {
	index  int
	ev     engine.Event
	closed bool
}

// startChoices submits the choices of prompts (one engine request each), n
// per prompt. A failure to submit the first ones is returned (nothing stays
// submitted then); a later copy that cannot be submitted ends with an error
// (or cancelled) event of its own. The caller must close the set.
func (s *Server) startChoices(ctx context.Context, prompts []*engine.Request, n int) (*choiceSet, *openai.Error) {
	n = max(n, 1)
	cs := &choiceSet{
		s:       s,
		ctx:     ctx,
		reqs:    choiceRequests(prompts, n),
		n:       n,
		stagger: n > 1 && s.opts.Engine.PrefixCaching,
		events:  make(chan indexedEvent),
		done:    make(chan struct{}),
	}
	cs.streams = make([]*engine.Stream, len(cs.reqs))
	var first []int
	for i := range cs.reqs {
		if !cs.stagger || i%n == 0 {
			first = append(first, i)
		}
	}
	reqs := make([]*engine.Request, len(first))
	for k, i := range first {
		reqs[k] = cs.reqs[i]
	}
	streams, aerr := s.submitAll(ctx, reqs)
	if aerr != nil {
		return nil, aerr
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for k, i := range first {
		cs.streams[i] = streams[k]
		go cs.pump(i, streams[k])
	}
	return cs, nil
}

// choices is how many choices the set runs.
func (cs *choiceSet) choices() int { return len(cs.reqs) }

// next waits for the next event of any choice.
func (cs *choiceSet) next() indexedEvent { return <-cs.events }

// close cancels every choice still running and stops the pumps.
func (cs *choiceSet) close() {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed {
		return
	}
	cs.closed = true
	close(cs.done)
	for _, st := range cs.streams {
		if st != nil {
			st.Close()
		}
	}
}

func (cs *choiceSet) send(ie indexedEvent) bool {
	select {
	case cs.events <- ie:
		return true
	case <-cs.done:
		return false
	}
}

func (cs *choiceSet) pump(i int, st *engine.Stream) {
	final, first := false, true
	for ev := range st.Events() {
		if first && cs.stagger && i%cs.n == 0 {
			cs.launchCopies(i)
		}
		first = false
		final = ev.Finish != ""
		if !cs.send(indexedEvent{index: i, ev: ev}) {
			return
		}
	}
	if first && cs.stagger && i%cs.n == 0 {
		cs.launchCopies(i) // ended without an event: the copies report for themselves
	}
	if !final {
		cs.send(indexedEvent{index: i, closed: true})
	}
}

// launchCopies submits copies 1..n-1 of the prompt whose first copy is
// choice i0.
func (cs *choiceSet) launchCopies(i0 int) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed {
		return
	}
	for i := i0 + 1; i < i0+cs.n; i++ {
		st, err := cs.s.eng.Submit(cs.ctx, cs.reqs[i])
		if err != nil {
			ev := engine.Event{Finish: engine.FinishError, Err: err, StopToken: -1}
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				ev.Finish, ev.Err = engine.FinishCancelled, nil
			}
			go cs.send(indexedEvent{index: i, ev: ev})
			continue
		}
		cs.streams[i] = st
		go cs.pump(i, st)
	}
}
