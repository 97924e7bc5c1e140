package cudabuild

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	cudasrc "github.com/glmctl/glmctl/cuda"
)

// fakeNVCC is a stand-in for nvcc that checks the arguments Build passes,
// records them, writes an object per unit and links a real shared library
// (gcc) exporting the ABI symbols, so Build's orchestration, cache and
// export check run without CUDA. FAKE_NVCC_FAIL makes one unit fail.
const fakeNVCC = `#!/bin/sh
echo "$*" >> "$FAKE_NVCC_LOG"
mode=""; out=""; unit=""; prev=""
for a in "$@"; do
  case "$a" in
    --version) echo "nvcc: fake"; echo "Cuda compilation tools, release 99.0, V99.0.${FAKE_NVCC_BUILD:-1}"; exit 0 ;;
    -c) mode=compile ;;
    -shared) mode=link ;;
  esac
  [ "$prev" = "-o" ] && out="$a"
  [ "$prev" = "-c" ] && unit="$a"
  prev="$a"
done
case "$mode" in
  compile)
    [ -f "$unit" ] || { echo "fake nvcc: $unit: no such file in $(pwd)" >&2; exit 3; }
    [ -f include/glmrt.h ] || { echo "fake nvcc: include/glmrt.h not extracted" >&2; exit 3; }
    if [ "$unit" = "$FAKE_NVCC_FAIL" ]; then echo "$unit(1): error: fake failure" >&2; exit 2; fi
    echo "object of $unit" > "$out" ;;
  link)
    exec gcc -shared -fPIC -o "$out" "$FAKE_NVCC_STUB" ;;
  *) echo "fake nvcc: neither -c nor -shared: $*" >&2; exit 4 ;;
esac
`

type fakeToolchain struct {
	nvcc, log, stub string
}

// newFakeToolchain installs the fake nvcc and a C stub defining every ABI
// function except omit.
func newFakeToolchain(t *testing.T, omit string) fakeToolchain {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Fatalf("gcc is needed to link the fake library: %v", err)
	}
	dir := t.TempDir()
	f := fakeToolchain{nvcc: filepath.Join(dir, "bin", "nvcc"), log: filepath.Join(dir, "nvcc.log"), stub: filepath.Join(dir, "stub.c")}
	writeExe(t, f.nvcc, fakeNVCC)
	syms, err := ABISymbols()
	if err != nil {
		t.Fatal(err)
	}
	var c strings.Builder
	for _, s := range syms {
		if s != omit {
			fmt.Fprintf(&c, "int %s(void) { return 0; }\n", s)
		}
	}
	if err := os.WriteFile(f.stub, []byte(c.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("FAKE_NVCC_LOG", f.log)
	t.Setenv("FAKE_NVCC_STUB", f.stub)
	t.Setenv("FAKE_NVCC_FAIL", "")
	t.Setenv("FAKE_NVCC_BUILD", "1")
	t.Setenv("NCCL_HOME", "")
	return f
}

// calls returns the fake nvcc invocations so far, one per line.
func (f fakeToolchain) calls(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(f.log)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func countCalls(calls []string, part string) int {
	n := 0
	for _, c := range calls {
		if strings.Contains(c, part) {
			n++
		}
	}
	return n
}

func TestBuildWithFakeToolchain(t *testing.T) {
	f := newFakeToolchain(t, "")
	cache := t.TempDir()
	var log bytes.Buffer
	ctx := context.Background()
	o := Options{Arch: "90a", NVCC: f.nvcc, CacheDir: cache, Jobs: 2, Log: &log}
	lib, err := Build(ctx, o)
	if err != nil {
		t.Fatalf("Build: %v\nlog:\n%s", err, log.String())
	}
	abi, err := ABIVersion()
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(fmt.Sprintf(`^%s/libglmcuda/abi%d-[0-9a-f]{16}/sm_90a/libglmcuda\.so$`, regexp.QuoteMeta(cache), abi))
	if !re.MatchString(lib) {
		t.Fatalf("library path %s does not match %s", lib, re)
	}
	if _, err := elf.Open(lib); err != nil {
		t.Fatalf("built library is not ELF: %v", err)
	}
	units := cudasrc.Units()
	calls := f.calls(t)
	if got := countCalls(calls, " -c "); got != len(units) {
		t.Errorf("compiled %d units, want %d:\n%s", got, len(units), strings.Join(calls, "\n"))
	}
	for _, u := range units {
		if countCalls(calls, "-c "+u+" -o ") != 1 {
			t.Errorf("unit %s not compiled exactly once", u)
		}
	}
	for _, c := range calls {
		if strings.Contains(c, " -c ") {
			for _, flag := range []string{"-O3", "-std=c++17", "-Xcompiler -fPIC", "-gencode=arch=compute_90a,code=sm_90a", "-Iinclude"} {
				if !strings.Contains(c, flag) {
					t.Errorf("compile command lacks %s: %s", flag, c)
				}
			}
		}
	}
	if got := countCalls(calls, "-shared"); got != 1 {
		t.Errorf("linked %d times, want 1", got)
	}
	for _, l := range linkLibs {
		if countCalls(calls, l) != 1 {
			t.Errorf("link command lacks %s", l)
		}
	}
	m, err := readManifest(filepath.Join(filepath.Dir(lib), manifestName))
	if err != nil {
		t.Fatal(err)
	}
	if m.Arch != "sm_90a" || m.ABIVersion != abi || m.SourcesDigest != SourcesDigest() || !slices.Equal(m.Units, units) || !strings.Contains(m.NVCCVersion, "V99.0.1") {
		t.Errorf("manifest %+v does not describe the build", m)
	}

	// A second build with the same inputs is a cache hit: only --version runs.
	before := len(f.calls(t))
	lib2, err := Build(ctx, o)
	if err != nil || lib2 != lib {
		t.Fatalf("second Build = %s, %v; want %s", lib2, err, lib)
	}
	if got := f.calls(t)[before:]; len(got) != 1 || !strings.Contains(got[0], "--version") {
		t.Errorf("cache hit ran nvcc %q, want only --version", got)
	}
	if !strings.Contains(log.String(), "up to date") {
		t.Errorf("log does not say up to date:\n%s", log.String())
	}

	// Force rebuilds into the same place.
	before = len(f.calls(t))
	o.Force = true
	if lib3, err := Build(ctx, o); err != nil || lib3 != lib {
		t.Fatalf("forced Build = %s, %v", lib3, err)
	}
	if got := countCalls(f.calls(t)[before:], " -c "); got != len(units) {
		t.Errorf("forced build compiled %d units, want %d", got, len(units))
	}
	o.Force = false

	// Another arch: same key directory, its own arch directory.
	o.Arch = "sm_100a"
	lib100, err := Build(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(filepath.Dir(lib100)) != filepath.Dir(filepath.Dir(lib)) || filepath.Base(filepath.Dir(lib100)) != "sm_100a" {
		t.Errorf("sm_100a library at %s, sm_90a at %s", lib100, lib)
	}
	// Another nvcc build: another key.
	t.Setenv("FAKE_NVCC_BUILD", "2")
	o.Arch = "sm_90a"
	libV2, err := Build(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if libV2 == lib {
		t.Errorf("a different nvcc version reused %s", lib)
	}

	found, err := FindLibrary(cache, "sm_90a")
	if err != nil {
		t.Fatal(err)
	}
	if found.Path != libV2 || !found.Current {
		t.Errorf("FindLibrary = %+v, want the newest current build %s", found, libV2)
	}
}

func TestBuildCompileErrorNamesUnit(t *testing.T) {
	f := newFakeToolchain(t, "")
	units := cudasrc.Units()
	bad := units[len(units)-1]
	t.Setenv("FAKE_NVCC_FAIL", bad)
	cache := t.TempDir()
	_, err := Build(context.Background(), Options{Arch: "sm_90a", NVCC: f.nvcc, CacheDir: cache, Jobs: 1})
	if err == nil {
		t.Fatal("Build succeeded although a unit failed to compile")
	}
	for _, part := range []string{"nvcc " + bad, "fake failure"} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("error %q lacks %q", err, part)
		}
	}
	if _, ferr := FindLibrary(cache, "sm_90a"); !errors.Is(ferr, ErrNotBuilt) {
		t.Errorf("a failed build left a library behind: %v", ferr)
	}
}

func TestBuildMissingExport(t *testing.T) {
	f := newFakeToolchain(t, "glmrt_step")
	_, err := Build(context.Background(), Options{Arch: "sm_90a", NVCC: f.nvcc, CacheDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "does not export glmrt_step") {
		t.Fatalf("Build error = %v, want it to name the missing glmrt_step", err)
	}
}

func TestBuildWithoutNVCC(t *testing.T) {
	_, err := Build(context.Background(), Options{Check: true, NVCC: "/nonexistent/bin/nvcc", CacheDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "--nvcc /nonexistent/bin/nvcc") {
		t.Fatalf("Build error = %v, want it to name the missing nvcc", err)
	}
}

func TestBuildWithoutArchNeedsGPU(t *testing.T) {
	f := newFakeToolchain(t, "")
	_, gerr := DetectGPUs()
	lib, err := Build(context.Background(), Options{NVCC: f.nvcc, CacheDir: t.TempDir()})
	if gerr != nil {
		if err == nil || !strings.Contains(err.Error(), "no NVIDIA driver/GPU found") || !strings.Contains(err.Error(), "pass --arch") {
			t.Fatalf("Build without GPU or --arch: %v; want the no-GPU error", err)
		}
		return
	}
	if err != nil || lib == "" {
		t.Fatalf("Build with a GPU present: %s, %v", lib, err)
	}
}

func TestCacheKey(t *testing.T) {
	files := map[string]string{"include/glmrt.h": "#define X 1\n", "kernels/a.cu": "a", "runtime/b.cu": "b"}
	read := func(m map[string]string) func(string) ([]byte, error) {
		return func(p string) ([]byte, error) {
			s, ok := m[p]
			if !ok {
				return nil, os.ErrNotExist
			}
			return []byte(s), nil
		}
	}
	names := []string{"include/glmrt.h", "kernels/a.cu", "runtime/b.cu"}
	tc := toolchain{version: "release 13.0, V13.0.88"}
	flags := []string{"-O3", "-gencode=arch=compute_ARCH,code=sm_ARCH"}
	key := func(abi int, m map[string]string, names []string, tc toolchain, flags []string) string {
		t.Helper()
		k, err := computeKey(abi, names, read(m), tc, flags)
		if err != nil {
			t.Fatal(err)
		}
		if len(k) != keyLen {
			t.Fatalf("key %q has %d digits, want %d", k, len(k), keyLen)
		}
		return k
	}
	base := key(1, files, names, tc, flags)
	if again := key(1, files, names, tc, flags); again != base {
		t.Fatalf("key not deterministic: %s vs %s", base, again)
	}
	changed := map[string]string{}
	for k, v := range files {
		changed[k] = v
	}
	changed["kernels/a.cu"] = "a2"
	renamed := map[string]string{"include/glmrt.h": files["include/glmrt.h"], "kernels/z.cu": "a", "runtime/b.cu": "b"}
	variants := map[string]string{
		"source content": key(1, changed, names, tc, flags),
		"source name":    key(1, renamed, []string{"include/glmrt.h", "kernels/z.cu", "runtime/b.cu"}, tc, flags),
		"fewer sources":  key(1, files, names[:2], tc, flags),
		"abi":            key(2, files, names, tc, flags),
		"nvcc version":   key(1, files, names, toolchain{version: "release 13.1, V13.1.2"}, flags),
		"flags":          key(1, files, names, tc, []string{"-O2", flags[1]}),
	}
	for what, k := range variants {
		if k == base {
			t.Errorf("changing the %s did not change the cache key", what)
		}
	}
	if _, err := computeKey(1, []string{"missing.cu"}, read(files), tc, flags); err == nil {
		t.Error("computeKey accepted an unreadable input")
	}
}

func TestFindLibrary(t *testing.T) {
	cache := t.TempDir()
	abi, err := ABIVersion()
	if err != nil {
		t.Fatal(err)
	}
	put := func(key, arch, digest, when string, manifest bool) string {
		t.Helper()
		dir := filepath.Join(cache, libDirName, fmt.Sprintf("abi%d-%s", abi, key), arch)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		lib := filepath.Join(dir, LibName)
		if err := os.WriteFile(lib, []byte("\x7fELF"), 0o755); err != nil {
			t.Fatal(err)
		}
		if manifest {
			js := fmt.Sprintf(`{"abi_version":%d,"arch":%q,"sources_digest":%q,"built_at":%q}`, abi, arch, digest, when)
			if err := os.WriteFile(filepath.Join(dir, manifestName), []byte(js), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return lib
	}
	if _, err := FindLibrary(cache, "sm_90a"); !errors.Is(err, ErrNotBuilt) || !strings.Contains(err.Error(), "run `glmctl build`") {
		t.Fatalf("empty cache: %v, want ErrNotBuilt", err)
	}
	put("cccccccccccccccc", "sm_90a", SourcesDigest(), "2030-01-01T00:00:00Z", false) // no manifest: ignored
	old := put("aaaaaaaaaaaaaaaa", "sm_90a", "other-sources", "2026-02-01T00:00:00Z", true)
	put("dddddddddddddddd", "sm_100a", SourcesDigest(), "2026-03-01T00:00:00Z", true)
	got, err := FindLibrary(cache, "90a")
	if err != nil || got.Path != old || got.Current {
		t.Fatalf("FindLibrary = %+v, %v; want the only sm_90a build %s (not current)", got, err, old)
	}
	cur := put("bbbbbbbbbbbbbbbb", "sm_90a", SourcesDigest(), "2026-01-01T00:00:00Z", true)
	got, err = FindLibrary(cache, "sm_90a")
	if err != nil || got.Path != cur || !got.Current {
		t.Fatalf("FindLibrary = %+v, %v; want the build of this binary's sources %s", got, err, cur)
	}
	// A library of another ABI version is never picked.
	otherABI := filepath.Join(cache, libDirName, fmt.Sprintf("abi%d-eeeeeeeeeeeeeeee", abi+1), "sm_89")
	if err := os.MkdirAll(otherABI, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(otherABI, LibName), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := FindLibrary(cache, "sm_89"); !errors.Is(err, ErrNotBuilt) {
		t.Fatalf("FindLibrary picked another ABI's library: %v", err)
	}
	if _, err := FindLibrary(cache, "bogus"); err == nil {
		t.Fatal("FindLibrary accepted a bogus arch")
	}
}

func TestABIFromHeader(t *testing.T) {
	v, err := ABIVersion()
	if err != nil || v < 1 {
		t.Fatalf("ABIVersion = %d, %v", v, err)
	}
	syms, err := ABISymbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"glmrt_abi_version", "glmrt_last_error", "glmrt_engine_create", "glmrt_load_tensor", "glmrt_finalize", "glmrt_step", "glmrt_engine_destroy"} {
		if !slices.Contains(syms, want) {
			t.Errorf("ABISymbols %v lacks %s", syms, want)
		}
	}
	for _, s := range syms {
		if !regexp.MustCompile(`^glmrt_[a-z0-9_]+$`).MatchString(s) {
			t.Errorf("odd symbol %q", s)
		}
	}
}

// TestEmbeddedSources checks what cudasrc embeds: the header, units under
// the source directories only, nothing from tests/.
func TestEmbeddedSources(t *testing.T) {
	inputs := cudasrc.Inputs()
	if !slices.Contains(inputs, HeaderPath) {
		t.Errorf("inputs %v lack %s", inputs, HeaderPath)
	}
	units := cudasrc.Units()
	if len(units) == 0 {
		t.Fatal("no units embedded")
	}
	for _, u := range units {
		if !regexp.MustCompile(`^(kernels|runtime|comm)/[^/]+\.(cu|cc|cpp)$`).MatchString(u) {
			t.Errorf("unexpected unit %s", u)
		}
	}
	for _, f := range inputs {
		if strings.HasPrefix(f, "tests/") {
			t.Errorf("test source %s embedded", f)
		}
	}
}

// TestFlagsMatchBuildScript keeps cuda/build.sh (for humans) and the Go flag
// list (what glmctl build runs) the same command.
func TestFlagsMatchBuildScript(t *testing.T) {
	b, err := cudasrc.FS.ReadFile("build.sh")
	if err != nil {
		t.Fatal(err)
	}
	script := strings.ReplaceAll(string(b), "\\\n", " ")
	var line string
	for _, l := range strings.Split(script, "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "nvcc ") && strings.Contains(l, "libglmcuda.so") {
			line = l
			break
		}
	}
	if line == "" {
		t.Fatal("cuda/build.sh has no nvcc command producing libglmcuda.so")
	}
	var scriptFlags, scriptDirs []string
	fields := strings.Fields(line)[1:]
	for i := 0; i < len(fields); i++ {
		f := fields[i]
		switch {
		case f == "-o":
			i++ // the output
		case f == "-shared":
		case f == `"$gencode"`:
			scriptFlags = append(scriptFlags, "GENCODE")
		case strings.HasPrefix(f, "-Icuda/"):
			scriptFlags = append(scriptFlags, "-I"+strings.TrimPrefix(f, "-Icuda/"))
		case strings.HasPrefix(f, "-"):
			scriptFlags = append(scriptFlags, f)
		case strings.HasPrefix(f, "cuda/"):
			m := regexp.MustCompile(`^cuda/([a-z]+)/\*\.(cu|cc|cpp)$`).FindStringSubmatch(f)
			if m == nil {
				t.Fatalf("build.sh source argument %q is not a cuda/<dir>/*.cu glob", f)
			}
			scriptDirs = append(scriptDirs, m[1])
		default:
			t.Fatalf("build.sh nvcc argument %q not understood; update TestFlagsMatchBuildScript and the Go flags", f)
		}
	}
	goFlags := append(append([]string{}, baseFlags...), "GENCODE")
	for _, d := range srcIncludeDirs {
		goFlags = append(goFlags, "-I"+d)
	}
	goFlags = append(goFlags, linkLibs...)
	slices.Sort(goFlags)
	slices.Sort(scriptFlags)
	if !slices.Equal(goFlags, scriptFlags) {
		t.Errorf("cuda/build.sh flags %v != pkg/cudabuild flags %v", scriptFlags, goFlags)
	}
	slices.Sort(scriptDirs)
	wantDirs := []string{"comm", "kernels", "runtime"}
	if !slices.Equal(scriptDirs, wantDirs) {
		t.Errorf("cuda/build.sh compiles %v, cudasrc.Units covers %v", scriptDirs, wantDirs)
	}
}

// Progress follows the units and the link, and replaces the per-unit lines.
func TestBuildProgress(t *testing.T) {
	f := newFakeToolchain(t, "")
	var (
		log   bytes.Buffer
		mu    sync.Mutex
		calls []string
	)
	o := Options{Arch: "90a", NVCC: f.nvcc, CacheDir: t.TempDir(), Jobs: 2, Log: &log,
		Progress: func(done, total int) {
			mu.Lock()
			calls = append(calls, fmt.Sprintf("%d/%d", done, total))
			mu.Unlock()
		}}
	if _, err := Build(context.Background(), o); err != nil {
		t.Fatalf("Build: %v\nlog:\n%s", err, log.String())
	}
	n := len(cudasrc.Units()) + 1
	if len(calls) != n+1 || calls[0] != fmt.Sprintf("0/%d", n) || calls[n] != fmt.Sprintf("%d/%d", n, n) {
		t.Errorf("progress calls %v, want 0/%d .. %d/%d", calls, n, n, n)
	}
	if strings.Contains(log.String(), "] compiled ") {
		t.Errorf("per-unit lines beside Progress:\n%s", log.String())
	}
}
