package cpu

import (
	"fmt"
	"sync"
)

// workerPool runs index ranges on a fixed set of goroutines. The calling
// goroutine takes the first chunk itself, so a pool of n uses n-1 helpers.
// One run at a time (Step is serialised), so chunk numbers identify
// per-worker scratch.
type workerPool struct {
	n     int
	tasks chan poolTask
}

type poolTask struct {
	fn             func(worker, lo, hi int)
	worker, lo, hi int
	wg             *sync.WaitGroup
	failed         *panicBox
}

// panicBox keeps the first panic of a run's chunks, so that run re-raises it
// on the calling goroutine (where the engine recovers it) instead of a
// helper goroutine's panic killing the process.
type panicBox struct {
	mu  sync.Mutex
	val any
	set bool
}

func (b *panicBox) catch(fn func(worker, lo, hi int), worker, lo, hi int) {
	defer func() {
		if r := recover(); r != nil {
			b.mu.Lock()
			if !b.set {
				b.val, b.set = r, true
			}
			b.mu.Unlock()
		}
	}()
	fn(worker, lo, hi)
}

func newWorkerPool(n int) *workerPool {
	p := &workerPool{n: max(n, 1)}
	if p.n > 1 {
		tasks := make(chan poolTask, p.n)
		p.tasks = tasks
		for range p.n - 1 {
			go func() {
				for t := range tasks {
					t.failed.catch(t.fn, t.worker, t.lo, t.hi)
					t.wg.Done()
				}
			}()
		}
	}
	return p
}

// run calls fn over [0, total) split into at most p.n contiguous chunks of at
// least grain items; worker is the chunk number, below p.n. If a chunk
// panics, run waits for every chunk to end, then panics on the calling
// goroutine.
func (p *workerPool) run(total, grain int, fn func(worker, lo, hi int)) {
	if total <= 0 {
		return
	}
	grain = max(grain, 1)
	chunks := min(p.n, (total+grain-1)/grain)
	if chunks <= 1 {
		fn(0, 0, total)
		return
	}
	var (
		wg     sync.WaitGroup
		failed panicBox
	)
	wg.Add(chunks - 1)
	for c := 1; c < chunks; c++ {
		p.tasks <- poolTask{fn: fn, worker: c, lo: c * total / chunks, hi: (c + 1) * total / chunks, wg: &wg, failed: &failed}
	}
	failed.catch(fn, 0, 0, total/chunks)
	wg.Wait()
	if failed.set {
		panic(fmt.Sprintf("cpu worker: %v", failed.val))
	}
}

func (p *workerPool) close() {
	if p.tasks != nil {
		close(p.tasks)
		p.tasks = nil
	}
}
