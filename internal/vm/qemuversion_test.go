package vm

import (
	"os"
	"strings"
	"testing"
)

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

// A vhost-user device maps guest RAM in the supervisor: Args refuses one
// without shared RAM, which QEMU would accept and the device would then
// silently see stale memory through.
func TestVirtioFSNeedsSharedRAM(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "sock")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	base := Config{Accel: AccelKVM, Kernel: "/k", ExtraFiles: []*os.File{f}, Devices: []Device{VirtioFS{Tag: "smx", FD: 3}}}
	if _, err := base.Args(); err == nil || !strings.Contains(err.Error(), "shared") {
		t.Fatalf("virtio-fs on private RAM: %v", err)
	}
	private := base
	private.RAMFile = "/ram"
	if _, err := private.Args(); err == nil {
		t.Fatal("virtio-fs on a private RAM file was accepted")
	}
	shared := base
	shared.SharedRAM = true
	args, err := shared.Args()
	if err != nil {
		t.Fatal(err)
	}
	line := strings.Join(args, " ")
	for _, want := range []string{"memory-backend-memfd,id=microvm.ram,size=256M,share=on", "-machine memory-backend=microvm.ram",
		"-chardev socket,id=vfs0,fd=3", "-device vhost-user-fs-device,chardev=vfs0,tag=smx,queue-size=1024"} {
		if !strings.Contains(line, want) {
			t.Errorf("args lack %q: %s", want, line)
		}
	}
	bad := shared
	bad.Devices = []Device{VirtioFS{Tag: "a,b", FD: 3}}
	if _, err := bad.Args(); err == nil {
		t.Error("tag with a comma accepted")
	}
}
