package progress

import (
	"bytes"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"testing"
)

func logger(buf *bytes.Buffer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: level,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Key == "elapsed" {
				return slog.Attr{}
			}
			return a
		}}))
}

func never(io.Writer) bool  { return false }
func always(io.Writer) bool { return true }

func TestPlainLinesEveryTenth(t *testing.T) {
	var logs, out bytes.Buffer
	b := New(Options{Out: &out, Log: logger(&logs, slog.LevelInfo), Terminal: never}, "validate", 20)
	for range 20 {
		b.Add(1)
	}
	b.Finish()
	b.Finish() // idempotent
	if out.Len() != 0 {
		t.Errorf("bar output without a terminal: %q", out.String())
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	// start, 10%..90% (9 lines), done
	if len(lines) != 11 {
		t.Fatalf("got %d lines, want 11:\n%s", len(lines), logs.String())
	}
	if want := `level=INFO msg="validate: starting" total=20`; lines[0] != want {
		t.Errorf("first line %q, want %q", lines[0], want)
	}
	if want := `level=INFO msg="validate: progress" done=2 of=20 percent=10`; lines[1] != want {
		t.Errorf("second line %q, want %q", lines[1], want)
	}
	if want := `level=INFO msg="validate: progress" done=18 of=20 percent=90`; lines[9] != want {
		t.Errorf("line 10 %q, want %q", lines[9], want)
	}
	if want := `level=INFO msg="validate: done" done=20 of=20`; lines[10] != want {
		t.Errorf("last line %q, want %q", lines[10], want)
	}
}

func TestPlainLinesCoarse(t *testing.T) {
	// Many small additions (tensors) still give at most one line per tenth;
	// one big addition skips the tenths it jumps over.
	var logs bytes.Buffer
	b := New(Options{Log: logger(&logs, slog.LevelInfo), Terminal: never, Bytes: true}, "load", 1<<30)
	for range 10000 {
		b.Add(1 << 16) // 625 MiB in all
	}
	b.Add(400 << 20)
	b.Finish()
	got := logs.String()
	// 10%..60%, then the jump to 100% is the done line's.
	if n := strings.Count(got, "load: progress"); n != 6 {
		t.Errorf("%d progress lines, want 6:\n%s", n, got)
	}
	if !strings.Contains(got, `msg="load: progress" done="102.4 MiB" of="1.0 GiB" percent=10`) {
		t.Errorf("no 10%% line in bytes:\n%s", got)
	}
	if !regexp.MustCompile(`msg="load: done" done="1.0 GiB"`).MatchString(got) {
		t.Errorf("no done line:\n%s", got)
	}
}

func TestWarnLevelSilences(t *testing.T) {
	var logs bytes.Buffer
	b := New(Options{Log: logger(&logs, slog.LevelWarn), Terminal: never}, "bench", 4)
	for range 4 {
		b.Add(1)
	}
	b.Finish()
	if logs.Len() != 0 {
		t.Errorf("lines at --log-level warn: %q", logs.String())
	}
}

func TestBarOnTerminal(t *testing.T) {
	var logs, out bytes.Buffer
	b := New(Options{Out: &out, Log: logger(&logs, slog.LevelInfo), Terminal: always}, "build", 3)
	w := b.Writer(&out)
	b.Add(1)
	_, _ = io.WriteString(w, "warning: something\n")
	b.Add(2)
	b.Finish()
	if logs.Len() != 0 {
		t.Errorf("plain lines while a bar is drawn: %q", logs.String())
	}
	if !strings.Contains(out.String(), "build") || !strings.Contains(out.String(), "warning: something\n") {
		t.Errorf("bar output %q lacks the label or the warning", out.String())
	}
}

func TestNilAndDefaults(t *testing.T) {
	var b *Bar
	b.Add(1)
	b.Describe("x")
	b.Finish()
	var buf bytes.Buffer
	if b.Writer(&buf) != io.Writer(&buf) {
		t.Error("nil bar's Writer is not the writer itself")
	}
	// A bytes.Buffer is not a terminal.
	if IsTerminal(&buf) {
		t.Error("a buffer counts as a terminal")
	}
	New(Options{}, "quiet", 0).Finish() // no log, no output: no panic
}
