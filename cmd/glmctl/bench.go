package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/glmctl/glmctl/pkg/backend"
	"github.com/glmctl/glmctl/pkg/bench"
	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/model"
	"github.com/glmctl/glmctl/pkg/progress"
)

func (a *app) newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark throughput and latency against the hardware floor",
		Long: `bench runs the engine in-process on the chosen backend with synthetic requests (random
prompt ids, EOS ignored so every request yields exactly --output-len tokens). For each value of
--concurrency it keeps that many requests in flight until --requests have finished, and reports
output and total tokens/s, requests/s, TTFT and TPOT percentiles, the mean step time and decode
batch (from the engine's counters), and the decode floor: the bytes one decode step must read on
one GPU of the TP/EP deployment (weights touched at the measured batch, expected distinct experts
under uniform routing, plus the KV cache at the mean context) divided by the memory bandwidth.
"of floor" is floor TPOT / measured mean TPOT. --project-model adds the floor another model
(e.g. testdata/glm-4.7-fp8, config only) would have at the same batch and context: a projection,
not a measurement. --synthetic glm-4.7 --rank 0/8 runs exactly one rank's share of the real
model on synthetic weights generated at load (no checkpoint; docs/synthetic.md).
With --backend cuda each run also samples its GPUs through NVML (peak memory used, mean
utilisation, mean/peak power, max temperature, SM clock); without NVML the report says why.

With --url, bench is instead a load generator for any OpenAI-compatible server (glmctl serve,
vLLM, SGLang, llama-server): streaming --endpoint requests at each --concurrency or at a Poisson
--request-rate, with random prompts of --input-len tokens (counted by the server's /tokenize) or
a --dataset file; it reports TTFT, TPOT, ITL, end-to-end latency, throughput, goodput under --slo
and failures by kind. --model is then the served model's name. See docs/bench.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if a.v.GetString("url") != "" {
				return a.runBenchURL(cmd)
			}
			if err := checkInProcessFlags(cmd); err != nil {
				return err
			}
			return a.runBench(cmd.Context(), commandLine(cmd))
		},
	}
	f := cmd.Flags()
	f.String("model", "testdata/models/tiny-f32", "model directory (with --url: the served model's name, default the first of GET /v1/models)")
	addBackendFlags(f)
	addSpeculativeFlags(f)
	addSyntheticFlags(f)
	f.Int("max-seqs", 0, "most sequences running at once (0 = engine default); must be >= every --concurrency")
	f.Int("max-batched-tokens", 0, "token budget of one engine step (0 = engine default)")
	addPrefillWithDecodeFlag(f)
	f.Bool("prefix-caching", false, "share KV blocks of common prompt prefixes (off: benchmarks measure compute, and random prompts share nothing)")
	f.String("concurrency", "1,4,16", "comma-separated requests in flight, one run per value")
	f.Int("input-len", 128, "prompt tokens per request")
	f.Int("output-len", 128, "generated tokens per request (EOS ignored)")
	f.Int("arrival-len", 0, "once each run's streams are decoding, one more request with a prompt of this many tokens arrives: report its TTFT and the streams' inter-token latency during its prefill (0 = none)")
	f.Bool("speculative-compare", false, "with --speculative mtp: run each concurrency twice with the same prompts, first with every request's drafting off, then on, and report the speed-up in output tok/s (each run warms up with at least one request per slot)")
	f.Int("requests", 0, "measured requests per run (0 = 4 × concurrency; never fewer than the concurrency)")
	f.Int("warmup", -1, "warm-up requests before each run, not measured (-1 = one per in-flight slot)")
	f.Int64("seed", 0, "seed of the random prompts (and of sampling with --temperature)")
	f.Float32("temperature", 0, "sampling temperature (0 = greedy)")
	f.Float64("hbm-bandwidth", 0, "memory bandwidth for the floor in bytes/s (0 = from the device: H200 4.46e12 measured, H100 3.11e12 estimated, CPU 20e9 assumed)")
	f.Int("ep", 0, "expert-parallel group size the floor assumes (0 = --tp)")
	f.String("floor-kv-dtype", "bf16", "KV cache element type the floor reads: bf16, fp8 or fp32 (default: the cache's, bf16, or fp8 with --kv-cache-dtype fp8)")
	f.String("project-model", "", "also print the floor of this model directory (config.json is enough) at each run's batch and context, labelled as a projection")
	f.Int("project-tp", 8, "tensor-parallel GPUs of the projection")
	f.Int("project-ep", 0, "expert-parallel group size of the projection (0 = --project-tp)")
	f.Float64("project-hbm-bandwidth", bench.H200MeasuredBandwidth, "memory bandwidth of the projection's GPUs in bytes/s (default: H200, measured)")
	f.Bool("json", false, "print the whole report as JSON")
	f.Bool("markdown", false, "print the header and a markdown table (for docs/perf.md)")
	addStepBenchFlags(f)
	addURLBenchFlags(f)
	return cmd
}

// commandLine rebuilds the command as typed: its path and the flags set on
// the command line (environment and config-file values are not shown).
func commandLine(cmd *cobra.Command) string {
	parts := []string{cmd.CommandPath()}
	add := func(fl *pflag.Flag) {
		val := fl.Value.String()
		if fl.Value.Type() == "bool" && val == "true" {
			parts = append(parts, "--"+fl.Name)
			return
		}
		if strings.ContainsAny(val, " \t\"'") || val == "" {
			val = strconv.Quote(val)
		}
		parts = append(parts, "--"+fl.Name+"="+val)
	}
	cmd.Flags().Visit(add)
	return strings.Join(parts, " ")
}

// parseConcurrency reads "1,4,16".
func parseConcurrency(s string) ([]int, error) { return parseInts("concurrency", s) }

func kvElemBytes(dtype string) (int, error) {
	switch strings.ToLower(dtype) {
	case "bf16":
		return 2, nil
	case "fp8":
		return 1, nil
	case "fp32":
		return 4, nil
	}
	return 0, fmt.Errorf("--floor-kv-dtype: %q is not one of bf16, fp8, fp32", dtype)
}

// bandwidthFlag reads a bandwidth flag: 0 means "default", negative or
// non-finite values are errors.
func bandwidthFlag(name string, v float64) (float64, error) {
	if v < 0 || v != v || v > 1e16 {
		return 0, fmt.Errorf("--%s: %g must be a bandwidth in bytes/s (0 = default)", name, v)
	}
	return v, nil
}

func seqLimitText(n int) string {
	if n <= 0 {
		return "no limit on sequences per step"
	}
	return fmt.Sprintf("at most %d sequences per step", n)
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func modelSummary(cfg *model.Config) string {
	params := model.Account(cfg, nil).MainParams
	s := fmt.Sprintf("%s, %d layers", cfg.ModelType, cfg.NumHiddenLayers)
	if cfg.NRoutedExperts > 0 {
		s += fmt.Sprintf(" (%d dense), %d experts top-%d", cfg.NumDenseLayers(), cfg.NRoutedExperts, cfg.NumExpertsPerTok)
	}
	return s + fmt.Sprintf(", hidden %d, vocab %d, %s params", cfg.HiddenSize, cfg.VocabSize, humanCount(params))
}

// floorModelOf builds the floor model of what runs: a synthetic model's
// derived config (its dtypes are the quantization_config's), or the model
// directory's config and shard headers.
func floorModelOf(src modelSource, o bench.FloorOptions) (bench.FloorModel, *model.Config, error) {
	if src.cfg == nil {
		return bench.LoadFloorModel(src.dir, o)
	}
	m, err := bench.NewFloorModel(src.cfg, nil, o)
	if err != nil {
		return bench.FloorModel{}, nil, fmt.Errorf("floor model of %s: %w", src.label, err)
	}
	return m, src.cfg, nil
}

func (a *app) runBench(ctx context.Context, cmdLine string) error {
	v := a.v
	asJSON, asMarkdown := v.GetBool("json"), v.GetBool("markdown")
	if asJSON && asMarkdown {
		return errors.New("--json and --markdown: choose one")
	}
	grid, gridMode, err := a.stepGridFromFlags()
	if err != nil {
		return err
	}
	if v.GetBool("speculative-compare") && (gridMode || v.GetString("speculative") == "") {
		return errors.New("--speculative-compare: only means something with --speculative mtp on the request workload (not with --batches)")
	}
	conc, err := parseConcurrency(v.GetString("concurrency"))
	if err != nil {
		return err
	}
	w := bench.Workload{
		Concurrency: conc,
		Requests:    v.GetInt("requests"),
		Warmup:      v.GetInt("warmup"),
		InputLen:    v.GetInt("input-len"),
		OutputLen:   v.GetInt("output-len"),
		Seed:        v.GetInt64("seed"),
		Temperature: float32(v.GetFloat64("temperature")),
		ArrivalLen:  v.GetInt("arrival-len"),
		// Checked against the engine (it must draft) by Workload.Check.
		CompareSpeculation: v.GetBool("speculative-compare"),
	}
	kvElem, err := kvElemBytes(v.GetString("floor-kv-dtype"))
	if err != nil {
		return err
	}
	// The floor reads the cache that runs unless told otherwise.
	if kvType, err := backend.ParseKVCacheDType(v.GetString("kv-cache-dtype")); err == nil && kvType == backend.KVFP8 &&
		!v.IsSet("floor-kv-dtype") {
		kvElem = 1
	}
	bwFlag, err := bandwidthFlag("hbm-bandwidth", v.GetFloat64("hbm-bandwidth"))
	if err != nil {
		return err
	}
	// The projection is config-only work: fail on it before loading weights.
	var projection *bench.Basis
	if dir := v.GetString("project-model"); dir != "" {
		bw, err := bandwidthFlag("project-hbm-bandwidth", v.GetFloat64("project-hbm-bandwidth"))
		if err != nil {
			return err
		}
		if bw == 0 {
			bw = bench.H200MeasuredBandwidth
		}
		source := fmt.Sprintf("%.3g B/s set by --project-hbm-bandwidth", bw)
		if bw == bench.H200MeasuredBandwidth {
			source = "H200 HBM read, measured 4.46 TB/s (docs/hardware.md §2)"
		}
		o := bench.FloorOptions{TP: v.GetInt("project-tp"), EP: v.GetInt("project-ep"), KVElemBytes: kvElem}
		m, _, err := bench.LoadFloorModel(dir, o)
		if err != nil {
			return fmt.Errorf("--project-model: %w", err)
		}
		projection = &bench.Basis{
			Label:    fmt.Sprintf("floor for %s at TP%d/EP%d", filepath.Base(filepath.Clean(dir)), m.Options.TP, m.Options.EP),
			ModelDir: dir, Model: m, Bandwidth: bench.Bandwidth{BytesPerSecond: bw, Source: source},
		}
	}

	src, err := a.modelFromFlags()
	if err != nil {
		return err
	}
	be, err := a.open(ctx, src)
	if err != nil {
		return err
	}
	defer be.Close()
	info := be.Info()

	// The floor describes the deployment that runs: the CPU backend is one
	// device; the CUDA backend spans --tp GPUs.
	tp, ep := v.GetInt("tp"), v.GetInt("ep")
	if tp == 0 {
		tp = 1
	}
	if info.Name == "cpu" && (tp != 1 || ep > 1) {
		return fmt.Errorf("--tp %d / --ep %d: the cpu backend runs on one device, so its floor is TP1/EP1 (use --project-model for a TP deployment's floor)", tp, ep)
	}
	floorModel, cfg, err := floorModelOf(src, bench.FloorOptions{TP: tp, EP: ep, KVElemBytes: kvElem})
	if err != nil {
		return err
	}
	bw := bench.Bandwidth{BytesPerSecond: bwFlag, Source: "set by --hbm-bandwidth"}
	if bwFlag == 0 {
		if bw, err = bench.DefaultBandwidth(info.Name, info.Device); err != nil {
			return err
		}
	}

	if gridMode {
		h := bench.Header{
			Model: src.label, ModelSummary: modelSummary(cfg), Backend: info.Name, Device: info.Device,
			Date: time.Now().UTC().Format(time.RFC3339), CommandLine: cmdLine,
			EngineConfig: fmt.Sprintf("KV %d blocks × %d tokens, %s", info.NumKVBlocks, info.KVBlockSize, seqLimitText(info.MaxBatchSeqs)),
			GoVersion:    runtime.Version(),
			Floor: &bench.Basis{Label: fmt.Sprintf("TP%d/EP%d", floorModel.Options.TP, floorModel.Options.EP),
				ModelDir: src.label, Model: floorModel, Bandwidth: bw},
		}
		return a.runStepGrid(ctx, be, grid, h, floorModel, bw)
	}
	prof, err := a.profilerOf(be)
	if err != nil {
		return err
	}
	drafts, draftBatch, err := a.speculative()
	if err != nil {
		return err
	}
	ecfg := engine.Config{
		MaxBatchedTokens:     v.GetInt("max-batched-tokens"),
		MaxPrefillWithDecode: v.GetInt("max-prefill-with-decode"),
		MaxSeqs:              v.GetInt("max-seqs"),
		PrefixCaching:        v.GetBool("prefix-caching"),
		Logger:               a.log,
		DraftTokens:          drafts,
		DraftMaxBatch:        draftBatch,
	}
	eng, stopEngine, err := engine.Start(ctx, be, ecfg)
	if err != nil {
		return err
	}
	defer stopEngine()
	lim := eng.Limits()

	sampling := "greedy"
	if w.Temperature > 0 {
		sampling = fmt.Sprintf("temperature %g (seeded per request)", w.Temperature)
	}
	rep := &bench.Report{Header: bench.Header{
		Model: src.label, ModelSummary: modelSummary(cfg), Backend: info.Name, Device: info.Device,
		Date: time.Now().UTC().Format(time.RFC3339), CommandLine: cmdLine,
		EngineConfig: fmt.Sprintf("max %d seqs, %d tokens per step (%d prefill tokens in a step that decodes), KV %d blocks × %d tokens, prefix caching %s",
			lim.MaxSeqs, lim.MaxBatchedTokens, lim.MaxPrefillWithDecode, lim.NumKVBlocks, lim.BlockSize, onOff(ecfg.PrefixCaching)),
		Sampling:  sampling,
		GoVersion: runtime.Version(),
		Floor: &bench.Basis{Label: fmt.Sprintf("TP%d/EP%d", floorModel.Options.TP, floorModel.Options.EP),
			ModelDir: src.label, Model: floorModel, Bandwidth: bw},
		Projection: projection,
		Workload:   w,
	}}
	gpus, closeGPUs, reason := a.benchGPUs(ctx, info.Name, v.GetInt("device"), tp)
	defer closeGPUs()
	rep.Header.GPUTelemetryError = reason
	var bar *progress.Bar
	runs, err := bench.RunHooked(ctx, eng, w, bench.Hooks{
		GPU:      gpus,
		Profiler: prof,
		RunStart: func(c, n int) { bar = a.progress(fmt.Sprintf("bench concurrency %d requests", c), int64(n), false) },
		Request:  func() { bar.Add(1) },
		RunDone: func(r bench.RunResult) {
			bar.Finish()
			a.log.Info("bench run finished", "concurrency", r.Concurrency, "requests", r.Requests,
				"output_tok_s", fmt.Sprintf("%.1f", r.OutputTokensPerSecond), "tpot_ms", fmt.Sprintf("%.2f", r.TPOTMs.Mean))
		},
	})
	bar.Finish()
	if err != nil {
		return err
	}
	for i := range runs {
		if err := bench.AttachFloor(&runs[i], rep.Header.Floor.Label, floorModel, bw); err != nil {
			return err
		}
		if projection != nil {
			if err := bench.AttachProjection(&runs[i], projection.Label, projection.Model, projection.Bandwidth); err != nil {
				return err
			}
		}
	}
	rep.Runs = runs
	switch {
	case asJSON:
		return writeJSON(a.out, rep)
	case asMarkdown:
		return rep.WriteMarkdown(a.out)
	}
	if err := rep.WriteText(a.out); err != nil {
		return err
	}
	if err := renderTable(a.out, rep.Columns(), rep.TableRows()); err != nil {
		return err
	}
	for _, l := range rep.ArrivalLines() {
		fmt.Fprintln(a.out, l)
	}
	for _, l := range rep.GPULines() {
		fmt.Fprintln(a.out, l)
	}
	return a.printRunProfiles(runs, bw)
}

// benchGPUs opens GPU telemetry for the runs: the GPUs of --device and --tp
// on the cuda backend. Without it (another backend, NVML unavailable, the
// GPUs not found) the sampler is nil and reason says why. close is never
// nil.
func (a *app) benchGPUs(ctx context.Context, backendName string, device, tp int) (gpus bench.GPUSampler, closeFn func(), reason string) {
	if backendName != "cuda" {
		return nil, func() {}, noGPUReason(backendName)
	}
	s := newGPUSampler()
	closeFn = func() { a.closeGPUs(s) }
	g := cudaGPUs(s, device, tp)
	pctx, cancel := context.WithTimeout(ctx, gpuProbeTimeout)
	defer cancel()
	if _, err := g.Sample(pctx); err != nil {
		a.log.Info("GPU telemetry off for this bench", "reason", err.Error())
		return nil, closeFn, err.Error()
	}
	return g, closeFn, ""
}
