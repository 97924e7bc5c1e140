package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/glmctl/glmctl/pkg/hub"
	"github.com/glmctl/glmctl/pkg/inspect"
)

func (a *app) newDownloadCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "download REPO",
		Short: "Download a model from the Hugging Face hub or a mirror: resumable, verified",
		Long: `download fetches the files of a model repository (ORG/NAME) at a revision from the
Hugging Face hub, or from the mirror HF_ENDPOINT names. Files are downloaded in parallel into
.incomplete files that a later run resumes with HTTP Range requests (after Ctrl-C or a dropped
connection), checked against the hub's size and sha256 (LFS files: the weights) or git blob id
(the small files), and renamed into place. A re-run of a complete download fetches nothing.

By default the files go to the hub cache (HF_HUB_CACHE, else HF_HOME/hub, else
~/.cache/huggingface/hub: blobs, refs and snapshots linking to them), where other tools find
them; --local-dir writes a plain directory instead. The directory to pass to --model and inspect
is printed at the end, followed by inspect's verdict on it (a download that is not a whole
checkpoint, e.g. --include config.json, still succeeds). See docs/download.md.`,
		Example: `  glmctl download zai-org/GLM-4.7-FP8                            # 93 shards, 361 GB, into the hub cache
  glmctl download zai-org/GLM-4.7-FP8 --local-dir /models/GLM-4.7-FP8
  glmctl download zai-org/GLM-4.7-FP8 --include config.json --include 'tokenizer*'
  glmctl download zai-org/GLM-4.7-FP8 --verify                   # re-hash what is on disk, repair it
  HF_ENDPOINT=https://hf-mirror.com glmctl download zai-org/GLM-4.7-FP8`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.runDownload(cmd.Context(), args[0])
		},
	}
	f := cmd.Flags()
	f.String("revision", "main", "branch, tag or commit hash")
	f.String("token", "", "hub token (default: HF_TOKEN, else the file `hf auth login` wrote)")
	f.String("endpoint", "", "hub address (default: HF_ENDPOINT, else "+hub.DefaultEndpoint+")")
	f.String("local-dir", "", "write the files to this plain directory instead of the hub cache")
	f.String("cache-dir", "", "hub cache (default: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)")
	f.StringSlice("include", nil, "only files matching these globs ('*' also matches '/'; repeat or separate with commas)")
	f.StringSlice("exclude", nil, "skip files matching these globs")
	f.Int("workers", 8, "files downloaded at once")
	f.Int("retries", 5, "tries again, with backoff, after a failure that brought no byte (a failure after progress resumes at once)")
	f.Bool("verify", false, "re-hash every file already on disk; download again those that do not match")
	f.Bool("dry-run", false, "show what is on disk and what a download would fetch; write nothing")
	f.Bool("json", false, "print a JSON summary on stdout")
	return cmd
}

// downloadInspect is inspect's verdict on a download, in the JSON summary.
type downloadInspect struct {
	OK       bool     `json:"ok"`
	Problems []string `json:"problems,omitempty"`
	// Error is set when inspect could not read the directory as a
	// checkpoint at all (e.g. only the tokenizer was downloaded).
	Error string `json:"error,omitempty"`
}

func (a *app) runDownload(ctx context.Context, repo string) error {
	v := a.v
	endpoint := v.GetString("endpoint")
	if endpoint == "" {
		endpoint = hub.EndpointFromEnv()
	}
	token, source := v.GetString("token"), "--token"
	if token == "" {
		token, source = hub.TokenFromEnv()
	}
	c := hub.NewClient(endpoint, token)
	c.UserAgent = "glmctl/" + version
	if token != "" {
		a.log.Debug("download: sending a token", "from", source)
	}
	if n := v.GetInt("workers"); n < 1 {
		return fmt.Errorf("--workers: %d must be at least 1", n)
	}
	if n := v.GetInt("retries"); n < 0 {
		return fmt.Errorf("--retries: %d must be at least 0", n)
	}
	o := hub.Options{
		Repo: repo, Revision: v.GetString("revision"),
		LocalDir: v.GetString("local-dir"), CacheDir: v.GetString("cache-dir"),
		Include: v.GetStringSlice("include"), Exclude: v.GetStringSlice("exclude"),
		Workers: v.GetInt("workers"), MaxAttempts: v.GetInt("retries") + 1,
		Verify: v.GetBool("verify"), DryRun: v.GetBool("dry-run"),
		Progress: a.downloadProgress(), Log: a.log,
	}
	res, err := hub.Download(ctx, c, o)
	if res == nil {
		return err
	}
	var verdict *downloadInspect
	if err == nil && !res.DryRun {
		verdict = inspectDownload(res.Dir)
	}
	if v.GetBool("json") {
		enc := json.NewEncoder(a.out)
		enc.SetIndent("", "  ")
		if jerr := enc.Encode(struct {
			*hub.Result
			Inspect *downloadInspect `json:"inspect,omitempty"`
		}{res, verdict}); jerr != nil {
			return fmt.Errorf("write JSON summary: %w", jerr)
		}
		return err
	}
	if err != nil {
		fmt.Fprintf(a.out, "%s at %s (commit %s): %d of %d file(s) in place in %s, %s fetched; %d not (see the error). The same command resumes.\n",
			res.Repo, res.Revision, res.Commit, len(res.Files)-res.Count(hub.StatusFailed), len(res.Files), res.Dir,
			humanBytes(res.FetchedBytes), res.Count(hub.StatusFailed))
		return err
	}
	if res.DryRun {
		return a.printDryRun(res)
	}
	a.printDownload(res)
	a.printDownloadVerdict(res, verdict, len(o.Include)+len(o.Exclude) > 0)
	return nil
}

// downloadProgress draws bars on a terminal, else logs a line per file and
// a total every 10 seconds.
func (a *app) downloadProgress() hub.Progress {
	if f, ok := a.errOut.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		w, _, err := term.GetSize(int(f.Fd()))
		if err != nil {
			w = 80
		}
		return hub.NewTermProgress(f, w)
	}
	return hub.NewLogProgress(a.log, 10*time.Second)
}

func (a *app) printDownload(res *hub.Result) {
	w := a.out
	if res.AlreadyComplete {
		fmt.Fprintf(w, "Already complete: %s at %s (commit %s), %d file(s), %s; nothing downloaded",
			res.Repo, res.Revision, res.Commit, len(res.Files), humanBytes(res.TotalBytes))
		if n := res.Count(hub.StatusVerified); n > 0 {
			fmt.Fprintf(w, " (%d re-hashed: all match)", n)
		}
		fmt.Fprintf(w, ".\n  %s\n", res.Dir)
		return
	}
	rate := ""
	if res.Seconds > 0 {
		rate = fmt.Sprintf(" (%s/s)", humanBytes(int64(float64(res.FetchedBytes)/res.Seconds)))
	}
	fmt.Fprintf(w, "Downloaded %s at %s (commit %s): %d file(s), %s fetched in %s%s",
		res.Repo, res.Revision, res.Commit, len(res.Files), humanBytes(res.FetchedBytes),
		time.Duration(res.Seconds*float64(time.Second)).Round(100*time.Millisecond), rate)
	var parts []string
	for _, s := range []struct{ status, what string }{
		{hub.StatusResumed, "resumed"}, {hub.StatusReplaced, "replaced (were wrong)"},
		{hub.StatusPresent, "already present"}, {hub.StatusVerified, "already present, re-hashed"},
	} {
		if n := res.Count(s.status); n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, s.what))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "; %s", strings.Join(parts, ", "))
	}
	fmt.Fprintf(w, ".\n  %s\n", res.Dir)
}

func (a *app) printDryRun(res *hub.Result) error {
	rows := make([][]string, 0, len(res.Files))
	for _, f := range res.Files {
		rows = append(rows, []string{f.Path, humanBytes(f.Size), f.Status})
	}
	fmt.Fprintf(a.out, "%s at %s (commit %s), %d of %d file(s) selected, %s\n\n",
		res.Repo, res.Revision, res.Commit, len(res.Files), res.RepoFiles, humanBytes(res.TotalBytes))
	if err := renderTable(a.out, []string{"FILE", "SIZE", "STATUS"}, rows); err != nil {
		return err
	}
	free := "unknown"
	if res.FreeBytes >= 0 {
		free = humanBytes(res.FreeBytes)
	}
	fmt.Fprintf(a.out, "\nDry run: %s to download into %s (%s free); nothing was written.\n", humanBytes(res.NeedBytes), res.Dir, free)
	if res.FreeBytes >= 0 && res.NeedBytes > res.FreeBytes {
		fmt.Fprintln(a.out, "Not enough space: a download would stop before it starts.")
	}
	return nil
}

// inspectDownload runs inspect's checks on a downloaded directory.
func inspectDownload(dir string) *downloadInspect {
	rep, err := inspect.Run(dir, inspect.Options{TP: 1, EP: 1, KVElemBytes: 2})
	if err != nil {
		return &downloadInspect{Error: err.Error()}
	}
	return &downloadInspect{OK: rep.OK, Problems: rep.Problems}
}

func (a *app) printDownloadVerdict(res *hub.Result, v *downloadInspect, filtered bool) {
	w := a.out
	switch {
	case v.Error != "":
		fmt.Fprintf(w, "\ninspect: not a checkpoint it can read: %s\n", v.Error)
		if filtered {
			fmt.Fprintln(w, "  (only the files matching --include/--exclude were downloaded)")
		}
	case v.OK:
		fmt.Fprintf(w, "\nVerdict: OK (glmctl inspect %s for the whole report)\n", res.Dir)
	default:
		fmt.Fprintf(w, "\nVerdict: %d problem(s) (glmctl inspect %s for the whole report)\n", len(v.Problems), res.Dir)
		for i, p := range v.Problems {
			if i == 10 {
				fmt.Fprintf(w, "  ... and %d more\n", len(v.Problems)-10)
				break
			}
			fmt.Fprintf(w, "  - %s\n", p)
		}
		if filtered {
			fmt.Fprintln(w, "  (only the files matching --include/--exclude were downloaded)")
		}
	}
}
