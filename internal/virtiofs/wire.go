package virtiofs

import (
	"encoding/binary"
	"errors"
)

// FUSE wire format (linux/fuse.h, protocol 7.31), little-endian as the
// guest writes it. Decoding is by hand with explicit bounds rather than
// go-fuse's structs, which are read by casting a pointer over a buffer:
// here every request comes from a hostile guest, scattered over guest
// memory, and each field is read once from a private copy.

const (
	opLookup      = 1
	opForget      = 2
	opGetattr     = 3
	opSetattr     = 4
	opReadlink    = 5
	opSymlink     = 6
	opMknod       = 8
	opMkdir       = 9
	opUnlink      = 10
	opRmdir       = 11
	opRename      = 12
	opLink        = 13
	opOpen        = 14
	opRead        = 15
	opWrite       = 16
	opStatfs      = 17
	opRelease     = 18
	opFsync       = 20
	opSetxattr    = 21
	opGetxattr    = 22
	opListxattr   = 23
	opRemovexattr = 24
	opFlush       = 25
	opInit        = 26
	opOpendir     = 27
	opReaddir     = 28
	opReleasedir  = 29
	opFsyncdir    = 30
	opAccess      = 34
	opCreate      = 35
	opInterrupt   = 36
	opDestroy     = 38
	opBatchForget = 42
	opRename2     = 45
)

const (
	inHeaderSize  = 40
	outHeaderSize = 16
	attrSize      = 88
	entryOutSize  = 40 + attrSize
	attrOutSize   = 16 + attrSize
	openOutSize   = 16
	direntBase    = 24

	// maxArgs bounds the copied part of a request (everything but WRITE
	// data): names are at most 255 bytes and symlink targets 4096.
	maxArgs = 16 << 10
)

// setattr valid bits
const (
	fattrMode     = 1 << 0
	fattrUID      = 1 << 1
	fattrGID      = 1 << 2
	fattrSize     = 1 << 3
	fattrAtime    = 1 << 4
	fattrMtime    = 1 << 5
	fattrFH       = 1 << 6
	fattrAtimeNow = 1 << 7
	fattrMtimeNow = 1 << 8
	fattrCtime    = 1 << 10
)

var errShort = errors.New("virtiofs: request too short")

type inHeader struct {
	Len    uint32
	Opcode uint32
	Unique uint64
	NodeID uint64
	UID    uint32
	GID    uint32
	PID    uint32
}

func parseInHeader(b []byte) (inHeader, error) {
	if len(b) < inHeaderSize {
		return inHeader{}, errShort
	}
	le := binary.LittleEndian
	return inHeader{Len: le.Uint32(b[0:]), Opcode: le.Uint32(b[4:]), Unique: le.Uint64(b[8:]),
		NodeID: le.Uint64(b[16:]), UID: le.Uint32(b[24:]), GID: le.Uint32(b[28:]), PID: le.Uint32(b[32:])}, nil
}

// args reads fixed fields off a request body; a read past the end sets
// bad instead of panicking, and is checked once at the end.
type args struct {
	b   []byte
	bad bool
}

func (a *args) take(n int) []byte {
	if a.bad || len(a.b) < n {
		a.bad = true
		return make([]byte, n)
	}
	v := a.b[:n]
	a.b = a.b[n:]
	return v
}

func (a *args) u32() uint32 { return binary.LittleEndian.Uint32(a.take(4)) }
func (a *args) u64() uint64 { return binary.LittleEndian.Uint64(a.take(8)) }

// name reads a NUL-terminated string.
func (a *args) name() string {
	if a.bad {
		return ""
	}
	for i, c := range a.b {
		if c == 0 {
			s := string(a.b[:i])
			a.b = a.b[i+1:]
			return s
		}
	}
	a.bad = true
	return ""
}

// attr is fuse_attr.
type attr struct {
	Ino, Size, Blocks, Atime, Mtime, Ctime uint64
	AtimeNs, MtimeNs, CtimeNs              uint32
	Mode, Nlink, UID, GID, Rdev, Blksize   uint32
}

func (x *attr) put(b []byte) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], x.Ino)
	le.PutUint64(b[8:], x.Size)
	le.PutUint64(b[16:], x.Blocks)
	le.PutUint64(b[24:], x.Atime)
	le.PutUint64(b[32:], x.Mtime)
	le.PutUint64(b[40:], x.Ctime)
	le.PutUint32(b[48:], x.AtimeNs)
	le.PutUint32(b[52:], x.MtimeNs)
	le.PutUint32(b[56:], x.CtimeNs)
	le.PutUint32(b[60:], x.Mode)
	le.PutUint32(b[64:], x.Nlink)
	le.PutUint32(b[68:], x.UID)
	le.PutUint32(b[72:], x.GID)
	le.PutUint32(b[76:], x.Rdev)
	le.PutUint32(b[80:], x.Blksize)
	le.PutUint32(b[84:], 0)
}

// entryOut is fuse_entry_out with entry and attribute timeouts of 0:
// the guest kernel asks again on every lookup, so every path it uses is
// decided by the profile current at that moment.
func entryOut(nodeid uint64, a *attr) []byte {
	b := make([]byte, entryOutSize)
	binary.LittleEndian.PutUint64(b[0:], nodeid)
	a.put(b[40:])
	return b
}

func attrOut(a *attr) []byte {
	b := make([]byte, attrOutSize)
	a.put(b[16:])
	return b
}

func openOut(fh uint64) []byte {
	b := make([]byte, openOutSize)
	binary.LittleEndian.PutUint64(b[0:], fh)
	return b
}
