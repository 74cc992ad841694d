package vm

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/smx-dev/smx/internal/testutil"
)

// CreateOverlay's file is what qemu-img makes: qemu-img checks it clean,
// reads the same size and backing file, and its content is the base's;
// and it is byte for byte qemu-img's own overlay but for the optional
// feature name table.
func TestCreateOverlay(t *testing.T) {
	testutil.RequireQEMU(t)
	qimg, err := exec.LookPath("qemu-img")
	if err != nil {
		t.Skip("qemu-img not installed")
	}
	dir := t.TempDir()
	base := filepath.Join(dir, "base.qcow2")
	if out, err := exec.Command(qimg, "create", "-q", "-f", "qcow2", base, "64M").CombinedOutput(); err != nil {
		t.Fatal(err, string(out))
	}
	if out, err := exec.Command("qemu-io", "-c", "write -P 0x5a 1M 64k", base).CombinedOutput(); err != nil {
		t.Logf("qemu-io (content check skipped): %v %s", err, out)
	}
	for _, size := range []int64{64 << 20, 4<<30 + 1000, 5 << 40} {
		ours := filepath.Join(dir, "ours.qcow2")
		theirs := filepath.Join(dir, "theirs.qcow2")
		os.Remove(ours)
		os.Remove(theirs)
		if err := CreateOverlay(ours, base, size); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(qimg, "create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", theirs, "--", strconv.FormatInt(size, 10)).CombinedOutput(); err != nil {
			t.Fatal(err, string(out))
		}
		if out, err := exec.Command(qimg, "check", ours).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img check: %v\n%s", err, out)
		}
		a, _ := os.ReadFile(ours)
		b, _ := os.ReadFile(theirs)
		if len(a) != len(b) {
			t.Fatalf("size %d: file of %d bytes, qemu-img's %d", size, len(a), len(b))
		}
		// qemu-img also writes a feature name table after the backing
		// format extension, which moves the backing file's name; the
		// header fields, the extension and the tables must match.
		same := func(from, to int) bool { return bytes.Equal(a[from:to], b[from:to]) }
		if !same(0, 8) || !same(16, 0x80) || !same(qcowCluster, len(a)) {
			t.Fatalf("size %d: header or tables differ from qemu-img's:\n%x\n%x", size, a[:0x80], b[:0x80])
		}
		info, err := exec.Command(qimg, "info", "--output=json", ours).Output()
		if err != nil {
			t.Fatal(err)
		}
		var meta struct {
			Backing string `json:"backing-filename"`
			Format  string `json:"backing-filename-format"`
			Size    int64  `json:"virtual-size"`
		}
		if err := json.Unmarshal(info, &meta); err != nil || meta.Backing != base || meta.Format != "qcow2" || meta.Size != (size+511)&^511 {
			t.Fatalf("qemu-img info: %+v %v\n%s", meta, err, info)
		}
		if got, err := QCOW2Size(ours); err != nil || got != (size+511)&^511 {
			t.Fatalf("QCOW2Size = %d, %v", got, err)
		}
		if out, err := exec.Command(qimg, "compare", "-f", "qcow2", "-F", "qcow2", ours, base).CombinedOutput(); err != nil && size == 64<<20 {
			t.Fatalf("overlay content differs from its base: %v\n%s", err, out)
		}
	}
	if err := CreateOverlay(filepath.Join(dir, "rel.qcow2"), "base.qcow2", 1<<20); err == nil {
		t.Fatal("a relative backing path was accepted")
	}
	if err := CreateOverlay(filepath.Join(dir, "base.qcow2"), base, 1<<20); err == nil {
		t.Fatal("an existing file was overwritten")
	}
}
