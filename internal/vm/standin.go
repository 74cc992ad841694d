package vm

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"

	"github.com/smx-dev/smx/internal/statedir"
)

// A QEMU that loads a saved state (Config.Incoming) never boots its
// -kernel and -initrd: the guest's kernel is in the saved memory, QEMU
// skips loading ROMs into memory while an incoming migration is pending,
// and -no-reboot ends the VM where a reset would boot them. QEMU still
// reads both files at start and keeps their contents for such a reset:
// the guest's 25 MB vmlinux and its 4-8 MB initramfs, about 15 ms of
// every restore here and host memory for as long as the sandbox runs. A
// restore is given standInKernel instead, without an initramfs. What must
// match the saved state is the boot protocol: a PVH ELF kernel, as every
// smx guest kernel is booted (Kernel.BootImage), gets the same PVH option
// ROM, the one RAM block of the boot path in the state.
//
// The stand-in is 203 bytes: an ELF header, a PT_LOAD of three bytes of
// code at the kernel's load address (hlt; jmp back), and the Xen PVH
// entry note QEMU's microvm requires of an uncompressed kernel.
var standInKernel = func() []byte {
	const entry = 0x1000000 // where Linux loads
	le := binary.LittleEndian
	var note []byte
	note = le.AppendUint32(note, 4)  // name size
	note = le.AppendUint32(note, 8)  // descriptor size
	note = le.AppendUint32(note, 18) // XEN_ELFNOTE_PHYS32_ENTRY
	note = append(note, "Xen\x00"...)
	note = le.AppendUint64(note, entry)
	code := []byte{0xf4, 0xeb, 0xfd} // hlt; jmp .-3
	const ehSize, phSize, phNum = 64, 56, 2
	noteOff := uint64(ehSize + phNum*phSize)
	codeOff := noteOff + uint64(len(note))

	b := []byte{0x7f, 'E', 'L', 'F', 2 /* 64-bit */, 1 /* little-endian */, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	b = le.AppendUint16(b, 2)  // ET_EXEC
	b = le.AppendUint16(b, 62) // EM_X86_64
	b = le.AppendUint32(b, 1)
	b = le.AppendUint64(b, entry)
	b = le.AppendUint64(b, ehSize) // program headers
	b = le.AppendUint64(b, 0)      // no section headers
	b = le.AppendUint32(b, 0)
	b = le.AppendUint16(b, ehSize)
	b = le.AppendUint16(b, phSize)
	b = le.AppendUint16(b, phNum)
	b = le.AppendUint16(b, 0)
	b = le.AppendUint16(b, 0)
	b = le.AppendUint16(b, 0)
	ph := func(typ, flags uint32, off, addr, size, align uint64) {
		b = le.AppendUint32(b, typ)
		b = le.AppendUint32(b, flags)
		b = le.AppendUint64(b, off)
		b = le.AppendUint64(b, addr)
		b = le.AppendUint64(b, addr)
		b = le.AppendUint64(b, size)
		b = le.AppendUint64(b, size)
		b = le.AppendUint64(b, align)
	}
	ph(1, 5, codeOff, entry, uint64(len(code)), 16) // PT_LOAD, R+X
	ph(4, 4, noteOff, 0, uint64(len(note)), 4)      // PT_NOTE, R
	b = append(b, note...)
	return append(b, code...)
}()

// StandInKernel returns the path of the stand-in kernel in dir (see
// standInKernel), written there once.
func StandInKernel(dir string) (string, error) {
	p := filepath.Join(dir, "restore-kernel.elf")
	if b, err := os.ReadFile(p); err == nil && bytes.Equal(b, standInKernel) {
		return p, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	return p, statedir.WriteFileAtomic(p, standInKernel, 0o644)
}
