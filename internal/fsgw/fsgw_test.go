package fsgw

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/testutil"
)

// These tests drive the gateway with p9's own client over a socketpair: the
// same bytes a guest kernel sends, against a real host directory. The VM
// tests in internal/cli do the same from a real guest.

const testProfile = `files:
  rules:
    - path: /work/**
      access: rw
    - path: /work/.env
      access: deny
    - path: /work/**/*.pem
      access: deny
    - path: /work/.github/**
      access: ro
`

type env struct {
	t    testing.TB
	dir  string
	gw   *Gateway
	root p9.File

	mu      sync.Mutex
	refused []map[string]any
	wrote   []map[string]any
}

func newEnv(t *testing.T, profile string, ro bool) *env {
	t.Helper()
	return newEnvOwner(t, profile, ro, Owner{}, nil)
}

// newEnvOwner is newEnv with the mount's guest owner; prep, when not nil,
// runs on the host folder before the gateway opens it.
func newEnvOwner(t testing.TB, profile string, ro bool, owner Owner, prep func(dir string)) *env {
	t.Helper()
	return newEnvIn(t, t.TempDir(), profile, ro, owner, prep)
}

// newEnvIn is newEnvOwner on host folder dir.
func newEnvIn(t testing.TB, dir, profile string, ro bool, owner Owner, prep func(dir string)) *env {
	t.Helper()
	return newEnvCfg(t, dir, profile, ro, owner, prep, nil)
}

// newEnvCfg is newEnvIn; mod, when not nil, changes the gateway's Config
// before it opens.
func newEnvCfg(t testing.TB, dir, profile string, ro bool, owner Owner, prep func(dir string), mod func(*Config)) *env {
	t.Helper()
	testutil.WriteTree(t, dir, map[string]string{
		".env":             "SECRET\n",
		"src/a.go":         "package a\n",
		"src/keys/k.pem":   "KEY\n",
		".github/ci.yml":   "on: push\n",
		"docs/readme.txt":  "hi\n",
		"docs/sub/more.md": "more\n",
	})
	if prep != nil {
		prep(dir)
	}
	prof, err := policy.Parse("test.yaml", []byte(profile), nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dir: dir}
	cfg := Config{
		Host:    dir,
		Mount:   policy.FileMount{Guest: "/work", ReadOnly: ro, Rule: "-v " + dir + ":/work"},
		Profile: func() *policy.Profile { return prof },
		Refused: func(f map[string]any) { e.mu.Lock(); e.refused = append(e.refused, f); e.mu.Unlock() },
		Wrote:   func(f map[string]any) { e.mu.Lock(); e.wrote = append(e.wrote, f); e.mu.Unlock() },
		Owner:   owner,
	}
	if mod != nil {
		mod(&cfg)
	}
	e.gw, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.gw.Close() })
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	sf, cf := os.NewFile(uintptr(fds[0]), "srv"), os.NewFile(uintptr(fds[1]), "cli")
	srvConn, _ := net.FileConn(sf)
	cliConn, _ := net.FileConn(cf)
	sf.Close()
	cf.Close()
	done := make(chan struct{})
	go func() { e.gw.Serve(srvConn); close(done) }()
	c, err := p9.NewClient(&clientConn{Conn: cliConn}, p9.WithMessageSize(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); <-done })
	if e.root, err = c.Attach("/"); err != nil {
		t.Fatal(err)
	}
	return e
}

// clientConn is the test client's end of the socketpair; it works around
// a bug of p9's client (v0.3.0) that let one test's closed session fail the
// next test's first request. sendRecv leaves a request whose send failed
// registered as pending and puts its response back in responsePool, shared
// by every client in the process; when a reader of the same client then
// fails (the connection closed under it), it delivers its error into that
// pooled response, and whichever request draws it next, in any client,
// returns "wait: socket error: ... use of closed network connection" at
// once. Requests are sent after the harness closes the client: the clunks
// of clientFile's GC finalizer for the files tests never close, and the
// deferred Close of the write helpers. So once Close has begun, a write is
// dropped as if sent: the request waits for its reply like any other and
// gets the reader's error, leaving nothing pending. A write that fails for
// any other reason still fails; the lock keeps a write from failing
// half-way because Close ran under it.
type clientConn struct {
	net.Conn
	mu     sync.RWMutex
	closed bool
}

func (c *clientConn) Write(b []byte) (int, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return len(b), nil
	}
	return c.Conn.Write(b)
}

func (c *clientConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return c.Conn.Close()
}

// walk walks from the root; the client's files are consumed by Create, so
// every step starts afresh.
func (e *env) walk(p string) (p9.File, error) {
	var names []string
	if p != "" {
		names = strings.Split(p, "/")
	}
	_, f, err := e.root.Walk(names)
	return f, err
}

func (e *env) mustWalk(p string) p9.File {
	e.t.Helper()
	f, err := e.walk(p)
	if err != nil {
		e.t.Fatalf("walk %s: %v", p, err)
	}
	return f
}

func (e *env) read(p string) (string, error) {
	f, err := e.walk(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		return "", err
	}
	buf := make([]byte, 4096)
	n, err := f.ReadAt(buf, 0)
	if err != nil && n == 0 {
		return "", err
	}
	return string(buf[:n]), nil
}

func (e *env) list(p string) []string {
	e.t.Helper()
	f := e.mustWalk(p)
	defer f.Close()
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		e.t.Fatal(err)
	}
	ents, err := f.Readdir(0, 64<<10)
	if err != nil {
		e.t.Fatal(err)
	}
	var names []string
	for _, d := range ents {
		names = append(names, d.Name)
	}
	return names
}

// lastRefusal returns the last refusal record, failing if there is none
// for op and path.
func (e *env) refusal(op, path string) map[string]any {
	e.t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := len(e.refused) - 1; i >= 0; i-- {
		if r := e.refused[i]; r["op"] == op && r["path"] == path {
			return r
		}
	}
	e.t.Fatalf("no %s refusal for %s in %v", op, path, e.refused)
	return nil
}

// errIs compares errnos whichever package's type carries them (the p9
// client returns linux.Errno).
func errIs(err error, want unix.Errno) bool {
	var le linux.Errno
	if errors.As(err, &le) {
		return uintptr(le) == uintptr(want)
	}
	return errors.Is(err, want)
}

func wantErr(t *testing.T, what string, err error, want unix.Errno) {
	t.Helper()
	if !errIs(err, want) {
		t.Fatalf("%s: got %v, want %v", what, err, want)
	}
}

func TestDeniedPathsAreAbsent(t *testing.T) {
	e := newEnv(t, testProfile, false)
	names := strings.Join(e.list(""), " ")
	if strings.Contains(names, ".env") || !strings.Contains(names, "src") {
		t.Fatalf("root listing %q: want src, not .env", names)
	}
	if got := strings.Join(e.list("src/keys"), " "); strings.Contains(got, "k.pem") {
		t.Fatalf("src/keys lists %q", got)
	}
	_, err := e.read(".env")
	wantErr(t, "read .env", err, unix.ENOENT)
	if r := e.refusal("walk", "/work/.env"); !strings.Contains(r["rule"].(string), "test.yaml:5:7 files.rules[1]") {
		t.Fatalf("refusal rule %q", r["rule"])
	}
	// Creating a denied name: EACCES, nothing on the host.
	_, _, _, err = e.mustWalk("src").Create("new.pem", p9.WriteOnly, 0o644, 0, 0)
	wantErr(t, "create src/new.pem", err, unix.EACCES)
	if _, err := os.Stat(filepath.Join(e.dir, "src/new.pem")); !os.IsNotExist(err) {
		t.Fatalf("src/new.pem exists on the host: %v", err)
	}
	e.refusal("create", "/work/src/new.pem")
}

func TestReadOnlyRuleAndMount(t *testing.T) {
	e := newEnv(t, testProfile, false)
	f := e.mustWalk(".github/ci.yml")
	_, _, err := f.Open(p9.WriteOnly)
	wantErr(t, "open .github/ci.yml for writing", err, unix.EROFS)
	if s, err := e.read(".github/ci.yml"); err != nil || s != "on: push\n" {
		t.Fatalf("read .github/ci.yml = %q, %v", s, err)
	}
	_, _, _, err = e.mustWalk(".github").Create("x.yml", p9.WriteOnly, 0o644, 0, 0)
	wantErr(t, "create in .github", err, unix.EROFS)
	wantErr(t, "unlink .github/ci.yml", e.mustWalk(".github").UnlinkAt("ci.yml", 0), unix.EROFS)

	// A read-only mount refuses changes even where a rule says rw.
	r := newEnv(t, testProfile, true)
	_, _, err = r.mustWalk("src/a.go").Open(p9.ReadWrite)
	wantErr(t, "open on a read-only mount", err, unix.EROFS)
	if rule := r.refusal("open", "/work/src/a.go")["rule"].(string); !strings.HasPrefix(rule, "-v ") {
		t.Fatalf("read-only mount refusal names rule %q, want the -v mount", rule)
	}
}

func TestMountModeIsTheDefault(t *testing.T) {
	// No files rules at all: the mount's own mode decides.
	e := newEnv(t, "files: {}\n", false)
	if s, err := e.read(".env"); err != nil || s != "SECRET\n" {
		t.Fatalf("read .env under a rw mount with no rules = %q, %v", s, err)
	}
	r := newEnv(t, "files: {}\n", true)
	_, _, err := r.mustWalk("src/a.go").Open(p9.WriteOnly)
	wantErr(t, "write under a ro mount with no rules", err, unix.EROFS)
}

func TestSymlinksNeverLeadOut(t *testing.T) {
	e := newEnv(t, testProfile, false)
	for target, want := range map[string]unix.Errno{
		"/etc/passwd":      unix.EPERM,
		"../../etc/passwd": unix.EPERM,
		"../.env":          unix.EACCES,
		"keys/k.pem":       unix.EACCES,
		"a.go":             0,
	} {
		name := "l" + strings.NewReplacer("/", "_", ".", "d").Replace(target)
		_, err := e.mustWalk("src").Symlink(target, name, 0, 0)
		if want == 0 && err != nil || want != 0 && !errIs(err, want) {
			t.Errorf("symlink %s -> %s: got %v, want %v", name, target, err, want)
		}
		_, lerr := os.Lstat(filepath.Join(e.dir, "src", name))
		if (want == 0) == os.IsNotExist(lerr) {
			t.Errorf("symlink %s on the host: %v (want it only when allowed)", name, lerr)
		}
	}
	// A symlink the host already has, pointing at a denied file: the
	// gateway never follows it, so opening it does not read the file.
	if err := os.Symlink("../.env", filepath.Join(e.dir, "src/planted")); err != nil {
		t.Fatal(err)
	}
	f := e.mustWalk("src/planted")
	if _, _, err := f.Open(p9.ReadOnly); err == nil {
		t.Fatal("opening a symlink opened its target")
	}
	if tgt, err := e.mustWalk("src/planted").Readlink(); err != nil || tgt != "../.env" {
		t.Fatalf("readlink = %q, %v", tgt, err)
	}
	// A directory swapped for a symlink after the walk: resolution fails
	// instead of following it.
	os.MkdirAll(filepath.Join(e.dir, "swap"), 0o755)
	os.WriteFile(filepath.Join(e.dir, "swap/f"), []byte("ok"), 0o644)
	sf := e.mustWalk("swap/f")
	os.RemoveAll(filepath.Join(e.dir, "swap"))
	os.Symlink(".github", filepath.Join(e.dir, "swap"))
	os.WriteFile(filepath.Join(e.dir, ".github/f"), []byte("frozen"), 0o644)
	_, _, err := sf.Open(p9.ReadWrite)
	wantErr(t, "open through a swapped-in symlink", err, unix.ENOENT)
}

func TestLinksRenamesAndNodes(t *testing.T) {
	e := newEnv(t, testProfile, false)
	// Hard link to a read-only file: it would be writable at the new name.
	err := e.mustWalk("src").Link(e.mustWalk(".github/ci.yml"), "ci-link")
	wantErr(t, "link to a read-only file", err, unix.EACCES)
	e.refusal("link", "/work/.github/ci.yml")
	// Rename onto a denied name, and of a denied file.
	err = e.mustWalk("src").RenameAt("a.go", e.mustWalk(""), ".env")
	wantErr(t, "rename onto .env", err, unix.EACCES)
	if b, _ := os.ReadFile(filepath.Join(e.dir, ".env")); string(b) != "SECRET\n" {
		t.Fatalf(".env on the host is now %q", b)
	}
	err = e.mustWalk("src/keys").RenameAt("k.pem", e.mustWalk("src"), "k.txt")
	wantErr(t, "rename a denied file", err, unix.ENOENT)
	// A directory holding a denied file cannot move where the file would
	// show: EXDEV makes the guest copy file by file.
	err = e.mustWalk("src").RenameAt("keys", e.mustWalk("docs"), "keys")
	wantErr(t, "rename a directory holding a denied file", err, unix.EXDEV)
	// A plain directory moves across directories.
	if err := e.mustWalk("docs").RenameAt("sub", e.mustWalk("src"), "sub"); err != nil {
		t.Fatalf("rename docs/sub -> src/sub: %v", err)
	}
	if s, err := e.read("src/sub/more.md"); err != nil || s != "more\n" {
		t.Fatalf("after rename: %q, %v", s, err)
	}
	// No device nodes, FIFOs or sockets on the host.
	_, err = e.mustWalk("src").Mknod("fifo", p9.ModeNamedPipe|0o644, 0, 0, 0, 0)
	wantErr(t, "mknod", err, unix.EPERM)
	e.refusal("mknod", "/work/src/fifo")
}

func TestSetuidStrippedAndOwnership(t *testing.T) {
	e := newEnv(t, testProfile, false)
	_, _, _, err := e.mustWalk("src").Create("tool", p9.ReadWrite, 0o6755, 1234, 1234)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(e.dir, "src/tool"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 || fi.Mode().Perm() != 0o755 {
		t.Fatalf("created mode %v: want 0755 without set-id bits", fi.Mode())
	}
	st := fi.Sys().(*syscall.Stat_t)
	if int(st.Uid) != os.Getuid() {
		t.Fatalf("created file owned by %d, want the host user %d", st.Uid, os.Getuid())
	}
	err = e.mustWalk("src/tool").SetAttr(p9.SetAttrMask{Permissions: true}, p9.SetAttr{Permissions: 0o4777})
	if err != nil {
		t.Fatal(err)
	}
	fi, _ = os.Stat(filepath.Join(e.dir, "src/tool"))
	if fi.Mode()&os.ModeSetuid != 0 {
		t.Fatalf("chmod 4777 left %v", fi.Mode())
	}
}

// TestOwnerMapping: the host user's files show as the mount's guest owner,
// other host users' as nobody; files the guest creates, whatever ids it
// sends, belong to the host user; a chown to anyone but the guest owner is
// refused and logged, one to the guest owner changes nothing on the host.
func TestOwnerMapping(t *testing.T) {
	e := newEnvOwner(t, testProfile, false, Owner{UID: 1000, GID: 1001}, nil)
	attr := func(p string) p9.Attr {
		t.Helper()
		_, _, a, err := e.mustWalk(p).GetAttr(p9.AttrMaskAll)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	if a := attr("src/a.go"); a.UID != 1000 || a.GID != 1001 {
		t.Errorf("host user's file shows as %d:%d, want 1000:1001", a.UID, a.GID)
	}
	_, _, _, err := e.mustWalk("src").Create("new", p9.ReadWrite, 0o644, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	hostOwner := func(p string) (uint32, uint32) {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(e.dir, p), &st); err != nil {
			t.Fatal(err)
		}
		return st.Uid, st.Gid
	}
	if u, g := hostOwner("src/new"); int(u) != os.Getuid() || int(g) != os.Getgid() {
		t.Errorf("created as guest root: host owner %d:%d, want the host user %d:%d", u, g, os.Getuid(), os.Getgid())
	}
	if a := attr("src/new"); a.UID != 1000 || a.GID != 1001 {
		t.Errorf("created file shows as %d:%d, want 1000:1001", a.UID, a.GID)
	}
	for _, c := range []struct {
		name  string
		valid p9.SetAttrMask
		attr  p9.SetAttr
		want  error
	}{
		{"chown root", p9.SetAttrMask{UID: true}, p9.SetAttr{UID: 0}, unix.EPERM},
		{"chgrp root", p9.SetAttrMask{GID: true}, p9.SetAttr{GID: 0}, unix.EPERM},
		{"chown owner:root", p9.SetAttrMask{UID: true, GID: true}, p9.SetAttr{UID: 1000, GID: 0}, unix.EPERM},
		{"chown nobody", p9.SetAttrMask{UID: true}, p9.SetAttr{UID: Nobody}, unix.EPERM},
		{"chown owner", p9.SetAttrMask{UID: true, GID: true}, p9.SetAttr{UID: 1000, GID: 1001}, nil},
	} {
		err := e.mustWalk("src/new").SetAttr(c.valid, c.attr)
		if c.want == nil && err != nil || c.want != nil && !errIs(err, c.want.(unix.Errno)) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
		if u, g := hostOwner("src/new"); int(u) != os.Getuid() || int(g) != os.Getgid() {
			t.Errorf("%s: host owner now %d:%d", c.name, u, g)
		}
	}
	e.refusal("chown", "/work/src/new")
	// A file of another host user shows as nobody (needs root to make one).
	if os.Getuid() == 0 {
		if err := os.Chown(filepath.Join(e.dir, "docs/readme.txt"), 4242, 4243); err != nil {
			t.Fatal(err)
		}
		if a := attr("docs/readme.txt"); a.UID != Nobody || a.GID != Nobody {
			t.Errorf("another user's file shows as %d:%d, want nobody", a.UID, a.GID)
		}
	}
	// A read-only mount refuses a chown as any other change.
	ro := newEnvOwner(t, testProfile, true, Owner{UID: 1000, GID: 1000}, nil)
	wantErr(t, "chown on a read-only mount", ro.mustWalk("src/a.go").SetAttr(p9.SetAttrMask{UID: true}, p9.SetAttr{UID: 1000}), unix.EROFS)
}

// TestOwnerMappingUnderSudo: a gateway run as root on another user's
// folder (`sudo smx agent run claude ./repo`) takes the folder's owner for
// the host user: that user's files show as the guest owner's, what the
// guest creates is handed to that user, root's files show as nobody, and a
// file with another link is never handed over.
func TestOwnerMappingUnderSudo(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: the gateway runs as root for another user's folder")
	}
	const hu, hg = 4242, 4243
	e := newEnvOwner(t, testProfile, false, Owner{UID: 1000, GID: 1000}, func(dir string) {
		filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
			if err == nil {
				err = os.Lchown(p, hu, hg)
			}
			return err
		})
		os.WriteFile(filepath.Join(dir, "docs/root.txt"), []byte("r\n"), 0o644) // root's
	})
	attr := func(p string) p9.Attr {
		t.Helper()
		_, _, a, err := e.mustWalk(p).GetAttr(p9.AttrMaskAll)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	if a := attr("src/a.go"); a.UID != 1000 || a.GID != 1000 {
		t.Errorf("the folder owner's file shows as %d:%d, want 1000:1000", a.UID, a.GID)
	}
	if a := attr("docs/root.txt"); a.UID != Nobody || a.GID != Nobody {
		t.Errorf("root's file shows as %d:%d, want nobody", a.UID, a.GID)
	}
	if _, _, _, err := e.mustWalk("src").Create("new", p9.ReadWrite, 0o644, 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.mustWalk("src").Mkdir("d", 0o755, 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.mustWalk("src").Symlink("a.go", "l", 0, 0); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"src/new", "src/d", "src/l"} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(e.dir, p), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != hu || st.Gid != hg {
			t.Errorf("host %s is %d:%d, want the folder owner's %d:%d", p, st.Uid, st.Gid, hu, hg)
		}
		if a := attr(p); a.UID != 1000 || a.GID != 1000 {
			t.Errorf("%s shows as %d:%d, want 1000:1000", p, a.UID, a.GID)
		}
	}
	// A root file with a second name is not handed over, even when the
	// guest opens it with create.
	if err := os.Link(filepath.Join(e.dir, "docs/root.txt"), filepath.Join(e.dir, "docs/root2.txt")); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := e.mustWalk("docs").Create("root.txt", p9.ReadWrite, 0o644, 0, 0); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	unix.Lstat(filepath.Join(e.dir, "docs/root.txt"), &st)
	if st.Uid != 0 {
		t.Errorf("a root file with two links was handed to %d", st.Uid)
	}
}

func TestXattrsUserOnly(t *testing.T) {
	// p9's client speaks no xattr messages: drive the server's files
	// directly (the VM tests cover the wire).
	e := newEnv(t, testProfile, false)
	root, _ := e.gw.Attach()
	at := func(p string) p9.File {
		_, f, err := root.Walk(strings.Split(p, "/"))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	f := at("src/a.go")
	if err := f.SetXattr("user.smx", []byte("v"), 0); err != nil {
		if errIs(err, unix.EOPNOTSUPP) {
			t.Skip("host file system without user xattrs")
		}
		t.Fatal(err)
	}
	if v, err := at("src/a.go").GetXattr("user.smx"); err != nil || !bytes.Equal(v, []byte("v")) {
		t.Fatalf("getxattr = %q, %v", v, err)
	}
	err := at("src/a.go").SetXattr("security.capability", []byte{1, 0, 0, 2}, 0)
	wantErr(t, "setxattr security.capability", err, unix.EPERM)
	e.refusal("setxattr", "/work/src/a.go")
	if _, err := unix.Getxattr(filepath.Join(e.dir, "src/a.go"), "security.capability", make([]byte, 64)); err == nil {
		t.Fatal("security.capability reached the host file")
	}
}

func TestProfileChangeAppliesToOpenFiles(t *testing.T) {
	e := newEnv(t, testProfile, false)
	f := e.mustWalk("src/a.go")
	if _, _, err := f.Open(p9.ReadWrite); err != nil {
		t.Fatal(err)
	}
	stricter, err := policy.Parse("strict.yaml", []byte(testProfile+"    - path: /work/src/**\n      access: deny\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	e.gw.cfg.Profile = func() *policy.Profile { return stricter }
	if _, err := f.ReadAt(make([]byte, 10), 0); err == nil {
		t.Fatal("read of an open file went on after the profile denied it")
	}
	if _, err := f.WriteAt([]byte("x"), 0); err == nil {
		t.Fatal("write of an open file went on after the profile denied it")
	}
}

func TestRefusalsRateLimited(t *testing.T) {
	e := newEnv(t, testProfile, false)
	for range 100 {
		e.read(".env")
	}
	e.mu.Lock()
	n := len(e.refused)
	e.mu.Unlock()
	if n != limitBurst {
		t.Fatalf("%d records for 100 refusals of one path, want %d before the summary", n, limitBurst)
	}
	e.gw.limit.flush(false)
	if r := e.refusal("walk", "/work/.env"); r["repeated"] != 100-limitBurst {
		t.Fatalf("summary %v: want repeated=%d", r, 100-limitBurst)
	}
}

// A hostile guest kernel sends garbage: the session ends, the gateway does
// not, and another session works.
func TestMalformedMessagesEndOnlyTheSession(t *testing.T) {
	e := newEnv(t, testProfile, false)
	for _, junk := range [][]byte{
		{0xff, 0xff, 0xff, 0xff, 100, 0, 0},        // 4 GiB message
		{3, 0, 0, 0},                               // shorter than a header
		{20, 0, 0, 0, 110, 1, 0, 1, 2, 3, 4, 5, 6}, // Twalk cut short
		bytes.Repeat([]byte{7}, 1000),
		// Tflush naming its own tag: p9's server would wait for itself.
		{9, 0, 0, 0, 108, 0x30, 0x30, 0x30, 0x30},
	} {
		a, b := net.Pipe()
		done := make(chan struct{})
		go func() { e.gw.Serve(a); close(done) }()
		b.Write(junk)
		b.Close()
		<-done
	}
	if s, err := e.read("src/a.go"); err != nil || s != "package a\n" {
		t.Fatalf("after malformed sessions: %q, %v", s, err)
	}
}

func FuzzServe(f *testing.F) {
	f.Add([]byte{19, 0, 0, 0, 100, 0xff, 0xff, 0, 0, 16, 0, 6, 0, '9', 'P', '2', '0', '0', '0'})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 100, 0, 0})
	dir := f.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644)
	prof, err := policy.Parse("fuzz.yaml", []byte(testProfile), nil)
	if err != nil {
		f.Fatal(err)
	}
	gw, err := New(Config{Host: dir, Mount: policy.FileMount{Guest: "/work", Rule: "-v"}, Profile: func() *policy.Profile { return prof }})
	if err != nil {
		f.Fatal(err)
	}
	defer gw.Close()
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := net.Pipe()
		done := make(chan struct{})
		go func() { gw.Serve(a); close(done) }()
		go func() {
			buf := make([]byte, 4096)
			for {
				if _, err := b.Read(buf); err != nil {
					return
				}
			}
		}()
		b.Write(data)
		b.Close()
		<-done
	})
}

// BenchmarkCreateOwner times creating (and closing) a file and a directory
// through the gateway, on a folder of the user running it and, as root, on
// another user's folder (the sudo case), where each new inode is handed to
// that user: the cost of the hand-over, side by side (run with -v for the
// ratio).
func BenchmarkCreateOwner(b *testing.B) {
	per := map[string]time.Duration{}
	for _, c := range []struct {
		name string
		prep func(dir string)
	}{
		{"own-folder", nil},
		{"sudo-folder", func(dir string) { os.Chown(dir, 4242, 4242); os.Chown(filepath.Join(dir, "src"), 4242, 4242) }},
	} {
		if c.prep != nil && os.Getuid() != 0 {
			continue
		}
		b.Run(c.name, func(b *testing.B) {
			e := newEnvOwner(b, testProfile, false, Owner{UID: 1000, GID: 1000}, c.prep)
			start := time.Now()
			for i := 0; i < b.N; i++ {
				name := "f" + strconv.Itoa(i)
				f, _, _, err := e.mustWalk("src").Create(name, p9.ReadWrite, 0o644, 0, 0)
				if err != nil {
					b.Fatal(err)
				}
				f.Close()
				if _, err := e.mustWalk("src").Mkdir("d"+name, 0o755, 0, 0); err != nil {
					b.Fatal(err)
				}
			}
			per[c.name] = time.Since(start) / time.Duration(b.N)
		})
	}
	if own, sudo := per["own-folder"], per["sudo-folder"]; own > 0 && sudo > 0 {
		b.Logf("create+mkdir: own folder %v, another user's folder as root %v: %.2fx the time", own, sudo, float64(sudo)/float64(own))
	}
}

// TestHostHardLinks: hard links the host already has between a hidden or
// read-only name and an allowed one. The guest reads and writes the
// content through neither; each refusal names the hidden name's rule.
// Files whose other links are all allowed, or outside the mount, work.
func TestHostHardLinks(t *testing.T) {
	outside := t.TempDir()
	e := newEnvOwner(t, testProfile, false, Owner{}, func(dir string) {
		for _, l := range [][2]string{
			{".env", "src/config"},             // hidden ↔ allowed
			{"src/keys/k.pem", "docs/key.txt"}, // hidden by a glob
			{".github/ci.yml", "src/ci-copy"},  // read-only ↔ allowed
			{"docs/readme.txt", "src/readme2"}, // both allowed
		} {
			if err := os.Link(filepath.Join(dir, l[0]), filepath.Join(dir, l[1])); err != nil {
				t.Fatal(err)
			}
		}
		// A link outside the mount (a pnpm store, a local clone) does not
		// count: it is no guest path.
		os.WriteFile(filepath.Join(dir, "src/shared.js"), []byte("shared\n"), 0o644)
		if err := os.Link(filepath.Join(dir, "src/shared.js"), filepath.Join(outside, "store.js")); err != nil {
			t.Fatal(err)
		}
	})
	for _, p := range []string{"src/config", "docs/key.txt"} {
		s, err := e.read(p)
		wantErr(t, "read "+p, err, unix.EACCES)
		if strings.Contains(s, "SECRET") || strings.Contains(s, "KEY") {
			t.Fatalf("read %s through a host hard link: %q", p, s)
		}
		_, _, err = e.mustWalk(p).Open(p9.WriteOnly)
		wantErr(t, "open "+p+" for writing", err, unix.EACCES)
	}
	if r := e.refusal("open", "/work/src/config"); !strings.Contains(r["rule"].(string), "files.rules[1]") || !strings.Contains(r["reason"].(string), "/work/.env") {
		t.Fatalf("refusal for src/config: %v", r)
	}
	if r := e.refusal("open", "/work/docs/key.txt"); !strings.Contains(r["rule"].(string), "files.rules[2]") {
		t.Fatalf("refusal for docs/key.txt: %v", r)
	}
	// Read-only through its other name: readable, not writable, not
	// truncatable, not replaced by a create over it.
	if s, err := e.read("src/ci-copy"); err != nil || s != "on: push\n" {
		t.Fatalf("read src/ci-copy = %q, %v", s, err)
	}
	_, _, err := e.mustWalk("src/ci-copy").Open(p9.ReadWrite)
	wantErr(t, "open src/ci-copy for writing", err, unix.EROFS)
	err = e.mustWalk("src/ci-copy").SetAttr(p9.SetAttrMask{Size: true}, p9.SetAttr{Size: 0})
	wantErr(t, "truncate src/ci-copy", err, unix.EROFS)
	_, _, _, err = e.mustWalk("src").Create("ci-copy", p9.OpenFlags(p9.WriteOnly|unix.O_TRUNC), 0o644, 0, 0)
	wantErr(t, "create over src/ci-copy", err, unix.EROFS)
	if b, _ := os.ReadFile(filepath.Join(e.dir, ".github/ci.yml")); string(b) != "on: push\n" {
		t.Fatalf(".github/ci.yml on the host = %q", b)
	}
	// Allowed at both names, or linked only outside: as any file.
	if s, err := e.read("src/readme2"); err != nil || s != "hi\n" {
		t.Fatalf("read src/readme2 = %q, %v", s, err)
	}
	if s, err := e.read("src/shared.js"); err != nil || s != "shared\n" {
		t.Fatalf("read src/shared.js = %q, %v", s, err)
	}

	// A link the host makes while a file is open applies to the next read.
	f := e.mustWalk("docs/sub/more.md")
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	// More links appear later: the count changes, the index is rebuilt.
	if err := os.Link(filepath.Join(e.dir, "src/readme2"), filepath.Join(e.dir, "src/keys/r.pem")); err != nil {
		t.Fatal(err)
	}
	_, err = e.read("src/readme2")
	wantErr(t, "read src/readme2 after the host linked it as a .pem", err, unix.EACCES)
	os.Remove(filepath.Join(e.dir, "src/keys/r.pem"))
	if s, err := e.read("src/readme2"); err != nil || s != "hi\n" {
		t.Fatalf("read src/readme2 after the .pem link went = %q, %v", s, err)
	}
}

// TestRmdirOfHiddenEntries: removing a directory whose only entries are
// hidden fails with ENOTEMPTY (they stay), and the log says why.
func TestRmdirOfHiddenEntries(t *testing.T) {
	e := newEnv(t, testProfile, false)
	err := e.mustWalk("src").UnlinkAt("keys", unix.AT_REMOVEDIR)
	wantErr(t, "rmdir src/keys", err, unix.ENOTEMPTY)
	r := e.refusal("rmdir", "/work/src/keys")
	if !strings.Contains(r["reason"].(string), `"k.pem"`) || !strings.Contains(r["rule"].(string), "files.rules[2]") {
		t.Fatalf("rmdir refusal: %v", r)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "src/keys/k.pem")); err != nil {
		t.Fatal(err)
	}
	// A directory still holding what the guest sees: ENOTEMPTY, no record.
	err = e.mustWalk("docs").UnlinkAt("sub", unix.AT_REMOVEDIR)
	wantErr(t, "rmdir docs/sub", err, unix.ENOTEMPTY)
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range e.refused {
		if r["path"] == "/work/docs/sub" {
			t.Fatalf("an ordinary ENOTEMPTY was logged: %v", r)
		}
	}
}

// TestSymlinkMovesNeverLeadOut: a symlink inside the mount where it was
// made must not lead outside it after a rename or a hard link, alone or
// inside a moved directory; each refusal is logged.
func TestSymlinkMovesNeverLeadOut(t *testing.T) {
	// setup: a/b/c/l -> ../../../x, inside the mount where it is made
	// (the root's x).
	setup := func(t *testing.T) *env {
		e := newEnvOwner(t, testProfile, false, Owner{}, func(dir string) {
			os.MkdirAll(filepath.Join(dir, "a/b/c"), 0o755)
			os.MkdirAll(filepath.Join(dir, "a/b/d"), 0o755)
		})
		if _, err := e.mustWalk("a/b/c").Symlink("../../../x", "l", 0, 0); err != nil {
			t.Fatal(err)
		}
		return e
	}
	// escapes reports whether the host link at p resolves outside the
	// folder.
	escapes := func(e *env, p string) bool {
		tgt, err := os.Readlink(filepath.Join(e.dir, p))
		if err != nil {
			return false
		}
		r := filepath.Join(e.dir, filepath.Dir(p), tgt)
		return r != e.dir && !strings.HasPrefix(r, e.dir+"/")
	}
	t.Run("rename to the root", func(t *testing.T) {
		e := setup(t)
		err := e.mustWalk("a/b/c").RenameAt("l", e.mustWalk(""), "l")
		wantErr(t, "rename a/b/c/l to l", err, unix.EPERM)
		if escapes(e, "l") {
			t.Fatal("the renamed symlink leads outside the mount on the host")
		}
		if r := e.refusal("rename", "/work/a/b/c/l"); r["rule"] != "builtin: file gateway" || !strings.Contains(r["reason"].(string), "above the mount's root") {
			t.Fatalf("rename refusal: %v", r)
		}
	})
	t.Run("hard link at the root", func(t *testing.T) {
		e := setup(t)
		err := e.mustWalk("").Link(e.mustWalk("a/b/c/l"), "hl")
		wantErr(t, "link a/b/c/l as hl", err, unix.EPERM)
		if escapes(e, "hl") {
			t.Fatal("the hard-linked symlink leads outside the mount on the host")
		}
		e.refusal("link", "/work/hl")
	})
	t.Run("its directory moved up", func(t *testing.T) {
		// EXDEV: the guest then copies file by file, and the symlink's
		// copy is refused by Symlink.
		e := setup(t)
		err := e.mustWalk("a/b").RenameAt("c", e.mustWalk(""), "c")
		wantErr(t, "rename a/b/c to c", err, unix.EXDEV)
		if escapes(e, "c/l") {
			t.Fatal("the symlink in the moved directory leads outside the mount on the host")
		}
		if r := e.refusal("rename", "/work/a/b/c"); !strings.Contains(r["reason"].(string), "/work/c/l, symlink target") {
			t.Fatalf("directory rename refusal: %v", r)
		}
		// The directory above it, one level up: l would sit at depth 2
		// with three ..
		err = e.mustWalk("a").RenameAt("b", e.mustWalk(""), "b")
		wantErr(t, "rename a/b to b", err, unix.EXDEV)
		if escapes(e, "b/c/l") {
			t.Fatal("the symlink two levels down in the moved directory leads outside the mount on the host")
		}
	})
	t.Run("moves that keep it inside", func(t *testing.T) {
		e := setup(t)
		if err := e.mustWalk("a/b").RenameAt("c", e.mustWalk("a/b/d"), "c"); err != nil {
			t.Fatalf("rename a/b/c to a/b/d/c: %v", err)
		}
		if err := e.mustWalk("a/b/d/c").RenameAt("l", e.mustWalk("a/b/d/c"), "l2"); err != nil {
			t.Fatalf("rename a/b/d/c/l to l2: %v", err)
		}
		if err := e.mustWalk("a/b/d").Link(e.mustWalk("a/b/d/c/l2"), "l3"); err != nil {
			t.Fatalf("link a/b/d/c/l2 as a/b/d/l3: %v", err)
		}
	})
	t.Run("a host symlink", func(t *testing.T) {
		e := setup(t)
		if err := os.Symlink("/etc/passwd", filepath.Join(e.dir, "docs/abs")); err != nil {
			t.Fatal(err)
		}
		err := e.mustWalk("docs").RenameAt("abs", e.mustWalk("src"), "abs")
		wantErr(t, "rename a host symlink to /etc/passwd", err, unix.EPERM)
		e.refusal("rename", "/work/docs/abs")
	})
	t.Run("onto a denied target", func(t *testing.T) {
		// docs/sub/env -> ../.env names docs/.env, allowed; one level up
		// it names /work/.env.
		e := setup(t)
		if _, err := e.mustWalk("docs/sub").Symlink("../.env", "env", 0, 0); err != nil {
			t.Fatalf("symlink docs/sub/env -> ../.env: %v", err)
		}
		err := e.mustWalk("docs/sub").RenameAt("env", e.mustWalk("docs"), "env")
		wantErr(t, "rename a symlink where it would name /work/.env", err, unix.EACCES)
		e.refusal("rename", "/work/docs/sub/env")
	})
}

// TestSymlinkTargetsLeaveNoRoot: targets that leave the mount's root even
// for a moment, or climb out of a name, are refused where they are made.
// A host folder whose name differs from the guest's (/work) has a sibling
// named work: ../work/... from the root would land there.
func TestSymlinkTargetsLeaveNoRoot(t *testing.T) {
	e := newEnv(t, testProfile, false)
	sibling := filepath.Join(filepath.Dir(e.dir), "work")
	if err := os.MkdirAll(sibling, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(sibling, "secret"), []byte("outside\n"), 0o644)
	for _, c := range []struct{ dir, target string }{
		{"", "../work/secret"},
		{"src", "../../work/secret"},
		{"src", "../../work/src/a.go"},
		{"docs/sub", "x/../../../.."},
		{"docs/sub", "x/../more.md"}, // harmless today, but x may become a symlink
		{"", "./../work"},
	} {
		_, err := e.mustWalk(c.dir).Symlink(c.target, "l", 0, 0)
		wantErr(t, "symlink "+c.dir+"/l -> "+c.target, err, unix.EPERM)
		p := "/work/l"
		if c.dir != "" {
			p = "/work/" + c.dir + "/l"
		}
		e.refusal("symlink", p)
		if _, err := os.Lstat(filepath.Join(e.dir, c.dir, "l")); !os.IsNotExist(err) {
			t.Fatalf("symlink %s/l -> %s exists on the host", c.dir, c.target)
		}
	}
	for i, c := range []struct{ dir, target string }{
		{"docs/sub", "../../src/a.go"},
		{"docs/sub", "./more.md"},
		{"docs/sub", "..//readme.txt"},
	} {
		if _, err := e.mustWalk(c.dir).Symlink(c.target, "ok"+strconv.Itoa(i), 0, 0); err != nil {
			t.Errorf("symlink %s -> %s: %v", c.dir, c.target, err)
		}
	}
}

// TestMovableStatsUnknownTypes: on a file system that does not fill
// d_type, a directory's walk before a rename still descends and sees
// symlinks.
func TestMovableStatsUnknownTypes(t *testing.T) {
	e := newEnvOwner(t, testProfile, false, Owner{}, func(dir string) {
		os.MkdirAll(filepath.Join(dir, "a/b/c"), 0o755)
		os.Symlink("../../../x", filepath.Join(dir, "a/b/c/l"))
	})
	e.gw.noDType = true
	// src holds keys/k.pem, denied wherever it lands.
	err := e.mustWalk("").RenameAt("src", e.mustWalk("docs"), "src")
	wantErr(t, "rename src (keys/k.pem inside) with unknown types", err, unix.EXDEV)
	if r := e.refusal("rename", "/work/src"); !strings.Contains(r["reason"].(string), "k.pem") {
		t.Fatalf("refusal: %v", r)
	}
	err = e.mustWalk("a").RenameAt("b", e.mustWalk(""), "b")
	wantErr(t, "rename a/b (a symlink two levels down) with unknown types", err, unix.EXDEV)
	if r := e.refusal("rename", "/work/a/b"); !strings.Contains(r["reason"].(string), "symlink") {
		t.Fatalf("refusal: %v", r)
	}
}

// TestWriteLockNeedsWriteAccess: flock(LOCK_EX) on a file opened for
// reading arrives as a write lock; the gateway takes it on a descriptor
// open for writing only where the guest may write the file. Elsewhere it
// is refused and logged, and the file is never opened for writing.
func TestWriteLockNeedsWriteAccess(t *testing.T) {
	// p9's client sends Tlock without its fid: drive the server's files
	// directly (the VM tests cover the wire).
	e := newEnv(t, testProfile, false)
	lock := func(e *env, p string) (p9.LockStatus, error) {
		root, _ := e.gw.Attach()
		_, f, err := root.Walk(strings.Split(p, "/"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		if _, _, err := f.Open(p9.ReadOnly); err != nil {
			t.Fatal(err)
		}
		return f.Lock(1, p9.WriteLock, 0, 0, 0, "test")
	}
	st, err := lock(e, ".github/ci.yml")
	wantErr(t, "write lock on read-only .github/ci.yml", err, unix.EROFS)
	if st == p9.LockStatusOK {
		t.Fatal("write lock granted on a read-only file")
	}
	e.refusal("lock", "/work/.github/ci.yml")
	if n := openForWriting(t, filepath.Join(e.dir, ".github/ci.yml")); n > 0 {
		t.Fatalf("the gateway holds .github/ci.yml open for writing (%d descriptors)", n)
	}
	// Where the guest may write, the lock is taken as before.
	if st, err := lock(e, "src/a.go"); err != nil || st != p9.LockStatusOK {
		t.Fatalf("write lock on src/a.go: %v, %v", st, err)
	}
	// On a read-only mount, no file may be write-locked.
	r := newEnv(t, testProfile, true)
	_, err = lock(r, "src/a.go")
	wantErr(t, "write lock on a read-only mount", err, unix.EROFS)
	r.refusal("lock", "/work/src/a.go")
}

// openForWriting counts this process's descriptors open for writing on
// file p.
func openForWriting(t *testing.T, p string) int {
	t.Helper()
	var want unix.Stat_t
	if err := unix.Stat(p, &want); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range ents {
		var st unix.Stat_t
		if unix.Stat("/proc/self/fd/"+d.Name(), &st) != nil || st.Ino != want.Ino || st.Dev != want.Dev {
			continue
		}
		b, _ := os.ReadFile("/proc/self/fdinfo/" + d.Name())
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "flags:"); ok {
				if fl, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64); err == nil && fl&unix.O_ACCMODE != unix.O_RDONLY {
					n++
				}
			}
		}
	}
	return n
}

// TestHostFIFOsAndDevicesNeverOpen: a FIFO the host has in the folder is
// refused by open and by create (which must not block the gateway), and
// logged; so is a device node (as root).
func TestHostFIFOsAndDevicesNeverOpen(t *testing.T) {
	e := newEnvOwner(t, testProfile, false, Owner{}, func(dir string) {
		if err := unix.Mkfifo(filepath.Join(dir, "src/pipe"), 0o666); err != nil {
			t.Fatal(err)
		}
		if os.Getuid() == 0 {
			if err := unix.Mknod(filepath.Join(dir, "src/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
				t.Fatal(err)
			}
		}
	})
	fifo := filepath.Join(e.dir, "src/pipe")
	type result struct{ err error }
	done := make(chan result, 1)
	go func() {
		_, _, _, err := e.mustWalk("src").Create("pipe", p9.WriteOnly, 0o644, 0, 0)
		done <- result{err}
	}()
	select {
	case r := <-done:
		wantErr(t, "create over a host FIFO", r.err, unix.EPERM)
	case <-time.After(5 * time.Second):
		// Let the blocked open go, so the test ends.
		if fd, err := unix.Open(fifo, unix.O_RDONLY|unix.O_NONBLOCK, 0); err == nil {
			defer unix.Close(fd)
		}
		<-done
		t.Fatal("create over a host FIFO blocked the gateway")
	}
	e.refusal("create", "/work/src/pipe")
	for _, m := range []p9.OpenFlags{p9.ReadOnly, p9.WriteOnly, p9.ReadWrite} {
		_, _, err := e.mustWalk("src/pipe").Open(m)
		wantErr(t, "open a host FIFO", err, unix.EPERM)
	}
	e.refusal("open", "/work/src/pipe")
	if os.Getuid() == 0 {
		_, _, err := e.mustWalk("src/null").Open(p9.ReadWrite)
		wantErr(t, "open a host device", err, unix.EPERM)
		e.refusal("open", "/work/src/null")
		err = e.mustWalk("src/null").SetAttr(p9.SetAttrMask{Size: true}, p9.SetAttr{Size: 0})
		wantErr(t, "truncate a host device", err, unix.EINVAL)
	}
}

// TestCaseInsensitiveNames: where the host compares names
// case-insensitively, every spelling of a denied or read-only name is
// refused as the name itself. The host folder here is case-sensitive, so
// the gateway is told that it folds (the whole mount, or one directory);
// TestCaseInsensitiveHostFolder finds it out on real file systems.
func TestCaseInsensitiveNames(t *testing.T) {
	t.Run("whole mount", func(t *testing.T) {
		e := newEnv(t, testProfile, false)
		e.gw.fold.all.Store(true)
		_, err := e.read(".ENV")
		wantErr(t, "read .ENV", err, unix.ENOENT)
		e.refusal("walk", "/work/.ENV")
		_, _, _, err = e.mustWalk("").Create(".Env", p9.WriteOnly, 0o644, 0, 0)
		wantErr(t, "create .Env", err, unix.EACCES)
		if r := e.refusal("create", "/work/.Env"); !strings.Contains(r["rule"].(string), "files.rules[1]") || !strings.Contains(r["reason"].(string), "case-insensitively") {
			t.Fatalf("refusal: %v", r)
		}
		_, _, _, err = e.mustWalk("src").Create("NEW.PEM", p9.WriteOnly, 0o644, 0, 0)
		wantErr(t, "create src/NEW.PEM", err, unix.EACCES)
		_, err = e.mustWalk("").Mkdir(".GitHub", 0o755, 0, 0)
		wantErr(t, "mkdir .GitHub", err, unix.EROFS)
		_, err = e.mustWalk("src").Symlink("../.ENV", "l", 0, 0)
		wantErr(t, "symlink to ../.ENV", err, unix.EACCES)
		for _, n := range []string{".Env", "src/NEW.PEM", ".GitHub", "src/l"} {
			if _, err := os.Lstat(filepath.Join(e.dir, n)); !os.IsNotExist(err) {
				t.Errorf("%s exists on the host", n)
			}
		}
		// Other names are as before.
		if s, err := e.read("src/a.go"); err != nil || s != "package a\n" {
			t.Fatalf("read src/a.go = %q, %v", s, err)
		}
	})
	t.Run("one directory", func(t *testing.T) {
		e := newEnv(t, testProfile, false)
		// As on ext4 with docs/ made casefold (chattr +F).
		e.gw.fold.perDir = true
		e.gw.fold.dirs = map[string]foldDir{".": {false, time.Now().Add(time.Hour)}, "docs": {true, time.Now().Add(time.Hour)}}
		_, _, _, err := e.mustWalk("docs").Create("K.PEM", p9.WriteOnly, 0o644, 0, 0)
		wantErr(t, "create docs/K.PEM", err, unix.EACCES)
		e.refusal("create", "/work/docs/K.PEM")
		if _, _, _, err := e.mustWalk("src").Create("K.PEM", p9.WriteOnly, 0o644, 0, 0); err != nil {
			t.Fatalf("create src/K.PEM, where names are case-sensitive: %v", err)
		}
	})
}

// TestCaseInsensitiveHostFolder: on a real case-insensitive file system
// (an ext4 directory with the casefold attribute, or vfat), the gateway
// finds out that the host folds names and refuses every spelling of a
// denied one. Needs root (a loop mount) and a kernel with ext4 casefold
// or vfat.
func TestCaseInsensitiveHostFolder(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to mount a file system image")
	}
	_, casefold := os.Stat("/sys/fs/ext4/features/casefold")
	mnt := os.Getenv("SMX_TEST_CASEFOLD_DIR") // a folder on an ext4 with the casefold feature, instead of an image
	if mnt == "" {
		mnt = mountCaseInsensitive(t, casefold == nil)
	} else if casefold != nil {
		t.Fatal("SMX_TEST_CASEFOLD_DIR is set, but the kernel cannot casefold ext4")
	}
	root := mnt
	if casefold == nil {
		// Only the directory with the attribute folds: the mount's
		// root is that directory's parent, so the gateway must find it
		// per directory.
		root = filepath.Join(mnt, "w")
		sub := filepath.Join(root, "docs")
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		fd, err := unix.Open(sub, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
		if err == nil {
			err = unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags|casefoldFlag))
		}
		unix.Close(fd)
		if err != nil {
			t.Fatalf("chattr +F %s: %v", sub, err)
		}
	}
	e := newEnvIn(t, root, testProfile, false, Owner{}, nil)
	// The folder really folds where the test says it does.
	if _, err := os.Stat(filepath.Join(root, "docs/README.TXT")); err != nil {
		t.Fatalf("docs/README.TXT on the host: %v (the folder does not fold)", err)
	}
	// docs/keys.pem is denied by /work/**/*.pem; docs/KEYS.PEM is the
	// same file on this host.
	if err := os.WriteFile(filepath.Join(root, "docs/keys.pem"), []byte("KEY\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := e.read("docs/KEYS.PEM")
	wantErr(t, "read docs/KEYS.PEM", err, unix.ENOENT)
	if s != "" {
		t.Fatalf("read the denied file through another case: %q", s)
	}
	e.refusal("walk", "/work/docs/KEYS.PEM")
	_, _, _, err = e.mustWalk("docs").Create("Keys.Pem", p9.OpenFlags(p9.WriteOnly|unix.O_TRUNC), 0o644, 0, 0)
	wantErr(t, "create docs/Keys.Pem", err, unix.EACCES)
	if b, _ := os.ReadFile(filepath.Join(root, "docs/keys.pem")); string(b) != "KEY\n" {
		t.Fatalf("docs/keys.pem on the host is now %q", b)
	}
	if casefold != nil {
		// vfat folds everywhere: the root's .env too.
		_, err := e.read(".ENV")
		wantErr(t, "read .ENV", err, unix.ENOENT)
		e.refusal("walk", "/work/.ENV")
	}
}

// BenchmarkMovable times the walk before a directory's rename (the
// decisions on each path at both places, and the target check of each
// symlink at its new place) over 500 files and 500 symlinks.
func BenchmarkMovable(b *testing.B) {
	e := newEnvOwner(b, testProfile, false, Owner{}, func(dir string) {
		d := filepath.Join(dir, "tree/sub")
		os.MkdirAll(d, 0o755)
		for i := range 500 {
			os.WriteFile(filepath.Join(d, "f"+strconv.Itoa(i)), nil, 0o644)
			os.Symlink("../../docs/f"+strconv.Itoa(i), filepath.Join(d, "l"+strconv.Itoa(i)))
		}
	})
	b.ResetTimer()
	for range b.N {
		if r := e.gw.movable("tree", "/work/tree", "/work/docs/tree", "docs/tree"); r != "" {
			b.Fatal(r)
		}
	}
}

// mountCaseInsensitive mounts a new file system image that can fold
// case (ext4 with the casefold feature when the kernel can fold ext4,
// else vfat) and returns where. It skips the test when the kernel has
// neither, and, outside CI, when the image cannot be made or mounted.
func mountCaseInsensitive(t *testing.T, casefold bool) string {
	fss, _ := os.ReadFile("/proc/filesystems")
	vfat := strings.Contains(string(fss), "\tvfat\n")
	if !casefold && !vfat {
		t.Skip("the kernel has neither ext4 casefold (/sys/fs/ext4/features/casefold) nor vfat: no case-insensitive file system to mount")
	}
	mkfs, args := "mkfs.vfat", []string{}
	if casefold {
		mkfs, args = "mkfs.ext4", []string{"-q", "-O", "casefold"}
	}
	if _, err := exec.LookPath(mkfs); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s not found (the kernel can mount its file system)", mkfs)
		}
		t.Skipf("%s not found: install e2fsprogs or dosfstools", mkfs)
	}
	img := filepath.Join(t.TempDir(), "fs.img")
	mnt := t.TempDir()
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 64<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(mkfs, append(args, img)...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", mkfs, err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mount %s: %v: %s", img, err, out)
		}
		t.Skipf("mount %s (no loop devices here?): %v: %s", img, err, out)
	}
	t.Cleanup(func() { exec.Command("umount", mnt).Run() })
	return mnt
}

// TestHostRunFilesReadOnly: under dev's /work/** rw, each way a guest
// could plant something the host's git, direnv or editor runs is refused
// with a record naming the built-in rule, and git's own writes still work.
func TestHostRunFilesReadOnly(t *testing.T) {
	repo := func(dir, at string, hooks bool) {
		for name, body := range map[string]string{
			"config": "[core]\n\trepositoryformatversion = 0\n", "HEAD": "ref: refs/heads/main\n", "objects/.keep": "", "refs/heads/.keep": "",
		} {
			p := filepath.Join(dir, at, ".git", name)
			os.MkdirAll(filepath.Dir(p), 0o755)
			os.WriteFile(p, []byte(body), 0o644)
		}
		if hooks {
			os.MkdirAll(filepath.Join(dir, at, ".git/hooks"), 0o755)
			os.MkdirAll(filepath.Join(dir, at, ".git/info"), 0o755)
		}
	}
	e := newEnvOwner(t, "extends: dev\n", false, Owner{}, func(dir string) {
		repo(dir, ".", true)
		repo(dir, "sub/nested", false) // no hooks directory yet
		os.MkdirAll(filepath.Join(dir, ".vscode"), 0o755)
		os.WriteFile(filepath.Join(dir, ".vscode/settings.json"), []byte("{}\n"), 0o644)
		os.WriteFile(filepath.Join(dir, "evil"), []byte("#!/bin/sh\ntouch /tmp/pwned\n"), 0o755)
	})
	const rule = "builtin: files the host runs are read-only"
	refused := func(what string, err error, want unix.Errno, op, path string) {
		t.Helper()
		if !errIs(err, want) {
			t.Errorf("%s: got %v, want %v", what, err, want)
			return
		}
		if r := e.refusal(op, path); !strings.HasPrefix(r["rule"].(string), rule) {
			t.Errorf("%s: refusal names rule %q, want %q", what, r["rule"], rule)
		}
	}
	create := func(dir, name string) error {
		_, _, _, err := e.mustWalk(dir).Create(name, p9.WriteOnly, 0o755, 0, 0)
		return err
	}

	// git config core.fsmonitor / hooksPath / sshCommand ... rewrite the
	// config through a lock file and a rename; or open it for writing.
	_, _, err := e.mustWalk(".git/config").Open(p9.ReadWrite)
	refused("open .git/config rw", err, unix.EROFS, "open", "/work/.git/config")
	err = e.mustWalk(".git/config").SetAttr(p9.SetAttrMask{Size: true}, p9.SetAttr{Size: 0})
	refused("truncate .git/config", err, unix.EROFS, "setattr", "/work/.git/config")
	refused("git config's lock file", create(".git", "config.lock"), unix.EROFS, "create", "/work/.git/config.lock")
	if err := create(".git", "config.tmp"); err != nil {
		t.Fatal(err)
	}
	err = e.mustWalk(".git").RenameAt("config.tmp", e.mustWalk(".git"), "config")
	refused("rename a file over .git/config", err, unix.EROFS, "rename", "/work/.git/config")
	err = e.mustWalk("").RenameAt("evil", e.mustWalk(".git"), "config")
	refused("mv evil .git/config", err, unix.EROFS, "rename", "/work/.git/config")
	refused("rm .git/config", e.mustWalk(".git").UnlinkAt("config", 0), unix.EROFS, "unlink", "/work/.git/config")
	err = e.mustWalk(".git").RenameAt("config", e.mustWalk(""), "config.saved")
	refused("mv .git/config away", err, unix.EROFS, "rename", "/work/.git/config")
	refused("config.worktree", create(".git", "config.worktree"), unix.EROFS, "create", "/work/.git/config.worktree")
	refused("commondir", create(".git", "commondir"), unix.EROFS, "create", "/work/.git/commondir")

	// Hooks, in a repository with a hooks directory and in one without.
	refused("write a hook", create(".git/hooks", "pre-commit"), unix.EROFS, "create", "/work/.git/hooks/pre-commit")
	_, err = e.mustWalk("sub/nested/.git").Mkdir("hooks", 0o755, 0, 0)
	refused("mkdir a missing hooks directory", err, unix.EROFS, "mkdir", "/work/sub/nested/.git/hooks")
	_, err = e.mustWalk(".git/hooks").Symlink("../../evil", "post-checkout", 0, 0)
	refused("symlink a hook", err, unix.EROFS, "symlink", "/work/.git/hooks/post-checkout")
	err = e.mustWalk(".git/hooks").Link(e.mustWalk("evil"), "pre-push")
	refused("hard link a hook", err, unix.EROFS, "link", "/work/.git/hooks/pre-push")
	_, err = e.mustWalk("").Mkdir("hooks.new", 0o755, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = e.mustWalk("").RenameAt("hooks.new", e.mustWalk("sub/nested/.git"), "hooks")
	refused("mv a directory in as hooks", err, unix.EROFS, "rename", "/work/sub/nested/.git/hooks")
	refused("info/attributes", create(".git/info", "attributes"), unix.EROFS, "create", "/work/.git/info/attributes")

	// A hard link to the config, to write it under another name.
	err = e.mustWalk("").Link(e.mustWalk(".git/config"), "cfg")
	refused("ln .git/config cfg", err, unix.EACCES, "link", "/work/.git/config")

	// Swapping the repository: mv .git .git2 (edit) mv .git2 .git; a
	// gitfile or a new .git in another folder; moving the parent.
	err = e.mustWalk("").RenameAt(".git", e.mustWalk(""), ".git2")
	refused("mv .git .git2", err, unix.EROFS, "rename", "/work/.git")
	_, err = e.mustWalk("").Mkdir("fake", 0o755, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	refused("gitfile", create("fake", ".git"), unix.EROFS, "create", "/work/fake/.git")
	_, err = e.mustWalk("fake").Mkdir(".git", 0o755, 0, 0)
	refused("new repository", err, unix.EROFS, "mkdir", "/work/fake/.git")
	refused("bare repository", create("fake", "HEAD"), unix.EROFS, "create", "/work/fake/HEAD")
	err = e.mustWalk("").RenameAt("sub", e.mustWalk(""), "sub2")
	if !errIs(err, unix.EXDEV) {
		t.Errorf("mv sub sub2 (holds a repository): got %v, want EXDEV", err)
	}

	// direnv and editors.
	_, err = e.mustWalk("").Symlink("evil", ".envrc", 0, 0)
	refused("symlink .envrc", err, unix.EROFS, "symlink", "/work/.envrc")
	refused(".envrc", create("sub", ".envrc"), unix.EROFS, "create", "/work/sub/.envrc")
	refused("tasks.json", create(".vscode", "tasks.json"), unix.EROFS, "create", "/work/.vscode/tasks.json")
	_, _, err = e.mustWalk(".vscode/settings.json").Open(p9.WriteOnly)
	refused("settings.json", err, unix.EROFS, "open", "/work/.vscode/settings.json")
	_, err = e.mustWalk("sub").Mkdir(".idea", 0o755, 0, 0)
	refused(".idea", err, unix.EROFS, "mkdir", "/work/sub/.idea")
	_, err = e.mustWalk("").Mkdir(".devcontainer", 0o755, 0, 0)
	refused(".devcontainer", err, unix.EROFS, "mkdir", "/work/.devcontainer")
	refused(".gitmodules", create("", ".gitmodules"), unix.EROFS, "create", "/work/.gitmodules")

	// Nothing of it reached the host.
	if b, _ := os.ReadFile(filepath.Join(e.dir, ".git/config")); string(b) != "[core]\n\trepositoryformatversion = 0\n" {
		t.Errorf(".git/config on the host is now %q", b)
	}
	for _, p := range []string{".git/hooks/pre-commit", ".git/hooks/post-checkout", ".git/hooks/pre-push", "sub/nested/.git/hooks",
		".git/info/attributes", ".git2", "fake/.git", "fake/HEAD", ".envrc", "sub/.envrc", ".vscode/tasks.json", ".devcontainer", ".gitmodules", "cfg"} {
		if _, err := os.Lstat(filepath.Join(e.dir, p)); err == nil {
			t.Errorf("%s exists on the host", p)
		}
	}

	// The rest of .git is git's to write: objects, refs, HEAD, the index.
	if err := create(".git/objects", "obj"); err != nil {
		t.Errorf("write an object: %v", err)
	}
	if err := create(".git", "HEAD.lock"); err != nil {
		t.Fatal(err)
	}
	if err := e.mustWalk(".git").RenameAt("HEAD.lock", e.mustWalk(".git"), "HEAD"); err != nil {
		t.Errorf("update HEAD: %v", err)
	}
	if err := create(".git/refs/heads", "feature"); err != nil {
		t.Errorf("create a branch: %v", err)
	}
}

// TestWritesNotedOncePerPath: the gateway notes each guest path the guest
// changed once (what `smx profile learn` reads), not reads, not refused
// writes, and not every write(2).
func TestWritesNotedOncePerPath(t *testing.T) {
	e := newEnv(t, testProfile, false)
	f, _, _, err := e.mustWalk("src").Create("new.go", p9.WriteOnly, 0o644, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := f.WriteAt([]byte("x"), int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	if _, err := e.read("src/a.go"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.mustWalk(".github/ci.yml").Open(p9.WriteOnly); err == nil {
		t.Fatal("write to .github/ci.yml allowed")
	}
	if _, err := e.root.Mkdir("out", 0o755, 0, 0); err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var got []string
	for _, w := range e.wrote {
		got = append(got, fmt.Sprintf("%s %s %v", w["op"], w["path"], strings.Contains(w["rule"].(string), "files.rules[0]")))
	}
	want := []string{"create /work/src/new.go true", "mkdir /work/out true"}
	if !slices.Equal(got, want) {
		t.Fatalf("noted writes %q, want %q", got, want)
	}

	// Past the cap, one overflow record and nothing more.
	w := newWroteSet(func(f map[string]any) { got = append(got, fmt.Sprint(f["path"])) })
	got = nil
	for i := 0; i < wroteKeys+10; i++ {
		w.note("create", fmt.Sprintf("/work/f%d", i), "r")
	}
	if len(got) != wroteKeys+1 || got[len(got)-1] != "*" {
		t.Fatalf("%d records past the cap, last %q", len(got), got[len(got)-1])
	}
}

// BenchmarkWriteNotes: what noting each written path once (file.write,
// for `smx profile learn`) costs, side by side with the gateway not
// noting: creates (each a new path, so each noted) and 4 KiB writes to
// one file (noted once, then one map lookup per write).
func BenchmarkWriteNotes(b *testing.B) {
	per := map[string]time.Duration{}
	for _, c := range []struct {
		name   string
		noting bool
	}{{"create/off", false}, {"create/on", true}, {"write4k/off", false}, {"write4k/on", true}} {
		b.Run(c.name, func(b *testing.B) {
			e := newEnvOwner(b, testProfile, false, Owner{}, nil)
			if !c.noting {
				e.gw.wrote = newWroteSet(nil)
			}
			buf := make([]byte, 4096)
			var f p9.File
			if strings.HasPrefix(c.name, "write") {
				var err error
				if f, _, _, err = e.mustWalk("src").Create("big", p9.ReadWrite, 0o644, 0, 0); err != nil {
					b.Fatal(err)
				}
				defer f.Close()
			}
			b.SetBytes(4096)
			start := time.Now()
			for i := 0; i < b.N; i++ {
				if f != nil {
					if _, err := f.WriteAt(buf, int64(i%256)*4096); err != nil {
						b.Fatal(err)
					}
					continue
				}
				nf, _, _, err := e.mustWalk("src").Create("f"+strconv.Itoa(i), p9.ReadWrite, 0o644, 0, 0)
				if err != nil {
					b.Fatal(err)
				}
				nf.Close()
			}
			per[c.name] = time.Since(start) / time.Duration(b.N)
		})
	}
	for _, op := range []string{"create", "write4k"} {
		if off, on := per[op+"/off"], per[op+"/on"]; off > 0 && on > 0 {
			b.Logf("%s: noting writes takes %.3fx the time of not noting (%v vs %v)", op, float64(on)/float64(off), on, off)
		}
	}
}

// BenchmarkWroteNoteSeen: the cost a write to an already-noted path adds
// to the gateway's decision (compare with a 9P write round trip in
// BenchmarkWriteNotes/write4k).
func BenchmarkWroteNoteSeen(b *testing.B) {
	w := newWroteSet(func(map[string]any) {})
	w.note("write", "/work/src/big", "r")
	for i := 0; i < b.N; i++ {
		w.note("write", "/work/src/big", "r")
	}
}

// TestXattrWalkHiddenIsAbsent: an attribute outside the user namespace is
// absent to the guest (Rlerror ENODATA), not present and empty, which
// overlayfs would take for trusted.overlay.metacopy on a read-only cache's
// files; user attributes still reach the gateway.
func TestXattrWalkHiddenIsAbsent(t *testing.T) {
	e := newEnv(t, testProfile, false)
	a, b := net.Pipe()
	go e.gw.Serve(a)
	defer b.Close()
	b.SetDeadline(time.Now().Add(10 * time.Second))
	str := func(s string) []byte { return append(binary.LittleEndian.AppendUint16(nil, uint16(len(s))), s...) }
	u32 := func(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
	call := func(typ byte, tag uint16, body ...[]byte) (byte, []byte) {
		t.Helper()
		msg := []byte{0, 0, 0, 0, typ}
		msg = binary.LittleEndian.AppendUint16(msg, tag)
		for _, p := range body {
			msg = append(msg, p...)
		}
		binary.LittleEndian.PutUint32(msg, uint32(len(msg)))
		if _, err := b.Write(msg); err != nil {
			t.Fatal(err)
		}
		hdr := make([]byte, 7)
		if _, err := io.ReadFull(b, hdr); err != nil {
			t.Fatal(err)
		}
		rest := make([]byte, binary.LittleEndian.Uint32(hdr)-7)
		if _, err := io.ReadFull(b, rest); err != nil {
			t.Fatal(err)
		}
		if got := binary.LittleEndian.Uint16(hdr[5:]); got != tag {
			t.Fatalf("answer to tag %d came with tag %d", tag, got)
		}
		return hdr[4], rest
	}
	if typ, _ := call(100, 0xffff, u32(1<<16), str("9P2000.L")); typ != 101 {
		t.Fatalf("Tversion answered with type %d", typ)
	}
	if typ, _ := call(104, 1, u32(1), u32(^uint32(0)), str("root"), str(""), u32(0)); typ != 105 {
		t.Fatalf("Tattach answered with type %d", typ)
	}
	for i, name := range []string{"trusted.overlay.metacopy", "security.capability", "trusted.overlay.redirect"} {
		typ, body := call(30, uint16(2+i), u32(1), u32(uint32(10+i)), str(name))
		if typ != 7 || binary.LittleEndian.Uint32(body) != uint32(unix.ENODATA) {
			t.Fatalf("Txattrwalk %s: type %d body %v; want Rlerror ENODATA", name, typ, body)
		}
	}
	// A user attribute is the gateway's to answer; the session goes on.
	if typ, _ := call(30, 9, u32(1), u32(20), str("user.none")); typ == 7 {
		t.Log("user.none: Rlerror (p9's answer)")
	}
	if typ, _ := call(30, 10, u32(1), u32(21), str("trusted.x")); typ != 7 {
		t.Fatalf("after a user attribute, Txattrwalk trusted.x answered with type %d", typ)
	}
	// The list of a file without attributes is empty, not one empty name
	// (which overlayfs's copy up would then fail to get).
	typ, body := call(30, 11, u32(1), u32(22), str(""))
	if typ != 31 || len(body) != 8 || binary.LittleEndian.Uint64(body) != 0 {
		t.Fatalf("Txattrwalk listing a file without attributes: type %d body %v; want Rxattrwalk size 0", typ, body)
	}
}
