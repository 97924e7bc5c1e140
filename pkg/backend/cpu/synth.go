package cpu

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/glmctl/glmctl/pkg/model"
	"github.com/glmctl/glmctl/pkg/synth"
)

// synthShardBytes bounds the shards of the temporary checkpoint (they are
// generated in memory one at a time).
const synthShardBytes = 512 << 20

// OpenSynthetic opens the synthetic model of spec (docs/synthetic.md): its
// checkpoint is written to a temporary directory ($TMPDIR), loaded, and the
// directory removed again before OpenSynthetic returns (the backend keeps
// float32 copies of every weight, not the files). The values are those
// `glmctl synth` writes for the same spec.
func OpenSynthetic(ctx context.Context, spec synth.Spec, o Options) (*Backend, error) {
	cfg, err := spec.Config()
	if err != nil {
		return nil, fmt.Errorf("cpu backend: %w", err)
	}
	// Refuse before writing anything the loader would refuse anyway.
	if need := 4 * model.Account(cfg, nil).MainParams; need > MaxWeightBytes {
		return nil, fmt.Errorf("cpu backend: %s: the CPU backend holds weights as float32 and would need %d bytes, over its limit of %d (use --rank and --layers, or the CUDA backend)",
			spec, need, int64(MaxWeightBytes))
	}
	dir, err := os.MkdirTemp("", "glmctl-synth-*")
	if err != nil {
		return nil, fmt.Errorf("cpu backend: %w", err)
	}
	defer os.RemoveAll(dir)
	start := time.Now()
	res, err := synth.Write(ctx, dir, spec, synth.WriteOptions{MaxShardBytes: synthShardBytes, Workers: o.Threads})
	if err != nil {
		return nil, fmt.Errorf("cpu backend: %w", err)
	}
	slog.Info("cpu backend: synthetic checkpoint written", "model", spec.String(), "dir", dir,
		"gb", float64(res.Bytes)/1e9, "seconds", time.Since(start).Seconds())
	return Open(dir, o)
}
