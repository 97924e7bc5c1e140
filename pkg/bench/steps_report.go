package bench

import (
	"fmt"
	"io"
	"strings"
)

// StepReport is everything a decode-step grid prints.
type StepReport struct {
	Header Header       `json:"header"`
	Grid   StepGrid     `json:"grid"`
	Cells  []StepResult `json:"cells"`
}

// Columns are the grid table's headers, in Rows order.
func (r *StepReport) Columns() []string {
	return []string{"batch", "context", "step ms p50", "mean", "p90", "tok/s", "floor ms", "of floor", "KV read", "experts/layer"}
}

// Rows formats one row per cell.
func (r *StepReport) Rows() [][]string {
	rows := make([][]string, 0, len(r.Cells))
	for _, c := range r.Cells {
		if c.Skipped != "" {
			rows = append(rows, []string{fmt.Sprint(c.Batch), fmt.Sprint(c.Context), "skipped: " + c.Skipped, "", "", "", "", "", "", ""})
			continue
		}
		row := []string{fmt.Sprint(c.Batch), fmt.Sprint(c.Context), num(c.StepMs.P50), num(c.StepMs.Mean), num(c.StepMs.P90),
			num(c.TokensPerSecond), "-", "-", "-", "-"}
		if f := c.Floor; f != nil {
			row[6] = num(f.StepMs)
			row[7] = fmt.Sprintf("%.1f%%", 100*c.OfFloor)
			row[8] = bytesText(f.Bytes.KV)
			row[9] = fmt.Sprintf("%.1f", f.Bytes.DistinctExperts)
		}
		rows = append(rows, row)
	}
	return rows
}

// HeaderLines are the header as "key: value" pairs.
func (r *StepReport) HeaderLines() [][2]string {
	h := r.Header
	lines := [][2]string{
		{"date", h.Date},
		{"command", h.CommandLine},
		{"model", fmt.Sprintf("%s (%s)", h.Model, h.ModelSummary)},
		{"backend", fmt.Sprintf("%s: %s", h.Backend, h.Device)},
		{"engine", h.EngineConfig},
		{"steps", fmt.Sprintf("decode steps straight on the backend: each cell %d warm-up + %d timed steps (wall time of one Step call), one new token per sequence at position context-1, greedy; KV blocks disjoint per sequence", r.Grid.Warmup, r.Grid.Steps)},
	}
	if b := h.Floor; b != nil {
		lines = append(lines, [2]string{"floor", basisText(b)})
	}
	return lines
}

// WriteText prints the header lines; the caller renders the table.
func (r *StepReport) WriteText(w io.Writer) error { return writeTextHeader(w, r.HeaderLines()) }

// WriteMarkdown prints the header as a list, the grid as a markdown table
// and each profiled cell's families, ready for docs/perf.md.
func (r *StepReport) WriteMarkdown(w io.Writer, bandwidth float64) error {
	var b strings.Builder
	writeMDHeader(&b, r.HeaderLines())
	writeMDTable(&b, r.Columns(), r.Rows())
	for _, c := range r.Cells {
		if c.Profile == nil {
			continue
		}
		mode := "eager"
		if c.Profile.Graphs {
			mode = "CUDA graphs"
		}
		fmt.Fprintf(&b, "\nProfile, batch %d, context %d (%s): GPU %s µs per step", c.Batch, c.Context, mode, num(c.Profile.StepUs))
		if c.Profile.FloorUs > 0 {
			fmt.Fprintf(&b, ", floor %s µs, %.1f%% of floor", num(c.Profile.FloorUs), 100*c.Profile.OfFloor)
		}
		b.WriteString("\n\n")
		writeMDTable(&b, ProfileColumns(bandwidth), c.Profile.ProfileRows(bandwidth))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writeMDTable(b *strings.Builder, cols []string, rows [][]string) {
	writeMDRow(b, cols)
	sep := make([]string, len(cols))
	for i := range sep {
		sep[i] = "---:"
	}
	writeMDRow(b, sep)
	for _, row := range rows {
		writeMDRow(b, row)
	}
}
