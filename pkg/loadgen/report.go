package loadgen

import (
	"fmt"
	"io"
	"strings"

	"github.com/glmctl/glmctl/pkg/bench"
)

// Header says what was measured and how.
type Header struct {
	Date           string  `json:"date"`
	CommandLine    string  `json:"command"`
	URL            string  `json:"url"`
	Endpoint       string  `json:"endpoint"`
	Model          string  `json:"model"`
	ServerVersion  string  `json:"server_version,omitempty"` // GET /version, when the server has it
	Prompts        string  `json:"prompts"`
	Tokenizer      string  `json:"tokenizer"`
	Streaming      string  `json:"streaming"`
	RequestTimeout string  `json:"request_timeout"`
	Seed           int64   `json:"seed"`
	Temperature    float64 `json:"temperature"`
	SLO            *SLO    `json:"slo,omitempty"`
	GoVersion      string  `json:"go_version"`
}

// RunResult is one run: a concurrency (closed loop) or a request rate
// (Poisson arrivals).
type RunResult struct {
	Concurrency  int     `json:"concurrency,omitempty"`
	RequestRate  float64 `json:"request_rate,omitempty"`
	Sent         int     `json:"requests_planned"`
	Warmup       int     `json:"warmup_requests"`
	PeakInFlight int     `json:"peak_in_flight"`
	// MeanInputTokens is the prompts' mean length by the server's
	// /tokenize (0 when it cannot count); MeanMaxTokens their mean max_tokens.
	MeanInputTokens float64 `json:"mean_input_tokens"`
	MeanMaxTokens   float64 `json:"mean_max_tokens"`
	Stats
	Records []Record `json:"records,omitempty"`
}

// Report is everything bench --url prints.
type Report struct {
	Header      Header      `json:"header"`
	Runs        []RunResult `json:"runs"`
	Interrupted bool        `json:"interrupted,omitempty"`
}

func promptsText(cfg Config, tok *tokenizer) string {
	out := fmt.Sprintf("output %d tokens", cfg.OutputLen)
	if cfg.RangeRatio > 0 {
		out += fmt.Sprintf(" ±%g%%", 100*cfg.RangeRatio)
	}
	if len(cfg.Dataset) > 0 {
		s := fmt.Sprintf("%d prompts from %s (shuffled with seed %d), ", len(cfg.Dataset), cfg.DatasetName, cfg.Seed)
		if cfg.OutputLenOverride {
			return s + out + " each (--output-len)"
		}
		return s + "max_tokens from the entry, else the ShareGPT reply's length, else " + out
	}
	kind := "random words cut to exactly that many tokens by the server's /tokenize and /detokenize"
	switch {
	case tok.field == "":
		kind = "random words, one per token asked (the server has no /tokenize to count them)"
	case !tok.detokenize:
		kind = "random words trimmed to at most that many tokens by the server's /tokenize"
	}
	in := fmt.Sprintf("input %d tokens", cfg.InputLen)
	if cfg.RangeRatio > 0 {
		in += fmt.Sprintf(" ±%g%%", 100*cfg.RangeRatio)
	}
	return fmt.Sprintf("%s, %s (%s)", in, out, kind)
}

func tokText(tok *tokenizer) string {
	switch {
	case tok.field == "":
		return "none: the server has no /tokenize; prompt tokens from usage only"
	case tok.field == "content":
		return "the server's /tokenize (llama-server's shape)"
	}
	return "the server's /tokenize (vLLM's shape)"
}

// HeaderLines are the header as key/value pairs, in print order.
func (r *Report) HeaderLines() [][2]string {
	h := r.Header
	server := h.URL
	if h.ServerVersion != "" {
		server += ", version " + h.ServerVersion
	}
	lines := [][2]string{
		{"date", h.Date},
		{"command", h.CommandLine},
		{"server", server},
		{"requests", fmt.Sprintf("POST %s, model %q, %s, temperature %g, timeout %s", h.Endpoint, h.Model, h.Streaming, h.Temperature, timeoutText(h.RequestTimeout))},
		{"prompts", h.Prompts},
		{"tokenizer", h.Tokenizer},
	}
	if h.SLO != nil {
		lines = append(lines, [2]string{"SLO", h.SLO.String() + " (goodput: requests meeting all of them)"})
	}
	if r.Interrupted {
		lines = append(lines, [2]string{"note", "INTERRUPTED: the last run covers only the requests that finished"})
	}
	return lines
}

func timeoutText(s string) string {
	if s == "0s" {
		return "none"
	}
	return s
}

// Columns are the table's headers, in TableRows order.
func (r *Report) Columns() []string {
	first := "conc"
	if len(r.Runs) > 0 && r.Runs[0].RequestRate > 0 {
		first = "rate req/s"
	}
	cols := []string{first, "ok/sent", "failed", "req/s", "out tok/s", "total tok/s",
		"TTFT ms p50/p90/p99", "TPOT ms p50/p90/p99", "ITL ms p50/p90/p99", "E2E ms p50/p90/p99"}
	if r.Header.SLO != nil {
		cols = append(cols, "goodput req/s", "SLO met")
	}
	return cols
}

// TableRows formats one row per run, matching Columns.
func (r *Report) TableRows() [][]string {
	rows := make([][]string, 0, len(r.Runs))
	for _, run := range r.Runs {
		first := fmt.Sprint(run.Concurrency)
		if run.RequestRate > 0 {
			first = trimFloat(run.RequestRate)
		}
		row := []string{first, fmt.Sprintf("%d/%d", run.Completed, run.Sent), fmt.Sprint(run.Failed),
			bench.FormatNum(run.RequestsPerSecond), bench.FormatNum(run.OutputTokensPerSecond), bench.FormatNum(run.TotalTokensPerSecond),
			bench.FormatTriple(run.TTFTMs), bench.FormatTriple(run.TPOTMs), bench.FormatTriple(run.ITLMs), bench.FormatTriple(run.E2EMs)}
		if r.Header.SLO != nil {
			if g := run.Goodput; g != nil {
				row = append(row, bench.FormatNum(g.RequestsPerSecond), fmt.Sprintf("%.1f%%", 100*g.Fraction))
			} else {
				row = append(row, "-", "-")
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// Notes are the lines under the table: failures by kind with the first
// message, and runs whose output tokens were counted from chunks.
func (r *Report) Notes() []string {
	var notes []string
	for _, run := range r.Runs {
		label := fmt.Sprintf("concurrency %d", run.Concurrency)
		if run.RequestRate > 0 {
			label = fmt.Sprintf("rate %s req/s", trimFloat(run.RequestRate))
		}
		if run.Failed > 0 {
			notes = append(notes, fmt.Sprintf("%s: %d failed (%s); first: %s", label, run.Failed, failureText(run.Failures), run.FirstError))
		}
		if run.Cancelled > 0 {
			notes = append(notes, fmt.Sprintf("%s: %d requests cut off by the interrupt, left out", label, run.Cancelled))
		}
		if run.OutputCounted {
			notes = append(notes, fmt.Sprintf("%s: the server sent no usage for some requests: their output tokens are counted SSE chunks", label))
		}
	}
	return notes
}

// WriteText prints the header lines; the caller renders the table and the
// notes.
func (r *Report) WriteText(w io.Writer) error { return bench.WriteTextHeader(w, r.HeaderLines()) }

// WriteNotes prints Notes, one per line, after a blank line.
func (r *Report) WriteNotes(w io.Writer) error {
	notes := r.Notes()
	if len(notes) == 0 {
		return nil
	}
	_, err := fmt.Fprintf(w, "\n%s\n", strings.Join(notes, "\n"))
	return err
}

// WriteMarkdown prints the header as a list, the table and the notes.
func (r *Report) WriteMarkdown(w io.Writer) error {
	if err := bench.WriteMarkdown(w, r.HeaderLines(), r.Columns(), r.TableRows()); err != nil {
		return err
	}
	return r.WriteNotes(w)
}
