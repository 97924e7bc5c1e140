package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// Set by the linker (-X main.version=... -X main.commit=...).
var (
	version = "dev"
	commit  = "none"
)

// app carries what every subcommand shares: configuration and output.
type app struct {
	v      *viper.Viper
	out    io.Writer
	errOut io.Writer
	log    *slog.Logger
}

// run executes the CLI and returns the process exit code. Errors are printed
// once, here.
func run(args []string, out, errOut io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRootCmd(out, errOut)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(errOut, "glmctl: %v\n", err)
		var ec exitCoder
		if errors.As(err, &ec) {
			return ec.ExitCode()
		}
		return 1
	}
	return 0
}

// exitCoder lets a command choose its exit code (e.g. 2 for a failed
// verdict) while still printing its error once.
type exitCoder interface{ ExitCode() int }

func newRootCmd(out, errOut io.Writer) *cobra.Command {
	a := &app{v: viper.New(), out: out, errOut: errOut}
	root := &cobra.Command{
		Use:           "glmctl",
		Short:         "Serve GLM-4.7-FP8: download, inspect, build, validate, generate, bench, serve, synth",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       fmt.Sprintf("%s (commit %s)", version, commit),
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return a.setup(cmd)
		},
	}
	root.SetOut(out)
	root.SetErr(errOut)
	pf := root.PersistentFlags()
	pf.String("config", "", "configuration file (YAML; default ./glmctl.yaml if present)")
	pf.String("log-format", "text", "log format: text or json")
	pf.String("log-level", "info", "log level: debug, info, warn, error")
	root.AddCommand(
		a.newVersionCmd(),
		a.newInspectCmd(),
		a.newDownloadCmd(),
		a.newBuildCmd(),
		a.newValidateCmd(),
		a.newGenerateCmd(),
		a.newBenchCmd(),
		a.newServeCmd(),
		a.newSynthCmd(),
	)
	return root
}

// setup wires configuration: flags > GLMCTL_* environment > config file >
// defaults, then builds the logger.
func (a *app) setup(cmd *cobra.Command) error {
	v := a.v
	v.SetEnvPrefix("GLMCTL")
	v.SetEnvKeyReplacer(strings.NewReplacer("-", "_", ".", "_"))
	v.AutomaticEnv()
	var bindErr error
	bind := func(f *pflag.Flag) {
		if err := v.BindPFlag(f.Name, f); err != nil && bindErr == nil {
			bindErr = fmt.Errorf("bind flag --%s: %w", f.Name, err)
		}
	}
	cmd.Flags().VisitAll(bind)
	cmd.InheritedFlags().VisitAll(bind)
	if bindErr != nil {
		return bindErr
	}
	if path := v.GetString("config"); path != "" {
		v.SetConfigFile(path)
		if err := v.ReadInConfig(); err != nil {
			return fmt.Errorf("read config file %s: %w", path, err)
		}
	} else if _, err := os.Stat("glmctl.yaml"); err == nil {
		v.SetConfigFile("glmctl.yaml")
		if err := v.ReadInConfig(); err != nil {
			return fmt.Errorf("read config file glmctl.yaml: %w", err)
		}
	}
	log, err := newLogger(a.errOut, v.GetString("log-format"), v.GetString("log-level"))
	if err != nil {
		return err
	}
	a.log = log
	slog.SetDefault(log)
	return nil
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %q is not one of debug, info, warn, error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format: %q is not one of text, json", format)
}
