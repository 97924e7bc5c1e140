package cpu_test

import (
	"testing"

	"github.com/glmctl/glmctl/pkg/backend/cpu"
)

// OnLoad sees the bytes read grow to exactly their total, with the total
// fixed from the first call.
func TestOnLoadReachesTotal(t *testing.T) {
	for _, name := range []string{"tiny-f32", "tiny-bf16g"} {
		var calls int
		var last, total int64
		openTiny(t, name, cpu.Options{OnLoad: func(done, tot int64) {
			if calls > 0 && (tot != total || done < last) {
				t.Errorf("%s: call %d: %d of %d after %d of %d", name, calls, done, tot, last, total)
			}
			calls++
			last, total = done, tot
		}})
		if calls < 2 || last != total || total <= 0 {
			t.Errorf("%s: %d calls, ended at %d of %d", name, calls, last, total)
		}
	}
}
