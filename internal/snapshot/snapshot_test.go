package snapshot

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/errdefs"
)

func build(t *testing.T, s *Store, name, parent string) *Snapshot {
	t.Helper()
	b, err := s.Begin(name)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(b.MemoryPath(), []byte("state of "+name), 0o600)
	os.WriteFile(b.DiskPath(), []byte("disk of "+name), 0o600)
	sn, err := b.Commit(Snapshot{Source: "src", Parent: parent, MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	return sn
}

func TestStore(t *testing.T) {
	s := &Store{Dir: t.TempDir()}
	one := build(t, s, "one", "")
	if !strings.HasPrefix(one.MemoryDigest, "sha256:") || one.MemoryStateBytes != int64(len("state of one")) {
		t.Fatalf("meta %+v", one)
	}
	if _, err := s.Begin("one"); !errors.Is(err, errdefs.ErrExists) {
		t.Fatalf("Begin existing: %v", err)
	}
	// A save in progress is invisible, blocks its name, and is dropped by
	// Abort.
	b, err := s.Begin("two")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Begin("two"); !errors.Is(err, errdefs.ErrExists) {
		t.Fatalf("second Begin: %v", err)
	}
	if list, _ := s.List(); len(list) != 1 {
		t.Fatalf("list during save: %v", list)
	}
	b.Abort()
	if _, err := os.Stat(s.TempDir("two")); !os.IsNotExist(err) {
		t.Fatalf("aborted build left: %v", err)
	}
	// A crashed save (no lock holder) is cleaned by List.
	os.Mkdir(s.TempDir("three"), 0o700)
	s.List()
	if _, err := os.Stat(s.TempDir("three")); !os.IsNotExist(err) {
		t.Fatal("stale temp dir kept")
	}

	child := build(t, s, "child", "one")
	if err := s.Verify(child); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("one", nil); !errors.Is(err, errdefs.ErrInUse) {
		t.Fatalf("remove parent: %v", err)
	}
	if err := s.Remove("child", func(string) ([]string, error) { return []string{"sandbox x"}, nil }); !errors.Is(err, errdefs.ErrInUse) {
		t.Fatalf("remove used: %v", err)
	}
	// Corrupting a parent layer fails the child's verification.
	p := filepath.Join(one.Dir, "disk.qcow2")
	os.Chmod(p, 0o644)
	os.WriteFile(p, []byte("disk of 0ne"), 0o644)
	if err := s.Verify(child); err == nil || !strings.Contains(err.Error(), "snapshot one: disk.qcow2 does not match") {
		t.Fatalf("verify corrupt parent: %v", err)
	}
	if err := s.Remove("child", nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("one", nil); err != nil {
		t.Fatal(err)
	}
	if list, _ := s.List(); len(list) != 0 {
		t.Fatalf("left: %v", list)
	}
}

func TestHostCheck(t *testing.T) {
	h := Host{QEMUVersion: "QEMU emulator version 7.2.22", Kernel: "6.1.0-57-amd64", InitramfsHash: "ab", Accel: "tcg"}
	if err := h.Check(h); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		mod  func(*Host)
		want string
	}{
		{func(h *Host) { h.QEMUVersion = "QEMU emulator version 8.0" }, "QEMU"},
		{func(h *Host) { h.Kernel = "6.1.0-58-amd64" }, "guest kernel"},
		{func(h *Host) { h.InitramfsHash = "cd" }, "initramfs"},
		{func(h *Host) { h.Accel = "kvm" }, "accelerator"},
	} {
		cur := h
		c.mod(&cur)
		err := h.Check(cur)
		if !errors.Is(err, errdefs.ErrFailed) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v", c.want, err)
		}
	}
}

// TestHostCheckCPU: a restore says which CPU features, model or machine
// the saved state needs that this host lacks; what the state did not
// record (saved before it was) is not compared.
func TestHostCheckCPU(t *testing.T) {
	base := Host{QEMUVersion: "q", Kernel: "k", InitramfsHash: "i", Accel: "kvm"}
	saved := base
	saved.Machine, saved.CPU, saved.CPUFlags = "microvm", "host", []string{"avx2", "avx512f", "fpu"}
	cur := base
	cur.Machine, cur.CPU, cur.CPUFlags = "microvm", "host", []string{"avx2", "fpu", "sse2"}
	err := saved.Check(cur)
	if err == nil || !strings.Contains(err.Error(), "this host lacks CPU features avx512f") || !errors.Is(err, errdefs.ErrFailed) {
		t.Errorf("missing flag: %v", err)
	}
	cur.CPUFlags = append(cur.CPUFlags, "avx512f")
	if err := saved.Check(cur); err != nil {
		t.Errorf("every flag there: %v", err)
	}
	tcg := base
	tcg.Accel, tcg.Machine, tcg.CPU = "tcg", "microvm", "max,-erms,-fsrm"
	other := tcg
	other.CPU, other.Machine = "max", "q35"
	if err := tcg.Check(other); err == nil || !strings.Contains(err.Error(), `QEMU machine type "microvm"`) || !strings.Contains(err.Error(), `CPU model "max,-erms,-fsrm"`) {
		t.Errorf("other model and machine: %v", err)
	}
	if err := base.Check(cur); err != nil {
		t.Errorf("a state that recorded no CPU: %v", err)
	}
}
