package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskapi "github.com/containerd/containerd/api/runtime/task/v2"
	tasktypes "github.com/containerd/containerd/api/types/task"
	cerrdefs "github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/protobuf"
	ptypes "github.com/containerd/containerd/protobuf/types"
	"github.com/containerd/containerd/runtime"
	"github.com/containerd/log"
	"github.com/google/go-containerregistry/pkg/name"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/ocisnap"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/service"
)

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
	var cfg *Config
	var from name.Reference
	var fromKind sourceKind
	if k != podContainer {
		// The node decides which profiles its pods may name, and which
		// artifacts they may be restored from: refused before anything
		// is mounted, pulled or booted, and the error is what containerd
		// (and the kubelet's event) reports.
		if cfg, err = loadConfig(s.svc.State().Root, r.Options); err != nil {
			return nil, grpcErr(err)
		}
		if profile, err = cfg.podProfile(spec.Annotations); err != nil {
			return nil, grpcErr(err)
		}
		if fromKind, from, err = cfg.restoreRef(spec.Annotations); err != nil {
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
	} else if from != nil && fromKind == fromSnapshot {
		if err := s.restore(ctx, cfg, vm, profile, fromSnapshot, from); err != nil {
			return nil, grpcErr(err)
		}
	} else {
		var tpl *ocisnap.PullResult
		if from != nil {
			if tpl, err = s.pullTemplate(ctx, cfg, from); err != nil {
				return nil, grpcErr(err)
			}
		}
		if err := s.boot(ctx, t, vm, rootfs, profile, tpl); err != nil {
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
// gets the pod's share. With tpl, the template the task's annotation
// named (pulled), the sandbox's first start is to restore it: a task
// whose image is not the one the template serves is refused before it
// boots (it could only boot cold); one whose VM still boots cold (its
// machine's shape, kernel or QEMU differ from the template's) runs, and
// the shim says so.
func (s *Shim) boot(ctx context.Context, t *task, vm *podVM, rootfs, profile string, tpl *ocisnap.PullResult) error {
	img, err := s.rootImage(ctx, rootfs)
	if err != nil {
		return err
	}
	if tpl != nil {
		im, err := s.svc.InspectImage(ctx, img)
		if err != nil {
			return fmt.Errorf("smx shim: sandbox %s: %w", vm.name, err)
		}
		if im.Digest != tpl.ImageDigest {
			return fmt.Errorf("smx shim: annotation %s=%q: template %s serves the image of digest %s, this pod's image is %s: it would boot cold: build the template from this pod's image on the sending host, or drop the annotation: %w",
				FromTemplateAnnotation, tpl.Ref, tpl.Snapshot, tpl.ImageDigest, im.Digest, errdefs.ErrInvalid)
		}
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
	if tpl != nil {
		s.checkTemplateStart(ctx, vm, tpl)
	}
	return nil
}

// checkTemplateStart says, in the shim's log, whether the sandbox's start
// restored the template tpl. One that did not booted cold: the pod runs
// as any other (its sandbox's sandbox.start record and `smx agent
// inspect` carry no restored_from), and the line names the likely
// causes. The pod is not refused then: it is up and correct, only
// slower, and a refusal would have the kubelet retry it, cold, forever;
// what would certainly boot cold (another image) is refused before the
// boot.
func (s *Shim) checkTemplateStart(ctx context.Context, vm *podVM, tpl *ocisnap.PullResult) {
	want := "template " + tpl.Snapshot
	in, err := s.svc.Inspect(ctx, vm.name)
	switch {
	case err != nil:
		log.G(ctx).Warnf("smx shim: sandbox %s: template %s: %v", vm.name, tpl.Ref, err)
	case in.State.RestoredFrom == want:
		log.G(ctx).Infof("smx shim: sandbox %s started from template %s (%s) in %d ms", vm.name, tpl.Snapshot, tpl.Ref, in.State.BootMS)
	default:
		log.G(ctx).Warnf("smx shim: sandbox %s booted cold (%d ms), not from template %s (%s): the template was made for another machine shape, kernel, QEMU or smx-agent than this pod's on this node; see the sandbox's log (smx agent logs %s) and `smx template ls`",
			vm.name, in.State.BootMS, tpl.Snapshot, tpl.Ref, vm.name)
	}
}

// createContainer puts an app container's root, with its volumes, into
// the pod's share, where smx-agent chroots its processes.
func (s *Shim) createContainer(ctx context.Context, t *task, vm *podVM, rootfs string) error {
	if vm.restored {
		// The restored guest's own root is the state the pod resumes;
		// there is no share to put the image's root or volumes in.
		if _, err := rlimits(t.spec.Process); err != nil {
			return err
		}
		var vols []string
		for _, m := range t.spec.Mounts {
			if isBind(m) {
				vols = append(vols, m.Destination)
			}
		}
		log.G(ctx).Infof("smx shim: container %s runs in the root of sandbox %s, restored from a snapshot: its image's root and its bind mounts %v are not applied", t.id, vm.name, vols)
		return nil
	}
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

	if t.kind == podSandbox && vm.restored {
		// The restored guest has no pause binary (its root is the
		// snapshot's, not the pause image's): the sandbox container's
		// process is the VM itself.
		go s.hold(t, p, vm)
		s.publish(ctx, runtime.TaskStartEventTopic, &eventstypes.TaskStart{ContainerID: t.id, Pid: p.pid})
		return &taskapi.StartResponse{Pid: p.pid}, nil
	}
	sio, closers, err := s.openIO(ctx, p)
	if err != nil {
		return nil, err
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
		s.exit(t, p, code)
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

// exit records a started process's exit and tells containerd.
func (s *Shim) exit(t *task, p *proc, code int) {
	s.mu.Lock()
	p.code = uint32(code)
	p.exitedAt = time.Now()
	close(p.exited)
	s.mu.Unlock()
	s.publish(context.Background(), runtime.TaskExitEventTopic, &eventstypes.TaskExit{
		ContainerID: t.id, ID: p.id(), Pid: p.pid, ExitStatus: uint32(code), ExitedAt: protobuf.ToTimestamp(p.exitedAt),
	})
}

// holdInterval is how often hold looks whether its VM is still up.
const holdInterval = time.Second

// hold is the process of a restored pod's sandbox container: like pause,
// it ends on SIGINT, SIGTERM or SIGKILL (other signals are ignored), and
// it ends when its VM does (stopped, crashed, removed), so that the
// kubelet sees the pod's sandbox gone.
func (s *Shim) hold(t *task, p *proc, vm *podVM) {
	tick := time.NewTicker(holdInterval)
	defer tick.Stop()
	for {
		select {
		case sig := <-p.signals:
			switch unix.Signal(sig) {
			case unix.SIGINT, unix.SIGTERM, unix.SIGKILL:
				s.exit(t, p, 128+sig)
				return
			}
		case <-tick.C:
			in, err := s.svc.Inspect(context.Background(), vm.name)
			if err != nil || taskStatus(tasktypes.Status_RUNNING, in.State.Status) == tasktypes.Status_UNKNOWN {
				s.exit(t, p, 255)
				return
			}
		}
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
