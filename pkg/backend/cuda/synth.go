package cuda

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/glmctl/glmctl/pkg/synth"
)

// OpenSynthetic creates an engine for the synthetic model of spec and fills
// every weight on the GPU(s) with glmrt_synthesize (docs/synthetic.md): no
// checkpoint is read, and the values are those `glmctl synth` writes for the
// same spec. The runtime receives the spec's effective seed (the rank
// already combined in).
func OpenSynthetic(ctx context.Context, spec synth.Spec, o Options) (*Backend, error) {
	cfg, err := spec.Config()
	if err != nil {
		return nil, err
	}
	if err := checkConfigRange(cfg); err != nil {
		return nil, err
	}
	b, path, copts, err := openRuntime(o)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			b.release()
		}
	}()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ccfg := modelConfig(cfg)
	if o.DraftTokens > 0 {
		// The spec's config has no MTP layer (pkg/synth writes none); the
		// runtime generates one on the GPU when it drafts (docs/synthetic.md).
		ccfg.num_nextn_predict_layers = 1
	}
	b.thread.run(func() { b.eng, err = b.lib.createEngine(&ccfg, &copts) })
	if err != nil {
		return nil, fmt.Errorf("cuda backend %s: %w", path, err)
	}
	seed := spec.EffectiveSeed()
	slog.Info("cuda backend: synthesizing weights", "model", spec.String(), "effective_seed", seed)
	start := time.Now()
	b.thread.run(func() { err = b.eng.synthesize(seed) })
	if err != nil {
		return nil, fmt.Errorf("cuda backend: %s: %w", spec, err)
	}
	if err := b.finish(path, cfg); err != nil {
		return nil, err
	}
	slog.Info("cuda backend: weights synthesized", "model", spec.String(),
		"weights_gb", float64(b.rt.WeightBytes)/1e9, "seconds", time.Since(start).Seconds())
	ok = true
	return b, nil
}
