package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/glmctl/glmctl/pkg/cudabuild"
	"github.com/glmctl/glmctl/pkg/progress"
)

func (a *app) newBuildCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "build",
		Short: "Build libglmcuda.so (the CUDA runtime) for this machine's GPU",
		Long: `build compiles the CUDA runtime sources embedded in glmctl with nvcc, for the
architecture of the visible GPUs (or --arch), into a content-addressed cache
(<cache-dir>/libglmcuda/abi<N>-<hash>/<arch>/libglmcuda.so), and prints the
library path on stdout. An existing build of the same sources, flags and nvcc
is reused unless --force. The CUDA backend finds the library there.

--check compiles and links for sm_90a without needing a GPU (CI): nvcc, headers
and libraries may come from the pinned PyPI wheels:
  eval "$(scripts/install-cuda-wheels.sh)" && glmctl build --check`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := a.v
			o := cudabuild.Options{
				Arch:        v.GetString("arch"),
				NVCC:        v.GetString("nvcc"),
				CUDAHome:    v.GetString("cuda-home"),
				IncludeDirs: v.GetStringSlice("include-dir"),
				LibDirs:     v.GetStringSlice("lib-dir"),
				CacheDir:    v.GetString("cache-dir"),
				Check:       v.GetBool("check"),
				Force:       v.GetBool("force"),
				Jobs:        v.GetInt("jobs"),
				Verbose:     v.GetBool("verbose"),
				Log:         a.errOut,
			}
			// On a terminal a bar follows the compile units and the link
			// (nvcc runs once per unit); otherwise the build prints a line
			// per unit, as before.
			var (
				bar  *progress.Bar
				last int
			)
			if a.terminal(a.errOut) {
				o.Log = writerFunc(func(p []byte) (int, error) { return bar.Writer(a.errOut).Write(p) })
				o.Progress = func(done, total int) {
					if bar == nil {
						bar = a.progress("libglmcuda: compiling", int64(total), false)
					}
					if done == total-1 {
						bar.Describe("libglmcuda: linking")
					}
					bar.Add(int64(done - last))
					last = done
				}
			}
			lib, err := cudabuild.Build(cmd.Context(), o)
			bar.Finish()
			if err != nil {
				return fmt.Errorf("build: %w", err)
			}
			fmt.Fprintln(a.out, lib)
			return nil
		},
	}
	f := cmd.Flags()
	f.String("arch", "", "target architecture, e.g. sm_90a (H100/H200) or sm_100a (B200); default: detected from the GPU")
	f.String("nvcc", "", "nvcc to use; default: --cuda-home, $CUDA_HOME, /usr/local/cuda, then $PATH")
	f.String("cuda-home", "", "CUDA toolkit root (bin/nvcc, lib64 or lib) [$GLMCTL_CUDA_HOME]")
	f.StringSlice("include-dir", nil, "extra include directory (repeatable), e.g. NCCL's from the wheels ($NCCL_HOME/include is added automatically)")
	f.StringSlice("lib-dir", nil, "extra library directory (repeatable); also recorded as rpath")
	f.String("cache-dir", "", "cache root; default $GLMCTL_CACHE or ~/.cache/glmctl")
	f.Bool("check", false, "compile and link for sm_90a (or --arch) without a GPU: the CI check")
	f.Int("jobs", 0, "parallel nvcc processes (0: one per CPU, at most 16)")
	f.Bool("force", false, "rebuild even if the cache holds this build")
	f.Bool("verbose", false, "print every nvcc command")
	return cmd
}

// writerFunc is an io.Writer made of a function.
type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
