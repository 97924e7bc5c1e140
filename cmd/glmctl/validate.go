package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/glmctl/glmctl/pkg/golden"
)

func (a *app) newValidateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "validate --model DIR [--golden FILE ...]",
		Short: "Compare a backend's logits and greedy tokens with golden files",
		Long: `validate loads the model in --model on a backend and runs every case of each golden
file (reference outputs of Hugging Face transformers, docs/golden.md): one prefill step whose
last-position logits are compared with the reference (relative L2 error, max abs error, top-1
and top-5 agreement), then teacher-forced greedy decoding through the KV cache, one token per
step, checking the backend's greedy token at every step. A token mismatch counts only where the
reference's top-1 margin is above the margin threshold. Tolerances (docs/validation.md) are
stricter on the exact float32 path than with --fp8-activations.

An FP8 golden (DIR.fp8.golden.json, "numerics": "fp8-gpu") holds what the GPU's FP8 path
computes (scripts/make_fp8_golden.py); it checks the FP8 path (--fp8-activations, or the CUDA
backend without --cuda-exact) tightly: half of its cases must agree to 1e-5, the rest stay
within FP8 noise.

Without --golden it uses DIR.golden.json, and on the FP8 path DIR.fp8.golden.json too, when
they exist. It exits 2 naming the worst case when a golden file is not matched, and 1 on any
other error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.runValidate(cmd)
		},
	}
	f := cmd.Flags()
	f.String("model", "", "model directory (config.json, index, shards)")
	f.StringSlice("golden", nil, "golden file(s); repeat the flag or give a comma-separated list (default DIR.golden.json, plus DIR.fp8.golden.json on the FP8 path)")
	addBackendFlags(f)
	f.Float64("tolerance", 0, "max relative L2 error of the last logits (0 = the default for the path)")
	f.Float64("margin-threshold", -1, "reference margin above which a token mismatch fails (-1 = the default for the path)")
	f.Bool("json", false, "print the reports as JSON")
	f.Int("max-batched-tokens", 0, "prefill a golden prompt in chunks of at most this many tokens (0 = the backend's step limit; cuda: also its max_tokens_per_step)")
	return cmd
}

// validateFailed is a golden mismatch: exit code 2, as a failed verdict.
type validateFailed struct{ err error }

func (e validateFailed) Error() string { return e.err.Error() }
func (e validateFailed) Unwrap() error { return e.err }
func (validateFailed) ExitCode() int   { return 2 }

// validateOutput is the --json document.
type validateOutput struct {
	Model   string            `json:"model"`
	Backend string            `json:"backend"`
	Device  string            `json:"device"`
	FP8     bool              `json:"fp8_activations"`
	Reports []*golden.Report  `json:"reports"`
	Errors  []validateFileErr `json:"errors,omitempty"`
	Pass    bool              `json:"pass"`
}

type validateFileErr struct {
	Golden string `json:"golden"`
	Error  string `json:"error"`
}

func (a *app) runValidate(cmd *cobra.Command) error {
	v := a.v
	dir := v.GetString("model")
	if dir == "" {
		return errors.New("--model: a model directory is required")
	}
	dir = filepath.Clean(dir)
	tolOverride := v.GetFloat64("tolerance")
	if tolOverride != 0 && !(tolOverride > 0) {
		return fmt.Errorf("--tolerance: %v must be > 0", tolOverride)
	}
	marginOverride := v.GetFloat64("margin-threshold")
	if marginOverride != -1 && !(marginOverride >= 0) {
		return fmt.Errorf("--margin-threshold: %v must be >= 0", marginOverride)
	}
	if n := v.GetInt("max-batched-tokens"); n < 0 {
		return fmt.Errorf("--max-batched-tokens: %d must be >= 0 (0 = the backend's step limit)", n)
	}
	files := v.GetStringSlice("golden")
	defaults := len(files) == 0
	if defaults {
		def := dir + ".golden.json"
		if _, err := os.Stat(def); err != nil {
			return fmt.Errorf("--golden: no golden file given and the default %s is not there: %w", def, err)
		}
		files = []string{def}
	}
	// Load every golden file first so that a typo fails before the model loads.
	goldens := make([]*golden.File, 0, len(files))
	for _, path := range files {
		g, err := golden.Load(path)
		if err != nil {
			return err
		}
		goldens = append(goldens, g)
	}

	be, err := a.openBackend(cmd.Context(), dir)
	if err != nil {
		return err
	}
	defer be.Close()
	info := be.Info()
	// The GPU's real path quantizes activations to FP8 per token, so it is
	// held to the FP8 tolerances; --cuda-exact runs it at validation
	// precision, held to the exact ones.
	fp8 := v.GetBool("fp8-activations") || (info.Name == "cuda" && !v.GetBool("cuda-exact"))
	if def := dir + ".fp8.golden.json"; defaults && fp8 {
		if _, err := os.Stat(def); err == nil {
			g, err := golden.Load(def)
			if err != nil {
				return err
			}
			goldens = append(goldens, g)
		}
	}
	tols := make([]golden.Tolerances, len(goldens))
	for i, g := range goldens {
		tol, err := golden.TolerancesFor(g, fp8)
		if err != nil {
			return err
		}
		if tolOverride != 0 {
			tol.MaxRelL2 = tolOverride
		}
		if marginOverride != -1 {
			tol.MarginThreshold = marginOverride
		}
		tols[i] = tol
	}
	if a.log != nil {
		a.log.Info("validate", "model", dir, "backend", info.Name, "device", info.Device, "goldens", len(goldens))
	}

	out := validateOutput{Model: dir, Backend: info.Name, Device: info.Device, FP8: fp8, Pass: true}
	var fails, errs []error
	cases := 0
	for _, g := range goldens {
		cases += len(g.Cases)
	}
	bar := a.progress("validate cases", int64(cases), false)
	for i, g := range goldens {
		rep, err := golden.Compare(cmd.Context(), be, g, golden.Options{Tolerances: tols[i], ModelName: modelName(dir), ChunkTokens: v.GetInt("max-batched-tokens"),
			OnCase: func(int, int) { bar.Add(1) }})
		if err != nil {
			errs = append(errs, err)
			out.Errors = append(out.Errors, validateFileErr{Golden: g.Path, Error: err.Error()})
			out.Pass = false
			continue
		}
		out.Reports = append(out.Reports, rep)
		if err := rep.Err(); err != nil {
			fails = append(fails, err)
			out.Pass = false
		}
	}
	bar.Finish()

	if v.GetBool("json") {
		enc := json.NewEncoder(a.out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return fmt.Errorf("write JSON report: %w", err)
		}
	} else if err := printValidate(a.out, &out); err != nil {
		return err
	}
	switch {
	case len(errs) > 0:
		return errors.Join(append(errs, fails...)...)
	case len(fails) > 0:
		return validateFailed{errors.Join(fails...)}
	}
	return nil
}

// modelName is the base name of the model directory, which golden files
// record; "." and relative paths are resolved first.
func modelName(dir string) string {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	return filepath.Base(dir)
}

func printValidate(w io.Writer, o *validateOutput) error {
	mode := "exact float32"
	if o.FP8 {
		mode = "FP8 activations"
	}
	fmt.Fprintf(w, "Model %s, %s backend: %s; %s path\n", o.Model, o.Backend, o.Device, mode)
	for _, r := range o.Reports {
		fmt.Fprintf(w, "\nGolden %s\n  made for %s by %s\n  tolerances: relative L2 <= %.3g, token mismatches counted where the reference margin > %.3g\n",
			r.Golden, r.Model, r.Reference, r.Tolerances.MaxRelL2, r.Tolerances.MarginThreshold)
		if t := r.Tolerances; t.MinAgreeFraction > 0 {
			fmt.Fprintf(w, "  agreement: %d of %d cases within %.0e (want at least %.0f%%)\n",
				r.Agreeing, len(r.Cases), t.AgreeRelL2, 100*t.MinAgreeFraction)
		}
		fmt.Fprintln(w)
		rows := make([][]string, 0, len(r.Cases))
		for _, c := range r.Cases {
			top1 := "yes"
			if !c.Top1Match {
				top1 = fmt.Sprintf("no (%d vs %d)", c.GotTop1, c.RefTop1)
			}
			greedy := fmt.Sprintf("%d/%d", c.GreedySteps-len(c.Mismatches), c.GreedySteps)
			if c.GreedyTolerated > 0 {
				greedy += fmt.Sprintf(" (%d near-tie)", c.GreedyTolerated)
			}
			result := "pass"
			if !c.Pass {
				result = "FAIL: " + strings.Join(c.Failures, "; ")
			}
			rows = append(rows, []string{
				fmt.Sprint(c.Case), fmt.Sprint(c.PromptLen), fmt.Sprintf("%.2e", c.RelL2), fmt.Sprintf("%.2e", c.MaxAbs),
				top1, fmt.Sprintf("%d/5", c.Top5Overlap), greedy, result,
			})
		}
		if err := renderTable(w, []string{"CASE", "PROMPT", "REL L2", "MAX ABS", "TOP-1", "TOP-5", "GREEDY", "RESULT"}, rows); err != nil {
			return err
		}
		failed := r.NumFailed()
		worst := r.Cases[r.Worst]
		verdict := "PASS"
		if !r.Pass {
			verdict = "FAIL"
		}
		fmt.Fprintf(w, "%s: %d of %d cases passed; worst case %d (relative L2 %.2e)\n",
			verdict, len(r.Cases)-failed, len(r.Cases), worst.Case, worst.RelL2)
	}
	for _, e := range o.Errors {
		fmt.Fprintf(w, "\nGolden %s\nERROR: %s\n", e.Golden, e.Error)
	}
	return nil
}
