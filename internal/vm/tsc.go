package vm

import (
	"strconv"
	"strings"
	"sync"
)

// Under TCG the guest reads the host's TSC, but the kernel's early TSC
// calibration against the emulated PIT fails when the host is busy ("tsc:
// Unable to calibrate against PIT"); with no HPET or ACPI PM timer on
// microvm it then has no usable clock and boot hangs, about one boot in
// ten on a loaded 2-core host. Telling the kernel the frequency
// (tsc_early_khz) skips the calibration.
var hostTSCKHz = sync.OnceValue(measureTSCKHz)

// MeasureTSC starts measuring the host TSC in the background, so that the
// first Config.Args under TCG finds it done instead of sleeping for it: a
// supervisor calls it as it starts, before the work that precedes QEMU.
func MeasureTSC() { go hostTSCKHz() }

// tcgCmdline adds tsc_early_khz to cmdline unless the caller set it, and
// tsc=reliable. Without the latter the kernel's clocksource watchdog
// compares the TSC with jiffies, which fall behind whenever the host is
// busy, marks the TSC unstable a second or two after boot and falls back
// to refined-jiffies: no high-resolution timers, clock reads with 4 ms
// steps, and every short sleep (Go's scheduler makes many) rounded up to
// a tick. Under TCG the TSC is the host's clock scaled, so it is the
// reliable one. Measured: a 9P round trip relayed by smx-agent went from
// about 3.7 ms to about 1 ms of wall time.
//
// It also adds mitigations=off: an emulated CPU never speculates, so the
// guest kernel's defences against speculative execution (a retpoline for
// every indirect call, return-buffer stuffing, barriers in user copies)
// protect nothing under TCG and cost emulated instructions on every
// syscall. Under KVM the kernel keeps its defaults.
func tcgCmdline(cmdline string) string {
	if !hasParam(cmdline, "tsc") {
		cmdline = strings.TrimSpace(cmdline + " tsc=reliable")
	}
	if !hasParam(cmdline, "mitigations") {
		cmdline += " mitigations=off"
	}
	if strings.Contains(cmdline, "tsc_early_khz=") {
		return cmdline
	}
	khz := hostTSCKHz()
	if khz <= 0 {
		return cmdline
	}
	return strings.TrimSpace(cmdline + " tsc_early_khz=" + strconv.Itoa(khz))
}

// hasParam reports whether cmdline sets kernel parameter name.
func hasParam(cmdline, name string) bool {
	for _, f := range strings.Fields(cmdline) {
		if f == name || strings.HasPrefix(f, name+"=") {
			return true
		}
	}
	return false
}
