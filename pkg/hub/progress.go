package hub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
)

// Progress receives what a download is doing. Download calls it from
// several goroutines at once. A phase ("verify": hashing files on disk,
// "download") runs from Phase to Finish; in it each file runs from
// FileStart to FileDone. FileStart may come again for a file that starts
// over (its bytes counted so far are taken back).
type Progress interface {
	// Phase starts a phase over files holding bytes still to process.
	Phase(name string, files int, bytes int64)
	// FileStart says a file of size bytes starts, offset of them already
	// on disk (a resumed download).
	FileStart(file string, offset, size int64)
	// Add counts n more bytes of a file.
	Add(file string, n int64)
	// FileDone ends a file, with its error if it failed.
	FileDone(file string, err error)
	// Note reports an event worth a line (a retry), slog-style key-values.
	Note(msg string, args ...any)
	// Finish ends the phase.
	Finish()
}

type nopProgress struct{}

func (nopProgress) Phase(string, int, int64)       {}
func (nopProgress) FileStart(string, int64, int64) {}
func (nopProgress) Add(string, int64)              {}
func (nopProgress) FileDone(string, error)         {}
func (nopProgress) Note(string, ...any)            {}
func (nopProgress) Finish()                        {}

// tracker holds the counts both Progress implementations show. Its
// methods must be called with mu held.
type tracker struct {
	mu               sync.Mutex
	phase            string
	files, filesDone int
	total, done      int64 // bytes of the phase (this run's share) and done so far
	start            time.Time
	active           map[string]*fileState
	order            []string // active files, in start order
}

type fileState struct {
	offset, size, added int64
	start               time.Time
	bar                 *progressbar.ProgressBar
}

func (t *tracker) phaseStart(name string, files int, bytes int64) {
	t.phase, t.files, t.filesDone, t.total, t.done = name, files, 0, bytes, 0
	t.start = time.Now()
	t.active = map[string]*fileState{}
	t.order = t.order[:0]
}

// fileStart returns the file's state and whether it restarted.
func (t *tracker) fileStart(file string, offset, size int64) (*fileState, bool) {
	fs, again := t.active[file]
	if again {
		t.done -= fs.added
		t.total += (size - offset) - (fs.size - fs.offset)
		fs.offset, fs.size, fs.added = offset, size, 0
		return fs, true
	}
	fs = &fileState{offset: offset, size: size, start: time.Now()}
	t.active[file] = fs
	t.order = append(t.order, file)
	return fs, false
}

func (t *tracker) add(file string, n int64) {
	if fs := t.active[file]; fs != nil {
		fs.added += n
	}
	t.done += n
}

func (t *tracker) fileDone(file string) *fileState {
	fs := t.active[file]
	delete(t.active, file)
	for i, f := range t.order {
		if f == file {
			t.order = append(t.order[:i], t.order[i+1:]...)
			break
		}
	}
	t.filesDone++
	return fs
}

// rate is the phase's average in bytes/s, eta the time left at that rate.
func (t *tracker) rate() (rate float64, eta time.Duration) {
	sec := time.Since(t.start).Seconds()
	if sec <= 0 || t.done <= 0 {
		return 0, -1
	}
	rate = float64(t.done) / sec
	return rate, time.Duration(float64(t.total-t.done) / rate * float64(time.Second)).Round(time.Second)
}

// NewLogProgress reports progress as log lines: a line per file and,
// every interval, the phase's bytes, percentage, rate and time left.
func NewLogProgress(log *slog.Logger, interval time.Duration) Progress {
	return &logProgress{log: log, every: interval}
}

type logProgress struct {
	tracker
	log   *slog.Logger
	every time.Duration
	stop  chan struct{}
	wg    sync.WaitGroup
}

func (p *logProgress) Phase(name string, files int, bytes int64) {
	p.mu.Lock()
	p.phaseStart(name, files, bytes)
	p.mu.Unlock()
	p.log.Info(name+": starting", "files", files, "bytes", bytes, "size", fmtBytes(bytes))
	p.stop = make(chan struct{})
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(p.every)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.mu.Lock()
				rate, eta := p.rate()
				args := []any{"done", fmtBytes(p.done), "of", fmtBytes(p.total),
					"percent", fmt.Sprintf("%.1f", 100*float64(p.done)/float64(max(p.total, 1))),
					"rate", fmtRate(rate), "eta", fmtETA(eta), "files", fmt.Sprintf("%d/%d", p.filesDone, p.files)}
				name := p.phase
				p.mu.Unlock()
				p.log.Info(name+": progress", args...)
			}
		}
	}()
}

func (p *logProgress) FileStart(file string, offset, size int64) {
	p.mu.Lock()
	_, again := p.fileStart(file, offset, size)
	name := p.phase
	p.mu.Unlock()
	switch {
	case again:
		p.log.Info(name+": file starts over", "file", file, "size", fmtBytes(size))
	case offset > 0:
		p.log.Info(name+": resuming file", "file", file, "at", fmtBytes(offset), "size", fmtBytes(size))
	default:
		p.log.Debug(name+": file", "file", file, "size", fmtBytes(size))
	}
}

func (p *logProgress) Add(file string, n int64) {
	p.mu.Lock()
	p.add(file, n)
	p.mu.Unlock()
}

func (p *logProgress) FileDone(file string, err error) {
	p.mu.Lock()
	fs := p.fileDone(file)
	name, done, files := p.phase, p.filesDone, p.files
	p.mu.Unlock()
	if fs == nil {
		return
	}
	sec := time.Since(fs.start).Seconds()
	switch {
	case err == nil:
		p.log.Info(name+": file done", "file", file, "size", fmtBytes(fs.size), "seconds", round1(sec),
			"rate", fmtRate(float64(fs.added)/max(sec, 1e-9)), "files", fmt.Sprintf("%d/%d", done, files))
	case errors.Is(err, context.Canceled):
	default:
		p.log.Warn(name+": file failed", "file", file, "err", err)
	}
}

func (p *logProgress) Note(msg string, args ...any) {
	p.mu.Lock()
	name := p.phase
	p.mu.Unlock()
	if name == "" {
		name = "download"
	}
	p.log.Warn(name+": "+msg, args...)
}

func (p *logProgress) Finish() {
	if p.stop != nil {
		close(p.stop)
		p.wg.Wait()
		p.stop = nil
	}
	p.mu.Lock()
	rate, _ := p.rate()
	args := []any{"files", fmt.Sprintf("%d/%d", p.filesDone, p.files), "bytes", p.done,
		"size", fmtBytes(p.done), "seconds", round1(time.Since(p.start).Seconds()), "rate", fmtRate(rate)}
	name := p.phase
	p.mu.Unlock()
	p.log.Info(name+": finished", args...)
}

// NewTermProgress draws progress bars on a terminal w of width columns: one
// for the phase (bytes, rate, time elapsed and left), one per file being
// processed, and a line for each finished file or event above them.
func NewTermProgress(w io.Writer, width int) Progress {
	if width < 40 {
		width = 80
	}
	return &termProgress{w: w, width: width}
}

type termProgress struct {
	tracker
	w        io.Writer
	width    int
	totalBar *progressbar.ProgressBar
	msgs     []string
	lines    int // lines of the bars drawn last
	stop     chan struct{}
	wg       sync.WaitGroup
}

// descWidth is the most columns a file bar's name takes; barWidth the
// bar's own: a line must fit the terminal (about 48 columns go to the
// percentage, counts, rate and times).
func (p *termProgress) descWidth() int {
	if p.width >= 110 {
		return 36
	}
	return 28
}

func (p *termProgress) barWidth() int { return min(max(p.width-p.descWidth()-48, 5), 20) }

// maxFileBars is how many file bars are drawn at most (the rest are
// counted on one line).
const maxFileBars = 12

// newBar makes a bar that renders to a string only (draw writes it); its
// clock starts now, so the first rate shown is not inflated.
func newBar(max int64, desc string, width int) *progressbar.ProgressBar {
	b := progressbar.NewOptions64(max,
		progressbar.OptionSetWriter(io.Discard),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionShowBytes(true),
		progressbar.OptionShowCount(),
		progressbar.OptionSetWidth(width),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionThrottle(0),
		progressbar.OptionSetRenderBlankState(false),
	)
	_ = b.RenderBlank()
	return b
}

func (p *termProgress) Phase(name string, files int, bytes int64) {
	p.mu.Lock()
	p.phaseStart(name, files, bytes)
	p.totalBar = newBar(max(bytes, 1), name, p.barWidth())
	p.mu.Unlock()
	p.stop = make(chan struct{})
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.mu.Lock()
				p.draw(false)
				p.mu.Unlock()
			}
		}
	}()
}

func (p *termProgress) FileStart(file string, offset, size int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fs, _ := p.fileStart(file, offset, size)
	suffix := ""
	if offset > 0 {
		suffix = fmt.Sprintf(" (from %s)", fmtBytes(offset))
	}
	desc := shorten(file, max(p.descWidth()-len(suffix), 12)) + suffix
	fs.bar = nil
	if size-offset > 0 {
		fs.bar = newBar(size-offset, desc, p.barWidth())
	}
	if p.totalBar != nil {
		p.totalBar.ChangeMax64(max(p.total, 1))
	}
}

func (p *termProgress) Add(file string, n int64) {
	p.mu.Lock()
	p.add(file, n)
	p.mu.Unlock()
}

func (p *termProgress) FileDone(file string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fs := p.fileDone(file)
	if fs == nil {
		return
	}
	sec := time.Since(fs.start).Seconds()
	switch {
	case err == nil:
		p.msgs = append(p.msgs, fmt.Sprintf("  %s %s  %s in %.1fs (%s)", p.phase, file, fmtBytes(fs.size), sec,
			fmtRate(float64(fs.added)/max(sec, 1e-9))))
	case errors.Is(err, context.Canceled):
	default:
		p.msgs = append(p.msgs, fmt.Sprintf("! %s %s failed: %v", p.phase, file, err))
	}
}

func (p *termProgress) Note(msg string, args ...any) {
	var b strings.Builder
	b.WriteString("! " + msg)
	for i := 0; i+1 < len(args); i += 2 {
		fmt.Fprintf(&b, " %v=%v", args[i], args[i+1])
	}
	p.mu.Lock()
	p.msgs = append(p.msgs, b.String())
	p.mu.Unlock()
}

func (p *termProgress) Finish() {
	if p.stop != nil {
		close(p.stop)
		p.wg.Wait()
		p.stop = nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.draw(true)
	rate, _ := p.rate()
	fmt.Fprintf(p.w, "%s: %d/%d files, %s in %s (%s)\n", p.phase, p.filesDone, p.files, fmtBytes(p.done),
		time.Since(p.start).Round(time.Second), fmtRate(rate))
}

// draw replaces the bars drawn last with the pending lines and the current
// bars (none when final). mu must be held; only this goroutine touches the
// progressbar values, so their rendering needs no lock of its own.
func (p *termProgress) draw(final bool) {
	var b strings.Builder
	if p.lines > 0 {
		fmt.Fprintf(&b, "\x1b[%dA\x1b[J", p.lines)
	}
	for _, m := range p.msgs {
		b.WriteString(p.fit(m) + "\n")
	}
	p.msgs = p.msgs[:0]
	p.lines = 0
	if !final && p.totalBar != nil {
		p.totalBar.Describe(fmt.Sprintf("%s %d/%d files", p.phase, p.filesDone, p.files))
		_ = p.totalBar.Set64(min(max(p.done, 0), max(p.total, 1)))
		b.WriteString(p.fit(p.totalBar.String()) + "\n")
		p.lines++
		shown := 0
		for _, f := range p.order {
			fs := p.active[f]
			if fs.bar == nil {
				continue
			}
			if shown == maxFileBars {
				fmt.Fprintf(&b, "  ... and %d more\n", len(p.order)-shown)
				p.lines++
				break
			}
			_ = fs.bar.Set64(min(max(fs.added, 0), fs.size-fs.offset))
			b.WriteString("  " + p.fit(fs.bar.String()) + "\n")
			p.lines++
			shown++
		}
	}
	_, _ = io.WriteString(p.w, b.String())
}

// fit strips the bar's carriage return and trailing blanks and cuts the
// line to the terminal's width (a wrapped line would break the redraw).
func (p *termProgress) fit(s string) string {
	s = strings.TrimRight(strings.TrimLeft(s, "\r"), " ")
	r := []rune(s)
	if len(r) > p.width-3 {
		r = r[:p.width-3]
	}
	return string(r)
}

// shorten keeps the end of a long file name (the shard number).
func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return "…" + string(r[len(r)-n+1:])
}

func fmtRate(bps float64) string {
	if bps <= 0 {
		return "-"
	}
	return fmtBytes(int64(bps)) + "/s"
}

func fmtETA(d time.Duration) string {
	if d < 0 {
		return "unknown"
	}
	return d.String()
}

func round1(x float64) float64 { return float64(int64(x*10+0.5)) / 10 }
