package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/glmctl/glmctl/pkg/inspect"
)

func (a *app) newInspectCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "inspect DIR",
		Short: "Summarise a checkpoint: architecture, tensors, parameter and memory accounting, verdict",
		Long: `inspect reads config.json, model.safetensors.index.json and every shard header of a
model directory, binds each tensor to the GLM-4.x MoE architecture, and prints a summary,
the tensor table, totals by dtype and by component, a per-GPU memory plan for --tp/--ep
and --kv-tokens, and a verdict. It exits non-zero when anything is missing or wrong.
It works on a directory holding only config.json and the index (shards reported missing).

When every shard is present it also reads the weight scales (finite and > 0), norms and
biases (finite); --verify scans every byte of every tensor instead (NaN/Inf values,
all-zero tensors), with a progress bar on stderr.

On a machine with NVIDIA GPUs (NVML) it also holds the plan against the free memory of
the first --tp GPUs (in CUDA order, under CUDA_VISIBLE_DEVICES): one line per GPU, and a
non-zero exit when one is short or fewer are present. Without a driver the check is
skipped, saying why; --gpu-check=false skips it (a plan for another machine).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.runInspect(cmd.Context(), args[0])
		},
	}
	f := cmd.Flags()
	f.String("filter", "", "only list tensors whose name matches this regular expression")
	f.Bool("json", false, "print the whole report as JSON")
	f.Int("tp", 8, "tensor-parallel GPUs for the memory plan")
	f.Int("ep", 8, "expert-parallel group size for the memory plan (divides --tp)")
	f.Int64("kv-tokens", 0, "tokens of KV cache to budget in the memory plan")
	f.String("kv-dtype", "bf16", "KV cache element type for the plan: bf16 or fp8")
	f.Int("max-rows", 200, "most tensor rows to print (0 = all)")
	f.Bool("verify", false, "scan every tensor's values (NaN/Inf, all-zero tensors), not only scales, norms and biases")
	f.Bool("gpu-check", true, "hold the memory plan against the free memory of the first --tp GPUs present (NVML; skipped without a driver)")
	return cmd
}

func (a *app) runInspect(ctx context.Context, dir string) error {
	v := a.v
	opts := inspect.Options{TP: v.GetInt("tp"), EP: v.GetInt("ep"), KVTokens: v.GetInt64("kv-tokens")}
	switch strings.ToLower(v.GetString("kv-dtype")) {
	case "bf16":
		opts.KVElemBytes = 2
	case "fp8":
		opts.KVElemBytes = 1
	default:
		return fmt.Errorf("--kv-dtype: %q is not one of bf16, fp8", v.GetString("kv-dtype"))
	}
	if pat := v.GetString("filter"); pat != "" {
		re, err := regexp.Compile(pat)
		if err != nil {
			return fmt.Errorf("--filter: %w", err)
		}
		opts.Filter = re
	}
	if v.GetBool("verify") {
		opts.Verify = true
		bar := a.verifyBar()
		opts.Progress = func(done, total int64) {
			if bar.GetMax64() != total {
				bar.ChangeMax64(total)
			}
			_ = bar.Set64(done)
		}
		defer func() { _ = bar.Finish() }()
	}
	rep, err := inspect.Run(dir, opts)
	if err != nil {
		return err
	}
	if v.GetBool("gpu-check") {
		rep.GPUCheck = a.checkGPUs(ctx, rep)
	}
	if v.GetBool("json") {
		enc := json.NewEncoder(a.out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return fmt.Errorf("write JSON report: %w", err)
		}
		return inspectErr(rep)
	}
	if err := printInspect(a.out, rep, v.GetInt("max-rows")); err != nil {
		return err
	}
	return inspectErr(rep)
}

// checkGPUs holds the report's memory plan against the GPUs present, in
// CUDA order.
func (a *app) checkGPUs(ctx context.Context, rep *inspect.Report) *inspect.GPUCheck {
	s := newGPUSampler()
	defer a.closeGPUs(s)
	ctx, cancel := context.WithTimeout(ctx, gpuProbeTimeout)
	defer cancel()
	return inspect.CheckGPUs(ctx, cudaGPUs(s, 0, 0), rep.Plan)
}

// inspectErr is the checkpoint's problems and the GPU check's shortfall.
func inspectErr(rep *inspect.Report) error {
	gpuErr := rep.GPUCheck.Err()
	if gpuErr != nil {
		gpuErr = fmt.Errorf("%w (--gpu-check=false to plan for another machine)", gpuErr)
	}
	return errors.Join(rep.Err(), gpuErr)
}

func printInspect(w io.Writer, r *inspect.Report, maxRows int) error {
	s := r.Summary
	fmt.Fprintf(w, "Model %s\n\n", r.Dir)
	scales := strings.Join(s.ScaleDTypes, "/")
	if scales == "" {
		scales = "dtype unknown"
	}
	sum := [][]string{
		{"architecture", fmt.Sprintf("%s (%s)", s.Architecture, s.ModelType)},
		{"layers", fmt.Sprintf("%d (%d dense, %d MoE) + %d MTP", s.Layers, s.DenseLayers, s.MoELayers, s.MTPLayers)},
		{"experts", fmt.Sprintf("%d routed, top-%d, %d shared, groups %d (top %d)", s.Experts, s.ExpertsPerTok, s.SharedExperts, s.NGroup, s.TopKGroup)},
		{"attention", fmt.Sprintf("%d q heads, %d kv heads, head_dim %d, rotary dim %d", s.Heads, s.KVHeads, s.HeadDim, s.RotaryDim)},
		{"hidden / vocab", fmt.Sprintf("%d / %d", s.Hidden, s.Vocab)},
		{"context", fmt.Sprintf("%d tokens", s.Context)},
		{"quantization", s.Quantization},
		{"linears", fmt.Sprintf("%d FP8 (scales %s), %d unquantized", s.QuantizedLins, scales, s.PlainLins)},
		{"shards", fmt.Sprintf("%d (%d missing)", s.Shards, s.ShardsMissing)},
		{"parameters", fmt.Sprintf("%s main (%d), %s MTP, %s active per token", humanCount(r.Accounting.MainParams), r.Accounting.MainParams, humanCount(r.Accounting.MTPParams), humanCount(r.ActiveParams))},
		{"size", fmt.Sprintf("%s main, %s MTP", humanBytes(r.Accounting.MainBytes), humanBytes(r.Accounting.MTPBytes))},
	}
	if !s.ShapesFromData {
		sum = append(sum, []string{"note", "some shards are absent: their dtypes are assumed from quantization_config"})
	}
	if err := renderTable(w, []string{"FIELD", "VALUE"}, sum); err != nil {
		return err
	}

	fmt.Fprintf(w, "\nTensors (%d listed)\n", len(r.Tensors))
	var rows [][]string
	for i, t := range r.Tensors {
		if maxRows > 0 && i >= maxRows {
			break
		}
		dt, shape := t.DType, fmt.Sprint(t.Shape)
		if dt == "" {
			dt, shape = "?", "?"
		}
		rows = append(rows, []string{t.Name, dt, shape, humanBytes(t.Bytes), t.Shard})
	}
	if err := renderTable(w, []string{"NAME", "DTYPE", "SHAPE", "SIZE", "SHARD"}, rows); err != nil {
		return err
	}
	if maxRows > 0 && len(r.Tensors) > maxRows {
		fmt.Fprintf(w, "... %d more (narrow with --filter, or --max-rows 0)\n", len(r.Tensors)-maxRows)
	}

	fmt.Fprintln(w, "\nTotals by dtype")
	rows = rows[:0]
	for _, d := range r.ByDType {
		rows = append(rows, []string{d.DType, fmt.Sprint(d.Tensors), humanBytes(d.Bytes)})
	}
	if err := renderTable(w, []string{"DTYPE", "TENSORS", "BYTES"}, rows); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nTotals by component")
	rows = rows[:0]
	for _, c := range r.Accounting.Components {
		if c.Params == 0 && c.Bytes == 0 {
			continue
		}
		rows = append(rows, []string{string(c.Component), humanCount(c.Params), fmt.Sprint(c.Params), humanBytes(c.Bytes)})
	}
	if err := renderTable(w, []string{"COMPONENT", "PARAMS", "EXACT", "BYTES"}, rows); err != nil {
		return err
	}

	if r.Plan != nil {
		p := r.Plan
		fmt.Fprintf(w, "\nMemory per GPU at TP%d / EP%d (busiest GPU; MTP layer not placed)\n", p.Opts.TP, p.Opts.EP)
		rows = rows[:0]
		for _, row := range p.Rows {
			rows = append(rows, []string{row.Item, humanBytes(row.Bytes)})
		}
		rows = append(rows, []string{"weights total", humanBytes(p.WeightBytes)})
		rows = append(rows, []string{fmt.Sprintf("KV cache (%d tokens, %d kv head(s)/GPU, %d B/token)", p.Opts.KVTokens, p.KVHeadsPerGPU, p.KVBytesPerTokenGPU), humanBytes(p.KVBytes)})
		rows = append(rows, []string{"total", humanBytes(p.Total)})
		if err := renderTable(w, []string{"ITEM", "BYTES"}, rows); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(w, "\nMemory plan: %s\n", r.PlanError)
	}
	if r.GPUCheck != nil {
		fmt.Fprintln(w)
		for _, l := range r.GPUCheck.Lines() {
			fmt.Fprintln(w, l)
		}
	}

	if len(r.Warnings) > 0 {
		fmt.Fprintf(w, "\nWarnings (%d; plain inference unaffected)\n", len(r.Warnings))
		for i, p := range r.Warnings {
			if i == 20 {
				fmt.Fprintf(w, "  ... and %d more\n", len(r.Warnings)-20)
				break
			}
			fmt.Fprintf(w, "  - %s\n", p)
		}
	}
	if r.Values != "" {
		fmt.Fprintf(w, "\nValues checked: %s\n", r.Values)
	} else {
		fmt.Fprintln(w, "\nValues checked: none (shards missing or tensors unbound)")
	}
	if r.OK {
		fmt.Fprintln(w, "\nVerdict: OK")
		return nil
	}
	fmt.Fprintf(w, "\nVerdict: %d problem(s)\n", len(r.Problems))
	for i, p := range r.Problems {
		if i == 50 {
			fmt.Fprintf(w, "  ... and %d more (use --json for all)\n", len(r.Problems)-50)
			break
		}
		fmt.Fprintf(w, "  - %s\n", p)
	}
	return nil
}

// verifyBar is the progress bar of inspect --verify, on stderr (hidden when
// stderr is not a terminal, so logs and tests stay clean).
func (a *app) verifyBar() *progressbar.ProgressBar {
	w := io.Discard
	if f, ok := a.errOut.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		w = f
	}
	return progressbar.NewOptions64(1,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription("verifying tensors"),
		progressbar.OptionShowBytes(true),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
	)
}
