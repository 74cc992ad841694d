package cli_test

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFilesVirtioFSExecRewritten runs a program from a virtio-fs mount,
// rewritten in place between runs with another of the same layout, and
// checks each run is the program now in the file. Under TCG this failed
// (old code ran, or the program crashed) until the guest copied the
// device's buffers itself: the supervisor writes the page cache's pages
// from another process, which QEMU's translated-code tracking never sees.
func TestFilesVirtioFSExecRewritten(t *testing.T) {
	requireVirtioFS(t)
	dir := t.TempDir()
	// 200 pages, each adding 1 (a) or 0 (b) to the exit code: a run
	// that mixes stale pages of one with the other exits in between.
	for name, add := range map[string]uint32{"a": 1, "b": 0} {
		if err := os.WriteFile(filepath.Join(dir, name), exitProgram(200, add), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	v := startSandbox(t, "files-vfs-exec", "--profile", "dev", "-v", dir+":/work")
	out, err := v.sh(`grep -q ' /work virtiofs ' /proc/mounts || exit 9
for i in $(seq 25); do
  cp /work/a /work/p; /work/p; ra=$?
  cp /work/b /work/p; /work/p; rb=$?
  echo "$ra $rb"
done 2>&1 | sort | uniq -c`)
	if err != nil {
		t.Fatalf("runs: %v\n%s", err, out)
	}
	if got := strings.Fields(out); len(got) != 3 || got[0] != "25" || got[1] != "200" || got[2] != "0" {
		t.Errorf("25 runs of a (exit 200) and b (exit 0) rewritten in place over virtio-fs gave (count, a's exit, b's exit):\n%s", out)
	}
}

// exitProgram is a static x86-64 ELF of pages pages of code after its
// headers' page: the first zeroes edi, each adds add to it and jumps to
// the next, the last exits with edi.
func exitProgram(pages int, add uint32) []byte {
	const base, page = 0x400000, 4096
	size := (pages + 1) * page
	b := make([]byte, size)
	le := binary.LittleEndian
	copy(b, "\x7fELF\x02\x01\x01")
	le.PutUint16(b[16:], 2)  // ET_EXEC
	le.PutUint16(b[18:], 62) // x86-64
	le.PutUint32(b[20:], 1)
	le.PutUint64(b[24:], base+page) // entry
	le.PutUint64(b[32:], 64)        // program headers
	le.PutUint16(b[52:], 64)
	le.PutUint16(b[54:], 56)
	le.PutUint16(b[56:], 1)
	ph := b[64:]
	le.PutUint32(ph[0:], 1) // PT_LOAD
	le.PutUint32(ph[4:], 5) // R+X
	le.PutUint64(ph[16:], base)
	le.PutUint64(ph[24:], base)
	le.PutUint64(ph[32:], uint64(size))
	le.PutUint64(ph[40:], uint64(size))
	le.PutUint64(ph[48:], page)
	for i := 1; i <= pages; i++ {
		c := b[i*page : i*page]
		if i == 1 {
			c = append(c, 0x31, 0xff) // xor edi, edi
		}
		c = append(c, 0x81, 0xc7) // add edi, imm32
		c = le.AppendUint32(c, add)
		if i < pages {
			c = append(c, 0xe9) // jmp rel32 to the next page
			c = le.AppendUint32(c, uint32(page-len(c)-4))
		} else {
			c = append(c, 0xb8, 60, 0, 0, 0, 0x0f, 0x05) // mov eax, 60 (exit); syscall
		}
	}
	return b
}
