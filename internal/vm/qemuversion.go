package vm

import (
	"strconv"
	"strings"
)

// VirtioFSMinQEMU is the first QEMU whose vhost-user-fs device migrates
// (its backend's state travels inside QEMU's migration stream, QEMU commit
// "vhost-user-fs: Implement internal migration"): with an older QEMU a
// virtio-fs mount would block snapshots, forks and templates, so mounts
// there use the 9P gateway instead.
var VirtioFSMinQEMU = [2]int{8, 2}

// ParseQEMUVersion reads major and minor from QEMU's --version line
// ("QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2...)"). ok is false
// for anything else.
func ParseQEMUVersion(line string) (major, minor int, ok bool) {
	const prefix = "QEMU emulator version "
	i := strings.Index(line, prefix)
	if i < 0 {
		return 0, 0, false
	}
	v := line[i+len(prefix):]
	if j := strings.IndexAny(v, " (\n"); j >= 0 {
		v = v[:j]
	}
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil || ma < 0 || mi < 0 {
		return 0, 0, false
	}
	return ma, mi, true
}

// VirtioFSCapable says whether a QEMU --version line is at least
// VirtioFSMinQEMU. An unreadable line is not.
func VirtioFSCapable(line string) bool {
	ma, mi, ok := ParseQEMUVersion(line)
	if !ok {
		return false
	}
	return ma > VirtioFSMinQEMU[0] || ma == VirtioFSMinQEMU[0] && mi >= VirtioFSMinQEMU[1]
}
