package guest

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A relayed share keeps the guest kernel's 9P session alive across a
// snapshot restore. The kernel mounts one end of a socketpair (trans=fd);
// the agent carries whole 9P messages between the other end and a TCP
// connection to the host's file gateway, and remembers what each fid
// names (walks, opens, creates, renames, clunks). A restored guest still
// holds the socketpair and this state, but its TCP connection died with
// the supervisor that saved it: on the next mount request for the same
// share the agent connects again, rebuilds the session (version, attach,
// every fid walked again from the root and opened again with its flags)
// and re-sends the requests that had no answer yet. The kernel never
// notices, so files and working directories open across a restore, or in
// a fork, keep working. What cannot be rebuilt is reported by the gateway
// as it would be for any fid it does not know: a file unlinked while
// open, a lock held at save time.

// relays are the guest's relayed shares by tag.
var relays = struct {
	sync.Mutex
	m map[string]*relay
}{m: map[string]*relay{}}

// 9P2000.L message types the relay follows.
const (
	p9Rlerror    = 7
	p9Tlopen     = 12
	p9Tlcreate   = 14
	p9Trenameat  = 74
	p9Tversion   = 100
	p9Tattach    = 104
	p9Tflush     = 108
	p9Twalk      = 110
	p9Tclunk     = 120
	p9Tremove    = 122
	p9Txattrwalk = 30
	p9Txattrcr   = 32
	p9NoTag      = 0xFFFF
	p9MaxWalk    = 16
	p9Header     = 7
	p9MaxMsg     = 4 << 20
	relayTag     = 0 // tag of the requests that rebuild a session
	// dotl open flags that only make sense the first time
	p9Creat, p9Excl, p9Trunc = 0o100, 0o200, 0o1000
)

type relayFid struct {
	attach uint32   // the attach fid it was walked from
	path   []string // names from that fid's root
	open   bool
	flags  uint32
	raw    []byte // Tattach: the message, to attach again
}

type relayReq struct {
	msg []byte
	seq uint64 // order sent: a flush is re-sent after what it flushes
	// what the request would change, applied when it succeeds
	typ            byte
	fid, newfid    uint32
	names          []string
	flags          uint32
	oldTag         uint16
	newDir         uint32
	oldName, newNm string
}

type relay struct {
	tag, addr string
	port      int
	kernel    *blockConn // the agent's end of the socketpair
	log       *slog.Logger

	sendMu sync.Mutex // held while writing to up, and while reconnecting
	// up is changed only with both sendMu and mu held, so either lets
	// it be read.
	up      *blockConn
	upDone  chan struct{} // closed when up's reader has finished
	mu      sync.Mutex    // guards up (see above) and the fields below
	version []byte
	fids    map[uint32]*relayFid
	pending map[uint16]*relayReq
	seq     uint64
	dead    bool // the kernel's end closed: the mount is gone
}

// newRelay connects share tag to the gateway and returns the relay with
// the kernel's end of its socketpair, to be mounted with trans=fd.
func newRelay(tag, addr string, port int, log *slog.Logger) (*relay, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("guest: relay: socketpair: %w", err)
	}
	for _, fd := range fds {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	// Non-blocking, so reads wait in Go's network poller: a read blocked
	// in a system call holds the only P of a one-CPU guest, and the
	// goroutine that the gateway's answer wakes then waits for sysmon to
	// take the P back (up to 10 ms per 9P round trip, measured).
	relayProcs.Do(func() {
		if runtime.GOMAXPROCS(0) < 4 {
			runtime.GOMAXPROCS(4)
		}
	})
	r := &relay{
		tag: tag, addr: addr, port: port, log: log,
		kernel:  &blockConn{fd: fds[0]},
		fids:    map[uint32]*relayFid{},
		pending: map[uint16]*relayReq{},
	}
	kernel := os.NewFile(uintptr(fds[1]), "share-kernel-"+tag)
	c, err := dialGateway(addr, port)
	if err != nil {
		r.kernel.release()
		kernel.Close()
		return nil, nil, err
	}
	r.up, r.upDone = c, make(chan struct{})
	go r.fromHost(c, r.upDone)
	go r.fromKernel()
	return r, kernel, nil
}

// dialGateway connects from a privileged port, which the gateway requires
// (only root in the guest may speak 9P to it).
func dialGateway(addr string, port int) (*blockConn, error) {
	raddr := net.JoinHostPort(addr, strconv.Itoa(port))
	var last error
	for p := 1023; p >= 600; p-- {
		d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{Port: p}}
		c, err := d.Dial("tcp4", raddr)
		if err == nil {
			c.(*net.TCPConn).SetNoDelay(true)
			f, err := c.(*net.TCPConn).File()
			c.Close()
			if err != nil {
				return nil, err
			}
			fd, err := unix.Dup(int(f.Fd()))
			f.Close()
			if err != nil {
				return nil, err
			}
			unix.SetNonblock(fd, false)
			return &blockConn{fd: fd}, nil
		}
		last = err
		if !errors.Is(err, syscall.EADDRINUSE) && !errors.Is(err, syscall.EADDRNOTAVAIL) {
			break
		}
	}
	return nil, fmt.Errorf("guest: relay: connect %s: %w", raddr, last)
}

// bigMsgs recycles the buffers of large messages (writes are up to msize,
// 1 MiB): allocating one per request costs the guest a 1 MiB clear.
var bigMsgs sync.Pool

const bigMsg = 64 << 10

func getMsg(size int) []byte {
	if size >= bigMsg {
		if b, ok := bigMsgs.Get().(*[]byte); ok && cap(*b) >= size {
			return (*b)[:size]
		}
	}
	return make([]byte, size)
}

func putMsg(b []byte) {
	if cap(b) >= bigMsg {
		bigMsgs.Put(&b)
	}
}

// readMsg reads one whole 9P message into buf, or a new buffer when buf
// is nil or too small.
func readMsg(r io.Reader, buf []byte) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	size := binary.LittleEndian.Uint32(hdr[:])
	if size < p9Header || size > p9MaxMsg {
		return nil, fmt.Errorf("guest: relay: bad 9P message size %d", size)
	}
	if cap(buf) < int(size) {
		buf = getMsg(int(size))
	}
	buf = buf[:size]
	copy(buf, hdr[:])
	if _, err := io.ReadFull(r, buf[4:]); err != nil {
		return nil, err
	}
	return buf, nil
}

// fromKernel carries requests to the host, noting what each would change.
func (r *relay) fromKernel() {
	br := bufio.NewReaderSize(r.kernel, 256<<10)
	for {
		msg, err := readMsg(br, nil)
		if err != nil {
			// Unmounted (or the kernel gave up on the session).
			r.mu.Lock()
			r.dead = true
			if r.up != nil {
				r.up.Close()
			}
			r.mu.Unlock()
			r.kernel.Close()
			r.kernel.release()
			return
		}
		req := parseRequest(msg)
		tag := binary.LittleEndian.Uint16(msg[5:])
		r.sendMu.Lock()
		r.mu.Lock()
		if req.typ == p9Tversion {
			r.version = msg
		}
		r.seq++
		req.seq = r.seq
		r.pending[tag] = req
		r.mu.Unlock()
		if up := r.up; up != nil {
			if _, err := up.Write(msg); err != nil {
				// Kept in pending: sent again when the share is
				// reconnected.
				up.Close()
				r.mu.Lock()
				r.up = nil
				r.mu.Unlock()
			}
		}
		r.sendMu.Unlock()
	}
}

// fromHost carries answers to the kernel, applying what succeeded.
func (r *relay) fromHost(c *blockConn, done chan struct{}) {
	defer close(done)
	defer c.release()
	var buf []byte
	br := bufio.NewReaderSize(c, 256<<10)
	for {
		msg, err := readMsg(br, buf)
		if err != nil {
			r.log.Debug("share relay: gateway connection ended", "tag", r.tag, "err", err)
			return
		}
		buf = msg
		r.answered(msg)
		if _, err := r.kernel.Write(msg); err != nil {
			return
		}
	}
}

// answered updates the fid table for the request msg answers.
func (r *relay) answered(msg []byte) {
	tag := binary.LittleEndian.Uint16(msg[5:])
	ok := msg[4] != p9Rlerror
	r.mu.Lock()
	defer r.mu.Unlock()
	req := r.pending[tag]
	if req == nil {
		return
	}
	delete(r.pending, tag)
	if req.typ != p9Tattach && req.typ != p9Tversion {
		putMsg(req.msg) // kept only until answered
	}
	switch req.typ {
	case p9Tversion:
		r.fids = map[uint32]*relayFid{}
	case p9Tattach:
		if ok {
			r.fids[req.fid] = &relayFid{attach: req.fid, raw: req.msg}
		}
	case p9Twalk:
		if !ok || len(msg) < p9Header+2 || int(binary.LittleEndian.Uint16(msg[p9Header:])) != len(req.names) {
			return
		}
		from := r.fids[req.fid]
		if from == nil {
			delete(r.fids, req.newfid)
			return
		}
		path := append(append([]string(nil), from.path...), req.names...)
		r.fids[req.newfid] = &relayFid{attach: from.attach, path: path}
	case p9Tlopen:
		if f := r.fids[req.fid]; ok && f != nil {
			f.open, f.flags = true, req.flags
		}
	case p9Tlcreate:
		if f := r.fids[req.fid]; ok && f != nil {
			f.path = append(append([]string(nil), f.path...), req.names[0])
			f.open, f.flags = true, req.flags&^(p9Creat|p9Excl|p9Trunc)
		}
	case p9Tclunk, p9Tremove, p9Txattrcr:
		delete(r.fids, req.fid) // gone whatever the answer
	case p9Tflush:
		delete(r.pending, req.oldTag)
	case p9Trenameat:
		od, nd := r.fids[req.fid], r.fids[req.newDir]
		if !ok || od == nil || nd == nil || od.attach != nd.attach {
			return
		}
		from := append(append([]string(nil), od.path...), req.oldName)
		to := append(append([]string(nil), nd.path...), req.newNm)
		for _, f := range r.fids {
			if f.attach == od.attach && hasPrefix(f.path, from) {
				f.path = append(append([]string(nil), to...), f.path[len(from):]...)
			}
		}
	}
}

func hasPrefix(p, prefix []string) bool {
	if len(p) < len(prefix) {
		return false
	}
	for i := range prefix {
		if p[i] != prefix[i] {
			return false
		}
	}
	return true
}

// parseRequest reads what the relay needs from a request. A message it
// cannot parse is passed on as it is (the gateway answers it).
func parseRequest(msg []byte) *relayReq {
	req := &relayReq{msg: msg, typ: msg[4]}
	b := msg[p9Header:]
	u32 := func() uint32 {
		if len(b) < 4 {
			b = nil
			return 0
		}
		v := binary.LittleEndian.Uint32(b)
		b = b[4:]
		return v
	}
	str := func() string {
		if len(b) < 2 {
			b = nil
			return ""
		}
		n := int(binary.LittleEndian.Uint16(b))
		if len(b) < 2+n {
			b = nil
			return ""
		}
		s := string(b[2 : 2+n])
		b = b[2+n:]
		return s
	}
	switch req.typ {
	case p9Tattach, p9Tclunk, p9Tremove, p9Txattrcr, p9Tlopen:
		req.fid = u32()
		if req.typ == p9Tlopen {
			req.flags = u32()
		}
	case p9Twalk:
		req.fid, req.newfid = u32(), u32()
		if len(b) >= 2 {
			n := int(binary.LittleEndian.Uint16(b))
			b = b[2:]
			for i := 0; i < n && b != nil; i++ {
				req.names = append(req.names, str())
			}
		}
	case p9Tlcreate:
		req.fid = u32()
		req.names = []string{str()}
		req.flags = u32()
	case p9Trenameat:
		req.fid = u32()
		req.oldName = str()
		req.newDir = u32()
		req.newNm = str()
	case p9Tflush:
		if len(b) >= 2 {
			req.oldTag = binary.LittleEndian.Uint16(b)
		}
	}
	if b == nil {
		req.typ = 0 // malformed: followed as nothing
	}
	return req
}

// reconnect rebuilds the session on a new gateway connection and re-sends
// the requests that had no answer. Fids that cannot be rebuilt are left to
// fail on the gateway (it does not know them).
func (r *relay) reconnect() error {
	// Close the dead connection first, without sendMu: a write to it
	// may hold sendMu until it fails.
	r.mu.Lock()
	if r.up != nil {
		r.up.Close()
	}
	r.mu.Unlock()
	r.sendMu.Lock()
	defer r.sendMu.Unlock()
	r.mu.Lock()
	r.up = nil
	r.mu.Unlock()
	if r.upDone != nil {
		<-r.upDone
	}
	c, err := dialGateway(r.addr, r.port)
	if err != nil {
		return err
	}
	r.mu.Lock()
	version := r.version
	fids := make(map[uint32]*relayFid, len(r.fids))
	for k, v := range r.fids {
		fids[k] = v
	}
	r.mu.Unlock()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	dropped, err := rebuild(c, version, fids)
	c.SetDeadline(time.Time{})
	if err != nil {
		c.release()
		return fmt.Errorf("guest: relay %s: rebuild session: %w", r.tag, err)
	}
	r.mu.Lock()
	for _, fid := range dropped {
		delete(r.fids, fid)
	}
	var reqs []*relayReq
	for t, req := range r.pending {
		if req.typ == p9Tversion {
			delete(r.pending, t)
			continue
		}
		reqs = append(reqs, req)
	}
	sort.Slice(reqs, func(i, j int) bool { return reqs[i].seq < reqs[j].seq })
	var resend [][]byte
	for _, req := range reqs {
		resend = append(resend, req.msg)
	}
	r.mu.Unlock()
	for _, m := range resend {
		if _, err := c.Write(m); err != nil {
			c.release()
			return fmt.Errorf("guest: relay %s: %w", r.tag, err)
		}
	}
	r.mu.Lock()
	r.up, r.upDone = c, make(chan struct{})
	r.mu.Unlock()
	go r.fromHost(c, r.upDone)
	r.log.Info("share relay reconnected", "tag", r.tag, "fids", len(fids)-len(dropped), "dropped", len(dropped), "resent", len(resend))
	return nil
}

// rebuild replays version, attaches, walks and opens on c, one request at
// a time, and returns the fids it could not rebuild.
func rebuild(c *blockConn, version []byte, fids map[uint32]*relayFid) ([]uint32, error) {
	if version == nil {
		return nil, errors.New("no version was negotiated")
	}
	var buf []byte
	rpc := func(msg []byte) (bool, error) {
		if _, err := c.Write(msg); err != nil {
			return false, err
		}
		m, err := readMsg(c, buf)
		if err != nil {
			return false, err
		}
		buf = m
		return m[4] != p9Rlerror, nil
	}
	if _, err := rpc(version); err != nil {
		return nil, err
	}
	var dropped []uint32
	order := make([]uint32, 0, len(fids))
	for fid, f := range fids {
		if f.raw != nil {
			if ok, err := rpc(f.raw); err != nil {
				return nil, err
			} else if !ok {
				dropped = append(dropped, fid)
				delete(fids, fid)
			}
			continue
		}
		order = append(order, fid)
	}
	sort.Slice(order, func(i, j int) bool { return len(fids[order[i]].path) < len(fids[order[j]].path) })
	for _, fid := range order {
		f := fids[fid]
		ok := fids[f.attach] != nil
		from, rest := f.attach, f.path
		walked := false
		for first := true; ok && (first || len(rest) > 0); first = false {
			n := min(len(rest), p9MaxWalk)
			var err error
			ok, err = rpc(twalk(from, fid, rest[:n]))
			if err != nil {
				return nil, err
			}
			if ok && (len(buf) < p9Header+2 || int(binary.LittleEndian.Uint16(buf[p9Header:])) != n) {
				ok = false
			}
			walked = walked || ok
			from, rest = fid, rest[n:]
		}
		if !ok && walked {
			// Part of a long path walked: the fid names the wrong file.
			if _, err := rpc(p9Msg(p9Tclunk, binary.LittleEndian.AppendUint32(nil, fid))); err != nil {
				return nil, err
			}
		}
		if ok && f.open {
			var err error
			if ok, err = rpc(tlopen(fid, f.flags)); err != nil {
				return nil, err
			}
		}
		if !ok {
			dropped = append(dropped, fid)
		}
	}
	return dropped, nil
}

func p9Msg(typ byte, body []byte) []byte {
	m := make([]byte, p9Header+len(body))
	binary.LittleEndian.PutUint32(m, uint32(len(m)))
	m[4] = typ
	binary.LittleEndian.PutUint16(m[5:], relayTag)
	copy(m[p9Header:], body)
	return m
}

func twalk(fid, newfid uint32, names []string) []byte {
	b := binary.LittleEndian.AppendUint32(nil, fid)
	b = binary.LittleEndian.AppendUint32(b, newfid)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(names)))
	for _, n := range names {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(n)))
		b = append(b, n...)
	}
	return p9Msg(p9Twalk, b)
}

func tlopen(fid, flags uint32) []byte {
	b := binary.LittleEndian.AppendUint32(nil, fid)
	b = binary.LittleEndian.AppendUint32(b, flags)
	return p9Msg(p9Tlopen, b)
}

// alive reports whether the kernel still uses the relay (not unmounted).
func (r *relay) alive() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.dead
}

var relayProcs sync.Once

// blockConn is a socket used with blocking system calls. The relay's
// goroutines each sit in read on their own thread and are woken by the
// kernel directly, with no trip through Go's poller and scheduler, which
// costs much under TCG. (The agent runs with several Ps so that a thread
// blocked in a system call never holds the only one.)
type blockConn struct {
	fd     int
	shut   sync.Once
	closed sync.Once
}

func (c *blockConn) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(c.fd, p)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 && len(p) > 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}

func (c *blockConn) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		n, err := unix.Write(c.fd, p[done:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, err
		}
		done += n
	}
	return done, nil
}

// Close shuts the socket down, which wakes a thread blocked on it; the
// descriptor itself is released by the reader (release), so that its
// number is not reused under a read still in progress.
func (c *blockConn) Close() error {
	c.shut.Do(func() { unix.Shutdown(c.fd, unix.SHUT_RDWR) })
	return nil
}

func (c *blockConn) release() {
	c.Close()
	c.closed.Do(func() { unix.Close(c.fd) })
}

func (c *blockConn) SetDeadline(t time.Time) error {
	var tv unix.Timeval
	if !t.IsZero() {
		tv = unix.NsecToTimeval(time.Until(t).Nanoseconds())
	}
	unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	return unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
}
