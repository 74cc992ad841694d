package cli

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/hosttool"
	"github.com/smx-dev/smx/internal/kernel"
	"github.com/smx-dev/smx/internal/service"
	"github.com/smx-dev/smx/internal/supervisor"
	"github.com/smx-dev/smx/internal/vm"
)

// requirement is one thing smx needs on the host.
type requirement struct {
	Name     string `json:"name"`
	Found    bool   `json:"found"`
	Detail   string `json:"detail,omitempty"`
	Fix      string `json:"fix,omitempty"`
	Optional bool   `json:"optional,omitempty"`
}

// hostPackages are the Debian packages `smx setup` installs.
var hostPackages = []string{"qemu-system-x86", "qemu-utils", "e2fsprogs", "busybox-static", "kmod", "xz-utils", "debootstrap"}

func tool(name, pkg, versionFlag string) requirement {
	r := requirement{Name: name, Fix: "apt-get install " + pkg + " (or run `smx setup` as root)"}
	p, err := hosttool.Look(name)
	if err != nil {
		return r
	}
	r.Found, r.Fix = true, ""
	r.Detail = p
	if versionFlag != "" {
		if out, err := exec.Command(p, versionFlag).Output(); err == nil {
			r.Detail += ": " + strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
		}
	}
	return r
}

// qemuTool is the QEMU sandboxes run: $SMX_QEMU or qemu-system-x86_64.
func qemuTool() requirement {
	r := tool(vm.QEMUProgram(), "qemu-system-x86", "--version")
	r.Name = "qemu-system-x86_64"
	return r
}

// qemuVirtioFS says whether the QEMU is new enough for the virtio-fs file
// gateway, and what the user gives up and how to upgrade when it is not.
func qemuVirtioFS() requirement {
	r := requirement{Name: fmt.Sprintf("QEMU >= %d.%d (virtio-fs mounts)", vm.VirtioFSMinQEMU[0], vm.VirtioFSMinQEMU[1]), Optional: true,
		Fix: "mounts use the slower 9P gateway (about 0.2-0.4x a plain share) and files held open in a mount fail after a snapshot restore, fork or template start; " +
			"upgrade QEMU (Debian 12: apt-get install -t bookworm-backports qemu-system-x86; see docs/install.md) or point SMX_QEMU at a newer one"}
	p, err := hosttool.Look(vm.QEMUProgram())
	if err != nil {
		return r
	}
	out, err := exec.Command(p, "--version").Output()
	if err != nil {
		return r
	}
	line := strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	if vm.VirtioFSCapable(line) {
		r.Found, r.Fix, r.Detail = true, "", line
	} else {
		r.Fix = line + ": " + r.Fix
	}
	return r
}

func staticBusybox() requirement {
	r := requirement{Name: "busybox (static)", Fix: "apt-get install busybox-static (or run `smx setup`)"}
	f, err := elf.Open("/bin/busybox")
	if err != nil {
		return r
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			r.Detail = "/bin/busybox is dynamically linked"
			return r
		}
	}
	r.Found, r.Fix, r.Detail = true, "", "/bin/busybox"
	return r
}

type doctorReport struct {
	Requirements []requirement `json:"requirements"`
	Accel        string        `json:"accel"`
	AccelReason  string        `json:"accel_reason"`
	StateDir     string        `json:"state_dir"`
	DiskFree     int64         `json:"disk_free_bytes"`
	OK           bool          `json:"ok"`
}

func (e *env) doctor() doctorReport {
	reqs := []requirement{
		qemuTool(),
		qemuVirtioFS(),
		tool("qemu-img", "qemu-utils", "--version"),
		tool("mkfs.ext4", "e2fsprogs", ""),
		staticBusybox(),
		tool("depmod", "kmod", ""),
		tool("dpkg-deb", "dpkg", ""),
		tool("apt-get", "apt", ""),
	}
	deb := tool("debootstrap", "debootstrap", "")
	deb.Optional = true
	deb.Detail = strings.TrimPrefix(deb.Detail+" (for `smx image build --from debian`)", " ")
	reqs = append(reqs, deb)

	kr := requirement{Name: "guest kernel"}
	if k, err := kernel.Find(e.state.Kernels()); err == nil {
		kr.Found, kr.Detail = true, k.Version+" in "+k.Dir
		if k.Own {
			kr.Detail = k.Version + " (smx's own, everything built in) in " + k.Dir
		}
	} else {
		kr.Fix = "run `smx setup` (downloads the Debian kernel package into the smx cache)"
	}
	reqs = append(reqs, kr)

	ar := requirement{Name: "smx-agent"}
	if p, err := supervisor.AgentPath(); err == nil {
		ar.Found, ar.Detail = true, p
	} else {
		ar.Fix = "build it next to smx: `make` (or set SMX_AGENT)"
	}
	reqs = append(reqs, ar)

	rep := doctorReport{Requirements: reqs, StateDir: e.state.Root, OK: true}
	a, why := vm.DetectAccel()
	rep.Accel, rep.AccelReason = string(a), why
	var st unix.Statfs_t
	dir := e.state.Root
	for dir != "/" {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		dir = parentDir(dir)
	}
	if unix.Statfs(dir, &st) == nil {
		rep.DiskFree = int64(st.Bavail) * int64(st.Bsize)
	}
	for _, r := range reqs {
		if !r.Found && !r.Optional {
			rep.OK = false
		}
	}
	return rep
}

func parentDir(p string) string {
	i := strings.LastIndexByte(strings.TrimRight(p, "/"), '/')
	if i <= 0 {
		return "/"
	}
	return p[:i]
}

func newDoctorCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check the host: QEMU, tools, guest kernel, accelerator, state dir, disk space",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			rep := e.doctor()
			if asJSON {
				if err := writeJSON(e.stdout, rep); err != nil {
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
			pkgs := hostPackages
			if kernelFlag == "smx" {
				pkgs = append(append([]string{}, pkgs...), kernel.BuildPackages()...)
			}
			if err := installPackages(ctx, e, pkgs); err != nil {
				return err
			}
			// The distribution kernel is always fetched: it is what new
			// sandboxes get until smx's own kernel is built.
			k, err := kernel.Ensure(ctx, e.state.Kernels(), e.stderr)
			if err != nil {
				return err
			}
			if kernelFlag == "smx" {
				if k, err = kernel.Build(ctx, e.state.Kernels(), kernel.BuildOptions{Progress: e.stderr}); err != nil {
					return err
				}
			} else if own, err := kernel.Find(e.state.Kernels()); err == nil && own.Own {
				k = own
			} else {
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
			rep := e.doctor()
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

func newSupervisorLogger(w *os.File) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}
