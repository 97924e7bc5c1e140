# glmctl — build, test, lint, run.
#   make build   builds ./bin/glmctl (static libtokenizers built first when needed)
#   make test    the whole test suite (what CI runs)
#   make run     the main job: the bundled demo model continues a Go prompt, on CPU
#   make lint    gofmt + go vet
#   make fuzz    every fuzz target of the module for FUZZTIME each (part of make test)

GO        ?= go
BIN       ?= bin/glmctl
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT    ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo none)
LDFLAGS   := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
GLMCTL_CACHE ?= $(HOME)/.cache/glmctl
TINY      ?= testdata/models/tiny-f32
DEMO      ?= testdata/models/demo-go

# NVML 13 headers are noisy; a fixed CGO_CFLAGS keeps the build cache stable.
export CGO_CFLAGS := -O2 -g -Wno-deprecated-declarations
export CGO_ENABLED := 1

-include mk/tokenizers.mk
-include mk/llguidance.mk
-include mk/cuda.mk
include mk/python.mk
TOKENIZERS_DEPS := $(if $(wildcard mk/tokenizers.mk),tokenizers-lib)
LLGUIDANCE_DEPS := $(if $(wildcard mk/llguidance.mk),llguidance-lib)

.PHONY: all build test lint fuzz run gpu-tests gpu-check gpu-perf clean

all: build

build: $(TOKENIZERS_DEPS) $(LLGUIDANCE_DEPS)
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/glmctl

# Everything CI runs: lint, the link check, the CUDA compile+link with nvcc from
# PyPI wheels, the goreleaser config check, and every Go test with the project's
# Python environment first on PATH (the serve test runs the real openai client).
test: lint link-check cuda-check release-check venv
	PATH="$(VENV)/bin:$$PATH" $(GO) test -count=1 ./...
	PATH="$(VENV)/bin:$$PATH" $(GO) test -count=1 -race ./pkg/engine/... ./pkg/sample/... ./pkg/server/... ./pkg/backend/...
	$(MAKE) --no-print-directory fuzz

# Every fuzz target (each func FuzzXxx of a _test.go file), one at a time for
# FUZZTIME, so that a new crasher is caught in CI; its seed corpus
# (testdata/fuzz) already runs with the plain tests. A failure leaves the
# input in testdata/fuzz/FuzzXxx/ for go test to replay: commit it with the fix.
# scripts/fuzz.sh tells a crasher from Go's fuzztime-boundary race.
FUZZTIME ?= 10s
fuzz: $(TOKENIZERS_DEPS) $(LLGUIDANCE_DEPS)
	@GO="$(GO)" scripts/fuzz.sh $(FUZZTIME)

lint: $(TOKENIZERS_DEPS) $(LLGUIDANCE_DEPS)
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# The bundled demo model (trained on Go's standard library, docs/demo-model.md)
# continues a Go prompt; it has no chat ability, so the prompt is raw text.
run: build
	$(BIN) inspect $(DEMO) --tp 1 --ep 1 --max-rows 10
	$(BIN) generate --model $(DEMO) --backend cpu --temperature 0 --max-tokens 128 \
	  "$$(printf '// Reverse returns a copy of s with its bytes in reverse order.\nfunc Reverse(s string) string {')"

# Build here, carry bin/ to the GPU machine (it has no Go): glmctl and the
# CUDA backend's GPU-only tests (-tags gpu) compiled into bin/cuda.test.
gpu-tests: build
	$(GO) test -c -tags gpu -o bin/cuda.test ./pkg/backend/cuda

# On the GPU machine, with bin/ carried there.
gpu-check:
	scripts/gpu-check.sh

# On the GPU machine, with bin/ and .carry/cuda (cuda/build.sh --check --tests -o .carry/cuda)
# carried there: kernel checks, attention vs SDPA, the decode grid and profile (docs/perf.md).
gpu-perf:
	scripts/gpu-perf.sh

clean:
	rm -rf bin

# goreleaser from the Go module proxy (pinned), cached outside the repo.
GORELEASER_VERSION := v2.12.7
GORELEASER := $(GLMCTL_CACHE)/bin/goreleaser-$(GORELEASER_VERSION)

$(GORELEASER):
	mkdir -p $(dir $@)
	GOFLAGS= GOBIN=$(abspath $(dir $@))/tmp-gr $(GO) install github.com/goreleaser/goreleaser/v2@$(GORELEASER_VERSION)
	mv $(dir $@)/tmp-gr/goreleaser $@ && rmdir $(dir $@)/tmp-gr

.PHONY: release-check
release-check: $(GORELEASER)
	$(GORELEASER) check
