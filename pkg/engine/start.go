package engine

import (
	"context"
	"errors"
	"sync"
)

// Start builds an engine on backend (New) and runs its step loop (Run) in a
// goroutine until stop is called: the start/stop sequence of an in-process
// command (glmctl generate, bench). The loop's context is ctx without its
// cancellation, so cancelling ctx does not stop the engine: a caller cancels
// its requests (their streams still deliver the final event) and then calls
// stop. stop ends the loop, waits for it to return and returns Run's error,
// nil when stop itself ended it; later calls return the same. The caller
// keeps ownership of backend and closes it after stop.
func Start(ctx context.Context, backend Backend, cfg Config) (eng *Engine, stop func() error, err error) {
	eng, err = New(backend, cfg)
	if err != nil {
		return nil, nil, err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- eng.Run(runCtx) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			runErr = <-done
			if errors.Is(runErr, context.Canceled) && !errors.Is(runErr, ErrBackendFatal) {
				runErr = nil // the loop ended because stop asked it to
			}
		})
		return runErr
	}
	return eng, stop, nil
}
