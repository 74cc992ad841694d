package vhostuser

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Dirty logging (vhost-user.rst, "Migration"): while QEMU migrates a
// running guest it copies guest RAM in rounds and needs to know which pages
// changed behind its back. The backend writes guest memory (replies, read
// data, the used ring), so with VHOST_F_LOG_ALL negotiated it sets one bit
// per 4 KiB guest page it wrote in a bitmap QEMU shares with it
// (SET_LOG_BASE with LOG_SHMFD). A page it wrote and did not mark would
// reach the destination stale: a read that returned the old bytes.

// FeatureLogAll is VHOST_F_LOG_ALL: the backend marks what it writes.
const FeatureLogAll = 1 << 26

// ProtocolLogShmfd is VHOST_USER_PROTOCOL_F_LOG_SHMFD: the log is shared
// memory passed with SET_LOG_BASE.
const ProtocolLogShmfd = 1 << 1

// vringFLog is VHOST_VRING_F_LOG in SET_VRING_ADDR's flags: writes to that
// queue's used ring are logged at its log address.
const vringFLog = 1

const logPage = 0x1000

// maxLogSize bounds the bitmap the front-end may hand over: one bit per
// 4 KiB page of 1 TiB of guest address space.
const maxLogSize = 1 << 25

// dirtyLog is the bitmap shared with the front-end. Bits are set with
// atomic ORs on aligned 32-bit words: QEMU clears them concurrently.
type dirtyLog struct {
	mapping []byte // the whole mmap, from file offset 0
	off     uint64 // where the bitmap starts in mapping
	size    uint64 // bitmap bytes
}

// mapLog maps the log of a SET_LOG_BASE (body: mmap size, mmap offset).
func mapLog(fd int, body []byte) (*dirtyLog, error) {
	if len(body) < 16 {
		return nil, malformed("log of %d bytes, want 16", len(body))
	}
	size := binary.LittleEndian.Uint64(body[0:8])
	off := binary.LittleEndian.Uint64(body[8:16])
	if size == 0 || size > maxLogSize || off > math.MaxInt64-size-8 {
		return nil, malformed("log size %d offset %d", size, off)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("vhostuser: log: %w", err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFREG && uint64(st.Size) < off+size {
		return nil, malformed("log of %d bytes at offset %d is beyond its file (%d bytes)", size, off, st.Size)
	}
	// Round up to a whole word: the last bits are set with a 32-bit OR.
	// The extra bytes share the last byte's page, which the file backs.
	n := (off + size + 7) &^ 7
	mp, err := unix.Mmap(fd, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("vhostuser: map log: %w", err)
	}
	return &dirtyLog{mapping: mp, off: off, size: size}, nil
}

func (l *dirtyLog) unmap() {
	if l != nil && l.mapping != nil {
		unix.Munmap(l.mapping)
	}
}

// mark sets the bits of the pages of [addr, addr+n). Pages beyond the log
// are not marked: the front-end sizes the log for all of guest memory and
// grows it (a new SET_LOG_BASE) before memory grows, so none should be; it
// is reported as an error to the caller.
func (l *dirtyLog) mark(addr, n uint64) error {
	if n == 0 {
		return nil
	}
	if addr > math.MaxUint64-n {
		return malformed("logged range %#x+%d wraps", addr, n)
	}
	first, last := addr/logPage, (addr+n-1)/logPage
	if last/8 >= l.size {
		return malformed("logged range %#x+%d is beyond the log (%d pages)", addr, n, l.size*8)
	}
	for p := first; p <= last; p++ {
		bit := l.off*8 + p // bit index from the start of the mapping
		word := (bit / 32) * 4
		w := (*uint32)(unsafe.Pointer(&l.mapping[word]))
		// The bitmap is little-endian bytes: bit k of byte b is bit
		// 8*(b%4)+k of the little-endian word holding it.
		atomic.OrUint32(w, 1<<(bit%32))
	}
	return nil
}

// span is a guest-physical range a descriptor names.
type span struct {
	gpa uint64
	n   uint64
}

// markWritten marks the first n bytes of the chain's writable descriptors.
func (l *dirtyLog) markWritten(spans []span, n uint64) error {
	for _, s := range spans {
		if n == 0 {
			break
		}
		k := min(s.n, n)
		if err := l.mark(s.gpa, k); err != nil {
			return err
		}
		n -= k
	}
	return nil
}
