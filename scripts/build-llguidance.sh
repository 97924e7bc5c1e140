#!/usr/bin/env bash
# Builds libllguidance.a (the C API of the llguidance crate, constrained
# decoding for pkg/grammar) with cargo into a cache directory outside the
# repository.
#
# third_party/llguidance/ is a small wrapper crate that depends on
# llguidance =1.9.1 from the crate registry (without the "rayon" feature) and
# builds one staticlib named libllguidance.a; its Cargo.lock pins every
# crate and the build runs with --locked, so every machine builds the same
# crates (about 50, a minute or two on 2 cores).
#
# Idempotent: if the .a exists and its stamp (hash of the rustc version,
# Cargo.toml, Cargo.lock and src/lib.rs) matches, nothing is done. Prints the
# library directory on stdout.
#
# Env:  GLMCTL_CACHE      cache root (default $HOME/.cache/glmctl)
#       CARGO_BUILD_JOBS  passed through to cargo (default: cargo's choice)
set -euo pipefail

VERSION=1.9.1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CRATE_DIR=$ROOT/third_party/llguidance
CACHE=${GLMCTL_CACHE:-$HOME/.cache/glmctl}
WORK=$CACHE/llguidance-$VERSION
LIB_DIR=$WORK/lib
LIB=$LIB_DIR/libllguidance.a

log() { echo "build-llguidance: $*" >&2; }

for tool in cargo rustc sha256sum nm; do
	command -v "$tool" >/dev/null || { log "missing tool: $tool"; exit 1; }
done

stamp=$( { echo "$VERSION"; rustc --version; cat "$CRATE_DIR/Cargo.toml" "$CRATE_DIR/Cargo.lock" "$CRATE_DIR/src/lib.rs"; } | sha256sum | cut -d' ' -f1)
if [[ -f $LIB && -f $LIB_DIR/stamp && $(cat "$LIB_DIR/stamp") == "$stamp" ]]; then
	log "up to date: $LIB"
	echo "$LIB_DIR"
	exit 0
fi

BUILD=$WORK/src
rm -rf "$BUILD"
mkdir -p "$BUILD" "$LIB_DIR"
cp -r "$CRATE_DIR/Cargo.toml" "$CRATE_DIR/Cargo.lock" "$CRATE_DIR/src" "$BUILD"/

log "cargo build --release (about 50 crates; a minute or two on 2 cores)"
(cd "$BUILD" && cargo build --release --locked --lib >&2)

# The C API must be in the archive (pkg/grammar links against these).
syms=$(nm -g --defined-only "$BUILD/target/release/libllguidance.a" 2>/dev/null | awk '$2 == "T" {print $3}')
for sym in llg_new_tokenizer_v2 llg_new_matcher llg_matcher_compute_mask_into llg_free_matcher; do
	if ! grep -qx "$sym" <<<"$syms"; then
		log "symbol $sym missing from libllguidance.a"
		exit 1
	fi
done

# The header pkg/grammar vendors must be the one of the crate we built.
hdr=$(cd "$BUILD" && cargo metadata --format-version 1 --locked 2>/dev/null |
	sed -n 's/.*"manifest_path":"\([^"]*\/llguidance-'"$VERSION"'\/Cargo.toml\)".*/\1/p' | head -1)
hdr=${hdr%/Cargo.toml}/llguidance.h
if [[ -f $hdr ]] && ! cmp -s "$hdr" "$ROOT/pkg/grammar/llguidance.h"; then
	log "warning: pkg/grammar/llguidance.h differs from $hdr"
fi

cp "$BUILD/target/release/libllguidance.a" "$LIB.tmp"
mv "$LIB.tmp" "$LIB"
echo "$stamp" >"$LIB_DIR/stamp"
rm -rf "$BUILD"
log "built $LIB ($(du -h "$LIB" | cut -f1))"
echo "$LIB_DIR"
