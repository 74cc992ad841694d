package virtiofs

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hugelgupf/p9/p9"

	"github.com/smx-dev/smx/internal/fsgw"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/vhostuser"
)

// These tests send the FUSE requests a guest kernel sends to a server on a
// real file gateway over a real host folder; the buffers are split the way
// a virtqueue splits them (several readable and writable pieces). The VM
// test in internal/cli mounts the same server from a real guest.

const testProfile = `files:
  rules:
    - path: /work/**
      access: rw
    - path: /work/.env
      access: deny
    - path: /work/.github/**
      access: ro
`

type env struct {
	t   testing.TB
	dir string
	s   *Server

	mu      sync.Mutex
	refused []map[string]any
	unique  uint64
}

func newEnv(t testing.TB) *env {
	t.Helper()
	return newEnvWith(t, testProfile, nil)
}

// newEnvWith is newEnv with another profile; mod, when not nil, changes
// the gateway's Config.
func newEnvWith(t testing.TB, profile string, mod func(*fsgw.Config)) *env {
	t.Helper()
	dir := t.TempDir()
	for name, body := range map[string]string{
		".env":           "SECRET\n",
		"src/a.go":       "package a\n",
		".github/ci.yml": "on: push\n",
	} {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "escape")); err != nil {
		t.Fatal(err)
	}
	prof, err := policy.Parse("test.yaml", []byte(profile), nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dir: dir}
	cfg := fsgw.Config{
		Host:    dir,
		Mount:   policy.FileMount{Guest: "/work", Rule: "-v " + dir + ":/work"},
		Profile: func() *policy.Profile { return prof },
		Refused: func(f map[string]any) { e.mu.Lock(); e.refused = append(e.refused, f); e.mu.Unlock() },
	}
	if mod != nil {
		mod(&cfg)
	}
	gw, err := fsgw.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	root, err := gw.Attach()
	if err != nil {
		t.Fatal(err)
	}
	e.s = New(root, nil)
	t.Cleanup(e.s.Close)
	if _, errno := e.call(opInit, 0, le32(7, 31, 0, 0), nil, 256); errno != 0 {
		t.Fatalf("init: %d", errno)
	}
	return e
}

func le32(v ...uint32) []byte {
	var b []byte
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, x)
	}
	return b
}

func le64(v ...uint64) []byte {
	var b []byte
	for _, x := range v {
		b = binary.LittleEndian.AppendUint64(b, x)
	}
	return b
}

func cstr(s ...string) []byte {
	var b []byte
	for _, x := range s {
		b = append(append(b, x...), 0)
	}
	return b
}

// split cuts b into pieces of at most n bytes, as a descriptor chain would.
func split(b []byte, n int) [][]byte {
	var out [][]byte
	for len(b) > n {
		out = append(out, b[:n:n])
		b = b[n:]
	}
	return append(out, b)
}

// call sends one request; data is extra readable payload (WRITE), replyMax
// the size of the guest's reply buffer, in pieces of 100 bytes.
func (e *env) call(op uint32, nodeid uint64, body, data []byte, replyMax int) ([]byte, int32) {
	e.t.Helper()
	unique := atomic.AddUint64(&e.unique, 1)
	req := make([]byte, inHeaderSize)
	binary.LittleEndian.PutUint32(req[0:], uint32(inHeaderSize+len(body)+len(data)))
	binary.LittleEndian.PutUint32(req[4:], op)
	binary.LittleEndian.PutUint64(req[8:], unique)
	binary.LittleEndian.PutUint64(req[16:], nodeid)
	req = append(append(req, body...), data...)
	out := make([]byte, replyMax)
	n, err := e.s.Handle(1, &vhostuser.Chain{Readable: split(req, 100), Writable: split(out, 100)})
	if err != nil {
		e.t.Fatalf("op %d: %v", op, err)
	}
	if n < outHeaderSize || int(binary.LittleEndian.Uint32(out)) != int(n) || binary.LittleEndian.Uint64(out[8:]) != unique {
		e.t.Fatalf("op %d: reply of %d bytes, header %x", op, n, out[:16])
	}
	return out[outHeaderSize:n], int32(binary.LittleEndian.Uint32(out[4:]))
}

func (e *env) lookup(parent uint64, name string) (uint64, int32) {
	out, errno := e.call(opLookup, parent, cstr(name), nil, 256)
	if errno != 0 {
		return 0, errno
	}
	return binary.LittleEndian.Uint64(out), 0
}

func (e *env) open(node uint64, flags uint32) (uint64, int32) {
	out, errno := e.call(opOpen, node, le32(flags, 0), nil, 64)
	if errno != 0 {
		return 0, errno
	}
	return binary.LittleEndian.Uint64(out), 0
}

func (e *env) path(p string) uint64 {
	e.t.Helper()
	id := uint64(rootID)
	for _, n := range strings.Split(p, "/") {
		var errno int32
		if id, errno = e.lookup(id, n); errno != 0 {
			e.t.Fatalf("lookup %s: errno %d", p, -errno)
		}
	}
	return id
}

func wantErrno(t *testing.T, what string, got int32, want unix.Errno) {
	t.Helper()
	if got != -int32(want) {
		t.Errorf("%s: errno %d, want %d (%v)", what, -got, int(want), want)
	}
}

func (e *env) refusedPaths() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var s []string
	for _, r := range e.refused {
		s = append(s, r["op"].(string)+" "+r["path"].(string))
	}
	return strings.Join(s, ", ")
}

func TestReadWriteThroughGateway(t *testing.T) {
	e := newEnv(t)
	if _, ok := e.s.nodes[rootID].file.(vecFile); !ok {
		t.Fatal("the gateway's files do not read and write vectors: data would take one system call and one decision per page")
	}
	a := e.path("src/a.go")
	fh, errno := e.open(a, unix.O_RDONLY)
	if errno != 0 {
		t.Fatalf("open: %d", errno)
	}
	// The reply buffer is split in 100-byte pieces: the data lands across
	// them, straight from the host file.
	out, errno := e.call(opRead, a, append(le64(fh, 0), le32(4096, 0, 0, 0, 0, 0)...), nil, 4096)
	if errno != 0 || string(out) != "package a\n" {
		t.Fatalf("read: %q, errno %d", out, errno)
	}
	e.call(opRelease, a, le64(fh, 0, 0), nil, 64)

	// Create and write a file whose data spans several pieces.
	src := e.path("src")
	out, errno = e.call(opCreate, src, append(le32(unix.O_WRONLY, 0o644, 0o022, 0), cstr("new.txt")...), nil, 512)
	if errno != 0 {
		t.Fatalf("create: %d", errno)
	}
	node := binary.LittleEndian.Uint64(out)
	wfh := binary.LittleEndian.Uint64(out[entryOutSize:])
	data := []byte(strings.Repeat("0123456789", 50))
	out, errno = e.call(opWrite, node, append(le64(wfh, 0), le32(uint32(len(data)), 0, 0, 0, 0, 0)...), data, 64)
	if errno != 0 || binary.LittleEndian.Uint32(out) != uint32(len(data)) {
		t.Fatalf("write: %v errno %d", out, errno)
	}
	e.call(opRelease, node, le64(wfh, 0, 0), nil, 64)
	if got, _ := os.ReadFile(filepath.Join(e.dir, "src/new.txt")); string(got) != string(data) {
		t.Fatalf("host file: %q", got)
	}
}

func TestPolicyThroughFUSE(t *testing.T) {
	e := newEnv(t)
	// A hidden name does not exist for the guest, and the refusal is recorded.
	_, errno := e.lookup(rootID, ".env")
	wantErrno(t, "lookup .env", errno, unix.ENOENT)
	// A read-only path opens for reading, not for writing.
	ci := e.path(".github/ci.yml")
	if _, errno := e.open(ci, unix.O_RDONLY); errno != 0 {
		t.Errorf("open ci.yml for reading: %d", errno)
	}
	_, errno = e.open(ci, unix.O_WRONLY)
	wantErrno(t, "open ci.yml for writing", errno, unix.EROFS)
	_, errno = e.call(opUnlink, e.path(".github"), cstr("ci.yml"), nil, 64)
	wantErrno(t, "unlink ci.yml", errno, unix.EROFS)
	// A symlink on the host is never followed: it opens as nothing.
	esc := e.path("escape")
	_, errno = e.open(esc, unix.O_RDONLY)
	wantErrno(t, "open a symlink to /etc/passwd", errno, unix.ELOOP)
	// Renaming a file onto the hidden name is refused; nothing moves.
	src := e.path("src")
	_, errno = e.call(opRename, src, append(le64(rootID), cstr("a.go", ".env")...), nil, 64)
	if errno == 0 {
		t.Error("rename onto .env succeeded")
	}
	if b, _ := os.ReadFile(filepath.Join(e.dir, ".env")); string(b) != "SECRET\n" {
		t.Errorf(".env on the host: %q", b)
	}
	// A symlink the guest makes to the hidden name is refused.
	_, errno = e.call(opSymlink, rootID, cstr("alias", ".env"), nil, 256)
	if errno == 0 {
		t.Error("symlink alias -> .env succeeded")
	}
	// Readdir of the root does not list the hidden name.
	fh, errno := e.call(opOpendir, rootID, le32(0, 0), nil, 64)
	if errno != 0 {
		t.Fatalf("opendir: %d", errno)
	}
	out, errno := e.call(opReaddir, rootID, append(le64(binary.LittleEndian.Uint64(fh), 0), le32(4096, 0, 0, 0, 0, 0)...), nil, 4096)
	if errno != 0 || !strings.Contains(string(out), "src") || strings.Contains(string(out), ".env") {
		t.Errorf("readdir: errno %d, %q", errno, out)
	}
	got := e.refusedPaths()
	for _, w := range []string{"/work/.env", "/work/.github/ci.yml"} {
		if !strings.Contains(got, w) {
			t.Errorf("refusal records %q lack %s", got, w)
		}
	}
}

// A request that lies about its length or is cut short ends the device.
func TestMalformedRequests(t *testing.T) {
	e := newEnv(t)
	for name, req := range map[string][]byte{
		"short header": make([]byte, 20),
		"wrong length": append(le32(500, opLookup), make([]byte, 40)...),
	} {
		_, err := e.s.Handle(1, &vhostuser.Chain{Readable: [][]byte{req}, Writable: [][]byte{make([]byte, 128)}})
		if !errors.Is(err, vhostuser.ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	// A lookup without its name is malformed too.
	req := append(le32(inHeaderSize+3, opLookup), make([]byte, 32)...)
	binary.LittleEndian.PutUint64(req[16:], rootID)
	req = append(req, 'a', 'b', 'c')
	if _, err := e.s.Handle(1, &vhostuser.Chain{Readable: [][]byte{req}, Writable: [][]byte{make([]byte, 256)}}); !errors.Is(err, vhostuser.ErrMalformed) {
		t.Errorf("unterminated name: %v", err)
	}
}

// FuzzFUSE sends hostile requests to a server on a real gateway: each is
// answered within the guest's buffer or ends the device with
// ErrMalformed, never a panic, and nothing outside the folder changes.
func FuzzFUSE(f *testing.F) {
	hdr := func(op uint32, node uint64, body []byte) []byte {
		b := make([]byte, inHeaderSize)
		binary.LittleEndian.PutUint32(b[0:], uint32(inHeaderSize+len(body)))
		binary.LittleEndian.PutUint32(b[4:], op)
		binary.LittleEndian.PutUint64(b[16:], node)
		return append(b, body...)
	}
	f.Add(hdr(opLookup, rootID, cstr("src")), uint16(256))
	f.Add(hdr(opLookup, rootID, cstr("..")), uint16(256))
	f.Add(hdr(opGetattr, rootID, make([]byte, 16)), uint16(256))
	f.Add(hdr(opOpendir, rootID, le32(0, 0)), uint16(64))
	f.Add(hdr(opCreate, rootID, append(le32(unix.O_RDWR, 0o644, 0, 0), cstr("x")...)), uint16(512))
	f.Add(hdr(opMkdir, rootID, append(le32(0o755, 0), cstr("d")...)), uint16(512))
	f.Add(hdr(opSymlink, rootID, cstr("l", "../../etc")), uint16(512))
	f.Add(hdr(opRename, rootID, append(le64(rootID), cstr("src", "s2")...)), uint16(64))
	f.Add(hdr(opBatchForget, 0, append(le32(2, 0), le64(1, 5, 2, 1)...)), uint16(0))
	f.Add(hdr(opSetxattr, rootID, append(le32(3, 0), append(cstr("user.a"), "abc"...)...)), uint16(64))
	f.Add(hdr(opInit, 0, le32(7, 31, 0, 0)), uint16(128))
	f.Fuzz(func(t *testing.T, req []byte, replyMax uint16) {
		e := newEnv(t)
		out := make([]byte, replyMax)
		n, err := e.s.Handle(1, &vhostuser.Chain{Readable: split(req, 37), Writable: split(out, 61)})
		if err != nil {
			if !errors.Is(err, vhostuser.ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		if int(n) > len(out) {
			t.Fatalf("reply of %d bytes in %d", n, len(out))
		}
	})
}

// Answers a FUSE client needs where 9P's differ: an absent extended
// attribute is ENODATA (exec reads security.capability and refuses an
// empty one), a name past NAME_MAX is ENAMETOOLONG as on the host.
func TestHostAnswers(t *testing.T) {
	e := newEnv(t)
	a := e.path("src/a.go")
	_, errno := e.call(opGetxattr, a, append(le32(0, 0), cstr("security.capability")...), nil, 64)
	wantErrno(t, "getxattr security.capability", errno, unix.ENODATA)
	_, errno = e.call(opGetxattr, a, append(le32(0, 0), cstr("user.none")...), nil, 64)
	wantErrno(t, "getxattr user.none", errno, unix.ENODATA)
	if _, errno := e.call(opSetxattr, a, append(le32(2, 0), append(cstr("user.k"), "v1"...)...), nil, 64); errno != 0 {
		t.Fatalf("setxattr user.k: %d", errno)
	}
	out, errno := e.call(opGetxattr, a, append(le32(64, 0), cstr("user.k")...), nil, 128)
	if errno != 0 || string(out) != "v1" {
		t.Errorf("getxattr user.k: %q, %d", out, errno)
	}
	long := strings.Repeat("n", 256)
	_, errno = e.call(opCreate, e.path("src"), append(le32(unix.O_WRONLY, 0o644, 0, 0), cstr(long)...), nil, 512)
	wantErrno(t, "create a 256-byte name", errno, unix.ENAMETOOLONG)
	_, errno = e.lookup(rootID, long)
	wantErrno(t, "lookup a 256-byte name", errno, unix.ENAMETOOLONG)
}

// Two mounts under one device: the root lists them and nothing else can be
// made there, and a link or rename from one mount into the other (which a
// guest kernel refuses across bind mounts, and a hostile one may still
// send) is EXDEV: each gateway decides only names of its own folder.
func TestMountsStayApart(t *testing.T) {
	a, b := newEnv(t), newEnv(t)
	_, fa, _ := a.s.nodes[rootID].file.Walk(nil)
	_, fb, _ := b.s.nodes[rootID].file.Walk(nil)
	e := &env{t: t, dir: a.dir, s: NewMounts(map[string]p9.File{"m0": fa, "m1": fb}, nil)}
	if _, errno := e.call(opInit, 0, le32(7, 31, 0, 0), nil, 256); errno != 0 {
		t.Fatal(errno)
	}
	fh, errno := e.call(opOpendir, rootID, le32(0, 0), nil, 64)
	if errno != 0 {
		t.Fatal(errno)
	}
	out, errno := e.call(opReaddir, rootID, append(le64(binary.LittleEndian.Uint64(fh), 0), le32(4096, 0, 0, 0, 0, 0)...), nil, 4096)
	if errno != 0 || !strings.Contains(string(out), "m0") || !strings.Contains(string(out), "m1") {
		t.Fatalf("root readdir: %q, %d", out, errno)
	}
	_, errno = e.call(opMkdir, rootID, append(le32(0o755, 0), cstr("x")...), nil, 256)
	wantErrno(t, "mkdir in the root", errno, unix.EROFS)
	_, errno = e.lookup(rootID, "m2")
	wantErrno(t, "lookup an unknown mount", errno, unix.ENOENT)
	srcA := e.path("m0/src/a.go")
	dirB := e.path("m1/src")
	_, errno = e.call(opLink, dirB, append(le64(srcA), cstr("stolen")...), nil, 256)
	wantErrno(t, "link across mounts", errno, unix.EXDEV)
	_, errno = e.call(opRename, e.path("m0/src"), append(le64(dirB), cstr("a.go", "moved")...), nil, 64)
	wantErrno(t, "rename across mounts", errno, unix.EXDEV)
	_, errno = e.call(opRename, e.path("m0/src"), append(le64(rootID), cstr("a.go", "moved")...), nil, 64)
	wantErrno(t, "rename into the root", errno, unix.EXDEV)
	if _, err := os.Lstat(filepath.Join(b.dir, "src/stolen")); err == nil {
		t.Error("the link was made")
	}
}

// An operation a files rule asks about waits in the gateway while other
// requests of the device are served (the queue hands itself over through
// Hold, see vhostuser.Chain.Hold); the answer lets it and the writes
// through its handle proceed.
func TestHeldOperationDoesNotHoldOthers(t *testing.T) {
	asked := make(chan fsgw.Question, 1)
	answer := make(chan fsgw.Answer)
	var e *env
	e = newEnvWith(t, "files:\n  rules:\n    - path: /work/**\n      access: rw\n    - path: /work/src/**\n      access: ask-write\n", func(c *fsgw.Config) {
		c.Ask = func(ctx context.Context, q fsgw.Question) fsgw.Answer {
			e.s.Hold()
			asked <- q
			return <-answer
		}
	})
	a := e.path("src/a.go")
	type res struct {
		fh    uint64
		errno int32
	}
	done := make(chan res, 1)
	go func() { fh, errno := e.open(a, unix.O_WRONLY); done <- res{fh, errno} }()
	var q fsgw.Question
	select {
	case q = <-asked:
	case <-time.After(10 * time.Second):
		t.Fatal("no question")
	}
	if q.What != "write /work/src/a.go" {
		t.Fatalf("question %+v", q)
	}
	// Meanwhile: lookups, reads and a create elsewhere are served.
	ci := e.path(".github/ci.yml")
	fh, errno := e.open(ci, unix.O_RDONLY)
	if errno != 0 {
		t.Fatalf("open while held: %d", errno)
	}
	if out, errno := e.call(opRead, ci, append(le64(fh, 0), le32(4096, 0, 0, 0, 0, 0)...), nil, 4096); errno != 0 || string(out) != "on: push\n" {
		t.Fatalf("read while held: %q %d", out, errno)
	}
	if _, errno := e.call(opCreate, rootID, append(le32(unix.O_WRONLY, 0o644, 0o022, 0), cstr("free.txt")...), nil, 512); errno != 0 {
		t.Fatalf("create while held: %d", errno)
	}
	select {
	case r := <-done:
		t.Fatalf("the held open finished before an answer: %+v", r)
	default:
	}
	answer <- fsgw.Answer{Allow: true, Rule: "approved test"}
	r := <-done
	if r.errno != 0 {
		t.Fatalf("open after the answer: %d", r.errno)
	}
	data := []byte("package a // v2\n")
	if out, errno := e.call(opWrite, a, append(le64(r.fh, 0), le32(uint32(len(data)), 0, 0, 0, 0, 0)...), data, 64); errno != 0 || binary.LittleEndian.Uint32(out) != uint32(len(data)) {
		t.Fatalf("write through the allowed handle: %d", errno)
	}
	if got, _ := os.ReadFile(filepath.Join(e.dir, "src/a.go")); string(got) != string(data) {
		t.Fatalf("host file: %q", got)
	}
}

// TestRemoveMount takes a tree away while the guest holds a node, an
// open file and an open directory in it: each fails from then on, the
// other mount goes on, and a tree added again under the same tag is new.
func TestRemoveMount(t *testing.T) {
	a, b := newEnv(t), newEnv(t)
	_, fa, _ := a.s.nodes[rootID].file.Walk(nil)
	_, fb, _ := b.s.nodes[rootID].file.Walk(nil)
	e := &env{t: t, dir: a.dir, s: NewMounts(map[string]p9.File{"m0": fa}, nil)}
	if _, errno := e.call(opInit, 0, le32(7, 31, 0, 0), nil, 256); errno != 0 {
		t.Fatal(errno)
	}
	e.s.AddMount("m1", fb)
	file := e.path("m1/src/a.go")
	fh, errno := e.open(file, unix.O_RDONLY)
	if errno != 0 {
		t.Fatalf("open: %d", errno)
	}
	dir := e.path("m1/src")
	dfh, errno := e.call(opOpendir, dir, le32(0, 0), nil, 64)
	if errno != 0 {
		t.Fatalf("opendir: %d", errno)
	}
	keep := e.path("m0/src/a.go")
	kfh, errno := e.open(keep, unix.O_RDONLY)
	if errno != 0 {
		t.Fatalf("open m0: %d", errno)
	}

	if !e.s.RemoveMount("m1") {
		t.Fatal("RemoveMount(m1) says it was not mounted")
	}
	if e.s.RemoveMount("m1") {
		t.Error("a second RemoveMount(m1) says it was mounted")
	}
	readArgs := func(fh uint64) []byte { return append(le64(fh, 0), le32(4096, 0, 0, 0, 0, 0)...) }
	if out, errno := e.call(opRead, file, readArgs(fh), nil, 4096); errno == 0 {
		t.Errorf("read of a file held open in the removed mount: %q", out)
	}
	if _, errno := e.call(opReaddir, dir, append(le64(binary.LittleEndian.Uint64(dfh), 0), le32(4096, 0, 0, 0, 0, 0)...), nil, 4096); errno == 0 {
		t.Error("readdir of a directory held open in the removed mount succeeded")
	}
	_, errno = e.call(opCreate, dir, append(le32(unix.O_WRONLY, 0o644, 0o022, 0), cstr("late.txt")...), nil, 512)
	wantErrno(t, "create in a removed directory node", errno, unix.ENOENT)
	if _, err := os.Lstat(filepath.Join(b.dir, "src/late.txt")); err == nil {
		t.Error("a create through the removed mount reached the host")
	}
	_, errno = e.lookup(rootID, "m1")
	wantErrno(t, "lookup of the removed tag", errno, unix.ENOENT)
	rfh, _ := e.call(opOpendir, rootID, le32(0, 0), nil, 64)
	out, errno := e.call(opReaddir, rootID, append(le64(binary.LittleEndian.Uint64(rfh), 0), le32(4096, 0, 0, 0, 0, 0)...), nil, 4096)
	if errno != 0 || strings.Contains(string(out), "m1") || !strings.Contains(string(out), "m0") {
		t.Errorf("root after removal: %q, %d", out, errno)
	}
	if out, errno := e.call(opRead, keep, readArgs(kfh), nil, 4096); errno != 0 || string(out) != "package a\n" {
		t.Errorf("the other mount's open file: %q, errno %d", out, errno)
	}

	// The same tag again: a new tree, and the old node ids stay dead.
	_, fb2, _ := b.s.nodes[rootID].file.Walk(nil)
	e.s.AddMount("m1", fb2)
	if _, errno := e.call(opRead, file, readArgs(fh), nil, 4096); errno == 0 {
		t.Error("the old handle reads again after the tag was mounted again")
	}
	again := e.path("m1/src/a.go")
	if again == file {
		t.Errorf("the new tree reuses node %d", file)
	}
	fh2, errno := e.open(again, unix.O_RDONLY)
	if errno != 0 {
		t.Fatalf("open in the new tree: %d", errno)
	}
	if out, errno := e.call(opRead, again, readArgs(fh2), nil, 4096); errno != 0 || string(out) != "package a\n" {
		t.Errorf("read in the new tree: %q, errno %d", out, errno)
	}
}

// Entry and attribute timeouts are 0 unless SetCacheTimeout says otherwise.
func TestCacheTimeout(t *testing.T) {
	e := newEnv(t)
	valid := func() (uint64, uint32, uint64) {
		out, errno := e.call(opLookup, rootID, cstr("src"), nil, 256)
		if errno != 0 {
			t.Fatalf("lookup: %d", errno)
		}
		id := binary.LittleEndian.Uint64(out)
		attr, errno := e.call(opGetattr, id, make([]byte, 16), nil, 256)
		if errno != 0 {
			t.Fatalf("getattr: %d", errno)
		}
		return binary.LittleEndian.Uint64(out[16:]), binary.LittleEndian.Uint32(out[32:]), binary.LittleEndian.Uint64(attr)
	}
	if es, ens, as := valid(); es != 0 || ens != 0 || as != 0 {
		t.Fatalf("default timeouts: entry %d s %d ns, attr %d s", es, ens, as)
	}
	e.s.SetCacheTimeout(1500 * time.Millisecond)
	if es, ens, as := valid(); es != 1 || ens != 5e8 || as != 1 {
		t.Fatalf("timeouts after SetCacheTimeout(1.5s): entry %d s %d ns, attr %d s", es, ens, as)
	}
}
