package virtiofs

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"
)

// The server's state as it travels in a snapshot, a suspend or a fork
// (vhostuser.DeviceState): the guest kernel keeps node IDs and file
// handles across it and goes on using them, so the server saves what each
// one names — a node as (parent node, name), a handle as (node, open
// flags) — never a host descriptor, inode or path string from the host.
// Loading resolves every name again through the file gateway of the
// sandbox that loads it, under its profile: a fork with a narrower
// profile gets stale nodes and handles for what it may not see (ESTALE,
// or EACCES for a handle its profile refuses), never the parent's access.
//
// The bytes come back from a file on disk that the guest's own data may
// have shaped (names it created): the decoder bounds every count and
// length, checks every reference, and rejects anything else.
//
// Format, little-endian:
//
//	magic "smx-vfs\x00", u32 version (1)
//	u64 next (the next ID to hand out)
//	u32 mounts, each: u16 len, tag, u16 len, guest path, u8 in guest (0, 1)
//	u32 nodes, parents before children, each:
//	    u64 id, u64 parent (0: names nothing now), u64 lookups, u16 len, name
//	u32 handles, each: u64 fh, u64 node, u32 open flags, u8 kind

const (
	stateMagic   = "smx-vfs\x00"
	stateVersion = StateVersion

	// Bounds well above what a guest can hold: the kernel keeps a node
	// per cached inode and a handle per open file.
	maxStateNodes   = 1 << 20
	maxStateHandles = 1 << 20
	maxStateMounts  = 64
	maxGuestPath    = 4096
	// maxStateBytes bounds the whole state: every node and handle at
	// its largest.
	maxStateBytes = 16 + 8 + 4 + maxStateMounts*(4+255+maxGuestPath) + 4 + maxStateNodes*(26+nameMax) + 4 + maxStateHandles*21

	handleFile = 0
	handleDir  = 1
	handleRoot = 2 // a directory handle on the virtual root

	openFlagsSaved = unix.O_ACCMODE | unix.O_APPEND
)

// StateVersion is the version of the device state this server writes and
// reads: a saved machine (a boot template's name) depends on it.
const StateVersion = 1

// errState marks a device state that is not one this server wrote.
var errState = errors.New("virtiofs: bad device state")

func badState(format string, a ...any) error {
	return fmt.Errorf("%w: %s", errState, fmt.Sprintf(format, a...))
}

// State is a decoded device state.
type State struct {
	Next    uint64
	Mounts  []StateMount
	Nodes   []StateNode
	Handles []StateHandle
}

type StateMount struct {
	Tag, Guest string
	// InGuest: the guest had bound the tag's directory at Guest.
	InGuest bool
}

type StateNode struct {
	ID, Parent, Lookups uint64
	Name                string
}

type StateHandle struct {
	FH, Node uint64
	Flags    uint32
	Kind     uint8
}

// Encode writes st in the format above.
func (st *State) Encode(w io.Writer) error {
	bw := bufio.NewWriter(w)
	le := binary.LittleEndian
	var b []byte
	b = append(b, stateMagic...)
	b = le.AppendUint32(b, stateVersion)
	b = le.AppendUint64(b, st.Next)
	b = le.AppendUint32(b, uint32(len(st.Mounts)))
	for _, m := range st.Mounts {
		b = appendString(b, m.Tag)
		b = appendString(b, m.Guest)
		b = append(b, boolByte(m.InGuest))
	}
	b = le.AppendUint32(b, uint32(len(st.Nodes)))
	for _, n := range st.Nodes {
		b = le.AppendUint64(b, n.ID)
		b = le.AppendUint64(b, n.Parent)
		b = le.AppendUint64(b, n.Lookups)
		b = appendString(b, n.Name)
		if len(b) > 1<<16 {
			if _, err := bw.Write(b); err != nil {
				return err
			}
			b = b[:0]
		}
	}
	b = le.AppendUint32(b, uint32(len(st.Handles)))
	for _, h := range st.Handles {
		b = le.AppendUint64(b, h.FH)
		b = le.AppendUint64(b, h.Node)
		b = le.AppendUint32(b, h.Flags)
		b = append(b, h.Kind)
	}
	if _, err := bw.Write(b); err != nil {
		return err
	}
	return bw.Flush()
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

func appendString(b []byte, s string) []byte {
	return append(binary.LittleEndian.AppendUint16(b, uint16(len(s))), s...)
}

// stateReader reads fields, remembering the first error.
type stateReader struct {
	r   *bufio.Reader
	err error
	buf [8]byte
}

func (d *stateReader) read(n int) []byte {
	if d.err != nil {
		return d.buf[:n]
	}
	if _, err := io.ReadFull(d.r, d.buf[:n]); err != nil {
		d.err = badState("truncated")
	}
	return d.buf[:n]
}

func (d *stateReader) u8() uint8   { return d.read(1)[0] }
func (d *stateReader) u16() uint16 { return binary.LittleEndian.Uint16(d.read(2)) }
func (d *stateReader) u32() uint32 { return binary.LittleEndian.Uint32(d.read(4)) }
func (d *stateReader) u64() uint64 { return binary.LittleEndian.Uint64(d.read(8)) }

func (d *stateReader) str(max int) string {
	n := int(d.u16())
	if d.err != nil {
		return ""
	}
	if n > max {
		d.err = badState("string of %d bytes (at most %d)", n, max)
		return ""
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(d.r, b); err != nil {
		d.err = badState("truncated")
		return ""
	}
	return string(b)
}

// DecodeState reads and validates a state: every count bounded, every ID
// in range and unique, every parent and node reference to something
// before it, every name a single path component, nothing after the end.
func DecodeState(r io.Reader) (*State, error) {
	lr := &io.LimitedReader{R: r, N: maxStateBytes + 1}
	d := &stateReader{r: bufio.NewReader(lr)}
	magic := make([]byte, len(stateMagic))
	if _, err := io.ReadFull(d.r, magic); err != nil || string(magic) != stateMagic {
		return nil, badState("not a virtio-fs device state")
	}
	if v := d.u32(); d.err == nil && v != stateVersion {
		return nil, badState("version %d (this smx reads %d)", v, stateVersion)
	}
	st := &State{Next: d.u64()}
	if d.err == nil && (st.Next <= rootID || st.Next > 1<<62) {
		return nil, badState("next ID %d", st.Next)
	}
	nm := d.u32()
	if d.err == nil && nm > maxStateMounts {
		return nil, badState("%d mounts", nm)
	}
	tags := map[string]bool{}
	for i := uint32(0); i < nm && d.err == nil; i++ {
		m := StateMount{Tag: d.str(nameMax), Guest: d.str(maxGuestPath)}
		in := d.u8()
		if d.err != nil {
			break
		}
		if in > 1 {
			return nil, badState("mount %q: in-guest flag %d", m.Tag, in)
		}
		m.InGuest = in == 1
		if !validName(m.Tag) || tags[m.Tag] {
			return nil, badState("mount tag %q", m.Tag)
		}
		tags[m.Tag] = true
		st.Mounts = append(st.Mounts, m)
	}
	nn := d.u32()
	if d.err == nil && nn > maxStateNodes {
		return nil, badState("%d nodes", nn)
	}
	seen := map[uint64]bool{rootID: true}
	names := map[nodeKey]bool{}
	for i := uint32(0); i < nn && d.err == nil; i++ {
		n := StateNode{ID: d.u64(), Parent: d.u64(), Lookups: d.u64(), Name: d.str(nameMax)}
		if d.err != nil {
			break
		}
		switch {
		case n.ID <= rootID || n.ID >= st.Next || seen[n.ID]:
			return nil, badState("node ID %d", n.ID)
		case n.Parent != 0 && !seen[n.Parent]:
			return nil, badState("node %d names parent %d, not saved before it", n.ID, n.Parent)
		case n.Parent != 0 && !validName(n.Name), n.Parent == 0 && n.Name != "":
			return nil, badState("node %d: name %q", n.ID, n.Name)
		case n.Lookups > 1<<40:
			return nil, badState("node %d: %d lookups", n.ID, n.Lookups)
		}
		if n.Parent != 0 {
			k := nodeKey{n.Parent, n.Name}
			if names[k] {
				return nil, badState("node %d: %q named twice in %d", n.ID, n.Name, n.Parent)
			}
			names[k] = true
		}
		seen[n.ID] = true
		st.Nodes = append(st.Nodes, n)
	}
	nh := d.u32()
	if d.err == nil && nh > maxStateHandles {
		return nil, badState("%d handles", nh)
	}
	fhs := map[uint64]bool{}
	for i := uint32(0); i < nh && d.err == nil; i++ {
		h := StateHandle{FH: d.u64(), Node: d.u64(), Flags: d.u32(), Kind: d.u8()}
		if d.err != nil {
			break
		}
		switch {
		case h.FH <= rootID || h.FH >= st.Next || fhs[h.FH]:
			return nil, badState("handle %d", h.FH)
		case !seen[h.Node]:
			return nil, badState("handle %d names node %d, not saved", h.FH, h.Node)
		case h.Flags&^openFlagsSaved != 0 || h.Flags&unix.O_ACCMODE == unix.O_ACCMODE:
			return nil, badState("handle %d: flags %#x", h.FH, h.Flags)
		case h.Kind > handleRoot, (h.Kind == handleRoot) != (h.Node == rootID):
			return nil, badState("handle %d: kind %d on node %d", h.FH, h.Kind, h.Node)
		}
		fhs[h.FH] = true
		st.Handles = append(st.Handles, h)
	}
	if d.err != nil {
		return nil, d.err
	}
	if _, err := d.r.ReadByte(); err != io.EOF {
		return nil, badState("data after the end")
	}
	return st, nil
}

// validName is one path component a guest can have looked up.
func validName(s string) bool {
	return s != "" && len(s) <= nameMax && s != "." && s != ".." && !strings.ContainsAny(s, "/\x00")
}

// SaveState implements vhostuser.DeviceState: it is called with the
// device's queues stopped, so no request changes the tables meanwhile.
func (s *Server) SaveState(w io.Writer) error {
	st := s.snapshot()
	return st.Encode(w)
}

// snapshot collects the tables, parents before children.
func (s *Server) snapshot() *State {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodeMu.Lock()
	defer s.nodeMu.Unlock()
	st := &State{Next: s.next}
	for _, t := range slices.Sorted(mapKeys(s.roots)) {
		st.Mounts = append(st.Mounts, StateMount{Tag: t, Guest: s.rootGuest[t], InGuest: s.inGuest[t]})
	}
	// Depth-first from the root over byName gives the order; a node no
	// name reaches (replaced by a rename, or below a forgotten parent)
	// is saved as naming nothing.
	children := map[uint64][]*node{}
	for k, n := range s.byName {
		if s.nodes[n.id] == n {
			children[k.parent] = append(children[k.parent], n)
		}
	}
	done := map[uint64]bool{rootID: true}
	var walk func(id uint64)
	walk = func(id uint64) {
		kids := children[id]
		slices.SortFunc(kids, func(a, b *node) int { return compareU64(a.id, b.id) })
		for _, n := range kids {
			if done[n.id] {
				continue
			}
			done[n.id] = true
			st.Nodes = append(st.Nodes, StateNode{ID: n.id, Parent: id, Lookups: n.lookups, Name: n.key.name})
			walk(n.id)
		}
	}
	walk(rootID)
	for _, id := range slices.Sorted(mapKeys(s.nodes)) {
		if !done[id] {
			done[id] = true
			st.Nodes = append(st.Nodes, StateNode{ID: id, Lookups: s.nodes[id].lookups})
		}
	}
	for _, fh := range slices.Sorted(mapKeys(s.handles)) {
		h := s.handles[fh]
		sh := StateHandle{FH: fh, Node: rootID, Kind: handleRoot, Flags: h.flags}
		if h.node != nil {
			sh.Node, sh.Kind = h.node.id, handleFile
			if h.dir {
				sh.Kind = handleDir
			}
		}
		if !done[sh.Node] {
			continue // its node was forgotten: the guest cannot use it
		}
		st.Handles = append(st.Handles, sh)
	}
	return st
}

func compareU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// LoadState implements vhostuser.DeviceState: it decodes a saved state
// and resolves every node and handle again through this server's mounts
// (their gateways and profile). It is called before the device's queues
// start, on a server that has served nothing.
func (s *Server) LoadState(r io.Reader) error {
	st, err := DecodeState(r)
	if err != nil {
		return err
	}
	return s.restore(st)
}

func (s *Server) restore(st *State) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodeMu.Lock()
	defer s.nodeMu.Unlock()
	if len(s.nodes) != 1 || len(s.handles) != 0 {
		return fmt.Errorf("virtiofs: load state: the device has served requests already")
	}
	guest := map[string]string{}
	s.loaded = map[string]string{}
	for _, m := range st.Mounts {
		guest[m.Tag] = m.Guest
		if m.InGuest && s.rootGuest[m.Tag] == m.Guest {
			s.loaded[m.Tag] = m.Guest
			s.inGuest[m.Tag] = true
		}
	}
	root := s.nodes[rootID]
	stale := 0
	for _, sn := range st.Nodes {
		n := &node{id: sn.ID, key: nodeKey{sn.Parent, sn.Name}, lookups: sn.Lookups}
		s.nodes[n.id] = n
		if sn.Parent == 0 {
			n.stale = linux.ESTALE
			stale++
			continue
		}
		s.byName[n.key] = n
		parent := s.nodes[sn.Parent]
		switch {
		case parent.stale != 0:
			n.stale = linux.ESTALE
		case parent == root && s.roots != nil:
			// A mount: the same tag must be the same mount point in
			// this sandbox, or the guest's open files would move to
			// another folder.
			f, ok := s.roots[sn.Name]
			if !ok || s.rootGuest[sn.Name] != guest[sn.Name] {
				n.stale = linux.ESTALE
				break
			}
			n.file = f
		default:
			_, f, err := parent.file.Walk([]string{sn.Name})
			if err != nil {
				n.stale = staleErrno(err)
				break
			}
			n.file = f
		}
		if n.stale != 0 {
			stale++
		}
	}
	staleHandles := 0
	for _, sh := range st.Handles {
		h := &handle{dir: sh.Kind != handleFile, flags: sh.Flags}
		s.handles[sh.FH] = h
		if sh.Kind == handleRoot {
			if s.roots == nil {
				h.stale = linux.ESTALE
			}
			continue
		}
		h.node = s.nodes[sh.Node]
		if h.node.stale != 0 {
			h.stale = h.node.stale
			staleHandles++
			continue
		}
		_, f, err := h.node.file.Walk(nil)
		if err == nil {
			if _, _, err = f.Open(p9.OpenFlags(sh.Flags)); err != nil {
				f.Close()
			}
		}
		if err != nil {
			h.stale = staleErrno(err)
			staleHandles++
			continue
		}
		h.file = f
	}
	s.next = st.Next
	s.log.Info("virtio-fs state loaded", "nodes", len(st.Nodes), "stale_nodes", stale, "handles", len(st.Handles), "stale_handles", staleHandles)
	return nil
}

// staleErrno is what a node or handle that could not be resolved again
// answers: EACCES when the profile refuses it, ESTALE otherwise (gone,
// hidden, moved).
func staleErrno(err error) linux.Errno {
	switch errnoOf(err) {
	case linux.EACCES, linux.EPERM, linux.EROFS:
		return linux.EACCES
	}
	return linux.ESTALE
}

// LoadedMounts is the tags and mount points the guest of the state this
// server loaded had bound, where this server has the same mount (nil if
// it loaded none): what a restored guest need not mount again.
func (s *Server) LoadedMounts() map[string]string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.loaded
}

// MountedInGuest records that the guest bound tag's directory at its
// mount point: a state saved from now on says so.
func (s *Server) MountedInGuest(tag string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inGuest[tag] = true
}
