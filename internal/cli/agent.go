package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	wire "github.com/smx-dev/smx/api"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/service"
	"github.com/smx-dev/smx/internal/supervisor"
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
	mounts  []string               // -v HOST:GUEST[:ro,uid=N,gid=N]
	ports   []string               // -p [HOSTIP:]HOSTPORT:GUESTPORT[/tcp]
	caches  []string               // --volume-cache NAME[:GUESTPATH][:ro|shared]
	// external allows -p to bind an address other than loopback.
	external bool
	timeout  string // --timeout DURATION
	idleStop string // --idle-stop DURATION
	// worktree and worktreeDir: --worktree NAME, --worktree-dir DIR.
	worktree, worktreeDir string
}

func (f *createFlags) register(cmd *cobra.Command) {
	f.set = func(name string) bool { return cmd.Flags().Changed(name) }
	cmd.Flags().StringVar(&f.image, "image", "busybox", "image to boot (see `smx image ls`)")
	cmd.Flags().StringVar(&f.profile, "profile", "dev", "security profile: a built-in (locked, dev, open), a name in the state dir's profiles/, or a file")
	cmd.Flags().StringVar(&f.name, "name", "", "sandbox name (default: generated)")
	cmd.Flags().IntVar(&f.cpus, "cpus", 1, "virtual CPUs")
	cmd.Flags().StringVarP(&f.memory, "memory", "m", "512M", "guest memory (as docker run -m)")
	cmd.Flags().StringVar(&f.disk, "disk", "4G", "root disk size (copy-on-write over the image)")
	cmd.Flags().StringVar(&f.accel, "accel", "", "force the accelerator: kvm or tcg (default: detect)")
	cmd.Flags().StringArrayVarP(&f.mounts, "volume", "v", nil, "share a host folder, decided per path by the profile's files rules (repeatable); OPTIONS: ro, uid=N, gid=N (who your files belong to in the guest; default 0:0), protect=off (let the guest write .git/config, hooks, .envrc, .vscode/ ...: only for a folder no host tool works in)")
	cmd.Flags().StringArrayVar(&f.mounts, "mount", nil, "same as -v")
	cmd.Flags().StringArrayVar(&f.caches, "volume-cache", nil, "use the named package cache NAME, kept in the state dir beyond this sandbox (repeatable; `smx cache ls`): npm, pip, go and cargo are ~/.npm, ~/.cache/pip, ~/go/pkg/mod, ~/.cargo/registry; another NAME:GUESTPATH. A new cache is ro (read-only to the guest, which writes over it in a layer of its own; at the end the host keeps only npm packages whose bytes match their hash) unless :shared (read-write for every sandbox using it)")
	registerPublish(cmd, &f.ports, &f.external)
	cmd.Flags().StringVar(&f.timeout, "timeout", "", "stop the sandbox once it has run this long (e.g. 30m, 2h; each start counts afresh)")
	cmd.Flags().StringVar(&f.idleStop, "idle-stop", "", "stop the sandbox after this long with no exec running, no network traffic and no output (e.g. 15m)")
	cmd.Flags().StringVar(&f.worktree, "worktree", "", "work in a Git worktree NAME of the repository (PATH for `agent run`, else the current directory) on branch agent/NAME, made from its HEAD or reused, mounted at /work; the sandbox may push only that branch")
	cmd.Flags().StringVar(&f.worktreeDir, "worktree-dir", "", "make --worktree's folder in DIR (DIR/NAME; default: in the state dir)")
}

// request turns the flags into a create request.
func (f *createFlags) request(env []string) (service.CreateRequest, error) {
	if f.name == "" && f.set != nil && f.set("name") {
		return service.CreateRequest{}, fmt.Errorf("--name is empty: give a name, or leave --name out for a generated one: %w", errdefs.ErrInvalid)
	}
	if f.cpus < 1 {
		// Zero would mean the default to the service.
		return service.CreateRequest{}, fmt.Errorf("invalid --cpus %d: use 1 to 64: %w", f.cpus, errdefs.ErrInvalid)
	}
	req := service.CreateRequest{
		Name: f.name, Image: f.image, Profile: f.profile, CPUs: f.cpus, Memory: f.memory,
		Accel: f.accel, Env: env, Mounts: f.mounts, Ports: f.ports, PublishExternal: f.external, Caches: f.caches,
		Timeout: f.timeout, IdleStop: f.idleStop, Worktree: f.worktree, WorktreeDir: f.worktreeDir,
	}
	if f.worktreeDir != "" && f.worktree == "" {
		return service.CreateRequest{}, fmt.Errorf("--worktree-dir needs --worktree NAME: %w", errdefs.ErrInvalid)
	}
	// Refused here, before an image build or a boot, not after.
	if _, err := service.ParseLimit("--timeout", f.timeout); err != nil {
		return service.CreateRequest{}, err
	}
	if _, err := service.ParseLimit("--idle-stop", f.idleStop); err != nil {
		return service.CreateRequest{}, err
	}
	if f.set != nil && f.set("disk") {
		req.Disk = f.disk
	}
	return req, nil
}

// startOwned starts a sandbox that belongs to this process when owner (the
// read end of a pipe whose write end this process keeps open) is set: see
// service.StartRequest.Owner.
func (e *env) startOwned(ctx context.Context, name string, owner *os.File) (*service.Sandbox, error) {
	return e.svc().Start(ctx, service.StartRequest{Name: name, Cold: e.cold, Owner: owner})
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
	req := service.ExecRequest{Name: name, Args: args, Env: env, Dir: f.workdir, User: f.user, TTY: f.tty, Label: label}
	return e.runExec(req, f.interactive, args[0])
}

// runExec runs req (the command called what in messages) with the CLI's
// stdio (stdin only when interactive) and returns the command's exit
// code. Interrupts go to the command; a second one ends the wait.
func (e *env) runExec(req service.ExecRequest, interactive bool, what string) (int, error) {
	name := req.Name
	sio := service.ExecIO{Stdout: e.stdout, Stderr: e.stderr}
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	if interactive {
		sio.Stdin = stdinUntil(e.stdin, done)
	}
	sigs := make(chan os.Signal, 4)
	forward := make(chan int, 4)
	sio.Signal = forward
	if req.TTY {
		size, resize, restore := rawTerminal(e.stdin, done)
		defer restore()
		if size != nil {
			req.Size = size
		}
		sio.Resize = resize
	}
	// Ctrl-C and friends go to the guest process first; it decides. A
	// second interrupt ends the wait whatever the guest does (a guest
	// that is stopped, e.g. blocked on a full host disk, cannot decide):
	// the stream closes, which kills the process in the guest. The first
	// one says so at once when the guest cannot see it (a blocked or
	// paused sandbox), and after a moment when the command runs on.
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	var interrupted atomic.Bool
	go func() {
		n := 0
		var later <-chan time.Time
		for {
			select {
			case s := <-sigs:
				if s == syscall.SIGINT || s == syscall.SIGTERM {
					if n++; n == 2 {
						interrupted.Store(true)
						cancel()
					} else if n == 1 {
						if msg := e.interruptNotice(name, what); msg != "" {
							fmt.Fprintf(e.stderr, "\r\nsmx: %s\r\n", msg)
						} else {
							later = time.After(2 * time.Second)
						}
					}
				}
				select {
				case forward <- int(s.(syscall.Signal)):
				default:
				}
			case <-later:
				fmt.Fprintf(e.stderr, "\r\nsmx: %s got the interrupt and still runs in %s; Ctrl-C again stops waiting (and kills it)\r\n", what, name)
			case <-done:
				return
			}
		}
	}()
	st, err := e.svc().Exec(ctx, req, sio)
	if err != nil {
		if ctx.Err() != nil && e.ctx.Err() == nil && interrupted.Load() {
			return 0, &ExitError{Code: 130, Err: fmt.Errorf("interrupted twice: stopped waiting for %s; the command is killed in the sandbox", what)}
		}
		return 0, err
	}
	return st.Code, nil
}

// interruptNotice is what the first interrupt of an exec says at once
// when the guest cannot see it (the sandbox is blocked or paused), or "".
func (e *env) interruptNotice(name, what string) string {
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Second)
	defer cancel()
	in, err := e.svc().Inspect(ctx, name)
	if err != nil {
		return ""
	}
	switch in.State.Status {
	case service.StatusBlocked:
		why := in.State.Error
		if why == "" {
			why = "QEMU stopped the guest on a host I/O error"
		}
		return fmt.Sprintf("sandbox %s is blocked (%s): %s gets the interrupt only once it resumes; Ctrl-C again stops waiting (and kills it)", name, why, what)
	case service.StatusPaused:
		return fmt.Sprintf("sandbox %s is paused: %s gets the interrupt only once `smx agent resume %s` runs; Ctrl-C again stops waiting (and kills it)", name, what, name)
	}
	return ""
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
			creq, err := cf.request(nil)
			if err != nil {
				return err
			}
			// Ctrl-C during boot must not leave a sandbox behind, and
			// neither must a SIGKILL at any time: unless --keep, the
			// sandbox belongs to this process.
			bootCtx, stop := signal.NotifyContext(e.ctx, os.Interrupt, syscall.SIGTERM)
			in, release, err := e.svc().Launch(bootCtx, service.LaunchRequest{CreateRequest: creq, Cold: e.cold, Keep: keep})
			stop()
			if err != nil {
				return err
			}
			defer func() {
				if err := release(); err != nil {
					fmt.Fprintf(e.stderr, "smx: %v\n", err)
				}
			}()
			name := in.Spec.Name
			if len(creq.Ports) > 0 {
				// stdout is the command's.
				e.printPorts(e.stderr, name, "smx: ")
			}
			xf.env = env
			err = exitCode(e.execAs(name, &xf, args, "run"))
			if lerr := e.limitStopped(name); lerr != nil {
				err = lerr
			}
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
		agentPortCmd(e),                                           // port.go
		agentMountCmd(e),                                          // mount.go
		agentSSHCmd(e), agentSSHProxyCmd(e), agentSSHConfigCmd(e), // editor.go
	)
	cmd.AddCommand(agentRunCmd(e), agentAttachCmd(e), agentPresetsCmd(e)) // agentrun.go
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
			creq, err := cf.request(envs)
			if err != nil {
				return err
			}
			in, err := e.svc().Create(e.ctx, creq)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(e.stdout, e.wireSandbox(in))
			}
			fmt.Fprintln(e.stdout, in.Spec.Name)
			if len(creq.Ports) > 0 {
				e.printPorts(e.stderr, in.Spec.Name, "smx: ")
			}
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
			in, err := e.startOwned(e.ctx, args[0], nil)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(e.stdout, e.wireSandbox(in))
			}
			how := "booted"
			if in.State.RestoredFrom != "" {
				how = "restored from " + in.State.RestoredFrom
			}
			fmt.Fprintf(e.stdout, "%s %s (%s in %d ms)\n", in.Spec.Name, in.State.Status, how, in.State.BootMS)
			if len(in.Spec.Ports) > 0 {
				e.printPorts(e.stdout, in.Spec.Name, "")
			}
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
			in, err := e.svc().Stop(e.ctx, service.StopRequest{Name: args[0], Timeout: timeout})
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
	var force, keepWorktree bool
	cmd := &cobra.Command{
		Use:   "rm [-f] NAME...",
		Short: "Remove sandboxes (-f stops running ones first)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var errs []error
			for _, n := range args {
				in, _ := e.svc().Inspect(e.ctx, n)
				if err := e.svc().Remove(e.ctx, service.RemoveRequest{Name: n, Force: force}); err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Fprintln(e.stdout, n)
				if in != nil && in.Spec.Worktree != nil {
					errs = append(errs, e.removeWorktree(in.Spec.Worktree, keepWorktree))
				}
			}
			return errors.Join(errs...)
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "stop the sandbox first if it is running")
	cmd.Flags().BoolVar(&keepWorktree, "keep-worktree", false, "keep the sandbox's --worktree folder even when it is clean")
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
			list, err := e.svc().List(e.ctx)
			if err != nil {
				return err
			}
			entries := []wire.Sandbox{}
			for i := range list {
				entries = append(entries, *e.wireSandbox(&list[i]))
			}
			if asJSON {
				return writeJSON(e.stdout, entries)
			}
			ports := make([]string, len(list))
			for i := range list {
				ports[i] = e.portsColumn(list[i])
			}
			return writeList(e.stdout, entries, ports)
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
			xf.interactive = true
			_, xf.tty = terminalFd(e.stdin)
			return exitCode(e.exec(args[0], &xf, []string{"/bin/sh", "-l"}))
		},
	}
	cmd.Flags().StringVarP(&xf.user, "user", "u", "", "user name or uid[:gid] in the guest (default root)")
	cmd.Flags().StringVarP(&xf.workdir, "workdir", "w", "", "working directory in the guest")
	return cmd
}

func agentCpCmd(e *env) *cobra.Command {
	var maxSize string
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files or directories between the host and a sandbox (one side NAME:/path)",
		Long: "Copy a file or directory between the host and a running sandbox; modes are kept.\n" +
			"  smx agent cp ./src NAME:/work/     copies into /work/ (trailing slash: into the directory)\n" +
			"  smx agent cp ./src NAME:/work/app  copies to /work/app\n" +
			"  smx agent cp NAME:/etc/hosts .     copies out into the current directory\n" +
			"  smx agent cp NAME:/work -          writes a tar stream to stdout\n" +
			"A copy out is checked on the host before anything lands: it must hold only the path\n" +
			"asked for (files, directories, symlinks, hard links within it), at most --max-size\n" +
			"bytes; set-id bits are dropped. A refused copy leaves nothing behind.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcName, srcPath, srcRemote := splitRemote(args[0])
			dstName, dstPath, dstRemote := splitRemote(args[1])
			switch {
			case srcRemote == dstRemote:
				return fmt.Errorf("exactly one of SRC and DST must be NAME:/path: %w", errdefs.ErrInvalid)
			case dstRemote:
				return e.svc().CopyToGuest(e.ctx, dstName, args[0], dstPath)
			case args[1] == "-":
				return e.svc().CopyOut(e.ctx, srcName, srcPath, e.stdout)
			default:
				n, err := parseSize(maxSize)
				if err != nil {
					return err
				}
				_, err = e.svc().CopyFromGuest(e.ctx, srcName, srcPath, args[1], service.CopyLimit(n))
				return err
			}
		},
	}
	cmd.Flags().StringVar(&maxSize, "max-size", strconv.Itoa(service.DefaultCopyMaxBytes>>30)+"G", "largest total of file content a copy out of the sandbox may write")
	return cmd
}

// splitRemote splits "NAME:/path". A local path containing ':' must start
// with "." or "/" to be taken as local.
func splitRemote(s string) (name, path string, remote bool) {
	if strings.HasPrefix(s, "/") || strings.HasPrefix(s, ".") {
		return "", s, false
	}
	n, p, ok := strings.Cut(s, ":")
	if !ok || service.ValidName(n) != nil {
		return "", s, false
	}
	return n, p, true
}

func agentInspectCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect NAME",
		Short: "Show a sandbox's settings, state and QEMU command line",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in, err := e.svc().Inspect(e.ctx, args[0])
			if err != nil {
				return err
			}
			if asJSON {
				// With the agent `smx agent run` started, if any.
				rec, _ := e.presetRecord(in.Spec.Name)
				return writeJSON(e.stdout, struct {
					*service.SandboxInfo
					Agent *service.AgentRecord      `json:"agent,omitempty"`
					Usage []service.CredentialUsage `json:"usage,omitempty"`
				}{in, rec, service.UsageOf(*in)})
			}
			w := e.stdout
			fmt.Fprintf(w, "Name:     %s\nStatus:   %s\nImage:    %s\nCPUs:     %d\nMemory:   %d MiB\nDisk:     %s\nCreated:  %s\nDir:      %s\n",
				in.Spec.Name, in.State.Status, in.Spec.Image, in.Spec.CPUs, in.Spec.MemoryMiB,
				humanBytes(in.Spec.DiskBytes), in.Spec.Created.Local().Format(time.RFC3339), in.Dir)
			for _, m := range in.Spec.Mounts {
				fmt.Fprintf(w, "Mount:    -v %s\n", m)
			}
			for _, c := range in.Spec.Caches {
				fmt.Fprintf(w, "Cache:    --volume-cache %s\n", c)
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
			if in.Spec.Timeout > 0 || in.Spec.IdleStop > 0 {
				fmt.Fprintf(w, "Limits:   %s\n", limitsText(in.Spec))
			}
			if in.State.StopReason != "" {
				fmt.Fprintf(w, "Stopped:  %s\n", in.State.StopReason)
			}
			for _, u := range service.UsageOf(*in) {
				fmt.Fprintf(w, "Spend:    %s\n", spendText(u))
			}
			if r, err := e.presetRecord(in.Spec.Name); err == nil {
				fmt.Fprintf(w, "Agent:    %s: %s\n", r.Preset, shellJoin(r.Command))
				if r.ExitCode != nil {
					fmt.Fprintf(w, "Exited:   %d at %s\n", *r.ExitCode, r.Exited.Local().Format(time.RFC3339))
				}
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

// spendText is one credential's spend for inspect: "claude: 12 requests,
// 48210 tokens (in 45000, out 3210, cache read 40000); today 2 requests,
// 8000 tokens; budget 2000000 tokens per day (spent)".
func spendText(u service.CredentialUsage) string {
	s := fmt.Sprintf("%s: %d requests, %d tokens (in %d, out %d", u.Credential, u.Requests, u.Total(), u.Input, u.Output)
	if u.CacheRead > 0 {
		s += fmt.Sprintf(", cache read %d", u.CacheRead)
	}
	if u.CacheWrite > 0 {
		s += fmt.Sprintf(", cache write %d", u.CacheWrite)
	}
	s += fmt.Sprintf("); today %d requests, %d tokens", u.DayRequests, u.DayTokens)
	if b := u.Budget; b != nil {
		var caps []string
		if b.Tokens > 0 {
			caps = append(caps, fmt.Sprintf("%d tokens", b.Tokens))
		}
		if b.Requests > 0 {
			caps = append(caps, fmt.Sprintf("%d requests", b.Requests))
		}
		s += "; budget " + strings.Join(caps, " and ") + " per " + b.Per
		req, tok := u.Requests, u.Total()
		if b.Per == "day" {
			req, tok = u.DayRequests, u.DayTokens
		}
		switch spent := (b.Requests > 0 && req >= b.Requests) || (b.Tokens > 0 && tok >= b.Tokens); {
		case spent && b.Ask:
			s += " (spent: model requests are asked of the host user)"
		case spent:
			s += " (spent: model requests are refused)"
		case b.Ask:
			s += ", asks when spent"
		}
	}
	return s
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

// newSuperviseCmd is the hidden command sandbox.Manager starts as a
// sandbox's supervisor; supervisor.Main does the rest.
func newSuperviseCmd(e *env) *cobra.Command {
	var o supervisor.MainOptions
	cmd := &cobra.Command{
		Use:    "__supervise [NAME]",
		Hidden: true,
		Args:   cobra.RangeArgs(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.State = e.state
			if len(args) == 1 {
				o.Name = args[0]
			}
			return supervisor.Main(e.ctx, o)
		},
	}
	cmd.Flags().BoolVar(&o.Cold, "cold", false, "boot even when a boot template could be restored")
	cmd.Flags().BoolVar(&o.LogCreate, "log-create", false, "write the sandbox.create record first (the sandbox was created without it)")
	return cmd
}

// limitsText shows a sandbox's --timeout and --idle-stop.
func limitsText(sp service.SandboxSpec) string {
	var parts []string
	if sp.Timeout > 0 {
		parts = append(parts, "--timeout "+sp.Timeout.String())
	}
	if sp.IdleStop > 0 {
		parts = append(parts, "--idle-stop "+sp.IdleStop.String())
	}
	return strings.Join(parts, ", ")
}

// limitStopped is the one line for an attached CLI whose sandbox its
// supervisor stopped at a limit (--timeout, --idle-stop), as smx's own
// failure (exit 125); nil when it was not.
func (e *env) limitStopped(name string) error {
	in, err := e.svc().Inspect(context.WithoutCancel(e.ctx), name)
	if err != nil || in.State.StopReason == "" {
		return nil
	}
	return &ExitError{Code: exitSmxError, Err: fmt.Errorf("sandbox %s stopped: %s", name, in.State.StopReason)}
}

// removeWorktree removes a removed sandbox's worktree when it is clean
// (unless keep) and says what became of it.
func (e *env) removeWorktree(wt *service.Worktree, keep bool) error {
	if keep {
		fmt.Fprintf(e.stderr, "smx: worktree %s (branch %s) kept\n", wt.Path, wt.Branch)
		return nil
	}
	r, err := e.svc().RemoveWorktree(context.WithoutCancel(e.ctx), wt)
	if err != nil {
		return err
	}
	if r.Removed {
		fmt.Fprintf(e.stderr, "smx: worktree %s removed (branch %s stays in %s)\n", r.Path, r.Branch, wt.Repo)
	} else {
		fmt.Fprintf(e.stderr, "smx: worktree %s (branch %s) kept: %s; `git worktree remove %s` in %s removes it\n", r.Path, r.Branch, r.Reason, r.Path, wt.Repo)
	}
	return nil
}
