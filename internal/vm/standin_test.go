package vm

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"testing"
)

// The stand-in is a PVH kernel as QEMU's microvm reads one: an x86-64
// executable whose Xen PHYS32_ENTRY note names its loaded code.
func TestStandInKernel(t *testing.T) {
	dir := t.TempDir()
	p, err := StandInKernel(dir)
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC || f.Machine != elf.EM_X86_64 || f.Class != elf.ELFCLASS64 {
		t.Fatalf("type %v, machine %v, class %v", f.Type, f.Machine, f.Class)
	}
	var entry uint64
	var loaded bool
	for _, ph := range f.Progs {
		switch ph.Type {
		case elf.PT_NOTE:
			b := make([]byte, ph.Filesz)
			if _, err := ph.ReadAt(b, 0); err != nil {
				t.Fatal(err)
			}
			le := binary.LittleEndian
			if len(b) != 24 || le.Uint32(b[0:]) != 4 || le.Uint32(b[8:]) != 18 || string(b[12:16]) != "Xen\x00" {
				t.Fatalf("note % x: want Xen PHYS32_ENTRY", b)
			}
			entry = le.Uint64(b[16:])
		case elf.PT_LOAD:
			code := make([]byte, ph.Filesz)
			ph.ReadAt(code, 0)
			loaded = ph.Paddr == f.Entry && bytes.Equal(code, []byte{0xf4, 0xeb, 0xfd})
		}
	}
	if entry != f.Entry || entry != 0x1000000 || !loaded {
		t.Fatalf("PVH entry %#x, ELF entry %#x, halt loop loaded there: %v", entry, f.Entry, loaded)
	}
	// A file that differs (an older stand-in, a damaged one) is replaced.
	os.WriteFile(p, []byte("junk"), 0o644)
	if p2, err := StandInKernel(dir); err != nil || p2 != p {
		t.Fatal(p2, err)
	}
	if b, _ := os.ReadFile(p); !bytes.Equal(b, standInKernel) {
		t.Fatal("stand-in not rewritten")
	}
}
