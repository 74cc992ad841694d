package fsgw

import (
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"

	"smx/internal/policy"
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
	t    *testing.T
	dir  string
	gw   *Gateway
	root p9.File

	mu      sync.Mutex
	refused []map[string]any
}

func newEnv(t *testing.T, profile string, ro bool) *env {
	t.Helper()
	dir := t.TempDir()
	for name, body := range map[string]string{
		".env":             "SECRET\n",
		"src/a.go":         "package a\n",
		"src/keys/k.pem":   "KEY\n",
		".github/ci.yml":   "on: push\n",
		"docs/readme.txt":  "hi\n",
		"docs/sub/more.md": "more\n",
	} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	prof, err := policy.Parse("test.yaml", []byte(profile), nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dir: dir}
	e.gw, err = New(Config{
		Host:    dir,
		Mount:   policy.FileMount{Guest: "/work", ReadOnly: ro, Rule: "-v " + dir + ":/work"},
		Profile: func() *policy.Profile { return prof },
		Refused: func(f map[string]any) { e.mu.Lock(); e.refused = append(e.refused, f); e.mu.Unlock() },
	})
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
	c, err := p9.NewClient(cliConn, p9.WithMessageSize(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); <-done })
	if e.root, err = c.Attach("/"); err != nil {
		t.Fatal(err)
	}
	return e
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
