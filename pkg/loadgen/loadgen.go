// Package loadgen is the client side of `glmctl bench --url`: a load
// generator for any OpenAI-compatible server (glmctl serve, vLLM, SGLang,
// llama-server). It sends streaming /v1/completions or /v1/chat/completions
// requests at a fixed concurrency (closed loop) or at a Poisson request rate
// (open loop), and measures what a client sees: TTFT, inter-token latency
// per SSE chunk, TPOT, end-to-end latency, throughput, goodput under SLOs and
// failures by kind. The in-process engine benchmark is pkg/bench, whose
// percentile and table helpers this package reuses.
package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Limits that keep a typo from queueing millions of requests.
const (
	MaxConcurrency = 1 << 14
	MaxRequests    = 1 << 20
)

// Config describes a load-generation session: one run per concurrency value
// or per request rate.
type Config struct {
	URL      string // the server: http://host:port (a trailing /v1 is dropped)
	Endpoint string // EndpointCompletions or EndpointChat
	Model    string // "" = the first model of GET /v1/models
	APIKey   string

	// Concurrency: one closed-loop run per value. RequestRates: one
	// open-loop run per value (requests per second, Poisson arrivals). Set
	// exactly one.
	Concurrency  []int
	RequestRates []float64
	// Requests per run; 0 = 4 × concurrency, or 100 at a request rate.
	Requests int
	// Warmup requests before each run, not measured; < 0 = one per
	// in-flight slot (concurrency) or 1 (rate).
	Warmup int

	InputLen, OutputLen int
	RangeRatio          float64 // lengths drawn from [l·(1−r), l·(1+r)]
	Dataset             []DatasetEntry
	DatasetName         string
	// OutputLenOverride: OutputLen beats the dataset's own lengths.
	OutputLenOverride bool

	Seed        int64
	Temperature float64
	IgnoreEOS   bool          // send ignore_eos and min_tokens
	Timeout     time.Duration // per request; 0 = none
	SLO         SLO
	// KeepRecords keeps every request's record in the report.
	KeepRecords bool

	HTTPClient *http.Client // nil = one sized for the concurrency
	// Progress, if set, is told about each run and each finished request.
	Progress Progress
}

// Progress follows a session.
type Progress interface {
	Start(run string, requests int)
	Done(r Record)
	Finish()
}

// Run runs every configured run against the server. On an interrupt (ctx
// ends) it returns the report of what finished, marked Interrupted, and
// ctx's error.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	base, err := baseURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	hc := cfg.HTTPClient
	if hc == nil {
		conns := 64
		for _, c := range cfg.Concurrency {
			conns = max(conns, c)
		}
		hc = &http.Client{Transport: &http.Transport{
			Proxy: http.ProxyFromEnvironment, MaxIdleConns: 0, MaxIdleConnsPerHost: conns,
			DisableCompression: true, IdleConnTimeout: 90 * time.Second,
		}}
	}
	c := &client{http: hc, base: base, endpoint: cfg.Endpoint, model: cfg.Model, apiKey: cfg.APIKey,
		ignoreEOS: cfg.IgnoreEOS, temperature: cfg.Temperature, timeout: cfg.Timeout}
	if c.model == "" {
		if c.model, err = firstModel(ctx, c); err != nil {
			return nil, err
		}
	}
	tok := probeTokenizer(ctx, c)
	src := &promptSource{tok: tok, dataset: cfg.Dataset, inputLen: cfg.InputLen, outputLen: cfg.OutputLen,
		rangeRatio: cfg.RangeRatio, overrideOL: cfg.OutputLenOverride, seed: cfg.Seed}
	if len(cfg.Dataset) > 0 {
		src.order = rand.New(rand.NewPCG(uint64(cfg.Seed), 0xda7a)).Perm(len(cfg.Dataset))
	}
	rep := &Report{Header: Header{
		Date: time.Now().UTC().Format(time.RFC3339), URL: base, Endpoint: cfg.Endpoint, Model: c.model,
		ServerVersion: serverVersion(ctx, c), GoVersion: runtime.Version(),
		Prompts: promptsText(cfg, tok), Tokenizer: tokText(tok),
		Streaming:      "stream, stream_options.include_usage" + map[bool]string{true: ", ignore_eos + min_tokens", false: ""}[cfg.IgnoreEOS],
		RequestTimeout: cfg.Timeout.String(), Seed: cfg.Seed, Temperature: cfg.Temperature,
	}}
	if !cfg.SLO.IsZero() {
		slo := cfg.SLO
		rep.Header.SLO = &slo
	}
	type run struct {
		conc int
		rate float64
	}
	var runs []run
	for _, v := range cfg.Concurrency {
		runs = append(runs, run{conc: v})
	}
	for _, v := range cfg.RequestRates {
		runs = append(runs, run{rate: v})
	}
	for i, rn := range runs {
		n, warm := cfg.Requests, cfg.Warmup
		label := fmt.Sprintf("concurrency %d", rn.conc)
		if rn.rate > 0 {
			label = fmt.Sprintf("rate %s req/s", trimFloat(rn.rate))
			if n == 0 {
				n = 100
			}
			if warm < 0 {
				warm = 1
			}
		} else {
			if n == 0 {
				n = 4 * rn.conc
			}
			n = max(n, rn.conc)
			if warm < 0 {
				warm = rn.conc
			}
		}
		all, err := src.prompts(ctx, warm+n, uint64(i))
		if err != nil {
			if ctx.Err() != nil {
				rep.Interrupted = true
				return rep, ctx.Err()
			}
			return rep, fmt.Errorf("%s: making prompts through %s/tokenize: %w", label, base, err)
		}
		if warm > 0 {
			recs, _ := closedLoop(ctx, c, all[:warm], max(1, min(warm, max(rn.conc, 1))), nil)
			if ctx.Err() != nil {
				rep.Interrupted = true
				return rep, ctx.Err()
			}
			okAny := false
			for _, r := range recs {
				okAny = okAny || r.OK
			}
			if !okAny {
				return rep, fmt.Errorf("%s: every warm-up request failed; first: %s", label, recs[0].Error)
			}
		}
		if cfg.Progress != nil {
			cfg.Progress.Start(label, n)
		}
		var (
			recs []Record
			wall time.Duration
			peak int
		)
		if rn.rate > 0 {
			recs, wall, peak = poisson(ctx, c, all[warm:], rn.rate, rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(i)^0x9e3779b9)), cfg.Progress)
		} else {
			recs, wall = closedLoop(ctx, c, all[warm:], rn.conc, cfg.Progress)
			peak = rn.conc
		}
		if cfg.Progress != nil {
			cfg.Progress.Finish()
		}
		res := RunResult{Concurrency: rn.conc, RequestRate: rn.rate, Sent: n, Warmup: warm, PeakInFlight: peak,
			Stats: Summarise(recs, wall, cfg.SLO)}
		var in, out int64
		for _, p := range all[warm:] {
			in += int64(p.Tokens)
			out += int64(p.OutputLen)
		}
		res.MeanInputTokens = float64(in) / float64(n)
		res.MeanMaxTokens = float64(out) / float64(n)
		if cfg.KeepRecords {
			res.Records = recs
		}
		rep.Runs = append(rep.Runs, res)
		if ctx.Err() != nil {
			rep.Interrupted = true
			return rep, ctx.Err()
		}
	}
	return rep, nil
}

func (cfg *Config) check() error {
	switch {
	case cfg.Endpoint != EndpointCompletions && cfg.Endpoint != EndpointChat:
		return fmt.Errorf("--endpoint: %q is not %s or %s", cfg.Endpoint, EndpointCompletions, EndpointChat)
	case len(cfg.Concurrency) > 0 && len(cfg.RequestRates) > 0:
		return errors.New("--concurrency and --request-rate: choose one")
	case len(cfg.Concurrency) == 0 && len(cfg.RequestRates) == 0:
		return errors.New("--concurrency or --request-rate: give one")
	case cfg.Requests < 0 || cfg.Requests > MaxRequests:
		return fmt.Errorf("--requests: %d out of range [0, %d]", cfg.Requests, MaxRequests)
	case cfg.Warmup > MaxRequests:
		return fmt.Errorf("--warmup: %d exceeds %d", cfg.Warmup, MaxRequests)
	case cfg.InputLen < 1 && len(cfg.Dataset) == 0:
		return fmt.Errorf("--input-len: must be >= 1, got %d", cfg.InputLen)
	case cfg.OutputLen < 1:
		return fmt.Errorf("--output-len: must be >= 1, got %d", cfg.OutputLen)
	case !(cfg.RangeRatio >= 0 && cfg.RangeRatio < 1):
		return fmt.Errorf("--range-ratio: %g must be in [0, 1)", cfg.RangeRatio)
	case cfg.Temperature < 0 || cfg.Temperature != cfg.Temperature:
		return fmt.Errorf("--temperature: must be >= 0, got %g", cfg.Temperature)
	case cfg.Timeout < 0:
		return fmt.Errorf("--request-timeout: %s must be >= 0", cfg.Timeout)
	}
	for _, c := range cfg.Concurrency {
		if c < 1 || c > MaxConcurrency {
			return fmt.Errorf("--concurrency: %d out of range [1, %d]", c, MaxConcurrency)
		}
	}
	for _, r := range cfg.RequestRates {
		if !(r > 0) || r > 1e6 {
			return fmt.Errorf("--request-rate: %g must be a rate in requests per second in (0, 1e6]", r)
		}
	}
	return nil
}

// baseURL normalises the server address: scheme and host, an optional path
// prefix, no trailing slash or /v1.
func baseURL(raw string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("--url: %q is not an http(s)://host[:port] address", raw)
	}
	u.Path = strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), "/v1")
	u.RawQuery, u.Fragment = "", ""
	return strings.TrimSuffix(u.String(), "/"), nil
}

// firstModel asks GET /v1/models for the served model's id.
func firstModel(ctx context.Context, c *client) (string, error) {
	req, err := c.newRequest(ctx, http.MethodGet, "/v1/models", nil)
	if err != nil {
		return "", err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return "", fmt.Errorf("--url: cannot reach %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s/v1/models: HTTP %d (give --model, and --api-key if the server needs one)", c.base, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list.Data) == 0 || list.Data[0].ID == "" {
		return "", fmt.Errorf("GET %s/v1/models: no model listed (give --model)", c.base)
	}
	return list.Data[0].ID, nil
}

// serverVersion is GET /version's "version" (vLLM, glmctl), or "".
func serverVersion(ctx context.Context, c *client) string {
	req, err := c.newRequest(ctx, http.MethodGet, "/version", nil)
	if err != nil {
		return ""
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var v struct {
		Version string `json:"version"`
		Commit  string `json:"commit"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&v) != nil {
		return ""
	}
	if v.Commit != "" {
		return v.Version + " (commit " + v.Commit + ")"
	}
	return v.Version
}

// closedLoop sends prompts with c workers, each sending its next request
// when the previous one ends. It stops sending when ctx ends.
func closedLoop(ctx context.Context, cl *client, prompts []Prompt, c int, prog Progress) ([]Record, time.Duration) {
	recs := make([]Record, len(prompts))
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	start := time.Now()
	end := start
	sent := make([]bool, len(prompts))
	for range c {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(prompts) || ctx.Err() != nil {
					return
				}
				r := cl.do(ctx, prompts[i], i, start)
				recs[i] = r
				mu.Lock()
				sent[i] = true
				if t := start.Add(time.Duration((r.StartMs + r.E2EMs) * 1e6)); t.After(end) && r.Failure != failCancelled {
					end = t
				}
				mu.Unlock()
				if prog != nil && r.Failure != failCancelled {
					prog.Done(r)
				}
			}
		})
	}
	wg.Wait()
	return keepSent(recs, sent), end.Sub(start)
}

// poisson sends prompts at exponentially distributed intervals of mean
// 1/rate (a Poisson process), each on its own, however many are in flight.
func poisson(ctx context.Context, cl *client, prompts []Prompt, rate float64, rng *rand.Rand, prog Progress) ([]Record, time.Duration, int) {
	recs := make([]Record, len(prompts))
	sent := make([]bool, len(prompts))
	var (
		wg             sync.WaitGroup
		mu             sync.Mutex
		inFlight, peak int
	)
	start := time.Now()
	end := start
	at := start
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
loop:
	for i := range prompts {
		if i > 0 {
			at = at.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
			timer.Reset(time.Until(at))
			select {
			case <-ctx.Done():
				break loop
			case <-timer.C:
			}
		}
		if ctx.Err() != nil {
			break
		}
		mu.Lock()
		inFlight++
		peak = max(peak, inFlight)
		sent[i] = true
		mu.Unlock()
		wg.Go(func() {
			r := cl.do(ctx, prompts[i], i, start)
			recs[i] = r
			mu.Lock()
			inFlight--
			if t := start.Add(time.Duration((r.StartMs + r.E2EMs) * 1e6)); t.After(end) && r.Failure != failCancelled {
				end = t
			}
			mu.Unlock()
			if prog != nil && r.Failure != failCancelled {
				prog.Done(r)
			}
		})
	}
	wg.Wait()
	return keepSent(recs, sent), end.Sub(start), peak
}

func keepSent(recs []Record, sent []bool) []Record {
	out := recs[:0]
	for i, r := range recs {
		if sent[i] {
			out = append(out, r)
		}
	}
	return out
}

func trimFloat(f float64) string {
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", f), "0"), ".")
}
