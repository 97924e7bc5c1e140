package bench

import (
	"fmt"
	"io"
	"strings"

	"github.com/glmctl/glmctl/pkg/engine"
)

// ProfileReport is a StepProfile per step: where one step's GPU time goes by
// kernel family, the bytes each family must move and the bandwidth that
// implies, next to the step's floor.
type ProfileReport struct {
	Steps  int     `json:"steps"`
	Graphs bool    `json:"graphs"`
	StepUs float64 `json:"step_us"` // GPU time per step
	// FloorUs is the step's bandwidth floor (0 when unknown); OfFloor is
	// FloorUs / StepUs.
	FloorUs  float64        `json:"floor_us,omitempty"`
	OfFloor  float64        `json:"of_floor,omitempty"`
	Families []FamilyReport `json:"families"`
}

// FamilyReport is one family's share of a step.
type FamilyReport struct {
	Name          string  `json:"name"`
	Us            float64 `json:"us"`    // GPU time per step
	Share         float64 `json:"share"` // of the step's GPU time
	Bytes         float64 `json:"bytes"` // per step
	BytesPerSecUs float64 `json:"bytes_per_s"`
	Launches      float64 `json:"launches"` // per step
}

// NewProfileReport turns totals into per-step figures; floor may be nil.
func NewProfileReport(p engine.StepProfile, floor *Floor) *ProfileReport {
	r := &ProfileReport{Steps: p.Steps, Graphs: p.Graphs}
	if p.Steps <= 0 {
		return r
	}
	n := float64(p.Steps)
	r.StepUs = p.StepUs / n
	if floor != nil && r.StepUs > 0 {
		r.FloorUs = floor.StepMs * 1e3
		r.OfFloor = r.FloorUs / r.StepUs
	}
	for _, f := range p.Families {
		if f.Launches == 0 && f.Us == 0 {
			continue
		}
		fr := FamilyReport{Name: f.Name, Us: f.Us / n, Bytes: float64(f.Bytes) / n, Launches: float64(f.Launches) / n}
		if r.StepUs > 0 {
			fr.Share = fr.Us / r.StepUs
		}
		if fr.Us > 0 {
			fr.BytesPerSecUs = fr.Bytes / (fr.Us * 1e-6)
		}
		r.Families = append(r.Families, fr)
	}
	return r
}

// ProfileColumns are the headers of ProfileRows(bandwidth): the last column
// names the bandwidth its percentages are of (bytes per second; the device's
// floor bandwidth, which is not 4.46 TB/s on every GPU).
func ProfileColumns(bandwidth float64) []string {
	last := "of floor bandwidth"
	if bandwidth > 0 {
		last = fmt.Sprintf("of %.2f TB/s", bandwidth/1e12)
	}
	return []string{"family", "µs/step", "share", "launches", "bytes/step", "GB/s", last}
}

// ProfileRows formats the families, then a total row.
func (r *ProfileReport) ProfileRows(bandwidth float64) [][]string {
	var rows [][]string
	var bytes float64
	for _, f := range r.Families {
		bytes += f.Bytes
		rows = append(rows, []string{f.Name, num(f.Us), fmt.Sprintf("%.1f%%", 100*f.Share), num(f.Launches),
			bytesText(f.Bytes), num(f.BytesPerSecUs / 1e9), pct(f.BytesPerSecUs, bandwidth)})
	}
	total := []string{"step", num(r.StepUs), "100%", "", bytesText(bytes), "", ""}
	if r.StepUs > 0 {
		bps := bytes / (r.StepUs * 1e-6)
		total[5], total[6] = num(bps/1e9), pct(bps, bandwidth)
	}
	return append(rows, total)
}

func pct(v, of float64) string {
	if of <= 0 || v <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*v/of)
}

// WriteProfileText prints a title line for the profile; the caller renders
// the table of ProfileRows.
func (r *ProfileReport) WriteProfileText(w io.Writer, title string) error {
	mode := "eager launches (host gaps included)"
	if r.Graphs {
		mode = "replayed CUDA graphs"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nprofile %s: %d steps, %s, GPU time %s µs per step", title, r.Steps, mode, num(r.StepUs))
	if r.FloorUs > 0 {
		fmt.Fprintf(&b, ", floor %s µs (%.1f%% of floor)", num(r.FloorUs), 100*r.OfFloor)
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}
