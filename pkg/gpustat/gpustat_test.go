package gpustat

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

func gpus(n int) []Stats {
	out := make([]Stats, n)
	for i := range out {
		out[i] = Stats{Index: i, Name: "H200", UUID: []string{"GPU-aa11", "GPU-aa22", "GPU-bb33", "GPU-cc44"}[i]}
	}
	return out
}

func indices(s []Stats) []int {
	out := []int{}
	for _, g := range s {
		out = append(out, g.Index)
	}
	return out
}

func TestCUDAOrder(t *testing.T) {
	tests := []struct {
		name    string
		visible string
		set     bool
		want    []int
		wantErr string
	}{
		{"unset: all, NVML order", "", false, []int{0, 1, 2, 3}, ""},
		{"set empty: none", "", true, []int{}, ""},
		{"indices reorder", "2,0", true, []int{2, 0}, ""},
		{"spaces", " 3 , 1 ", true, []int{3, 1}, ""},
		{"invalid index hides the rest", "1,7,2", true, []int{1}, ""},
		{"negative index", "-1,2", true, []int{}, ""},
		{"duplicate stops", "1,1,2", true, []int{1}, ""},
		{"uuid", "GPU-bb33,GPU-aa11", true, []int{2, 0}, ""},
		{"uuid prefix", "GPU-c,GPU-b", true, []int{3, 2}, ""},
		{"ambiguous uuid prefix hides the rest", "GPU-cc,GPU-aa,GPU-bb", true, []int{3}, ""},
		{"mig", "MIG-1234", true, nil, "MIG instance"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := CUDAOrder(gpus(4), tc.visible, tc.set)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrUnavailable) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(indices(got), tc.want) {
				t.Fatalf("got GPUs %v, want %v", indices(got), tc.want)
			}
		})
	}
}

type fakeSampler struct {
	stats []Stats
	err   error
}

func (f fakeSampler) Sample(context.Context) ([]Stats, error) { return f.stats, f.err }

func TestCUDASampler(t *testing.T) {
	tests := []struct {
		name    string
		s       CUDASampler
		want    []int
		wantErr string
		unavail bool
		inner   error
	}{
		{"device 0 tp 2", CUDASampler{First: 0, N: 2}, []int{0, 1}, "", false, nil},
		{"device 1 tp 2", CUDASampler{First: 1, N: 2}, []int{1, 2}, "", false, nil},
		{"all from 2", CUDASampler{First: 2}, []int{2, 3}, "", false, nil},
		{"all from 4: none", CUDASampler{First: 4}, []int{}, "", false, nil},
		{"visible subset", CUDASampler{First: 1, N: 1, Visible: "3,2", VisibleSet: true}, []int{2}, "", false, nil},
		{"too few", CUDASampler{First: 2, N: 4}, nil, "CUDA devices 2..5: only 4 GPU(s) visible", false, nil},
		{"too few visible", CUDASampler{First: 0, N: 2, Visible: "1", VisibleSet: true}, nil, "only 1 GPU(s) visible", false, nil},
		{"first past the end", CUDASampler{First: 5}, nil, "CUDA device 5: only 4 GPU(s) visible", false, nil},
		{"negative first", CUDASampler{First: -1, N: 1}, nil, "must be >= 0", false, nil},
		{"unavailable passes through", CUDASampler{N: 1}, nil, "NVML unavailable", true, ErrUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.s.Sampler = fakeSampler{stats: gpus(4), err: tc.inner}
			got, err := tc.s.Sample(context.Background())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || errors.Is(err, ErrUnavailable) != tc.unavail {
					t.Fatalf("err %v, want %q (ErrUnavailable: %v)", err, tc.wantErr, tc.unavail)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(indices(got), tc.want) {
				t.Fatalf("got GPUs %v, want %v", indices(got), tc.want)
			}
		})
	}
}

func TestFieldString(t *testing.T) {
	for _, tc := range []struct {
		f    Field
		want string
	}{
		{0, "none"},
		{FieldPower | FieldSMClock, "power, SM clock"},
		{FieldMemory, "memory"},
	} {
		if got := tc.f.String(); got != tc.want {
			t.Errorf("%d: %q, want %q", tc.f, got, tc.want)
		}
	}
}
