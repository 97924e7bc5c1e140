package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/glmctl/glmctl/pkg/loadgen"
)

// urlOnlyFlags mean something only with --url.
var urlOnlyFlags = []string{"endpoint", "api-key", "request-rate", "range-ratio", "dataset", "slo",
	"result-json", "request-timeout", "ignore-eos"}

// urlModeFlags are the bench flags that apply with --url (the rest configure
// the in-process engine, its floor or the step grid).
var urlModeFlags = map[string]bool{"url": true, "model": true, "concurrency": true, "requests": true, "warmup": true,
	"input-len": true, "output-len": true, "seed": true, "temperature": true, "json": true, "markdown": true,
	"config": true, "log-format": true, "log-level": true}

func init() {
	for _, f := range urlOnlyFlags {
		urlModeFlags[f] = true
	}
}

func addURLBenchFlags(f *pflag.FlagSet) {
	f.String("url", "", "benchmark a running OpenAI-compatible server at this address (http://host:port) instead of the in-process engine")
	f.String("endpoint", loadgen.EndpointCompletions, "with --url: "+loadgen.EndpointCompletions+" or "+loadgen.EndpointChat)
	f.String("api-key", "", "with --url: sent as \"Authorization: Bearer KEY\" (default $OPENAI_API_KEY)")
	f.String("request-rate", "", "with --url: comma-separated request rates in requests/s, one open-loop run per value (Poisson arrivals) instead of --concurrency")
	f.Float64("range-ratio", 0, "with --url: draw input and output lengths uniformly from [len·(1−r), len·(1+r)], 0 <= r < 1")
	f.String("dataset", "", "with --url: prompts file, JSON Lines of {\"prompt\": ...} or ShareGPT {\"conversations\": [...]} (or a JSON array of them)")
	f.String("slo", "", "with --url: goodput bounds, e.g. ttft=200ms,tpot=50ms,e2e=5s (requests meeting all of them)")
	f.String("result-json", "", "with --url: also write the report, with every request's record, to this JSON file")
	f.Duration("request-timeout", 10*time.Minute, "with --url: a request taking longer fails as a timeout (0 = none)")
	f.Bool("ignore-eos", true, "with --url: send ignore_eos and min_tokens so that servers that take them generate exactly max_tokens")
}

// checkInProcessFlags refuses --url-only flags without --url.
func checkInProcessFlags(cmd *cobra.Command) error {
	for _, name := range urlOnlyFlags {
		if cmd.Flags().Changed(name) {
			return fmt.Errorf("--%s: only means something with --url (the load generator for a running server)", name)
		}
	}
	return nil
}

func parseRates(s string) ([]float64, error) {
	var out []float64
	for i, part := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(part), 64)
		if err != nil || !(v > 0) || v > 1e6 {
			return nil, fmt.Errorf("--request-rate: entry %d (%q) is not a rate in requests/s in (0, 1e6]", i, part)
		}
		out = append(out, v)
	}
	return out, nil
}

func (a *app) runBenchURL(cmd *cobra.Command) error {
	v := a.v
	var wrong []string
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if !urlModeFlags[f.Name] {
			wrong = append(wrong, "--"+f.Name)
		}
	})
	if len(wrong) > 0 {
		return fmt.Errorf("%s: does not apply with --url (it configures the in-process engine, its floor or the step grid; the server at --url has its own)", strings.Join(wrong, ", "))
	}
	asJSON, asMarkdown := v.GetBool("json"), v.GetBool("markdown")
	if asJSON && asMarkdown {
		return errors.New("--json and --markdown: choose one")
	}
	cfg := loadgen.Config{
		URL:               v.GetString("url"),
		Endpoint:          v.GetString("endpoint"),
		APIKey:            v.GetString("api-key"),
		Requests:          v.GetInt("requests"),
		Warmup:            v.GetInt("warmup"),
		InputLen:          v.GetInt("input-len"),
		OutputLen:         v.GetInt("output-len"),
		RangeRatio:        v.GetFloat64("range-ratio"),
		Seed:              v.GetInt64("seed"),
		Temperature:       v.GetFloat64("temperature"),
		IgnoreEOS:         v.GetBool("ignore-eos"),
		Timeout:           v.GetDuration("request-timeout"),
		OutputLenOverride: cmd.Flags().Changed("output-len"),
	}
	if cmd.Flags().Changed("model") {
		cfg.Model = v.GetString("model")
	}
	if cfg.APIKey == "" {
		cfg.APIKey = os.Getenv("OPENAI_API_KEY")
	}
	var err error
	if rates := v.GetString("request-rate"); rates != "" {
		if cmd.Flags().Changed("concurrency") {
			return errors.New("--concurrency and --request-rate: choose one (a closed loop at fixed concurrency, or Poisson arrivals at a rate)")
		}
		if cfg.RequestRates, err = parseRates(rates); err != nil {
			return err
		}
	} else if cfg.Concurrency, err = parseConcurrency(v.GetString("concurrency")); err != nil {
		return err
	}
	if cfg.SLO, err = loadgen.ParseSLO(v.GetString("slo")); err != nil {
		return err
	}
	if path := v.GetString("dataset"); path != "" {
		if cfg.Dataset, err = loadgen.ReadDataset(path); err != nil {
			return err
		}
		cfg.DatasetName = path
	}
	resultPath := v.GetString("result-json")
	cfg.KeepRecords = resultPath != ""
	prog := a.benchProgress()
	cfg.Progress = prog

	rep, runErr := loadgen.Run(cmd.Context(), cfg)
	if rep == nil {
		return runErr
	}
	rep.Header.CommandLine = commandLine(cmd)
	if resultPath != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(resultPath, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("--result-json: %w", err)
		}
	}
	for i := range rep.Runs {
		rep.Runs[i].Records = nil
	}
	if len(rep.Runs) > 0 {
		switch {
		case asJSON:
			if err := writeJSON(a.out, rep); err != nil {
				return err
			}
		case asMarkdown:
			if err := rep.WriteMarkdown(a.out); err != nil {
				return err
			}
		default:
			if err := rep.WriteText(a.out); err != nil {
				return err
			}
			if err := renderTable(a.out, rep.Columns(), rep.TableRows()); err != nil {
				return err
			}
			if err := rep.WriteNotes(a.out); err != nil {
				return err
			}
		}
	}
	if runErr != nil {
		if rep.Interrupted {
			return fmt.Errorf("interrupted: the report above covers the requests that finished (%w)", runErr)
		}
		return runErr
	}
	completed := 0
	for _, r := range rep.Runs {
		completed += r.Completed
	}
	if completed == 0 {
		return errors.New("every request failed (see the failures above)")
	}
	return nil
}

// benchProgress is a progress bar on a terminal, plain log lines (every
// tenth of a run) otherwise.
func (a *app) benchProgress() loadgen.Progress {
	if a.terminal(a.errOut) {
		return &benchBarProgress{w: a.errOut}
	}
	return &benchLogProgress{a: a}
}

type benchBarProgress struct {
	w   io.Writer
	mu  sync.Mutex
	bar *progressbar.ProgressBar
}

func (p *benchBarProgress) Start(run string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bar = progressbar.NewOptions(n,
		progressbar.OptionSetWriter(p.w),
		progressbar.OptionSetDescription(run),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
	)
}

func (p *benchBarProgress) Done(loadgen.Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar != nil {
		_ = p.bar.Add(1)
	}
}

func (p *benchBarProgress) Finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}

type benchLogProgress struct {
	a                  *app
	mu                 sync.Mutex
	run                string
	total, done, fails int
	start              time.Time
}

func (p *benchLogProgress) Start(run string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.run, p.total, p.done, p.fails, p.start = run, n, 0, 0, time.Now()
	p.a.log.Info("bench run started", "run", run, "requests", n)
}

func (p *benchLogProgress) Done(r loadgen.Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done++
	if !r.OK {
		p.fails++
	}
	if step := max(1, p.total/10); p.done%step == 0 || p.done == p.total {
		p.a.log.Info("bench progress", "run", p.run, "done", p.done, "of", p.total, "failed", p.fails,
			"elapsed", time.Since(p.start).Round(time.Millisecond).String())
	}
}

func (p *benchLogProgress) Finish() {}
