// Package progress shows how far a long task is: a progress bar
// (schollz/progressbar) when the output is a terminal, otherwise plain log
// lines at a coarse granularity (every 10% of the work, and at the end), so
// that logs redirected to a file stay short. Log lines are Info level, so
// --log-level warn silences them.
package progress

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// IsTerminal reports whether w is a terminal (an *os.File on a TTY).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// Options configures New.
type Options struct {
	// Out is where a bar is drawn (stderr). Nil: no bar.
	Out io.Writer
	// Log receives the plain lines when Out is not a terminal. Nil: none.
	Log *slog.Logger
	// Terminal decides whether Out gets a bar; nil: IsTerminal.
	Terminal func(io.Writer) bool
	// Bytes shows counts as byte sizes.
	Bytes bool
	// Steps is how many plain lines the whole task logs at most (one each
	// time another 1/Steps of it is done); 0: 10.
	Steps int
}

// Bar follows one task of a known size. Its methods are safe for
// concurrent use; a nil *Bar does nothing.
type Bar struct {
	mu          sync.Mutex
	desc        string
	total, done int64
	bytes       bool
	steps       int
	step        int // plain lines logged so far (tenths passed)
	start       time.Time
	bar         *progressbar.ProgressBar
	log         *slog.Logger
	finished    bool
}

// New starts a task named desc of total units (bytes with Options.Bytes).
func New(o Options, desc string, total int64) *Bar {
	b := &Bar{desc: desc, total: max(total, 0), bytes: o.Bytes, steps: o.Steps, start: time.Now(), log: o.Log}
	if b.steps <= 0 {
		b.steps = 10
	}
	isTerm := o.Terminal
	if isTerm == nil {
		isTerm = IsTerminal
	}
	if o.Out != nil && isTerm(o.Out) {
		opts := []progressbar.Option{
			progressbar.OptionSetWriter(o.Out),
			progressbar.OptionSetDescription(desc),
			progressbar.OptionShowCount(),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(100 * time.Millisecond),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionShowElapsedTimeOnFinish(),
		}
		if o.Bytes {
			opts = append(opts, progressbar.OptionShowBytes(true))
		}
		b.bar = progressbar.NewOptions64(max(total, 1), opts...)
		b.log = nil
		return b
	}
	if b.log != nil {
		b.log.Info(desc+": starting", "total", b.fmt(b.total))
	}
	return b
}

func (b *Bar) fmt(n int64) string {
	if b.bytes {
		return fmtBytes(n)
	}
	return fmt.Sprint(n)
}

// Add counts n more units done.
func (b *Bar) Add(n int64) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done += n
	if b.bar != nil {
		_ = b.bar.Set64(min(b.done, max(b.total, 1)))
		return
	}
	if b.log == nil || b.total <= 0 {
		return
	}
	reached := int(min(b.done, b.total) * int64(b.steps) / b.total)
	if reached > b.step && reached < b.steps { // the last step is Finish's line
		b.step = reached
		b.log.Info(b.desc+": progress", "done", b.fmt(b.done), "of", b.fmt(b.total),
			"percent", 100*reached/b.steps, "elapsed", time.Since(b.start).Round(100*time.Millisecond).String())
	}
}

// Describe changes the task's name (the bar's label; plain lines use it
// from then on).
func (b *Bar) Describe(desc string) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.desc = desc
	if b.bar != nil {
		b.bar.Describe(desc)
	}
}

// Finish ends the task: the bar is cleared, or a last plain line says how
// much was done in what time.
func (b *Bar) Finish() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.finished {
		return
	}
	b.finished = true
	if b.bar != nil {
		_ = b.bar.Finish()
		return
	}
	if b.log != nil {
		b.log.Info(b.desc+": done", "done", b.fmt(b.done), "of", b.fmt(b.total),
			"elapsed", time.Since(b.start).Round(100*time.Millisecond).String())
	}
}

// Writer returns w wrapped so that what is written through it (warnings
// printed while the bar runs) first clears the bar, which redraws on the
// next Add. Without a bar it returns w.
func (b *Bar) Writer(w io.Writer) io.Writer {
	if b == nil || b.bar == nil {
		return w
	}
	return clearWriter{b: b, w: w}
}

type clearWriter struct {
	b *Bar
	w io.Writer
}

func (c clearWriter) Write(p []byte) (int, error) {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	if !c.b.finished {
		_ = c.b.bar.Clear()
	}
	return c.w.Write(p)
}

func fmtBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
