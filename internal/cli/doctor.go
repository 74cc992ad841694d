package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/smx-dev/smx/internal/api"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/service"
)

func newDoctorCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check the host: QEMU, tools, guest kernel, accelerator, state dir, disk space",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			rep := e.svc().Doctor(e.ctx)
			if asJSON {
				if err := writeJSON(e.stdout, api.WireDoctor(rep)); err != nil {
					return err
				}
			} else {
				tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
				for _, r := range rep.Requirements {
					mark := "ok"
					if !r.Found {
						mark = "MISSING"
						if r.Optional {
							mark = "optional"
						}
					}
					line := r.Detail
					if !r.Found {
						line = "fix: " + r.Fix
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\n", mark, r.Name, line)
				}
				fmt.Fprintf(tw, "ok\taccelerator\t%s: %s\n", rep.Accel, rep.AccelReason)
				fmt.Fprintf(tw, "ok\tstate dir\t%s (%s free)\n", rep.StateDir, humanBytes(rep.DiskFree))
				tw.Flush()
			}
			if !rep.OK {
				return &ExitError{Code: 1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newSetupCmd(e *env) *cobra.Command {
	var noImage bool
	var kernelFlag string
	cmd := &cobra.Command{
		Use:   "setup",
		Short: "Install host requirements, the guest kernel and the busybox image (idempotent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := e.interruptible()
			defer cancel()
			if err := e.state.Ensure(); err != nil {
				return err
			}
			if kernelFlag != "stock" && kernelFlag != "smx" {
				return fmt.Errorf("setup: --kernel %q: want stock or smx: %w", kernelFlag, errdefs.ErrInvalid)
			}
			pkgs := service.HostPackages
			if kernelFlag == "smx" {
				pkgs = append(append([]string{}, pkgs...), service.KernelBuildPackages()...)
			}
			if err := installPackages(ctx, e, pkgs); err != nil {
				return err
			}
			k, err := e.svc().SetupKernel(ctx, kernelFlag == "smx", e.stderr)
			if err != nil {
				return err
			}
			if !k.Own {
				fmt.Fprintf(e.stderr, "setup: using the Debian kernel; `smx setup --kernel smx` builds smx's own (once, about 10 min on 2 idle cores), which boots sandboxes about twice as fast\n")
			}
			fmt.Fprintf(e.stderr, "setup: guest kernel %s\n", k.Version)
			// A new kernel never switches existing sandboxes: say so.
			if sbs, sns, err := e.svc().PinnedElsewhere(ctx, k.Version); err == nil {
				for v, names := range sbs {
					fmt.Fprintf(e.stderr, "setup: %d sandbox(es) and %d snapshot(s) stay pinned to kernel %s (`smx kernel ls`)\n", len(names), len(sns[v]), v)
					delete(sns, v)
				}
				for v, names := range sns {
					fmt.Fprintf(e.stderr, "setup: %d snapshot(s) stay pinned to kernel %s (`smx kernel ls`)\n", len(names), v)
				}
			}
			if !noImage {
				if _, err := e.svc().InspectImage(ctx, "busybox"); errors.Is(err, errdefs.ErrNotFound) {
					if _, err := e.svc().BuildImage(ctx, service.ImageBuildRequest{Name: "busybox", From: "busybox", Progress: e.stderr}); err != nil {
						return err
					}
				} else if err != nil {
					return err
				}
				fmt.Fprintln(e.stderr, "setup: image busybox ready")
			}
			rep := e.svc().Doctor(ctx)
			if !rep.OK {
				for _, r := range rep.Requirements {
					if !r.Found && !r.Optional {
						fmt.Fprintf(e.stderr, "setup: still missing: %s: %s\n", r.Name, r.Fix)
					}
				}
				return fmt.Errorf("setup incomplete: see `smx doctor`: %w", errdefs.ErrUnavailable)
			}
			fmt.Fprintf(e.stdout, "smx is ready (accelerator: %s: %s)\n", rep.Accel, rep.AccelReason)
			return nil
		},
	}
	cmd.Flags().BoolVar(&noImage, "no-image", false, "do not build the busybox image")
	cmd.Flags().StringVar(&kernelFlag, "kernel", "stock", "stock: fetch Debian's kernel package; smx: also build smx's own kernel from Debian's kernel source (minutes, once). New sandboxes use smx's own whenever it is built")
	return cmd
}

// installPackages installs the missing host packages with apt-get when we
// are root; otherwise it says what to run.
func installPackages(ctx context.Context, e *env, pkgs []string) error {
	var missing []string
	for _, p := range pkgs {
		if err := exec.CommandContext(ctx, "dpkg-query", "-W", "-f=${Status}", p).Run(); err != nil {
			missing = append(missing, p)
			continue
		}
		out, _ := exec.CommandContext(ctx, "dpkg-query", "-W", "-f=${Status}", p).Output()
		if !strings.Contains(string(out), "install ok installed") {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("missing host packages: run `sudo apt-get install %s`, then `smx setup` again: %w", strings.Join(missing, " "), errdefs.ErrUnavailable)
	}
	fmt.Fprintf(e.stderr, "setup: installing %s\n", strings.Join(missing, " "))
	run := func(args ...string) error {
		c := exec.CommandContext(ctx, "apt-get", args...)
		c.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		c.Stdout, c.Stderr = e.stderr, e.stderr
		return c.Run()
	}
	if err := run(append([]string{"install", "-y", "--no-install-recommends"}, missing...)...); err != nil {
		if err := run("update"); err != nil {
			return fmt.Errorf("setup: apt-get update: %w", err)
		}
		if err := run(append([]string{"install", "-y", "--no-install-recommends"}, missing...)...); err != nil {
			return fmt.Errorf("setup: apt-get install %s: %w", strings.Join(missing, " "), err)
		}
	}
	return nil
}
