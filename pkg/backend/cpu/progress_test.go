package cpu_test

import (
	"testing"

	"github.com/glmctl/glmctl/pkg/backend/cpu"
)

// OnLoad sees the bytes read grow to exactly their total, with the total
// fixed from the first call; with DraftTokens the MTP layer counts too.
func TestOnLoadReachesTotal(t *testing.T) {
	plain := map[string]int64{}
	for _, c := range []struct {
		name   string
		drafts int
	}{{"tiny-f32", 0}, {"tiny-bf16g", 0}, {"tiny-f32", 1}, {"tiny-bf16g", 2}} {
		name := c.name
		var calls int
		var last, total int64
		openTiny(t, name, cpu.Options{DraftTokens: c.drafts, OnLoad: func(done, tot int64) {
			if calls > 0 && (tot != total || done < last) {
				t.Errorf("%s: call %d: %d of %d after %d of %d", name, calls, done, tot, last, total)
			}
			calls++
			last, total = done, tot
		}})
		if calls < 2 || last != total || total <= 0 {
			t.Errorf("%s: %d calls, ended at %d of %d", name, calls, last, total)
		}
		if c.drafts == 0 {
			plain[name] = total
		} else if total <= plain[name] {
			t.Errorf("%s with DraftTokens: %d bytes read, plain %d: the MTP layer is not counted", name, total, plain[name])
		}
	}
}
