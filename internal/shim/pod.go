package shim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/mount"
	securejoin "github.com/cyphar/filepath-securejoin"
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
// container's root (with its volumes bound inside it, on the host).
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
// reverse order, each detached lazily: the guest's 9P client holds files
// under them open until it lets go.
type hostMounts []string

func (h *hostMounts) bind(src, dst string, rec, ro bool) error {
	flags := uintptr(unix.MS_BIND)
	if rec {
		flags |= unix.MS_REC
	}
	if err := unix.Mount(src, dst, "", flags, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", src, dst, err)
	}
	*h = append(*h, dst)
	if ro {
		// The top mount only: volumes bound below keep their own mode.
		if err := unix.Mount("", dst, "", flags|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", dst, err)
		}
	}
	return nil
}

func (h *hostMounts) undo() error {
	var errs []error
	for i := len(*h) - 1; i >= 0; i-- {
		if err := unix.Unmount((*h)[i], unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", (*h)[i], err))
		}
	}
	*h = nil
	return errors.Join(errs...)
}

// mountContainer prepares an app container's root file system for its
// pod's VM: rootfs (the snapshot, mounted by the caller) gets the mount
// points smx-agent needs and the spec's bind mounts (volumes), then is
// bound, read-only if the spec says so, at dir/rootfs in the pod's share.
// What it mounted is returned for undo, also on error.
func mountContainer(spec *specs.Spec, rootfs, dir string) (hostMounts, []string, error) {
	var h hostMounts
	var skipped []string
	for _, d := range mountPoints {
		p, err := securejoin.SecureJoin(rootfs, d)
		if err != nil {
			return h, nil, err
		}
		if err := os.MkdirAll(p, 0o755); err != nil && !errors.Is(err, unix.EROFS) {
			// A read-only snapshot without it: the container goes without.
			return h, nil, fmt.Errorf("mount point /%s: %w", d, err)
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
		dst, err := securejoin.SecureJoin(rootfs, m.Destination)
		if err != nil {
			return h, skipped, fmt.Errorf("volume %s: %w", m.Destination, err)
		}
		if fi.IsDir() {
			err = os.MkdirAll(dst, 0o755)
		} else {
			if err = os.MkdirAll(filepath.Dir(dst), 0o755); err == nil {
				var f *os.File
				if f, err = os.OpenFile(dst, os.O_CREATE|os.O_RDONLY, 0o644); err == nil {
					f.Close()
				}
			}
		}
		if err != nil {
			return h, skipped, fmt.Errorf("volume %s: mount point: %w", m.Destination, err)
		}
		if err := h.bind(m.Source, dst, true, readOnly(m.Options)); err != nil {
			return h, skipped, fmt.Errorf("volume %s: %w", m.Destination, err)
		}
	}
	target := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(target, 0o755); err != nil {
		return h, skipped, err
	}
	ro := spec.Root != nil && spec.Root.Readonly
	if err := h.bind(rootfs, target, true, ro); err != nil {
		return h, skipped, fmt.Errorf("root: %w", err)
	}
	return h, skipped, nil
}

// mountRootfs mounts a task's snapshot at rootfs.
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
