// Package shim is smx's containerd runtime (shim v2, runtime type
// io.containerd.smx.v1): one shim and one smx sandbox, a microVM behind
// the host-side gateway, per Kubernetes pod (or per task, for a task
// outside any pod), and each container's OCI process runs in it as an
// exec. Everything about the sandbox's lifecycle (create, boot, exec,
// stop, remove, the signed log) is the service layer's; this package only
// translates the task API onto it.
//
// The VM's root file system (the bundle's rootfs of the pod's sandbox
// container, or of the stand-alone task, mounted from the snapshotter) is
// imported as an smx image named by a hash of its content and the task's
// containerd namespace (ctr-HASH), so the guest boots straight off it, and
// a second VM on the same content in the same namespace reuses it. Its
// writes go to the sandbox's copy-on-write overlay. A pod's app containers
// keep their own roots (see pod.go): their writes go to their snapshots,
// through the file gateway. Which profile a pod may name is the node's
// decision (config.go).
//
// Implemented: Create, Start, Exec, Wait, Kill, Delete, State, CloseIO,
// ResizePty, Pids, Stats, Connect, Shutdown, and the shim binary's start
// (with containerd's grouping by sandbox ID) and delete actions. Not
// implemented: Pause/Resume, Checkpoint, Update.
package shim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	cgstats "github.com/containerd/cgroups/v3/cgroup1/stats"
	eventstypes "github.com/containerd/containerd/api/events"
	taskapi "github.com/containerd/containerd/api/runtime/task/v2"
	tasktypes "github.com/containerd/containerd/api/types/task"
	cerrdefs "github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/protobuf"
	ptypes "github.com/containerd/containerd/protobuf/types"
	"github.com/containerd/containerd/runtime"
	cshim "github.com/containerd/containerd/runtime/v2/shim"
	"github.com/containerd/fifo"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/service"
	"github.com/smx-dev/smx/internal/statedir"
)

// RuntimeName is the runtime type containerd is configured with.
const RuntimeName = "io.containerd.smx.v1"

// ProfileAnnotation names the security profile a task's sandbox gets (a
// built-in, or a profile installed in the node's state directory).
const ProfileAnnotation = "io.smx.profile"

// DefaultProfile is the profile of a task without the annotation.
const DefaultProfile = "locked"

// Main runs the shim binary (containerd starts it with its own flags).
// The shim runs tools (mkfs.ext4, qemu-img) and supervisors through
// os/exec, which waits for its own children: the package's reaper would
// steal their exit statuses, and as a subreaper the shim would inherit
// detached supervisors, so both are off.
func Main() {
	cshim.Run(RuntimeName, New, func(c *cshim.Config) {
		c.NoReaper = true
		c.NoSubreaper = true
	})
}

// New is the shim's init function: one per shim process.
func New(ctx context.Context, id string, publisher cshim.Publisher, shutdown func()) (cshim.Shim, error) {
	st, err := statedir.Default()
	if err != nil {
		return nil, err
	}
	svc := service.New(st, nil)
	smx, err := smxBinary()
	if err != nil {
		return nil, err
	}
	svc.Supervisor = []string{smx}
	ns, _ := namespaces.Namespace(ctx)
	return &Shim{id: id, ns: ns, svc: svc, publisher: publisher, shutdown: shutdown, tasks: map[string]*task{}}, nil
}

// smxBinary is the smx executable that runs supervisors: $SMX_BIN/smx,
// else next to this shim, else on PATH.
func smxBinary() (string, error) {
	if d := os.Getenv("SMX_BIN"); d != "" {
		return filepath.Join(d, "smx"), nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "smx")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("smx")
	if err != nil {
		return "", fmt.Errorf("smx shim: the smx binary is neither next to the shim nor on PATH: install it: %w", err)
	}
	return p, nil
}

// Shim serves the task API for the tasks of one VM: a pod's, or one
// stand-alone task's.
type Shim struct {
	id, ns    string
	svc       *service.Service
	publisher cshim.Publisher
	shutdown  func()

	mu    sync.Mutex
	tasks map[string]*task
	vm    *podVM // set by the Create of the VM's own task
}

// podVM is the smx sandbox this shim runs.
type podVM struct {
	id      string    // the pod's sandbox ID, or the stand-alone task's ID
	name    string    // the smx sandbox
	share   *podShare // shared at PodShareGuest; nil outside a pod
	release func() error
}

// task is one container: the VM's own (a pod's sandbox container or a
// stand-alone task) or an app container of the pod.
type task struct {
	id, bundle string
	kind       kind
	spec       *specs.Spec
	rootfs     string    // mounted by Create, unmounted by Delete; "" if not ours
	root       string    // guest root of an app container (chroot); "" for the VM's own root
	share      *podShare // an app container's pod's share
	mounts     hostMounts
	init       *proc
	execs      map[string]*proc
}

// proc is one process of the task in the guest: its init process (exec
// ID "") or one added with Exec. Its mutable fields are guarded by
// Shim.mu. It keeps no status of its own: what the shim knows of the
// process itself is whether it was started and whether its exit came
// back (exited closed, code set); the rest is its sandbox's status
// (taskStatus).
type proc struct {
	taskID, execID        string
	stdin, stdout, stderr string
	terminal              bool
	spec                  *specs.Process

	started  bool
	pid      uint32
	guestPID int // once started
	code     uint32
	exitedAt time.Time
	exited   chan struct{}
	signals  chan int
	resize   chan service.WindowSize
	stdinF   io.Closer
}

func newProc(taskID, execID string, spec *specs.Process, stdin, stdout, stderr string, terminal bool) *proc {
	return &proc{
		taskID: taskID, execID: execID, spec: spec,
		stdin: stdin, stdout: stdout, stderr: stderr, terminal: terminal,
		pid: uint32(os.Getpid()), exited: make(chan struct{}),
		signals: make(chan int), resize: make(chan service.WindowSize),
	}
}

// done reports whether the process's exit is known (or it was killed
// before it started).
func (p *proc) done() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// own is the process's status as far as the shim alone knows it:
// created until started, stopped once done, running in between (where
// its sandbox has the last word: taskStatus). The caller holds Shim.mu.
func (p *proc) own() tasktypes.Status {
	switch {
	case p.done():
		return tasktypes.Status_STOPPED
	case !p.started:
		return tasktypes.Status_CREATED
	}
	return tasktypes.Status_RUNNING
}

// taskStatus is a process's containerd status: its own (created,
// stopped), and while it runs, its sandbox's: paused while the sandbox
// is paused, blocked on a full host disk or suspended (its processes are
// kept, none runs), running while the sandbox is up, and unknown once
// the sandbox is down (or gone) while the process's exit status has not
// come back yet (it will: the exec ends with the machine).
func taskStatus(own tasktypes.Status, sb sandbox.Status) tasktypes.Status {
	if own != tasktypes.Status_RUNNING {
		return own
	}
	switch sb {
	case sandbox.StatusPaused, sandbox.StatusBlocked, sandbox.StatusSuspended:
		return tasktypes.Status_PAUSED
	case sandbox.StatusRunning, sandbox.StatusStarting, sandbox.StatusStopping:
		return tasktypes.Status_RUNNING
	}
	return tasktypes.Status_UNKNOWN
}

// id is how events name the process: the exec ID, or the task's for init.
func (p *proc) id() string {
	if p.execID != "" {
		return p.execID
	}
	return p.taskID
}

var _ taskapi.TaskService = (*Shim)(nil)

var nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`[^a-zA-Z0-9_.-]+`) })

// SandboxName is the smx sandbox that runs task id of containerd
// namespace ns. A container made by the CRI plugin is named after its
// pod, k8s-PODNAMESPACE-POD-CONTAINER-HASH (HASH from the task ID keeps
// a restarted container's sandbox distinct); any other is ctr-NS-ID. The
// name is cleaned to a valid sandbox name and shortened, with a hash of
// the ID, when long.
func SandboxName(ns, id string, annotations map[string]string) string {
	h := sha256.Sum256([]byte(ns + "/" + id))
	sum := hex.EncodeToString(h[:6])
	n := "ctr-" + ns + "-" + id
	if pod := annotations["io.kubernetes.cri.sandbox-name"]; pod != "" {
		n = "k8s-" + annotations["io.kubernetes.cri.sandbox-namespace"] + "-" + pod
		if c := annotations["io.kubernetes.cri.container-name"]; c != "" {
			n += "-" + c
		}
		n += "-" + sum[:6]
	}
	n = nameRE().ReplaceAllString(n, "-")
	if len(n) > 63 {
		n = n[:50] + "-" + sum
	}
	return n
}

func grpcErr(err error) error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		err = fmt.Errorf("%v: %w", err, cerrdefs.ErrNotFound)
	case errors.Is(err, errdefs.ErrExists):
		err = fmt.Errorf("%v: %w", err, cerrdefs.ErrAlreadyExists)
	case errors.Is(err, errdefs.ErrInvalid):
		err = fmt.Errorf("%v: %w", err, cerrdefs.ErrInvalidArgument)
	case errors.Is(err, errdefs.ErrDenied):
		err = fmt.Errorf("%s: %w", strings.TrimSuffix(err.Error(), ": "+errdefs.ErrDenied.Error()), cerrdefs.ErrPermissionDenied)
	}
	return cerrdefs.ToGRPC(err)
}

func (s *Shim) get(id string) (*task, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tasks[id]
	if !ok {
		return nil, cerrdefs.ToGRPC(fmt.Errorf("task %s: %w", id, cerrdefs.ErrNotFound))
	}
	return t, nil
}

// proc finds process execID ("" for init) of task id.
func (s *Shim) proc(id, execID string) (*task, *proc, error) {
	t, err := s.get(id)
	if err != nil {
		return nil, nil, err
	}
	if execID == "" {
		return t, t.init, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := t.execs[execID]
	if !ok {
		return nil, nil, cerrdefs.ToGRPC(fmt.Errorf("exec %s of task %s: %w", execID, id, cerrdefs.ErrNotFound))
	}
	return t, p, nil
}

func (s *Shim) publish(ctx context.Context, topic string, ev interface{}) {
	// Events are the task's namespace's, whatever context the call had.
	ctx = namespaces.WithNamespace(context.WithoutCancel(ctx), s.ns)
	if err := s.publisher.Publish(ctx, topic, ev); err != nil {
		log.G(ctx).WithError(err).Warnf("smx shim: publish %s", topic)
	}
}

// Create makes a task: for the VM's own task (a pod's sandbox container,
// or a stand-alone task) it imports the root file system as an image and
// boots the sandbox; for a pod's app container it prepares its root in
// the pod's share. The process starts with Start.
func (s *Shim) Create(ctx context.Context, r *taskapi.CreateTaskRequest) (_ *taskapi.CreateTaskResponse, retErr error) {
	if r.Checkpoint != "" {
		return nil, cerrdefs.ToGRPC(fmt.Errorf("smx shim: restoring a checkpoint: %w", cerrdefs.ErrNotImplemented))
	}
	spec, err := readSpec(r.Bundle)
	if err != nil {
		return nil, grpcErr(err)
	}
	if spec.Process == nil || len(spec.Process.Args) == 0 {
		return nil, cerrdefs.ToGRPC(fmt.Errorf("smx shim: the container has no process args: %w", cerrdefs.ErrInvalidArgument))
	}
	k, vmID := classify(r.ID, spec.Annotations)
	profile := ""
	if k != podContainer {
		// The node decides which profiles its pods may name: refused
		// before anything is mounted or booted, and the error is what
		// containerd (and the kubelet's event) reports.
		cfg, err := loadConfig(s.svc.State().Root, r.Options)
		if err != nil {
			return nil, grpcErr(err)
		}
		if profile, err = cfg.podProfile(spec.Annotations); err != nil {
			return nil, grpcErr(err)
		}
	}
	t := &task{
		id: r.ID, bundle: r.Bundle, kind: k, spec: spec,
		init:  newProc(r.ID, "", spec.Process, r.Stdin, r.Stdout, r.Stderr, r.Terminal),
		execs: map[string]*proc{},
	}
	// Claim the ID (and, for the VM's task, the VM) before the slow part.
	s.mu.Lock()
	var vm *podVM
	switch {
	case s.tasks[r.ID] != nil:
		err = fmt.Errorf("task %s: %w", r.ID, cerrdefs.ErrAlreadyExists)
	case k == podContainer && (s.vm == nil || s.vm.id != vmID):
		err = fmt.Errorf("smx shim: container %s: its pod sandbox %s does not run in this shim (create the sandbox container first): %w", r.ID, vmID, cerrdefs.ErrFailedPrecondition)
	case k != podContainer && s.vm != nil:
		err = fmt.Errorf("smx shim: %s %s: this shim already runs sandbox %s (one VM per shim): %w", k, r.ID, s.vm.name, cerrdefs.ErrFailedPrecondition)
	case k == podContainer:
		vm = s.vm
	default:
		vm = &podVM{id: vmID, name: SandboxName(s.ns, r.ID, spec.Annotations)}
		if k == podSandbox {
			vm.name = podName(s.ns, r.ID, spec.Annotations)
		}
		s.vm = vm
	}
	if err == nil {
		s.tasks[r.ID] = t
	}
	s.mu.Unlock()
	if err != nil {
		return nil, cerrdefs.ToGRPC(err)
	}
	defer func() {
		if retErr != nil {
			s.mu.Lock()
			delete(s.tasks, r.ID)
			if k != podContainer {
				s.vm = nil
			}
			s.mu.Unlock()
		}
	}()

	rootfs := filepath.Join(r.Bundle, "rootfs")
	if len(r.Rootfs) > 0 {
		var ms []mount.Mount
		for _, m := range r.Rootfs {
			ms = append(ms, mount.Mount{Type: m.Type, Source: m.Source, Options: m.Options})
		}
		if err := mountRootfs(ms, rootfs); err != nil {
			return nil, grpcErr(err)
		}
		t.rootfs = rootfs
		defer func() {
			if retErr != nil {
				t.mounts.undo()
				unix.Unmount(rootfs, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
				if t.share != nil {
					t.share.remove(t.id)
				}
			}
		}()
	} else if spec.Root != nil && spec.Root.Path != "" {
		rootfs = spec.Root.Path
		if !filepath.IsAbs(rootfs) {
			rootfs = filepath.Join(r.Bundle, rootfs)
		}
	}
	if k == podContainer {
		if err := s.createContainer(ctx, t, vm, rootfs); err != nil {
			return nil, grpcErr(fmt.Errorf("smx shim: container %s: %w", r.ID, err))
		}
	} else {
		if err := s.boot(ctx, t, vm, rootfs, profile); err != nil {
			return nil, grpcErr(err)
		}
	}
	s.publish(ctx, runtime.TaskCreateEventTopic, &eventstypes.TaskCreate{
		ContainerID: r.ID, Bundle: r.Bundle, Rootfs: r.Rootfs, Checkpoint: r.Checkpoint, Pid: t.init.pid,
		IO: &eventstypes.TaskIO{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal},
	})
	return &taskapi.CreateTaskResponse{Pid: t.init.pid}, nil
}

// boot imports the VM's root file system and boots its sandbox; a pod's
// gets the pod's share.
func (s *Shim) boot(ctx context.Context, t *task, vm *podVM, rootfs, profile string) error {
	img, err := s.rootImage(ctx, rootfs)
	if err != nil {
		return err
	}
	req := service.LaunchRequest{CreateRequest: service.CreateRequest{Name: vm.name, Image: img, Profile: profile}}
	if t.kind == podSandbox {
		if vm.share, err = newPodShare(t.bundle); err != nil {
			return fmt.Errorf("smx shim: sandbox %s: %w", vm.name, err)
		}
		// No host tool works in the containers' root file systems: git
		// clones and editor folders in them are the containers' own.
		req.Mounts = []string{vm.share.view + ":" + PodShareGuest + ":protect=off"}
	}
	_, release, err := s.svc.Launch(ctx, req)
	if err != nil {
		if vm.share != nil {
			vm.share.close()
			vm.share = nil
		}
		return fmt.Errorf("smx shim: sandbox %s: %w", vm.name, err)
	}
	vm.release = release
	return nil
}

// createContainer puts an app container's root, with its volumes, into
// the pod's share, where smx-agent chroots its processes.
func (s *Shim) createContainer(ctx context.Context, t *task, vm *podVM, rootfs string) error {
	if vm.share == nil {
		return fmt.Errorf("sandbox %s has no pod share: %w", vm.name, errdefs.ErrInvalid)
	}
	if _, err := rlimits(t.spec.Process); err != nil {
		return err
	}
	t.share = vm.share
	ms, skipped, err := mountContainer(t.spec, rootfs, vm.share, t.id)
	t.mounts = ms
	if err != nil {
		return err
	}
	if len(skipped) > 0 {
		log.G(ctx).Infof("smx shim: container %s: bind mounts under /proc, /sys or /dev not applied (the guest's own are mounted there): %v", t.id, skipped)
	}
	t.root = PodShareGuest + "/" + t.id + "/rootfs"
	return nil
}

func readSpec(bundle string) (*specs.Spec, error) {
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("smx shim: read OCI spec: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, fmt.Errorf("smx shim: parse OCI spec: %v: %w", err, errdefs.ErrInvalid)
	}
	return &spec, nil
}

// rootImage returns the smx image of the tree at rootfs, importing it
// when no image of the same content exists yet in the task's containerd
// namespace.
func (s *Shim) rootImage(ctx context.Context, rootfs string) (string, error) {
	key, err := treeKey(ctx, s.ns, rootfs)
	if err != nil {
		return "", fmt.Errorf("smx shim: hash rootfs: %w", err)
	}
	// 192 bits, and longer than the names of the metadata-keyed
	// imports before, which are never reused.
	name := "ctr-" + key[:48]
	if _, err := s.svc.InspectImage(ctx, name); err == nil {
		return name, nil
	}
	_, err = s.svc.ImportImage(ctx, service.ImageImportRequest{Name: name, Ref: "dir:" + rootfs})
	if errors.Is(err, errdefs.ErrExists) {
		err = nil // another shim imported the same content meanwhile
	}
	return name, err
}

// treeKey names a root file system's content in containerd namespace ns:
// a SHA-256 over every entry's name, type, mode, owner, device number,
// link target and, for a regular file, the SHA-256 of its bytes (and its
// time: the import keeps it). It is what decides that a pod boots an
// image imported for another pod, so it reads the contents: a key on
// metadata alone let a pod author craft an image whose names, sizes and
// times equal a public image's, run it first, and have the node boot its
// bytes for every later pod of the public image. The namespace keeps one
// tenant's imports out of another's. Directories' sizes and times are
// left out: a snapshot's root is a fresh upper directory for every
// container, and the import does not keep them either.
func treeKey(ctx context.Context, ns, root string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "smx-shim-rootfs-v2\x00%d:%s", len(ns), ns)
	buf := make([]byte, 256<<10)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		st, _ := fi.Sys().(*syscall.Stat_t)
		var uid, gid uint32
		var rdev uint64
		if st != nil {
			uid, gid, rdev = st.Uid, st.Gid, st.Rdev
		}
		link, sum, mtime := "", "", int64(0)
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		case fi.Mode().IsRegular():
			if sum, err = fileSum(p, buf); err != nil {
				return err
			}
			mtime = fi.ModTime().UnixNano()
		}
		fmt.Fprintf(h, "%d:%s %o %d %d %d %d %d:%s %s\n", len(rel), rel, fi.Mode(), uid, gid, rdev, mtime, len(link), link, sum)
		return nil
	})
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// fileSum hashes a regular file's bytes, opened without following a link.
func fileSum(p string, buf []byte) (string, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyBuffer(h, struct{ io.Reader }{f}, buf); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Start runs the container's process, or an exec added to it, in its
// sandbox.
func (s *Shim) Start(ctx context.Context, r *taskapi.StartRequest) (*taskapi.StartResponse, error) {
	t, p, err := s.proc(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if own := p.own(); own != tasktypes.Status_CREATED {
		s.mu.Unlock()
		return nil, cerrdefs.ToGRPC(fmt.Errorf("process %s is %s: %w", p.id(), own, cerrdefs.ErrFailedPrecondition))
	}
	if r.ExecID != "" && t.init.own() != tasktypes.Status_RUNNING {
		s.mu.Unlock()
		return nil, cerrdefs.ToGRPC(fmt.Errorf("task %s is not running: %w", t.id, cerrdefs.ErrFailedPrecondition))
	}
	vm := s.vm
	if vm == nil || vm.release == nil {
		s.mu.Unlock()
		return nil, cerrdefs.ToGRPC(fmt.Errorf("task %s: its sandbox is gone: %w", t.id, cerrdefs.ErrFailedPrecondition))
	}
	limits, err := rlimits(p.spec)
	if err != nil {
		s.mu.Unlock()
		return nil, grpcErr(err)
	}
	p.started = true
	s.mu.Unlock()

	// The FIFOs' other ends are held by containerd's client (ctr, CRI).
	sio := service.ExecIO{Signal: p.signals}
	var closers []io.Closer
	if p.stdin != "" {
		f, err := fifo.OpenFifo(context.WithoutCancel(ctx), p.stdin, unix.O_RDONLY|unix.O_NONBLOCK, 0)
		if err != nil {
			return nil, grpcErr(err)
		}
		in := &closableStdin{f: f}
		sio.Stdin = in
		s.mu.Lock()
		p.stdinF = in
		s.mu.Unlock()
		closers = append(closers, f)
	}
	for _, o := range []struct {
		path string
		w    *io.Writer
	}{{p.stdout, &sio.Stdout}, {p.stderr, &sio.Stderr}} {
		if o.path == "" {
			continue
		}
		// Read-write: opening does not wait for a reader, and a client
		// that detached (ctr run -d) leaves the process writing into the
		// pipe's buffer rather than blocking this call for good.
		f, err := fifo.OpenFifo(context.WithoutCancel(ctx), o.path, unix.O_RDWR, 0)
		if err != nil {
			for _, c := range closers {
				c.Close()
			}
			return nil, grpcErr(err)
		}
		*o.w = f
		closers = append(closers, f)
	}
	ps := p.spec
	req := service.ExecRequest{
		Name: vm.name, Args: ps.Args, Env: ps.Env, Dir: ps.Cwd, Root: t.root,
		User: fmt.Sprintf("%d:%d", ps.User.UID, ps.User.GID), TTY: ps.Terminal || p.terminal,
	}
	req.Rlimits = limits
	if r.ExecID == "" {
		req.Label = "run"
	}
	if req.TTY {
		sio.Resize = p.resize
		if ps.ConsoleSize != nil {
			req.Size = &service.WindowSize{Rows: uint16(ps.ConsoleSize.Height), Cols: uint16(ps.ConsoleSize.Width)}
		}
	}
	started := make(chan struct{})
	var once sync.Once
	sio.Started = func(pid int) {
		s.mu.Lock()
		p.guestPID = pid
		s.mu.Unlock()
		once.Do(func() { close(started) })
	}
	go func() {
		st, err := s.svc.Exec(context.Background(), req, sio)
		code := 0
		switch {
		case err == nil:
			code = st.Code
		default:
			if c, ok := service.CommandExitCode(err); ok {
				code = c
			} else {
				code = 255
			}
			if sio.Stderr != nil {
				fmt.Fprintf(sio.Stderr, "smx: %v\n", err)
			} else if sio.Stdout != nil {
				fmt.Fprintf(sio.Stdout, "smx: %v\r\n", err)
			}
		}
		for _, c := range closers {
			c.Close()
		}
		once.Do(func() { close(started) })
		s.mu.Lock()
		p.code = uint32(code)
		p.exitedAt = time.Now()
		close(p.exited)
		s.mu.Unlock()
		s.publish(context.Background(), runtime.TaskExitEventTopic, &eventstypes.TaskExit{
			ContainerID: t.id, ID: p.id(), Pid: p.pid, ExitStatus: uint32(code), ExitedAt: protobuf.ToTimestamp(p.exitedAt),
		})
	}()
	select {
	case <-started:
	case <-ctx.Done():
	}
	if r.ExecID != "" {
		s.publish(ctx, runtime.TaskExecStartedEventTopic, &eventstypes.TaskExecStarted{ContainerID: t.id, ExecID: r.ExecID, Pid: p.pid})
	} else {
		s.publish(ctx, runtime.TaskStartEventTopic, &eventstypes.TaskStart{ContainerID: t.id, Pid: p.pid})
	}
	return &taskapi.StartResponse{Pid: p.pid}, nil
}

// closableStdin is a stdin FIFO that CloseIO ends: the read it
// interrupts reports EOF, which is what tells the guest process its input
// ended (ctr keeps its end open and calls CloseIO instead).
type closableStdin struct {
	f      io.ReadCloser
	mu     sync.Mutex
	closed bool
}

func (c *closableStdin) Read(p []byte) (int, error) {
	n, err := c.f.Read(p)
	if err != nil {
		c.mu.Lock()
		if c.closed {
			err = io.EOF
		}
		c.mu.Unlock()
	}
	return n, err
}

func (c *closableStdin) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.drain(2 * time.Second)
	return c.f.Close()
}

// drain waits until the reader has taken (TIOCINQ is FIONREAD on Linux) what the client wrote before its
// CloseIO (ctr writes all of stdin, then calls CloseIO at once: closing
// the FIFO then dropped what was still in the pipe), or until d passes.
func (c *closableStdin) drain(d time.Duration) {
	sc, ok := c.f.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		n := 0
		if err := rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) }); err != nil || n == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Kill sends a signal to the process group of a process in the guest.
// A process that never started just counts as killed.
func (s *Shim) Kill(ctx context.Context, r *taskapi.KillRequest) (*ptypes.Empty, error) {
	t, p, err := s.proc(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	status := p.own()
	if status == tasktypes.Status_CREATED {
		p.code = 128 + r.Signal
		p.exitedAt = time.Now()
		close(p.exited)
	}
	s.mu.Unlock()
	switch status {
	case tasktypes.Status_CREATED:
		s.publish(ctx, runtime.TaskExitEventTopic, &eventstypes.TaskExit{
			ContainerID: t.id, ID: p.id(), Pid: p.pid, ExitStatus: p.code, ExitedAt: protobuf.ToTimestamp(p.exitedAt),
		})
		return &ptypes.Empty{}, nil
	case tasktypes.Status_STOPPED:
		return nil, cerrdefs.ToGRPC(fmt.Errorf("process already finished: %w", cerrdefs.ErrNotFound))
	}
	select {
	case p.signals <- int(r.Signal):
	case <-p.exited:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &ptypes.Empty{}, nil
}

// Wait returns once the process has exited.
func (s *Shim) Wait(ctx context.Context, r *taskapi.WaitRequest) (*taskapi.WaitResponse, error) {
	_, p, err := s.proc(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	select {
	case <-p.exited:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return &taskapi.WaitResponse{ExitStatus: p.code, ExitedAt: protobuf.ToTimestamp(p.exitedAt)}, nil
}

// Delete forgets an exited exec, or removes the task's sandbox (its log
// stays) and unmounts its root filesystem.
func (s *Shim) Delete(ctx context.Context, r *taskapi.DeleteRequest) (*taskapi.DeleteResponse, error) {
	t, p, err := s.proc(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	own := p.own()
	if own == tasktypes.Status_RUNNING {
		s.mu.Unlock()
		return nil, cerrdefs.ToGRPC(fmt.Errorf("process %s is running: kill it first: %w", p.id(), cerrdefs.ErrFailedPrecondition))
	}
	if own == tasktypes.Status_CREATED {
		p.exitedAt = time.Now()
	}
	if r.ExecID != "" {
		delete(t.execs, r.ExecID)
		s.mu.Unlock()
		return &taskapi.DeleteResponse{Pid: p.pid, ExitStatus: p.code, ExitedAt: protobuf.ToTimestamp(p.exitedAt)}, nil
	}
	var others []*task
	if t.kind != podContainer {
		for _, o := range s.tasks {
			if o != t {
				others = append(others, o)
			}
		}
	}
	vm := s.vm
	s.mu.Unlock()
	var errs []error
	if t.kind != podContainer && vm != nil && vm.release != nil {
		// The VM goes: every process in it ends, and so does any app
		// container of the pod still here (containerd deletes those first).
		if err := vm.release(); err != nil {
			errs = append(errs, err)
		}
		for _, o := range others {
			errs = append(errs, o.unmount())
		}
	}
	errs = append(errs, t.unmount())
	if t.kind == podSandbox && vm != nil && vm.share != nil {
		// Empty by now (every container's mounts are detached); the
		// view's detach takes along any that is not.
		errs = append(errs, vm.share.close())
	}
	if err := errors.Join(errs...); err != nil {
		return nil, grpcErr(err)
	}
	s.mu.Lock()
	delete(s.tasks, t.id)
	if t.kind != podContainer {
		for _, o := range others {
			delete(s.tasks, o.id)
		}
		s.vm = nil
	}
	s.mu.Unlock()
	s.publish(ctx, runtime.TaskDeleteEventTopic, &eventstypes.TaskDelete{
		ContainerID: t.id, ID: t.id, Pid: p.pid, ExitStatus: p.code, ExitedAt: protobuf.ToTimestamp(p.exitedAt),
	})
	return &taskapi.DeleteResponse{Pid: p.pid, ExitStatus: p.code, ExitedAt: protobuf.ToTimestamp(p.exitedAt)}, nil
}

// unmount undoes what Create mounted for the task. An app container's
// mounts are detached lazily (the guest may still hold files open through
// the gateway), then its empty directories in the pod's share removed.
func (t *task) unmount() error {
	var errs []error
	if t.kind == podContainer {
		errs = append(errs, t.mounts.undo())
		if t.rootfs != "" {
			// The snapshot's mount point in containerd's bundle, which
			// the guest cannot rename.
			if err := unix.Unmount(t.rootfs, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) {
				errs = append(errs, fmt.Errorf("unmount rootfs: %w", err))
			}
		}
		if t.share != nil {
			t.share.remove(t.id)
		}
		t.rootfs = ""
		return errors.Join(errs...)
	}
	if t.rootfs != "" {
		if err := mount.UnmountAll(t.rootfs, 0); err != nil {
			return fmt.Errorf("unmount rootfs: %w", err)
		}
		t.rootfs = ""
	}
	return nil
}

// State reports a process, its status derived from its sandbox's
// (taskStatus).
func (s *Shim) State(ctx context.Context, r *taskapi.StateRequest) (*taskapi.StateResponse, error) {
	t, p, err := s.proc(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	var sb sandbox.Status
	s.mu.Lock()
	vm := s.vm
	s.mu.Unlock()
	if vm != nil {
		if in, err := s.svc.Inspect(ctx, vm.name); err == nil {
			sb = in.State.Status
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return &taskapi.StateResponse{
		ID: p.id(), Bundle: t.bundle, Pid: p.pid, Status: taskStatus(p.own(), sb), ExecID: p.execID,
		Stdin: p.stdin, Stdout: p.stdout, Stderr: p.stderr, Terminal: p.terminal,
		ExitStatus: p.code, ExitedAt: protobuf.ToTimestamp(p.exitedAt),
	}, nil
}

// CloseIO closes a process's stdin.
func (s *Shim) CloseIO(ctx context.Context, r *taskapi.CloseIORequest) (*ptypes.Empty, error) {
	_, p, err := s.proc(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	f := p.stdinF
	s.mu.Unlock()
	if f != nil && r.Stdin {
		f.Close()
	}
	return &ptypes.Empty{}, nil
}

// ResizePty resizes a process's terminal.
func (s *Shim) ResizePty(ctx context.Context, r *taskapi.ResizePtyRequest) (*ptypes.Empty, error) {
	_, p, err := s.proc(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	select {
	case p.resize <- service.WindowSize{Rows: uint16(r.Height), Cols: uint16(r.Width)}:
	case <-p.exited:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &ptypes.Empty{}, nil
}

// Exec adds a process to the running task; Start starts it.
func (s *Shim) Exec(ctx context.Context, r *taskapi.ExecProcessRequest) (*ptypes.Empty, error) {
	t, err := s.get(r.ID)
	if err != nil {
		return nil, err
	}
	if r.Spec == nil {
		return nil, cerrdefs.ToGRPC(fmt.Errorf("exec %s: no process spec: %w", r.ExecID, cerrdefs.ErrInvalidArgument))
	}
	var ps specs.Process
	if err := json.Unmarshal(r.Spec.Value, &ps); err != nil || len(ps.Args) == 0 {
		return nil, cerrdefs.ToGRPC(fmt.Errorf("exec %s: bad process spec (%v): %w", r.ExecID, err, cerrdefs.ErrInvalidArgument))
	}
	s.mu.Lock()
	if _, dup := t.execs[r.ExecID]; dup {
		s.mu.Unlock()
		return nil, cerrdefs.ToGRPC(fmt.Errorf("exec %s: %w", r.ExecID, cerrdefs.ErrAlreadyExists))
	}
	t.execs[r.ExecID] = newProc(t.id, r.ExecID, &ps, r.Stdin, r.Stdout, r.Stderr, r.Terminal)
	s.mu.Unlock()
	s.publish(ctx, runtime.TaskExecAddedEventTopic, &eventstypes.TaskExecAdded{ContainerID: t.id, ExecID: r.ExecID})
	return &ptypes.Empty{}, nil
}

// Connect tells containerd the shim's and the task's PIDs (the task has
// no host PID: its process is in the guest; it reports the shim's).
func (s *Shim) Connect(ctx context.Context, r *taskapi.ConnectRequest) (*taskapi.ConnectResponse, error) {
	resp := &taskapi.ConnectResponse{ShimPid: uint32(os.Getpid())}
	if t, err := s.get(r.ID); err == nil {
		resp.TaskPid = t.init.pid
	}
	return resp, nil
}

// Shutdown ends the shim once it has no task left (a pod's shim serves
// all of the pod's containers).
func (s *Shim) Shutdown(ctx context.Context, r *taskapi.ShutdownRequest) (*ptypes.Empty, error) {
	s.mu.Lock()
	busy := len(s.tasks) > 0
	s.mu.Unlock()
	if !busy {
		s.shutdown()
	}
	return &ptypes.Empty{}, nil
}

func notImplemented(what string) error {
	return cerrdefs.ToGRPC(fmt.Errorf("smx shim: %s: %w", what, cerrdefs.ErrNotImplemented))
}

// Pids lists the task's processes by their guest PIDs: its own and
// those of its execs that are running (not their children: there is no
// cgroup to ask, the processes are in the guest).
func (s *Shim) Pids(ctx context.Context, r *taskapi.PidsRequest) (*taskapi.PidsResponse, error) {
	t, err := s.get(r.ID)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &taskapi.PidsResponse{}
	for _, p := range append([]*proc{t.init}, mapValues(t.execs)...) {
		if p.own() == tasktypes.Status_RUNNING && p.guestPID > 0 {
			resp.Processes = append(resp.Processes, &tasktypes.ProcessInfo{Pid: uint32(p.guestPID)})
		}
	}
	return resp, nil
}

func mapValues(m map[string]*proc) []*proc {
	out := make([]*proc, 0, len(m))
	for _, p := range m {
		out = append(out, p)
	}
	return out
}

// Stats reports the VM the task runs in, as cgroup v1 metrics: QEMU's
// CPU time (user and system) and resident memory on the host, and the
// task's running processes. A pod's containers share one VM, so each of
// them reports the whole pod's figures.
func (s *Shim) Stats(ctx context.Context, r *taskapi.StatsRequest) (*taskapi.StatsResponse, error) {
	if _, err := s.get(r.ID); err != nil {
		return nil, err
	}
	s.mu.Lock()
	vm := s.vm
	s.mu.Unlock()
	if vm == nil {
		return nil, cerrdefs.ToGRPC(fmt.Errorf("task %s: no sandbox: %w", r.ID, cerrdefs.ErrNotFound))
	}
	in, err := s.svc.Inspect(ctx, vm.name)
	if err != nil {
		return nil, grpcErr(err)
	}
	m, err := qemuMetrics(in.State.QEMUPID)
	if err != nil {
		return nil, grpcErr(fmt.Errorf("smx shim: stats of sandbox %s: %w", vm.name, err))
	}
	if pids, err := s.Pids(ctx, &taskapi.PidsRequest{ID: r.ID}); err == nil {
		m.Pids = &cgstats.PidsStat{Current: uint64(len(pids.Processes))}
	}
	a, err := typeurl.MarshalAny(m)
	if err != nil {
		return nil, grpcErr(err)
	}
	return &taskapi.StatsResponse{Stats: protobuf.FromAny(a)}, nil
}

// qemuMetrics reads a QEMU process's CPU time and resident memory from
// the host's /proc.
func qemuMetrics(pid int) (*cgstats.Metrics, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("the VM is not running: %w", errdefs.ErrFailed)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	// Fields after the command name (which may hold spaces), from field 3.
	rest := string(b)
	if i := strings.LastIndexByte(rest, ')'); i >= 0 {
		rest = rest[i+1:]
	}
	f := strings.Fields(rest)
	if len(f) < 22 {
		return nil, fmt.Errorf("short /proc/%d/stat", pid)
	}
	utime, _ := strconv.ParseUint(f[11], 10, 64)    // field 14
	stime, _ := strconv.ParseUint(f[12], 10, 64)    // field 15
	rssPages, _ := strconv.ParseUint(f[21], 10, 64) // field 24
	const tick = uint64(time.Second) / 100          // USER_HZ
	user, sys := utime*tick, stime*tick
	rss := rssPages * uint64(os.Getpagesize())
	return &cgstats.Metrics{
		CPU:    &cgstats.CPUStat{Usage: &cgstats.CPUUsage{Total: user + sys, User: user, Kernel: sys}},
		Memory: &cgstats.MemoryStat{RSS: rss, TotalRSS: rss, Usage: &cgstats.MemoryEntry{Usage: rss}},
	}, nil
}
func (s *Shim) Pause(context.Context, *taskapi.PauseRequest) (*ptypes.Empty, error) {
	return nil, notImplemented("pause")
}
func (s *Shim) Resume(context.Context, *taskapi.ResumeRequest) (*ptypes.Empty, error) {
	return nil, notImplemented("resume")
}
func (s *Shim) Checkpoint(context.Context, *taskapi.CheckpointTaskRequest) (*ptypes.Empty, error) {
	return nil, notImplemented("checkpoint")
}
func (s *Shim) Update(context.Context, *taskapi.UpdateTaskRequest) (*ptypes.Empty, error) {
	return nil, notImplemented("update")
}

// cleanupContainer detaches app container id's root from the share of
// the pod whose sandbox bundle is podBundle, after the shim died: found
// beneath the share with no symbolic link followed, detached through its
// descriptor.
func cleanupContainer(ctx context.Context, podBundle, id string) {
	view, dirs := sharePaths(podBundle)
	v, err := os.OpenFile(view, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return // the pod's share is gone already
	}
	defer v.Close()
	if !validID(id) {
		return
	}
	if m, err := openBeneath(v, filepath.Join(id, "rootfs"), unix.O_DIRECTORY, 0); err == nil {
		if err := detach(m); err != nil {
			log.G(ctx).WithError(err).Warnf("smx shim: container %s", id)
		}
	}
	(&podShare{view: view, dirs: dirs}).remove(id)
}

// cleanupShare detaches the share of the pod whose sandbox bundle is
// bundle, after the shim died, and everything still mounted below it
// (lazily: the detach takes the containers' roots along), then removes
// its folders. The view is a mount point in containerd's bundle, which
// the guest cannot rename.
func cleanupShare(ctx context.Context, bundle string) {
	view, dirs := sharePaths(bundle)
	if err := unix.Unmount(view, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		log.G(ctx).WithError(err).Warnf("smx shim: unmount %s", view)
	}
	// Whatever containers' folders are left (only the shim writes these),
	// then the share.
	if ents, err := os.ReadDir(dirs); err == nil {
		share := &podShare{view: view, dirs: dirs}
		for _, e := range ents {
			share.remove(e.Name())
		}
	}
	os.Remove(view)
	os.Remove(dirs)
}

// Cleanup is the shim binary's delete action, run by containerd for each
// task when the shim died (the working directory is the task's bundle):
// the VM's own task removes the sandbox; every task's mounts are undone.
func (s *Shim) Cleanup(ctx context.Context) (*taskapi.DeleteResponse, error) {
	cwd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	var annotations map[string]string
	if spec, err := readSpec(cwd); err == nil {
		annotations = spec.Annotations
	}
	k, podID := classify(s.id, annotations)
	switch k {
	case podContainer:
		// Its root in the pod's share, which lives in the sandbox
		// container's bundle beside this one (containerd keeps a
		// namespace's bundles in one directory).
		if validID(podID) {
			cleanupContainer(ctx, filepath.Join(filepath.Dir(cwd), podID), s.id)
		}
	case podSandbox:
		err = s.svc.Remove(ctx, service.RemoveRequest{Name: podName(s.ns, s.id, annotations), Force: true})
	default:
		err = s.svc.Remove(ctx, service.RemoveRequest{Name: SandboxName(s.ns, s.id, annotations), Force: true})
	}
	if errors.Is(err, errdefs.ErrNotFound) {
		err = nil
	}
	if k == podSandbox {
		cleanupShare(ctx, cwd)
	}
	// Lazily: a detached mount takes the ones below it (volumes) along.
	// A mount point in containerd's bundle, which the guest cannot rename.
	rootfs := filepath.Join(cwd, "rootfs")
	if uerr := unix.Unmount(rootfs, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); uerr != nil && !errors.Is(uerr, unix.EINVAL) && !errors.Is(uerr, unix.ENOENT) {
		log.G(ctx).WithError(uerr).Warnf("smx shim: unmount %s", rootfs)
	}
	if err != nil {
		return nil, err
	}
	return &taskapi.DeleteResponse{ExitedAt: protobuf.ToTimestamp(time.Now()), ExitStatus: 128 + uint32(unix.SIGKILL)}, nil
}

// StartShim starts the long-lived shim process for a task, handing it
// its listening socket, and returns its address. Tasks of one pod share a
// shim (containerd's grouping convention, as runc's v2 shim does it): the
// socket is named after the pod's sandbox ID, and a task whose pod's shim
// already listens there gets that shim's address.
func (s *Shim) StartShim(ctx context.Context, opts cshim.StartOpts) (_ string, retErr error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	cwd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	var annotations map[string]string
	if spec, err := readSpec(cwd); err == nil {
		annotations = spec.Annotations
	}
	group := groupID(opts.ID, annotations)
	args := []string{"-id", opts.ID}
	if opts.Debug {
		args = append(args, "-debug")
	}
	// Not bound to ctx: containerd's start command cancels it as it
	// returns, and a command made with a context is killed when that
	// context ends; the daemon must outlive the start (runc's shim uses
	// a plain exec.Command for the same reason).
	cmd, err := cshim.Command(context.WithoutCancel(ctx), &cshim.CommandConfig{
		Runtime: self, Address: opts.Address, TTRPCAddress: opts.TTRPCAddress, Path: cwd, Args: args,
	})
	if err != nil {
		return "", err
	}
	address, err := cshim.SocketAddress(ctx, opts.Address, group)
	if err != nil {
		return "", err
	}
	socket, err := cshim.NewSocket(address)
	if err != nil {
		if !cshim.SocketEaddrinuse(err) {
			return "", fmt.Errorf("smx shim: create socket: %w", err)
		}
		if cshim.CanConnect(address) {
			// The pod's shim.
			if err := cshim.WriteAddress("address", address); err != nil {
				return "", err
			}
			return address, nil
		}
		// A dead shim's socket.
		if err := cshim.RemoveSocket(address); err != nil {
			return "", fmt.Errorf("smx shim: remove stale socket: %w", err)
		}
		if socket, err = cshim.NewSocket(address); err != nil {
			return "", fmt.Errorf("smx shim: create socket: %w", err)
		}
	}
	defer func() {
		if retErr != nil {
			socket.Close()
			cshim.RemoveSocket(address)
		}
	}()
	f, err := socket.File()
	if err != nil {
		return "", err
	}
	defer f.Close()
	cmd.ExtraFiles = append(cmd.ExtraFiles, f)
	if err := cmd.Start(); err != nil {
		return "", err
	}
	go cmd.Wait()
	if err := cshim.WriteAddress("address", address); err != nil {
		cmd.Process.Kill()
		return "", err
	}
	return address, nil
}
