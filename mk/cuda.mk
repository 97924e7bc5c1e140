# mk/cuda.mk — the CUDA runtime (libglmcuda.so) and the link check.
#
# Included from the top-level Makefile.
#   make link-check   build glmctl once without go-nvml (-tags nonvml): go-nvml adds
#                     -Wl,--unresolved-symbols=ignore-in-object-files to the whole link
#                     (docs/backends.md), so only this build turns a missing C symbol
#                     (e.g. a stale libtokenizers.a) into a link error instead of a
#                     `symbol lookup error` at run time.
#   make cuda-check   compile and link cuda/ for sm_90a with no GPU, using the pinned
#                     CUDA 13.0 PyPI wheels (what CI runs; a compile error fails).
#   make cuda-lib     build libglmcuda.so for this machine's GPU (on the GPU machine).

GO  ?= go
BIN ?= bin/glmctl

.PHONY: link-check cuda-check cuda-lib

link-check: $(TOKENIZERS_DEPS) $(LLGUIDANCE_DEPS)
	$(GO) build -tags nonvml -o /dev/null ./cmd/glmctl

cuda-check: build
	eval "$$(scripts/install-cuda-wheels.sh)" && $(BIN) build --check

cuda-lib: build
	$(BIN) build
