// Package cudabuild compiles libglmcuda.so, the CUDA runtime of glmctl, from
// the sources embedded in the binary (package cudasrc, cuda/embed.go) with
// nvcc, into a content-addressed cache directory. It is what `glmctl build`
// runs; cuda/build.sh is the same command for humans, and a test keeps the two
// flag lists identical.
package cudabuild

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	cudasrc "github.com/glmctl/glmctl/cuda"
)

// LibName is the file name of the built library.
const LibName = "libglmcuda.so"

// maxJobs caps parallel nvcc processes: each takes 1-3 GB of memory on the
// bigger kernels, and there are few enough units that more would idle.
const maxJobs = 16

// The nvcc command of cuda/build.sh, split into what every translation unit
// is compiled with and what the shared library is linked with. The gencode
// flag (Gencode) and the toolchain's include/library directories are added
// per build. Keep in step with cuda/build.sh (TestFlagsMatchBuildScript).
var (
	baseFlags      = []string{"-O3", "-std=c++17", "-Xcompiler", "-fPIC"}
	srcIncludeDirs = []string{"include"} // relative to the extracted cuda/ tree
	linkLibs       = []string{"-lcublasLt", "-lcublas", "-lnccl"}
)

// Options controls Build.
type Options struct {
	// Arch is the target ("sm_90a", "90a", ...). Empty: detected from the
	// GPUs through NVML, or DefaultCheckArch with Check.
	Arch string
	// NVCC is an explicit nvcc path; empty: FindNVCC.
	NVCC string
	// CUDAHome is the toolkit root (bin/nvcc, include/, lib64/ or lib/);
	// empty: the directory above nvcc's bin/.
	CUDAHome string
	// IncludeDirs and LibDirs are extra -I / -L directories, for toolchains
	// spread over several directories (the PyPI wheels put NCCL apart from
	// the rest; $NCCL_HOME is added automatically when set).
	IncludeDirs, LibDirs []string
	// CacheDir is the glmctl cache root; empty: DefaultCacheDir().
	CacheDir string
	// Check compiles and links for DefaultCheckArch (unless Arch is set)
	// without looking for a GPU: the CI mode.
	Check bool
	// Force rebuilds even when the cache already holds the library.
	Force bool
	// Jobs is the number of parallel nvcc processes (0: one per CPU, at most 16).
	Jobs int
	// Verbose logs every nvcc command line.
	Verbose bool
	// Log receives progress and compiler warnings (nil: discarded).
	Log io.Writer
	// Progress, if not nil, follows the compile and link steps (the
	// translation units, then the link): it is called with done = 0 before
	// the first, and after each. The "[i/n] compiled" lines are then left
	// out of Log (a progress bar shows them).
	Progress func(done, total int)
}

// toolchain is a resolved nvcc with the directories it builds against.
type toolchain struct {
	nvcc        string
	version     string // nvcc --version output
	includeDirs []string
	libDirs     []string
}

// plan is everything that determines the library's bytes.
type plan struct {
	abi    int
	arch   string
	tc     toolchain
	units  []string
	inputs []string
	key    string
}

// Build compiles the embedded sources into
// <cache>/libglmcuda/abi<N>-<key>/<arch>/libglmcuda.so and returns that path.
// The key hashes the sources, the flags and the exact nvcc version, so an
// existing library is reused as is (unless Force).
func Build(ctx context.Context, o Options) (string, error) {
	log := o.Log
	if log == nil {
		log = io.Discard
	}
	arch, err := resolveArch(o, log)
	if err != nil {
		return "", err
	}
	tc, err := resolveToolchain(ctx, o)
	if err != nil {
		return "", err
	}
	cacheDir := o.CacheDir
	if cacheDir == "" {
		if cacheDir, err = DefaultCacheDir(); err != nil {
			return "", err
		}
	}
	p, err := newPlan(arch, tc)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cacheDir, libDirName, fmt.Sprintf("abi%d-%s", p.abi, p.key), arch)
	lib := filepath.Join(dir, LibName)
	if !o.Force {
		if _, err := os.Stat(lib); err == nil {
			if _, err := readManifest(filepath.Join(dir, manifestName)); err == nil {
				fmt.Fprintf(log, "libglmcuda: up to date (%s, %s)\n", arch, releaseLine(tc.version))
				return lib, nil
			}
		}
	}
	fmt.Fprintf(log, "libglmcuda: building for %s with %s (%s), %d units\n", arch, tc.nvcc, releaseLine(tc.version), len(p.units))
	start := time.Now()
	work, err := os.MkdirTemp("", "glmctl-cudabuild-")
	if err != nil {
		return "", fmt.Errorf("create build directory: %w", err)
	}
	defer os.RemoveAll(work)
	built, err := p.compileAndLink(ctx, work, o, log)
	if err != nil {
		return "", err
	}
	syms, err := ABISymbols()
	if err != nil {
		return "", err
	}
	if err := checkExports(built, syms); err != nil {
		return "", err
	}
	m := Manifest{
		ABIVersion: p.abi, Arch: arch, Key: p.key, SourcesDigest: SourcesDigest(),
		NVCC: tc.nvcc, NVCCVersion: tc.version, Units: p.units,
		CompileFlags: p.compileFlags(), LinkFlags: p.linkFlags(), Check: o.Check,
		BuiltAt: time.Now().UTC(), // full resolution: FindLibrary prefers the newest build
	}
	if err := install(dir, built, m); err != nil {
		return "", err
	}
	fmt.Fprintf(log, "libglmcuda: built in %s\n", time.Since(start).Round(100*time.Millisecond))
	return lib, nil
}

func resolveArch(o Options, log io.Writer) (string, error) {
	if o.Arch != "" {
		return NormalizeArch(o.Arch)
	}
	if o.Check {
		return DefaultCheckArch, nil
	}
	arch, gpus, err := DetectArch()
	if err != nil {
		return "", err
	}
	fmt.Fprintf(log, "libglmcuda: detected %d GPU(s), GPU 0 %s (compute capability %d.%d) -> %s\n",
		len(gpus), gpus[0].Name, gpus[0].Major, gpus[0].Minor, arch)
	return arch, nil
}

func resolveToolchain(ctx context.Context, o Options) (toolchain, error) {
	nvcc, err := FindNVCC(o.NVCC, o.CUDAHome)
	if err != nil {
		return toolchain{}, err
	}
	if abs, err := filepath.Abs(nvcc); err == nil {
		nvcc = abs
	}
	version, err := nvccVersion(ctx, nvcc)
	if err != nil {
		return toolchain{}, err
	}
	home := o.CUDAHome
	if home == "" {
		home = filepath.Dir(filepath.Dir(nvcc))
	}
	tc := toolchain{nvcc: nvcc, version: version}
	// nvcc finds its own headers; the libraries may sit in lib64/ (toolkit
	// installs) or lib/ (PyPI wheels), which nvcc.profile does not always name.
	for _, d := range []string{filepath.Join(home, "lib64"), filepath.Join(home, "lib")} {
		if isDir(d) {
			tc.libDirs = append(tc.libDirs, d)
		}
	}
	if nccl := os.Getenv("NCCL_HOME"); nccl != "" {
		tc.includeDirs = append(tc.includeDirs, filepath.Join(nccl, "include"))
		tc.libDirs = append(tc.libDirs, filepath.Join(nccl, "lib"))
	}
	for _, d := range o.IncludeDirs {
		if !isDir(d) {
			return toolchain{}, fmt.Errorf("include directory %s: not a directory", d)
		}
		tc.includeDirs = append(tc.includeDirs, d)
	}
	for _, d := range o.LibDirs {
		if !isDir(d) {
			return toolchain{}, fmt.Errorf("library directory %s: not a directory", d)
		}
		tc.libDirs = append(tc.libDirs, d)
	}
	return tc, nil
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

func newPlan(arch string, tc toolchain) (*plan, error) {
	abi, err := ABIVersion()
	if err != nil {
		return nil, err
	}
	p := &plan{abi: abi, arch: arch, tc: tc, units: cudasrc.Units(), inputs: cudasrc.Inputs()}
	if len(p.units) == 0 {
		return nil, errors.New("no CUDA translation units embedded in this binary (cuda/kernels, cuda/runtime, cuda/comm)")
	}
	if err := p.checkArchFeatures(); err != nil {
		return nil, err
	}
	if p.key, err = p.cacheKey(); err != nil {
		return nil, err
	}
	return p, nil
}

// checkArchFeatures refuses pre-Hopper targets when the sources use wgmma,
// which only sm_90a has, so the failure names the cause instead of being a
// ptxas error deep in a kernel.
func (p *plan) checkArchFeatures() error {
	if archNumber(p.arch) >= 90 {
		return nil
	}
	for _, u := range p.units {
		b, err := cudasrc.FS.ReadFile(u)
		if err != nil {
			return fmt.Errorf("embedded %s: %w", u, err)
		}
		if bytes.Contains(b, []byte("wgmma.")) {
			return fmt.Errorf("target %s: the runtime uses Hopper wgmma instructions (%s), which need sm_90a; this GPU/arch is older", p.arch, u)
		}
	}
	return nil
}

// compileFlags are the flags of every translation unit (without -c/-o).
func (p *plan) compileFlags() []string {
	f := append([]string{}, baseFlags...)
	f = append(f, Gencode(p.arch))
	for _, d := range srcIncludeDirs {
		f = append(f, "-I"+d)
	}
	for _, d := range p.tc.includeDirs {
		f = append(f, "-I"+d)
	}
	return f
}

// linkFlags are the flags of the shared-library link (without objects/-o).
// The library directories also go in as rpath so the library finds
// cuBLAS/NCCL at dlopen time even where they are not in the loader's path.
func (p *plan) linkFlags() []string {
	f := []string{"-shared", Gencode(p.arch)}
	for _, d := range p.tc.libDirs {
		f = append(f, "-L"+d)
	}
	for _, d := range p.tc.libDirs {
		if !strings.Contains(d, ",") { // nvcc splits -Xlinker on commas
			f = append(f, "-Xlinker", "-rpath,"+d)
		}
	}
	return append(f, linkLibs...)
}

// objectName flattens a unit path into one object file name.
func objectName(unit string) string {
	return strings.NewReplacer("/", "_", ".", "_").Replace(unit) + ".o"
}

func (p *plan) compileAndLink(ctx context.Context, work string, o Options, log io.Writer) (string, error) {
	src := filepath.Join(work, "src")
	objDir := filepath.Join(work, "obj")
	if err := extract(src, p.inputs); err != nil {
		return "", err
	}
	if err := os.MkdirAll(objDir, 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w", objDir, err)
	}
	jobs := o.Jobs
	if jobs <= 0 {
		jobs = min(runtime.NumCPU(), maxJobs)
	}
	jobs = max(1, min(jobs, len(p.units)))
	steps := len(p.units) + 1 // the units, then the link
	if o.Progress != nil {
		o.Progress(0, steps)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		done     int
		errs     = make([]error, len(p.units))
		objs     = make([]string, len(p.units))
		sem      = make(chan struct{}, jobs)
		wg       sync.WaitGroup
		compiled = p.compileFlags()
	)
	for i, u := range p.units {
		objs[i] = filepath.Join(objDir, objectName(u))
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if ctx.Err() != nil {
				errs[i] = ctx.Err()
				return
			}
			args := append(append([]string{}, compiled...), "-c", u, "-o", objs[i])
			out, err := runNVCC(ctx, p.tc.nvcc, src, args, o.Verbose, log, &mu)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs[i] = fmt.Errorf("nvcc %s: %w\n%s", u, err, tail(out, 8000))
				cancel()
				return
			}
			done++
			if o.Progress != nil {
				o.Progress(done, steps)
			} else {
				fmt.Fprintf(log, "libglmcuda: [%d/%d] compiled %s\n", done, len(p.units), u)
			}
			if strings.TrimSpace(out) != "" {
				fmt.Fprintf(log, "%s\n", strings.TrimSpace(out))
			}
		}()
	}
	wg.Wait()
	// Report the first real compile error in unit order; cancellations of the
	// other units are its consequence.
	var canceled error
	for _, err := range errs {
		if err == nil {
			continue
		}
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			canceled = err
			continue
		}
		return "", err
	}
	if canceled != nil {
		return "", fmt.Errorf("build canceled: %w", canceled)
	}
	out := filepath.Join(work, LibName)
	args := append(append([]string{}, p.linkFlags()[:2]...), objs...)
	args = append(append(args, p.linkFlags()[2:]...), "-o", out)
	if msg, err := runNVCC(ctx, p.tc.nvcc, src, args, o.Verbose, log, &mu); err != nil {
		return "", fmt.Errorf("nvcc link %s: %w\n%s", LibName, err, tail(msg, 8000))
	} else if strings.TrimSpace(msg) != "" {
		fmt.Fprintf(log, "%s\n", strings.TrimSpace(msg))
	}
	if o.Progress != nil {
		o.Progress(steps, steps)
	}
	fmt.Fprintf(log, "libglmcuda: linked %s\n", LibName)
	return out, nil
}

// runNVCC runs nvcc in dir and returns its combined output.
func runNVCC(ctx context.Context, nvcc, dir string, args []string, verbose bool, log io.Writer, mu *sync.Mutex) (string, error) {
	if verbose {
		mu.Lock()
		fmt.Fprintf(log, "+ (cd %s && %s %s)\n", dir, nvcc, strings.Join(args, " "))
		mu.Unlock()
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, nvcc, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil && ctx.Err() != nil {
		return out.String(), ctx.Err()
	}
	return out.String(), err
}

// extract writes the embedded inputs under dir, keeping their paths.
func extract(dir string, inputs []string) error {
	for _, f := range inputs {
		b, err := cudasrc.FS.ReadFile(f)
		if err != nil {
			return fmt.Errorf("embedded %s: %w", f, err)
		}
		dst := filepath.Join(dir, filepath.FromSlash(f))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("extract %s: %w", f, err)
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			return fmt.Errorf("extract %s: %w", f, err)
		}
	}
	return nil
}
