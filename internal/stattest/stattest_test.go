package stattest

import (
	"math"
	"testing"
)

func TestChiSquareTwoSample(t *testing.T) {
	same := map[[2]int32]int{{1, 2}: 50, {3, 4}: 50}
	if chi2, dof := ChiSquareTwoSample(same, same); chi2 != 0 || dof != 1 {
		t.Errorf("identical tables: chi2 %g dof %d, want 0, 1", chi2, dof)
	}
	// 60/40 against 40/60: each cell expects 50, (10^2/50)*4 = 8.
	a := map[[2]int32]int{{1, 2}: 60, {3, 4}: 40}
	b := map[[2]int32]int{{1, 2}: 40, {3, 4}: 60}
	if chi2, dof := ChiSquareTwoSample(a, b); math.Abs(chi2-8) > 1e-12 || dof != 1 {
		t.Errorf("60/40 vs 40/60: chi2 %g dof %d, want 8, 1", chi2, dof)
	}
	// Rare categories pool into one.
	c := map[[2]int32]int{{1, 2}: 100, {5, 5}: 3, {6, 6}: 4}
	if _, dof := ChiSquareTwoSample(c, c); dof != 1 {
		t.Errorf("pooled rare categories: dof %d, want 1", dof)
	}
}

func TestChiSquareQuantile(t *testing.T) {
	// chi-square with 10 dof: the 1 - 1e-6 quantile is 46.863 (the closed
	// form of its survival function for even dof, solved by bisection); the
	// approximation lands within 3% above it (a slightly more lenient limit).
	if q := ChiSquareQuantile(10, Z1e6); q < 46.86 || q > 46.863*1.03 {
		t.Errorf("quantile(10, 1e-6) = %g, want within 3%% above 46.863", q)
	}
}
