package engine

import "slices"

type seqState int

const (
	seqWaiting seqState = iota
	seqRunning
	seqFinished
)

// sequence is the step loop's view of one request.
type sequence struct {
	id        uint64
	label     string
	tokens    []int32 // prompt followed by output
	numPrompt int
	params    SamplingParams
	maxTokens int // 0 = no cap besides maxLen
	maxLen    int // prompt+output limit
	stopIDs   []int32
	wantLogit bool

	state       seqState
	started     bool // admitted at least once (no longer counts against MaxQueue)
	numComputed int  // leading tokens whose KV is in blocks
	blocks      []int32
	// keys[j] is the chain key of full block j of tokens (computed lazily;
	// tokens never change, so keys survive preemption).
	keys          []blockKey
	numRegistered int // leading blocks already offered to the prefix cache
	cachedPrompt  int // prompt tokens found in the prefix cache at first admission

	// constraint limits the generated tokens (structured outputs); mask is
	// its bitmask for the next token, refilled before every sampling step.
	constraint Constraint
	mask       []uint32

	// speculate: the sequence runs with the draft model (every step sets
	// StepSeq.Draft); drafts are its proposals for the next step.
	speculate bool
	drafts    []int32

	text   *textState // nil without a detokenizer
	stream *Stream
	events []Event // produced this iteration, delivered at the next flush
	// textPending: pendingEv (a sampled token's event) waits for its text,
	// decoded while the next step runs (overlap.go).
	textPending bool
	pendingEv   Event
}

func (s *sequence) output() []int32 { return s.tokens[s.numPrompt:] }

// ensureKeys computes chain keys for the first n full blocks.
func (s *sequence) ensureKeys(n, blockSize int) {
	for j := len(s.keys); j < n; j++ {
		var parent blockKey
		if j > 0 {
			parent = s.keys[j-1]
		}
		s.keys = append(s.keys, chainKey(parent, s.tokens[j*blockSize:(j+1)*blockSize]))
	}
}

// scheduledSeq is one sequence's share of a step.
type scheduledSeq struct {
	seq       *sequence
	numTokens int  // tokens computed this step, from seq.numComputed (drafts included)
	sample    bool // the chunk reaches the end of seq.tokens
	drafts    int  // of numTokens, the last drafts are seq.drafts[:drafts] (verified this step)
	propose   int  // draft tokens to ask for (StepSeq.Propose)
}

// scheduler decides what runs in each step (vLLM v1 style) and owns the
// block pool. It has no goroutines; the engine's step loop drives it.
type scheduler struct {
	lim     Limits
	pool    *blockPool
	waiting []*sequence // FCFS; preempted sequences go back to the front
	running []*sequence // admission order, oldest first

	onFirstAdmit func(*sequence)

	preemptions     uint64
	prefixQueries   uint64 // tokens looked up in the prefix cache
	prefixHits      uint64 // tokens found there
	admittedPrompts uint64 // prompt tokens of requests admitted the first time
}

func newScheduler(lim Limits, prefixCaching bool) *scheduler {
	return &scheduler{lim: lim, pool: newBlockPool(lim.NumKVBlocks, lim.BlockSize, prefixCaching)}
}

func (s *scheduler) blocksFor(tokens int) int {
	return (tokens + s.lim.BlockSize - 1) / s.lim.BlockSize
}

func (s *scheduler) enqueue(seq *sequence) {
	seq.state = seqWaiting
	s.waiting = append(s.waiting, seq)
}

func (s *scheduler) idle() bool { return len(s.waiting) == 0 && len(s.running) == 0 }

// schedule picks the next step:
//  1. running sequences, oldest first, each gets its remaining tokens (one
//     decode token, or the next prefill chunk) within the token budget; when
//     blocks run out the newest running sequence is preempted (blocks freed,
//     requeued at the front of waiting, recomputed later), repeatedly, until
//     the allocation fits or the sequence itself was the newest;
//  2. if nothing was preempted, waiting sequences in FCFS order are admitted
//     with their first (or only) prefill chunk while budget, the sequence cap
//     and blocks allow; the first one that does not fit stops admission.
//
// While some running sequence decodes, the step's prefill tokens (chunks of
// both kinds) also stay within MaxPrefillWithDecode, so that a long prompt
// does not hold the decoding sequences' next tokens for a whole-budget chunk.
//
// The oldest running sequence can always be scheduled (a sequence alone fits
// by construction: MaxModelLen <= KV capacity), so the loop always makes
// progress and never deadlocks.
func (s *scheduler) schedule() []scheduledSeq {
	budget := s.lim.MaxBatchedTokens
	prefillBudget := budget
	for _, seq := range s.running {
		if len(seq.tokens)-seq.numComputed == 1 { // decodes this step
			prefillBudget = min(budget, s.lim.MaxPrefillWithDecode)
			break
		}
	}
	var out []scheduledSeq
	preempted := false
	// Speculative decoding proposes drafts only while few sequences run.
	proposing := s.lim.DraftTokens > 0 && len(s.running)+len(s.waiting) <= s.lim.DraftMaxBatch
	for i := 0; i < len(s.running) && budget > 0 && len(out) < s.lim.MaxSeqs; {
		seq := s.running[i]
		n := min(len(seq.tokens)-seq.numComputed, budget)
		prefill := n > 1
		if prefill {
			n = min(n, prefillBudget)
		}
		if n <= 0 { // no prefill tokens left this step (or nothing to compute: cannot happen, finished sequences leave running)
			i++
			continue
		}
		sample := seq.numComputed+n == len(seq.tokens)
		// A decoding sequence verifies its drafts: they ride behind its last
		// token, within the budget and the context.
		drafts := 0
		if sample && n == 1 {
			drafts = min(len(seq.drafts), budget-1, seq.maxLen-len(seq.tokens))
		}
		propose := 0
		if seq.speculate && sample && proposing {
			// The chained draft positions (docs/speculative.md step 4) run up
			// to e-1+propose-1, e = the step's end position; they must stay
			// inside the context.
			propose = max(0, min(s.lim.DraftTokens, seq.maxLen-(seq.numComputed+n+drafts)+1))
		}
		n += drafts
		extra := max(propose-1, 0) // KV slots of the chained draft positions
		fits := true
		for !s.grow(seq, n+extra) {
			victim := s.running[len(s.running)-1]
			s.preempt(victim)
			preempted = true
			if victim == seq {
				fits = false
				break
			}
		}
		if !fits {
			break
		}
		out = append(out, scheduledSeq{seq: seq, numTokens: n, sample: sample, drafts: drafts, propose: propose})
		budget -= n
		if prefill {
			prefillBudget -= n
		}
		i++
	}
	if preempted {
		return out
	}
	for len(s.waiting) > 0 && min(budget, prefillBudget) > 0 && len(s.running) < s.lim.MaxSeqs {
		seq := s.waiting[0]
		n, ok := s.admit(seq, min(budget, prefillBudget))
		if !ok {
			break
		}
		prefillBudget -= n
		s.waiting = s.waiting[1:]
		seq.state = seqRunning
		s.running = append(s.running, seq)
		sc := scheduledSeq{seq: seq, numTokens: n, sample: seq.numComputed+n == len(seq.tokens)}
		if seq.speculate && sc.sample && proposing {
			sc.propose = max(0, min(s.lim.DraftTokens, seq.maxLen-(seq.numComputed+n)+1))
			if sc.propose > 1 && !s.grow(seq, n+sc.propose-1) {
				sc.propose = 1 // no blocks for the chained draft positions this time
			}
		}
		out = append(out, sc)
		budget -= n
	}
	return out
}

// grow makes seq's block table cover n more tokens, if blocks allow.
func (s *scheduler) grow(seq *sequence, n int) bool {
	need := s.blocksFor(seq.numComputed+n) - len(seq.blocks)
	if need <= 0 {
		return true
	}
	ids := s.pool.allocate(need)
	if ids == nil {
		return false
	}
	seq.blocks = append(seq.blocks, ids...)
	return true
}

// admit gives a waiting sequence (which owns no blocks) its cached prefix
// and blocks for its first chunk, and returns the chunk length. At least the
// last token is always computed, since its logits are needed.
func (s *scheduler) admit(seq *sequence, budget int) (int, bool) {
	bs := s.lim.BlockSize
	var hit []int32
	if s.pool.prefix {
		maxHit := (len(seq.tokens) - 1) / bs
		seq.ensureKeys(maxHit, bs)
		hit = s.pool.lookup(seq.keys[:maxHit], seq.tokens)
	}
	cached := len(hit) * bs
	n := min(len(seq.tokens)-cached, budget)
	need := s.blocksFor(cached+n) - len(hit)
	if need > s.pool.available()-s.pool.countUnreferenced(hit) {
		return 0, false
	}
	s.pool.acquire(hit)
	seq.blocks = append(hit, s.pool.allocate(need)...)
	seq.numComputed = cached
	seq.numRegistered = len(hit)
	if s.pool.prefix {
		s.prefixQueries += uint64(len(seq.tokens))
		s.prefixHits += uint64(cached)
	}
	if !seq.started {
		seq.started = true
		seq.cachedPrompt = min(cached, seq.numPrompt)
		s.admittedPrompts += uint64(seq.numPrompt)
		if s.onFirstAdmit != nil {
			s.onFirstAdmit(seq)
		}
	}
	return n, true
}

// preempt frees a running sequence's blocks and puts it back at the front of
// the waiting queue; it will recompute its prompt and output so far.
func (s *scheduler) preempt(seq *sequence) {
	s.running = slices.DeleteFunc(s.running, func(x *sequence) bool { return x == seq })
	s.pool.release(seq.blocks)
	seq.blocks = nil
	seq.numComputed = 0
	seq.numRegistered = 0
	seq.drafts = nil
	seq.state = seqWaiting
	s.waiting = slices.Insert(s.waiting, 0, seq)
	s.preemptions++
}

// commit records that a step computed n more of seq's tokens (whose ids are
// in seq.tokens), and offers blocks that are now full to the prefix cache.
func (s *scheduler) commit(seq *sequence, n int) {
	seq.numComputed += n
	if !s.pool.prefix {
		return
	}
	bs := s.lim.BlockSize
	full := seq.numComputed / bs
	seq.ensureKeys(full, bs)
	for j := seq.numRegistered; j < full; j++ {
		s.pool.register(seq.blocks[j], seq.keys[j], seq.tokens[j*bs:(j+1)*bs])
	}
	seq.numRegistered = full
}

// remove takes a sequence out of the scheduler for good and frees its blocks.
func (s *scheduler) remove(seq *sequence) {
	switch seq.state {
	case seqRunning:
		s.running = slices.DeleteFunc(s.running, func(x *sequence) bool { return x == seq })
	case seqWaiting:
		s.waiting = slices.DeleteFunc(s.waiting, func(x *sequence) bool { return x == seq })
	}
	s.pool.release(seq.blocks)
	seq.blocks = nil
	seq.state = seqFinished
}

// discard keeps a failed sequence's blocks out of the prefix cache: their
// contents may be partial or hold non-finite values, so no later request
// may reuse them. The blocks stay owned until remove frees them.
func (s *scheduler) discard(seq *sequence) {
	s.pool.forget(seq.blocks)
	seq.numRegistered = 0
}
