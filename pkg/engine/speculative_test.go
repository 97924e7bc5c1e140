package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
)

// kvModel is a backend whose "model" reads its context from its own paged KV
// store, so the engine's bookkeeping is what decides its output: the next
// token after position p is a hash of the tokens in KV slots 0..p. A wrong
// start position, a stale draft left inside numComputed, or a missing block
// changes the tokens. Its draft model proposes the true continuation except
// at positions picked by wrongEvery, so drafts are accepted and rejected.
type kvModel struct {
	info       BackendInfo
	wrongEvery int // a draft at position p is wrong when p % wrongEvery == 0 (0: never)

	mu        sync.Mutex
	kv        map[int32][]int32 // block -> slot -> token (-1 empty)
	violation error
	steps     []StepBatch
}

func newKVModel(blockSize, numBlocks, maxDrafts, wrongEvery int) *kvModel {
	return &kvModel{
		info: BackendInfo{Name: "kvmodel", VocabSize: 97, MaxContext: 4096, KVBlockSize: blockSize,
			NumKVBlocks: numBlocks, MaxDraftTokens: maxDrafts},
		wrongEvery: wrongEvery,
		kv:         map[int32][]int32{},
	}
}

func (m *kvModel) Info() BackendInfo { return m.info }
func (m *kvModel) Close() error      { return nil }

func (m *kvModel) slot(table []int32, p int) (int32, int) {
	return table[p/m.info.KVBlockSize], p % m.info.KVBlockSize
}

func (m *kvModel) write(table []int32, p int, tok int32) {
	b, s := m.slot(table, p)
	if m.kv[b] == nil {
		m.kv[b] = slices.Repeat([]int32{-1}, m.info.KVBlockSize)
	}
	m.kv[b][s] = tok
}

// next is the target model: the token after positions 0..p of the table.
func (m *kvModel) next(table []int32, p int) (int32, error) {
	h := uint64(1469598103934665603)
	for i := 0; i <= p; i++ {
		b, s := m.slot(table, i)
		if m.kv[b] == nil || m.kv[b][s] < 0 {
			return 0, fmt.Errorf("position %d (block %d slot %d) was never written", i, b, s)
		}
		h = (h ^ uint64(m.kv[b][s]+1)) * 1099511628211
	}
	return int32(h % uint64(m.info.VocabSize)), nil
}

func (m *kvModel) fail(err error) {
	if m.violation == nil {
		m.violation = err
	}
}

func (m *kvModel) Step(_ context.Context, b *StepBatch) ([]SeqResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cp := StepBatch{Seqs: slices.Clone(b.Seqs)}
	for i := range cp.Seqs {
		cp.Seqs[i].Tokens = slices.Clone(cp.Seqs[i].Tokens)
	}
	m.steps = append(m.steps, cp)
	out := make([]SeqResult, len(b.Seqs))
	for i := range b.Seqs {
		q := &b.Seqs[i]
		out[i].SeqID = q.SeqID
		e := q.StartPos + len(q.Tokens)
		if need := (e + max(q.Propose-1, 0) + m.info.KVBlockSize - 1) / m.info.KVBlockSize; len(q.BlockTable) < need {
			m.fail(fmt.Errorf("seq %d: %d blocks, positions up to %d (chained drafts included) need %d", q.SeqID, len(q.BlockTable), e-1+max(q.Propose-1, 0), need))
			continue
		}
		if q.Drafts > 0 && (!q.Sample || q.Drafts >= len(q.Tokens) || q.Drafts > m.info.MaxDraftTokens) {
			m.fail(fmt.Errorf("seq %d: %d drafts in %d tokens (sample %v)", q.SeqID, q.Drafts, len(q.Tokens), q.Sample))
		}
		if q.Draft && !q.Sample {
			if want := int32(-1); e < len(q.PromptTokens) {
				want = q.PromptTokens[e]
				if q.NextToken != want {
					m.fail(fmt.Errorf("seq %d: NextToken %d after a chunk ending at %d, the prompt has %d", q.SeqID, q.NextToken, e, want))
				}
			}
		}
		for j, t := range q.Tokens {
			m.write(q.BlockTable, q.StartPos+j, t)
		}
		if !q.Sample {
			continue
		}
		base := e - 1 - q.Drafts
		for j := 0; ; j++ {
			x, err := m.next(q.BlockTable, base+j)
			if err != nil {
				m.fail(fmt.Errorf("seq %d: %w", q.SeqID, err))
				break
			}
			if j < q.Drafts && x == q.Tokens[len(q.Tokens)-q.Drafts+j] {
				out[i].Accepted = append(out[i].Accepted, AcceptedToken{Token: x})
				continue
			}
			out[i].Token = x
			break
		}
		// Proposals: continue the context (valid positions, then Token and
		// each proposal) in a scratch copy of the table's tokens.
		ctx := m.context(q.BlockTable, base+len(out[i].Accepted))
		ctx = append(ctx, out[i].Token)
		for range q.Propose {
			d := hashTokens(ctx, m.info.VocabSize)
			if m.wrongEvery > 0 && len(ctx)%m.wrongEvery == 0 {
				d = (d + 1) % int32(m.info.VocabSize)
			}
			out[i].Drafts = append(out[i].Drafts, d)
			ctx = append(ctx, d)
		}
	}
	return out, nil
}

func (m *kvModel) context(table []int32, p int) []int32 {
	var ctx []int32
	for i := 0; i <= p; i++ {
		b, s := m.slot(table, i)
		ctx = append(ctx, m.kv[b][s])
	}
	return ctx
}

func hashTokens(ctx []int32, vocab int) int32 {
	h := uint64(1469598103934665603)
	for _, t := range ctx {
		h = (h ^ uint64(t+1)) * 1099511628211
	}
	return int32(h % uint64(vocab))
}

// runKVModel generates every request to the end on a fresh engine and
// returns the tokens of each, the engine's stats and the backend.
func runKVModel(t *testing.T, cfg Config, blocks, wrongEvery int, reqs []Request) ([][]int32, Stats, *kvModel) {
	t.Helper()
	m := newKVModel(4, blocks, 4, wrongEvery)
	e := newEngine(t, m, cfg)
	// Every request is queued before the loop starts, so the steps (and
	// which of them propose drafts) do not depend on submission timing.
	streams := make([]*Stream, len(reqs))
	for i := range reqs {
		streams[i] = mustSubmit(t, e, &reqs[i])
	}
	startEngine(t, e, nil)
	out := make([][]int32, len(reqs))
	for i, st := range streams {
		c := collect(t, st)
		if c.Finish == FinishError {
			t.Fatalf("request %d failed", i)
		}
		out[i] = c.Tokens
	}
	waitIdle(t, e)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.violation != nil {
		t.Fatalf("backend contract: %v", m.violation)
	}
	return out, e.Stats(), m
}

func specRequests() []Request {
	var reqs []Request
	for i := range 6 {
		r := Request{PromptTokens: seqTokens(3+i, 5+7*i), MaxTokens: 20 + 9*i, IgnoreEOS: true,
			Sampling: SamplingParams{TopP: 1, RepetitionPenalty: 1}}
		if i == 2 {
			r.StopTokenIDs = []int32{13, 41} // ends mid-way, maybe inside accepted drafts
			r.IgnoreEOS = false
		}
		reqs = append(reqs, r)
	}
	return reqs
}

// Speculative decoding changes no token: with 1..4 drafts per step, under a
// tight token budget (drafts trimmed, prompts chunked) and a KV pool small
// enough to preempt, every request gets exactly the tokens of plain decoding,
// and drafts are both accepted and rejected along the way.
func TestSpeculativeMatchesPlainDecoding(t *testing.T) {
	plain, _, _ := runKVModel(t, Config{MaxBatchedTokens: 64}, 400, 0, specRequests())
	for _, tc := range []struct {
		name   string
		cfg    Config
		blocks int
	}{
		{"k1", Config{MaxBatchedTokens: 64, DraftTokens: 1}, 400},
		{"k2", Config{MaxBatchedTokens: 64, DraftTokens: 2}, 400},
		{"k4", Config{MaxBatchedTokens: 64, DraftTokens: 4}, 400},
		{"k3-tight-budget", Config{MaxBatchedTokens: 9, DraftTokens: 3}, 400},
		{"k3-preempting", Config{MaxBatchedTokens: 64, DraftTokens: 3}, 40},
		{"k2-prefix-cache", Config{MaxBatchedTokens: 64, DraftTokens: 2, PrefixCaching: true}, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, st, m := runKVModel(t, tc.cfg, tc.blocks, 3, specRequests())
			for i := range plain {
				if !slices.Equal(got[i], plain[i]) {
					t.Errorf("request %d: speculative %v\nplain       %v", i, got[i], plain[i])
				}
			}
			if st.DraftsVerified == 0 || st.DraftsAccepted == 0 || st.DraftsAccepted == st.DraftsVerified {
				t.Errorf("drafts verified %d, accepted %d: want some accepted and some rejected", st.DraftsVerified, st.DraftsAccepted)
			}
			if tc.blocks == 40 && st.Preemptions == 0 {
				t.Errorf("no preemption with %d blocks", tc.blocks)
			}
			m.mu.Lock()
			steps := len(m.steps)
			m.mu.Unlock()
			t.Logf("%d steps, drafts accepted %d of %d, %d preemptions", steps, st.DraftsAccepted, st.DraftsVerified, st.Preemptions)
		})
	}
}

// Proposals stop while more sequences run than DraftMaxBatch (the draft
// model still follows every sequence: Draft stays set), and resume when the
// batch shrinks.
func TestSpeculativeOffAtLargeBatch(t *testing.T) {
	reqs := specRequests()
	_, _, m := runKVModel(t, Config{MaxBatchedTokens: 64, DraftTokens: 2, DraftMaxBatch: 3}, 400, 3, reqs)
	m.mu.Lock()
	defer m.mu.Unlock()
	sawOff, sawOn := false, false
	for _, b := range m.steps {
		proposing := false
		for _, q := range b.Seqs {
			if !q.Draft {
				t.Fatalf("seq %d stepped without Draft", q.SeqID)
			}
			proposing = proposing || q.Propose > 0
		}
		if len(b.Seqs) > 3 && proposing {
			t.Fatalf("a step of %d sequences proposed drafts (DraftMaxBatch 3)", len(b.Seqs))
		}
		sawOff = sawOff || (len(b.Seqs) > 3 && !proposing)
		sawOn = sawOn || proposing
	}
	if !sawOff || !sawOn {
		t.Fatalf("proposals off at large batch %v, on at small batch %v", sawOff, sawOn)
	}
}

// Requests that want logits or carry a constraint never speculate.
func TestSpeculativeSkipsLogitsRequests(t *testing.T) {
	reqs := []Request{{PromptTokens: seqTokens(1, 6), MaxTokens: 8, IgnoreEOS: true, ReturnLogits: true,
		Sampling: SamplingParams{TopP: 1, RepetitionPenalty: 1}}}
	_, st, m := runKVModel(t, Config{DraftTokens: 2}, 100, 0, reqs)
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, b := range m.steps {
		for _, q := range b.Seqs {
			if q.Draft || q.Drafts > 0 || q.Propose > 0 {
				t.Fatalf("a logits request speculated: %+v", q)
			}
		}
	}
	if st.DraftsVerified != 0 {
		t.Fatalf("drafts verified %d", st.DraftsVerified)
	}
}

// Draft tokens need a backend with a draft model, within its limit.
func TestSpeculativeConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		maxDrafts, drafts int
		want              string
	}{
		{0, 1, "needs a draft model"},
		{2, 3, "exceed the kvmodel backend's limit of 2"},
		{2, -1, "must be >= 0"},
	} {
		_, err := New(newKVModel(4, 16, tc.maxDrafts, 0), Config{DraftTokens: tc.drafts})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("max %d, asked %d: err %v, want %q", tc.maxDrafts, tc.drafts, err, tc.want)
		}
	}
}

// A request's Speculation overrides the engine's setting: SpeculationOff
// requests never run the draft model (no Draft, drafts or proposals in any
// of their steps) while the others draft beside them, and every request gets
// the tokens of plain decoding.
func TestSpeculationPerRequest(t *testing.T) {
	plain, _, _ := runKVModel(t, Config{MaxBatchedTokens: 64}, 400, 0, specRequests())
	reqs := specRequests()
	for i := range reqs {
		if i%2 == 1 {
			reqs[i].Speculation = SpeculationOff
		} else if i == 2 {
			reqs[i].Speculation = SpeculationOn
		}
	}
	got, st, m := runKVModel(t, Config{MaxBatchedTokens: 64, DraftTokens: 2}, 400, 3, reqs)
	for i := range plain {
		if !slices.Equal(got[i], plain[i]) {
			t.Errorf("request %d: %v\nplain      %v", i, got[i], plain[i])
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	drafting, all := map[uint64]bool{}, map[uint64]bool{}
	for _, b := range m.steps {
		for _, q := range b.Seqs {
			all[q.SeqID] = true
			if q.Draft || q.Drafts > 0 || q.Propose > 0 {
				drafting[q.SeqID] = true
			}
		}
	}
	if len(all) != len(reqs) || len(drafting) != len(reqs)/2 {
		t.Errorf("%d of %d sequences ran the draft model, want %d (the others set SpeculationOff)", len(drafting), len(all), len(reqs)/2)
	}
	if st.DraftsVerified == 0 {
		t.Error("no draft was verified")
	}
}

// SpeculationOn is refused where the request cannot draft: an engine without
// a draft model, a request that wants logits; an unknown value is refused.
func TestSpeculationOnErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		drafts int
		req    Request
		want   string
	}{
		{"no draft model", 0, Request{Speculation: SpeculationOn}, "without a draft model"},
		{"logits", 2, Request{Speculation: SpeculationOn, ReturnLogits: true}, "cannot go with a token constraint (structured outputs) or returned logits"},
		{"unknown", 2, Request{Speculation: 7}, "speculation 7 is not one of"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, newKVModel(4, 64, 2, 0), Config{DraftTokens: tc.drafts})
			tc.req.PromptTokens = seqTokens(1, 4)
			tc.req.MaxTokens = 4
			_, err := e.Submit(context.Background(), &tc.req)
			if err == nil || !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Submit: %v, want an invalid-request error containing %q", err, tc.want)
			}
		})
	}
}
