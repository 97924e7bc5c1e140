//go:build race

package cpu_test

// raceEnabled: the race detector slows the step loop tests about 25 times,
// so they run a smaller matrix under it (the concurrency they exercise is
// the same).
const raceEnabled = true
