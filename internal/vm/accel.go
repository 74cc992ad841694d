package vm

import (
	"bufio"
	"errors"
	"io/fs"
	"os"
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
	f, err := os.Open(cpuinfoPath)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20) // flags lines are long
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(key) != "flags" {
			continue
		}
		for _, fl := range strings.Fields(val) {
			if fl == "vmx" || fl == "svm" {
				return true
			}
		}
		return false // all CPUs show the same flags; the first line decides
	}
	return false
}
