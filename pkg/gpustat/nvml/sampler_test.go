//go:build !nonvml

package nvml

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/glmctl/glmctl/pkg/gpustat"
)

// TestRealNVML runs the real sampler. Without a driver (this development
// machine, CI) it must answer a clear gpustat.ErrUnavailable, every time,
// and never panic; on a GPU machine the readings must be sane.
func TestRealNVML(t *testing.T) {
	s := New()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stats, err := s.Sample(ctx)
	if err != nil {
		if !errors.Is(err, gpustat.ErrUnavailable) {
			t.Fatalf("Sample without a usable driver: %v, want it to wrap ErrUnavailable", err)
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "NVML unavailable: ") || !(strings.Contains(msg, LibraryName) || strings.Contains(msg, "driver") || strings.Contains(msg, "init")) {
			t.Fatalf("error %q does not say why NVML is unavailable", msg)
		}
		if _, err2 := s.Sample(ctx); err2 == nil || err2.Error() != msg {
			t.Fatalf("second Sample: %v, want the remembered %q", err2, msg)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close after a failed init: %v", err)
		}
		t.Logf("no GPU here, as expected: %v", err)
		return
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	if len(stats) == 0 {
		t.Fatal("NVML initialised but Sample returned no GPUs and no error")
	}
	for i, g := range stats {
		t.Logf("%s %s: %.1f/%.1f GiB used, util %g%%, %.0f/%.0f W, %g °C, SM %g MHz, missing %s",
			g.Label(), g.UUID, float64(g.MemoryUsedBytes)/(1<<30), float64(g.MemoryTotalBytes)/(1<<30),
			g.GPUUtilPercent, g.PowerWatts, g.PowerLimitWatts, g.TemperatureC, g.SMClockMHz, g.Missing)
		switch {
		case g.Index != i:
			t.Errorf("GPU %d has index %d", i, g.Index)
		case g.Name == "" || !strings.HasPrefix(g.UUID, "GPU-"):
			t.Errorf("GPU %d: name %q uuid %q", i, g.Name, g.UUID)
		case !g.Has(gpustat.FieldMemory) || g.MemoryTotalBytes == 0 || g.MemoryFreeBytes > g.MemoryTotalBytes || g.MemoryUsedBytes > g.MemoryTotalBytes:
			t.Errorf("GPU %d: memory total %d used %d free %d (missing %s)", i, g.MemoryTotalBytes, g.MemoryUsedBytes, g.MemoryFreeBytes, g.Missing)
		case g.GPUUtilPercent < 0 || g.GPUUtilPercent > 100 || g.MemUtilPercent < 0 || g.MemUtilPercent > 100:
			t.Errorf("GPU %d: utilisation %g%% / %g%%", i, g.GPUUtilPercent, g.MemUtilPercent)
		case g.Has(gpustat.FieldTemperature) && (g.TemperatureC <= 0 || g.TemperatureC > 130):
			t.Errorf("GPU %d: temperature %g °C", i, g.TemperatureC)
		case g.Has(gpustat.FieldPower) && (g.PowerWatts <= 0 || g.PowerWatts > 2000):
			t.Errorf("GPU %d: power %g W", i, g.PowerWatts)
		case g.Has(gpustat.FieldSMClock) && (g.SMClockMHz <= 0 || g.SMClockMHz > 5000):
			t.Errorf("GPU %d: SM clock %g MHz", i, g.SMClockMHz)
		}
	}
}

// fakeDevice is a GPU whose every reading succeeds unless overridden.
func fakeDevice(name string, override func(d *mock.Device)) *mock.Device {
	d := &mock.Device{
		GetNameFunc: func() (string, gonvml.Return) { return name, gonvml.SUCCESS },
		GetUUIDFunc: func() (string, gonvml.Return) { return "GPU-" + name, gonvml.SUCCESS },
		GetMemoryInfoFunc: func() (gonvml.Memory, gonvml.Return) {
			return gonvml.Memory{Total: 80 << 30, Used: 30 << 30, Free: 50 << 30}, gonvml.SUCCESS
		},
		GetUtilizationRatesFunc: func() (gonvml.Utilization, gonvml.Return) {
			return gonvml.Utilization{Gpu: 87, Memory: 64}, gonvml.SUCCESS
		},
		GetPowerUsageFunc:         func() (uint32, gonvml.Return) { return 512_345, gonvml.SUCCESS },
		GetEnforcedPowerLimitFunc: func() (uint32, gonvml.Return) { return 700_000, gonvml.SUCCESS },
		GetTemperatureFunc: func(s gonvml.TemperatureSensors) (uint32, gonvml.Return) {
			if s != gonvml.TEMPERATURE_GPU {
				return 0, gonvml.ERROR_INVALID_ARGUMENT
			}
			return 71, gonvml.SUCCESS
		},
		GetClockInfoFunc: func(c gonvml.ClockType) (uint32, gonvml.Return) {
			switch c {
			case gonvml.CLOCK_SM:
				return 1980, gonvml.SUCCESS
			case gonvml.CLOCK_MEM:
				return 2619, gonvml.SUCCESS
			}
			return 0, gonvml.ERROR_INVALID_ARGUMENT
		},
	}
	if override != nil {
		override(d)
	}
	return d
}

// fakeLib is an NVML with these devices whose Init answers initRet.
func fakeLib(initRet gonvml.Return, devs ...*mock.Device) *mock.Interface {
	return &mock.Interface{
		InitFunc:     func() gonvml.Return { return initRet },
		ShutdownFunc: func() gonvml.Return { return gonvml.SUCCESS },
		DeviceGetCountFunc: func() (int, gonvml.Return) {
			return len(devs), gonvml.SUCCESS
		},
		DeviceGetHandleByIndexFunc: func(i int) (gonvml.Device, gonvml.Return) {
			if i < 0 || i >= len(devs) {
				return nil, gonvml.ERROR_INVALID_ARGUMENT
			}
			return devs[i], gonvml.SUCCESS
		},
	}
}

func TestSampleReadings(t *testing.T) {
	full := gpustat.Stats{
		Name: "H200", UUID: "GPU-H200",
		MemoryTotalBytes: 80 << 30, MemoryUsedBytes: 30 << 30, MemoryFreeBytes: 50 << 30,
		GPUUtilPercent: 87, MemUtilPercent: 64, PowerWatts: 512.345, PowerLimitWatts: 700,
		TemperatureC: 71, SMClockMHz: 1980, MemClockMHz: 2619,
	}
	tests := []struct {
		name     string
		override func(d *mock.Device)
		want     func(g gpustat.Stats) gpustat.Stats
		wantErr  string
	}{
		{"every reading", nil, func(g gpustat.Stats) gpustat.Stats { return g }, ""},
		{"power not supported", func(d *mock.Device) {
			d.GetPowerUsageFunc = func() (uint32, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
			d.GetEnforcedPowerLimitFunc = func() (uint32, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
		}, func(g gpustat.Stats) gpustat.Stats {
			g.PowerWatts, g.PowerLimitWatts, g.Missing = 0, 0, gpustat.FieldPower|gpustat.FieldPowerLimit
			return g
		}, ""},
		{"clocks and temperature need permission", func(d *mock.Device) {
			d.GetClockInfoFunc = func(gonvml.ClockType) (uint32, gonvml.Return) { return 0, gonvml.ERROR_NO_PERMISSION }
			d.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 0, gonvml.ERROR_NO_PERMISSION }
		}, func(g gpustat.Stats) gpustat.Stats {
			g.SMClockMHz, g.MemClockMHz, g.TemperatureC = 0, 0, 0
			g.Missing = gpustat.FieldSMClock | gpustat.FieldMemClock | gpustat.FieldTemperature
			return g
		}, ""},
		{"no name or uuid", func(d *mock.Device) {
			d.GetNameFunc = func() (string, gonvml.Return) { return "junk", gonvml.ERROR_UNKNOWN }
			d.GetUUIDFunc = func() (string, gonvml.Return) { return "junk", gonvml.ERROR_UNKNOWN }
		}, func(g gpustat.Stats) gpustat.Stats {
			g.Name, g.UUID = "", ""
			return g
		}, ""},
		{"gpu lost", func(d *mock.Device) {
			d.GetMemoryInfoFunc = func() (gonvml.Memory, gonvml.Return) { return gonvml.Memory{}, gonvml.ERROR_GPU_IS_LOST }
		}, nil, "GPU 1: memory: ERROR_GPU_IS_LOST"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lib := fakeLib(gonvml.SUCCESS, fakeDevice("A100", nil), fakeDevice("H200", tc.override))
			s := newSampler(func() gonvml.Interface { return lib })
			defer s.Close()
			got, err := s.Sample(context.Background())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || errors.Is(err, gpustat.ErrUnavailable) {
					t.Fatalf("err %v, want one containing %q (not ErrUnavailable)", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := tc.want(full)
			want.Index = 1
			if len(got) != 2 || got[0].Name != "A100" || got[0].Index != 0 || got[1] != want {
				t.Fatalf("got %+v\nwant [A100, %+v]", got, want)
			}
		})
	}
}

func TestSampleUnavailable(t *testing.T) {
	tests := []struct {
		name         string
		lib          *mock.Interface
		want         string
		wantShutdown int
	}{
		{"no library", fakeLib(gonvml.ERROR_LIBRARY_NOT_FOUND), "NVML unavailable: libnvidia-ml.so.1 not found (no NVIDIA driver installed?)", 0},
		{"driver not loaded", fakeLib(gonvml.ERROR_DRIVER_NOT_LOADED), "NVML unavailable: the NVIDIA driver is not loaded", 0},
		{"no permission", fakeLib(gonvml.ERROR_NO_PERMISSION), "NVML unavailable: no permission", 0},
		{"other init failure", fakeLib(gonvml.ERROR_UNKNOWN), "NVML unavailable: init: ERROR_UNKNOWN", 0},
		{"no GPUs", fakeLib(gonvml.SUCCESS), "NVML unavailable: the NVIDIA driver reports no GPUs", 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSampler(func() gonvml.Interface { return tc.lib })
			for range 3 {
				_, err := s.Sample(context.Background())
				if !errors.Is(err, gpustat.ErrUnavailable) || !strings.HasPrefix(err.Error(), tc.want) {
					t.Fatalf("err %v, want ErrUnavailable starting %q", err, tc.want)
				}
			}
			if n := len(tc.lib.InitCalls()); n != 1 {
				t.Errorf("Init called %d times over 3 samples, want once (the failure is remembered)", n)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if n := len(tc.lib.ShutdownCalls()); n != tc.wantShutdown {
				t.Errorf("Shutdown called %d times, want %d (only after a successful Init)", n, tc.wantShutdown)
			}
		})
	}
}

// Lazy init, one Init for many concurrent samples, one Shutdown on Close,
// and nothing after Close. Run with -race.
func TestSampleConcurrentAndClose(t *testing.T) {
	lib := fakeLib(gonvml.SUCCESS, fakeDevice("H200", nil))
	created := 0
	s := newSampler(func() gonvml.Interface { created++; return lib })
	if created != 0 || len(lib.InitCalls()) != 0 {
		t.Fatal("NVML touched before the first Sample")
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16*10)
	for range 16 {
		wg.Go(func() {
			for range 10 {
				st, err := s.Sample(context.Background())
				if err == nil && len(st) != 1 {
					err = errors.New("not one GPU")
				}
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if created != 1 || len(lib.InitCalls()) != 1 {
		t.Fatalf("library created %d times, Init called %d times; want once each", created, len(lib.InitCalls()))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if n := len(lib.ShutdownCalls()); n != 1 {
		t.Fatalf("Shutdown called %d times, want 1", n)
	}
	if _, err := s.Sample(context.Background()); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("Sample after Close: %v", err)
	}
}

// A driver call that hangs: the caller returns at its deadline, the next
// caller waits only until its own, and sampling resumes once NVML answers.
func TestSampleHungDriver(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	dev := fakeDevice("H200", func(d *mock.Device) {
		d.GetNameFunc = func() (string, gonvml.Return) {
			once.Do(func() { <-release })
			return "H200", gonvml.SUCCESS
		}
	})
	s := newSampler(func() gonvml.Interface { return fakeLib(gonvml.SUCCESS, dev) })
	short := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		_, err := s.Sample(ctx)
		return err
	}
	if err := short(); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "did not answer in time") {
		t.Fatalf("hung sample: %v", err)
	}
	if err := short(); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "waiting for the sample in flight") {
		t.Fatalf("sample behind the hung one: %v", err)
	}
	close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if st, err := s.Sample(ctx); err != nil || len(st) != 1 {
		t.Fatalf("after the driver answered: %v %v", st, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
