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
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"

	"smx/internal/policy"
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
	// Log receives diagnostics. Nil discards them.
	Log *slog.Logger
}

// Gateway serves one mount. Its methods are safe for concurrent use.
type Gateway struct {
	cfg    Config
	rootFD int
	umask  uint32
	uid    uint32 // the supervisor's own uid/gid, shown to the guest as root
	gid    uint32
	limit  *limiter
	closed chan struct{}
	once   sync.Once
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
	um := syscall.Umask(0)
	syscall.Umask(um)
	g := &Gateway{
		cfg:    cfg,
		rootFD: fd,
		umask:  uint32(um),
		uid:    uint32(unix.Getuid()),
		gid:    uint32(unix.Getgid()),
		closed: make(chan struct{}),
	}
	g.limit = newLimiter(cfg.Refused)
	go g.flushLoop()
	return g, nil
}

// Close releases the root descriptor and flushes pending refusal
// summaries. It is idempotent.
func (g *Gateway) Close() error {
	g.once.Do(func() {
		close(g.closed)
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
	c := conn{Reader: &msgReader{r: rwc}, Writer: &msgWriter{w: rwc}, Closer: rwc}
	return srv.Handle(c, c)
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
)

// decide asks the profile about guest path p. It returns nil when allowed;
// otherwise it logs the refusal (rate-limited) and returns hidden or
// readOnly as the kind of refusal.
func (g *Gateway) decide(op, p, access string) (refused bool, kind int) {
	prof := g.cfg.Profile()
	d := prof.DecideMounted(g.cfg.Mount, p, access)
	if d.Allow {
		return false, 0
	}
	kind = hidden
	if access == "rw" && prof.DecideMounted(g.cfg.Mount, p, "ro").Allow {
		kind = readOnly
	}
	g.limit.refuse(op, p, d.Rule, d.Reason)
	return true, kind
}

// check decides an operation on an existing path: a hidden path is ENOENT,
// a read-only one EROFS.
func (g *Gateway) check(op, p, access string) error {
	if refused, kind := g.decide(op, p, access); refused {
		if kind == readOnly {
			return linux.EROFS
		}
		return linux.ENOENT
	}
	return nil
}

// checkNew decides the creation of a new name: a name the guest may not
// see cannot be created either (EACCES); in a read-only place, EROFS.
func (g *Gateway) checkNew(op, p string) error {
	if refused, kind := g.decide(op, p, "rw"); refused {
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

// visible reports, without logging, whether p may be listed.
func (g *Gateway) visible(p string) bool {
	return g.cfg.Profile().DecideMounted(g.cfg.Mount, p, "ro").Allow
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
	w   io.Writer
	buf []byte
}

func (m *msgWriter) Write(p []byte) (int, error) {
	m.buf = append(m.buf, p...)
	for len(m.buf) >= 4 {
		size := int(uint32(m.buf[0]) | uint32(m.buf[1])<<8 | uint32(m.buf[2])<<16 | uint32(m.buf[3])<<24)
		if size < 4 || len(m.buf) < size {
			break
		}
		if _, err := m.w.Write(m.buf[:size]); err != nil {
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

// msgReader hands p9 whole 9P requests and ends the session on requests
// p9 would hang on: a Tflush naming its own tag waits for itself for ever
// in p9's server (found by FuzzServe), which would leave the session and
// its goroutines behind.
type msgReader struct {
	r       io.Reader
	pending []byte
}

// Message framing: size[4] type[1] tag[2], little-endian.
const (
	msgHeader = 7
	msgMax    = 4 << 20 // p9's own largest message
	msgTflush = 108
)

var errMalformed = errors.New("fsgw: malformed 9P request")

func (m *msgReader) Read(p []byte) (int, error) {
	if len(m.pending) == 0 {
		var hdr [msgHeader]byte
		if _, err := io.ReadFull(m.r, hdr[:]); err != nil {
			return 0, err
		}
		size := binary.LittleEndian.Uint32(hdr[:])
		if size < msgHeader || size > msgMax {
			return 0, errMalformed
		}
		msg := make([]byte, size)
		copy(msg, hdr[:])
		if _, err := io.ReadFull(m.r, msg[msgHeader:]); err != nil {
			return 0, err
		}
		if msg[4] == msgTflush && size >= msgHeader+2 && binary.LittleEndian.Uint16(msg[msgHeader:]) == binary.LittleEndian.Uint16(hdr[5:]) {
			return 0, errMalformed
		}
		m.pending = msg
	}
	n := copy(p, m.pending)
	m.pending = m.pending[n:]
	return n, nil
}
