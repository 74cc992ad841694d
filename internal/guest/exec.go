package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/agentproto"
)

// DefaultPath is PATH for processes whose request does not set one.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// execSpec is an ExecRequest resolved against the guest: who, where, what.
type execSpec struct {
	path string
	argv []string
	env  []string
	dir  string
	cred *syscall.Credential
	root string // chroot; "" for the guest's own root
}

func (s *Server) passwdPath() string {
	if s.PasswdPath != "" {
		return s.PasswdPath
	}
	return "/etc/passwd"
}

func (s *Server) groupPath() string {
	if s.GroupPath != "" {
		return s.GroupPath
	}
	return "/etc/group"
}

// resolve turns a request into something ForkExec can run. Its errors are
// the ones the host sees as FrameError, so they name what was wrong.
func (s *Server) resolve(req *agentproto.ExecRequest) (*execSpec, error) {
	if req == nil || len(req.Args) == 0 || req.Args[0] == "" {
		return nil, errors.New("guest: exec: no command given")
	}
	sp := &execSpec{argv: req.Args}
	// in names a path of the process's file system as the agent sees it.
	in := func(p string) string { return p }
	passwd, group := s.passwdPath(), s.groupPath()
	if req.Root != "" {
		if err := prepareRoot(req.Root); err != nil {
			return nil, err
		}
		sp.root = req.Root
		in = func(p string) string { return filepath.Join(req.Root, p) }
		passwd, group = in("/etc/passwd"), in("/etc/group")
	}

	var name, home string
	if req.User == "" {
		// The agent's own identity: root in the guest.
		name, home = homeOf(passwd, uint32(os.Geteuid()), "/")
	} else {
		id, err := LookupUser(req.User, passwd, group)
		if err != nil {
			return nil, err
		}
		name, home = id.Name, id.Home
		sp.cred = &syscall.Credential{Uid: id.UID, Gid: id.GID, Groups: id.Groups}
		if sp.cred.Groups == nil {
			// Empty, not nil: drop the agent's supplementary groups.
			sp.cred.Groups = []uint32{}
		}
	}

	env := newEnvList()
	env.set("PATH", DefaultPath)
	env.set("HOME", home)
	if name != "" {
		env.set("USER", name)
		env.set("LOGNAME", name)
	}
	if req.TTY {
		env.set("TERM", "xterm")
	}
	for _, kv := range req.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("guest: exec: bad environment entry %q: want KEY=VALUE", kv)
		}
		env.set(k, v)
	}
	sp.env = env.list()

	sp.dir = req.Dir
	if sp.dir == "" {
		sp.dir = "/"
		if fi, err := os.Stat(in(home)); err == nil && fi.IsDir() {
			sp.dir = home
		}
	} else {
		fi, err := os.Stat(in(sp.dir))
		if err != nil {
			return nil, fmt.Errorf("guest: exec: working directory: %w", err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("guest: exec: working directory %s: not a directory", sp.dir)
		}
	}

	path, err := lookPath(req.Args[0], env.get("PATH"), sp.dir, in)
	if err != nil {
		return nil, err
	}
	sp.path = path
	return sp, nil
}

// envList is an environment that keeps first-set order and lets later
// entries override earlier ones.
type envList struct {
	keys []string
	vals map[string]string
}

func newEnvList() *envList { return &envList{vals: map[string]string{}} }

func (e *envList) set(k, v string) {
	if _, ok := e.vals[k]; !ok {
		e.keys = append(e.keys, k)
	}
	e.vals[k] = v
}

func (e *envList) get(k string) string { return e.vals[k] }

func (e *envList) list() []string {
	out := make([]string, 0, len(e.keys))
	for _, k := range e.keys {
		out = append(out, k+"="+e.vals[k])
	}
	return out
}

// lookPath is exec.LookPath against the process's environment, working
// directory and root (in maps a path of the process's file system to the
// agent's) rather than the agent's; the path it returns is the process's.
func lookPath(file, pathEnv, dir string, in func(string) string) (string, error) {
	if strings.Contains(file, "/") {
		p := file
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if err := findExecutable(in(p)); err != nil {
			return "", &exec.Error{Name: file, Err: err}
		}
		return p, nil
	}
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, file)
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if findExecutable(in(p)) == nil {
			return p, nil
		}
	}
	return "", &exec.Error{Name: file, Err: exec.ErrNotFound}
}

func findExecutable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return syscall.EISDIR
	}
	if fi.Mode()&0o111 == 0 {
		return fs.ErrPermission
	}
	return nil
}

// process is a started exec request.
type process struct {
	pid    int
	mu     sync.Mutex
	exited bool
}

// signal delivers sig to the process group, or the process if it has no
// group of its own. Once the process has been reaped its pid may belong to
// someone else, so nothing is sent any more.
func (p *process) signal(sig unix.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return nil
	}
	err := unix.Kill(-p.pid, sig)
	if errors.Is(err, unix.ESRCH) {
		err = unix.Kill(p.pid, sig)
	}
	return err
}

func (p *process) markExited() {
	p.mu.Lock()
	p.exited = true
	p.mu.Unlock()
}

// exec runs one OpExec request. Errors returned before the process starts
// become the request's FrameError; once FrameStarted is sent the request
// always ends with FrameExit (unless the host is gone).
func (s *Server) exec(ctx context.Context, w *agentproto.LockedWriter, stream io.Reader, req *agentproto.ExecRequest) error {
	sp, err := s.resolve(req)
	if err != nil {
		return err
	}

	// childFiles go to the process and are closed here once it started;
	// the rest are the agent's ends.
	var (
		childFiles     []*os.File
		stdin          *os.File // agent's end of stdin (pipe writer or pty master)
		outputs        []*os.File
		outTypes       []agentproto.FrameType
		master         *os.File
		sys            = &syscall.SysProcAttr{Setsid: true, Credential: sp.cred, Chroot: sp.root}
		closeAllParent = func() {
			for _, f := range outputs {
				f.Close()
			}
			if stdin != nil {
				stdin.Close()
			}
		}
	)
	defer func() {
		for _, f := range childFiles {
			f.Close()
		}
	}()

	if req.TTY {
		m, tty, err := pty.Open()
		if err != nil {
			return fmt.Errorf("guest: exec: open pty: %w", err)
		}
		master = m
		if req.Size != nil {
			_ = pty.Setsize(master, &pty.Winsize{Rows: req.Size.Rows, Cols: req.Size.Cols})
		}
		childFiles = []*os.File{tty, tty, tty}
		stdin = master
		outputs = []*os.File{master}
		outTypes = []agentproto.FrameType{agentproto.FrameStdout}
		sys.Setctty = true
		sys.Ctty = 0
	} else {
		var in *os.File
		if req.Stdin {
			r, pw, err := os.Pipe()
			if err != nil {
				return fmt.Errorf("guest: exec: %w", err)
			}
			in, stdin = r, pw
		} else {
			in, err = os.Open(os.DevNull)
			if err != nil {
				return fmt.Errorf("guest: exec: %w", err)
			}
		}
		childFiles = append(childFiles, in)
		for _, t := range []agentproto.FrameType{agentproto.FrameStdout, agentproto.FrameStderr} {
			r, pw, err := os.Pipe()
			if err != nil {
				for _, f := range childFiles {
					f.Close()
				}
				closeAllParent()
				return fmt.Errorf("guest: exec: %w", err)
			}
			childFiles = append(childFiles, pw)
			outputs = append(outputs, r)
			outTypes = append(outTypes, t)
		}
	}

	// Fd puts the child's ends into blocking mode, which is what the child
	// expects; the agent's ends are separate open files and stay
	// non-blocking.
	fds := make([]uintptr, len(childFiles))
	for i, f := range childFiles {
		fds[i] = f.Fd()
	}
	pid, done, err := s.Reaper.Start(func() (int, error) {
		return syscall.ForkExec(sp.path, sp.argv, &syscall.ProcAttr{
			Dir:   sp.dir,
			Env:   sp.env,
			Files: fds,
			Sys:   sys,
		})
	})
	runtime.KeepAlive(childFiles)
	for _, f := range childFiles {
		f.Close()
	}
	childFiles = nil
	if err != nil {
		closeAllParent()
		return &errStart{fmt.Errorf("guest: exec: start %s: %w", sp.argv[0], err)}
	}
	p := &process{pid: pid}
	s.Log.Debug("exec started", "pid", pid, "args", sp.argv, "tty", req.TTY, "root", sp.root)
	// Set from outside once the process runs: ForkExec has no hook in the
	// child, and the agent's own limits (PID 1) must not change. The
	// process may run briefly under the guest's defaults.
	for _, rl := range req.Rlimits {
		lim := unix.Rlimit{Cur: rl.Soft, Max: rl.Hard}
		if err := unix.Prlimit(pid, rl.Resource, &lim, nil); err != nil {
			s.Log.Warn("exec: rlimit", "pid", pid, "resource", rl.Resource, "err", err)
		}
	}

	var killOnce sync.Once
	hostGone := func() {
		killOnce.Do(func() {
			p.mu.Lock()
			running := !p.exited
			p.mu.Unlock()
			if running {
				s.Log.Debug("exec: host went away; killing process group", "pid", pid)
				_ = p.signal(unix.SIGKILL)
			}
		})
	}

	if err := agentproto.WriteJSON(w, agentproto.FrameStarted, agentproto.Started{PID: pid}); err != nil {
		hostGone()
	}

	var pumps sync.WaitGroup
	for i, f := range outputs {
		pumps.Add(1)
		go func(f *os.File, t agentproto.FrameType) {
			defer pumps.Done()
			// Reading straight into a frame-sized buffer and writing one
			// frame per read keeps memory bounded: a slow host stalls the
			// write, which stalls the read, which fills the pipe and blocks
			// the process.
			buf := make([]byte, agentproto.DataChunk)
			for {
				n, err := f.Read(buf)
				if n > 0 {
					if werr := agentproto.WriteFrame(w, t, buf[:n]); werr != nil {
						hostGone()
						return
					}
				}
				if err != nil {
					// EOF for pipes; EIO for a pty whose last slave fd closed.
					return
				}
			}
		}(f, outTypes[i])
	}

	stdinCh := make(chan []byte, 4)
	go pumpStdin(stdin, stdinCh, req.TTY)
	go s.execInput(stream, p, stdinCh, master, req.Stdin || req.TTY, hostGone)

	ws := <-done
	p.markExited()

	drained := make(chan struct{})
	go func() {
		pumps.Wait()
		close(drained)
	}()
	select {
	case <-drained:
	case <-time.After(s.drainTimeout()):
		s.Log.Debug("exec: output still open after exit; closing it", "pid", pid)
		for _, f := range outputs {
			f.Close()
		}
		<-drained
	case <-ctx.Done():
		for _, f := range outputs {
			f.Close()
		}
		<-drained
	}
	closeAllParent()

	st := agentproto.ExitStatus{}
	switch {
	case ws.Exited():
		st.Code = ws.ExitStatus()
	case ws.Signaled():
		st.Signal = int(ws.Signal())
		st.Code = 128 + st.Signal
	}
	s.Log.Debug("exec exited", "pid", pid, "code", st.Code, "signal", st.Signal)
	if err := agentproto.WriteJSON(w, agentproto.FrameExit, st); err != nil {
		s.Log.Debug("exec: send exit", "err", err)
	}
	return nil
}

func (s *Server) drainTimeout() time.Duration {
	if s.DrainTimeout > 0 {
		return s.DrainTimeout
	}
	return 3 * time.Second
}

// pumpStdin writes host stdin to the process. A nil chunk means end of
// input. Writes that fail (the process closed stdin) make it discard the
// rest, so the host is never blocked by a process that stopped reading
// and exited.
func pumpStdin(f *os.File, ch <-chan []byte, tty bool) {
	failed := f == nil
	closed := false
	for b := range ch {
		if failed || closed {
			continue
		}
		if b == nil {
			if tty {
				// A terminal has no end of file; ^D is how a user says it.
				_, err := f.Write([]byte{4})
				failed = err != nil
			} else {
				f.Close()
				closed = true
			}
			continue
		}
		if _, err := f.Write(b); err != nil {
			failed = true
		}
	}
	if f != nil && !tty && !closed {
		f.Close()
	}
}

// execInput reads the host's frames for a running process until the stream
// ends. A stream that ends before the process does means the host is gone,
// and nothing the process started should outlive that.
func (s *Server) execInput(r io.Reader, p *process, stdin chan<- []byte, master *os.File, wantStdin bool, hostGone func()) {
	defer close(stdin)
	var buf []byte
	for {
		t, payload, err := agentproto.ReadFrame(r, buf)
		if err != nil {
			hostGone()
			return
		}
		if cap(payload) > cap(buf) {
			buf = payload[:0]
		}
		switch t {
		case agentproto.FrameStdin:
			if wantStdin && len(payload) > 0 {
				stdin <- append([]byte(nil), payload...)
			}
		case agentproto.FrameStdinEOF:
			if wantStdin {
				stdin <- nil
			}
		case agentproto.FrameResize:
			var ws agentproto.WindowSize
			if master == nil || json.Unmarshal(payload, &ws) != nil {
				continue
			}
			_ = pty.Setsize(master, &pty.Winsize{Rows: ws.Rows, Cols: ws.Cols})
		case agentproto.FrameSignal:
			var sig agentproto.Signal
			if json.Unmarshal(payload, &sig) != nil || sig.Signal <= 0 || sig.Signal > 64 {
				s.Log.Debug("exec: bad signal frame", "payload", string(payload))
				continue
			}
			if err := p.signal(unix.Signal(sig.Signal)); err != nil {
				s.Log.Debug("exec: signal", "pid", p.pid, "signal", sig.Signal, "err", err)
			}
		default:
			s.Log.Debug("exec: unexpected frame", "type", t)
		}
	}
}

// chrootMounts serialises prepareRoot: two execs into one new root would
// otherwise both mount.
var chrootMounts sync.Mutex

// prepareRoot mounts the guest's /proc, /sys and /dev into a container's
// root file system, once: a mount point whose file system is no longer
// root's own already has its mount. The mount points must exist in root;
// the host creates them (internal/shim).
func prepareRoot(root string) error {
	chrootMounts.Lock()
	defer chrootMounts.Unlock()
	var rst unix.Statfs_t
	if err := unix.Statfs(root, &rst); err != nil {
		return fmt.Errorf("guest: exec: root: %w", err)
	}
	for _, m := range []struct {
		dir, fstype, src string
		flags            uintptr
	}{
		{"proc", "proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
		{"sys", "sysfs", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_RDONLY},
		{"dev", "", "/dev", unix.MS_BIND | unix.MS_REC},
	} {
		target := filepath.Join(root, m.dir)
		if fi, err := os.Lstat(target); err != nil || !fi.IsDir() {
			continue // the image has no such directory: nothing to mount on
		}
		var st unix.Statfs_t
		if unix.Statfs(target, &st) == nil && st.Type != rst.Type {
			continue
		}
		if err := unix.Mount(m.src, target, m.fstype, m.flags, ""); err != nil {
			return fmt.Errorf("guest: exec: mount %s in %s: %w", m.src, root, err)
		}
	}
	return nil
}
