package server

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/glmctl/glmctl/pkg/engine"
)

// metrics is the server's own Prometheus registry (never the global one, so
// several servers can live in one process, as in tests).
type metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	inFlight prometheus.Gauge
	ttft     prometheus.Histogram
	itl      prometheus.Histogram
	e2e      prometheus.Histogram
	step     prometheus.Histogram
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "glmctl_http_requests_total",
			Help: "HTTP requests by route and status code (499: the client went away).",
		}, []string{"path", "code"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "glmctl_http_requests_in_flight",
			Help: "HTTP requests being served.",
		}),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "glmctl_time_to_first_token_seconds",
			Help:    "Time from request arrival to the first generated token.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}),
		itl: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "glmctl_inter_token_latency_seconds",
			Help:    "Time between consecutive generated tokens of one request.",
			Buckets: []float64{.001, .0025, .005, .01, .02, .04, .06, .08, .1, .25, .5, 1, 2.5},
		}),
		e2e: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "glmctl_e2e_request_latency_seconds",
			Help:    "Time from request arrival to its last token (generation requests that reached the engine).",
			Buckets: []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 20, 40, 60, 120, 300, 600},
		}),
		step: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "glmctl_step_duration_seconds",
			Help:    "Duration of one engine step (one backend forward pass over the batch).",
			Buckets: []float64{.001, .0025, .005, .01, .02, .04, .08, .16, .32, .64, 1.28, 2.56, 5.12},
		}),
	}
	m.reg.MustRegister(m.requests, m.inFlight, m.ttft, m.itl, m.e2e, m.step,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// watchEngine exports the engine's counters and gauges, read once per
// scrape.
func (m *metrics) watchEngine(e *engine.Engine) {
	m.reg.MustRegister(&engineCollector{stats: e.Stats})
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// timeSteps wraps a backend so that each Step is timed into the step
// histogram; the engine sees the same backend otherwise.
func (m *metrics) timeSteps(b engine.Backend) engine.Backend {
	return &timedBackend{Backend: b, hist: m.step}
}

type timedBackend struct {
	engine.Backend
	hist prometheus.Histogram
}

func (b *timedBackend) Step(ctx context.Context, batch *engine.StepBatch) ([]engine.SeqResult, error) {
	t0 := time.Now()
	res, err := b.Backend.Step(ctx, batch)
	b.hist.Observe(time.Since(t0).Seconds())
	return res, err
}

var (
	descQueue = prometheus.NewDesc("glmctl_queue_depth",
		"Requests waiting for the engine (submitted or preempted, not running).", nil, nil)
	descRunning = prometheus.NewDesc("glmctl_running_sequences",
		"Sequences in the running batch.", nil, nil)
	descKVTotal = prometheus.NewDesc("glmctl_kv_blocks_total",
		"KV cache blocks managed by the engine.", nil, nil)
	descKVUsed = prometheus.NewDesc("glmctl_kv_blocks_used",
		"KV cache blocks owned by running sequences.", nil, nil)
	descKVCached = prometheus.NewDesc("glmctl_kv_blocks_cached",
		"Unowned KV cache blocks holding a reusable prefix.", nil, nil)
	descKVUsage = prometheus.NewDesc("glmctl_kv_cache_usage_ratio",
		"KV cache occupancy: used blocks over total blocks (0..1).", nil, nil)
	descPrompt = prometheus.NewDesc("glmctl_prompt_tokens_total",
		"Prompt tokens of requests admitted by the engine.", nil, nil)
	descGenerated = prometheus.NewDesc("glmctl_generation_tokens_total",
		"Tokens generated (sampled).", nil, nil)
	descFinished = prometheus.NewDesc("glmctl_engine_requests_finished_total",
		"Engine requests finished, by reason.", []string{"reason"}, nil)
	descRejected = prometheus.NewDesc("glmctl_engine_requests_rejected_total",
		"Requests refused because the queue was full (HTTP 429).", nil, nil)
	descPreempt = prometheus.NewDesc("glmctl_engine_preemptions_total",
		"Sequences preempted to free KV blocks.", nil, nil)
	descSteps = prometheus.NewDesc("glmctl_engine_steps_total",
		"Engine steps run.", nil, nil)
	descPrefixQ = prometheus.NewDesc("glmctl_prefix_cache_queries_tokens_total",
		"Prompt tokens looked up in the prefix cache.", nil, nil)
	descPrefixH = prometheus.NewDesc("glmctl_prefix_cache_hits_tokens_total",
		"Prompt tokens found in the prefix cache.", nil, nil)
	descStepFail = prometheus.NewDesc("glmctl_engine_step_failures_total",
		"Engine steps that failed, failing their requests, by kind (error, panic, fatal).", []string{"kind"}, nil)
	descNonFinite = prometheus.NewDesc("glmctl_engine_nonfinite_logits_total",
		"Requests ended with an error because their logits held NaN or Inf.", nil, nil)
	descDraftsVerified = prometheus.NewDesc("glmctl_spec_decode_draft_tokens_total",
		"Draft tokens (speculative decoding, --speculative mtp) the model verified.", nil, nil)
	descDraftsAccepted = prometheus.NewDesc("glmctl_spec_decode_accepted_tokens_total",
		"Draft tokens the model accepted.", nil, nil)
	descTextOverlap = prometheus.NewDesc("glmctl_engine_text_overlapped_tokens_total",
		"Generated tokens whose text was decoded while the next engine step ran (--overlap-output).", nil, nil)
)

// engineCollector turns one engine.Stats snapshot per scrape into metrics.
type engineCollector struct {
	stats func() engine.Stats
}

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descQueue, descRunning, descKVTotal, descKVUsed, descKVCached, descKVUsage,
		descPrompt, descGenerated, descFinished, descRejected, descPreempt, descSteps, descPrefixQ, descPrefixH, descStepFail, descNonFinite,
		descDraftsVerified, descDraftsAccepted, descTextOverlap} {
		ch <- d
	}
}

func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(descQueue, float64(st.Waiting))
	gauge(descRunning, float64(st.Running))
	gauge(descKVTotal, float64(st.KVBlocksTotal))
	gauge(descKVUsed, float64(st.KVBlocksUsed))
	gauge(descKVCached, float64(st.KVBlocksCached))
	usage := 0.0
	if st.KVBlocksTotal > 0 {
		usage = float64(st.KVBlocksUsed) / float64(st.KVBlocksTotal)
	}
	gauge(descKVUsage, usage)
	counter(descPrompt, st.PromptTokens)
	counter(descGenerated, st.GeneratedTokens)
	counter(descFinished, st.FinishedStop, "stop")
	counter(descFinished, st.FinishedLength, "length")
	counter(descFinished, st.FinishedCancelled, "cancelled")
	counter(descFinished, st.FinishedError, "error")
	counter(descRejected, st.RequestsRejected)
	counter(descPreempt, st.Preemptions)
	counter(descSteps, st.Steps)
	counter(descPrefixQ, st.PrefixQueryTokens)
	counter(descPrefixH, st.PrefixHitTokens)
	counter(descStepFail, st.StepErrors, "error")
	counter(descStepFail, st.StepPanics, "panic")
	counter(descStepFail, st.FatalErrors, "fatal")
	counter(descNonFinite, st.NonFiniteLogits)
	counter(descDraftsVerified, st.DraftsVerified)
	counter(descDraftsAccepted, st.DraftsAccepted)
	counter(descTextOverlap, st.TextOverlapped)
}
