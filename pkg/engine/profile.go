package engine

// StepProfile is where a backend's GPU time went over some steps, by kernel
// family (attention, norms, each linear role, ...). Backends that can profile
// (the CUDA backend) return it; the numbers are totals over Steps steps.
type StepProfile struct {
	Steps int `json:"steps"`
	// StepUs is the GPU time from the first to the last work of the steps,
	// summed over steps, in microseconds.
	StepUs float64 `json:"step_us"`
	// Graphs is true when the steps ran as replayed CUDA graphs (no host
	// launch gaps inside the timing); false for eagerly launched steps.
	Graphs   bool            `json:"graphs"`
	Families []FamilyProfile `json:"families"`
}

// FamilyProfile is one kernel family's share of a StepProfile.
type FamilyProfile struct {
	Name     string  `json:"name"`
	Us       float64 `json:"us"`       // GPU time, summed over steps
	Bytes    int64   `json:"bytes"`    // device-memory bytes the family must move, summed over steps
	Launches int64   `json:"launches"` // kernel launches (or groups of launches), summed over steps
}
