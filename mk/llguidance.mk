# mk/llguidance.mk — libllguidance.a for pkg/grammar (cgo; constrained decoding).
#
# Included from the top-level Makefile. The static library is built from
# third_party/llguidance/ (a wrapper crate over llguidance =1.9.1 from the
# crate registry, with a committed Cargo.lock) by scripts/build-llguidance.sh
# into a cache outside the repository; the script is idempotent and returns
# at once when the cached build matches.
#
# Every package that imports pkg/grammar links against the library, so
# `go build`, `go test` and `go vet` of those packages need CGO_LDFLAGS below.

GLMCTL_CACHE ?= $(HOME)/.cache/glmctl
LLGUIDANCE_VERSION := 1.9.1
LLGUIDANCE_LIB_DIR := $(GLMCTL_CACHE)/llguidance-$(LLGUIDANCE_VERSION)/lib
export GLMCTL_CACHE

CGO_LDFLAGS += -L$(LLGUIDANCE_LIB_DIR)
export CGO_LDFLAGS

.PHONY: llguidance-lib
llguidance-lib: $(LLGUIDANCE_LIB_DIR)/libllguidance.a

# The script re-checks its stamp itself (inputs + rustc version), so the rule
# only has to run it when the archive is missing or the crate files changed.
$(LLGUIDANCE_LIB_DIR)/libllguidance.a: scripts/build-llguidance.sh third_party/llguidance/Cargo.toml third_party/llguidance/Cargo.lock third_party/llguidance/src/lib.rs
	GLMCTL_CACHE=$(GLMCTL_CACHE) bash scripts/build-llguidance.sh >/dev/null
