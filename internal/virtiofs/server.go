// Package virtiofs is the FUSE server of a sandbox's virtio-fs device: it
// takes FUSE requests from the device's virtqueues (internal/vhostuser)
// and serves each one through a file gateway (internal/fsgw), the same
// p9.File operations the 9P transport uses, so every operation is decided
// by the same profile checks (hidden names, read-only paths, openat2
// RESOLVE_BENEATH|NO_SYMLINKS, the hard-link and rename rules, owner
// mapping, refusal records). File data moves between the host file and
// guest memory with pread/pwrite straight on the buffers the queue names.
//
// Nodes are paths: a node is the (parent node, name) the guest looked up,
// never an inode, so that a second name of a file is decided as that name.
// Entry and attribute timeouts are 0, so the guest kernel looks every path
// up again and each lookup reaches the profile.
package virtiofs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/vhostuser"
)

// Queues is the vhost-user-fs device's queue count: the high-priority
// queue and one request queue.
const Queues = 2

// hiprioQueue carries FORGET and INTERRUPT only; nothing on it waits.
const hiprioQueue = 0

// maxWrite is the largest READ or WRITE the guest is told to send.
const maxWrite = 1 << 20

// Server serves one virtio-fs device. Its Handle is safe for concurrent
// use by the device's queues.
type Server struct {
	log *slog.Logger

	// mu: read-held by every operation, write-held by those that move
	// names (a rename changes the path of a node and its handles).
	mu      sync.RWMutex
	nodeMu  sync.Mutex // nodes, byName, handles, next
	nodes   map[uint64]*node
	byName  map[nodeKey]*node
	handles map[uint64]*handle
	next    uint64
	// roots, when not nil, are the mounts under a virtual root directory
	// (node 1), one subdirectory each, named by tag; rootGuest their
	// mount points in the guest (a saved state's tags must name the same
	// ones to be resolved again).
	roots     map[string]p9.File
	rootGuest map[string]string
	loaded    map[string]string // the mounts of a loaded state (LoadedMounts)
	inGuest   map[string]bool   // tags the guest has bound (MountedInGuest)

	// cache is how long the guest may keep names and attributes
	// (SetCacheTimeout); 0 by default.
	cache time.Duration

	curMu sync.Mutex
	cur   *vhostuser.Chain // the request queue's request in Handle (Hold)
}

// Hold holds the request the device's request queue is handling (see
// vhostuser.Chain.Hold), so that the queue goes on while it waits. The
// file gateway calls it (through the supervisor) on the goroutine that
// handles the request, just before it waits for the host user; called
// from elsewhere it costs at most a goroutine.
func (s *Server) Hold() {
	s.curMu.Lock()
	c := s.cur
	s.curMu.Unlock()
	if c != nil {
		c.Hold()
	}
}

// SetCacheTimeout lets the guest keep the names and attributes it was
// given for d (FUSE entry and attribute timeouts) instead of asking again
// for every path it resolves. 0, the default, sends every lookup to the
// profile. Opens, reads, writes and every change are decided whatever d
// is; what a longer d leaves to the guest is a name or attributes it was
// already shown, for at most d after the profile or the host folder
// changes. Call it before the device serves.
func (s *Server) SetCacheTimeout(d time.Duration) { s.cache = max(d, 0) }

// timed sets the entry (entry_out) or attribute (attr_out) timeouts of a
// reply to the cache timeout.
func (s *Server) timed(out []byte, entry bool) []byte {
	if s.cache == 0 {
		return out
	}
	sec, nsec := uint64(s.cache/time.Second), uint32(s.cache%time.Second)
	le := binary.LittleEndian
	if entry {
		le.PutUint64(out[16:], sec) // entry_valid
		le.PutUint64(out[24:], sec) // attr_valid
		le.PutUint32(out[32:], nsec)
		le.PutUint32(out[36:], nsec)
	} else {
		le.PutUint64(out[0:], sec)
		le.PutUint32(out[8:], nsec)
	}
	return out
}

type nodeKey struct {
	parent uint64
	name   string
}

type node struct {
	id      uint64
	key     nodeKey
	file    p9.File
	lookups uint64
	// stale, when not 0, is what every operation on the node answers: a
	// loaded state named it and this sandbox could not resolve it again
	// (see LoadState). Its file is nil.
	stale linux.Errno
}

type handle struct {
	file  p9.File
	node  *node
	dir   bool
	flags uint32 // the open flags, to open it again after a restore
	// stale, when not 0, is what the handle answers (see node.stale).
	stale linux.Errno
}

const rootID = 1

// New serves the tree under root (fsgw.Gateway.Attach).
func New(root p9.File, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{log: log, nodes: map[uint64]*node{}, byName: map[nodeKey]*node{}, handles: map[uint64]*handle{}, next: rootID + 1}
	s.nodes[rootID] = &node{id: rootID, file: root, lookups: 1}
	return s
}

// NewMounts serves several trees under one virtual, read-only root: the
// device's one mount in the guest holds a subdirectory per tag, which the
// guest binds where each mount belongs. The root itself lists the tags and
// nothing can be made in it.
func NewMounts(roots map[string]p9.File, log *slog.Logger) *Server {
	s := New(nil, log)
	s.roots = map[string]p9.File{}
	s.rootGuest = map[string]string{}
	s.inGuest = map[string]bool{}
	for t, r := range roots {
		s.roots[t] = r
	}
	return s
}

// AddMount adds a tree under the virtual root of a NewMounts server.
func (s *Server) AddMount(tag string, root p9.File) {
	s.AddMountAt(tag, "", root)
}

// AddMountAt adds a tree under the virtual root of a NewMounts server,
// mounted at guest in the guest. A loaded state resolves the nodes of a
// tag again only if it names the same mount point.
func (s *Server) AddMountAt(tag, guest string, root p9.File) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.roots[tag] = root
	s.rootGuest[tag] = guest
}

// RemoveMount takes tag's tree out from under the virtual root: it waits
// for the operations in flight, then forgets every node and closes every
// handle beneath it, so that what the guest still holds there (an open
// file, a working directory) fails from the next operation on: ENOENT for
// a node, EBADF for a handle. A later AddMount of the same tag starts a
// new tree; nothing of the old one reaches it. It reports whether tag was
// mounted.
func (s *Server) RemoveMount(tag string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.roots[tag]; !ok {
		return false
	}
	delete(s.roots, tag)
	delete(s.rootGuest, tag)
	delete(s.inGuest, tag)
	s.nodeMu.Lock()
	defer s.nodeMu.Unlock()
	// The tree is every node whose chain of parents reaches the root's
	// entry for tag; a rename may have given a node a parent with a
	// larger id, so grow the set until it stops changing.
	gone := map[uint64]bool{}
	for changed := true; changed; {
		changed = false
		for id, n := range s.nodes {
			if gone[id] {
				continue
			}
			if n.key == (nodeKey{rootID, tag}) || gone[n.key.parent] {
				gone[id], changed = true, true
			}
		}
	}
	for id := range gone {
		n := s.nodes[id]
		delete(s.nodes, id)
		if s.byName[n.key] == n {
			delete(s.byName, n.key)
		}
	}
	for fh, h := range s.handles {
		if h.node != nil && gone[h.node.id] {
			if h.file != nil {
				h.file.Close()
			}
			delete(s.handles, fh)
		}
	}
	return true
}

// Close releases every node and handle.
func (s *Server) Close() {
	s.nodeMu.Lock()
	defer s.nodeMu.Unlock()
	for _, h := range s.handles {
		if h.file != nil {
			h.file.Close()
		}
	}
	s.handles = map[uint64]*handle{}
}

// errMalformed is a FUSE message that breaks the protocol: it ends the
// device, like a malformed ring.
func errMalformed(format string, a ...any) error {
	return fmt.Errorf("%w: fuse: %s", vhostuser.ErrMalformed, fmt.Sprintf(format, a...))
}

// Handle implements vhostuser.Handler.
func (s *Server) Handle(q int, c *vhostuser.Chain) (uint32, error) {
	buf := gather(c.Readable, maxArgs+inHeaderSize+40)
	h, err := parseInHeader(buf)
	if err != nil {
		return 0, errMalformed("%d-byte request", len(buf))
	}
	if int(h.Len) != c.ReadableLen() {
		return 0, errMalformed("request says %d bytes, carries %d", h.Len, c.ReadableLen())
	}
	body := buf[inHeaderSize:]
	switch h.Opcode {
	case opForget, opBatchForget, opInterrupt:
		s.forgetOp(h, body)
		return 0, nil
	}
	if q != hiprioQueue {
		s.curMu.Lock()
		s.cur = c
		s.curMu.Unlock()
		defer func() {
			s.curMu.Lock()
			if s.cur == c {
				s.cur = nil
			}
			s.curMu.Unlock()
		}()
	}
	if c.WritableLen() < outHeaderSize {
		return 0, errMalformed("op %d: no room for a reply", h.Opcode)
	}
	r := reply{w: c.Writable}
	errno := s.dispatch(h, body, c, &r)
	if r.bad {
		return 0, errMalformed("op %d: malformed arguments", h.Opcode)
	}
	if errno != 0 {
		r.out = nil
		r.data = 0
	}
	n := outHeaderSize + len(r.out) + r.data
	if n > c.WritableLen() {
		// The guest's reply buffer is too small for the answer.
		errno, r.out, r.data, n = linux.ERANGE, nil, 0, outHeaderSize
	}
	hdr := make([]byte, outHeaderSize, outHeaderSize+len(r.out))
	binary.LittleEndian.PutUint32(hdr[0:], uint32(n))
	binary.LittleEndian.PutUint32(hdr[4:], uint32(-int32(errno)))
	binary.LittleEndian.PutUint64(hdr[8:], h.Unique)
	scatter(c.Writable, 0, append(hdr, r.out...))
	return uint32(n), nil
}

// reply is what an operation answers: out (copied after the header) and,
// for READ, data bytes already written into the guest's buffers after it.
type reply struct {
	w    [][]byte
	out  []byte
	data int
	bad  bool
}

// gather copies at most max bytes of bufs.
func gather(bufs [][]byte, max int) []byte {
	var out []byte
	for _, b := range bufs {
		if len(out)+len(b) > max {
			b = b[:max-len(out)]
		}
		out = append(out, b...)
		if len(out) == max {
			break
		}
	}
	return out
}

// skip returns bufs without its first n bytes (slices of the same memory).
func skip(bufs [][]byte, n int) [][]byte {
	var out [][]byte
	for _, b := range bufs {
		if n >= len(b) {
			n -= len(b)
			continue
		}
		out = append(out, b[n:])
		n = 0
	}
	return out
}

func scatter(bufs [][]byte, off int, p []byte) {
	for _, b := range skip(bufs, off) {
		if len(p) == 0 {
			return
		}
		p = p[copy(b, p):]
	}
}

func errnoOf(err error) linux.Errno {
	if err == nil {
		return 0
	}
	var e linux.Errno
	if errors.As(err, &e) {
		return e
	}
	var u unix.Errno
	if errors.As(err, &u) {
		return linux.Errno(u)
	}
	if e := linux.ExtractErrno(err); e != 0 {
		return e
	}
	return linux.EIO
}

func (s *Server) node(id uint64) *node {
	s.nodeMu.Lock()
	defer s.nodeMu.Unlock()
	return s.nodes[id]
}

// handle returns an open file's handle (never the virtual root's, never
// a stale one).
func (s *Server) handle(fh uint64) *handle {
	s.nodeMu.Lock()
	defer s.nodeMu.Unlock()
	if h := s.handles[fh]; h != nil && h.file != nil {
		return h
	}
	return nil
}

// fileHandle is handle for the operations on a handle's data: a stale
// handle answers its errno, an unknown one EBADF.
func (s *Server) fileHandle(fh uint64) (*handle, linux.Errno) {
	s.nodeMu.Lock()
	defer s.nodeMu.Unlock()
	h := s.handles[fh]
	switch {
	case h == nil:
		return nil, linux.EBADF
	case h.stale != 0:
		return nil, h.stale
	case h.file == nil:
		return nil, linux.EBADF
	}
	return h, 0
}

func (s *Server) addHandle(h *handle) uint64 {
	s.nodeMu.Lock()
	defer s.nodeMu.Unlock()
	id := s.next
	s.next++
	s.handles[id] = h
	return id
}

// attrOf converts a gateway's attributes.
func attrOf(q p9.QID, a p9.Attr) attr {
	return attr{Ino: q.Path, Size: a.Size, Blocks: a.Blocks, Atime: a.ATimeSeconds, Mtime: a.MTimeSeconds, Ctime: a.CTimeSeconds,
		AtimeNs: uint32(a.ATimeNanoSeconds), MtimeNs: uint32(a.MTimeNanoSeconds), CtimeNs: uint32(a.CTimeNanoSeconds),
		Mode: uint32(a.Mode), Nlink: uint32(a.NLink), UID: uint32(a.UID), GID: uint32(a.GID), Rdev: uint32(a.RDev), Blksize: uint32(a.BlockSize)}
}

// lookup walks from parent to name and returns its entry, counting one
// lookup of the node.
func (s *Server) lookup(parent *node, name string) ([]byte, linux.Errno) {
	// One decision and one lstat where the file has WalkGetAttr (the file
	// gateway's), Walk then GetAttr otherwise.
	qids, f, _, a, err := parent.file.WalkGetAttr([]string{name})
	var q p9.QID
	if err == linux.ENOSYS {
		if _, f, err = parent.file.Walk([]string{name}); err != nil {
			return nil, errnoOf(err)
		}
		if q, _, a, err = f.GetAttr(p9.AttrMaskAll); err != nil {
			return nil, errnoOf(err)
		}
	} else if err != nil {
		return nil, errnoOf(err)
	} else if len(qids) != 1 {
		f.Close()
		return nil, linux.EIO
	} else {
		q = qids[0]
	}
	key := nodeKey{parent.id, name}
	s.nodeMu.Lock()
	n := s.byName[key]
	if n == nil || n.stale != 0 {
		// A name a restore could not resolve, found again: a new node
		// (the stale one keeps answering ESTALE to whoever holds it).
		n = &node{id: s.next, key: key, file: f}
		s.next++
		s.nodes[n.id] = n
		s.byName[key] = n
	}
	n.lookups++
	s.nodeMu.Unlock()
	at := attrOf(q, a)
	return s.timed(entryOut(n.id, &at), true), 0
}

func (s *Server) forgetOp(h inHeader, body []byte) {
	a := args{b: body}
	switch h.Opcode {
	case opForget:
		s.forget(h.NodeID, a.u64())
	case opBatchForget:
		count := a.u32()
		a.u32()
		for i := uint32(0); i < count && !a.bad; i++ {
			id, n := a.u64(), a.u64()
			if !a.bad {
				s.forget(id, n)
			}
		}
	}
}

func (s *Server) forget(id, n uint64) {
	s.nodeMu.Lock()
	defer s.nodeMu.Unlock()
	nd := s.nodes[id]
	if nd == nil || id == rootID {
		return
	}
	if n >= nd.lookups {
		delete(s.nodes, id)
		if s.byName[nd.key] == nd {
			delete(s.byName, nd.key)
		}
		return
	}
	nd.lookups -= n
}

func (s *Server) dispatch(h inHeader, body []byte, c *vhostuser.Chain, r *reply) linux.Errno {
	a := &args{b: body}
	defer func() { r.bad = r.bad || a.bad }()
	if h.Opcode == opInit {
		return s.init(a, r)
	}
	if h.Opcode == opDestroy {
		return 0
	}
	if h.Opcode == opRename || h.Opcode == opRename2 {
		s.mu.Lock()
		defer s.mu.Unlock()
	} else {
		s.mu.RLock()
		defer s.mu.RUnlock()
	}
	n := s.node(h.NodeID)
	if n == nil {
		return linux.ENOENT
	}
	if n.stale != 0 {
		switch h.Opcode {
		case opRelease, opReleasedir:
			s.release(a)
			return 0
		case opFlush:
			return 0
		}
		return n.stale
	}
	if tooLong(h.Opcode, body) {
		return linux.ENAMETOOLONG
	}
	if n.file == nil {
		return s.virtualRoot(h, a, r)
	}
	switch h.Opcode {
	case opLookup:
		name := a.name()
		if a.bad {
			return 0
		}
		var e linux.Errno
		r.out, e = s.lookup(n, name)
		return e
	case opGetattr:
		a.u32()
		a.u32()
		fh := a.u64()
		f := n.file
		if hd := s.handle(fh); hd != nil && hd.node == n {
			f = hd.file
		}
		q, _, at, err := f.GetAttr(p9.AttrMaskAll)
		if err != nil {
			return errnoOf(err)
		}
		x := attrOf(q, at)
		r.out = s.timed(attrOut(&x), false)
		return 0
	case opSetattr:
		return s.setattr(n, a, r)
	case opReadlink:
		t, err := n.file.Readlink()
		if err != nil {
			return errnoOf(err)
		}
		r.out = []byte(t)
		return 0
	case opSymlink:
		name, target := a.name(), a.name()
		if a.bad {
			return 0
		}
		if _, err := n.file.Symlink(target, name, p9.UID(h.UID), p9.GID(h.GID)); err != nil {
			return errnoOf(err)
		}
		var e linux.Errno
		r.out, e = s.lookup(n, name)
		return e
	case opMknod:
		mode, rdev := a.u32(), a.u32()
		a.u32()
		a.u32()
		name := a.name()
		if a.bad {
			return 0
		}
		if _, err := n.file.Mknod(name, p9.FileMode(mode), rdev>>8, rdev&0xff, p9.UID(h.UID), p9.GID(h.GID)); err != nil {
			return errnoOf(err)
		}
		var e linux.Errno
		r.out, e = s.lookup(n, name)
		return e
	case opMkdir:
		mode, umask := a.u32(), a.u32()
		name := a.name()
		if a.bad {
			return 0
		}
		if _, err := n.file.Mkdir(name, p9.FileMode(mode&^umask), p9.UID(h.UID), p9.GID(h.GID)); err != nil {
			return errnoOf(err)
		}
		var e linux.Errno
		r.out, e = s.lookup(n, name)
		return e
	case opUnlink, opRmdir:
		name := a.name()
		if a.bad {
			return 0
		}
		var flags uint32
		if h.Opcode == opRmdir {
			flags = unix.AT_REMOVEDIR
		}
		return errnoOf(n.file.UnlinkAt(name, flags))
	case opRename, opRename2:
		newDir := a.u64()
		if h.Opcode == opRename2 {
			if flags := a.u32(); flags != 0 {
				return linux.EINVAL
			}
			a.u32()
		}
		oldName, newName := a.name(), a.name()
		if a.bad {
			return 0
		}
		return s.rename(n, oldName, newDir, newName)
	case opLink:
		old := a.u64()
		name := a.name()
		if a.bad {
			return 0
		}
		target := s.node(old)
		if target == nil {
			return linux.ENOENT
		}
		if target.stale != 0 {
			return target.stale
		}
		if target.file == nil {
			return linux.EPERM
		}
		if err := n.file.Link(target.file, name); err != nil {
			return errnoOf(err)
		}
		var e linux.Errno
		r.out, e = s.lookup(n, name)
		return e
	case opOpen, opOpendir:
		flags := a.u32()
		a.u32()
		if a.bad {
			return 0
		}
		_, f, err := n.file.Walk(nil)
		if err != nil {
			return errnoOf(err)
		}
		flags &= unix.O_ACCMODE | unix.O_APPEND
		if _, _, err := f.Open(p9.OpenFlags(flags)); err != nil {
			f.Close()
			return errnoOf(err)
		}
		r.out = openOut(s.addHandle(&handle{file: f, node: n, dir: h.Opcode == opOpendir, flags: flags}))
		return 0
	case opCreate:
		flags, mode, umask := a.u32(), a.u32(), a.u32()
		a.u32()
		name := a.name()
		if a.bad {
			return 0
		}
		_, f, err := n.file.Walk(nil)
		if err != nil {
			return errnoOf(err)
		}
		of, _, _, err := f.Create(name, p9.OpenFlags(flags&(unix.O_ACCMODE|unix.O_APPEND|unix.O_TRUNC|unix.O_EXCL)), p9.FileMode(mode&^umask), p9.UID(h.UID), p9.GID(h.GID))
		if err != nil {
			f.Close()
			return errnoOf(err)
		}
		entry, e := s.lookup(n, name)
		if e != 0 {
			of.Close()
			return e
		}
		s.nodeMu.Lock()
		nd := s.nodes[binary.LittleEndian.Uint64(entry)]
		s.nodeMu.Unlock()
		r.out = append(entry, openOut(s.addHandle(&handle{file: of, node: nd, flags: flags & (unix.O_ACCMODE | unix.O_APPEND)}))...)
		return 0
	case opRead:
		fh, off, size := a.u64(), a.u64(), a.u32()
		if a.bad {
			return 0
		}
		hd, e := s.fileHandle(fh)
		if e != 0 {
			return e
		}
		if hd.dir {
			return linux.EBADF
		}
		size = min(size, maxWrite)
		bufs := limit(skip(c.Writable, outHeaderSize), int(size))
		if len(bufs) == 0 {
			return 0
		}
		k, err := readVec(hd.file, bufs, int64(off))
		if err != nil {
			return errnoOf(err)
		}
		r.data = k
		return 0
	case opWrite:
		fh, off, size := a.u64(), a.u64(), a.u32()
		if a.bad {
			return 0
		}
		hd, e := s.fileHandle(fh)
		if e != 0 {
			return e
		}
		if hd.dir {
			return linux.EBADF
		}
		// The data follows the 40-byte write_in in the guest's buffers.
		bufs := limit(skip(c.Readable, inHeaderSize+40), int(size))
		written := uint32(0)
		if len(bufs) > 0 {
			k, err := writeVec(hd.file, bufs, int64(off))
			if err != nil {
				return errnoOf(err)
			}
			written = uint32(k)
		}
		r.out = binary.LittleEndian.AppendUint64(nil, uint64(written))
		return 0
	case opStatfs:
		st, err := n.file.StatFS()
		if err != nil {
			return errnoOf(err)
		}
		out := make([]byte, 80)
		le := binary.LittleEndian
		le.PutUint64(out[0:], st.Blocks)
		le.PutUint64(out[8:], st.BlocksFree)
		le.PutUint64(out[16:], st.BlocksAvailable)
		le.PutUint64(out[24:], st.Files)
		le.PutUint64(out[32:], st.FilesFree)
		le.PutUint32(out[40:], st.BlockSize)
		le.PutUint32(out[44:], st.NameLength)
		le.PutUint32(out[48:], st.BlockSize)
		r.out = out
		return 0
	case opRelease, opReleasedir:
		s.release(a)
		return 0
	case opFsync, opFsyncdir:
		fh := a.u64()
		if a.bad {
			return 0
		}
		hd, e := s.fileHandle(fh)
		if e != 0 {
			return e
		}
		return errnoOf(hd.file.FSync())
	case opFlush:
		return 0
	case opReaddir:
		fh, off, size := a.u64(), a.u64(), a.u32()
		if a.bad {
			return 0
		}
		hd, e := s.fileHandle(fh)
		if e != 0 {
			return e
		}
		if !hd.dir {
			return linux.EBADF
		}
		return s.readdir(hd, off, min(size, maxWrite), r)
	case opGetxattr:
		size := a.u32()
		a.u32()
		name := a.name()
		if a.bad {
			return 0
		}
		v, err := n.file.GetXattr(name)
		if err != nil {
			return errnoOf(err)
		}
		if v == nil {
			// The gateway answers an absent (or hidden) attribute with
			// no value; a FUSE client needs ENODATA (an empty value
			// would read as a malformed security.capability on exec).
			return linux.ENODATA
		}
		return sizedReply(r, v, size)
	case opListxattr:
		size := a.u32()
		a.u32()
		if a.bad {
			return 0
		}
		names, err := n.file.ListXattrs()
		if err != nil {
			return errnoOf(err)
		}
		var v []byte
		for _, x := range names {
			v = append(append(v, x...), 0)
		}
		return sizedReply(r, v, size)
	case opSetxattr:
		size, flags := a.u32(), a.u32()
		name := a.name()
		v := a.take(int(size))
		if a.bad {
			return 0
		}
		return errnoOf(n.file.SetXattr(name, v, p9.XattrFlags(flags)))
	case opRemovexattr:
		name := a.name()
		if a.bad {
			return 0
		}
		return errnoOf(n.file.RemoveXattr(name))
	case opAccess:
		// The guest kernel checks modes against the attributes; the
		// gateway decides every operation itself.
		return linux.ENOSYS
	}
	return linux.ENOSYS
}

// release forgets a handle (RELEASE, RELEASEDIR: the fh comes first).
func (s *Server) release(a *args) {
	fh := a.u64()
	if a.bad {
		return
	}
	s.nodeMu.Lock()
	hd := s.handles[fh]
	delete(s.handles, fh)
	s.nodeMu.Unlock()
	if hd != nil && hd.file != nil {
		hd.file.Close()
	}
}

func sizedReply(r *reply, v []byte, size uint32) linux.Errno {
	if size == 0 {
		r.out = binary.LittleEndian.AppendUint64(nil, uint64(len(v)))
		return 0
	}
	if uint32(len(v)) > size {
		return linux.ERANGE
	}
	r.out = v
	return 0
}

func (s *Server) init(a *args, r *reply) linux.Errno {
	major, minor := a.u32(), a.u32()
	readahead := a.u32()
	a.u32() // flags
	if a.bad {
		return 0
	}
	if major != 7 {
		return linux.EPROTO
	}
	out := make([]byte, 64)
	le := binary.LittleEndian
	le.PutUint32(out[0:], 7)
	le.PutUint32(out[4:], min(minor, 31))
	// The guest's own readahead: without it every page of a sequential
	// read is a request of its own.
	le.PutUint32(out[8:], readahead)
	le.PutUint32(out[12:], initAsyncRead|initBigWrites|initMaxPages)
	le.PutUint16(out[16:], 16)       // max_background
	le.PutUint16(out[18:], 12)       // congestion_threshold
	le.PutUint32(out[20:], maxWrite) // max_write
	le.PutUint32(out[24:], 1)        // time_gran
	// max_pages: a request of 1 MiB is 256 page descriptors, within the
	// queue size the device is created with (vm.VirtioFS: 1024).
	le.PutUint16(out[28:], maxWrite/4096)
	if minor < 23 {
		out = out[:24]
	}
	r.out = out
	return 0
}

// INIT flags
const (
	initAsyncRead = 1 << 0
	initBigWrites = 1 << 5
	initMaxPages  = 1 << 22
)

func (s *Server) setattr(n *node, a *args, r *reply) linux.Errno {
	valid := a.u32()
	a.u32()
	fh, size := a.u64(), a.u64()
	a.u64() // lock_owner
	atime, mtime := a.u64(), a.u64()
	a.u64() // ctime
	atimens, mtimens := a.u32(), a.u32()
	a.u32()
	mode := a.u32()
	a.u32()
	uid, gid := a.u32(), a.u32()
	if a.bad {
		return 0
	}
	f := n.file
	if valid&fattrFH != 0 {
		if hd := s.handle(fh); hd != nil && hd.node == n {
			f = hd.file
		}
	}
	m := p9.SetAttrMask{Permissions: valid&fattrMode != 0, UID: valid&fattrUID != 0, GID: valid&fattrGID != 0, Size: valid&fattrSize != 0,
		ATime: valid&(fattrAtime|fattrAtimeNow) != 0, MTime: valid&(fattrMtime|fattrMtimeNow) != 0,
		ATimeNotSystemTime: valid&fattrAtime != 0 && valid&fattrAtimeNow == 0, MTimeNotSystemTime: valid&fattrMtime != 0 && valid&fattrMtimeNow == 0}
	v := p9.SetAttr{Permissions: p9.FileMode(mode), UID: p9.UID(uid), GID: p9.GID(gid), Size: size,
		ATimeSeconds: atime, ATimeNanoSeconds: uint64(atimens), MTimeSeconds: mtime, MTimeNanoSeconds: uint64(mtimens)}
	if err := f.SetAttr(m, v); err != nil {
		return errnoOf(err)
	}
	q, _, at, err := f.GetAttr(p9.AttrMaskAll)
	if err != nil {
		return errnoOf(err)
	}
	x := attrOf(q, at)
	r.out = s.timed(attrOut(&x), false)
	return 0
}

// rename moves a name and then the nodes and handles that named it (under
// the server's write lock: no operation sees a half-moved path).
func (s *Server) rename(dir *node, oldName string, newDirID uint64, newName string) linux.Errno {
	nd := s.node(newDirID)
	if nd == nil {
		return linux.ENOENT
	}
	if nd.stale != 0 {
		return nd.stale
	}
	if nd.file == nil {
		return linux.EXDEV
	}
	if err := dir.file.RenameAt(oldName, nd.file, newName); err != nil {
		return errnoOf(err)
	}
	s.nodeMu.Lock()
	defer s.nodeMu.Unlock()
	if over := s.byName[nodeKey{nd.id, newName}]; over != nil {
		delete(s.byName, over.key)
		over.key = nodeKey{} // replaced: it names nothing now
	}
	moved := s.byName[nodeKey{dir.id, oldName}]
	if moved == nil {
		return 0
	}
	delete(s.byName, moved.key)
	moved.key = nodeKey{nd.id, newName}
	if moved.stale != 0 {
		return 0 // names nothing here: the new name is looked up afresh
	}
	s.byName[moved.key] = moved
	moved.file.Renamed(nd.file, newName)
	for _, h := range s.handles {
		if h.node == moved && h.file != nil {
			h.file.Renamed(nd.file, newName)
		}
	}
	return 0
}

func (s *Server) readdir(hd *handle, off uint64, size uint32, r *reply) linux.Errno {
	ents, err := hd.file.Readdir(off, size)
	if err != nil {
		return errnoOf(err)
	}
	var out []byte
	for _, e := range ents {
		rec := (direntBase + len(e.Name) + 7) &^ 7
		if len(out)+rec > int(size) {
			break
		}
		b := make([]byte, rec)
		le := binary.LittleEndian
		le.PutUint64(b[0:], e.QID.Path)
		le.PutUint64(b[8:], e.Offset)
		le.PutUint32(b[16:], uint32(len(e.Name)))
		le.PutUint32(b[20:], uint32(e.Type))
		copy(b[direntBase:], e.Name)
		out = append(out, b...)
	}
	r.out = out
	return 0
}

// virtualRoot serves the root of NewMounts.
func (s *Server) virtualRoot(h inHeader, a *args, r *reply) linux.Errno {
	switch h.Opcode {
	case opLookup:
		name := a.name()
		if a.bad {
			return 0
		}
		f, ok := s.roots[name]
		if !ok {
			return linux.ENOENT
		}
		q, _, at, err := f.GetAttr(p9.AttrMaskAll)
		if err != nil {
			return errnoOf(err)
		}
		key := nodeKey{rootID, name}
		s.nodeMu.Lock()
		n := s.byName[key]
		if n == nil || n.stale != 0 {
			n = &node{id: s.next, key: key, file: f}
			s.next++
			s.nodes[n.id] = n
			s.byName[key] = n
		}
		n.lookups++
		s.nodeMu.Unlock()
		x := attrOf(q, at)
		r.out = entryOut(n.id, &x)
		return 0
	case opGetattr:
		x := attr{Ino: rootID, Mode: unix.S_IFDIR | 0o555, Nlink: 2, Blksize: 4096}
		r.out = attrOut(&x)
		return 0
	case opOpendir:
		r.out = openOut(s.addHandle(&handle{dir: true}))
		return 0
	case opReaddir:
		fh, off, size := a.u64(), a.u64(), a.u32()
		if a.bad {
			return 0
		}
		s.nodeMu.Lock()
		hd := s.handles[fh]
		s.nodeMu.Unlock()
		if hd == nil || hd.file != nil {
			return linux.EBADF
		}
		names := []string{".", ".."}
		for t := range s.roots {
			names = append(names, t)
		}
		slices.Sort(names[2:])
		var out []byte
		for i := off; i < uint64(len(names)); i++ {
			name := names[i]
			rec := (direntBase + len(name) + 7) &^ 7
			if len(out)+rec > int(size) {
				break
			}
			b := make([]byte, rec)
			binary.LittleEndian.PutUint64(b[0:], i+100)
			binary.LittleEndian.PutUint64(b[8:], i+1)
			binary.LittleEndian.PutUint32(b[16:], uint32(len(name)))
			binary.LittleEndian.PutUint32(b[20:], unix.DT_DIR)
			copy(b[direntBase:], name)
			out = append(out, b...)
		}
		r.out = out
		return 0
	case opReleasedir, opRelease:
		fh := a.u64()
		s.nodeMu.Lock()
		delete(s.handles, fh)
		s.nodeMu.Unlock()
		return 0
	case opStatfs:
		r.out = make([]byte, 80)
		return 0
	case opFlush, opFsyncdir:
		return 0
	case opGetxattr, opListxattr:
		return linux.ENODATA
	}
	return linux.EROFS
}

// nameMax is the longest name a host file system takes (NAME_MAX). The
// guest's FUSE client allows up to 1024 bytes; a longer name is answered
// as the host would answer it, not as a malformed request.
const nameMax = 255

// tooLong reports whether an operation that makes or finds a name carries
// one longer than nameMax.
func tooLong(op uint32, body []byte) bool {
	a := args{b: body}
	var names []string
	switch op {
	case opLookup, opUnlink, opRmdir:
		names = append(names, a.name())
	case opSymlink:
		names = append(names, a.name())
	case opMkdir:
		a.take(8)
		names = append(names, a.name())
	case opMknod, opCreate:
		a.take(16)
		names = append(names, a.name())
	case opLink:
		a.take(8)
		names = append(names, a.name())
	case opRename:
		a.take(8)
		names = append(names, a.name(), a.name())
	case opRename2:
		a.take(16)
		names = append(names, a.name(), a.name())
	}
	for _, n := range names {
		if len(n) > nameMax {
			return true
		}
	}
	return false
}

// limit trims bufs to n bytes in all.
func limit(bufs [][]byte, n int) [][]byte {
	var out [][]byte
	for _, b := range bufs {
		if n == 0 {
			break
		}
		b = b[:min(len(b), n)]
		out = append(out, b)
		n -= len(b)
	}
	return out
}

// vecFile is a file that reads and writes several buffers with one
// decision and one system call (the file gateway's files).
type vecFile interface {
	ReadVecAt(bufs [][]byte, off int64) (int, error)
	WriteVecAt(bufs [][]byte, off int64) (int, error)
}

func readVec(f p9.File, bufs [][]byte, off int64) (int, error) {
	if v, ok := f.(vecFile); ok {
		return v.ReadVecAt(bufs, off)
	}
	return eachAt(f.ReadAt, bufs, off)
}

func writeVec(f p9.File, bufs [][]byte, off int64) (int, error) {
	if v, ok := f.(vecFile); ok {
		return v.WriteVecAt(bufs, off)
	}
	return eachAt(f.WriteAt, bufs, off)
}

// eachAt moves bufs one after another at off with at (a file without
// vectored I/O), stopping at the first short or failed one; what moved
// before a failure is the answer.
func eachAt(at func([]byte, int64) (int, error), bufs [][]byte, off int64) (int, error) {
	n := 0
	for _, b := range bufs {
		k, err := at(b, off+int64(n))
		n += k
		if err != nil || k < len(b) {
			if n > 0 {
				return n, nil
			}
			return 0, err
		}
	}
	return n, nil
}
