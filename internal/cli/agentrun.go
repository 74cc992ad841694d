package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/service"
)

// presetRecord reads what `smx agent run` left beside a sandbox's spec,
// for attach and ls.
func (e *env) presetRecord(name string) (*service.AgentRecord, error) {
	return e.svc().AgentRecord(name)
}

func agentRunCmd(e *env) *cobra.Command {
	var cf createFlags
	var detach, rm, tty, importConfig, docker bool
	var detachKeys string
	cmd := &cobra.Command{
		Use:   "run PRESET [PATH] [flags] [-- ARGS...]",
		Short: "Run a coding agent (claude, codex, gemini, shell, docker) in a new sandbox on PATH",
		Long: "Build or reuse the preset's image, create a sandbox with the preset's profile,\n" +
			"mount PATH (default: the current directory) at /work under the profile's file\n" +
			"rules, and start the agent on a terminal attached to this one. Detach with\n" +
			"ctrl-p ctrl-q (--detach-keys); the agent keeps running; `smx agent attach NAME`\n" +
			"comes back. Presets: `smx agent presets`.\n\n" +
			"ARGS are appended to the preset's command line, never run instead of it: the\n" +
			"shell preset's command is `bash -l`, so `-- -c 'make test'` runs\n" +
			"`bash -l -c 'make test'` (and `-- sh -c '...'` would run `bash -l sh -c '...'`,\n" +
			"bash running a script file named sh).\n\n" +
			"When stdout is not a terminal (`> out.txt`, a pipe), the agent runs with no\n" +
			"terminal, as `docker run` without -t: its stdout and stderr come apart and plain\n" +
			"(no terminal redraws or CRLF), stdin is passed when it is not a terminal (else the\n" +
			"agent reads an empty stdin), and it cannot be detached from. -t gives it a\n" +
			"terminal anyway.",
		Example: "  smx agent run claude ./repo\n" +
			"  smx agent run claude ./repo -d --worktree fix-login   # own worktree, branch agent/fix-login\n" +
			"  smx agent run codex . -d --name fix1 -- exec \"fix the tests\"\n" +
			"  smx agent run claude . --import-config                # with your ~/.claude settings, skills, MCP servers\n" +
			"  smx agent run claude . --docker                       # with Docker Engine in the guest (or: smx agent run docker .)\n" +
			"  smx agent run shell . -- -c 'make test' > test.log   # bash -l -c 'make test', plain output",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			keys, err := parseDetachKeys(detachKeys)
			if err != nil {
				return err
			}
			dash := cmd.ArgsLenAtDash()
			pos, extra := args, []string(nil)
			if dash >= 0 {
				pos, extra = args[:dash], args[dash:]
			}
			if len(pos) < 1 || len(pos) > 2 {
				return fmt.Errorf("want PRESET [PATH], then -- and the agent's arguments: %w", errdefs.ErrInvalid)
			}
			creq, err := cf.request(nil)
			if err != nil {
				return err
			}
			work := "."
			if len(pos) == 2 {
				work = pos[1]
			}
			if work, err = filepath.Abs(work); err != nil {
				return err
			}
			// Like `docker run` without -t: output that is not a terminal
			// gets the agent's plain output, not a terminal's.
			plain := !detach && !tty && !isTerminal(e.stdout)
			req := service.AgentRequest{Preset: pos[0], Workspace: work, Args: extra, Name: creq.Name,
				CPUs: creq.CPUs, Disk: creq.Disk, Accel: creq.Accel, Mounts: creq.Mounts, Caches: creq.Caches, Cold: e.cold,
				Ports: creq.Ports, PublishExternal: creq.PublishExternal, Timeout: creq.Timeout, IdleStop: creq.IdleStop,
				Term: os.Getenv("TERM"), Remove: rm, Attach: !detach, ImportConfig: importConfig, Docker: docker,
				Worktree: creq.Worktree, WorktreeDir: creq.WorktreeDir}
			if cf.set("memory") {
				req.Memory = cf.memory
			}
			if cf.set("profile") {
				req.Profile = cf.profile
			}
			ctx, cancel := e.interruptible()
			defer cancel()
			ag, err := e.svc().RunAgent(ctx, req, func(p service.AgentProgress) {
				switch p.Stage {
				case "build":
					fmt.Fprintln(e.stderr, p.Message)
				case "image", "warning", "service":
					fmt.Fprintf(e.stderr, "smx: %s\n", p.Message)
				}
			})
			if err != nil {
				return err
			}
			name, rec := ag.Spec.Name, &ag.Agent
			if len(req.Ports) > 0 {
				e.printPorts(e.stderr, name, "smx: ")
			}
			if detach {
				fmt.Fprintln(e.stdout, name)
				return nil
			}
			var code int
			if plain {
				fmt.Fprintf(e.stderr, "smx: %s runs %s in sandbox %s on %s (no terminal: stdout is not one)\n", rec.Preset, shellJoin(rec.Command), name, work)
				_, stdinTerm := terminalFd(e.stdin)
				_, err := e.runExec(service.AgentPlainExec(name, rec), !stdinTerm, rec.Preset)
				if lerr := e.limitStopped(name); lerr != nil {
					return e.afterLimit(name, rm, lerr)
				}
				if err != nil {
					e.svc().Stop(context.WithoutCancel(e.ctx), service.StopRequest{Name: name, Timeout: 10 * time.Second})
					return err
				}
				// The wrapper's own status says nothing: the agent's is
				// in the file it left.
				code, _ = e.svc().AgentExit(e.ctx, name, 15*time.Second)
			} else {
				fmt.Fprintf(e.stderr, "smx: %s runs %s in sandbox %s on %s (detach: %s)\n", rec.Preset, shellJoin(rec.Command), name, work, detachKeys)
				// One exec creates the session and attaches to it, so an
				// agent that ends at once is still seen.
				c, detached, err := e.attach(name, rec, keys, true)
				if lerr := e.limitStopped(name); lerr != nil && !detached {
					return e.afterLimit(name, rm, lerr)
				}
				if err != nil || detached {
					return err
				}
				code = c
			}
			// The agent ended: the sandbox stops and is kept (removed
			// with --rm), as the watcher also does.
			if err := e.svc().EndAgent(context.WithoutCancel(e.ctx), name, rm); err != nil && rm {
				return err
			}
			if rm {
				fmt.Fprintf(e.stderr, "smx: %s exited with status %d; sandbox %s removed\n", rec.Preset, code, name)
			} else {
				fmt.Fprintf(e.stderr, "smx: %s exited with status %d; sandbox %s stopped (`smx agent rm %s` removes it)\n", rec.Preset, code, name, name)
			}
			return exitCode(code, nil)
		},
	}
	cf.register(cmd)
	for _, f := range []string{"image"} {
		cmd.Flags().Lookup(f).Hidden = true
	}
	cmd.Flags().Lookup("profile").DefValue = "the preset's (dev plus its model API credential)"
	cmd.Flags().Lookup("memory").DefValue = "2G"
	cmd.Flags().Lookup("disk").DefValue = "16G"
	cmd.Flags().BoolVarP(&detach, "detach", "d", false, "start the agent and print the sandbox name; attach later")
	cmd.Flags().BoolVar(&rm, "rm", false, "remove the sandbox when the agent exits (its log stays)")
	cmd.Flags().StringVar(&detachKeys, "detach-keys", "ctrl-p,ctrl-q", "key sequence that detaches from the agent")
	cmd.Flags().BoolVarP(&tty, "tty", "t", false, "run the agent on a terminal even when stdout is not one")
	cmd.Flags().BoolVar(&docker, "docker", false, "add Docker Engine to the preset's image and start dockerd in the guest (what the docker preset has; its own image, built once)")
	cmd.Flags().BoolVar(&importConfig, "import-config", false, "copy your own settings, instructions, sub-agents, commands, skills, hooks and MCP servers of the agent (never sign-ins, keys or history) into the guest")
	return cmd
}

func agentAttachCmd(e *env) *cobra.Command {
	var detachKeys string
	cmd := &cobra.Command{
		Use:   "attach NAME",
		Short: "Attach this terminal to the agent `smx agent run` started (detach: ctrl-p ctrl-q)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			keys, err := parseDetachKeys(detachKeys)
			if err != nil {
				return err
			}
			name := args[0]
			if err := e.svc().CheckExec(e.ctx, name); err != nil {
				return err
			}
			rec, err := e.presetRecord(name)
			if err != nil {
				return fmt.Errorf("%s: %w", strings.TrimSuffix(err.Error(), ": "+errdefs.ErrNotFound.Error()), errdefs.ErrInvalid)
			}
			// This terminal's type, not the one agent run had.
			if t := os.Getenv("TERM"); t != "" {
				rec.Term = t
			}
			code, detached, err := e.attach(name, rec, keys, false)
			if err != nil || detached {
				return err
			}
			fmt.Fprintf(e.stderr, "smx: %s exited with status %d\n", rec.Preset, code)
			return exitCode(code, nil)
		},
	}
	cmd.Flags().StringVar(&detachKeys, "detach-keys", "ctrl-p,ctrl-q", "key sequence that detaches from the agent")
	return cmd
}

func agentPresetsCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "presets",
		Short: "List the agent presets (shipped ones and those in ~/.config/smx/presets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			list, err := e.svc().ListPresets(e.ctx)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(e.stdout, list)
			}
			for _, r := range list {
				if r.Error != "" {
					fmt.Fprintf(e.stdout, "%-8s (broken: %s)\n", r.Name, userMessage(r.Error))
					continue
				}
				fmt.Fprintf(e.stdout, "%-8s %-40s image %s (%s)\n", r.Name, r.Description, r.ImageName(), strings.Join(r.Image.Npm, " "))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// presetProgress puts a preset image build's output on stderr.
func (e *env) presetProgress(pr service.AgentProgress) {
	switch pr.Stage {
	case "build":
		fmt.Fprintln(e.stderr, pr.Message)
	case "image", "warning", "service":
		fmt.Fprintf(e.stderr, "smx: %s\n", pr.Message)
	}
}

// ownedMount is service.OwnedMount.
func ownedMount(m string, uid, gid uint32) string { return service.OwnedMount(m, uid, gid) }

// agentWait is the hidden verb of the host process that waits for a
// detached agent's end (service.WaitAgent), started by `smx agent run`.
func agentWaitCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:    "__agent-wait NAME",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return e.svc().WaitAgent(e.ctx, args[0])
		},
	}
}

// attach connects this terminal to the agent's dtach master until the
// agent ends (its exit status is returned) or the user types the detach
// keys (detached is true).
func (e *env) attach(name string, rec *service.AgentRecord, keys []byte, create bool) (code int, detached bool, err error) {
	req := service.AgentExec(name, rec, create)
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	sio := service.ExecIO{Stdout: e.stdout, Stderr: e.stderr}
	size, resize, restore := rawTerminal(e.stdin, done)
	defer restore()
	if size != nil {
		req.Size = size
	}
	sio.Resize = resize
	det := make(chan struct{})
	pr, pw := io.Pipe()
	go func() {
		err := copyUntilKeys(pw, e.stdin, keys)
		if errors.Is(err, errDetach) {
			close(det)
			cancel()
		}
		pw.CloseWithError(err)
	}()
	sio.Stdin = pr
	// Questions the sandbox asks while attached: see asknotify.go.
	go (&askWatcher{e: e, name: name, seen: map[string]bool{}}).run(ctx)
	st, err := e.svc().Exec(ctx, req, sio)
	select {
	case <-det:
		fmt.Fprintf(e.stderr, "\r\nsmx: detached from %s; the agent keeps running (`smx agent attach %s`)\r\n", name, name)
		restore()
		e.printWaiting(name)
		return 0, true, nil
	default:
	}
	if err != nil {
		return 0, false, err
	}
	if st.Code != 0 {
		return 0, false, fmt.Errorf("attach to the agent in %s failed (exit %d): is it still running? `smx agent ls`: %w", name, st.Code, errdefs.ErrFailed)
	}
	// The agent ended; its wrapper left the status (in the guest, or,
	// once the watcher stopped the sandbox, in the record and the log).
	code, _ = e.svc().AgentExit(e.ctx, name, 15*time.Second)
	return code, false, nil
}

var errDetach = errors.New("detach keys")

// afterLimit ends an attached `smx agent run` whose sandbox reached its
// --timeout or --idle-stop: the supervisor stopped it; with --rm it is
// removed here (the watcher does the same; whichever comes first).
func (e *env) afterLimit(name string, rm bool, lerr error) error {
	if rm {
		if err := e.svc().Remove(context.WithoutCancel(e.ctx), service.RemoveRequest{Name: name, Force: true}); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return err
		}
	}
	return lerr
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// copyUntilKeys copies src to dst until src ends or the key sequence keys
// arrives (errDetach). Bytes that start the sequence are held until it is
// complete or broken, as container runtimes do.
func copyUntilKeys(dst io.Writer, src io.Reader, keys []byte) error {
	buf := make([]byte, 4096)
	matched := 0
	for {
		n, err := src.Read(buf)
		out := make([]byte, 0, n+len(keys))
		for _, b := range buf[:n] {
			if len(keys) > 0 && b == keys[matched] {
				matched++
				if matched == len(keys) {
					if len(out) > 0 {
						dst.Write(out)
					}
					return errDetach
				}
				continue
			}
			if matched > 0 {
				out = append(out, keys[:matched]...)
				matched = 0
				if b == keys[0] {
					matched = 1
					continue
				}
			}
			out = append(out, b)
		}
		if len(out) > 0 {
			if _, werr := dst.Write(out); werr != nil {
				return werr
			}
		}
		if err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}

// parseDetachKeys reads docker's --detach-keys syntax: comma-separated
// keys, each a single character or ctrl-X (X a letter or one of @[\]^_).
func parseDetachKeys(s string) ([]byte, error) {
	var out []byte
	for k := range strings.SplitSeq(s, ",") {
		k = strings.TrimSpace(k)
		switch {
		case len(k) == 1:
			out = append(out, k[0])
		case len(k) == 6 && strings.HasPrefix(strings.ToLower(k), "ctrl-"):
			c := k[5]
			switch {
			case c >= 'a' && c <= 'z':
				out = append(out, c-'a'+1)
			case c >= 'A' && c <= 'Z':
				out = append(out, c-'A'+1)
			case strings.IndexByte("@[\\]^_", c) >= 0:
				out = append(out, c&0x1f)
			default:
				return nil, fmt.Errorf("--detach-keys: %q is not a key: use ctrl-a..ctrl-z, ctrl-@, ctrl-[ ... or one character: %w", k, errdefs.ErrInvalid)
			}
		default:
			return nil, fmt.Errorf("--detach-keys: %q is not a key: say e.g. ctrl-p,ctrl-q: %w", k, errdefs.ErrInvalid)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--detach-keys is empty: %w", errdefs.ErrInvalid)
	}
	return out, nil
}
