package server

import (
	"bytes"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape fetches /metrics and parses it with Prometheus' own text parser.
func scrape(t testing.TB, ts *testServer) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := ts.get(t, "/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return fams
}

// metricValue returns the value of the family's sample whose labels include
// labels (name, value pairs), and whether it exists.
func metricValue(fams map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		case m.Untyped != nil:
			return m.Untyped.GetValue(), true
		}
	}
	return 0, false
}

func TestMetrics(t *testing.T) {
	ts := startServer(t, nil)
	ts.post(t, "/v1/completions", `{"prompt":"abcd","max_tokens":5}`)
	ts.post(t, "/v1/completions", `{"prompt":"abcd","max_tokens":5,"stream":true}`)
	ts.post(t, "/v1/chat/completions", `{"messages":"bad"}`)
	fams := scrape(t, ts)

	want := []struct {
		name   string
		labels []string
		check  func(float64) bool
		what   string
	}{
		{"glmctl_http_requests_total", []string{"path", "/v1/completions", "code", "200"}, eq(2), "2"},
		{"glmctl_http_requests_total", []string{"path", "/v1/chat/completions", "code", "400"}, eq(1), "1"},
		{"glmctl_prompt_tokens_total", nil, eq(8), "8"},
		{"glmctl_generation_tokens_total", nil, eq(10), "10"},
		// Every token but each request's last (it ends the request) has its
		// text decoded while the next step runs.
		{"glmctl_engine_text_overlapped_tokens_total", nil, eq(8), "8"},
		{"glmctl_time_to_first_token_seconds", nil, eq(2), "2 observations"},
		{"glmctl_inter_token_latency_seconds", nil, eq(8), "8 observations"},
		{"glmctl_e2e_request_latency_seconds", nil, eq(2), "2 observations"},
		{"glmctl_step_duration_seconds", nil, gt(0), "> 0 observations"},
		{"glmctl_engine_steps_total", nil, gt(0), "> 0"},
		{"glmctl_engine_requests_finished_total", []string{"reason", "length"}, eq(2), "2"},
		{"glmctl_queue_depth", nil, eq(0), "0"},
		{"glmctl_running_sequences", nil, eq(0), "0"},
		{"glmctl_kv_blocks_used", nil, eq(0), "0"},
		{"glmctl_kv_blocks_total", nil, eq(512), "512"},
		{"glmctl_kv_cache_usage_ratio", nil, eq(0), "0"},
		{"glmctl_http_requests_in_flight", nil, eq(1), "1 (the scrape itself)"},
		{"go_goroutines", nil, gt(0), "> 0"},
	}
	for _, w := range want {
		v, ok := metricValue(fams, w.name, w.labels...)
		if !ok {
			t.Errorf("metric %s%v missing", w.name, w.labels)
			continue
		}
		if !w.check(v) {
			t.Errorf("metric %s%v = %v, want %s", w.name, w.labels, v, w.what)
		}
	}
	for _, name := range []string{"glmctl_time_to_first_token_seconds", "glmctl_step_duration_seconds"} {
		if fams[name].GetType() != dto.MetricType_HISTOGRAM {
			t.Errorf("%s is %v, want a histogram", name, fams[name].GetType())
		}
	}
}

func eq(want float64) func(float64) bool { return func(v float64) bool { return v == want } }
func gt(lo float64) func(float64) bool   { return func(v float64) bool { return v > lo } }
