package bench

import (
	"io"
	"strings"
)

// Report primitives shared with other benchmarks (pkg/loadgen, the client
// side load generator of `glmctl bench --url`), so that both print figures,
// percentiles and tables the same way.

// Summarise returns the mean and the p50/p90/p99 of v (any order); empty
// input gives zeros.
func Summarise(v []float64) Percentiles { return summarise(v) }

// FormatNum prints a figure with about three significant digits.
func FormatNum(v float64) string { return num(v) }

// FormatTriple prints p50/p90/p99.
func FormatTriple(p Percentiles) string { return triple(p) }

// WriteTextHeader prints "key value" header lines and a blank line.
func WriteTextHeader(w io.Writer, lines [][2]string) error { return writeTextHeader(w, lines) }

// WriteMarkdown prints header lines as a markdown list (the "command" line
// as code) and a markdown table.
func WriteMarkdown(w io.Writer, lines [][2]string, cols []string, rows [][]string) error {
	var b strings.Builder
	writeMDHeader(&b, lines)
	writeMDTable(&b, cols, rows)
	_, err := io.WriteString(w, b.String())
	return err
}
