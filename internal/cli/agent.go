package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"smx/internal/agentproto"
	"smx/internal/audit"
	"smx/internal/errdefs"
	"smx/internal/kernel"
	"smx/internal/sandbox"
	"smx/internal/statedir"
	"smx/internal/supervisor"
	"smx/internal/tarfs"
)

// createFlags are shared by `smx run` and `smx agent create`.
type createFlags struct {
	profile string
	image   string
	name    string
	cpus    int
	memory  string
	disk    string
	accel   string
	set     func(name string) bool // whether the user gave the flag
	mounts  []string               // -v HOST:GUEST[:ro]
}

func (f *createFlags) register(cmd *cobra.Command) {
	f.set = func(name string) bool { return cmd.Flags().Changed(name) }
	cmd.Flags().StringVar(&f.image, "image", "busybox", "image to boot (see `smx image ls`)")
	cmd.Flags().StringVar(&f.profile, "profile", "dev", "security profile: a built-in (locked, dev, open), a name in the state dir's profiles/, or a file")
	cmd.Flags().StringVar(&f.name, "name", "", "sandbox name (default: generated)")
	cmd.Flags().IntVar(&f.cpus, "cpus", 1, "virtual CPUs")
	cmd.Flags().StringVar(&f.memory, "memory", "512M", "guest memory")
	cmd.Flags().StringVar(&f.disk, "disk", "4G", "root disk size (copy-on-write over the image)")
	cmd.Flags().StringVar(&f.accel, "accel", "", "force the accelerator: kvm or tcg (default: detect)")
	cmd.Flags().StringArrayVarP(&f.mounts, "volume", "v", nil, "share a host folder, decided per path by the profile's files rules (repeatable)")
	cmd.Flags().StringArrayVar(&f.mounts, "mount", nil, "same as -v")
}

// create records a sandbox and its disk; it undoes itself on failure.
func (e *env) create(f *createFlags, env []string) (*sandbox.Info, error) {
	if f.name == "" && f.set != nil && f.set("name") {
		return nil, fmt.Errorf("--name is empty: give a name, or leave --name out for a generated one: %w", errdefs.ErrInvalid)
	}
	if f.name == "" {
		b := make([]byte, 4)
		rand.Read(b)
		f.name = "smx-" + hex.EncodeToString(b)
	}
	if err := sandbox.ValidName(f.name); err != nil {
		return nil, err
	}
	if f.cpus < 1 || f.cpus > 64 {
		return nil, fmt.Errorf("invalid --cpus %d: use 1 to 64: %w", f.cpus, errdefs.ErrInvalid)
	}
	mem, err := parseSize(f.memory)
	if err != nil {
		return nil, fmt.Errorf("--memory: %w", err)
	}
	if mem < 64<<20 || mem > 1<<40 {
		return nil, fmt.Errorf("invalid --memory %s: use 64M to 1T: %w", f.memory, errdefs.ErrInvalid)
	}
	if err := checkMemory(f.memory, mem); err != nil {
		return nil, err
	}
	disk, err := parseSize(f.disk)
	if err != nil {
		return nil, fmt.Errorf("--disk: %w", err)
	}
	switch f.accel {
	case "", "kvm", "tcg":
	default:
		return nil, fmt.Errorf("invalid --accel %q: use kvm or tcg: %w", f.accel, errdefs.ErrInvalid)
	}
	prof, err := e.resolveProfile(f.profile)
	if err != nil {
		return nil, fmt.Errorf("--profile: %w", err)
	}
	mounts, err := parseMounts(f.mounts, prof)
	if err != nil {
		return nil, err
	}
	profYAML, err := prof.FrozenYAML()
	if err != nil {
		return nil, err
	}
	img, err := e.images().Get(f.image)
	if err != nil {
		return nil, err
	}
	if disk, err = e.checkDisk(f, disk, img); err != nil {
		return nil, err
	}
	m := e.manager()
	lock, err := m.LockAll()
	if err != nil {
		return nil, err
	}
	defer lock.Unlock()
	// Pinned to the newest cached kernel; with none cached yet, the first
	// start pins the one `smx setup` brings.
	var kernelVersion string
	if k, err := kernel.Find(e.state.Kernels()); err == nil {
		kernelVersion = k.Version
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}
	p, err := m.Create(sandbox.Spec{
		Name: f.name, Image: img.Name, ImageBase: img.Path, Kernel: kernelVersion,
		CPUs: f.cpus, MemoryMiB: int(mem >> 20), DiskBytes: disk,
		Accel: f.accel, Env: env, Created: time.Now().UTC(),
		Profile: f.profile, ProfileHash: prof.Hash, Mounts: mounts,
	})
	if err != nil {
		return nil, err
	}
	if err := statedir.WriteFileAtomic(p.Profile(), profYAML, 0o600); err != nil {
		m.Remove(f.name)
		return nil, err
	}
	if err := img.CreateOverlay(e.ctx, p.Disk(), disk); err != nil {
		m.Remove(f.name)
		return nil, err
	}
	e.logEvent(f.name, audit.KindSandboxCreate, map[string]any{
		"image": img.Name, "image_digest": img.Digest, "profile": f.profile, "profile_hash": prof.Hash,
		"cpus": f.cpus, "memory_mib": mem >> 20, "disk_bytes": disk, "mounts": mountStrings(mounts),
	})
	return m.Get(f.name)
}

func (e *env) start(ctx context.Context, name string) (*sandbox.Info, error) {
	return e.startOwned(ctx, name, nil)
}

// startOwned starts a sandbox that belongs to this process when owner (the
// read end of a pipe whose write end this process keeps open) is set: see
// sandbox.Manager.StartOwned.
func (e *env) startOwned(ctx context.Context, name string, owner *os.File) (*sandbox.Info, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	argv := []string{exe, "__supervise", name}
	if e.cold {
		argv = append(argv, "--cold")
	}
	in, err := e.manager().StartOwned(ctx, name, argv, owner)
	// The accelerator and why are said by doctor, setup and inspect; a
	// command's own stderr stays the command's.
	if err != nil && in != nil && len(in.State.ConsoleTail) > 0 {
		err = fmt.Errorf("%w\nlast console lines:\n  %s", err, strings.Join(in.State.ConsoleTail, "\n  "))
	}
	return in, err
}

// remove stops a sandbox if asked to and deletes it.
func (e *env) remove(name string, force bool) error {
	m := e.manager()
	in, err := m.Get(name)
	if err != nil {
		return err
	}
	if sandbox.SupervisorAlive(m.Paths(name)) {
		if !force {
			return fmt.Errorf("sandbox %s is %s: stop it first or use `smx agent rm -f %s`: %w", name, in.State.Status, name, errdefs.ErrInUse)
		}
		if err := m.Stop(e.ctx, name, 10*time.Second); err != nil {
			return err
		}
	}
	lock, err := m.LockAll()
	if err != nil {
		return err
	}
	defer lock.Unlock()
	if in, err = m.Get(name); err != nil {
		return err
	}
	if err := m.Remove(name); err != nil {
		return err
	}
	fields := map[string]any{"status": string(in.State.Status)}
	if in.State.Status == sandbox.StatusCrashed {
		fields["error"] = in.State.Error
	}
	e.logEvent(name, audit.KindSandboxRemove, fields)
	return nil
}

type execFlags struct {
	interactive bool
	tty         bool
	env         []string
	workdir     string
	user        string
}

func (f *execFlags) register(cmd *cobra.Command, withUser bool) {
	cmd.Flags().BoolVarP(&f.interactive, "interactive", "i", false, "pass stdin to the command")
	cmd.Flags().BoolVarP(&f.tty, "tty", "t", false, "run the command on a pseudo-terminal")
	cmd.Flags().StringArrayVarP(&f.env, "env", "e", nil, "set an environment variable KEY=VALUE (repeatable)")
	cmd.Flags().StringVarP(&f.workdir, "workdir", "w", "", "working directory in the guest")
	if withUser {
		cmd.Flags().StringVarP(&f.user, "user", "u", "", "user name or uid[:gid] in the guest (default root)")
	}
}

// exec runs args in a running sandbox with the CLI's stdio, and returns the
// command's exit code.
func (e *env) exec(name string, f *execFlags, args []string) (int, error) {
	return e.execAs(name, f, args, "")
}

// execAs is exec with the supervisor's audit label ("run" for `smx run`).
func (e *env) execAs(name string, f *execFlags, args []string, label string) (int, error) {
	env, err := parseEnv(f.env)
	if err != nil {
		return 0, err
	}
	if len(args) == 0 {
		return 0, fmt.Errorf("no command given: put it after --, e.g. `-- sh -c 'echo hi'`: %w", errdefs.ErrInvalid)
	}
	if err := checkTTY(e.stdin, f); err != nil {
		return 0, err
	}
	if t := os.Getenv("TERM"); f.tty && t != "" {
		// The guest's terminal is this one: say what it is (-e wins).
		env = append([]string{"TERM=" + t}, env...)
	}
	c := &sandbox.Client{Paths: e.manager().Paths(name)}
	req := agentproto.ExecRequest{Args: args, Env: env, Dir: f.workdir, User: f.user, TTY: f.tty}
	sio := sandbox.ExecIO{Stdout: e.stdout, Stderr: e.stderr}
	if f.interactive {
		sio.Stdin = e.stdin
	}
	sigs := make(chan os.Signal, 4)
	forward := make(chan int, 4)
	sio.Signal = forward
	if f.tty {
		fd, isTerm := terminalFd(e.stdin)
		if isTerm {
			old, err := term.MakeRaw(fd)
			if err == nil {
				defer term.Restore(fd, old)
			}
			if w, h, err := term.GetSize(fd); err == nil {
				req.Size = &agentproto.WindowSize{Rows: uint16(h), Cols: uint16(w)}
			}
			resize := make(chan agentproto.WindowSize, 1)
			sio.Resize = resize
			winch := make(chan os.Signal, 1)
			signal.Notify(winch, syscall.SIGWINCH)
			defer signal.Stop(winch)
			go func() {
				for range winch {
					if w, h, err := term.GetSize(fd); err == nil {
						select {
						case resize <- agentproto.WindowSize{Rows: uint16(h), Cols: uint16(w)}:
						default:
						}
					}
				}
			}()
		}
	}
	// Ctrl-C and friends go to the guest process first; it decides. A
	// second interrupt ends the wait whatever the guest does (a guest
	// that is stopped, e.g. blocked on a full host disk, cannot decide):
	// the stream closes, which kills the process in the guest.
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	var interrupted atomic.Bool
	go func() {
		n := 0
		for {
			select {
			case s := <-sigs:
				if s == syscall.SIGINT || s == syscall.SIGTERM {
					if n++; n == 2 {
						interrupted.Store(true)
						cancel()
					}
				}
				select {
				case forward <- int(s.(syscall.Signal)):
				default:
				}
			case <-done:
				return
			}
		}
	}()
	st, err := c.ExecLabeled(ctx, req, sio, label)
	if err != nil {
		if ctx.Err() != nil && e.ctx.Err() == nil && interrupted.Load() {
			return 0, &ExitError{Code: 130, Err: fmt.Errorf("interrupted twice: stopped waiting for %s; the command is killed in the sandbox", args[0])}
		}
		return 0, err
	}
	return st.Code, nil
}

// exitCode turns a guest command's exit code into the CLI's: nil for 0,
// an ExitError carrying it otherwise.
func exitCode(code int, err error) error {
	if err != nil {
		return execExitError(err)
	}
	if code != 0 {
		return &ExitError{Code: code}
	}
	return nil
}

// checkTTY refuses -it when stdin is not a terminal, as docker does: a
// terminal has no end of file, so input piped into one never ends for a
// shell that flushes its input when it starts editing lines.
func checkTTY(stdin io.Reader, f *execFlags) error {
	if f.interactive && f.tty {
		if _, ok := terminalFd(stdin); !ok {
			return fmt.Errorf("the input device is not a TTY: drop -t to pipe input, or run from a terminal: %w", errdefs.ErrInvalid)
		}
	}
	return nil
}

func terminalFd(r io.Reader) (int, bool) {
	f, ok := r.(*os.File)
	if !ok {
		return 0, false
	}
	return int(f.Fd()), term.IsTerminal(int(f.Fd()))
}

func newRunCmd(e *env) *cobra.Command {
	var cf createFlags
	var xf execFlags
	var keep bool
	cmd := &cobra.Command{
		Use:   "run [flags] -- CMD [ARG...]",
		Short: "Boot a fresh sandbox, run a command in it, and remove it",
		Long: "Boot a fresh microVM from an image, run CMD in it with this terminal's streams,\n" +
			"remove the sandbox, and exit with CMD's exit code (128+N when killed by signal N).\n" +
			"smx's own failures exit with 125.",
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return fmt.Errorf("no command given: `smx run -- CMD [ARG...]`: %w", errdefs.ErrInvalid)
			}
			env, err := parseEnv(xf.env)
			if err != nil {
				return err
			}
			if err := checkTTY(e.stdin, &xf); err != nil {
				return err
			}
			in, err := e.create(&cf, nil)
			if err != nil {
				return err
			}
			name := in.Spec.Name
			var ownerW *os.File // write end of the owner pipe; closed only once the sandbox is gone
			defer func() {
				if keep {
					return
				}
				defer ownerW.Close()
				// A throwaway sandbox needs no clean guest shutdown: its
				// disk is deleted next.
				m := e.manager()
				m.Stop(context.WithoutCancel(e.ctx), name, time.Millisecond)
				if err := e.remove(name, true); err != nil {
					fmt.Fprintf(e.stderr, "smx: removing sandbox %s: %v\n", name, err)
				}
			}()
			// Ctrl-C during boot must not leave a sandbox behind, and
			// neither must a SIGKILL at any time: the sandbox belongs to
			// this process, and its supervisor removes it when the owner
			// pipe's write end (held here until exit) closes.
			var owner *os.File
			if !keep {
				or, ow, err := os.Pipe()
				if err != nil {
					return err
				}
				owner, ownerW = or, ow
			}
			bootCtx, stop := signal.NotifyContext(e.ctx, os.Interrupt, syscall.SIGTERM)
			_, err = e.startOwned(bootCtx, name, owner)
			if owner != nil {
				owner.Close()
			}
			stop()
			if err != nil {
				return err
			}
			xf.env = env
			err = exitCode(e.execAs(name, &xf, args, "run"))
			if keep {
				// stdout is the command's; the name goes beside the errors.
				fmt.Fprintf(e.stderr, "smx: kept sandbox %s (`smx agent rm -f %s` removes it)\n", name, name)
			}
			return err
		},
	}
	cf.register(cmd)
	xf.register(cmd, true)
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the sandbox running afterwards instead of removing it")
	cmd.Flags().BoolVar(&e.cold, "cold", false, "boot the guest even when a boot template could be restored")
	cmd.Flags().SetInterspersed(false)
	return cmd
}

func newAgentCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{Use: "agent", Short: "Manage sandboxes (one microVM per agent)"}
	cmd.AddCommand(
		agentCreateCmd(e), agentStartCmd(e), agentStopCmd(e), agentRmCmd(e), agentLsCmd(e),
		agentExecCmd(e), agentShellCmd(e), agentCpCmd(e), agentInspectCmd(e), agentLogsCmd(e), agentPolicyCmd(e),
		agentPauseCmd(e), agentResumeCmd(e), agentSuspendCmd(e), agentRestoreCmd(e),
	)
	return cmd
}

func agentCreateCmd(e *env) *cobra.Command {
	var cf createFlags
	var envs []string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a sandbox (does not boot it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] == "" {
				return fmt.Errorf("the sandbox name is empty: name it, or use `smx run` for a throwaway one: %w", errdefs.ErrInvalid)
			}
			cf.name = args[0]
			env, err := parseEnv(envs)
			if err != nil {
				return err
			}
			in, err := e.create(&cf, env)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(e.stdout, e.listEntry(*in))
			}
			fmt.Fprintln(e.stdout, in.Spec.Name)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the new sandbox as JSON")
	cf.register(cmd)
	cmd.Flags().Lookup("name").Hidden = true
	cmd.Flags().StringArrayVarP(&envs, "env", "e", nil, "environment for every command in this sandbox (repeatable)")
	return cmd
}

func agentStartCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "start NAME",
		Short: "Boot a sandbox; it keeps running after this command returns",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in, err := e.start(e.ctx, args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(e.stdout, e.listEntry(*in))
			}
			how := "booted"
			if in.State.RestoredFrom != "" {
				how = "restored from " + in.State.RestoredFrom
			}
			fmt.Fprintf(e.stdout, "%s %s (%s in %d ms)\n", in.Spec.Name, in.State.Status, how, in.State.BootMS)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the started sandbox as JSON")
	cmd.Flags().BoolVar(&e.cold, "cold", false, "boot the guest even when a boot template could be restored")
	return cmd
}

func agentStopCmd(e *env) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "stop NAME",
		Short: "Power a sandbox off: guest shutdown, then QEMU quit, then kill, within --timeout",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := e.manager().Stop(e.ctx, args[0], timeout); err != nil {
				return err
			}
			in, err := e.manager().Get(args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "%s %s\n", args[0], in.State.Status)
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "how long the guest gets to power off before it is forced")
	return cmd
}

func agentRmCmd(e *env) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "rm [-f] NAME...",
		Short: "Remove sandboxes (-f stops running ones first)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var errs []error
			for _, n := range args {
				if err := e.remove(n, force); err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Fprintln(e.stdout, n)
			}
			return errors.Join(errs...)
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "stop the sandbox first if it is running")
	return cmd
}

func agentLsCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"ps"},
		Short:   "List sandboxes and their true status",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			list, err := e.manager().List()
			if err != nil {
				return err
			}
			entries := []listEntry{}
			for _, in := range list {
				entries = append(entries, e.listEntry(in))
			}
			if asJSON {
				return writeJSON(e.stdout, entries)
			}
			return writeList(e.stdout, entries)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func agentExecCmd(e *env) *cobra.Command {
	var xf execFlags
	cmd := &cobra.Command{
		Use:   "exec NAME [flags] -- CMD [ARG...]",
		Short: "Run a command in a running sandbox",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := e.runningSandbox(args[0]); err != nil {
				return err
			}
			return exitCode(e.exec(args[0], &xf, args[1:]))
		},
	}
	xf.register(cmd, true)
	return cmd
}

func agentShellCmd(e *env) *cobra.Command {
	var xf execFlags
	cmd := &cobra.Command{
		Use:   "shell NAME",
		Short: "Open an interactive shell in a running sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := e.runningSandbox(args[0]); err != nil {
				return err
			}
			xf.interactive = true
			_, xf.tty = terminalFd(e.stdin)
			return exitCode(e.exec(args[0], &xf, []string{"/bin/sh", "-l"}))
		},
	}
	cmd.Flags().StringVarP(&xf.user, "user", "u", "", "user name or uid[:gid] in the guest (default root)")
	cmd.Flags().StringVarP(&xf.workdir, "workdir", "w", "", "working directory in the guest")
	return cmd
}

func (e *env) runningSandbox(name string) (*sandbox.Info, error) {
	in, err := e.manager().Get(name)
	if err != nil {
		return nil, err
	}
	if in.State.Status != sandbox.StatusRunning {
		msg := fmt.Sprintf("sandbox %s is %s", name, in.State.Status)
		if in.State.Status == sandbox.StatusBlocked {
			return nil, fmt.Errorf("%s: %s: %w", msg, in.State.Error, errdefs.ErrFailed)
		}
		if in.State.Status == sandbox.StatusCrashed && in.State.Error != "" {
			msg += " (" + in.State.Error + ")"
		}
		verb := "start"
		if in.State.Status == sandbox.StatusPaused || in.State.Status == sandbox.StatusSuspended {
			verb = "resume"
		}
		return nil, fmt.Errorf("%s: %s it with `smx agent %s %s`: %w", msg, verb, verb, name, errdefs.ErrFailed)
	}
	return in, nil
}

func agentCpCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files or directories between the host and a sandbox (one side NAME:/path)",
		Long: "Copy a file or directory between the host and a running sandbox; modes are kept.\n" +
			"  smx agent cp ./src NAME:/work/     copies into /work/ (trailing slash: into the directory)\n" +
			"  smx agent cp ./src NAME:/work/app  copies to /work/app\n" +
			"  smx agent cp NAME:/etc/hosts .     copies out into the current directory\n" +
			"  smx agent cp NAME:/work -          writes a tar stream to stdout",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcName, srcPath, srcRemote := splitRemote(args[0])
			dstName, dstPath, dstRemote := splitRemote(args[1])
			switch {
			case srcRemote == dstRemote:
				return fmt.Errorf("exactly one of SRC and DST must be NAME:/path: %w", errdefs.ErrInvalid)
			case dstRemote:
				return e.copyIn(dstName, args[0], dstPath)
			default:
				return e.copyOut(srcName, srcPath, args[1])
			}
		},
	}
}

// splitRemote splits "NAME:/path". A local path containing ':' must start
// with "." or "/" to be taken as local.
func splitRemote(s string) (name, path string, remote bool) {
	if strings.HasPrefix(s, "/") || strings.HasPrefix(s, ".") {
		return "", s, false
	}
	n, p, ok := strings.Cut(s, ":")
	if !ok || sandbox.ValidName(n) != nil {
		return "", s, false
	}
	return n, p, true
}

func (e *env) copyIn(name, src, dst string) error {
	if _, err := e.runningSandbox(name); err != nil {
		return err
	}
	if !strings.HasPrefix(dst, "/") {
		return fmt.Errorf("guest path %q must be absolute: %w", dst, errdefs.ErrInvalid)
	}
	if _, err := os.Lstat(src); err != nil {
		return fmt.Errorf("cp: %w", err)
	}
	entry := filepath.Base(filepath.Clean(src))
	dir := dst
	if !strings.HasSuffix(dst, "/") {
		dir, entry = filepath.Dir(dst), filepath.Base(dst)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(tarfs.Pack(pw, src, entry)) }()
	c := &sandbox.Client{Paths: e.manager().Paths(name)}
	_, err := c.CopyIn(e.ctx, dir, pr)
	pr.Close()
	return err
}

func (e *env) copyOut(name, src, dst string) error {
	if _, err := e.runningSandbox(name); err != nil {
		return err
	}
	c := &sandbox.Client{Paths: e.manager().Paths(name)}
	if dst == "-" {
		return c.CopyOut(e.ctx, src, e.stdout)
	}
	dir, rename := dst, ""
	if fi, err := os.Stat(dst); err != nil || !fi.IsDir() {
		dir, rename = filepath.Dir(dst), filepath.Base(dst)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		if err == nil {
			return fmt.Errorf("%s is not a directory: %w", dir, errdefs.ErrInvalid)
		}
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("no such directory %s on the host: create it first: %w", dir, errdefs.ErrNotFound)
		}
		return fmt.Errorf("cp: destination: %w", err)
	}
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		_, err := tarfs.Extract(pr, dir, tarfs.Options{Rename: rename, Chown: os.Geteuid() == 0})
		pr.CloseWithError(err)
		errc <- err
	}()
	err := c.CopyOut(e.ctx, src, pw)
	pw.CloseWithError(err)
	if xerr := <-errc; err == nil {
		err = xerr
	}
	return err
}

func agentInspectCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect NAME",
		Short: "Show a sandbox's settings, state and QEMU command line",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in, err := e.manager().Get(args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(e.stdout, in)
			}
			w := e.stdout
			fmt.Fprintf(w, "Name:     %s\nStatus:   %s\nImage:    %s\nCPUs:     %d\nMemory:   %d MiB\nDisk:     %s\nCreated:  %s\nDir:      %s\n",
				in.Spec.Name, in.State.Status, in.Spec.Image, in.Spec.CPUs, in.Spec.MemoryMiB,
				humanBytes(in.Spec.DiskBytes), in.Spec.Created.Local().Format(time.RFC3339), in.Dir)
			for _, m := range in.Spec.Mounts {
				fmt.Fprintf(w, "Mount:    -v %s\n", m)
			}
			if in.State.Accel != "" {
				fmt.Fprintf(w, "Accel:    %s (%s)\nKernel:   %s\n", in.State.Accel, in.State.AccelReason, in.State.Kernel)
			}
			if in.State.SupervisorPID > 0 {
				fmt.Fprintf(w, "PIDs:     supervisor %d, qemu %d\n", in.State.SupervisorPID, in.State.QEMUPID)
			}
			if in.State.BootMS > 0 {
				fmt.Fprintf(w, "Boot:     %d ms\n", in.State.BootMS)
			}
			if in.State.Error != "" {
				fmt.Fprintf(w, "Error:    %s\n", in.State.Error)
			}
			if len(in.State.ConsoleTail) > 0 {
				fmt.Fprintf(w, "Console (last lines):\n  %s\n", strings.Join(in.State.ConsoleTail, "\n  "))
			}
			if len(in.State.QEMUArgs) > 0 {
				fmt.Fprintf(w, "QEMU:\n  %s\n", shellJoin(in.State.QEMUArgs))
			} else {
				fmt.Fprintln(w, "QEMU:     (not started yet)")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func shellJoin(args []string) string {
	var b strings.Builder
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"'$\\;&|<>*?()") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		// One option and its value per line.
		if i > 0 && strings.HasPrefix(a, "-") {
			b.WriteString(" \\\n    ")
		} else if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(a)
	}
	return b.String()
}

func newSuperviseCmd(e *env) *cobra.Command {
	var cold bool
	cmd := &cobra.Command{
		Use:    "__supervise NAME",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			agent, err := supervisor.AgentPath()
			ready := os.NewFile(3, "ready")
			if err != nil {
				if ready != nil {
					fmt.Fprintln(ready, err)
				}
				return err
			}
			ctx, stop := signal.NotifyContext(e.ctx, syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
			log := newSupervisorLogger(os.Stderr)
			// SMX_BOOT_TIMEOUT bounds how long the guest agent may take to
			// answer (default 2 minutes, generous for TCG on a busy host).
			var boot time.Duration
			if v := os.Getenv("SMX_BOOT_TIMEOUT"); v != "" {
				if boot, err = time.ParseDuration(v); err != nil {
					err = fmt.Errorf("SMX_BOOT_TIMEOUT: %w", err)
					fmt.Fprintln(ready, err)
					return err
				}
			}
			opts := supervisor.Options{
				State: e.state, Name: args[0], AgentPath: agent, Logger: log, Ready: ready,
				BootTimeout: boot, Cold: cold,
			}
			if os.Getenv("SMX_OWNER_FD") == strconv.Itoa(sandbox.OwnerFD) {
				os.Unsetenv("SMX_OWNER_FD")
				syscall.CloseOnExec(sandbox.OwnerFD)
				opts.Owner = os.NewFile(sandbox.OwnerFD, "owner")
			}
			return supervisor.Run(ctx, opts)
		},
	}
	cmd.Flags().BoolVar(&cold, "cold", false, "boot even when a boot template could be restored")
	return cmd
}
