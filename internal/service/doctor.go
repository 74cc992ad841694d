package service

import (
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/hosttool"
	"github.com/smx-dev/smx/internal/kernel"
	"github.com/smx-dev/smx/internal/supervisor"
	"github.com/smx-dev/smx/internal/vm"
)

// Requirement is one thing smx needs on the host.
type Requirement struct {
	Name     string `json:"name"`
	Found    bool   `json:"found"`
	Detail   string `json:"detail,omitempty"`
	Fix      string `json:"fix,omitempty"`
	Optional bool   `json:"optional,omitempty"`
}

// HostPackages are the Debian packages `smx setup` installs.
var HostPackages = []string{"qemu-system-x86", "qemu-utils", "e2fsprogs", "busybox-static", "kmod", "xz-utils", "debootstrap"}

func tool(name, pkg, versionFlag string) Requirement {
	r := Requirement{Name: name, Fix: "apt-get install " + pkg + " (or run `smx setup` as root)"}
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
func qemuTool() Requirement {
	r := tool(vm.QEMUProgram(), "qemu-system-x86", "--version")
	r.Name = "qemu-system-x86_64"
	return r
}

// qemuVirtioFS says whether the QEMU is new enough for the virtio-fs file
// gateway, and what the user gives up and how to upgrade when it is not.
func qemuVirtioFS() Requirement {
	r := Requirement{Name: fmt.Sprintf("QEMU >= %d.%d (virtio-fs mounts)", vm.VirtioFSMinQEMU[0], vm.VirtioFSMinQEMU[1]), Optional: true,
		Fix: "mounts use the slower 9P gateway (about 0.2-0.4x a plain share), cannot be added to or removed from a running sandbox (smx agent mount), and files held open in a mount fail after a snapshot restore, fork or template start; " +
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

func staticBusybox() Requirement {
	r := Requirement{Name: "busybox (static)", Fix: "apt-get install busybox-static (or run `smx setup`)"}
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

// DoctorReport is what `smx doctor` checks on the host: the tools and
// files smx needs, the accelerator, the state directory and its free
// space. OK is false when a requirement that is not optional is missing.
type DoctorReport struct {
	Requirements []Requirement `json:"requirements"`
	Accel        string        `json:"accel"`
	AccelReason  string        `json:"accel_reason"`
	StateDir     string        `json:"state_dir"`
	DiskFree     int64         `json:"disk_free_bytes"`
	OK           bool          `json:"ok"`
}

// Doctor checks the host the service runs on.
func (s *Service) Doctor(ctx context.Context) *DoctorReport {
	reqs := []Requirement{
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

	kr := Requirement{Name: "guest kernel"}
	if k, err := kernel.Find(s.state.Kernels()); err == nil {
		kr.Found, kr.Detail = true, k.Version+" in "+k.Dir
		if k.Own {
			kr.Detail = k.Version + " (smx's own, everything built in) in " + k.Dir
		}
	} else {
		kr.Fix = "run `smx setup` (downloads the Debian kernel package into the smx cache)"
	}
	reqs = append(reqs, kr)

	ar := Requirement{Name: "smx-agent"}
	if p, err := supervisor.AgentPath(); err == nil {
		ar.Found, ar.Detail = true, p
	} else {
		ar.Fix = "build it next to smx: `make` (or set SMX_AGENT)"
	}
	reqs = append(reqs, ar)

	rep := &DoctorReport{Requirements: reqs, StateDir: s.state.Root, OK: true}
	a, why := vm.DetectAccel()
	rep.Accel, rep.AccelReason = string(a), why
	var st unix.Statfs_t
	dir := s.state.Root
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
