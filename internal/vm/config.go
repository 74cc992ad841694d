// Package vm runs a QEMU microvm built from data: a Config lists the kernel,
// the resources and Device values, Args turns it into a command line that
// can be printed for debugging, and Start runs it as a Machine.
package vm

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/hosttool"
)

// Config describes one microVM. The zero values of CPUs and MemoryMiB
// mean 1 CPU and 256 MiB.
type Config struct {
	QEMU      string // empty: QEMUProgram()
	Accel     Accel  // required; see DetectAccel
	CPUs      int
	MemoryMiB int

	Kernel  string
	Initrd  string
	Cmdline string // a Console device needs console=ttyS0 here
	// Firmware is the ROM the machine starts: empty for Firmware (qboot),
	// or what a saved state being loaded was saved with.
	Firmware string

	Devices []Device

	// QMPSocket is where QEMU listens for QMP. Start requires it.
	QMPSocket string
	// OperatorQMPSocket, when set, is a second QMP monitor for people and
	// tools (socat, a debugger, a test's memory dump): QEMU serves one
	// client per monitor, and the Machine keeps QMPSocket's.
	OperatorQMPSocket string

	// Incoming, when set, starts QEMU waiting for a saved state instead of
	// booting: "fd:N" reads it from fd N (3 + index in ExtraFiles). The
	// device set and memory size must be those of the machine that saved
	// it. See Machine.WaitLoaded.
	Incoming string

	// RAMFile, when set, backs guest RAM with this file instead of
	// anonymous memory: a memory-backend-file under the machine's own RAM
	// name (ramName), so a state saved either way loads into the other.
	// RAMShared maps it shared (QEMU's writes reach the file); otherwise
	// it is mapped private: the guest reads the file's pages from the host
	// page cache, shared with every other machine mapping it, and a page
	// it writes becomes its own copy. QEMU 7.2 opens the file read-write
	// either way.
	RAMFile   string
	RAMShared bool

	// SharedRAM backs guest RAM with a shared memfd
	// (memory-backend-memfd,share=on) under the machine's RAM name. A
	// vhost-user device (VirtioFS) maps guest RAM in another process and
	// needs it shared: QEMU hands over a private mapping's descriptor as
	// well, and the device then silently sees stale memory, so Args
	// refuses a VirtioFS device without SharedRAM (or a shared RAMFile).
	SharedRAM bool

	// ExtraFiles are passed to QEMU as fds 3, 4, ... in order; devices
	// refer to them by those numbers. The caller keeps ownership and may
	// close its copies once Start returns.
	ExtraFiles []*os.File
}

// ramName is the RAM block of QEMU's microvm machine (its default_ram_id).
// A saved state names its RAM blocks; a RAM backend given under this id
// keeps the name of the default one.
const ramName = "microvm.ram"

const (
	defaultCPUs      = 1
	defaultMemoryMiB = 256
	minMemoryMiB     = 64 // a Debian kernel with an initramfs does not boot in less
)

// sandboxArg turns on QEMU's seccomp filter. spawn=deny means QEMU cannot
// run programs, so live migration must go to an fd (QMP getfd + "fd:NAME"),
// not to "exec:".
const sandboxArg = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

func invalid(format string, a ...any) error {
	return fmt.Errorf("vm: config: %s: %w", fmt.Sprintf(format, a...), errdefs.ErrInvalid)
}

// QEMUProgram is the QEMU that sandboxes run: $SMX_QEMU when it is set
// (a path or a name on PATH, e.g. a newer QEMU unpacked beside the
// distribution's for virtio-fs), else qemu-system-x86_64 from PATH. A saved
// state loads only into the QEMU build that wrote it, so a host keeps one
// setting for all its sandboxes.
func QEMUProgram() string {
	if q := os.Getenv("SMX_QEMU"); q != "" {
		return q
	}
	return "qemu-system-x86_64"
}

// qemuPath resolves the QEMU binary.
func (c Config) qemuPath() (string, error) {
	name := c.QEMU
	if name == "" {
		name = QEMUProgram()
	}
	p, err := hosttool.Look(name)
	if err != nil {
		return "", fmt.Errorf("vm: %s not found: %w: install QEMU (Debian: apt-get install qemu-system-x86) or run `smx doctor`", name, errdefs.ErrUnavailable)
	}
	return p, nil
}

// Args returns QEMU's arguments (without the program name). It checks the
// config but touches no files, so it can be used to print a command line.
// Under TCG, unless Incoming is set, it appends tsc_early_khz to the
// kernel command line (see tcgCmdline); the first such call measures the
// host TSC for 20 ms.
func (c Config) Args() ([]string, error) {
	cpus, mem := c.CPUs, c.MemoryMiB
	if cpus == 0 {
		cpus = defaultCPUs
	}
	if mem == 0 {
		mem = defaultMemoryMiB
	}
	if cpus < 1 || cpus > 64 {
		return nil, invalid("CPUs %d: want 1..64", c.CPUs)
	}
	if mem < minMemoryMiB {
		return nil, invalid("memory %d MiB: want at least %d", c.MemoryMiB, minMemoryMiB)
	}
	if c.Kernel == "" {
		return nil, invalid("no kernel: run `smx setup`")
	}
	for _, d := range c.Devices {
		if v, ok := d.(validator); ok {
			if err := v.validate(len(c.ExtraFiles)); err != nil {
				return nil, invalid("%v", err)
			}
		}
	}

	args := []string{"-M", MachineType}
	switch fw := c.Firmware; fw {
	case "":
		args = append(args, "-bios", Firmware)
	case FirmwareSeaBIOS:
	default:
		args = append(args, "-bios", fw)
	}
	switch c.Accel {
	case AccelKVM:
		args = append(args, "-accel", "kvm", "-cpu", CPUModel(c.Accel))
	case AccelTCG:
		args = append(args, "-accel", "tcg", "-cpu", CPUModel(c.Accel))
	default:
		return nil, invalid("accel %q: want %q or %q (see vm.DetectAccel)", c.Accel, AccelKVM, AccelTCG)
	}
	args = append(args,
		"-m", strconv.Itoa(mem),
		"-smp", strconv.Itoa(cpus),
		"-nodefaults", "-no-user-config", "-nographic", "-display", "none",
		"-sandbox", sandboxArg,
		"-no-reboot", // a guest reboot ends the VM; the supervisor decides what next
		"-kernel", c.Kernel,
	)
	if c.Initrd != "" {
		args = append(args, "-initrd", c.Initrd)
	}
	cmdline := c.Cmdline
	// A machine that loads a saved state never boots its kernel: the
	// guest keeps the command line it booted with, so the TSC need not be
	// measured for it (a restore would otherwise wait up to 20 ms for it).
	if c.Accel == AccelTCG && c.Incoming == "" {
		cmdline = tcgCmdline(cmdline)
	}
	if cmdline != "" {
		args = append(args, "-append", cmdline)
	}
	if c.QMPSocket != "" {
		args = append(args, "-qmp", "unix:"+opt(c.QMPSocket)+",server=on,wait=off")
	}
	if c.OperatorQMPSocket != "" {
		args = append(args, "-qmp", "unix:"+opt(c.OperatorQMPSocket)+",server=on,wait=off")
	}
	if c.Incoming != "" {
		if fd, ok := strings.CutPrefix(c.Incoming, "fd:"); ok {
			n, err := strconv.Atoi(fd)
			if err != nil {
				return nil, invalid("incoming %q: bad fd", c.Incoming)
			}
			if err := checkFD("incoming", n, len(c.ExtraFiles)); err != nil {
				return nil, invalid("%v", err)
			}
		} else if c.Incoming != "defer" {
			return nil, invalid("incoming %q: want fd:N or defer", c.Incoming)
		}
		// No self-announcement after the load: QEMU would have the guest
		// announce its addresses (a config interrupt and a round of ARP,
		// neighbour and multicast frames) five times over the first half
		// second, for switches to learn where a migrated machine went. The
		// NIC's other end is this sandbox's own gateway, which has nothing
		// to learn, and under TCG each round is guest code to translate on
		// the start path.
		args = append(args, "-incoming", c.Incoming, "-global", "migration.announce-rounds=0")
	}
	if c.RAMFile != "" {
		share := "off"
		if c.RAMShared {
			share = "on"
		}
		args = append(args,
			"-object", fmt.Sprintf("memory-backend-file,id=%s,size=%dM,mem-path=%s,share=%s", ramName, mem, opt(c.RAMFile), share),
			"-machine", "memory-backend="+ramName)
	}
	if c.SharedRAM {
		if c.RAMFile != "" {
			return nil, invalid("SharedRAM and RAMFile: choose one RAM backend")
		}
		args = append(args,
			"-object", fmt.Sprintf("memory-backend-memfd,id=%s,size=%dM,share=on", ramName, mem),
			"-machine", "memory-backend="+ramName)
	}
	for _, d := range c.Devices {
		if _, ok := d.(VirtioFS); ok && !c.SharedRAM && !(c.RAMFile != "" && c.RAMShared) {
			return nil, invalid("virtio-fs needs guest RAM shared with its backend (SharedRAM): a private mapping would break it silently")
		}
	}
	var ids IDs
	for _, d := range c.Devices {
		args = append(args, d.Args(&ids)...)
	}
	return args, nil
}
