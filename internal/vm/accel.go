package vm

import (
	"bufio"
	"errors"
	"io/fs"
	"os"
	"slices"
	"strings"
)

// Accel is a QEMU accelerator.
type Accel string

const (
	AccelKVM Accel = "kvm"
	AccelTCG Accel = "tcg"
)

// DetectAccel picks KVM when the host can really use it and TCG otherwise.
// The string says why, in one line fit for a notice to the user.
//
// An openable /dev/kvm is not enough: nested, paravirtual KVM (as on some
// cloud machines) exposes /dev/kvm yet cannot boot a stock kernel — QEMU
// asserts on an MSR or the guest hangs. Such hosts do not show vmx or svm in
// the CPU flags, so both conditions are required.
func DetectAccel() (Accel, string) {
	a, why := detectAccel("/dev/kvm", "/proc/cpuinfo")
	if a == AccelTCG && isWSL("/proc/sys/kernel/osrelease") {
		why += "; " + wslAdvice
	}
	return a, why
}

// wslAdvice is how KVM comes to WSL2: nested virtualisation in the
// Windows user's .wslconfig, then /dev/kvm for this user.
const wslAdvice = "on WSL2, KVM needs nested virtualisation: put `nestedVirtualization=true` under `[wsl2]` in %UserProfile%\\.wslconfig, run `wsl --shutdown` from Windows, then `sudo usermod -aG kvm $USER` (see docs/install.md)"

// isWSL reports whether the kernel is WSL2's (its release names
// Microsoft's build, e.g. 5.15.153.1-microsoft-standard-WSL2).
func isWSL(osreleasePath string) bool {
	b, err := os.ReadFile(osreleasePath)
	return err == nil && strings.Contains(strings.ToLower(string(b)), "microsoft")
}

func detectAccel(kvmPath, cpuinfoPath string) (Accel, string) {
	f, err := os.OpenFile(kvmPath, os.O_RDWR, 0)
	if err != nil {
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return AccelTCG, kvmPath + " does not exist; using TCG (slow)"
		case errors.Is(err, fs.ErrPermission):
			return AccelTCG, kvmPath + ": permission denied (add yourself to the kvm group); using TCG (slow)"
		default:
			return AccelTCG, kvmPath + ": " + err.Error() + "; using TCG (slow)"
		}
	}
	f.Close()
	if !hasVirtFlag(cpuinfoPath) {
		return AccelTCG, "no vmx/svm in CPU flags (nested or paravirtual KVM cannot boot a stock kernel); using TCG (slow)"
	}
	return AccelKVM, "using KVM"
}

func hasVirtFlag(cpuinfoPath string) bool {
	flags, _ := cpuFlags(cpuinfoPath)
	for _, fl := range flags {
		if fl == "vmx" || fl == "svm" {
			return true
		}
	}
	return false
}

// HostCPUFlags are the host CPU's feature flags (/proc/cpuinfo), sorted.
// Under KVM (`-cpu host`) they are what a guest may have started using,
// so a state saved on this host needs them all where it is restored.
func HostCPUFlags() ([]string, error) { return cpuFlags("/proc/cpuinfo") }

func cpuFlags(cpuinfoPath string) ([]string, error) {
	f, err := os.Open(cpuinfoPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20) // flags lines are long
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(key) != "flags" {
			continue
		}
		// All CPUs show the same flags; the first line decides.
		flags := strings.Fields(val)
		slices.Sort(flags)
		return slices.Compact(flags), nil
	}
	return nil, sc.Err()
}

// CPUModel is the -cpu argument a machine with accel gets: under TCG the
// emulated model (what the guest sees is fixed by it and the QEMU
// build), under KVM the host's own CPU (what the guest sees is the host's
// flags: see HostCPUFlags).
func CPUModel(accel Accel) string {
	if accel == AccelKVM {
		return "host"
	}
	// max rather than the default qemu64: it boots as fast under TCG
	// and offers RDRAND, SSE4.2 (crc32c-intel) and x86-64-v2+ to
	// guest programs built for newer CPUs. Without ERMS and FSRM:
	// with them the guest kernel copies with `rep movsb`, which TCG
	// runs one byte per loop iteration; without, `rep movsq` moves 8
	// bytes per iteration. Every copy through a socket or the page
	// cache takes 2.5-3x less guest CPU (measured on 9P over TCP).
	return "max,-erms,-fsrm"
}

// CPUOf is the -cpu model a machine with accel runs and, under KVM, the
// host CPU's flags the guest sees (nil under TCG, where the model and the
// QEMU build fix them).
func CPUOf(accel Accel) (model string, flags []string) {
	if accel == AccelKVM {
		flags, _ = HostCPUFlags()
	}
	return CPUModel(accel), flags
}

// MachineType is the QEMU machine type every sandbox runs.
const MachineType = "microvm"

// Firmware is the ROM a machine boots with: qboot, the minimal firmware
// made for microvm (in QEMU's data directory since 4.0). QEMU's own
// default for microvm, bios-microvm.bin, is qboot in Debian 12's QEMU 7.2
// but SeaBIOS in QEMU 10 from bookworm-backports, and that SeaBIOS
// (1.16.3) hangs after "Booting from ROM.." at some sizes of initramfs, so
// a change of smx-agent's size could stop every boot. A saved state loads
// only into a machine with the firmware it was saved with:
// FirmwareSeaBIOS stands for QEMU's default, which states saved before smx
// named one ran.
const (
	Firmware        = "qboot.rom"
	FirmwareSeaBIOS = "seabios"
)
