// Package fsgw is the host side of a folder shared into a sandbox: a
// 9P2000.L server (github.com/hugelgupf/p9) over one host directory that
// asks the sandbox's profile before every operation reaches the host file
// system, and logs what it refuses.
//
// Names are resolved from a descriptor of the mount's root with openat2
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS: no path from the guest can leave the
// directory, and no symbolic link is ever followed on the host, not even one
// inside the mount. The guest kernel resolves symlinks itself, one walk at a
// time, so every path the gateway sees is the path it decides on and the
// path it opens. (os.Root follows symlinks that stay inside the root, which
// would let a guest plant `x -> .env` and read a denied file through an
// allowed name.)
//
// Decisions are per operation, on the guest path, with the profile current
// at that moment (Config.Profile), so a profile change applies to the next
// operation, including on files already open.
package fsgw

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/policy"
)

// Config describes one mount.
type Config struct {
	// Host is the host directory (absolute). It is opened once by New;
	// if it is later removed or replaced, the mount stays on the original
	// directory (operations then fail as they would in a removed
	// directory).
	Host string
	// Mount is the guest side: mount point, read-only flag, and the rule
	// that names the mount in the log.
	Mount policy.FileMount
	// Profile returns the sandbox's current profile. Called on every
	// operation; must be safe for concurrent use.
	Profile func() *policy.Profile
	// Refused is called for every refusal that the rate limit lets
	// through, and for the summaries of those it held back.
	// Fields: op, path, rule, reason; summaries add repeated.
	Refused func(fields map[string]any)
	// Wrote is called the first time, per guest path, that the profile
	// allows a write-class operation on it (create, write, mkdir,
	// rename, unlink, setattr, ...), at most for 4096 paths and then
	// once more with fields overflow and reason. Fields: op, path, rule.
	// Nil notes nothing.
	Wrote func(fields map[string]any)
	// Log receives diagnostics. Nil discards them.
	Log *slog.Logger
	// Ask puts an operation a files rule answers ask to the host user
	// (see ask.go) and returns the answer. It is called on the goroutine
	// that already serves the request and may block it up to the
	// profile's ask.timeout; ctx ends when the gateway closes. Nil refuses
	// such operations at once, with NoAsk as the reason.
	Ask func(ctx context.Context, q Question) Answer
	// NoAsk says why a mount has no Ask (e.g. its transport serves one
	// request at a time), for the refusal's reason.
	NoAsk string
	// Owner is who the host user's files belong to in the guest (0:0,
	// root, unless the mount says otherwise, e.g. the image's unprivileged
	// user for an agent preset). See Gateway for the whole mapping.
	Owner Owner
}

// Owner is a guest uid and gid.
type Owner struct {
	UID, GID uint32
}

// Nobody is the guest owner of files the host user running the gateway
// does not own (the overflow uid and gid of Linux, 65534).
const Nobody = 65534

// Gateway serves one mount. Its methods are safe for concurrent use.
//
// Ownership: every change on the host is made by the host user running the
// gateway, so every file the guest creates belongs to that user, whatever
// guest user created it. In the guest, files of that host user (uid; gid
// for the group) show as Config.Owner's; files of any other host user or
// group show as Nobody, so the guest kernel's own permission checks treat
// them as someone else's. The guest cannot give a file away: a chown to
// anything but Config.Owner is refused (EPERM, logged); one to
// Config.Owner changes nothing on the host, which already holds it as the
// host user. Set-user-ID and set-group-ID bits are never set on the host.
//
// The host user is the one running the gateway, except when that is root
// (`sudo smx ...` on a user's checkout): then it is the owner of the
// mount's folder, whose files show as Config.Owner's, and what the guest
// creates is handed to that owner right after it is made (only ever to
// that uid and gid, and only on a new inode with one link).
type Gateway struct {
	cfg    Config
	rootFD int
	umask  uint32
	uid    uint32 // the host user: shown to the guest as cfg.Owner
	gid    uint32
	chown  bool // run as root for another host user: give what is created to uid:gid
	limit  *limiter
	wrote  *wroteSet
	links  linkIndex // names of multi-linked files, see checkLinks
	fold   foldState // where the host compares names case-insensitively
	// nsMu makes each check of a symlink's target and the change it
	// allows (Symlink, RenameAt, Link) one step for every session of the
	// gateway: no symlink appears in a directory between the walk that
	// allowed its move and the move.
	nsMu sync.Mutex
	// noDType makes readDir report every entry's type as unknown, as
	// some file systems do (tests; none at hand fills no d_type).
	noDType bool
	grants  onceGrants // paths an answer of once allowed (ask.go)
	ctx     context.Context
	cancel  context.CancelFunc
	sessMu  sync.Mutex
	sessCtx context.Context // the latest session's: questions wait under it
	closed  chan struct{}
	once    sync.Once
}

// New opens cfg.Host and returns a gateway for it. Close releases it.
func New(cfg Config) (*Gateway, error) {
	if cfg.Profile == nil {
		return nil, errors.New("fsgw: no profile")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	fd, err := unix.Open(cfg.Host, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("fsgw: open %s: %w", cfg.Host, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("fsgw: stat %s: %w", cfg.Host, err)
	}
	um := syscall.Umask(0)
	syscall.Umask(um)
	g := &Gateway{
		cfg:    cfg,
		rootFD: fd,
		umask:  uint32(um),
		uid:    uint32(unix.Geteuid()),
		gid:    uint32(unix.Getegid()),
		closed: make(chan struct{}),
	}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	if g.uid == 0 && (st.Uid != 0 || st.Gid != 0) {
		g.uid, g.gid, g.chown = st.Uid, st.Gid, true
	}
	g.initFold()
	g.limit = newLimiter(cfg.Refused)
	g.wrote = newWroteSet(cfg.Wrote)
	go g.flushLoop()
	return g, nil
}

// Close releases the root descriptor and flushes pending refusal
// summaries. It is idempotent.
func (g *Gateway) Close() error {
	g.once.Do(func() {
		close(g.closed)
		g.cancel()
		g.limit.flush(true)
		unix.Close(g.rootFD)
	})
	return nil
}

// Serve runs one 9P session on conn until it ends (the guest unmounts, the
// stream closes, or the guest sends a malformed message). It closes conn.
// Errors in one session never affect the gateway or other sessions.
func (g *Gateway) Serve(rwc io.ReadWriteCloser) error {
	srv := p9.NewServer(g)
	mw := &msgWriter{w: rwc}
	ctx, cancel := context.WithCancel(g.ctx)
	defer cancel()
	g.sessMu.Lock()
	g.sessCtx = ctx
	g.sessMu.Unlock()
	mr := &msgReader{r: rwc, answer: mw.answer, listing: mw.listing}
	mr.end = func() {
		// The guest is gone: its held questions have no one to answer.
		// p9's server must see the end only once every request has its
		// reply and the receivers it started are waiting: a request
		// goroutine that loops back while the server waits for its
		// requests panics in p9 (sync.WaitGroup reuse), which a request
		// held for the host user made likely.
		cancel()
		mw.drain(mr.whole, 5*time.Second)
	}
	c := conn{Reader: mr, Writer: mw, Closer: rwc}
	start := time.Now()
	err := srv.Handle(c, c)
	// The round trips a workload cost, by request type (9P2000.L
	// numbers: 110 walk, 24 getattr, 12 open, 14 create, 116 read, 118
	// write, 120 clunk, 40 readdir, 76 unlinkat, ...).
	var byType []any
	for t, n := range mr.count {
		if n > 0 {
			byType = append(byType, strconv.Itoa(t), n)
		}
	}
	g.cfg.Log.Info("9P session ended", "requests", mr.total, "seconds", time.Since(start).Seconds(), slog.Group("by_type", byType...))
	return err
}

// Attach implements p9.Attacher: every attach starts at the mount's root.
func (g *Gateway) Attach() (p9.File, error) {
	return &file{g: g}, nil
}

func (g *Gateway) flushLoop() {
	t := time.NewTicker(limitWindow)
	defer t.Stop()
	for {
		select {
		case <-g.closed:
			return
		case <-t.C:
			g.limit.flush(false)
		}
	}
}

// How a refusal shows to the guest.
const (
	hidden   = iota // the path does not exist for the guest
	readOnly        // readable, not writable
	asked           // a question the host user denied or let time out: EACCES
)

// decide asks the profile about guest path p. It returns nil when allowed;
// otherwise it logs the refusal (rate-limited) and returns hidden,
// readOnly or asked as the kind of refusal.
func (g *Gateway) decide(op, p, access string) (refused bool, kind int) {
	return g.decideFor(op, p, access, nil)
}

// decideFor is decide for an operation through descriptor f (nil: none):
// a rule that says ask is settled by g.ask, which may hold the caller
// while the host user answers, and which remembers an answer on f.
func (g *Gateway) decideFor(op, p, access string, f *file) (refused bool, kind int) {
	return g.decideWhat(op, p, access, "", f)
}

// decideWhat is decideFor with the question's wording (what; "" names op
// and p), for an operation on two paths that asks one question.
func (g *Gateway) decideWhat(op, p, access, what string, f *file) (refused bool, kind int) {
	prof := g.cfg.Profile()
	d := g.decision(prof, p, access)
	wasAsk := d.Ask
	if d.Ask {
		d = g.ask(prof, op, p, access, what, d, f)
	}
	if d.Allow {
		if access == "rw" {
			g.wrote.note(op, p, d.Rule)
		}
		return false, 0
	}
	switch rd := g.decision(prof, p, "ro"); {
	case wasAsk:
		kind = asked
	case access == "rw" && (rd.Allow || rd.Ask):
		kind = readOnly
	default:
		kind = hidden
	}
	g.limit.refuse(op, p, d.Rule, d.Reason)
	return true, kind
}

// decision asks prof about guest path p, folding case where the host
// does (see foldState).
func (g *Gateway) decision(prof *policy.Profile, p, access string) policy.Decision {
	m := g.cfg.Mount
	m.FoldCase = g.folds(p)
	return prof.DecideMounted(m, p, access)
}

// check decides an operation on an existing path: a hidden path is ENOENT,
// a read-only one EROFS, a question refused EACCES.
func (g *Gateway) check(op, p, access string) error {
	return g.checkFor(op, p, access, nil)
}

// checkFor is check for an operation through descriptor f.
func (g *Gateway) checkFor(op, p, access string, f *file) error {
	return g.checkWhat(op, p, access, "", f)
}

// checkWhat is checkFor with the question's wording (see decideWhat).
func (g *Gateway) checkWhat(op, p, access, what string, f *file) error {
	if refused, kind := g.decideWhat(op, p, access, what, f); refused {
		switch kind {
		case readOnly:
			return linux.EROFS
		case asked:
			return linux.EACCES
		}
		return linux.ENOENT
	}
	return nil
}

// checkNew decides the creation of a new name: a name the guest may not
// see cannot be created either (EACCES); in a read-only place, EROFS.
// f, when not nil, is the descriptor the creation opens (see decideFor).
func (g *Gateway) checkNew(op, p string) error {
	return g.checkNewFor(op, p, nil)
}

func (g *Gateway) checkNewFor(op, p string, f *file) error {
	return g.checkNewWhat(op, p, "", f)
}

func (g *Gateway) checkNewWhat(op, p, what string, f *file) error {
	if refused, kind := g.decideWhat(op, p, "rw", what, f); refused {
		if kind == readOnly {
			return linux.EROFS
		}
		return linux.EACCES
	}
	return nil
}

// refuse logs a refusal that is not a profile decision (a device node, a
// symlink out of the mount, a privileged xattr) and returns err.
func (g *Gateway) refuse(op, p, reason string, err error) error {
	g.limit.refuse(op, p, "builtin: file gateway", reason)
	return err
}

// visible reports, without logging, whether p may be listed (a rule
// that asks before a read leaves names visible, see ask.go).
func (g *Gateway) visible(p string) bool {
	d := g.decision(g.cfg.Profile(), p, "ro")
	return d.Allow || d.Ask
}

// guestPath turns a path relative to the mount root into the guest's.
func (g *Gateway) guestPath(rel string) string {
	if rel == "." {
		return g.cfg.Mount.Guest
	}
	return g.cfg.Mount.Guest + "/" + rel
}

// resolveFlags: never leave the root, never follow a symlink, anywhere in
// the path.
const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// openat opens rel (relative to the root, clean) with flags.
func (g *Gateway) openat(rel string, flags int, mode uint32) (int, error) {
	if flags&unix.O_PATH == 0 {
		flags |= unix.O_NOCTTY // openat2 refuses it beside O_PATH
	}
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: resolveFlags}
	for {
		fd, err := unix.Openat2(g.rootFD, rel, &how)
		if err == unix.EINTR || err == unix.EAGAIN {
			// EAGAIN: a concurrent rename on the host; RESOLVE_BENEATH
			// asks us to retry rather than risk an escape.
			continue
		}
		if err == unix.ELOOP || err == unix.EXDEV {
			// A symlink in the path (or a try to leave the root): the
			// guest walks component by component, so this is a race or
			// an attack; the path it named does not exist as a directory.
			return -1, linux.ENOENT
		}
		return fd, err
	}
}

// Kinds of names openNode does not open.
var (
	errNotFile = errors.New("fsgw: not a regular file or directory")
	errSymlink = errors.New("fsgw: a symlink")
)

// openNode opens rel for I/O with flags (an access mode, O_TRUNC,
// O_APPEND; O_NONBLOCK is added), but only a regular file or a directory:
// it looks at the inode through an O_PATH descriptor first, calls check
// (when not nil) on it, and only then opens that very inode (through
// /proc/self/fd). So a FIFO, socket or device node the host has in the
// folder is never opened, even one that replaces the name in between: a
// FIFO would block the gateway, a device's driver would act on the host.
// A symlink is errSymlink, anything else that is not a regular file or
// directory errNotFile; st is the inode's.
func (g *Gateway) openNode(rel string, flags int, check func(st *unix.Stat_t) error) (fd int, st unix.Stat_t, err error) {
	pfd, err := g.openat(rel, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return -1, st, err
	}
	defer unix.Close(pfd)
	if err := unix.Fstat(pfd, &st); err != nil {
		return -1, st, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG, unix.S_IFDIR:
	case unix.S_IFLNK:
		return -1, st, errSymlink
	default:
		return -1, st, errNotFile
	}
	if check != nil {
		if err := check(&st); err != nil {
			return -1, st, err
		}
	}
	fd, err = reopen(pfd, flags|unix.O_NONBLOCK)
	return fd, st, err
}

// reopen opens the inode behind descriptor fd again, with flags: the very
// file, whatever name it has now. No O_NOFOLLOW: the /proc entry is a link
// to it.
func reopen(fd, flags int) (int, error) {
	flags &^= unix.O_NOFOLLOW | unix.O_CREAT | unix.O_EXCL | unix.O_PATH
	for {
		nfd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(fd), flags|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
		if err == unix.EINTR {
			continue
		}
		return nfd, err
	}
}

// dirFD opens directory rel for *at calls.
func (g *Gateway) dirFD(rel string) (int, error) {
	return g.openat(rel, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
}

// lstat stats rel without following a final symlink.
func (g *Gateway) lstat(rel string) (unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := g.openat(rel, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return st, err
	}
	err = unix.Fstat(fd, &st)
	unix.Close(fd)
	return st, err
}

// checkName refuses names 9P's own check lets through but the host would
// misread. (p9 already refuses "", ".", ".." and names with '/'.)
func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") || len(name) > 255 {
		return linux.EINVAL
	}
	return nil
}

func join(rel, name string) string {
	if rel == "." {
		return name
	}
	return path.Join(rel, name)
}

// msgWriter coalesces each 9P reply into one Write: p9 writes a reply as
// up to three pieces (header, body, payload), and on a TCP connection
// each piece would otherwise leave as its own segment. It relies on 9P's
// framing (size[4] first, little-endian, counting itself) and on p9
// writing one reply at a time (its send lock).
type msgWriter struct {
	mu      sync.Mutex // one whole message at a time on w: p9's answers and answer's
	w       io.Writer
	buf     []byte
	lists   map[uint16]bool // tags of Txattrwalks that list a file's attributes
	replies atomic.Uint64   // replies written (or failed to write)
}

// listing marks request tag as a Txattrwalk that lists attributes: p9
// answers a file without any with a list of one empty name ("\x00"),
// which a client then fails to get (overlayfs's copy up does); the
// answer is made an empty list.
func (m *msgWriter) listing(tag uint16, list bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !list {
		delete(m.lists, tag) // a tag reused after a flush
		return
	}
	if m.lists == nil {
		m.lists = map[uint16]bool{}
	}
	m.lists[tag] = true
}

// answer sends Rlerror errno for request tag, which p9 never sees.
func (m *msgWriter) answer(tag uint16, errno uint32) error {
	var b [msgHeader + 4]byte
	binary.LittleEndian.PutUint32(b[:], uint32(len(b)))
	b[4] = msgRlerror
	binary.LittleEndian.PutUint16(b[5:], tag)
	binary.LittleEndian.PutUint32(b[7:], errno)
	m.mu.Lock()
	defer m.mu.Unlock()
	_, err := m.w.Write(b[:])
	return err
}

// drain waits, at most d, until n replies have been written, and then a
// little more for the server's goroutines to settle (see Serve).
func (m *msgWriter) drain(n uint64, d time.Duration) {
	for deadline := time.Now().Add(d); m.replies.Load() < n && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
}

func (m *msgWriter) Write(p []byte) (int, error) {
	m.buf = append(m.buf, p...)
	for len(m.buf) >= 4 {
		size := int(uint32(m.buf[0]) | uint32(m.buf[1])<<8 | uint32(m.buf[2])<<16 | uint32(m.buf[3])<<24)
		if size < 4 || len(m.buf) < size {
			break
		}
		m.mu.Lock()
		if len(m.lists) > 0 && size >= msgHeader {
			if tag := binary.LittleEndian.Uint16(m.buf[5:]); m.lists[tag] {
				delete(m.lists, tag)
				if m.buf[4] == msgRxattrwalk && size == msgHeader+8 && binary.LittleEndian.Uint64(m.buf[msgHeader:]) == 1 {
					binary.LittleEndian.PutUint64(m.buf[msgHeader:], 0)
				}
			}
		}
		_, err := m.w.Write(m.buf[:size])
		m.replies.Add(1)
		m.mu.Unlock()
		if err != nil {
			m.buf = m.buf[:0]
			return 0, err
		}
		m.buf = append(m.buf[:0], m.buf[size:]...)
	}
	if cap(m.buf) > 8<<20 && len(m.buf) == 0 {
		m.buf = nil
	}
	return len(p), nil
}

type conn struct {
	io.Reader
	io.Writer
	io.Closer
}

// msgReader checks the framing of 9P requests on their way to p9 and ends
// the session on requests p9 would hang on: a Tflush naming its own tag
// waits for itself for ever in p9's server (found by FuzzServe), which
// would leave the session and its goroutines behind. Message bodies pass
// through without a copy of their own (a write's payload is 1 MiB).
//
// It also answers itself a Txattrwalk for an attribute outside the user
// namespace, which the guest never sees (see xattrAllowed): ENODATA, as a
// file system without it would. p9 answers an absent attribute with an
// empty value or EINVAL, and overlayfs (a read-only cache's overlay over
// a share, internal/cache) takes an empty trusted.overlay.* attribute
// for a real one and EINVAL for a broken file.
type msgReader struct {
	r       io.Reader
	answer  func(tag uint16, errno uint32) error
	listing func(tag uint16, list bool)
	walk    []byte // a Txattrwalk read whole
	end     func() // called once when the stream ends, before p9 sees it (nil: nothing)
	pending []byte // header bytes read ahead, not yet handed out
	hdr     [msgHeader + 2]byte
	rest    uint32 // bytes of the current message still to pass through
	total   uint64
	whole   uint64      // requests handed to p9 whole (each gets a reply)
	count   [256]uint64 // requests by type
}

// Message framing: size[4] type[1] tag[2], little-endian.
const (
	msgHeader = 7
	msgMax    = 4 << 20 // p9's own largest message
	msgTflush = 108
	// Txattrwalk: fid[4] newfid[4] name[s]; Rlerror: ecode[4].
	msgTxattrwalk = 30
	msgRlerror    = 7
	msgRxattrwalk = 31
	enodata       = 61
	xattrNameMax  = 255 // Linux's XATTR_NAME_MAX
)

var errMalformed = errors.New("fsgw: malformed 9P request")

// Read hands p9 the next bytes of the stream; when the stream ends (or a
// request is malformed, which ends it too) it calls end first.
func (m *msgReader) Read(p []byte) (int, error) {
	n, err := m.read(p)
	if err != nil && m.end != nil {
		m.end()
		m.end = nil
	}
	return n, err
}

func (m *msgReader) read(p []byte) (int, error) {
	for len(m.pending) == 0 && m.rest == 0 {
		hdr := m.hdr[:msgHeader]
		if _, err := io.ReadFull(m.r, hdr); err != nil {
			return 0, err
		}
		size := binary.LittleEndian.Uint32(hdr)
		if size < msgHeader || size > msgMax {
			return 0, errMalformed
		}
		m.rest = size - msgHeader
		m.total++
		m.count[hdr[4]]++
		if hdr[4] == msgTflush && m.rest >= 2 {
			hdr = m.hdr[:msgHeader+2]
			if _, err := io.ReadFull(m.r, hdr[msgHeader:]); err != nil {
				return 0, err
			}
			m.rest -= 2
			if binary.LittleEndian.Uint16(hdr[msgHeader:]) == binary.LittleEndian.Uint16(hdr[5:]) {
				return 0, errMalformed
			}
		}
		if hdr[4] == msgTxattrwalk && m.answer != nil && m.rest <= 4+4+2+xattrNameMax {
			// Read whole: small (a name), and answered here or passed on.
			m.walk = append(append(m.walk[:0], hdr...), make([]byte, m.rest)...)
			if _, err := io.ReadFull(m.r, m.walk[msgHeader:]); err != nil {
				return 0, err
			}
			m.rest = 0
			body := m.walk[msgHeader:]
			if len(body) >= 10 {
				n := int(binary.LittleEndian.Uint16(body[8:]))
				if m.listing != nil {
					m.listing(binary.LittleEndian.Uint16(hdr[5:]), len(body) == 10 && n == 0)
				}
				if len(body) == 10+n && n > 0 && !xattrAllowed(string(body[10:])) {
					if err := m.answer(binary.LittleEndian.Uint16(hdr[5:]), enodata); err != nil {
						return 0, err
					}
					continue
				}
			}
			hdr = m.walk
		}
		m.pending = hdr
	}
	if len(m.pending) > 0 {
		n := copy(p, m.pending)
		m.pending = m.pending[n:]
		if len(m.pending) == 0 && m.rest == 0 {
			m.whole++
		}
		return n, nil
	}
	if uint32(len(p)) > m.rest {
		p = p[:m.rest]
	}
	n, err := m.r.Read(p)
	m.rest -= uint32(n)
	if n > 0 && m.rest == 0 {
		m.whole++
	}
	if err == io.EOF && m.rest > 0 {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}
