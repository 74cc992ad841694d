package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	wire "github.com/smx-dev/smx/api"
	"github.com/smx-dev/smx/internal/api"
	"github.com/smx-dev/smx/internal/service"
)

func newKernelCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kernel",
		Short: "Guest kernels in the cache, and what is pinned to them",
	}
	cmd.AddCommand(kernelLsCmd(e), kernelRmCmd(e), kernelBuildCmd(e))
	return cmd
}

func kernelBuildCmd(e *env) *cobra.Command {
	var jobs int
	var nice bool
	var workDir string
	cmd := &cobra.Command{
		Use:   "build",
		Short: "Build smx's own guest kernel from Debian's kernel source (cached; new sandboxes then use it)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := e.interruptible()
			defer cancel()
			k, err := e.svc().BuildKernel(ctx, service.KernelBuildRequest{Jobs: jobs, Nice: nice, WorkDir: workDir, Progress: e.stderr})
			if err != nil {
				return err
			}
			fmt.Fprintln(e.stdout, k.Version)
			return nil
		},
	}
	cmd.Flags().IntVarP(&jobs, "jobs", "j", 0, "parallel compile jobs (default: one per CPU)")
	cmd.Flags().BoolVar(&nice, "nice", false, "compile at low priority (nice 10)")
	cmd.Flags().StringVar(&workDir, "work-dir", "", "unpack and compile in DIR and keep it, so a rebuild compiles only what changed (default: in the cache, removed after success)")
	return cmd
}

func kernelLsCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List cached guest kernels and the sandboxes and snapshots pinned to each",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			rows, err := e.svc().ListKernels(e.ctx)
			if err != nil {
				return err
			}
			if asJSON {
				out := []wire.Kernel{}
				for _, r := range rows {
					out = append(out, api.WireKernel(r))
				}
				return writeJSON(e.stdout, out)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "VERSION\tDEFAULT\tSANDBOXES\tSNAPSHOTS")
			for _, r := range rows {
				def := ""
				if r.Default {
					def = "*"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Version, def, joinOrDash(r.Sandboxes), joinOrDash(r.Snapshots))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func kernelRmCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "rm VERSION",
		Short: "Remove a cached guest kernel (refused while a sandbox or snapshot is pinned to it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			v := args[0]
			if err := e.svc().RemoveKernel(e.ctx, v); err != nil {
				return err
			}
			fmt.Fprintln(e.stdout, v)
			return nil
		},
	}
}

func joinOrDash(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, ",")
}
