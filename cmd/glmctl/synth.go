package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/glmctl/glmctl/pkg/inspect"
	"github.com/glmctl/glmctl/pkg/safetensors"
	"github.com/glmctl/glmctl/pkg/synth"
)

func (a *app) newSynthCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "synth NAME --out DIR",
		Short: "Write full-size synthetic weights as a checkpoint (GLM-4.7-FP8 layout)",
		Long: `synth writes the synthetic weights that --synthetic NAME runs (docs/synthetic.md) as a
checkpoint: real tensor names, per-rank shapes with --rank r/N (exactly rank r's share of a
TP = EP = N deployment), FP8 E4M3 linears with F32 row scales, config.json of the derived
configuration, generation_config.json, shards of at most --max-shard-bytes and
model.safetensors.index.json. inspect, validate and the CPU backend read it like any other
checkpoint; the CUDA backend's --synthetic makes the same values on the GPU without it.
It then runs inspect's checks on DIR and prints the verdict. Nothing is written outside DIR;
a non-empty DIR is refused unless --force (which replaces its checkpoint files).`,
		Example: `  glmctl synth glm-4.7 --rank 0/8 --out /data/glm-4.7-r0of8          # one rank, all 92 layers (46 GB)
  glmctl synth glm-4.7 --rank 0/8 --layers 2 --dense-layers 1 --out /tmp/glm-2l`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.runSynth(cmd.Context(), args[0])
		},
	}
	f := cmd.Flags()
	f.String("rank", "", "r/N: exactly rank r's share of a TP = EP = N deployment (e.g. 0/8); empty = the whole model")
	f.Int("layers", 0, "keep the first N decoder layers (0 = all)")
	f.Int("dense-layers", -1, "how many of them are dense-MLP layers (-1 = the model's, at most --layers)")
	f.Uint64("seed", synth.DefaultSeed, "seed of the weights (each rank combines it with its index)")
	f.String("out", "", "directory to write (created if missing; required)")
	f.Bool("force", false, "write into a non-empty directory, replacing its checkpoint files")
	f.Int64("max-shard-bytes", synth.DefaultMaxShardBytes, "largest shard file; a shard is generated in memory before it is written")
	return cmd
}

func (a *app) runSynth(ctx context.Context, base string) error {
	v := a.v
	spec := synth.Spec{Base: base, Layers: v.GetInt("layers"), DenseLayers: v.GetInt("dense-layers"), Seed: v.GetUint64("seed")}
	if r := v.GetString("rank"); r != "" {
		var err error
		if spec.Rank, spec.Ranks, err = synth.ParseRank(r); err != nil {
			return err
		}
	}
	if _, err := spec.Config(); err != nil {
		return err
	}
	dir := v.GetString("out")
	if dir == "" {
		return errors.New("--out: a directory to write is required")
	}
	if n := v.GetInt64("max-shard-bytes"); n <= 0 {
		return fmt.Errorf("--max-shard-bytes: %d must be > 0", n)
	}
	if err := prepareOutDir(dir, v.GetBool("force")); err != nil {
		return err
	}

	a.log.Info("synth: writing checkpoint", "model", spec.String(), "dir", dir)
	res, err := synth.Write(ctx, dir, spec, synth.WriteOptions{
		MaxShardBytes: v.GetInt64("max-shard-bytes"),
		Progress:      a.synthProgress(),
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(a.out, "Wrote %s: %s\n  %d tensors, %s in %d shard(s), %.1f s (effective seed %d)\n\n",
		dir, spec, res.Tensors, humanBytes(res.Bytes), res.Shards, res.Elapsed.Seconds(), res.Seed)

	rep, err := inspect.Run(dir, inspect.Options{TP: 1, EP: 1, KVElemBytes: 2})
	if err != nil {
		return err
	}
	s := rep.Summary
	rows := [][]string{
		{"architecture", fmt.Sprintf("%s (%s)", s.Architecture, s.ModelType)},
		{"layers", fmt.Sprintf("%d (%d dense, %d MoE) + %d MTP", s.Layers, s.DenseLayers, s.MoELayers, s.MTPLayers)},
		{"experts", fmt.Sprintf("%d routed, top-%d, %d shared", s.Experts, s.ExpertsPerTok, s.SharedExperts)},
		{"attention", fmt.Sprintf("%d q heads, %d kv heads, head_dim %d", s.Heads, s.KVHeads, s.HeadDim)},
		{"hidden / vocab", fmt.Sprintf("%d / %d", s.Hidden, s.Vocab)},
		{"linears", fmt.Sprintf("%d FP8, %d unquantized", s.QuantizedLins, s.PlainLins)},
		{"parameters", fmt.Sprintf("%s (%d)", humanCount(rep.Accounting.MainParams), rep.Accounting.MainParams)},
		{"size", humanBytes(rep.Accounting.MainBytes)},
	}
	if err := renderTable(a.out, []string{"FIELD", "VALUE"}, rows); err != nil {
		return err
	}
	if rep.OK {
		fmt.Fprintln(a.out, "\nVerdict: OK (glmctl inspect "+dir+" for the whole report)")
		return nil
	}
	fmt.Fprintf(a.out, "\nVerdict: %d problem(s)\n", len(rep.Problems))
	for i, p := range rep.Problems {
		if i == 20 {
			fmt.Fprintf(a.out, "  ... and %d more\n", len(rep.Problems)-20)
			break
		}
		fmt.Fprintf(a.out, "  - %s\n", p)
	}
	return rep.Err()
}

// prepareOutDir refuses a non-empty dir unless force, and with force removes
// the checkpoint files a previous write may have left there (shards of
// another count, a single-file model.safetensors, the index).
func prepareOutDir(dir string, force bool) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("--out %s: %w", dir, err)
	case len(entries) == 0:
		return nil
	case !force:
		return fmt.Errorf("--out %s: the directory is not empty (%d entries); use --force to replace its checkpoint files", dir, len(entries))
	}
	for _, e := range entries {
		name := e.Name()
		stale := name == safetensors.SingleFileName || name == safetensors.IndexFileName
		if ok, _ := filepath.Match("model-*-of-*.safetensors", name); ok {
			stale = true
		}
		if stale && e.Type().IsRegular() {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return fmt.Errorf("--force: %w", err)
			}
		}
	}
	return nil
}

// synthProgress reports synth.Write's progress: a progress bar on a
// terminal, else a log line at most every 10 seconds.
func (a *app) synthProgress() func(done, total int64) {
	if f, ok := a.errOut.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		var bar *progressbar.ProgressBar
		return func(done, total int64) {
			if bar == nil {
				bar = progressbar.NewOptions64(total,
					progressbar.OptionSetWriter(f),
					progressbar.OptionSetDescription("synth"),
					progressbar.OptionShowBytes(true),
					progressbar.OptionSetWidth(30),
					progressbar.OptionThrottle(100*time.Millisecond),
					progressbar.OptionShowCount(),
					progressbar.OptionClearOnFinish(),
				)
			}
			_ = bar.Set64(done)
			if done == total {
				_ = bar.Finish()
			}
		}
	}
	return logProgress(a.log.Info)
}

// logProgress logs "synth: generating" lines at most every 10 seconds, and
// once at the end.
func logProgress(info func(msg string, args ...any)) func(done, total int64) {
	start := time.Now()
	var last time.Time
	ended := false
	return func(done, total int64) {
		if ended || (done < total && time.Since(last) < 10*time.Second) {
			return
		}
		last, ended = time.Now(), done >= total
		info("synth: generating", "gb", fmt.Sprintf("%.2f/%.2f", float64(done)/1e9, float64(total)/1e9),
			"percent", fmt.Sprintf("%.0f", 100*float64(done)/float64(max(total, 1))), "seconds", time.Since(start).Seconds())
	}
}
