package shim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/mount"
	securejoin "github.com/cyphar/filepath-securejoin"
	pathrs "github.com/cyphar/filepath-securejoin/pathrs-lite"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/errdefs"
)

// Pods: one microVM per Kubernetes pod. The CRI plugin marks every
// container with the pod's sandbox ID and whether it is the pod's sandbox
// (pause) container or one of its app containers. The sandbox container
// is the VM: its root file system is the VM's root disk and its process
// (pause) the VM's first. An app container is a process in that VM,
// chrooted by smx-agent into its own root file system, which reaches the
// guest through the file gateway: the pod's share, a host directory
// shared into the guest at PodShareGuest, holds a bind mount of every app
// container's root (with its volumes bound inside it, on the host). The
// share's top is read-only to the guest and every mount goes through
// descriptors (mounts.go): the guest writes the share as root on the host.
const (
	// ContainerTypeAnnotation is "sandbox" for a pod's pause container,
	// "container" for its app containers.
	ContainerTypeAnnotation = "io.kubernetes.cri.container-type"
	// SandboxIDAnnotation is the pod's ID (its pause container's).
	SandboxIDAnnotation = "io.kubernetes.cri.sandbox-id"

	// PodShareGuest is where the pod's share is mounted in the guest.
	PodShareGuest = "/smx-pod"
)

// kind is what a task is to the shim.
type kind int

const (
	standalone   kind = iota // its own VM (ctr run without pod annotations)
	podSandbox               // the pod's VM
	podContainer             // a process in its pod's VM
)

func (k kind) String() string {
	return [...]string{"stand-alone task", "pod sandbox", "pod container"}[k]
}

// classify tells a task's kind from its annotations, and the ID of the VM
// it runs in: the pod's sandbox ID, or its own.
func classify(id string, ann map[string]string) (kind, string) {
	pod := ann[SandboxIDAnnotation]
	switch ann[ContainerTypeAnnotation] {
	case "sandbox":
		return podSandbox, id
	case "container":
		if pod != "" {
			return podContainer, pod
		}
	}
	return standalone, id
}

// groupID is the ID whose shim serves a task: its pod's, else its own
// (containerd's shim grouping convention, as runc's v2 shim does it).
func groupID(id string, ann map[string]string) string {
	if pod := ann[SandboxIDAnnotation]; pod != "" {
		return pod
	}
	return id
}

// podName is the smx sandbox of a pod: named like its pause container's
// (SandboxName without the container's name).
func podName(ns, podID string, ann map[string]string) string {
	pa := map[string]string{}
	for _, k := range []string{"io.kubernetes.cri.sandbox-namespace", "io.kubernetes.cri.sandbox-name"} {
		if v, ok := ann[k]; ok {
			pa[k] = v
		}
	}
	return SandboxName(ns, podID, pa)
}

// mountPoints are made in an app container's root, so that smx-agent can
// mount the guest's /proc, /sys and /dev on them (as runc makes them).
var mountPoints = []string{"proc", "sys", "dev"}

// underGuestMount reports whether a container path is under one of the
// mounts smx-agent makes, which would hide anything bound there.
func underGuestMount(p string) bool {
	p = filepath.Clean("/" + p)
	for _, m := range mountPoints {
		if p == "/"+m || strings.HasPrefix(p, "/"+m+"/") {
			return true
		}
	}
	return false
}

// isBind reports whether an OCI mount is a bind mount (how hostPath,
// emptyDir, configMap, secret and projected volumes, and CRI's own
// /etc/hosts, /etc/resolv.conf and /etc/hostname, reach a container).
func isBind(m specs.Mount) bool {
	if m.Type == "bind" {
		return true
	}
	for _, o := range m.Options {
		if o == "bind" || o == "rbind" {
			return true
		}
	}
	return false
}

func readOnly(opts []string) bool {
	ro := false
	for _, o := range opts {
		switch o {
		case "ro":
			ro = true
		case "rw":
			ro = false
		}
	}
	return ro
}

// hostMounts is what the host mounted for one app container, undone in
// reverse order, each detached lazily (the guest's file gateway client
// holds files under them open until it lets go). Each is held as a
// descriptor of the mount itself, never by path: the guest writes the
// container's root, and a directory above a volume that it renamed (with
// a symbolic link left in its place) would otherwise steer the unmount to
// a host path of its choice.
type hostMounts []*os.File

func (h *hostMounts) undo() error {
	var errs []error
	for i := len(*h) - 1; i >= 0; i-- {
		if err := detach((*h)[i]); err != nil {
			errs = append(errs, err)
		}
	}
	*h = nil
	return errors.Join(errs...)
}

// mountContainer prepares an app container's root file system for its
// pod's VM: rootfs (the snapshot, mounted by the caller) gets the mount
// points smx-agent needs and the spec's bind mounts (volumes), then is
// bound, read-only if the spec says so, at ID/rootfs in the pod's share.
// Every target is opened beneath its root with no symbolic link left to
// follow and mounted through its descriptor. What it mounted is returned
// for undo, also on error.
func mountContainer(spec *specs.Spec, rootfs string, share *podShare, id string) (hostMounts, []string, error) {
	var h hostMounts
	var skipped []string
	root, err := os.OpenFile(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return h, nil, err
	}
	defer root.Close()
	for _, d := range mountPoints {
		f, err := pathrs.MkdirAllHandle(root, d, 0o755)
		if err != nil && !errors.Is(err, unix.EROFS) {
			// A read-only snapshot without it: the container goes without.
			return h, nil, fmt.Errorf("mount point /%s: %w", d, err)
		}
		if f != nil {
			f.Close()
		}
	}
	for _, m := range spec.Mounts {
		if !isBind(m) {
			continue // proc, sysfs, tmpfs, devpts, mqueue, cgroup: the guest's own (see smx-agent)
		}
		if underGuestMount(m.Destination) {
			skipped = append(skipped, m.Destination)
			continue
		}
		fi, err := os.Stat(m.Source)
		if err != nil {
			return h, skipped, fmt.Errorf("volume %s: %w", m.Destination, err)
		}
		// Resolved inside the container's root: a symbolic link in the
		// image cannot point the bind at the host's own directories.
		dst, err := mountPointIn(root, rootfs, m.Destination, fi.IsDir())
		if err != nil {
			return h, skipped, fmt.Errorf("volume %s: mount point: %w", m.Destination, err)
		}
		mf, err := bindAt(m.Source, dst, true, readOnly(m.Options))
		dst.Close()
		if err != nil {
			return h, skipped, fmt.Errorf("volume %s: %w", m.Destination, err)
		}
		h = append(h, mf)
	}
	target, err := share.add(id)
	if err != nil {
		return h, skipped, err
	}
	defer target.Close()
	ro := spec.Root != nil && spec.Root.Readonly
	mf, err := bindAt(rootfs, target, true, ro)
	if err != nil {
		return h, skipped, fmt.Errorf("root: %w", err)
	}
	h = append(h, mf)
	return h, skipped, nil
}

// mountPointIn opens (making it if missing) the mount point of a volume at
// dest in the container's root, a directory or a file, with the image's
// symbolic links resolved inside the root.
func mountPointIn(root *os.File, rootfs, dest string, dir bool) (*os.File, error) {
	p, err := securejoin.SecureJoin(rootfs, dest)
	if err != nil {
		return nil, err
	}
	rel, err := filepath.Rel(rootfs, p)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return nil, fmt.Errorf("%s resolves outside the container's root", dest)
	}
	if dir {
		return pathrs.MkdirAllHandle(root, rel, 0o755)
	}
	parent, err := pathrs.MkdirAllHandle(root, filepath.Dir(rel), 0o755)
	if err != nil {
		return nil, err
	}
	defer parent.Close()
	base := filepath.Base(rel)
	fd, err := unix.Openat(int(parent.Fd()), base, unix.O_CREAT|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, err
	}
	unix.Close(fd)
	f, err := openBeneath(parent, base, 0, 0)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file", dest)
	}
	return f, nil
}

// mountRootfs mounts a task's snapshot at rootfs (in containerd's
// bundle).
func mountRootfs(ms []mount.Mount, rootfs string) error {
	if err := os.MkdirAll(rootfs, 0o711); err != nil {
		return err
	}
	if err := mount.All(ms, rootfs); err != nil {
		return fmt.Errorf("smx shim: mount rootfs: %w", err)
	}
	return nil
}

// rlimits turns the spec's RLIMIT_* names into the guest's numbers.
func rlimits(ps *specs.Process) ([]agentproto.Rlimit, error) {
	var out []agentproto.Rlimit
	for _, r := range ps.Rlimits {
		n, ok := rlimitNumbers[r.Type]
		if !ok {
			return nil, fmt.Errorf("smx shim: unknown rlimit %q: %w", r.Type, errdefs.ErrInvalid)
		}
		out = append(out, agentproto.Rlimit{Resource: n, Soft: r.Soft, Hard: r.Hard})
	}
	return out, nil
}

var rlimitNumbers = map[string]int{
	"RLIMIT_AS": unix.RLIMIT_AS, "RLIMIT_CORE": unix.RLIMIT_CORE, "RLIMIT_CPU": unix.RLIMIT_CPU,
	"RLIMIT_DATA": unix.RLIMIT_DATA, "RLIMIT_FSIZE": unix.RLIMIT_FSIZE, "RLIMIT_LOCKS": unix.RLIMIT_LOCKS,
	"RLIMIT_MEMLOCK": unix.RLIMIT_MEMLOCK, "RLIMIT_MSGQUEUE": unix.RLIMIT_MSGQUEUE, "RLIMIT_NICE": unix.RLIMIT_NICE,
	"RLIMIT_NOFILE": unix.RLIMIT_NOFILE, "RLIMIT_NPROC": unix.RLIMIT_NPROC, "RLIMIT_RSS": unix.RLIMIT_RSS,
	"RLIMIT_RTPRIO": unix.RLIMIT_RTPRIO, "RLIMIT_RTTIME": unix.RLIMIT_RTTIME, "RLIMIT_SIGPENDING": unix.RLIMIT_SIGPENDING,
	"RLIMIT_STACK": unix.RLIMIT_STACK,
}
