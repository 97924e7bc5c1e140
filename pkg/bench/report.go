package bench

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Header says what was measured, where and how.
type Header struct {
	Model        string   `json:"model"`      // model directory
	ModelSummary string   `json:"model_info"` // architecture at a glance
	Backend      string   `json:"backend"`    // "cpu" or "cuda"
	Device       string   `json:"device"`     // engine.BackendInfo.Device
	Date         string   `json:"date"`       // RFC 3339
	CommandLine  string   `json:"command"`    // as typed
	EngineConfig string   `json:"engine"`     // budgets, prefix caching
	Sampling     string   `json:"sampling"`   // greedy or temperature
	GoVersion    string   `json:"go_version"` // runtime.Version()
	Floor        *Basis   `json:"floor"`      // the run model's floor basis
	Projection   *Basis   `json:"projection"` // nil without --project-model
	Workload     Workload `json:"workload"`
	// GPUTelemetryError says why the runs carry no GPU telemetry (the cpu
	// backend, no NVIDIA driver); empty when they do.
	GPUTelemetryError string `json:"gpu_telemetry_error,omitempty"`
}

// Basis is what a floor column rests on.
type Basis struct {
	Label     string     `json:"label"` // e.g. "TP1/EP1" or "glm-4.7-fp8 at TP8/EP8"
	ModelDir  string     `json:"model_dir"`
	Model     FloorModel `json:"model"`
	Bandwidth Bandwidth  `json:"bandwidth"`
}

// Report is everything bench prints.
type Report struct {
	Header Header      `json:"header"`
	Runs   []RunResult `json:"runs"`
}

// Columns are the table's headers, in TableRows order.
func (r *Report) Columns() []string {
	cols := []string{"conc", "reqs", "out tok/s", "total tok/s", "req/s",
		"TTFT ms p50/p90/p99", "TPOT ms p50/p90/p99", "step ms", "batch", "floor TPOT ms", "of floor"}
	if r.Header.Projection != nil {
		cols = append(cols, "proj. floor TPOT ms", "proj. floor tok/s")
	}
	if r.hasDrafts() {
		cols = append(cols, "drafts accepted")
	}
	if r.comparesSpeculation() {
		cols = append(cols, "speculation")
	}
	if r.hasGPU() {
		cols = append(cols, gpuColumns()...)
	}
	return cols
}

// comparesSpeculation reports whether the runs come in pairs with drafting
// off and on (Workload.CompareSpeculation); the table then says which is which
// and the speed-up.
func (r *Report) comparesSpeculation() bool {
	for _, run := range r.Runs {
		if run.Speculation != "" {
			return true
		}
	}
	return false
}

// speculationCell is "off", or "on, 1.31× off" (the output tok/s speed-up).
func speculationCell(run RunResult) string {
	switch {
	case run.Speculation == "on" && run.SpeedupVsPlain > 0:
		return fmt.Sprintf("on, %.2f× off", run.SpeedupVsPlain)
	case run.Speculation != "":
		return run.Speculation
	}
	return "-"
}

// hasDrafts reports whether any run verified draft tokens (speculative
// decoding); the table then shows the acceptance.
func (r *Report) hasDrafts() bool {
	for _, run := range r.Runs {
		if run.Steps.DraftsVerified > 0 {
			return true
		}
	}
	return false
}

// hasGPU reports whether any run carries GPU samples (the table then has
// the GPU columns).
func (r *Report) hasGPU() bool {
	for _, run := range r.Runs {
		if run.GPU != nil && run.GPU.Samples > 0 {
			return true
		}
	}
	return false
}

// TableRows formats one row per run, matching Columns.
func (r *Report) TableRows() [][]string {
	rows := make([][]string, 0, len(r.Runs))
	for _, run := range r.Runs {
		row := []string{
			fmt.Sprint(run.Concurrency),
			fmt.Sprint(run.Requests),
			num(run.OutputTokensPerSecond),
			num(run.TotalTokensPerSecond),
			num(run.RequestsPerSecond),
			triple(run.TTFTMs),
			triple(run.TPOTMs),
			num(run.Steps.MeanStepMs),
			fmt.Sprintf("%.2f", run.Steps.MeanDecodeBatch),
			"-", "-",
		}
		if f := run.Floor; f != nil {
			row[9] = num(f.StepMs)
			row[10] = fmt.Sprintf("%.1f%%", 100*f.OfFloor)
		}
		if r.Header.Projection != nil {
			if p := run.Projection; p != nil {
				row = append(row, num(p.StepMs), num(p.TokensPerSecond))
			} else {
				row = append(row, "-", "-")
			}
		}
		if r.hasDrafts() {
			row = append(row, fmt.Sprintf("%.1f%% of %d", 100*run.Steps.DraftAcceptance, run.Steps.DraftsVerified))
		}
		if r.comparesSpeculation() {
			row = append(row, speculationCell(run))
		}
		if r.hasGPU() {
			row = append(row, gpuCells(run.GPU)...)
		}
		rows = append(rows, row)
	}
	return rows
}

// HeaderLines are the header as "key: value" pairs, in print order.
func (r *Report) HeaderLines() [][2]string {
	h := r.Header
	w := h.Workload
	lines := [][2]string{
		{"date", h.Date},
		{"command", h.CommandLine},
		{"model", fmt.Sprintf("%s (%s)", h.Model, h.ModelSummary)},
		{"backend", fmt.Sprintf("%s: %s", h.Backend, h.Device)},
		{"engine", h.EngineConfig},
		{"workload", fmt.Sprintf("input %d, output %d tokens per request (EOS ignored), random prompt ids (seed %d), %s, warm-up %s",
			w.InputLen, w.OutputLen, w.Seed, h.Sampling, warmupText(w.Warmup))},
	}
	if w.CompareSpeculation {
		lines = append(lines, [2]string{"speculation", "each concurrency twice with the same prompts: every request's drafting off, then on as the engine is set; speed-up = output tok/s on ÷ off"})
	}
	if b := h.Floor; b != nil {
		lines = append(lines, [2]string{"floor", basisText(b)})
	}
	if b := h.Projection; b != nil {
		lines = append(lines, [2]string{"projection", "PROJECTION, not a measurement: " + basisText(b) + ", at each run's measured batch and context"})
	}
	return lines
}

func warmupText(n int) string {
	if n < 0 {
		return "one request per in-flight slot before each run"
	}
	return fmt.Sprintf("%d request(s) before each run", n)
}

func basisText(b *Basis) string {
	m := b.Model
	assumed := "dtypes from shard headers"
	if m.DTypesAssumed {
		assumed = "dtypes assumed from quantization_config"
	}
	return fmt.Sprintf("%s (%s): bytes one decode step reads on one GPU / %s/s [%s]; fixed %s + %s per distinct routed expert per MoE layer (%d layers, uniform top-%d of %d) + KV %s per context token (%d-byte elements); %s",
		b.Label, b.ModelDir, bytesText(b.Bandwidth.BytesPerSecond), b.Bandwidth.Source,
		bytesText(float64(m.FixedBytesPerGPU)), bytesText(m.ExpertBytes/float64(m.Options.TP)), m.MoELayers, m.TopK, m.Experts,
		bytesText(float64(m.KVBytesPerTokenGPU)), m.Options.KVElemBytes, assumed)
}

// WriteText prints the header lines; the caller renders the table.
func (r *Report) WriteText(w io.Writer) error { return writeTextHeader(w, r.HeaderLines()) }

// writeTextHeader prints "key value" header lines and a blank line.
func writeTextHeader(w io.Writer, lines [][2]string) error {
	for _, l := range lines {
		if _, err := fmt.Fprintf(w, "%-10s %s\n", l[0], l[1]); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintln(w)
	return err
}

// WriteMarkdown prints the header as a list and the runs as a markdown
// table, ready to paste into docs/perf.md.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	writeMDHeader(&b, r.HeaderLines())
	writeMDTable(&b, r.Columns(), r.TableRows())
	for _, l := range r.ArrivalLines() {
		b.WriteString("\n" + l + "\n")
	}
	for _, l := range r.GPULines() {
		b.WriteString("\n" + mdEscape(l) + "\n")
	}
	var bandwidth float64
	if r.Header.Floor != nil {
		bandwidth = r.Header.Floor.Bandwidth.BytesPerSecond
	}
	for _, run := range r.Runs {
		if run.Profile == nil {
			continue
		}
		fmt.Fprintf(&b, "\nProfile, concurrency %d (prefill and decode steps): GPU %s µs per step\n\n", run.Concurrency, num(run.Profile.StepUs))
		writeMDTable(&b, ProfileColumns(bandwidth), run.Profile.ProfileRows(bandwidth))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeMDHeader prints header lines as a markdown list, the command line as code.
func writeMDHeader(b *strings.Builder, lines [][2]string) {
	for _, l := range lines {
		v := l[1]
		if l[0] == "command" {
			v = "`" + strings.ReplaceAll(v, "`", "'") + "`"
		}
		fmt.Fprintf(b, "- %s: %s\n", l[0], mdEscape(v))
	}
	b.WriteString("\n")
}

func writeMDRow(b *strings.Builder, cells []string) {
	b.WriteString("|")
	for _, c := range cells {
		b.WriteString(" " + mdEscape(c) + " |")
	}
	b.WriteString("\n")
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

func triple(p Percentiles) string { return num(p.P50) + "/" + num(p.P90) + "/" + num(p.P99) }

// num prints a figure with about three significant digits, without
// exponents for everyday magnitudes.
func num(v float64) string {
	a := math.Abs(v)
	switch {
	case a == 0:
		return "0"
	case a >= 1e15:
		return fmt.Sprintf("%.3g", v)
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	case a < 1e-9:
		return fmt.Sprintf("%.3g", v)
	}
	// Three significant digits, trailing zeros kept: 0.670, 0.00172. The
	// digit count is taken after rounding (0.0099999 → 0.0100).
	r, err := strconv.ParseFloat(fmt.Sprintf("%.3g", a), 64)
	if err != nil || r == 0 {
		return fmt.Sprintf("%.3g", v)
	}
	return fmt.Sprintf("%.*f", 2-int(math.Floor(math.Log10(r))), v)
}

// bytesText formats a byte count in decimal units.
func bytesText(n float64) string {
	switch {
	case n >= 1e12:
		return fmt.Sprintf("%.3g TB", n/1e12)
	case n >= 1e9:
		return fmt.Sprintf("%.3g GB", n/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.3g MB", n/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.3g kB", n/1e3)
	}
	return fmt.Sprintf("%.0f B", n)
}

// ArrivalLines describes each run's mid-run arrival (Workload.ArrivalLen):
// its TTFT and prefill rate, and the running streams' inter-token latency
// while it was prefilled next to before it.
func (r *Report) ArrivalLines() []string {
	var out []string
	for _, run := range r.Runs {
		a := run.Arrival
		if a == nil {
			continue
		}
		l := fmt.Sprintf("Arrival at concurrency %d: a %d-token prompt, TTFT %s ms (%s prompt tok/s); the running streams' ITL during its prefill p50/p99/max %s/%s/%s ms over %d gaps",
			run.Concurrency, a.PromptTokens, num(a.TTFTMs), num(a.PrefillTokPerS), num(a.ITLDuringMs.P50), num(a.ITLDuringMs.P99), num(a.ITLDuringMax), a.GapsDuring)
		if a.GapsBefore > 0 {
			l += fmt.Sprintf(", before it p50/p99 %s/%s ms", num(a.ITLBeforeMs.P50), num(a.ITLBeforeMs.P99))
		}
		out = append(out, l+".")
	}
	return out
}
