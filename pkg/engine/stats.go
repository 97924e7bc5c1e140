package engine

import "time"

// Stats is a snapshot of the engine for metrics. Counters only grow.
type Stats struct {
	Waiting int // submitted or preempted, not running
	Running int

	KVBlocksTotal  int
	KVBlocksUsed   int // owned by at least one sequence
	KVBlocksFree   int // unowned, not cached
	KVBlocksCached int // unowned, holding a cached prefix (reusable or evictable)

	RequestsSubmitted uint64
	RequestsRejected  uint64 // ErrQueueFull
	FinishedStop      uint64
	FinishedLength    uint64
	FinishedCancelled uint64
	FinishedError     uint64

	PromptTokens    uint64 // prompt tokens of requests admitted (once per request)
	GeneratedTokens uint64 // tokens sampled
	ComputedTokens  uint64 // tokens the backend processed, recomputation included
	// Prefix cache: tokens looked up at admission, and how many were found.
	PrefixQueryTokens uint64
	PrefixHitTokens   uint64
	Preemptions       uint64

	// Failures, each counted once: steps whose Backend.Step returned an
	// error (StepErrors) or panicked (StepPanics), failing their requests;
	// fatal errors (ErrBackendFatal from a step, or a panic of the loop
	// itself: the engine stopped); requests ended because their logits were
	// non-finite (ErrNonFiniteLogits).
	StepErrors      uint64
	StepPanics      uint64
	FatalErrors     uint64
	NonFiniteLogits uint64
	// FailedStepsInARow counts the steps that failed (an error or a panic)
	// since the last one that succeeded; LastStepError and LastStepErrorAt
	// describe the latest failure (kept after a success).
	FailedStepsInARow int
	LastStepError     string
	LastStepErrorAt   time.Time

	// Speculative decoding: draft tokens verified by the target model, and
	// how many of them it accepted (acceptance rate = accepted / verified).
	DraftsVerified uint64
	DraftsAccepted uint64

	// TextOverlapped counts the sampled tokens whose event text was decoded
	// while the next Backend.Step ran (overlap.go) rather than between steps.
	TextOverlapped uint64

	Steps          uint64
	StepTime       time.Duration // total time inside Backend.Step
	LastStepTime   time.Duration
	LastStepTokens int
	LastStepSeqs   int
}

// Stats returns the latest snapshot, published by the step loop before it
// delivers each batch of events.
func (e *Engine) Stats() Stats {
	e.statsMu.Lock()
	s := e.snap
	e.statsMu.Unlock()
	e.mu.Lock()
	s.Waiting += len(e.inbox)
	e.mu.Unlock()
	s.RequestsSubmitted = e.submitted.Load()
	s.RequestsRejected = e.rejected.Load()
	return s
}

// publish copies the loop's counters into the snapshot.
func (e *Engine) publish() {
	s := e.stats
	sch := e.sched
	s.Waiting = len(sch.waiting)
	s.Running = len(sch.running)
	s.KVBlocksTotal = sch.pool.numBlocks()
	s.KVBlocksUsed = sch.pool.numUsed()
	s.KVBlocksFree = sch.pool.numFree()
	s.KVBlocksCached = sch.pool.numCached()
	s.PromptTokens = sch.admittedPrompts
	s.PrefixQueryTokens = sch.prefixQueries
	s.PrefixHitTokens = sch.prefixHits
	s.Preemptions = sch.preemptions
	e.statsMu.Lock()
	e.snap = s
	e.statsMu.Unlock()
}
