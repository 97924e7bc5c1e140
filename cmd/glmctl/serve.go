package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/grammar"
	"github.com/glmctl/glmctl/pkg/server"
	"github.com/glmctl/glmctl/pkg/tokenizer"
	"github.com/glmctl/glmctl/pkg/tokenizer/chat"
)

func (a *app) newServeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the OpenAI-compatible API (and Anthropic's Messages API)",
		Long: `serve loads a model directory on a backend and serves an OpenAI-compatible HTTP API:
POST /v1/chat/completions and /v1/completions (streamed as server-sent events or not),
GET /v1/models, /healthz (process up), /readyz (engine running) and /metrics (Prometheus;
with --backend cuda also per-GPU memory, utilisation, power, temperature and clocks via NVML),
and vLLM's utility routes: GET /health (200 when ready, else 503), GET /version, POST /tokenize
and POST /detokenize. Anthropic's Messages API is served too: POST /v1/messages (streamed or
not, thinking and tool_use blocks) and POST /v1/messages/count_tokens.

Every flag can also be set as GLMCTL_<FLAG> (dashes as underscores, e.g.
GLMCTL_API_KEY) or in the config file. SIGTERM or Ctrl-C stops accepting
connections, lets running requests finish for --shutdown-timeout, cancels the
rest and exits 0. Logs are JSON unless --log-format is given.`,
		Example: `  glmctl serve --model ./GLM-4.7-FP8 --backend cuda --host 0.0.0.0 --port 8000
  glmctl serve --model testdata/models/tiny-f32 --backend cpu --api-key secret
  glmctl serve --synthetic glm-4.7 --rank 0/8 --tokenizer ./qwen3-tokenizer --backend cuda`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.runServe(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.String("model", "", "model directory: config.json, safetensors shards, tokenizer.json (required unless --synthetic)")
	addBackendFlags(f)
	addSpeculativeFlags(f)
	addSyntheticFlags(f)
	f.String("tokenizer", "", "directory of the tokenizer.json to use (default: the model directory; required with --synthetic: any tokenizer whose vocabulary covers the model's ids)")
	f.String("host", "127.0.0.1", "address to listen on (0.0.0.0 for all interfaces)")
	f.Int("port", 8000, "TCP port to listen on")
	f.Int("max-queue", server.DefaultMaxQueue, "requests waiting for the engine before new ones get 429 (-1 = unbounded)")
	f.Int("max-seqs", 0, "most sequences running at once (0 = engine default)")
	f.Int("max-batched-tokens", 0, "token budget of one engine step (0 = engine default)")
	addPrefillWithDecodeFlag(f)
	f.Int("max-model-len", 0, "most tokens (prompt + completion) of one request (0 = model context, capped by the KV cache)")
	f.Bool("prefix-caching", true, "share KV blocks of common prompt prefixes between requests")
	f.Bool("overlap-output", true, "decode generated tokens' text while the next engine step runs (a stop string found there ends the request at that token; off: between steps; the same output)")
	f.String("api-key", "", "require this key as \"Authorization: Bearer KEY\" or \"x-api-key: KEY\" on /v1/* (or GLMCTL_API_KEY)")
	f.String("served-model-name", "", "model id clients send and /v1/models lists (default: the model directory's name)")
	f.Int64("max-body-bytes", server.DefaultMaxBodyBytes, "largest request body accepted (413 beyond)")
	f.Duration("shutdown-timeout", server.DefaultShutdownTimeout, "on SIGTERM, how long running requests may finish before they are cancelled")
	return cmd
}

func (a *app) runServe(ctx context.Context) error {
	v := a.v
	log := a.log
	if !v.IsSet("log-format") {
		// A server's logs go to collectors: JSON unless asked otherwise.
		l, err := newLogger(a.errOut, "json", v.GetString("log-level"))
		if err != nil {
			return err
		}
		log = l
		a.log = l
		slog.SetDefault(l)
	}
	src, err := a.modelFromFlags()
	if err != nil {
		return err
	}
	dir, tokDir := src.dir, v.GetString("tokenizer")
	switch {
	case src.spec != nil && tokDir == "":
		return errors.New("--synthetic: a synthetic model has no tokenizer; give --tokenizer DIR (a tokenizer.json whose vocabulary covers the model's ids)")
	case src.spec == nil && dir == "":
		return errors.New("--model: a model directory is required")
	case tokDir == "":
		tokDir = dir
	}
	port := v.GetInt("port")
	if port < 0 || port > 65535 {
		return fmt.Errorf("--port: %d is not a TCP port (0..65535)", port)
	}
	name := v.GetString("served-model-name")
	if name == "" && src.spec != nil {
		name = src.spec.Name()
	} else if name == "" {
		name = filepath.Base(filepath.Clean(dir))
	}

	tok, err := tokenizer.Load(tokDir)
	if err != nil {
		return err
	}
	defer tok.Close()
	stopIDs := tok.StopIDs
	var format server.ChatFormat
	if tok.Variant != chat.VariantUnknown {
		format = server.GLMChat{Variant: tok.Variant}
	} else {
		log.Warn("no GLM chat template recognised: /v1/chat/completions disabled, /v1/completions works", "dir", tokDir)
	}
	sampling := server.SamplingDefaults{Temperature: 1, TopP: 1}
	if src.spec == nil {
		if sampling, err = samplingDefaults(dir); err != nil {
			return err
		}
	} else {
		// Stop ids of the borrowed tokenizer that the model's vocabulary
		// (a rank's share) does not hold can never be generated.
		stopIDs = nil
		for _, id := range tok.StopIDs {
			if int(id) < src.cfg.VocabSize {
				stopIDs = append(stopIDs, id)
			}
		}
	}

	log.Info("loading model", "model", src.label, "backend", v.GetString("backend"))
	backend, err := a.open(ctx, src)
	if err != nil {
		return err
	}
	defer backend.Close()
	info := backend.Info()
	log.Info("model loaded", "backend", info.Name, "device", info.Device, "vocab", info.VocabSize,
		"kv_blocks", info.NumKVBlocks, "kv_block_size", info.KVBlockSize)
	// /metrics samples the GPUs the backend runs on (glmctl_gpu_*).
	var gpus server.GPUSampler
	if info.Name == "cuda" {
		s := newGPUSampler()
		defer a.closeGPUs(s)
		gpus = cudaGPUs(s, v.GetInt("device"), v.GetInt("tp"))
	} else {
		log.Info("GPU telemetry off: no glmctl_gpu_* metrics", "reason", noGPUReason(info.Name))
	}

	// Structured outputs: the model's vocabulary for the grammar library
	// (about a second for GLM-4.7's 151k tokens, once).
	var gram *grammar.Vocab
	eos := make([]int, len(stopIDs))
	for i, id := range stopIDs {
		eos[i] = int(id)
	}
	t0 := time.Now()
	if gram, err = grammar.NewVocabFromTokenizerJSON(filepath.Join(tokDir, "tokenizer.json"), info.VocabSize, eos); err != nil {
		log.Warn("structured outputs off: no grammar vocabulary", "err", err)
		gram = nil
	} else {
		log.Info("structured outputs on", "grammar", "llguidance "+grammar.Version, "vocab", info.VocabSize, "seconds", time.Since(t0).Seconds())
	}

	drafts, draftBatch, err := a.speculative()
	if err != nil {
		return err
	}
	if drafts > 0 {
		log.Info("speculative decoding on", "draft_model", "MTP layer", "draft_tokens", drafts,
			"draft_max_batch", cmp.Or(draftBatch, engine.DefaultDraftMaxBatch))
	}
	srv, err := server.New(server.Options{
		Backend: backend,
		Engine: engine.Config{
			DraftTokens:          drafts,
			DraftMaxBatch:        draftBatch,
			MaxBatchedTokens:     v.GetInt("max-batched-tokens"),
			MaxPrefillWithDecode: v.GetInt("max-prefill-with-decode"),
			MaxSeqs:              v.GetInt("max-seqs"),
			MaxModelLen:          v.GetInt("max-model-len"),
			PrefixCaching:        v.GetBool("prefix-caching"),
			TextBetweenSteps:     !v.GetBool("overlap-output"),
			MaxQueue:             v.GetInt("max-queue"),
			EOSTokenIDs:          stopIDs,
		},
		Tokenizer:       tokenizer.ServerTokenizer{Tok: tok},
		Chat:            format,
		Grammar:         gram,
		ModelName:       name,
		APIKey:          v.GetString("api-key"),
		Addr:            net.JoinHostPort(v.GetString("host"), strconv.Itoa(port)),
		MaxBodyBytes:    v.GetInt64("max-body-bytes"),
		Sampling:        sampling,
		ShutdownTimeout: v.GetDuration("shutdown-timeout"),
		Logger:          log,
		Version:         version,
		Commit:          buildCommit(),
		GPU:             gpus,
	})
	if err != nil {
		return err
	}
	return srv.ListenAndServe(ctx)
}

// samplingDefaults reads temperature, top_p and top_k from the model's
// generation_config.json, as vLLM does; a missing file or field keeps
// OpenAI's defaults (temperature 1, top_p 1, no top_k).
func samplingDefaults(dir string) (server.SamplingDefaults, error) {
	d := server.SamplingDefaults{Temperature: 1, TopP: 1}
	path := filepath.Join(dir, "generation_config.json")
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return d, nil
	}
	if err != nil {
		return d, fmt.Errorf("read %s: %w", path, err)
	}
	var gc struct {
		Temperature *float64 `json:"temperature"`
		TopP        *float64 `json:"top_p"`
		TopK        *int     `json:"top_k"`
	}
	if err := json.Unmarshal(data, &gc); err != nil {
		return d, fmt.Errorf("read %s: %w", path, err)
	}
	if gc.Temperature != nil {
		if *gc.Temperature < 0 || *gc.Temperature > 2 {
			return d, fmt.Errorf("read %s: temperature %v must be in [0, 2]", path, *gc.Temperature)
		}
		d.Temperature = *gc.Temperature
	}
	if gc.TopP != nil {
		if *gc.TopP <= 0 || *gc.TopP > 1 {
			return d, fmt.Errorf("read %s: top_p %v must be in (0, 1]", path, *gc.TopP)
		}
		d.TopP = *gc.TopP
	}
	if gc.TopK != nil {
		if *gc.TopK < 0 {
			return d, fmt.Errorf("read %s: top_k %d must be >= 0", path, *gc.TopK)
		}
		d.TopK = *gc.TopK
	}
	return d, nil
}
