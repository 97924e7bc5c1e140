package backend

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/glmctl/glmctl/pkg/backend/cuda"
	"github.com/glmctl/glmctl/pkg/cudabuild"
)

const tinyModel = "../../testdata/models/tiny-f32"

func TestChoose(t *testing.T) {
	h200 := []cudabuild.GPU{{Index: 0, Name: "NVIDIA H200", Major: 9, Minor: 0}}
	noGPU := func() ([]cudabuild.GPU, error) {
		return nil, errors.New("no NVIDIA driver/GPU found (nvml: ERROR_LIBRARY_NOT_FOUND)")
	}
	gpu := func() ([]cudabuild.GPU, error) { return h200, nil }
	lib := func(cuda.Options) (string, error) { return "/cache/libglmcuda.so", nil }
	noLib := func(cuda.Options) (string, error) { return "", cudabuild.ErrNotBuilt }
	count := func(n int, err error) func(string) (int, error) {
		return func(string) (int, error) { return n, err }
	}
	tests := []struct {
		name, backend string
		p             probe
		want          string
		reasonParts   []string
	}{
		{"cpu requested", "cpu", probe{gpu, lib, count(1, nil)}, CPU, []string{"requested"}},
		{"cuda requested", "CUDA", probe{noGPU, noLib, count(0, nil)}, CUDA, []string{"requested"}},
		{"auto: GPU and library", "auto", probe{gpu, lib, count(0, errors.New("unused"))}, CUDA, []string{"NVIDIA H200", "/cache/libglmcuda.so"}},
		{"empty means auto", "", probe{gpu, lib, nil}, CUDA, nil},
		{"auto: GPU, no library", "auto", probe{gpu, noLib, nil}, CPU, []string{"NVIDIA H200", "run `glmctl build`"}},
		{"auto: no GPU, no library", "auto", probe{noGPU, noLib, nil}, CPU, []string{"no GPU", "nvml"}},
		{"auto: no NVML, runtime sees 2", "auto", probe{noGPU, lib, count(2, nil)}, CUDA, []string{"2 CUDA device(s)"}},
		{"auto: no NVML, runtime sees none", "auto", probe{noGPU, lib, count(0, errors.New("glmrt_device_count: no CUDA driver"))}, CPU, []string{"no CUDA driver"}},
		{"auto: NVML says 0, runtime 0", "auto", probe{func() ([]cudabuild.GPU, error) { return nil, nil }, lib, count(0, nil)}, CPU, []string{"no GPU visible"}},
	}
	for _, tt := range tests {
		c, err := tt.p.choose(tt.backend, Options{})
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if c.Name != tt.want {
			t.Errorf("%s: chose %s (%s), want %s", tt.name, c.Name, c.Reason, tt.want)
		}
		for _, p := range tt.reasonParts {
			if !strings.Contains(c.Reason, p) {
				t.Errorf("%s: reason %q lacks %q", tt.name, c.Reason, p)
			}
		}
		if c.Name == CUDA && tt.backend != "CUDA" && c.LibPath != "/cache/libglmcuda.so" {
			t.Errorf("%s: LibPath %q", tt.name, c.LibPath)
		}
	}
	if _, err := machine.choose("tpu", Options{}); err == nil || !strings.Contains(err.Error(), "want one of auto, cpu, cuda") {
		t.Errorf("unknown backend: %v", err)
	}
}

func TestOpenCPU(t *testing.T) {
	b, err := Open(context.Background(), "cpu", tinyModel, Options{KVBlockSize: 16, NumKVBlocks: 32, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if info := b.Info(); info.Name != "cpu" || info.KVBlockSize != 16 || info.NumKVBlocks != 32 || info.VocabSize != 1040 {
		t.Errorf("Info = %+v", info)
	}
}

// TestOpenCUDA opens the CUDA backend on the test double of the runtime
// (pkg/backend/cuda/testdata/fake_glmrt.c), explicitly and through auto.
func TestOpenCUDA(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "libglmcuda.so")
	if msg, err := exec.Command("gcc", "-shared", "-fPIC", "-O1", "-I../../cuda/include", "-o", fake, "cuda/testdata/fake_glmrt.c", "-lpthread").CombinedOutput(); err != nil {
		t.Fatalf("build fake runtime: %v\n%s", err, msg)
	}
	b, err := Open(context.Background(), "cuda", tinyModel, Options{LibPath: fake, KVBlockSize: 8, NumKVBlocks: 10})
	if err != nil {
		t.Fatal(err)
	}
	if info := b.Info(); info.Name != "cuda" || info.KVBlockSize != 8 || info.NumKVBlocks != 10 {
		t.Errorf("Info = %+v", info)
	}
	b.Close()

	// auto with the library given: the fake reports 3 devices when NVML
	// finds none, so auto must pick CUDA here too.
	saved := machine
	defer func() { machine = saved }()
	machine.gpus = func() ([]cudabuild.GPU, error) { return nil, cudabuild.ErrNoGPU }
	b, err = Open(context.Background(), "auto", tinyModel, Options{LibPath: fake})
	if err != nil {
		t.Fatal(err)
	}
	if b.Info().Name != "cuda" {
		t.Errorf("auto with a runtime seeing 3 devices opened %s", b.Info().Name)
	}
	b.Close()

	if _, err := Open(context.Background(), "cuda", tinyModel, Options{LibPath: "libm.so.6"}); err == nil || !strings.Contains(err.Error(), "missing symbol glmrt_abi_version") {
		t.Errorf("cuda with libm: %v", err)
	}
}

// TestOpenAutoHere runs auto against this machine for real: without a GPU
// or without a built library it must open the CPU backend.
func TestOpenAutoHere(t *testing.T) {
	t.Setenv(cuda.LibEnv, "")
	c, err := Choose("auto", Options{CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if c.Name != CPU || c.Reason == "" {
		t.Fatalf("auto with an empty cache chose %+v, want cpu with a reason", c)
	}
	b, err := Open(context.Background(), "auto", tinyModel, Options{CacheDir: t.TempDir(), Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.Info().Name != "cpu" {
		t.Errorf("auto opened %s", b.Info().Name)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Open(ctx, "cpu", tinyModel, Options{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Open with a canceled context: %v", err)
	}
}

// TestParseKVCacheDType: the --kv-cache-dtype spellings, and an unknown one
// named in its error.
func TestParseKVCacheDType(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", KVAuto}, {"auto", KVAuto}, {"BF16", KVBF16}, {"fp8", KVFP8}, {"fp8_e4m3", KVFP8},
	} {
		got, err := ParseKVCacheDType(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseKVCacheDType(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	if _, err := ParseKVCacheDType("int4"); err == nil || !strings.Contains(err.Error(), `"int4"`) {
		t.Errorf("ParseKVCacheDType(int4): %v, want an error naming it", err)
	}
}

// TestOpenCPUKVFP8: the CPU reference refuses an FP8 (or BF16) KV cache by
// name rather than silently keeping float32.
func TestOpenCPUKVFP8(t *testing.T) {
	for _, kv := range []string{KVFP8, KVBF16} {
		_, err := Open(context.Background(), CPU, "../../testdata/models/tiny-f32", Options{KVCacheDType: kv})
		if err == nil || !strings.Contains(err.Error(), "--kv-cache-dtype "+kv) {
			t.Errorf("cpu with KV %s: %v, want an error naming --kv-cache-dtype %s", kv, err, kv)
		}
	}
}
