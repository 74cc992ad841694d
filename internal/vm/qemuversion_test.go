package vm

import "testing"

func TestParseQEMUVersion(t *testing.T) {
	for _, c := range []struct {
		line         string
		major, minor int
		ok, capable  bool
	}{
		{"QEMU emulator version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u18)", 7, 2, true, false},
		{"QEMU emulator version 8.1.5", 8, 1, true, false},
		{"QEMU emulator version 8.2.2 (Debian 1:8.2.2+ds-0ubuntu1)", 8, 2, true, true},
		{"QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)", 10, 0, true, true},
		{"QEMU emulator version 9.10", 9, 10, true, true},
		{"qemu 10.0", 0, 0, false, false},
		{"QEMU emulator version x.2", 0, 0, false, false},
		{"QEMU emulator version 10", 0, 0, false, false},
		{"", 0, 0, false, false},
	} {
		ma, mi, ok := ParseQEMUVersion(c.line)
		if ma != c.major || mi != c.minor || ok != c.ok {
			t.Errorf("ParseQEMUVersion(%q) = %d, %d, %v; want %d, %d, %v", c.line, ma, mi, ok, c.major, c.minor, c.ok)
		}
		if got := VirtioFSCapable(c.line); got != c.capable {
			t.Errorf("VirtioFSCapable(%q) = %v, want %v", c.line, got, c.capable)
		}
	}
}
