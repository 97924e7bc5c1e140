package loadgen

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/glmctl/glmctl/pkg/bench"
)

// Failure kinds of a request that did not complete.
const (
	FailHTTP       = "http"         // a status other than 200 (the kind is "http_<code>")
	FailTimeout    = "timeout"      // --request-timeout passed
	FailStream     = "stream_error" // an error event, a broken or truncated stream, bad JSON
	FailConnection = "connection"   // the request could not be sent
	FailEmpty      = "empty"        // a stream that ended normally without a token
	failCancelled  = "cancelled"    // the run was interrupted (not a failure: left out)
)

// Record is what one request showed the client. Times are in milliseconds;
// StartMs is from the start of its run.
type Record struct {
	Index   int    `json:"index"`
	OK      bool   `json:"ok"`
	Failure string `json:"failure,omitempty"` // kind, when not OK
	Error   string `json:"error,omitempty"`
	// PromptTokens is the usage's prompt_tokens, else the prompt's count by
	// the server's /tokenize, else 0.
	PromptTokens int `json:"prompt_tokens"`
	// OutputTokens is the final usage chunk's completion_tokens, else the
	// number of chunks that carried text (OutputFromUsage false).
	OutputTokens    int       `json:"output_tokens"`
	OutputFromUsage bool      `json:"output_from_usage"`
	Chunks          int       `json:"chunks"` // SSE chunks that carried generated text
	MaxTokens       int       `json:"max_tokens"`
	StartMs         float64   `json:"start_ms"`
	TTFTMs          float64   `json:"ttft_ms"` // send to the first chunk with text
	E2EMs           float64   `json:"e2e_ms"`  // send to the end of the stream
	ITLMs           []float64 `json:"itl_ms,omitempty"`
}

// TPOT is the time per output token after the first: (e2e − ttft) /
// (output tokens − 1). ok is false with fewer than two tokens.
func TPOT(e2eMs, ttftMs float64, outputTokens int) (tpot float64, ok bool) {
	if outputTokens < 2 {
		return 0, false
	}
	return (e2eMs - ttftMs) / float64(outputTokens-1), true
}

// SLO bounds per-request latencies; a zero field is no bound.
type SLO struct {
	TTFTMs float64 `json:"ttft_ms,omitempty"`
	TPOTMs float64 `json:"tpot_ms,omitempty"`
	E2EMs  float64 `json:"e2e_ms,omitempty"`
}

// IsZero reports whether no bound is set.
func (s SLO) IsZero() bool { return s == SLO{} }

func (s SLO) String() string {
	var parts []string
	for _, p := range []struct {
		name string
		v    float64
	}{{"ttft", s.TTFTMs}, {"tpot", s.TPOTMs}, {"e2e", s.E2EMs}} {
		if p.v > 0 {
			parts = append(parts, fmt.Sprintf("%s<=%sms", p.name, bench.FormatNum(p.v)))
		}
	}
	return strings.Join(parts, ",")
}

// ParseSLO reads "ttft=200ms,tpot=50ms,e2e=2s": durations in Go syntax, or
// bare numbers in milliseconds.
func ParseSLO(spec string) (SLO, error) {
	var s SLO
	if strings.TrimSpace(spec) == "" {
		return s, nil
	}
	for _, part := range strings.Split(spec, ",") {
		key, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return s, fmt.Errorf("--slo: %q is not metric=limit (e.g. ttft=200ms)", part)
		}
		var msv float64
		if f, err := strconv.ParseFloat(val, 64); err == nil {
			msv = f
		} else if d, err := time.ParseDuration(val); err == nil {
			msv = float64(d) / float64(time.Millisecond)
		} else {
			return s, fmt.Errorf("--slo: %s=%q is not a duration (200ms, 1.5s) or a number of milliseconds", key, val)
		}
		if !(msv > 0) || math.IsInf(msv, 0) {
			return s, fmt.Errorf("--slo: %s=%s must be a positive duration", key, val)
		}
		switch strings.ToLower(key) {
		case "ttft":
			s.TTFTMs = msv
		case "tpot":
			s.TPOTMs = msv
		case "e2e", "e2el":
			s.E2EMs = msv
		default:
			return s, fmt.Errorf("--slo: unknown metric %q (ttft, tpot, e2e)", key)
		}
	}
	return s, nil
}

// Met reports whether a completed request meets every bound. A request with
// one output token has no TPOT and meets any TPOT bound.
func (s SLO) Met(r Record) bool {
	if !r.OK {
		return false
	}
	if s.TTFTMs > 0 && r.TTFTMs > s.TTFTMs {
		return false
	}
	if s.E2EMs > 0 && r.E2EMs > s.E2EMs {
		return false
	}
	if tpot, ok := TPOT(r.E2EMs, r.TTFTMs, r.OutputTokens); s.TPOTMs > 0 && ok && tpot > s.TPOTMs {
		return false
	}
	return true
}

// Goodput is the share and rate of requests that met the SLO.
type Goodput struct {
	SLO               SLO     `json:"slo"`
	Good              int     `json:"good_requests"`
	Fraction          float64 `json:"fraction"` // good / requests finished (failures count against it)
	RequestsPerSecond float64 `json:"requests_per_s"`
}

// Stats summarise one run's records.
type Stats struct {
	Requests  int            `json:"requests"` // finished: completed + failed
	Completed int            `json:"completed"`
	Failed    int            `json:"failed"`
	Cancelled int            `json:"cancelled,omitempty"` // cut off by an interrupt, left out of every figure
	Failures  map[string]int `json:"failures,omitempty"`  // by kind
	// FirstError is the message of the failure that ended first.
	FirstError string `json:"first_error,omitempty"`

	WallSeconds           float64 `json:"wall_seconds"` // first send to last end
	PromptTokens          int64   `json:"prompt_tokens"`
	OutputTokens          int64   `json:"output_tokens"`
	RequestsPerSecond     float64 `json:"requests_per_s"` // completed / wall
	OutputTokensPerSecond float64 `json:"output_tokens_per_s"`
	TotalTokensPerSecond  float64 `json:"total_tokens_per_s"`
	// OutputCounted is true when some request's output tokens were counted
	// from chunks (the server sent no usage).
	OutputCounted bool `json:"output_counted_from_chunks,omitempty"`

	TTFTMs bench.Percentiles `json:"ttft_ms"`
	TPOTMs bench.Percentiles `json:"tpot_ms"`
	ITLMs  bench.Percentiles `json:"itl_ms"` // over every gap between chunks of every request
	E2EMs  bench.Percentiles `json:"e2e_ms"`

	Goodput *Goodput `json:"goodput,omitempty"`
}

// Summarise computes a run's figures from its records; wall is the run's
// duration (first send to last end). Cancelled records count only as such.
func Summarise(records []Record, wall time.Duration, slo SLO) Stats {
	st := Stats{WallSeconds: wall.Seconds()}
	var ttft, tpot, itl, e2e []float64
	firstEnd := math.Inf(1)
	good := 0
	for _, r := range records {
		switch {
		case r.Failure == failCancelled:
			st.Cancelled++
			continue
		case !r.OK:
			st.Requests++
			st.Failed++
			if st.Failures == nil {
				st.Failures = map[string]int{}
			}
			st.Failures[r.Failure]++
			if end := r.StartMs + r.E2EMs; end < firstEnd {
				firstEnd, st.FirstError = end, r.Error
			}
			continue
		}
		st.Requests++
		st.Completed++
		st.PromptTokens += int64(r.PromptTokens)
		st.OutputTokens += int64(r.OutputTokens)
		st.OutputCounted = st.OutputCounted || !r.OutputFromUsage
		ttft = append(ttft, r.TTFTMs)
		e2e = append(e2e, r.E2EMs)
		itl = append(itl, r.ITLMs...)
		if v, ok := TPOT(r.E2EMs, r.TTFTMs, r.OutputTokens); ok {
			tpot = append(tpot, v)
		}
		if slo.Met(r) {
			good++
		}
	}
	st.TTFTMs, st.TPOTMs, st.ITLMs, st.E2EMs = bench.Summarise(ttft), bench.Summarise(tpot), bench.Summarise(itl), bench.Summarise(e2e)
	if s := wall.Seconds(); s > 0 {
		st.RequestsPerSecond = float64(st.Completed) / s
		st.OutputTokensPerSecond = float64(st.OutputTokens) / s
		st.TotalTokensPerSecond = float64(st.PromptTokens+st.OutputTokens) / s
	}
	if !slo.IsZero() {
		g := &Goodput{SLO: slo, Good: good}
		if st.Requests > 0 {
			g.Fraction = float64(good) / float64(st.Requests)
		}
		if s := wall.Seconds(); s > 0 {
			g.RequestsPerSecond = float64(good) / s
		}
		st.Goodput = g
	}
	return st
}

// failureText lists failures by kind, most frequent first: "http_500 3, timeout 1".
func failureText(m map[string]int) string {
	kinds := make([]string, 0, len(m))
	for k := range m {
		kinds = append(kinds, k)
	}
	slices.SortFunc(kinds, func(a, b string) int {
		if m[a] != m[b] {
			return m[b] - m[a]
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
