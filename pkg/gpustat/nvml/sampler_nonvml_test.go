//go:build nonvml

package nvml

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/glmctl/glmctl/pkg/gpustat"
)

// A -tags nonvml binary has no NVML: Sample says so, Close is harmless.
func TestNoNVMLBuild(t *testing.T) {
	s := New()
	_, err := s.Sample(context.Background())
	if !errors.Is(err, gpustat.ErrUnavailable) || !strings.Contains(err.Error(), "-tags nonvml") {
		t.Fatalf("Sample: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
