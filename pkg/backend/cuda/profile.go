package cuda

/*
#include "glmrt.h"
*/
import "C"

import (
	"fmt"

	"github.com/glmctl/glmctl/pkg/engine"
)

// profileFamilies names the GLMRT_PROF_* families, in index order.
var profileFamilies = [...]string{
	C.GLMRT_PROF_EMBED:          "embed",
	C.GLMRT_PROF_NORM:           "add+rmsnorm",
	C.GLMRT_PROF_QKV:            "q|k|v linear",
	C.GLMRT_PROF_ROPE_KV:        "qk norm+rope+kv write",
	C.GLMRT_PROF_ATTENTION:      "attention",
	C.GLMRT_PROF_O_PROJ:         "o_proj linear",
	C.GLMRT_PROF_DENSE_GATE_UP:  "dense gate|up",
	C.GLMRT_PROF_DENSE_DOWN:     "dense down",
	C.GLMRT_PROF_ROUTER:         "router",
	C.GLMRT_PROF_EXPERT_GATE_UP: "experts gate|up",
	C.GLMRT_PROF_EXPERT_DOWN:    "experts down",
	C.GLMRT_PROF_ACTIVATION:     "silu*up+quant",
	C.GLMRT_PROF_MOE_COMBINE:    "moe combine",
	C.GLMRT_PROF_LM_HEAD:        "lm_head",
	C.GLMRT_PROF_SAMPLING:       "sampling",
	C.GLMRT_PROF_COMM:           "communication",
	C.GLMRT_PROF_COPY:           "host copies",
	C.GLMRT_PROF_MOE_LAYER:      "moe layer (1 launch)",
	C.GLMRT_PROF_ATTN_LAYER:     "attention layer (1 launch)",
}

var _ = [1]struct{}{}[len(profileFamilies)-int(C.GLMRT_PROF_N)] // one name per family

// StartProfile clears the runtime's step profile and starts timing every
// launch of the following steps by family (glmrt_profile_enable).
func (b *Backend) StartProfile() error {
	return b.withEngine(func() error { return b.eng.profileEnable(true) })
}

// StopProfile stops profiling and returns what the steps since StartProfile
// accumulated.
func (b *Backend) StopProfile() (engine.StepProfile, error) {
	var p C.glmrt_profile
	err := b.withEngine(func() error {
		var err error
		if p, err = b.eng.profileRead(true); err != nil {
			return err
		}
		return b.eng.profileEnable(false)
	})
	if err != nil {
		return engine.StepProfile{}, err
	}
	out := engine.StepProfile{Steps: int(p.steps), StepUs: float64(p.step_us), Graphs: p.graphs != 0}
	for i, name := range profileFamilies {
		out.Families = append(out.Families, engine.FamilyProfile{
			Name: name, Us: float64(p.family_us[i]), Bytes: int64(p.family_bytes[i]), Launches: int64(p.family_launches[i]),
		})
	}
	return out, nil
}

// withEngine runs f on the backend's thread, serialized with Step and Close.
func (b *Backend) withEngine(f func() error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	var err error
	b.thread.run(func() { err = f() })
	if err != nil {
		return fmt.Errorf("cuda backend: %w", err)
	}
	return nil
}
