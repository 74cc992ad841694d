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

// tcgCmdline adds tsc_early_khz to cmdline unless the caller set it.
func tcgCmdline(cmdline string) string {
	if strings.Contains(cmdline, "tsc_early_khz=") {
		return cmdline
	}
	khz := hostTSCKHz()
	if khz <= 0 {
		return cmdline
	}
	return strings.TrimSpace(cmdline + " tsc_early_khz=" + strconv.Itoa(khz))
}
