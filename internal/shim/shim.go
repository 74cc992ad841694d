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
// decision (config.go). A pod annotated io.smx.from-snapshot is restored
// from a signed snapshot artifact instead of booted, if the node admits
// the reference and the signer (restore.go).
//
// Implemented: Create, Start, Exec, Wait, Kill, Delete, State, CloseIO,
// ResizePty, Pids, Stats, Connect, Shutdown, and the shim binary's start
// (with containerd's grouping by sandbox ID) and delete actions. Not
// implemented: Pause/Resume, Checkpoint, Update.
//
// Files: shim.go is the shim process (its start, the Shim, the delete
// action's cleanup); task.go the task API (tasks, processes, their
// status); rootfs.go the root file system's import and its content key;
// io.go a process's stdio; stats.go its metrics; name.go the sandbox's
// name; pod.go an app container's root and mounts in the pod's share,
// mounts.go that share; config.go the node's configuration; restore.go
// a VM restored from a registry and the node's cache of what it pulled.
package shim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	taskapi "github.com/containerd/containerd/api/runtime/task/v2"
	cerrdefs "github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/protobuf"
	ptypes "github.com/containerd/containerd/protobuf/types"
	cshim "github.com/containerd/containerd/runtime/v2/shim"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/errdefs"
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
	id    string    // the pod's sandbox ID, or the stand-alone task's ID
	name  string    // the smx sandbox
	share *podShare // shared at PodShareGuest; nil outside a pod and in a restored VM
	// restored: the VM was restored from an artifact (restore.go), not
	// booted from the task's root file system.
	restored bool
	release  func() error
}

var _ taskapi.TaskService = (*Shim)(nil)

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
