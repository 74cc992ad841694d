package vhostuser

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrMalformed marks input from the front-end or the guest that breaks
// the protocol: a bad message, a descriptor outside guest memory, a ring
// index out of range. It ends the device, never the process.
var ErrMalformed = errors.New("vhostuser: malformed")

func malformed(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, a...))
}

// Region is one piece of guest memory as the front-end described it:
// guest-physical addresses [GPA, GPA+len(Mem)) are the bytes of Mem, which
// the front-end maps at UserAddr in its own address space.
type Region struct {
	GPA      uint64
	UserAddr uint64
	Mem      []byte
	mapping  []byte // the whole mmap (from file offset 0), nil for test memory
}

// Memory is the guest's memory table. It is read-only once built; a new
// SET_MEM_TABLE builds a new one.
type Memory struct {
	regions []Region
}

// NewMemory checks regions (non-empty, no address overflow, no overlap in
// guest-physical or front-end addresses) and returns the table.
func NewMemory(regions []Region) (*Memory, error) {
	for i, r := range regions {
		n := uint64(len(r.Mem))
		if n == 0 {
			return nil, malformed("memory region %d is empty", i)
		}
		if r.GPA > math.MaxUint64-n || r.UserAddr > math.MaxUint64-n {
			return nil, malformed("memory region %d wraps the address space", i)
		}
		for j := range i {
			o := regions[j]
			m := uint64(len(o.Mem))
			if r.GPA < o.GPA+m && o.GPA < r.GPA+n {
				return nil, malformed("memory regions %d and %d overlap", j, i)
			}
			if r.UserAddr < o.UserAddr+m && o.UserAddr < r.UserAddr+n {
				return nil, malformed("memory regions %d and %d overlap in the front-end", j, i)
			}
		}
	}
	return &Memory{regions: regions}, nil
}

// unmap releases the mappings of a table built by SetMemTable.
func (m *Memory) unmap() {
	if m == nil {
		return
	}
	for _, r := range m.regions {
		if r.mapping != nil {
			unix.Munmap(r.mapping)
		}
	}
}

// Guest returns guest-physical [addr, addr+n) as slices of guest memory,
// one per region it crosses (usually one). Every byte must be inside a
// region.
func (m *Memory) Guest(addr, n uint64, out [][]byte) ([][]byte, error) {
	if addr > math.MaxUint64-n {
		return out, malformed("buffer %#x+%d wraps", addr, n)
	}
	for n > 0 {
		r := m.findGPA(addr)
		if r == nil {
			return out, malformed("guest address %#x is outside guest memory", addr)
		}
		off := addr - r.GPA
		k := min(n, uint64(len(r.Mem))-off)
		out = append(out, r.Mem[off:off+k:off+k])
		addr += k
		n -= k
	}
	return out, nil
}

// guestRange is Guest for a structure that must lie in one region (a
// descriptor table, a ring).
func (m *Memory) guestRange(addr, n uint64) ([]byte, error) {
	if addr > math.MaxUint64-n {
		return nil, malformed("range %#x+%d wraps", addr, n)
	}
	r := m.findGPA(addr)
	if r == nil || addr-r.GPA+n > uint64(len(r.Mem)) {
		return nil, malformed("range %#x+%d is not inside one guest memory region", addr, n)
	}
	off := addr - r.GPA
	return r.Mem[off : off+n : off+n], nil
}

// user translates a front-end address (the vring addresses of
// SET_VRING_ADDR) to n bytes of guest memory in one region.
func (m *Memory) user(addr, n uint64) ([]byte, error) {
	if addr > math.MaxUint64-n {
		return nil, malformed("front-end range %#x+%d wraps", addr, n)
	}
	for i := range m.regions {
		r := &m.regions[i]
		if addr >= r.UserAddr && addr-r.UserAddr+n <= uint64(len(r.Mem)) {
			off := addr - r.UserAddr
			return r.Mem[off : off+n : off+n], nil
		}
	}
	return nil, malformed("front-end range %#x+%d is not inside one guest memory region", addr, n)
}

func (m *Memory) findGPA(addr uint64) *Region {
	for i := range m.regions {
		r := &m.regions[i]
		if addr >= r.GPA && addr-r.GPA < uint64(len(r.Mem)) {
			return r
		}
	}
	return nil
}

// contains says whether b lies inside guest memory (tests).
func (m *Memory) contains(b []byte) bool {
	if len(b) == 0 {
		return true
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	for _, r := range m.regions {
		s := uintptr(unsafe.Pointer(unsafe.SliceData(r.Mem)))
		if p >= s && p+uintptr(len(b)) <= s+uintptr(len(r.Mem)) {
			return true
		}
	}
	return false
}

// mapRegion maps one region of a SET_MEM_TABLE from its descriptor. The
// mapping is shared: what the backend writes is what the guest reads.
func mapRegion(fd int, gpa, size, userAddr, offset uint64) (Region, error) {
	if size == 0 || offset > math.MaxUint64-size || offset+size > math.MaxInt64 {
		return Region{}, malformed("memory region size %d offset %d", size, offset)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Region{}, fmt.Errorf("vhostuser: memory region: %w", err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFREG && uint64(st.Size) < offset+size {
		return Region{}, malformed("memory region of %d bytes at offset %d is beyond its file (%d bytes)", size, offset, st.Size)
	}
	mp, err := unix.Mmap(fd, 0, int(offset+size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return Region{}, fmt.Errorf("vhostuser: map memory region: %w", err)
	}
	return Region{GPA: gpa, UserAddr: userAddr, Mem: mp[offset : offset+size : offset+size], mapping: mp}, nil
}
