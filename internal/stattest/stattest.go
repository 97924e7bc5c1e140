// Package stattest holds the statistics the sampling tests share: a
// two-sample chi-square homogeneity test over token-pair counts, and the
// chi-square quantile it is compared with.
package stattest

import (
	"math"
	"slices"
)

// ChiSquareTwoSample is the homogeneity statistic of two count tables with
// equal totals, pooling categories with fewer than 20 counts between them;
// it returns the statistic and its degrees of freedom.
func ChiSquareTwoSample(a, b map[[2]int32]int) (float64, int) {
	keys := map[[2]int32]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	var sorted [][2]int32
	for k := range keys {
		sorted = append(sorted, k)
	}
	slices.SortFunc(sorted, func(x, y [2]int32) int {
		if x[0] != y[0] {
			return int(x[0] - y[0])
		}
		return int(x[1] - y[1])
	})
	chi2, cats := 0.0, 0
	restA, restB := 0, 0
	add := func(x, y int) {
		e := float64(x+y) / 2
		chi2 += (float64(x)-e)*(float64(x)-e)/e + (float64(y)-e)*(float64(y)-e)/e
		cats++
	}
	for _, k := range sorted {
		if a[k]+b[k] < 20 {
			restA, restB = restA+a[k], restB+b[k]
			continue
		}
		add(a[k], b[k])
	}
	if restA+restB > 0 {
		add(restA, restB)
	}
	return chi2, max(cats-1, 1)
}

// ChiSquareQuantile approximates the chi-square quantile with dof degrees of
// freedom at standard-normal quantile z (Wilson–Hilferty).
func ChiSquareQuantile(dof int, z float64) float64 {
	k := float64(dof)
	c := 1 - 2/(9*k) + z*math.Sqrt(2/(9*k))
	return k * c * c * c
}

// Z1e6 is the standard-normal quantile of a one-sided 1e-6 tail: a correct
// sampler fails a test at this threshold with probability 1e-6.
const Z1e6 = 4.753
