package loadgen

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func TestTPOT(t *testing.T) {
	for _, tc := range []struct {
		e2e, ttft float64
		out       int
		want      float64
		ok        bool
	}{
		{100, 20, 5, 20, true},
		{100, 20, 2, 80, true},
		{100, 20, 1, 0, false},
		{100, 20, 0, 0, false},
		{50, 50, 11, 0, true},
	} {
		got, ok := TPOT(tc.e2e, tc.ttft, tc.out)
		if ok != tc.ok || math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("TPOT(%v, %v, %d) = %v, %v; want %v, %v", tc.e2e, tc.ttft, tc.out, got, ok, tc.want, tc.ok)
		}
	}
}

func TestParseSLO(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want SLO
		err  string
	}{
		{"", SLO{}, ""},
		{"ttft=200ms,tpot=50ms", SLO{TTFTMs: 200, TPOTMs: 50}, ""},
		{"ttft=1.5s, e2e=10s", SLO{TTFTMs: 1500, E2EMs: 10000}, ""},
		{"TPOT=12.5", SLO{TPOTMs: 12.5}, ""},
		{"e2el=2s", SLO{E2EMs: 2000}, ""},
		{"ttft", SLO{}, "not metric=limit"},
		{"itl=5ms", SLO{}, "unknown metric"},
		{"ttft=fast", SLO{}, "not a duration"},
		{"ttft=0ms", SLO{}, "positive"},
		{"ttft=-5", SLO{}, "positive"},
	} {
		got, err := ParseSLO(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseSLO(%q): err %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseSLO(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	if s := (SLO{TTFTMs: 200, TPOTMs: 50}).String(); s != "ttft<=200ms,tpot<=50.0ms" {
		t.Errorf("String %q", s)
	}
}

func TestSLOMet(t *testing.T) {
	slo := SLO{TTFTMs: 100, TPOTMs: 10, E2EMs: 500}
	for _, tc := range []struct {
		name string
		r    Record
		want bool
	}{
		{"meets all", Record{OK: true, TTFTMs: 100, E2EMs: 190, OutputTokens: 10}, true},
		{"ttft over", Record{OK: true, TTFTMs: 101, E2EMs: 190, OutputTokens: 10}, false},
		{"tpot over", Record{OK: true, TTFTMs: 50, E2EMs: 150, OutputTokens: 10}, false}, // 100/9 > 10
		{"e2e over", Record{OK: true, TTFTMs: 50, E2EMs: 501, OutputTokens: 100}, false},
		{"one token: no tpot", Record{OK: true, TTFTMs: 50, E2EMs: 400, OutputTokens: 1}, true},
		{"failed", Record{OK: false, Failure: "http_500"}, false},
	} {
		if got := slo.Met(tc.r); got != tc.want {
			t.Errorf("%s: Met = %v", tc.name, got)
		}
	}
	if !(SLO{}).Met(Record{OK: true, TTFTMs: 1e9}) {
		t.Error("no bounds: every completed request meets them")
	}
}

func TestSummarise(t *testing.T) {
	recs := []Record{
		{OK: true, PromptTokens: 10, OutputTokens: 5, OutputFromUsage: true, TTFTMs: 10, E2EMs: 50, ITLMs: []float64{10, 10, 10, 10}, StartMs: 0},
		{OK: true, PromptTokens: 10, OutputTokens: 3, OutputFromUsage: true, TTFTMs: 30, E2EMs: 70, ITLMs: []float64{20, 20}, StartMs: 5},
		{OK: false, Failure: "http_500", Error: "HTTP 500: later", StartMs: 20, E2EMs: 5},
		{OK: false, Failure: "timeout", Error: "first", StartMs: 1, E2EMs: 3},
		{OK: false, Failure: "http_500", Error: "HTTP 500: third", StartMs: 30, E2EMs: 1},
		{Failure: failCancelled, StartMs: 40},
	}
	st := Summarise(recs, 2*time.Second, SLO{TTFTMs: 20})
	if st.Requests != 5 || st.Completed != 2 || st.Failed != 3 || st.Cancelled != 1 {
		t.Fatalf("counts %+v", st)
	}
	if st.Failures["http_500"] != 2 || st.Failures["timeout"] != 1 || st.FirstError != "first" {
		t.Errorf("failures %v, first %q", st.Failures, st.FirstError)
	}
	if st.PromptTokens != 20 || st.OutputTokens != 8 || st.OutputTokensPerSecond != 4 || st.TotalTokensPerSecond != 14 || st.RequestsPerSecond != 1 {
		t.Errorf("throughput %+v", st)
	}
	// TPOT: (50−10)/4 = 10 and (70−30)/2 = 20.
	if st.TPOTMs.Mean != 15 || st.TPOTMs.P50 != 15 || st.TTFTMs.Mean != 20 || st.E2EMs.P50 != 60 {
		t.Errorf("latencies ttft %+v tpot %+v e2e %+v", st.TTFTMs, st.TPOTMs, st.E2EMs)
	}
	// ITL over all six gaps: four of 10, two of 20.
	if math.Abs(st.ITLMs.Mean-80.0/6) > 1e-9 || st.ITLMs.P50 != 10 || st.ITLMs.P99 != 20 {
		t.Errorf("itl %+v", st.ITLMs)
	}
	g := st.Goodput
	if g == nil || g.Good != 1 || g.Fraction != 0.2 || g.RequestsPerSecond != 0.5 {
		t.Errorf("goodput %+v", g)
	}
	if st.OutputCounted {
		t.Error("usage was present for every request")
	}
	if got := failureText(st.Failures); got != "http_500 2, timeout 1" {
		t.Errorf("failureText %q", got)
	}
	if st := Summarise(recs, time.Second, SLO{}); st.Goodput != nil {
		t.Error("goodput without an SLO")
	}
	if st := Summarise(nil, 0, SLO{TTFTMs: 1}); st.Requests != 0 || st.Goodput.Fraction != 0 || st.TTFTMs.P50 != 0 {
		t.Errorf("empty run %+v", st)
	}
}

func TestBaseURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:8000":       "http://127.0.0.1:8000",
		"http://127.0.0.1:8000/":      "http://127.0.0.1:8000",
		"http://127.0.0.1:8000/v1":    "http://127.0.0.1:8000",
		"https://gw.example/vllm/v1/": "https://gw.example/vllm",
		"http://h:1/v1?x=1":           "http://h:1",
		"ftp://h":                     "",
		"127.0.0.1:8000":              "",
		"http://":                     "",
	} {
		got, err := baseURL(in)
		if (err != nil) != (want == "") || got != want {
			t.Errorf("baseURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestLengthIn(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	if lengthIn(rng, 100, 0) != 100 {
		t.Error("ratio 0 must give the length")
	}
	seen := map[int]bool{}
	for range 2000 {
		v := lengthIn(rng, 10, 0.5)
		if v < 5 || v > 15 {
			t.Fatalf("lengthIn(10, 0.5) = %d", v)
		}
		seen[v] = true
	}
	if len(seen) != 11 {
		t.Errorf("drew %d distinct lengths of 11", len(seen))
	}
	if v := lengthIn(rng, 1, 0.9); v < 1 {
		t.Errorf("lengthIn(1, 0.9) = %d", v)
	}
}

func TestParseDataset(t *testing.T) {
	jsonl := `{"prompt": "one"}

{"prompt": "two", "output_len": 7}
{"prompt": "three", "max_tokens": 9}
`
	got, err := ParseDataset("a.jsonl", []byte(jsonl))
	if err != nil || len(got) != 3 || got[0] != (DatasetEntry{Prompt: "one"}) || got[1].OutputLen != 7 || got[2].OutputLen != 9 {
		t.Fatalf("jsonl: %+v %v", got, err)
	}
	sharegpt := `[{"id": "a", "conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "Q1"}, {"from": "gpt", "value": "A1"}]},
	 {"conversations": [{"from": "gpt", "value": "no question"}]},
	 {"conversations": [{"role": "user", "content": "Q2"}]}]`
	got, err = ParseDataset("sg.json", []byte(sharegpt))
	if err != nil || len(got) != 2 || got[0] != (DatasetEntry{Prompt: "Q1", Reply: "A1"}) || got[1] != (DatasetEntry{Prompt: "Q2"}) {
		t.Fatalf("sharegpt: %+v %v", got, err)
	}
	sgl := `{"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]}`
	if got, err := ParseDataset("sg.jsonl", []byte(sgl)); err != nil || len(got) != 1 || got[0].Reply != "A" {
		t.Fatalf("sharegpt jsonl: %+v %v", got, err)
	}
	for _, tc := range []struct{ data, want string }{
		{"{\"prompt\": \"a\"}\nnot json\n", "line 2"},
		{`{"text": "a"}`, "neither \"prompt\" nor \"conversations\""},
		{`{"prompt": "a", "output_len": 0}`, "must be >= 1"},
		{`[{"conversations": []}]`, "no usable prompt"},
		{``, "no usable prompt"},
		{`[1, 2]`, "entry 0"},
	} {
		if _, err := ParseDataset("f", []byte(tc.data)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err %v, want %q", tc.data, err, tc.want)
		}
	}
}
