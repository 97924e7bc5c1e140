package main

import (
	"io"

	"github.com/glmctl/glmctl/pkg/progress"
)

// isTerminal decides whether stderr gets progress bars; tests replace it.
var isTerminal = progress.IsTerminal

// terminal reports whether w (stderr) gets progress bars.
func (a *app) terminal(w io.Writer) bool { return isTerminal(w) }

// progress starts a task's progress: a bar on stderr when it is a
// terminal, else Info log lines every tenth of the task (silenced by
// --log-level warn).
func (a *app) progress(desc string, total int64, bytes bool) *progress.Bar {
	return progress.New(progress.Options{Out: a.errOut, Log: a.log, Terminal: a.terminal, Bytes: bytes}, desc, total)
}

// loadProgress follows weight loading (backend.Options.OnLoad); finish
// ends it once the backend is open.
func (a *app) loadProgress() (onLoad func(done, total int64), finish func()) {
	var (
		bar          *progress.Bar
		total, shown int64
	)
	onLoad = func(done, t int64) {
		if bar == nil || t != total || done < shown { // first call, or another backend's load (auto fallback)
			bar.Finish()
			bar, total, shown = a.progress("loading weights", t, true), t, 0
		}
		bar.Add(done - shown)
		shown = done
	}
	return onLoad, func() { bar.Finish() }
}
