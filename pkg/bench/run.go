// Package bench measures the engine on synthetic requests (throughput,
// TTFT, TPOT, step statistics) and compares the decode rate with the memory
// bandwidth floor of the model on its deployment (docs/hardware.md
// §4). Performance is reported, never asserted.
package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/glmctl/glmctl/pkg/engine"
)

// Workload describes the synthetic requests of a benchmark.
type Workload struct {
	Concurrency []int `json:"concurrency"` // one run per value, each keeping that many requests in flight
	// Requests per run; 0 = 4 × concurrency. A run never has fewer requests
	// than its concurrency.
	Requests int `json:"requests"`
	// Warmup requests before each run (not measured); < 0 = one per
	// in-flight slot (the run's concurrency).
	Warmup      int     `json:"warmup"`
	InputLen    int     `json:"input_len"`  // prompt tokens per request
	OutputLen   int     `json:"output_len"` // generated tokens per request (EOS ignored)
	Seed        int64   `json:"seed"`       // prompt ids and sampling seeds
	Temperature float32 `json:"temperature"`
	// ArrivalLen > 0: once the run's streams are all decoding, one more
	// request with a prompt of this many tokens (and one output token)
	// arrives; the run then reports its TTFT and the running streams'
	// inter-token latency while it was prefilled (chunked prefill mixed
	// with decode under the step's token budget).
	ArrivalLen int `json:"arrival_len,omitempty"`
	// CompareSpeculation: each concurrency runs twice on the same engine with
	// the same prompts, first with every request's speculative decoding off
	// (engine.SpeculationOff), then as the engine is set; the second run's
	// SpeedupVsPlain is its output tok/s over the first's. Each run warms up
	// with at least one request per in-flight slot. The engine must draft
	// (Config.DraftTokens > 0).
	CompareSpeculation bool `json:"compare_speculation,omitempty"`

	// speculation is what every request of the run in progress asks for.
	speculation engine.Speculation
}

// Limits on a workload, to keep a typo from allocating gigabytes of prompts.
const (
	MaxConcurrency = 1 << 14
	MaxRequests    = 1 << 20
	MaxPromptIDs   = 1 << 28 // requests × input length of one run
)

// requestsFor is the number of measured requests of the run at concurrency c.
func (w Workload) requestsFor(c int) int {
	n := w.Requests
	if n == 0 {
		n = 4 * c
	}
	return max(n, c)
}

// warmupFor is the number of warm-up requests before the run at concurrency c:
// with CompareSpeculation at least c, so that neither run of a pair pays the
// first use of its batch shapes (CUDA graph capture: ~90 ms at batch 8 on the
// GPU, which a one-request warm-up left to the first measured run).
func (w Workload) warmupFor(c int) int {
	if w.Warmup < 0 || (w.CompareSpeculation && w.Warmup < c) {
		return c
	}
	return w.Warmup
}

// Check validates w against the engine's limits.
func (w Workload) Check(lim engine.Limits) error {
	if len(w.Concurrency) == 0 {
		return errors.New("concurrency: no values given")
	}
	for _, c := range w.Concurrency {
		switch {
		case c < 1 || c > MaxConcurrency:
			return fmt.Errorf("concurrency: %d out of range [1, %d]", c, MaxConcurrency)
		case c > lim.MaxSeqs:
			return fmt.Errorf("concurrency: %d exceeds the engine's %d sequences per step (--max-seqs, or the backend's limit); the run could not keep them all in flight", c, lim.MaxSeqs)
		}
		if n := int64(w.requestsFor(c)+w.warmupFor(c)) * int64(w.InputLen); n > MaxPromptIDs {
			return fmt.Errorf("requests: %d requests × input length %d at concurrency %d exceed %d prompt tokens per run", w.requestsFor(c)+w.warmupFor(c), w.InputLen, c, MaxPromptIDs)
		}
	}
	switch {
	case w.Requests < 0 || w.Requests > MaxRequests:
		return fmt.Errorf("requests: %d out of range [0, %d] (0 = 4 × concurrency)", w.Requests, MaxRequests)
	case w.Warmup > MaxRequests:
		return fmt.Errorf("warmup: %d exceeds %d", w.Warmup, MaxRequests)
	case w.InputLen < 1:
		return fmt.Errorf("input length: must be >= 1, got %d", w.InputLen)
	case w.OutputLen < 2:
		return fmt.Errorf("output length: must be >= 2 (TPOT needs two tokens), got %d", w.OutputLen)
	case w.ArrivalLen < 0 || w.ArrivalLen > lim.MaxModelLen-1:
		return fmt.Errorf("arrival length: %d out of range [0, %d] (the engine's max model length - 1)", w.ArrivalLen, lim.MaxModelLen-1)
	case w.InputLen+w.OutputLen > lim.MaxModelLen:
		return fmt.Errorf("input length %d + output length %d exceed the engine's max model length %d (context limit or KV pool)", w.InputLen, w.OutputLen, lim.MaxModelLen)
	case math.IsNaN(float64(w.Temperature)) || w.Temperature < 0:
		return fmt.Errorf("temperature: must be >= 0, got %g", w.Temperature)
	case lim.VocabSize <= 0:
		return fmt.Errorf("vocab size: engine reports %d", lim.VocabSize)
	case w.CompareSpeculation && lim.DraftTokens <= 0:
		return errors.New("compare speculation: the engine does not draft (start it with speculative decoding, --speculative mtp)")
	}
	return nil
}

// Percentiles summarise a latency distribution in milliseconds.
type Percentiles struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
}

// Percentile is the p-th percentile (0..100) of sorted values, linearly
// interpolated between closest ranks (numpy's default). Empty input gives 0.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	pos := p / 100 * float64(n-1)
	lo := int(math.Floor(pos))
	if lo >= n-1 {
		return sorted[n-1]
	}
	if lo < 0 {
		return sorted[0]
	}
	frac := pos - float64(lo)
	return sorted[lo] + frac*(sorted[lo+1]-sorted[lo])
}

func summarise(v []float64) Percentiles {
	if len(v) == 0 {
		return Percentiles{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	return Percentiles{Mean: sum / float64(len(s)), P50: Percentile(s, 50), P90: Percentile(s, 90), P99: Percentile(s, 99)}
}

// StepStats are engine.Stats deltas over a run.
type StepStats struct {
	Steps           uint64  `json:"steps"`
	StepSeconds     float64 `json:"step_seconds"` // time inside Backend.Step
	ComputedTokens  uint64  `json:"computed_tokens"`
	GeneratedTokens uint64  `json:"generated_tokens"`
	PromptTokens    uint64  `json:"prompt_tokens"`
	Preemptions     uint64  `json:"preemptions"`
	PrefixHitTokens uint64  `json:"prefix_hit_tokens"`
	// MeanStepMs is StepSeconds / Steps.
	MeanStepMs float64 `json:"mean_step_ms"`
	// MeanDecodeBatch is GeneratedTokens / Steps: sequences sampled per
	// step (steps that only prefill count too, which lowers it slightly).
	MeanDecodeBatch float64 `json:"mean_decode_batch"`
	// MeanTokensPerStep is ComputedTokens / Steps.
	MeanTokensPerStep float64 `json:"mean_tokens_per_step"`
	// BackendBusy is StepSeconds / the run's wall time: the share of time
	// the backend computed (the rest is engine, scheduling and client).
	BackendBusy float64 `json:"backend_busy"`
	// Speculative decoding: draft tokens verified and accepted, and
	// DraftAcceptance = accepted / verified (0 without drafts).
	DraftsVerified  uint64  `json:"drafts_verified,omitempty"`
	DraftsAccepted  uint64  `json:"drafts_accepted,omitempty"`
	DraftAcceptance float64 `json:"draft_acceptance,omitempty"`
}

func stepStats(before, after engine.Stats, wall time.Duration) StepStats {
	s := StepStats{
		Steps:           after.Steps - before.Steps,
		StepSeconds:     (after.StepTime - before.StepTime).Seconds(),
		ComputedTokens:  after.ComputedTokens - before.ComputedTokens,
		GeneratedTokens: after.GeneratedTokens - before.GeneratedTokens,
		PromptTokens:    after.PromptTokens - before.PromptTokens,
		Preemptions:     after.Preemptions - before.Preemptions,
		PrefixHitTokens: after.PrefixHitTokens - before.PrefixHitTokens,
		DraftsVerified:  after.DraftsVerified - before.DraftsVerified,
		DraftsAccepted:  after.DraftsAccepted - before.DraftsAccepted,
	}
	if s.DraftsVerified > 0 {
		s.DraftAcceptance = float64(s.DraftsAccepted) / float64(s.DraftsVerified)
	}
	if s.Steps > 0 {
		s.MeanStepMs = s.StepSeconds * 1e3 / float64(s.Steps)
		s.MeanDecodeBatch = float64(s.GeneratedTokens) / float64(s.Steps)
		s.MeanTokensPerStep = float64(s.ComputedTokens) / float64(s.Steps)
	}
	if wall > 0 {
		s.BackendBusy = s.StepSeconds / wall.Seconds()
	}
	return s
}

// FloorResult compares one run with a bandwidth floor.
type FloorResult struct {
	Label string `json:"label"` // what deployment the floor describes
	Floor
	// AchievedTPOTMs is the run's mean TPOT; OfFloor = floor TPOT /
	// achieved (1 = at the floor). Both are absent for a projection,
	// which is not a measurement of that model.
	AchievedTPOTMs float64 `json:"achieved_tpot_ms,omitempty"`
	OfFloor        float64 `json:"of_floor,omitempty"`
}

// RunResult is one concurrency's measurement.
type RunResult struct {
	Concurrency int `json:"concurrency"`
	Requests    int `json:"requests"`
	Warmup      int `json:"warmup_requests"`
	InputLen    int `json:"input_len"`
	OutputLen   int `json:"output_len"`

	WallSeconds           float64 `json:"wall_seconds"` // first submit to last token
	PromptTokens          int64   `json:"prompt_tokens"`
	OutputTokens          int64   `json:"output_tokens"`
	OutputTokensPerSecond float64 `json:"output_tokens_per_s"`
	TotalTokensPerSecond  float64 `json:"total_tokens_per_s"` // (prompt + output) / wall
	RequestsPerSecond     float64 `json:"requests_per_s"`

	TTFTMs Percentiles `json:"ttft_ms"` // submit to first token
	// TPOTMs is per request: (last token − first token) / (tokens − 1).
	TPOTMs Percentiles `json:"tpot_ms"`

	Steps StepStats `json:"steps"`
	// MeanDecodeContext is the mean number of KV positions a decode step
	// attends per sequence: the j-th generated token (j = 1..out−1) is
	// decoded against input+j positions, so input + output/2.
	MeanDecodeContext float64 `json:"mean_decode_context"`

	Floor      *FloorResult `json:"floor,omitempty"`
	Projection *FloorResult `json:"projection,omitempty"`
	// Profile is the GPU time of the run's steps by kernel family (--profile;
	// prefill and decode steps together, as they ran).
	Profile *ProfileReport `json:"profile,omitempty"`
	// Arrival is the long prompt that arrived mid-run (Workload.ArrivalLen).
	Arrival *ArrivalResult `json:"arrival,omitempty"`
	// GPU is what the GPUs did during the measured part (Hooks.GPU).
	GPU *GPUTelemetry `json:"gpu,omitempty"`
	// With Workload.CompareSpeculation: "off" for the run with every
	// request's drafting off, "on" for the run as the engine is set, whose
	// SpeedupVsPlain is its output tok/s over the "off" run's.
	Speculation    string  `json:"speculation,omitempty"`
	SpeedupVsPlain float64 `json:"speedup_vs_plain,omitempty"`
}

// ArrivalResult is what a long prompt arriving among decoding streams did.
type ArrivalResult struct {
	PromptTokens   int     `json:"prompt_tokens"`
	TTFTMs         float64 `json:"ttft_ms"`           // its submit to its first token
	PrefillTokPerS float64 `json:"prefill_tok_per_s"` // prompt tokens / TTFT
	// Inter-token gaps of the running streams whose interval overlaps the
	// arrival's prefill (submit to first token), and those that ended before it.
	ITLDuringMs  Percentiles `json:"itl_during_ms"`
	ITLDuringMax float64     `json:"itl_during_max_ms"`
	GapsDuring   int         `json:"gaps_during"`
	ITLBeforeMs  Percentiles `json:"itl_before_ms"`
	GapsBefore   int         `json:"gaps_before"`
}

// requestTiming is what one request's stream showed.
type requestTiming struct {
	submit, first, last time.Time
	tokens              int
	prompt              int
	stamps              []time.Time // every token's arrival (arrival runs only: inter-token gaps)
}

// Run measures one workload run per concurrency value on a running engine,
// one after the other. done, if not nil, is called after each run.
func Run(ctx context.Context, eng *engine.Engine, w Workload, done func(RunResult)) ([]RunResult, error) {
	return RunProfiled(ctx, eng, w, nil, done)
}

// RunProfiled is Run that also profiles the measured part of every run with
// prof (the engine's backend) when prof is not nil.
func RunProfiled(ctx context.Context, eng *engine.Engine, w Workload, prof Profiler, done func(RunResult)) ([]RunResult, error) {
	return RunHooked(ctx, eng, w, Hooks{Profiler: prof, RunDone: done})
}

// Hooks are what RunHooked calls besides measuring; every field is optional.
type Hooks struct {
	// Profiler profiles the measured part of every run.
	Profiler Profiler
	// RunStart is called before each run's warm-up, with the run's
	// concurrency and number of measured requests.
	RunStart func(concurrency, requests int)
	// Request is called after each measured request finishes (from the
	// goroutine that followed it: several at once).
	Request func()
	// RunDone is called after each run.
	RunDone func(RunResult)
	// GPU, when set, is sampled over the measured part of every run, every
	// GPUInterval (0 = DefaultGPUInterval), into RunResult.GPU.
	GPU         GPUSampler
	GPUInterval time.Duration
}

// RunHooked is Run with progress hooks and an optional profiler.
func RunHooked(ctx context.Context, eng *engine.Engine, w Workload, h Hooks) ([]RunResult, error) {
	lim := eng.Limits()
	if err := w.Check(lim); err != nil {
		return nil, err
	}
	results := make([]RunResult, 0, len(w.Concurrency))
	for i, c := range w.Concurrency {
		if blocks := int64(c) * int64((w.InputLen+w.OutputLen+lim.BlockSize-1)/lim.BlockSize); blocks > int64(lim.NumKVBlocks) {
			slog.Warn("bench: the KV pool cannot hold every request at full length; expect preemptions",
				"concurrency", c, "blocks_needed", blocks, "kv_blocks", lim.NumKVBlocks)
		}
		if h.RunStart != nil {
			h.RunStart(c, w.requestsFor(c))
		}
		emit := func(r RunResult) {
			results = append(results, r)
			if h.RunDone != nil {
				h.RunDone(r)
			}
		}
		var plainTokPerS float64
		if w.CompareSpeculation {
			// The same prompts (run index i) with drafting off, then on.
			plain := w
			plain.speculation = engine.SpeculationOff
			r, err := runOne(ctx, eng, plain, c, uint64(i), h)
			if err != nil {
				return results, fmt.Errorf("run at concurrency %d, speculation off: %w", c, err)
			}
			r.Speculation, plainTokPerS = "off", r.OutputTokensPerSecond
			emit(r)
			if h.RunStart != nil {
				h.RunStart(c, w.requestsFor(c))
			}
		}
		r, err := runOne(ctx, eng, w, c, uint64(i), h)
		if err != nil {
			return results, fmt.Errorf("run at concurrency %d: %w", c, err)
		}
		if w.CompareSpeculation {
			r.Speculation = "on"
			if plainTokPerS > 0 {
				r.SpeedupVsPlain = r.OutputTokensPerSecond / plainTokPerS
			}
		}
		emit(r)
	}
	return results, nil
}

// runOne runs the warm-up and then the measured requests at concurrency c,
// with h's profiler, GPU sampler and per-request hook.
func runOne(ctx context.Context, eng *engine.Engine, w Workload, c int, runIndex uint64, h Hooks) (RunResult, error) {
	prof, onReq := h.Profiler, h.Request
	vocab := eng.Limits().VocabSize
	rng := rand.New(rand.NewPCG(uint64(w.Seed), runIndex))
	nWarm, nReq := w.warmupFor(c), w.requestsFor(c)
	prompts := func(n int) [][]int32 {
		p := make([][]int32, n)
		for i := range p {
			p[i] = make([]int32, w.InputLen)
			for j := range p[i] {
				p[i][j] = int32(rng.IntN(vocab))
			}
		}
		return p
	}
	warm := prompts(nWarm)
	measured := prompts(nReq)
	// Seeds for sampled runs: distinct per request, reproducible per run.
	seedBase := w.Seed + int64(runIndex)<<32
	if nWarm > 0 {
		if _, err := drive(ctx, eng, w, min(c, nWarm), warm, seedBase+int64(nReq), nil, nil); err != nil {
			return RunResult{}, fmt.Errorf("warm-up: %w", err)
		}
	}
	if prof != nil {
		if err := prof.StartProfile(); err != nil {
			return RunResult{}, fmt.Errorf("start profile: %w", err)
		}
	}
	var gpus *gpuWatch
	if h.GPU != nil {
		gpus = watchGPUs(h.GPU, h.GPUInterval)
	}
	before := eng.Stats()
	start := time.Now()
	var (
		timings []requestTiming
		err     error
		arrival *requestTiming
	)
	if w.ArrivalLen > 0 {
		timings, arrival, err = driveWithArrival(ctx, eng, w, c, measured, seedBase, rng, onReq)
	} else {
		timings, err = drive(ctx, eng, w, c, measured, seedBase, nil, onReq)
	}
	after := eng.Stats()
	var gpuTel *GPUTelemetry
	if gpus != nil {
		gpuTel = gpus.stop()
	}
	if err != nil {
		if prof != nil {
			_, _ = prof.StopProfile()
		}
		return RunResult{}, err
	}
	var profile *ProfileReport
	if prof != nil {
		p, err := prof.StopProfile()
		if err != nil {
			return RunResult{}, fmt.Errorf("stop profile: %w", err)
		}
		profile = NewProfileReport(p, nil)
	}
	end := start
	for _, t := range timings {
		if t.last.After(end) {
			end = t.last
		}
	}
	wall := end.Sub(start)
	r := RunResult{
		Concurrency: c, Requests: nReq, Warmup: nWarm, InputLen: w.InputLen, OutputLen: w.OutputLen,
		WallSeconds:       wall.Seconds(),
		Steps:             stepStats(before, after, wall),
		MeanDecodeContext: float64(w.InputLen) + float64(w.OutputLen)/2,
		Profile:           profile,
		GPU:               gpuTel,
	}
	ttft := make([]float64, 0, len(timings))
	tpot := make([]float64, 0, len(timings))
	for _, t := range timings {
		r.PromptTokens += int64(t.prompt)
		r.OutputTokens += int64(t.tokens)
		ttft = append(ttft, ms(t.first.Sub(t.submit)))
		tpot = append(tpot, ms(t.last.Sub(t.first))/float64(t.tokens-1))
	}
	r.TTFTMs, r.TPOTMs = summarise(ttft), summarise(tpot)
	if arrival != nil {
		r.Arrival = arrivalResult(*arrival, timings)
	}
	if s := wall.Seconds(); s > 0 {
		r.OutputTokensPerSecond = float64(r.OutputTokens) / s
		r.TotalTokensPerSecond = float64(r.PromptTokens+r.OutputTokens) / s
		r.RequestsPerSecond = float64(nReq) / s
	}
	return r, nil
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// drive runs prompts through eng with at most c in flight (closed loop:
// each of c workers submits its next request when the previous one ends)
// and checks that every request produced exactly w.OutputLen tokens.
// tokens, if not nil, counts every token the streams receive; onReq, if not
// nil, is called after each request finishes.
func drive(ctx context.Context, eng *engine.Engine, w Workload, c int, prompts [][]int32, seedBase int64, tokens *atomic.Int64, onReq func()) ([]requestTiming, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	timings := make([]requestTiming, len(prompts))
	var (
		mu      sync.Mutex
		next    int
		firstEr error
		wg      sync.WaitGroup
	)
	take := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if next >= len(prompts) || firstEr != nil {
			return 0, false
		}
		next++
		return next - 1, true
	}
	fail := func(err error) {
		mu.Lock()
		if firstEr == nil {
			firstEr = err
		}
		mu.Unlock()
		cancel()
	}
	for range c {
		wg.Go(func() {
			for {
				i, ok := take()
				if !ok {
					return
				}
				req := &engine.Request{
					Label:        fmt.Sprintf("bench-%d", i),
					PromptTokens: prompts[i],
					MaxTokens:    w.OutputLen,
					IgnoreEOS:    true,
					Sampling:     engine.SamplingParams{Temperature: w.Temperature, TopP: 1, RepetitionPenalty: 1},
					Speculation:  w.speculation,
				}
				if w.Temperature > 0 {
					req.Sampling.Seed, req.Sampling.HasSeed = seedBase+int64(i), true
				}
				t, err := oneRequest(ctx, eng, req, w.OutputLen, tokens)
				if err != nil {
					fail(fmt.Errorf("request %d: %w", i, err))
					return
				}
				timings[i] = t
				if onReq != nil {
					onReq()
				}
			}
		})
	}
	wg.Wait()
	if firstEr != nil {
		return nil, firstEr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return timings, nil
}

// oneRequest submits req and follows its stream to the end.
func oneRequest(ctx context.Context, eng *engine.Engine, req *engine.Request, want int, tokens *atomic.Int64) (requestTiming, error) {
	t := requestTiming{prompt: len(req.PromptTokens), submit: time.Now()}
	st, err := eng.Submit(ctx, req)
	if err != nil {
		return t, err
	}
	defer st.Close()
	var final *engine.Event
	for ev := range st.Events() {
		if ev.HasToken {
			now := time.Now()
			if t.tokens == 0 {
				t.first = now
			}
			t.last = now
			t.tokens++
			if tokens != nil { // an arrival run: its report needs every gap
				t.stamps = append(t.stamps, now)
				tokens.Add(1)
			}
		}
		if ev.Finish != "" {
			final = &ev
		}
	}
	if final == nil {
		if err := ctx.Err(); err != nil {
			return t, err
		}
		return t, errors.New("stream closed without a final event")
	}
	switch {
	case final.Finish == engine.FinishError:
		return t, fmt.Errorf("engine error: %w", final.Err)
	case final.Finish != engine.FinishLength:
		return t, fmt.Errorf("finished %q after %d tokens, want %d tokens and finish %q", final.Finish, t.tokens, want, engine.FinishLength)
	case t.tokens != want || final.Usage.CompletionTokens != want:
		return t, fmt.Errorf("produced %d tokens (usage says %d), want exactly %d", t.tokens, final.Usage.CompletionTokens, want)
	case final.Usage.PromptTokens != len(req.PromptTokens):
		return t, fmt.Errorf("usage counts %d prompt tokens, sent %d", final.Usage.PromptTokens, len(req.PromptTokens))
	}
	return t, nil
}

// AttachFloor fills r.Floor from the floor model m at the run's mean decode
// batch and context, comparing it with the run's mean TPOT.
func AttachFloor(r *RunResult, label string, m FloorModel, bw Bandwidth) error {
	f, err := floorAt(r, m, bw)
	if err != nil {
		return err
	}
	fr := &FloorResult{Label: label, Floor: f, AchievedTPOTMs: r.TPOTMs.Mean}
	if r.TPOTMs.Mean > 0 {
		fr.OfFloor = f.StepMs / r.TPOTMs.Mean
	}
	r.Floor = fr
	return nil
}

// AttachProjection fills r.Projection: the floor of another model (or
// deployment) at the run's mean decode batch and context. It is a
// projection, not a measurement, so it carries no achieved figures.
func AttachProjection(r *RunResult, label string, m FloorModel, bw Bandwidth) error {
	f, err := floorAt(r, m, bw)
	if err != nil {
		return err
	}
	r.Projection = &FloorResult{Label: label, Floor: f}
	return nil
}

func floorAt(r *RunResult, m FloorModel, bw Bandwidth) (Floor, error) {
	if r.Steps.MeanDecodeBatch <= 0 {
		return Floor{}, fmt.Errorf("run at concurrency %d recorded no engine steps", r.Concurrency)
	}
	return m.Floor(r.Steps.MeanDecodeBatch, r.MeanDecodeContext, bw.BytesPerSecond)
}

// driveWithArrival runs drive and, once the streams of the first wave have
// produced about six tokens each, submits one request with a prompt of w.ArrivalLen
// random tokens and one output token. It returns the streams' timings and
// the arrival's.
func driveWithArrival(ctx context.Context, eng *engine.Engine, w Workload, c int, prompts [][]int32, seedBase int64, rng *rand.Rand, onReq func()) ([]requestTiming, *requestTiming, error) {
	vocab := eng.Limits().VocabSize
	long := make([]int32, w.ArrivalLen)
	for j := range long {
		long[j] = int32(rng.IntN(vocab))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var tokens atomic.Int64
	type out struct {
		t   []requestTiming
		err error
	}
	streams := make(chan out, 1)
	go func() {
		t, err := drive(ctx, eng, w, c, prompts, seedBase, &tokens, onReq)
		streams <- out{t, err}
	}()
	// Two tokens per stream put the first wave in decode; four more give the
	// steady gaps the report compares with.
	want := int64(6 * min(c, len(prompts)))
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for tokens.Load() < want {
		select {
		case o := <-streams: // the streams ended before the arrival could be placed
			if o.err != nil {
				return nil, nil, o.err
			}
			return nil, nil, fmt.Errorf("arrival: the streams finished before all %d of them were decoding; raise --output-len", c)
		case <-tick.C:
		}
	}
	req := &engine.Request{
		Label: "bench-arrival", PromptTokens: long, MaxTokens: 1, IgnoreEOS: true,
		Sampling:    engine.SamplingParams{Temperature: 0, TopP: 1, RepetitionPenalty: 1},
		Speculation: w.speculation,
	}
	at, err := oneRequest(ctx, eng, req, 1, nil)
	if err != nil {
		cancel()
		<-streams
		return nil, nil, fmt.Errorf("arrival of %d prompt tokens: %w", w.ArrivalLen, err)
	}
	o := <-streams
	if o.err != nil {
		return nil, nil, o.err
	}
	return o.t, &at, nil
}

// arrivalResult summarises the arrival's TTFT and the streams' inter-token
// gaps during its prefill ([submit, first token]) and before it: gaps after
// every stream that started before the arrival had its first token (steady
// decode, not the streams' own prefill) and ending by the arrival's submit.
func arrivalResult(a requestTiming, streams []requestTiming) *ArrivalResult {
	ttft := a.first.Sub(a.submit)
	r := &ArrivalResult{PromptTokens: a.prompt, TTFTMs: ms(ttft)}
	if ttft > 0 {
		r.PrefillTokPerS = float64(a.prompt) / ttft.Seconds()
	}
	var decodeFrom time.Time // every stream started before the arrival is decoding
	for _, s := range streams {
		if s.submit.Before(a.submit) && s.first.After(decodeFrom) {
			decodeFrom = s.first
		}
	}
	var during, before []float64
	for _, s := range streams {
		for i := 1; i < len(s.stamps); i++ {
			g0, g1 := s.stamps[i-1], s.stamps[i]
			switch {
			case g1.After(a.submit) && g0.Before(a.first):
				during = append(during, ms(g1.Sub(g0)))
			case !g1.After(a.submit) && !g0.Before(decodeFrom):
				before = append(before, ms(g1.Sub(g0)))
			}
		}
	}
	r.GapsDuring, r.GapsBefore = len(during), len(before)
	r.ITLDuringMs, r.ITLBeforeMs = summarise(during), summarise(before)
	for _, g := range during {
		r.ITLDuringMax = max(r.ITLDuringMax, g)
	}
	return r
}
