package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Engine serves many requests at once on one Backend: continuous batching
// with chunked prefill, a paged KV cache with prefix caching, and preemption
// by recompute. Submit, Cancel and Stats are safe from any goroutine; the
// step loop (Run) is the only caller of Backend.Step.
type Engine struct {
	backend Backend
	cfg     Config
	lim     Limits
	log     *slog.Logger
	// lateMasks: the backend calls StepBatch.AwaitMasks (BackendInfo.LateMasks).
	lateMasks bool

	// Shared with Submit/Cancel, guarded by mu.
	mu          sync.Mutex
	inbox       []*sequence // submitted, not yet seen by the loop
	cancels     []*sequence
	queued      int // submitted and never admitted (MaxQueue)
	nextID      uint64
	loopStarted bool
	stopped     bool
	stopErr     error         // what shutdown fails outstanding requests with
	wake        chan struct{} // capacity 1

	submitted atomic.Uint64
	rejected  atomic.Uint64

	// Step loop only.
	sched *scheduler
	dirty []*sequence // sequences with undelivered events
	// deferred: sequences whose last token event waits for its text, decoded
	// during the next backend step (overlap.go).
	deferred, deferredSpare []*sequence
	stats                   Stats // counters maintained by the loop

	statsMu sync.Mutex
	snap    Stats // last published copy
}

// New checks cfg against the backend and builds an engine. The caller keeps
// ownership of backend (the engine never closes it) and must call Run.
func New(backend Backend, cfg Config) (*Engine, error) {
	if backend == nil {
		return nil, errors.New("engine: nil backend")
	}
	info := backend.Info()
	lim, err := resolve(cfg, info)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if asked := max(cfg.MaxModelLen, info.MaxContext); asked > lim.MaxModelLen {
		log.Warn("max model len capped by KV capacity", "asked", asked, "kv_tokens", lim.NumKVBlocks*lim.BlockSize, "max_model_len", lim.MaxModelLen)
	}
	e := &Engine{
		backend:   backend,
		cfg:       cfg,
		lim:       lim,
		log:       log,
		lateMasks: info.LateMasks,
		wake:      make(chan struct{}, 1),
		sched:     newScheduler(lim, cfg.PrefixCaching),
		nextID:    1,
	}
	e.sched.onFirstAdmit = func(*sequence) {
		e.mu.Lock()
		e.queued--
		e.mu.Unlock()
	}
	e.stats.KVBlocksTotal = lim.NumKVBlocks
	e.publish()
	return e, nil
}

// Limits returns the effective limits (block size, KV blocks, budgets, max
// model len) the engine runs with.
func (e *Engine) Limits() Limits { return e.lim }

// Submit validates req and queues it. Bad requests fail with an error
// wrapping ErrInvalidRequest; ErrQueueFull and ErrEngineStopped are returned
// as they are. When ctx ends the request is cancelled.
func (e *Engine) Submit(ctx context.Context, req *Request) (*Stream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	seq, err := e.newSequence(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	sctx, closeCtx := context.WithCancel(ctx)
	st := &Stream{
		Seed:     seq.params.Seed,
		events:   make(chan Event),
		q:        eventQueue{notify: make(chan struct{}, 1)},
		ctx:      sctx,
		closeCtx: closeCtx,
		eng:      e,
		seq:      seq,
	}
	seq.stream = st

	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		closeCtx()
		return nil, ErrEngineStopped
	}
	if e.cfg.MaxQueue > 0 && e.queued >= e.cfg.MaxQueue {
		queued := e.queued
		e.mu.Unlock()
		closeCtx()
		e.rejected.Add(1)
		return nil, fmt.Errorf("%w (%d requests waiting to start, limit %d)", ErrQueueFull, queued, e.cfg.MaxQueue)
	}
	seq.id = e.nextID
	e.nextID++
	st.ID = seq.id
	e.queued++
	e.inbox = append(e.inbox, seq)
	e.mu.Unlock()

	e.submitted.Add(1)
	st.stopWatch = context.AfterFunc(sctx, st.Cancel)
	go st.forward()
	e.log.Debug("request submitted", "id", seq.id, "label", seq.label, "prompt_tokens", seq.numPrompt,
		"max_tokens", seq.maxTokens, "seed", seq.params.Seed)
	e.signal()
	return st, nil
}

// newSequence validates req and builds the loop's sequence for it.
func (e *Engine) newSequence(req *Request) (*sequence, error) {
	if req == nil {
		return nil, errors.New("nil request")
	}
	vocab := e.lim.VocabSize
	switch n := len(req.PromptTokens); {
	case n == 0:
		return nil, errors.New("prompt is empty")
	case n > e.lim.MaxModelLen:
		return nil, fmt.Errorf("prompt has %d tokens; the limit is %d (max model len, at most the KV capacity of %d tokens)",
			n, e.lim.MaxModelLen, e.lim.NumKVBlocks*e.lim.BlockSize)
	}
	for i, t := range req.PromptTokens {
		if t < 0 || int(t) >= vocab {
			return nil, fmt.Errorf("prompt token %d at index %d is outside the vocabulary (size %d)", t, i, vocab)
		}
	}
	if req.MaxTokens < 0 {
		return nil, fmt.Errorf("max_tokens %d must be >= 0 (0 = up to the context limit)", req.MaxTokens)
	}
	if err := req.Sampling.Validate(); err != nil {
		return nil, err
	}
	for i, t := range req.StopTokenIDs {
		if t < 0 || int(t) >= vocab {
			return nil, fmt.Errorf("stop token id %d at index %d is outside the vocabulary (size %d)", t, i, vocab)
		}
	}
	if err := validateStopStrings(req.StopStrings); err != nil {
		return nil, err
	}
	if len(req.StopStrings) > 0 && e.cfg.Detokenizer == nil {
		return nil, errors.New("stop strings need a detokenizer, and the engine has none (Config.Detokenizer)")
	}
	if req.Constraint != nil && !e.backend.Info().TokenMasks {
		return nil, fmt.Errorf("constrained decoding (structured outputs) is not supported by the %s backend", e.backend.Info().Name)
	}
	switch req.Speculation {
	case SpeculationDefault, SpeculationOff:
	case SpeculationOn:
		if e.lim.DraftTokens == 0 {
			return nil, errors.New("speculative decoding was requested, but the engine runs without a draft model (start it with --speculative mtp)")
		}
		if req.Constraint != nil || req.ReturnLogits {
			return nil, errors.New("speculative decoding cannot go with a token constraint (structured outputs) or returned logits")
		}
	default:
		return nil, fmt.Errorf("speculation %d is not one of SpeculationDefault, SpeculationOff, SpeculationOn", req.Speculation)
	}
	params := req.Sampling
	if !params.HasSeed {
		params.Seed, params.HasSeed = rand.Int64(), true
	}
	seq := &sequence{
		speculate:  e.lim.DraftTokens > 0 && req.Speculation != SpeculationOff && req.Constraint == nil && !req.ReturnLogits,
		label:      req.Label,
		tokens:     slices.Clone(req.PromptTokens),
		numPrompt:  len(req.PromptTokens),
		params:     params,
		maxTokens:  req.MaxTokens,
		maxLen:     e.lim.MaxModelLen,
		wantLogit:  req.ReturnLogits,
		constraint: req.Constraint,
	}
	if seq.constraint != nil {
		seq.mask = make([]uint32, MaskWords(vocab))
	}
	seq.stopIDs = slices.Clone(req.StopTokenIDs)
	if !req.IgnoreEOS {
		seq.stopIDs = append(seq.stopIDs, e.cfg.EOSTokenIDs...)
	}
	if e.cfg.Detokenizer != nil {
		seq.text = &textState{detok: e.cfg.Detokenizer, stops: slices.Clone(req.StopStrings)}
	}
	return seq, nil
}

func (e *Engine) requestCancel(seq *sequence) {
	e.mu.Lock()
	e.cancels = append(e.cancels, seq)
	e.mu.Unlock()
	e.signal()
}

func (e *Engine) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Run is the step loop. It returns when ctx ends (with ctx's error), or when
// the backend reports an error wrapping ErrBackendFatal (with that error);
// every request still queued or running then finishes with Finish "error"
// and an error wrapping ErrEngineStopped (and the fatal error), and later
// Submits fail with ErrEngineStopped. A failing or panicking step that is
// not fatal fails only that step's requests; the loop goes on. Run may be
// called once.
func (e *Engine) Run(ctx context.Context) (err error) {
	e.mu.Lock()
	if e.loopStarted {
		e.mu.Unlock()
		return errors.New("engine: Run called more than once")
	}
	e.loopStarted = true
	e.mu.Unlock()
	defer e.shutdown()
	defer func() {
		// A panic in the loop's own bookkeeping leaves its state unknown:
		// stop (shutdown still fails every request with an error event)
		// rather than take the process down.
		if r := recover(); r != nil {
			e.log.Error("engine loop panicked: stopping", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = fmt.Errorf("%w: engine loop panicked: %v", ErrBackendFatal, r)
			e.stats.FatalErrors++
			e.setStopErr(err)
		}
	}()

	for {
		e.drain()
		e.deliver()
		if err := ctx.Err(); err != nil {
			return err
		}
		if e.sched.idle() {
			select {
			case <-e.wake:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		batch := e.sched.schedule()
		if len(batch) == 0 {
			// Unreachable while the scheduler's invariants hold; failing the
			// head request keeps a bug from turning into a busy loop.
			stuck := append(slices.Clone(e.sched.running), e.sched.waiting...)[0]
			e.finish(stuck, Event{}, FinishError, fmt.Errorf("request %d could not be scheduled (%d KV blocks available)", stuck.id, e.sched.pool.available()))
			continue
		}
		if err := e.step(ctx, batch); err != nil {
			return err
		}
	}
}

// drain takes new requests and cancellations from Submit and Cancel.
func (e *Engine) drain() {
	e.mu.Lock()
	inbox, cancels := e.inbox, e.cancels
	e.inbox, e.cancels = nil, nil
	e.mu.Unlock()
	for _, seq := range inbox {
		e.sched.enqueue(seq)
	}
	for _, seq := range cancels {
		if seq.state != seqFinished {
			e.finish(seq, Event{}, FinishCancelled, nil)
		}
	}
}

// step runs one batch on the backend and applies the results. It returns an
// error only when ctx ended during the step.
func (e *Engine) step(ctx context.Context, sched []scheduledSeq) error {
	batch := &StepBatch{Seqs: make([]StepSeq, len(sched))}
	// The token masks of constrained sequences: filled before the step, or,
	// with a LateMasks backend, while the device runs the step's forward.
	var (
		maskErrs  map[*sequence]error
		masksDone chan struct{} // closed when the late masks are filled
	)
	late := e.lateMasks && e.hasMasks(sched)
	if late {
		masksDone = make(chan struct{})
		go func() {
			defer close(masksDone)
			maskErrs = e.fillMasks(sched)
			for seq := range maskErrs {
				// Its sample is discarded; any mask keeps the backend's
				// sampler well defined.
				for j := range seq.mask {
					seq.mask[j] = ^uint32(0)
				}
			}
		}()
		batch.AwaitMasks = func() { <-masksDone }
	} else if bad := e.fillMasks(sched); len(bad) > 0 {
		// A constraint that cannot say what comes next fails its request
		// alone; the step goes on without it.
		kept := sched[:0:0]
		for _, sc := range sched {
			if err, ok := bad[sc.seq]; ok {
				e.finish(sc.seq, Event{}, FinishError, err)
				continue
			}
			kept = append(kept, sc)
		}
		sched = kept
		batch.Seqs = batch.Seqs[:len(sched)]
		if len(sched) == 0 {
			return nil
		}
	}
	for i, sc := range sched {
		seq := sc.seq
		start, end := seq.numComputed, seq.numComputed+sc.numTokens-sc.drafts
		tokens := seq.tokens[start:end:end]
		if sc.drafts > 0 {
			tokens = append(slices.Clone(tokens), seq.drafts[:sc.drafts]...)
		}
		batch.Seqs[i] = StepSeq{
			SeqID:        seq.id,
			Tokens:       tokens,
			StartPos:     start,
			BlockTable:   seq.blocks[:len(seq.blocks):len(seq.blocks)],
			Sample:       sc.sample,
			Sampling:     seq.params,
			SampleIndex:  len(seq.tokens) - seq.numPrompt,
			PromptTokens: seq.tokens[:seq.numPrompt:seq.numPrompt],
			OutputTokens: seq.tokens[seq.numPrompt:len(seq.tokens):len(seq.tokens)],
			WantLogits:   sc.sample && seq.wantLogit,
		}
		if sc.sample && seq.constraint != nil {
			batch.Seqs[i].AllowedTokens = seq.mask
		}
		if seq.speculate {
			q := &batch.Seqs[i]
			q.Draft, q.NextToken, q.Drafts, q.Propose = true, -1, sc.drafts, sc.propose
			if !sc.sample {
				q.NextToken = seq.tokens[end] // the prompt goes on after this chunk
			}
		}
	}
	t0 := time.Now()
	// The previous step's pending token texts are decoded while this one
	// runs (overlap.go); joined before anything reads them.
	join := e.startTextHelper()
	results, err := func() ([]SeqResult, error) {
		defer join()
		return e.callStep(ctx, batch)
	}()
	dt := time.Since(t0)
	if late {
		// The backend may have failed before it waited for the masks.
		<-masksDone
		for _, sc := range sched {
			if merr, ok := maskErrs[sc.seq]; ok {
				e.sched.discard(sc.seq)
				e.finish(sc.seq, Event{}, FinishError, merr)
			}
		}
	}
	e.stats.Steps++
	e.stats.StepTime += dt
	e.stats.LastStepTime = dt
	e.stats.LastStepTokens = batch.NumTokens()
	e.stats.LastStepSeqs = len(batch.Seqs)

	if err == nil && len(results) != len(sched) {
		err = fmt.Errorf("backend returned %d results for %d sequences", len(results), len(sched))
	}
	for i := 0; err == nil && i < len(results); i++ {
		if results[i].SeqID != batch.Seqs[i].SeqID {
			err = fmt.Errorf("backend result %d is for sequence %d, want %d", i, results[i].SeqID, batch.Seqs[i].SeqID)
		}
	}
	if err != nil {
		fatal := errors.Is(err, ErrBackendFatal)
		if ctx.Err() != nil && !fatal {
			return ctx.Err() // shutdown fails everything
		}
		switch {
		case fatal:
			e.stats.FatalErrors++
		case errors.Is(err, ErrStepPanic):
			e.stats.StepPanics++
		default:
			e.stats.StepErrors++
		}
		e.stats.FailedStepsInARow++
		e.stats.LastStepError = err.Error()
		e.stats.LastStepErrorAt = time.Now()
		ids, labels := stepIDs(sched)
		e.log.Error("backend step failed: failing its requests", "fatal", fatal, "seqs", len(sched),
			"tokens", batch.NumTokens(), "request_ids", ids, "labels", labels, "err", err)
		for _, sc := range sched {
			if sc.seq.state == seqFinished {
				continue // its constraint failed while the step ran
			}
			// The step may have written part of these blocks: keep them
			// out of the prefix cache.
			e.sched.discard(sc.seq)
			e.finish(sc.seq, Event{}, FinishError, fmt.Errorf("backend step: %w", err))
		}
		if fatal {
			e.setStopErr(err)
			return fmt.Errorf("engine: %w", err)
		}
		return nil
	}
	e.stats.FailedStepsInARow = 0
	for i, sc := range sched {
		if sc.seq.state == seqFinished {
			continue // its constraint failed while the step ran
		}
		if rerr := results[i].Err; rerr != nil {
			e.failSeq(sc.seq, rerr)
			continue
		}
		e.stats.ComputedTokens += uint64(sc.numTokens)
		if sc.drafts > 0 || len(results[i].Accepted) > 0 || len(results[i].Drafts) > 0 {
			e.acceptSpeculative(sc, &results[i])
			continue
		}
		e.sched.commit(sc.seq, sc.numTokens)
		if sc.sample {
			e.accept(sc.seq, &results[i])
		}
	}
	return nil
}

// acceptSpeculative applies the result of a speculating sequence's step
// (docs/speculative.md): the positions of its last token and of the accepted
// drafts become computed, the accepted drafts and the target's token are
// emitted in order (each may end the request), and the new proposals are
// kept for the next step. The KV of rejected drafts lies past numComputed and
// is overwritten later.
func (e *Engine) acceptSpeculative(sc scheduledSeq, res *SeqResult) {
	seq := sc.seq
	switch {
	case len(res.Accepted) > sc.drafts:
		e.failSeq(seq, fmt.Errorf("backend accepted %d drafts of the %d it was given", len(res.Accepted), sc.drafts))
		return
	case len(res.Drafts) > sc.propose:
		e.failSeq(seq, fmt.Errorf("backend proposed %d drafts, %d were asked for", len(res.Drafts), sc.propose))
		return
	}
	for j, a := range res.Accepted {
		if a.Token != seq.drafts[j] {
			e.failSeq(seq, fmt.Errorf("backend accepted token %d as draft %d, which was %d", a.Token, j, seq.drafts[j]))
			return
		}
	}
	for _, d := range res.Drafts {
		if d < 0 || int(d) >= e.lim.VocabSize {
			e.failSeq(seq, fmt.Errorf("backend proposed draft token %d, outside the vocabulary (size %d)", d, e.lim.VocabSize))
			return
		}
	}
	seq.drafts = nil
	e.stats.DraftsVerified += uint64(sc.drafts)
	e.stats.DraftsAccepted += uint64(len(res.Accepted))
	// The positions before the drafts (a prefill chunk's, or the last token's).
	e.sched.commit(seq, sc.numTokens-sc.drafts)
	if !sc.sample {
		return
	}
	for _, a := range res.Accepted {
		e.accept(seq, &SeqResult{SeqID: res.SeqID, Token: a.Token, Logprob: a.Logprob, TopLogprobs: a.TopLogprobs})
		if seq.state == seqFinished {
			return
		}
		// The draft's position holds its KV, and its token is now in
		// seq.tokens (the prefix cache keys need it).
		e.sched.commit(seq, 1)
	}
	e.accept(seq, res)
	if seq.state != seqFinished {
		seq.drafts = slices.Clone(res.Drafts)
	}
}

// callStep runs Backend.Step, turning a panic into an error wrapping
// ErrStepPanic (logged with its stack).
func (e *Engine) callStep(ctx context.Context, batch *StepBatch) (res []SeqResult, err error) {
	defer func() {
		if r := recover(); r != nil {
			ids := make([]uint64, len(batch.Seqs))
			for i := range batch.Seqs {
				ids[i] = batch.Seqs[i].SeqID
			}
			e.log.Error("backend step panicked", "request_ids", ids, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			res, err = nil, fmt.Errorf("%w: %v", ErrStepPanic, r)
		}
	}()
	return e.backend.Step(ctx, batch)
}

// failSeq ends one sequence whose step result carries an error; the rest
// of the step stands.
func (e *Engine) failSeq(seq *sequence, err error) {
	if errors.Is(err, ErrNonFiniteLogits) {
		e.stats.NonFiniteLogits++
	}
	e.log.Warn("request failed in the backend", "id", seq.id, "label", seq.label, "err", err)
	e.sched.discard(seq)
	e.finish(seq, Event{}, FinishError, err)
}

// stepIDs lists the request ids and labels of a step, for logs.
func stepIDs(sched []scheduledSeq) ([]uint64, []string) {
	ids := make([]uint64, len(sched))
	labels := make([]string, 0, len(sched))
	for i, sc := range sched {
		ids[i] = sc.seq.id
		if sc.seq.label != "" {
			labels = append(labels, sc.seq.label)
		}
	}
	return ids, labels
}

// setStopErr records why the engine stops, for the requests shutdown fails.
func (e *Engine) setStopErr(err error) {
	e.mu.Lock()
	if e.stopErr == nil {
		e.stopErr = fmt.Errorf("%w: %w", ErrEngineStopped, err)
	}
	e.mu.Unlock()
}

// accept appends a sampled token and decides whether the request ends.
// Order: stop token, then stop string, then max_tokens / context limit.
func (e *Engine) accept(seq *sequence, res *SeqResult) {
	tok := res.Token
	if tok < 0 || int(tok) >= e.lim.VocabSize {
		e.finish(seq, Event{}, FinishError, fmt.Errorf("backend sampled token %d, outside the vocabulary (size %d)", tok, e.lim.VocabSize))
		return
	}
	if seq.constraint != nil && !Allowed(seq.mask, tok) {
		e.finish(seq, Event{}, FinishError, fmt.Errorf("backend sampled token %d, which the request's constraint does not allow", tok))
		return
	}
	seq.tokens = append(seq.tokens, tok)
	e.stats.GeneratedTokens++
	ev := Event{HasToken: true, Token: tok, StopToken: -1}
	if seq.params.WantsLogprobs() {
		ev.Logprob, ev.TopLogprobs = res.Logprob, res.TopLogprobs
	}
	if seq.wantLogit {
		ev.Logits = res.Logits
	}
	if slices.Contains(seq.stopIDs, tok) {
		ev.StopToken = tok
		e.finish(seq, ev, FinishStop, nil)
		return
	}
	constraintDone := false
	if seq.constraint != nil {
		if err := seq.constraint.Accept(tok); err != nil {
			e.finish(seq, ev, FinishError, fmt.Errorf("constraint: token %d: %w", tok, err))
			return
		}
		constraintDone = seq.constraint.Done()
	}
	atLength := (seq.maxTokens > 0 && len(seq.output()) >= seq.maxTokens) || len(seq.tokens) >= seq.maxLen
	if e.deferText(seq) && !atLength {
		// Decode the text while the next step runs (overlap.go); a stop
		// string in it ends the request at this token then.
		seq.textPending, seq.pendingEv = true, ev
		e.deferred = append(e.deferred, seq)
		return
	}
	if seq.text != nil {
		text, stop, err := seq.text.push(tok)
		if err != nil {
			e.finish(seq, ev, FinishError, err)
			return
		}
		ev.Text = text
		if stop != "" {
			ev.StopString = stop
			e.finish(seq, ev, FinishStop, nil)
			return
		}
	}
	if constraintDone {
		// The output is complete (e.g. the JSON value closed): nothing but a
		// stop token could follow.
		e.finish(seq, ev, FinishStop, nil)
		return
	}
	if atLength {
		e.finish(seq, ev, FinishLength, nil)
		return
	}
	e.emit(seq, ev)
}

// hasMasks reports whether a sequence of the step samples under a constraint.
func (e *Engine) hasMasks(sched []scheduledSeq) bool {
	for _, sc := range sched {
		if sc.sample && sc.seq.constraint != nil {
			return true
		}
	}
	return false
}

// fillMasks refills the token mask of every constrained sequence that
// samples this step, concurrently (a grammar's mask costs tens of
// microseconds to milliseconds), and returns the sequences whose constraint
// failed.
func (e *Engine) fillMasks(sched []scheduledSeq) map[*sequence]error {
	var todo []*sequence
	for _, sc := range sched {
		if sc.sample && sc.seq.constraint != nil {
			todo = append(todo, sc.seq)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	errs := make([]error, len(todo))
	fill := func(i int) {
		if err := todo[i].constraint.FillMask(todo[i].mask); err != nil {
			errs[i] = fmt.Errorf("constraint: next-token mask: %w", err)
		}
	}
	if len(todo) == 1 {
		fill(0)
	} else {
		var wg sync.WaitGroup
		next := atomic.Int64{}
		for range min(len(todo), runtime.GOMAXPROCS(0)) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := int(next.Add(1) - 1); i < len(todo); i = int(next.Add(1) - 1) {
					fill(i)
				}
			}()
		}
		wg.Wait()
	}
	var bad map[*sequence]error
	for i, err := range errs {
		if err != nil {
			if bad == nil {
				bad = map[*sequence]error{}
			}
			bad[todo[i]] = err
		}
	}
	return bad
}

// finish ends a request: frees its blocks now, flushes held-back text and
// queues the final event ev (which may carry the last token).
func (e *Engine) finish(seq *sequence, ev Event, reason FinishReason, err error) {
	if seq.textPending {
		// The previous token's event first (its text was left for the
		// next step, overlap.go).
		switch fev, stopped, ferr := e.flushText(seq); {
		case ferr != nil:
			if reason != FinishError {
				ev, reason, err = fev, FinishError, ferr
			}
		case stopped:
			// Its text completed a stop string: the request ended there,
			// and what came after (a later token, a cancel) is dropped.
			if ev.HasToken {
				seq.tokens = seq.tokens[:len(seq.tokens)-1]
			}
			ev, reason, err = fev, FinishStop, nil
		}
	}
	if !seq.started {
		e.mu.Lock()
		e.queued--
		e.mu.Unlock()
		seq.started = true
	}
	e.sched.remove(seq)
	if seq.constraint != nil {
		seq.constraint.Close()
		seq.constraint = nil
	}
	if !ev.HasToken {
		ev.StopToken = -1
	}
	if seq.text != nil && ev.StopString == "" && reason != FinishError {
		text, stop, terr := seq.text.finish()
		if terr != nil {
			reason, err = FinishError, terr
		} else {
			ev.Text += text
			if stop != "" {
				ev.StopString = stop
				reason = FinishStop
			}
		}
	}
	ev.Finish = reason
	ev.Err = err
	ev.Usage = Usage{
		PromptTokens:       seq.numPrompt,
		CompletionTokens:   len(seq.tokens) - seq.numPrompt,
		CachedPromptTokens: seq.cachedPrompt,
	}
	switch reason {
	case FinishStop:
		e.stats.FinishedStop++
	case FinishLength:
		e.stats.FinishedLength++
	case FinishCancelled:
		e.stats.FinishedCancelled++
	default:
		e.stats.FinishedError++
	}
	e.log.Debug("request finished", "id", seq.id, "label", seq.label, "finish", reason,
		"prompt_tokens", ev.Usage.PromptTokens, "completion_tokens", ev.Usage.CompletionTokens,
		"cached_tokens", ev.Usage.CachedPromptTokens, "err", err)
	e.emit(seq, ev)
}

func (e *Engine) emit(seq *sequence, ev Event) {
	if len(seq.events) == 0 {
		e.dirty = append(e.dirty, seq)
	}
	seq.events = append(seq.events, ev)
}

// deliver publishes the stats, then hands this iteration's events to their
// streams, so a reader that sees an event also sees stats at least as new.
func (e *Engine) deliver() {
	e.publish()
	for _, seq := range e.dirty {
		seq.stream.q.push(seq.events)
		seq.events = nil
	}
	clear(e.dirty)
	e.dirty = e.dirty[:0]
}

// shutdown ends every outstanding request once Run returns.
func (e *Engine) shutdown() {
	e.mu.Lock()
	e.stopped = true
	inbox := e.inbox
	e.inbox, e.cancels = nil, nil
	stopErr := e.stopErr
	e.mu.Unlock()
	if stopErr == nil {
		stopErr = ErrEngineStopped
	}
	var all []*sequence
	all = append(all, e.sched.running...)
	all = append(all, e.sched.waiting...)
	all = append(all, inbox...)
	for _, seq := range all {
		e.finish(seq, Event{}, FinishError, stopErr)
	}
	e.deliver()
}
