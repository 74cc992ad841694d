package cli_test

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/testutil"
	"github.com/smx-dev/smx/internal/vm"
)

// The files tests mount real host folders into real guests and attack the
// rules from inside: each trick is checked in what the guest saw, in what
// the host folder holds afterwards, and in the log.

const filesProfile = `files:
  rules:
    - path: /work/**
      access: rw
    - path: /work/.env
      access: deny
    - path: /work/**/*.pem
      access: deny
    - path: /work/secret/**
      access: deny
    - path: /work/.github/**
      access: ro
`

// filesDir makes a host folder to share.
func filesDir(t *testing.T) string {
	t.Helper()
	return testutil.WriteTree(t, t.TempDir(), map[string]string{
		".env":           "SECRET-ENV\n",
		".github/ci.yml": "on: push\n",
		"src/a.txt":      "hello\n",
		"src/k.pem":      "SECRET-PEM\n",
		"secret/f":       "SECRET-DIR\n",
		"pub/f":          "PUBLIC\n",
	})
}

func writeProfile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "files.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func (v *vmEnv) sh(script string) (string, error) {
	return v.smx("agent", "exec", v.name, "--", "sh", "-c", script)
}

// fileRefusals reads the file.refused records of the sandbox's log.
func (v *vmEnv) fileRefusals(t *testing.T) []logRecord {
	t.Helper()
	out, err := v.cmd("agent", "logs", v.name, "--json", "--refusals").Output()
	if err != nil {
		t.Fatalf("logs: %v", err)
	}
	var recs []logRecord
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r logRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if r.Kind == "file.refused" {
			recs = append(recs, r)
		}
	}
	return recs
}

func expectRefusal(t *testing.T, recs []logRecord, op, path, rule string) {
	t.Helper()
	for _, r := range recs {
		if r.f("op") == op && r.f("path") == path && regexp.MustCompile(rule).MatchString(r.f("rule")) && r.f("reason") != "" {
			return
		}
	}
	var seen []string
	for _, r := range recs {
		seen = append(seen, r.f("op")+" "+r.f("path")+" "+r.f("rule"))
	}
	t.Errorf("no file.refused record op=%s path=%s rule~%s among:\n%s", op, path, rule, strings.Join(seen, "\n"))
}

// steps runs shell steps in the guest and returns each one's outcome:
// "ok" or the error the guest saw.
func (v *vmEnv) steps(t *testing.T, steps [][2]string) map[string]string {
	t.Helper()
	var sb strings.Builder
	for _, s := range steps {
		sb.WriteString("if ( " + s[1] + " ) >/tmp/o 2>/tmp/e; then echo '" + s[0] + "=ok'; else echo \"" + s[0] + "=$(head -c 200 /tmp/e | tr '\\n' ' ')\"; fi\n")
	}
	out, err := v.sh(sb.String())
	if err != nil {
		t.Fatalf("steps: %v\n%s", err, out)
	}
	res := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, val, ok := strings.Cut(l, "="); ok {
			res[k] = val
		}
	}
	return res
}

func TestFilesRulesFromGuest(t *testing.T) {
	dir := filesDir(t)
	v := startSandbox(t, "files-rules", "--profile", writeProfile(t, filesProfile), "-v", dir+":/work")

	res := v.steps(t, [][2]string{
		{"list", "ls -a /work /work/src | tr '\\n' ' ' >&2; ! ls -a /work /work/src | grep -e '^.env$' -e pem -e secret"},
		{"read-env", "cat /work/.env"},
		{"read-dotdot", "cat /work/src/../.env"},
		{"read-pem", "cat /work/src/k.pem"},
		{"read-secret", "cat /work/secret/f"},
		{"create-env", "echo x > /work/.env"},
		{"create-pem", "echo x > /work/src/new.pem"},
		{"write-ro", "echo x >> /work/.github/ci.yml"},
		{"rm-ro", "rm /work/.github/ci.yml"},
		{"read-ro", "cat /work/.github/ci.yml"},
		{"symlink-abs", "ln -s /etc/passwd /work/src/l1"},
		{"symlink-out", "ln -s ../../../etc /work/src/l2"},
		{"symlink-denied", "ln -s ../.env /work/src/l3"},
		{"symlink-ok", "ln -s a.txt /work/src/l4 && cat /work/src/l4"},
		// Inside where it is made; moved two levels up it would climb
		// above the mount on the host: the rename is refused, and so is
		// the copy mv makes of a directory holding such a link.
		{"symlink-move-up", "mkdir -p /work/src/a/b && ln -s ../../../pub/f /work/src/a/b/l && cat /work/src/a/b/l && mv /work/src/a/b/l /work/src/l5"},
		{"symlink-dir-move-up", "mkdir -p /work/src/c/d && ln -s ../../../pub /work/src/c/d/up && mv /work/src/c /work/c2"},
		// Through the host folder's parent, back in by the guest's name
		// for it: on the host that is a sibling folder called work.
		{"symlink-mount-name", "ln -s ../work/pub/f /work/wl"},
		{"hardlink-ro", "ln /work/.github/ci.yml /work/src/h1"},
		{"rename-onto-denied", "mv /work/src/a.txt /work/.env"},
		{"rename-to-pem", "cp /work/src/a.txt /work/src/b.txt && mv /work/src/b.txt /work/src/b.pem"},
		{"mknod-fifo", "mknod /work/src/fifo p"},
		{"mknod-dev", "mknod /work/src/null c 1 3"},
		{"setuid", "echo '#!/bin/sh' > /work/src/s && chmod 6755 /work/src/s"},
		{"write", "echo data > /work/src/new.txt && cat /work/src/new.txt"},
		{"rename-across", "mkdir -p /work/src/d1 /work/src/d2 && echo m > /work/src/d1/f && mv /work/src/d1/f /work/src/d2/f && cat /work/src/d2/f"},
		{"mv-dir-with-secret", "mkdir /work/src/kd && echo k > /work/src/kd/x.txt && mv /work/src/kd /work/kd && test -f /work/kd/x.txt"},
		// 9P straight to the gateway from an unprivileged port: closed.
		{"raw-9p", "printf '\\023\\0\\0\\0d\\377\\377\\0\\0\\020\\0\\010\\0009P2000.L' | nc 10.0.2.2 5640 | wc -c | grep -qx 0"},
	})
	wantOK := map[string]bool{"raw-9p": true, "list": true, "read-ro": true, "symlink-ok": true, "setuid": true, "write": true, "rename-across": true, "mv-dir-with-secret": true}
	for k, r := range res {
		if wantOK[k] != (r == "ok") {
			t.Errorf("step %s: %s (want ok=%v)", k, r, wantOK[k])
		}
	}
	if len(res) != 27 {
		t.Fatalf("only %d steps reported: %v", len(res), res)
	}
	// Errors as documented: hidden → ENOENT, denied new name → EACCES,
	// read-only → EROFS, never-created kinds → EPERM.
	for step, msg := range map[string]string{
		"read-env": "No such file", "read-dotdot": "No such file", "read-pem": "No such file", "read-secret": "No such file",
		"create-env": "Permission denied", "create-pem": "Permission denied", "write-ro": "Read-only", "rm-ro": "Read-only",
		"symlink-abs": "not permitted", "symlink-out": "not permitted", "symlink-denied": "Permission denied",
		"symlink-move-up": "not permitted", "symlink-dir-move-up": "not permitted", "symlink-mount-name": "not permitted",
		"mknod-fifo": "not permitted", "mknod-dev": "not permitted",
	} {
		if !strings.Contains(res[step], msg) {
			t.Errorf("step %s: guest saw %q, want %q", step, res[step], msg)
		}
	}

	// The host folder.
	for name, want := range map[string]string{".env": "SECRET-ENV\n", ".github/ci.yml": "on: push\n", "src/new.txt": "data\n", "src/d2/f": "m\n", "kd/x.txt": "k\n"} {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(b) != want {
			t.Errorf("host %s = %q, %v; want %q", name, b, err, want)
		}
	}
	for _, name := range []string{"src/new.pem", "src/l1", "src/l2", "src/l3", "src/h1", "src/fifo", "src/null", "src/b.pem", "src/l5", "c2/d/up", "wl"} {
		if _, err := os.Lstat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("host has %s (%v)", name, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, "src/s")); err != nil || fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
		t.Errorf("host src/s: %v, %v: want no set-id bits", fi.Mode(), err)
	}

	// The log.
	recs := v.fileRefusals(t)
	rules := `/files.yaml:\d+:\d+ files.rules` // the user's profile file and line (the frozen copy keeps them)
	expectRefusal(t, recs, "walk", "/work/.env", rules+`\[1\] deny /work/.env`)
	expectRefusal(t, recs, "walk", "/work/src/k.pem", rules+`\[2\]`)
	expectRefusal(t, recs, "walk", "/work/secret", rules+`\[3\]`)
	expectRefusal(t, recs, "create", "/work/src/new.pem", rules+`\[2\]`)
	expectRefusal(t, recs, "open", "/work/.github/ci.yml", rules+`\[4\] ro`)
	expectRefusal(t, recs, "unlink", "/work/.github/ci.yml", rules+`\[4\] ro`)
	expectRefusal(t, recs, "symlink", "/work/src/l1", "builtin: file gateway")
	expectRefusal(t, recs, "symlink", "/work/src/l2", "builtin: file gateway")
	expectRefusal(t, recs, "symlink", "/work/src/l3", "builtin: file gateway")
	expectRefusal(t, recs, "rename", "/work/src/a/b/l", "builtin: file gateway")
	expectRefusal(t, recs, "rename", "/work/src/c", "builtin: file gateway")
	expectRefusal(t, recs, "symlink", "/work/c2/d/up", "builtin: file gateway")
	expectRefusal(t, recs, "symlink", "/work/wl", "builtin: file gateway")
	expectRefusal(t, recs, "link", "/work/.github/ci.yml", rules+`\[4\]`)
	expectRefusal(t, recs, "rename", "/work/.env", rules+`\[1\]`)
	expectRefusal(t, recs, "rename", "/work/src/b.pem", rules+`\[2\]`)
	expectRefusal(t, recs, "mknod", "/work/src/fifo", "builtin: file gateway")
	expectRefusal(t, recs, "mknod", "/work/src/null", "builtin: file gateway")
	expectRefusal(t, recs, "connect", "/work", "builtin: file gateway")
}

// TestFilesOwnerMapping mounts a folder with uid=1000 (the image's
// unprivileged user): that user sees the host user's files as its own and
// writes into the mount; what it creates belongs to the host user on the
// host (run as root: the folder's owner, as under sudo); another host
// user's file shows as nobody's and stays unwritable; chown from the guest
// to anyone but the guest owner is refused, even for guest root, and never
// reaches the host.
func TestFilesOwnerMapping(t *testing.T) {
	dir := filesDir(t)
	// The host user: ours, or, run as root, the folder's owner (as under
	// `sudo smx ...` on a user's checkout): a user 4242 owns the folder.
	hostUID, hostGID := os.Getuid(), os.Getgid()
	other := os.Getuid() == 0 // only root can make files of other host users
	if other {
		hostUID, hostGID = 4242, 4242
		filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
			if err == nil {
				err = os.Lchown(p, hostUID, hostGID)
			}
			return err
		})
		if err := os.Chown(filepath.Join(dir, "pub/f"), 4343, 4343); err != nil {
			t.Fatal(err)
		}
	}
	v := startSandbox(t, "files-owner", "--profile", writeProfile(t, filesProfile), "-v", dir+":/work:uid=1000,gid=1000")

	asUser := func(script string) string {
		t.Helper()
		out, err := v.smx("agent", "exec", "-u", "user", v.name, "--", "sh", "-c", script)
		if err != nil {
			t.Fatalf("as user: %v\n%s", err, out)
		}
		return out
	}
	out := asUser(`id -u; stat -c 'owner %n %u:%g' /work /work/src/a.txt /work/pub/f
echo from-user > /work/src/u.txt && mkdir -p /work/src/ud/deep && echo x > /work/src/ud/deep/f && echo WRITE-OK
stat -c 'owner %n %u:%g' /work/src/u.txt /work/src/ud/deep/f
chown 0:0 /work/src/u.txt 2>&1 || echo USER-CHOWN-REFUSED
echo y >> /work/pub/f 2>&1 || echo OTHER-WRITE-REFUSED`)
	for _, want := range []string{"1000\n", "owner /work 1000:1000", "owner /work/src/a.txt 1000:1000", "WRITE-OK",
		"owner /work/src/u.txt 1000:1000", "owner /work/src/ud/deep/f 1000:1000", "u.txt: Operation not permitted\nUSER-CHOWN-REFUSED"} {
		if !strings.Contains(out, want) {
			t.Errorf("as user: no %q in\n%s", want, out)
		}
	}
	if other && (!strings.Contains(out, "owner /work/pub/f 65534:65534") || !strings.Contains(out, "OTHER-WRITE-REFUSED")) {
		t.Errorf("another host user's file: want it nobody's and unwritable:\n%s", out)
	}

	// Guest root cannot give files away either: the gateway refuses.
	res := v.steps(t, [][2]string{
		{"chown-root", "chown 0:0 /work/src/u.txt"},
		{"chown-other", "chown 4343 /work/src/u.txt"},
		{"chgrp-root", "chgrp 0 /work/src/ud"},
		{"chown-owner", "chown 1000:1000 /work/src/u.txt"},
		{"root-creates", "echo r > /work/src/r.txt && stat -c %u:%g /work/src/r.txt | grep -qx 1000:1000"},
		{"setuid", "cp /bin/sh /work/src/sh && chmod 4755 /work/src/sh"},
	})
	for step, want := range map[string]string{"chown-root": "not permitted", "chown-other": "not permitted", "chgrp-root": "not permitted",
		"chown-owner": "ok", "root-creates": "ok", "setuid": "ok"} {
		if got := res[step]; want == "ok" && got != "ok" || want != "ok" && !strings.Contains(got, want) {
			t.Errorf("as root, %s: %q, want %q", step, got, want)
		}
	}

	// On the host: everything the guest made is the host user's.
	if b, err := os.ReadFile(filepath.Join(dir, "src/u.txt")); err != nil || string(b) != "from-user\n" {
		t.Errorf("host src/u.txt = %q, %v", b, err)
	}
	for _, name := range []string{"src/u.txt", "src/ud", "src/ud/deep/f", "src/r.txt", "src/sh"} {
		fi, err := os.Lstat(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("host %s: %v", name, err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		if int(st.Uid) != hostUID || int(st.Gid) != hostGID || fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
			t.Errorf("host %s: %v %d:%d, want the host user's %d:%d without set-id bits", name, fi.Mode(), st.Uid, st.Gid, hostUID, hostGID)
		}
	}
	if other {
		if b, _ := os.ReadFile(filepath.Join(dir, "pub/f")); string(b) != "PUBLIC\n" {
			t.Errorf("another host user's file changed: %q", b)
		}
	}
	recs := v.fileRefusals(t)
	expectRefusal(t, recs, "chown", "/work/src/u.txt", "builtin: file gateway")
	expectRefusal(t, recs, "chown", "/work/src/ud", "builtin: file gateway")
}

// TestFilesSwapRace races renames and symlink swaps against reads through
// every name the guest can build: nothing denied is ever read.
func TestFilesSwapRace(t *testing.T) {
	dir := filesDir(t)
	// A symlink the host already had, into the denied directory.
	if err := os.Symlink("secret", filepath.Join(dir, "lnk")); err != nil {
		t.Fatal(err)
	}
	v := startSandbox(t, "files-race", "--profile", writeProfile(t, filesProfile), "-v", dir+":/work")
	out, err := v.sh(`cd /work
(i=0; while [ $i -lt 60 ]; do mv pub tmp; mv tmp pub; ln -s pub sw; rm sw; mkdir sw; echo X > sw/f; rm -r sw; i=$((i+1)); done) &
i=0; while [ $i -lt 120 ]; do cat pub/f tmp/f sw/f lnk/f secret/f src/../secret/f tmp/../secret/f 2>/dev/null; i=$((i+1)); done
wait; echo done`)
	if !strings.Contains(out, "done") {
		t.Fatalf("race script: %v\n%s", err, out)
	}
	if strings.Contains(out, "SECRET") {
		t.Fatalf("a denied file was read during the race:\n%s", out)
	}
	if !strings.Contains(out, "PUBLIC") {
		t.Fatalf("the allowed file was never read: the race proved nothing\n%.500s", out)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "secret/f")); string(b) != "SECRET-DIR\n" {
		t.Fatalf("host secret/f = %q", b)
	}
}

// TestFilesPolicyAndFaults: a profile change applies to the next
// operation, and a host folder removed under a running guest fails the
// guest's operations without hurting the sandbox.
func TestFilesPolicyAndFaults(t *testing.T) {
	dir := filesDir(t)
	v := startSandbox(t, "files-faults", "--profile", writeProfile(t, filesProfile), "-v", dir+":/work")
	if out, err := v.sh("cat /work/src/a.txt"); err != nil || out != "hello\n" {
		t.Fatalf("before: %q, %v", out, err)
	}
	stricter := writeProfile(t, filesProfile+"    - path: /work/src/**\n      access: deny\n")
	if out, err := v.smx("agent", "policy", v.name, stricter); err != nil {
		t.Fatalf("policy: %v\n%s", err, out)
	}
	if out, err := v.sh("cat /work/src/a.txt"); err == nil {
		t.Fatalf("after the profile denied src/, the guest still read it: %q", out)
	}
	expectRefusal(t, v.fileRefusals(t), "walk", "/work/src", `files.rules\[5\] deny /work/src/\*\*`)

	// The host folder goes away.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if out, err := v.sh("echo x > /work/pub/g"); err == nil {
		t.Fatalf("writing into a removed folder succeeded: %q", out)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the removed folder came back: %v", err)
	}
	if out, err := v.sh("ls /work; echo alive"); !strings.Contains(out, "alive") {
		t.Fatalf("sandbox unusable after its folder was removed: %v\n%s", err, out)
	}
}

// TestFilesGitInMountedRepo does real work in a mounted repository with
// the Debian image: git status (mmap, many stats) and git commit (lock
// files, renames, fsync), then checks the repository on the host.
func TestFilesGitInMountedRepo(t *testing.T) {
	testutil.RequireQEMU(t)
	bin := testutil.Binaries(t)
	home := vmHome(t, bin)
	img := testutil.DebianImage(t, home)
	repo := t.TempDir()
	git := func(args ...string) string {
		t.Helper()
		c := exec.Command("git", append([]string{"-C", repo, "-c", "user.name=host", "-c", "user.email=host@example.test"}, args...)...)
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	git("init", "-q", "-b", "main")
	for i := range 50 {
		p := filepath.Join(repo, "pkg", string(rune('a'+i%10)), "f"+strings.Repeat("x", i%7)+".txt")
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(strings.Repeat("line\n", i+1)), 0o644)
	}
	os.WriteFile(filepath.Join(repo, ".env"), []byte("SECRET\n"), 0o644)
	os.WriteFile(filepath.Join(repo, ".gitignore"), []byte(".env\n"), 0o644)
	git("add", "-A")
	git("commit", "-qm", "first")

	prof := writeProfile(t, "files:\n  rules:\n    - path: /work/**\n      access: rw\n    - path: /work/.env\n      access: deny\n    - path: /work/.git/hooks/**\n      access: ro\n")
	v := startSandbox(t, "files-git", "--image", img, "--profile", prof, "-v", repo+":/work", "--memory", "1G")
	out, err := v.sh(`set -e; cd /work
git config --global --add safe.directory /work
test -z "$(git status --porcelain)"
echo change >> pkg/a/f.txt
echo new > pkg/new.txt
git status --porcelain | sort | tr '\n' ' '
git add -A
git -c user.name=guest -c user.email=guest@example.test commit -qm "from the guest"
git log --oneline | wc -l
dd if=/dev/zero of=/work/big bs=1M count=1 seek=4400 2>/dev/null
tail -c 1048576 /work/big | wc -c
flock /work/lockfile -c 'echo locked'
sync /work/pkg/new.txt && echo synced
rm /work/big /work/lockfile`)
	if err != nil {
		t.Fatalf("guest git: %v\n%s", err, out)
	}
	for _, want := range []string{" M pkg/a/f.txt", "?? pkg/new.txt", " 2\n", "\n1048576\n", "locked", "synced"} {
		if !strings.Contains(out, want) {
			t.Errorf("guest output lacks %q:\n%s", want, out)
		}
	}
	if log := git("log", "--format=%an %s"); !strings.HasPrefix(log, "guest from the guest\n") {
		t.Errorf("host git log = %q", log)
	}
	git("fsck", "--strict")
	if st := git("status", "--porcelain"); st != "" {
		t.Errorf("host git status after the guest's commit = %q", st)
	}
	if b, _ := os.ReadFile(filepath.Join(repo, "pkg/new.txt")); string(b) != "new\n" {
		t.Errorf("host pkg/new.txt = %q", b)
	}

	// A change made on the host shows in the guest at once; rsync (temp
	// files, renames, many small files) and a clone through the mount
	// leave the same bytes on both sides. (--safe-links: links that leave
	// the tree would lead out of the mount, which the gateway refuses.)
	os.WriteFile(filepath.Join(repo, "pkg/b/f.txt"), []byte("host edit\n"), 0o644)
	out, err = v.sh(`set -e; cd /work
git status --porcelain
rsync -a --safe-links /usr/share/doc/git/ /work/docs/
git clone -q /work /root/clone && git -C /root/clone log --oneline | wc -l
cd /work/docs && find . -type f | LC_ALL=C sort | xargs sha256sum`)
	if err != nil {
		t.Fatalf("guest rsync/clone: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) < 4 || lines[0] != " M pkg/b/f.txt" || lines[1] != "2" {
		t.Fatalf("guest status/clone = %q", lines[:min(2, len(lines))])
	}
	guestSums := lines[2:]
	var hostSums []string // "./REL\x00line", sorted by REL as the guest's sort does
	docs := filepath.Join(repo, "docs")
	filepath.WalkDir(docs, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(docs, p)
		hostSums = append(hostSums, "./"+rel+"\x00"+fmt.Sprintf("%x  ./%s", sha256.Sum256(b), rel))
		return nil
	})
	sort.Strings(hostSums)
	for i, l := range hostSums {
		hostSums[i] = l[strings.IndexByte(l, 0)+1:]
	}
	if len(hostSums) < 10 || strings.Join(hostSums, "\n") != strings.Join(guestSums, "\n") {
		t.Errorf("rsync into the mount: host holds %d files, guest lists %d, or their contents differ", len(hostSums), len(guestSums))
	}
}

// TestFilesDiskFullAndNames: a full host disk is ENOSPC in the guest and
// nothing is reported written that the host does not hold; odd names
// (non-UTF-8, the longest allowed, too long) behave as on a local disk.
func TestFilesDiskFullAndNames(t *testing.T) {
	testutil.Require(t, os.Getuid() == 0, "root", "run as root to mount a small tmpfs as the host folder")
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=2m", "smx-test", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	v := startSandbox(t, "files-full", "--profile", writeProfile(t, "files: {}\n"), "-v", dir+":/work")
	out, err := v.sh(`dd if=/dev/zero of=/work/fill bs=64k count=100 2>&1; echo "rc=$?"`)
	if !strings.Contains(out, "No space left on device") || strings.Contains(out, "rc=0") {
		t.Fatalf("filling a 2 MiB host folder: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`(\d+)\+0 records out`).FindStringSubmatch(out)
	fi, serr := os.Stat(filepath.Join(dir, "fill"))
	if m == nil || serr != nil {
		t.Fatalf("dd said %q (want whole records only); host: %v", out, serr)
	}
	if n, _ := strconv.ParseInt(m[1], 10, 64); n*65536 != fi.Size() || n == 0 {
		t.Fatalf("guest dd reported %d blocks of 64 KiB written, the host file holds %d bytes", n, fi.Size())
	}

	long := strings.Repeat("n", 255)
	out, err = v.sh(`cd /work && rm fill && touch "$(printf 'bad\377name')" ` + long + ` && ls | wc -l && (touch ` + long + `x 2>&1 || true)`)
	if err != nil || !strings.Contains(out, "2\n") || !strings.Contains(out, "too long") {
		t.Fatalf("names: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "bad\xffname")); err != nil {
		t.Fatalf("non-UTF-8 name on the host: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, long)); err != nil {
		t.Fatalf("255-byte name on the host: %v", err)
	}
}

// TestFilesFDTransport keeps the control-channel relay (the transport
// measured against TCP, SMX_FILES_TRANSPORT=fd) working and enforcing.
func TestFilesFDTransport(t *testing.T) {
	t.Setenv("SMX_FILES_TRANSPORT", "fd")
	dir := filesDir(t)
	v := startSandbox(t, "files-fd", "--profile", writeProfile(t, filesProfile), "-v", dir+":/work")
	res := v.steps(t, [][2]string{
		{"mounted", "mount | grep -q 'on /work type 9p .*trans=fd'"},
		{"read", "cat /work/src/a.txt"},
		{"write", "echo fd > /work/src/fd.txt"},
		{"read-env", "cat /work/.env"},
		{"write-ro", "echo x >> /work/.github/ci.yml"},
	})
	for step, want := range map[string]string{"mounted": "ok", "read": "ok", "write": "ok", "read-env": "No such file", "write-ro": "Read-only"} {
		if !strings.Contains(res[step], want) {
			t.Errorf("step %s: %q, want %q", step, res[step], want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "src/fd.txt")); string(b) != "fd\n" {
		t.Errorf("host src/fd.txt = %q", b)
	}
	expectRefusal(t, v.fileRefusals(t), "walk", "/work/.env", `files.rules\[1\]`)
}

// TestFilesOpenAcrossRestore holds files and a working directory open in a
// mounted folder across a snapshot (relay transport): the fork reads on
// from where the source was, appends through the descriptor it inherited,
// and lists its working directory; the source goes on as well, and so does
// a suspended and resumed sandbox. Both sides are checked: what the guests
// saw and what the host folder holds. Only the first start asks for the
// relay.
func TestFilesOpenAcrossRestore(t *testing.T) {
	t.Setenv("SMX_FILES_TRANSPORT", "relay")
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "sub"), 0o755)
	os.WriteFile(filepath.Join(dir, "sub", "x.txt"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "in.txt"), []byte("line1\nline2\nline3\nline4\n"), 0o644)
	v := startSandbox(t, "files-keep", "--memory", "256M", "-v", dir+":/work")
	// Forks and resumes run supervisors that would mount with tcp: the
	// guest's relay state decides, so they keep the files all the same.
	os.Setenv("SMX_FILES_TRANSPORT", "tcp")
	// A daemon (its own session, so it outlives the exec that started it)
	// with the folder open: cwd, an append descriptor, a read descriptor.
	// Each time /tmp/go appears it logs the tag through fd 3, reads one
	// line from fd 4 and lists its working directory.
	daemon := `cat > /tmp/d.sh <<'X'
cd /work/sub || exit 1
exec 3>>/work/held.log 4</work/in.txt
while :; do
  if [ -e /tmp/go ]; then
    n=$(cat /tmp/go); rm /tmp/go
    echo "$n" >&3 || echo fail-write > /tmp/err.$n
    read -r l <&4 && echo "$l" > /tmp/read.$n || echo fail-read > /tmp/err.$n
    ls > /tmp/ls.$n 2>&1 || echo fail-ls > /tmp/err.$n
    touch /tmp/done.$n
  fi
  sleep 0.1
done
X
setsid sh /tmp/d.sh </dev/null >/dev/null 2>&1 &`
	if out, err := v.sh(daemon); err != nil {
		t.Fatalf("daemon: %v\n%s", err, out)
	}
	poke := func(name, tag, wantLine string) {
		t.Helper()
		script := `echo ` + tag + ` > /tmp/go; i=0; while [ ! -e /tmp/done.` + tag + ` ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
cat /tmp/err.` + tag + ` 2>/dev/null; cat /tmp/read.` + tag + ` /tmp/ls.` + tag
		out, err := v.smx("agent", "exec", name, "--", "sh", "-c", script)
		if err != nil || out != wantLine+"\nx.txt\n" {
			t.Fatalf("%s, %s: the held descriptors gave %q, %v; want %q then the listing", name, tag, out, err, wantLine)
		}
	}
	poke("files-keep", "before", "line1")
	if out, err := v.smx("snapshot", "create", "files-keep", "--name", "files-keep-s1"); err != nil {
		t.Fatalf("snapshot: %v\n%s", err, out)
	}
	t.Cleanup(func() { v.smx("snapshot", "rm", "files-keep-s1") })
	if out, err := v.smx("agent", "restore", "files-keep-s1", "--name", "files-keep-fork"); err != nil {
		t.Fatalf("restore: %v\n%s", err, out)
	}
	t.Cleanup(func() { v.smx("agent", "rm", "-f", "files-keep-fork") })
	poke("files-keep-fork", "fork", "line2")
	poke("files-keep", "source", "line2")
	poke("files-keep-fork", "fork2", "line3")
	if out, err := v.smx("agent", "suspend", "files-keep"); err != nil {
		t.Fatalf("suspend: %v\n%s", err, out)
	}
	if out, err := v.smx("agent", "resume", "files-keep"); err != nil {
		t.Fatalf("resume: %v\n%s", err, out)
	}
	poke("files-keep", "resumed", "line3")
	b, err := os.ReadFile(filepath.Join(dir, "held.log"))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Fields(string(b))
	want := []string{"before", "fork", "source", "fork2", "resumed"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("host held.log = %q, want %q", got, want)
	}
	// What the guest sees of the file is what the host holds.
	if out, err := v.sh("cat /work/held.log"); err != nil || out != string(b) {
		t.Errorf("guest held.log = %q, %v; host has %q", out, err, b)
	}
}

// fsProbe is a guest program for what the shell cannot do: bind a unix
// socket, take fcntl locks, set extended attributes, fsync. Each command
// prints NAME=ok or NAME=<the errno's text>.
const fsProbe = `package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"
)

func report(name string, err error) {
	var e syscall.Errno
	switch {
	case err == nil:
		fmt.Printf("%s=ok\n", name)
	case errors.As(err, &e):
		fmt.Printf("%s=%s\n", name, e.Error())
	default:
		fmt.Printf("%s=%v\n", name, err)
	}
}

func lock(p string) (*os.File, error) {
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	lk := syscall.Flock_t{Type: syscall.F_WRLCK}
	if err := syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &lk); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func main() {
	p := os.Args[2]
	switch os.Args[1] {
	case "socket":
		l, err := net.Listen("unix", p)
		if err == nil {
			l.Close()
		}
		report("socket", err)
	case "lock":
		f, err := lock(p)
		report("lock", err)
		if err == nil {
			f.Close()
		}
	case "hold": // lock, write our pid to argv[3], hold for a minute
		f, err := lock(p)
		if err != nil {
			report("hold", err)
			os.Exit(1)
		}
		os.WriteFile(os.Args[3], []byte(strconv.Itoa(os.Getpid())), 0o644)
		time.Sleep(time.Minute)
		f.Close()
	case "flock": // LOCK_EX on a file opened for reading
		f, err := os.Open(p)
		if err == nil {
			err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
			f.Close()
		}
		report("flock", err)
	case "xattr":
		report("set-user", syscall.Setxattr(p, "user.smx", []byte("from-guest"), 0))
		buf := make([]byte, 64)
		n, err := syscall.Getxattr(p, "user.smx", buf)
		if err == nil && string(buf[:n]) != "from-guest" {
			err = fmt.Errorf("read back %q", buf[:n])
		}
		report("get-user", err)
		// A well-formed file capability (revision 2, effective,
		// CAP_NET_BIND_SERVICE): the guest kernel checks the format.
		// smx's kernel has no 9p security xattr handler
		// (EOPNOTSUPP in the guest); Debian's sends it, and the gateway
		// refuses it (EPERM).
		fcap := []byte{1, 0, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
		report("set-security", syscall.Setxattr(p, "security.capability", fcap, 0))
		report("set-trusted", syscall.Setxattr(p, "trusted.smx", []byte("x"), 0))
	case "fsync":
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err == nil {
			_, err = f.WriteString("synced\n")
		}
		if err == nil {
			err = f.Sync()
		}
		if err == nil {
			err = f.Close()
		}
		report("fsync", err)
	}
}
`

// buildProbe builds fsProbe for the guest (static) into a new folder.
func buildProbe(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "probe.go"), []byte(fsProbe), 0o644); err != nil {
		t.Fatal(err)
	}
	c := exec.Command("go", "build", "-o", "probe", "probe.go")
	c.Dir = dir
	c.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("build the probe: %v\n%s", err, out)
	}
	os.Remove(filepath.Join(dir, "probe.go"))
	return dir
}

// TestFilesHostSemantics covers what the shell steps of
// TestFilesRulesFromGuest cannot: hard links the host already had between
// a hidden or read-only name and an allowed one, rm -r of a directory
// whose remaining entries are hidden, no socket on the host, fcntl locks
// that the host's locks and the guest's exclude each other, user xattrs
// (and no others), fsync, a sparse file past 4 GiB; on both sides and in
// the log.
func TestFilesHostSemantics(t *testing.T) {
	dir := filesDir(t)
	for _, l := range [][2]string{{".env", "src/config"}, {".github/ci.yml", "src/ci-link"}} {
		if err := os.Link(filepath.Join(dir, l[0]), filepath.Join(dir, l[1])); err != nil {
			t.Fatal(err)
		}
	}
	os.MkdirAll(filepath.Join(dir, "src/keys"), 0o755)
	os.WriteFile(filepath.Join(dir, "src/keys/k2.pem"), []byte("SECRET-PEM2\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "src/keys/pub.txt"), []byte("pub\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "src/lk"), nil, 0o644)
	probe := buildProbe(t)
	v := startSandbox(t, "files-sem", "--profile", writeProfile(t, filesProfile), "-v", dir+":/work", "-v", probe+":/probe:ro")

	const big = 4617089843 // past 4 GiB
	res := v.steps(t, [][2]string{
		{"hardlink-hidden", "cat /work/src/config"},
		{"hardlink-hidden-write", "echo x >> /work/src/config"},
		{"hardlink-ro-read", "cat /work/src/ci-link"},
		{"hardlink-ro-write", "echo x >> /work/src/ci-link"},
		{"rm-r-hidden", "rm -r /work/src/keys"},
		{"rm-r-left", "ls -A /work/src/keys | wc -l | grep -qx 0"},
		{"socket", "/probe/probe socket /work/src/sock | tee /dev/stderr | grep -q 'socket=operation not permitted'"},
		{"xattr", "/probe/probe xattr /work/src/a.txt | tr '\\n' ' ' | tee /dev/stderr | grep -Eq 'set-user=ok get-user=ok set-security=operation not (permitted|supported) set-trusted=operation not permitted'"},
		{"fsync", "/probe/probe fsync /work/src/synced | tee /dev/stderr | grep -qx fsync=ok"},
		// flock(LOCK_EX) on a file opened for reading: a write lock,
		// which the gateway takes on a descriptor open for writing only
		// where the guest may write.
		{"flock-rw", "/probe/probe flock /work/src/a.txt | tee /dev/stderr | grep -qx flock=ok"},
		{"flock-ro", "/probe/probe flock /work/.github/ci.yml | tee /dev/stderr | grep -qx 'flock=read-only file system'"},
		{"sparse", "printf MARK | dd of=/work/big bs=1 seek=" + strconv.Itoa(big) + " conv=notrunc 2>/dev/null && tail -c 4 /work/big | grep -qx MARK && stat -c %s /work/big | grep -qx " + strconv.Itoa(big+4)},
	})
	for step, want := range map[string]string{
		"hardlink-hidden": "Permission denied", "hardlink-hidden-write": "Permission denied",
		"hardlink-ro-read": "ok", "hardlink-ro-write": "Read-only",
		"rm-r-hidden": "Directory not empty", "rm-r-left": "ok",
		"socket": "ok", "xattr": "ok", "fsync": "ok", "sparse": "ok", "flock-rw": "ok", "flock-ro": "ok",
	} {
		if got := res[step]; want == "ok" && got != "ok" || want != "ok" && !strings.Contains(got, want) {
			t.Errorf("step %s: guest saw %q, want %q", step, got, want)
		}
	}

	// The host folder.
	for name, want := range map[string]string{".env": "SECRET-ENV\n", ".github/ci.yml": "on: push\n", "src/keys/k2.pem": "SECRET-PEM2\n", "src/synced": "synced\n"} {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(b) != want {
			t.Errorf("host %s = %q, %v; want %q", name, b, err, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, "src/keys/pub.txt")); !os.IsNotExist(err) {
		t.Errorf("rm -r left the visible src/keys/pub.txt: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "src/sock")); !os.IsNotExist(err) {
		t.Errorf("host has a socket src/sock: %v", err)
	}
	buf := make([]byte, 64)
	if n, err := unix.Getxattr(filepath.Join(dir, "src/a.txt"), "user.smx", buf); err != nil || string(buf[:n]) != "from-guest" {
		t.Errorf("host user.smx of src/a.txt = %q, %v", buf[:max(n, 0)], err)
	}
	if n, _ := unix.Getxattr(filepath.Join(dir, "src/a.txt"), "security.capability", buf); n > 0 {
		t.Errorf("host src/a.txt has security.capability")
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, "big"), &st); err != nil || st.Size != big+4 || st.Blocks*512 > 1<<20 {
		t.Errorf("host big: size %d, %d bytes allocated, %v; want %d bytes, sparse", st.Size, st.Blocks*512, err, big+4)
	}
	f, err := os.Open(filepath.Join(dir, "big"))
	if err != nil {
		t.Fatal(err)
	}
	mark := make([]byte, 4)
	f.ReadAt(mark, big)
	f.Close()
	if string(mark) != "MARK" {
		t.Errorf("host big at %d = %q", big, mark)
	}

	// fcntl locks: the host's lock keeps the guest out, then the guest's
	// keeps the host out.
	hf, err := os.OpenFile(filepath.Join(dir, "src/lk"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer hf.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK}
	if err := unix.FcntlFlock(hf.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		t.Fatal(err)
	}
	if out, _ := v.sh("/probe/probe lock /work/src/lk"); !strings.Contains(out, "lock=resource temporarily unavailable") {
		t.Errorf("guest lock while the host holds one: %q", out)
	}
	lk.Type = unix.F_UNLCK
	unix.FcntlFlock(hf.Fd(), unix.F_OFD_SETLK, &lk)
	if out, _ := v.sh("/probe/probe lock /work/src/lk"); out != "lock=ok\n" {
		t.Errorf("guest lock after the host released its own: %q", out)
	}
	out, err := v.sh(`setsid /probe/probe hold /work/src/lk /tmp/held </dev/null >/tmp/hold.out 2>&1 &
i=0; while [ ! -s /tmp/held ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; cat /tmp/held /tmp/hold.out`)
	if err != nil || strings.Contains(out, "hold=") {
		t.Fatalf("guest hold: %v %q", err, out)
	}
	lk.Type = unix.F_WRLCK
	if err := unix.FcntlFlock(hf.Fd(), unix.F_OFD_SETLK, &lk); err != unix.EAGAIN {
		t.Errorf("host lock while the guest holds one: %v, want EAGAIN", err)
	}
	v.sh("kill $(cat /tmp/held)")

	// The log.
	recs := v.fileRefusals(t)
	rules := `/files.yaml:\d+:\d+ files.rules`
	expectRefusal(t, recs, "open", "/work/src/config", rules+`\[1\] deny /work/.env`)
	expectRefusal(t, recs, "open", "/work/src/ci-link", rules+`\[4\] ro`)
	expectRefusal(t, recs, "rmdir", "/work/src/keys", rules+`\[2\]`)
	expectRefusal(t, recs, "mknod", "/work/src/sock", "builtin: file gateway")
	expectRefusal(t, recs, "setxattr", "/work/src/a.txt", "builtin: file gateway")
	expectRefusal(t, recs, "lock", "/work/.github/ci.yml", rules+`\[4\] ro`)
	for _, r := range recs {
		if r.f("op") == "rmdir" && !strings.Contains(r.f("reason"), `"k2.pem"`) {
			t.Errorf("rmdir refusal does not name what stayed: %s", r.f("reason"))
		}
	}
}

// goEnv is the environment of a Go build that needs no network: the
// toolchain as it is, modules from nowhere, no cgo (the guest has no C
// compiler), a build cache at cache.
func goEnv(cache, gopath string) []string {
	return []string{"CGO_ENABLED=0", "GOFLAGS=-mod=mod", "GOPROXY=off", "GOTOOLCHAIN=local", "GOSUMDB=off",
		"GOCACHE=" + cache, "GOPATH=" + gopath, "GOTELEMETRY=off"}
}

// TestFilesGoBuildAndFork builds a Go module in a mounted folder with the
// host's own toolchain mounted read-only, runs the
// result on both sides, and checks the guest built the very binary the
// host builds from the same source (Go builds are reproducible with
// -trimpath). Then a fork from a snapshot of that sandbox (default
// transport: its mounts are attached again) edits and builds again in
// the same folder, and the source sandbox sees the fork's edit. The host
// fills the build cache first (same toolchain, same flags: the guest finds
// the standard library compiled there and compiles only the module, which
// keeps the test to seconds under TCG instead of minutes).
func TestFilesGoBuildAndFork(t *testing.T) {
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	testutil.Require(t, err == nil, "a Go toolchain", "install Go")
	gr := strings.TrimSpace(string(goroot))
	repo := testutil.WriteTree(t, t.TempDir(), map[string]string{
		"go.mod":         "module example.test/hello\n\ngo 1.22\n",
		"greet/greet.go": "package greet\n\nfunc Hello(who string) string { return \"hello, \" + who }\n",
		"main.go":        "package main\n\nimport (\n\t\"fmt\"\n\n\t\"example.test/hello/greet\"\n)\n\nfunc main() { fmt.Println(greet.Hello(\"host\")) }\n",
	})
	hostBuild := func(out string) {
		t.Helper()
		c := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-o", out, ".")
		c.Dir = repo
		c.Env = append(os.Environ(), goEnv(filepath.Join(repo, ".gocache"), t.TempDir())...)
		if b, err := c.CombinedOutput(); err != nil {
			t.Fatalf("host go build: %v\n%s", err, b)
		}
	}
	hostBuild(filepath.Join(t.TempDir(), "warm"))
	run := func(p string) string {
		t.Helper()
		b, err := exec.Command(p).CombinedOutput()
		if err != nil {
			t.Fatalf("%s on the host: %v\n%s", p, err, b)
		}
		return string(b)
	}
	sum := func(p string) string {
		t.Helper()
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("%x", sha256.Sum256(b))
	}

	// (Under /opt: /usr is the guest system's. The go command finds its
	// GOROOT from where it runs; -trimpath keeps the path out of the
	// build, so the cache the host filled serves the guest.)
	start := time.Now()
	v := startSandbox(t, "files-go", "--memory", "512M", "-v", repo+":/work", "-v", gr+":/opt/go:ro")
	t.Logf("%v: started", time.Since(start).Round(time.Millisecond))
	build := func(name, who string) string {
		t.Helper()
		defer func() { t.Logf("%v: built in %s", time.Since(start).Round(time.Millisecond), name) }()
		script := "set -e; cd /work; export " + strings.Join(goEnv("/work/.gocache", "/tmp/gopath"), " ") + " HOME=/root PATH=/opt/go/bin:$PATH\n" +
			"sed -i 's/Hello(\"[a-z]*\")/Hello(\"" + who + "\")/' main.go\n" +
			"go build -trimpath -buildvcs=false -o hello .\n./hello\nsha256sum hello\n"
		out, err := v.smx("agent", "exec", name, "--", "sh", "-c", script)
		if err != nil {
			t.Fatalf("%s: go build in the guest: %v\n%s", name, err, out)
		}
		return out
	}
	out := build("files-go", "guest")
	hostBuild(filepath.Join(repo, "hello-host"))
	if want := "hello, guest\n" + sum(filepath.Join(repo, "hello")) + "  hello\n"; out != want {
		t.Errorf("guest build printed %q, want %q (its binary as the host holds it)", out, want)
	}
	if got := run(filepath.Join(repo, "hello")); got != "hello, guest\n" {
		t.Errorf("the guest's binary on the host printed %q", got)
	}
	if a, b := sum(filepath.Join(repo, "hello")), sum(filepath.Join(repo, "hello-host")); a != b {
		t.Errorf("the guest built %s, the host %s from the same source", a, b)
	}

	if out, err := v.smx("snapshot", "create", "files-go", "--name", "files-go-s1"); err != nil {
		t.Fatalf("snapshot: %v\n%s", err, out)
	}
	t.Cleanup(func() { v.smx("snapshot", "rm", "files-go-s1") })
	if out, err := v.smx("agent", "restore", "files-go-s1", "--name", "files-go-fork"); err != nil {
		t.Fatalf("restore: %v\n%s", err, out)
	}
	t.Cleanup(func() { v.smx("agent", "rm", "-f", "files-go-fork") })
	t.Logf("%v: snapshot and fork", time.Since(start).Round(time.Millisecond))
	out = build("files-go-fork", "fork")
	if want := "hello, fork\n" + sum(filepath.Join(repo, "hello")) + "  hello\n"; out != want {
		t.Errorf("fork build printed %q, want %q", out, want)
	}
	if got := run(filepath.Join(repo, "hello")); got != "hello, fork\n" {
		t.Errorf("the fork's binary on the host printed %q", got)
	}
	if out, err := v.sh("grep -c 'Hello(\"fork\")' /work/main.go && /work/hello"); err != nil || out != "1\nhello, fork\n" {
		t.Errorf("the source sandbox after the fork's build: %q, %v", out, err)
	}
}

// npmTarball writes an npm package tarball (package/ prefix, as npm pack
// makes it) holding files.
func npmTarball(t testing.TB, path string, files map[string]string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zw := gzip.NewWriter(f)
	tw := tar.NewWriter(zw)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		tw.WriteHeader(&tar.Header{Name: "package/" + n, Mode: 0o644, Size: int64(len(files[n])), Typeflag: tar.TypeReg})
		tw.Write([]byte(files[n]))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
}

// treeSums lists "sha256  ./rel" for every regular file under dir, sorted
// by name as the guest's `LC_ALL=C sort` does.
func treeSums(t *testing.T, dir string) []string {
	t.Helper()
	var sums []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		sums = append(sums, "./"+rel+"\x00"+fmt.Sprintf("%x  ./%s", sha256.Sum256(b), rel))
		return nil
	})
	sort.Strings(sums)
	for i, l := range sums {
		sums[i] = l[strings.IndexByte(l, 0)+1:]
	}
	return sums
}

// hostNode returns a folder holding the host's node binary (a hard link,
// or a copy) and the folder of the host's npm, to mount into a guest:
// the preset images carry node (Debian's) but not npm.
func hostNode(t testing.TB) (nodeDir, npmDir string) {
	t.Helper()
	node, err := exec.LookPath("node")
	testutil.Require(t, err == nil, "node", "install Node.js with npm")
	npm, err := exec.LookPath("npm")
	testutil.Require(t, err == nil, "npm", "install Node.js with npm")
	cli, err := filepath.EvalSymlinks(npm) // .../npm/bin/npm-cli.js
	if err != nil {
		t.Fatal(err)
	}
	npmDir = filepath.Dir(filepath.Dir(cli))
	nodeDir = t.TempDir()
	if err := os.Link(node, filepath.Join(nodeDir, "node")); err != nil {
		b, err := os.ReadFile(node)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(nodeDir, "node"), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return nodeDir, npmDir
}

// TestFilesNpmInstall runs `npm install` (offline) in a mounted project
// whose dependency is a local tarball, as the image's unprivileged user
// through uid=1000, with the host's node and npm mounted read-only (the
// claude preset's image has node's libraries): node_modules and the lock
// file land on the host, identical to what the guest sees, and the
// installed module runs on both sides. (The host's node is linked into
// its folder: a file whose other link lies outside the mount.)
func TestFilesNpmInstall(t *testing.T) {
	testutil.RequireQEMU(t)
	bin := testutil.Binaries(t)
	img := presetImage(t, vmHome(t, bin), "claude")
	nodeDir, npmDir := hostNode(t)
	app := t.TempDir()
	npmTarball(t, filepath.Join(app, "padder-1.0.0.tgz"), map[string]string{
		"package.json": `{"name": "padder", "version": "1.0.0", "main": "index.js"}` + "\n",
		"index.js":     "module.exports = (s, n) => ' '.repeat(Math.max(0, n - s.length)) + s;\n",
		"lib/util.js":  "exports.id = (x) => x;\n",
	})
	os.WriteFile(filepath.Join(app, "package.json"), []byte(`{"name": "app", "version": "1.0.0", "private": true, "dependencies": {"padder": "file:padder-1.0.0.tgz"}}`+"\n"), 0o644)
	os.WriteFile(filepath.Join(app, ".env"), []byte("SECRET\n"), 0o644)
	prof := writeProfile(t, "files:\n  rules:\n    - path: /work/**\n      access: rw\n    - path: /work/.env\n      access: deny\n")
	v := startSandbox(t, "files-npm", "--image", img, "--profile", prof, "--memory", "1G", "-v", app+":/work:uid=1000,gid=1000",
		"-v", nodeDir+":/opt/node:ro", "-v", npmDir+":/opt/npm:ro")
	out, err := v.smx("agent", "exec", "-u", "user", v.name, "--", "sh", "-c", `set -e; cd /work; export PATH=/opt/node:$PATH
node /opt/npm/bin/npm-cli.js install --offline --no-audit --no-fund --ignore-scripts --loglevel=error >/tmp/npm.log 2>&1 || { cat /tmp/npm.log; exit 1; }
node -e 'console.log("[" + require("padder")("x", 4) + "]")'
cd node_modules && find . -type f | LC_ALL=C sort | xargs sha256sum`)
	if err != nil {
		t.Fatalf("npm install in the guest: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if lines[0] != "[   x]" {
		t.Fatalf("the installed module in the guest printed %q\n%s", lines[0], out)
	}
	host := treeSums(t, filepath.Join(app, "node_modules"))
	if len(host) < 3 || strings.Join(host, "\n") != strings.Join(lines[1:], "\n") {
		t.Errorf("node_modules: host holds\n%s\nguest sees\n%s", strings.Join(host, "\n"), strings.Join(lines[1:], "\n"))
	}
	if b, err := os.ReadFile(filepath.Join(app, "package-lock.json")); err != nil || !strings.Contains(string(b), `"padder"`) {
		t.Errorf("host package-lock.json: %v\n%s", err, b)
	}
	if node, err := exec.LookPath("node"); err == nil {
		c := exec.Command(node, "-e", `console.log("[" + require("padder")("y", 3) + "]")`)
		c.Dir = app
		if b, err := c.CombinedOutput(); err != nil || string(b) != "[  y]\n" {
			t.Errorf("the guest's install on the host: %q, %v", b, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(app, ".env")); string(b) != "SECRET\n" {
		t.Errorf("host .env = %q", b)
	}
}

// requireVirtioFS runs a test with mounts on virtio-fs: it needs a QEMU of
// 8.2 or newer (SMX_QEMU may name one beside the distribution's 7.2).
func requireVirtioFS(t *testing.T) {
	t.Helper()
	line, err := vm.QEMUVersion(context.Background(), "")
	if err != nil || !vm.VirtioFSCapable(line) {
		t.Skipf("virtio-fs mounts need QEMU >= 8.2 (have %q): set SMX_QEMU to a newer QEMU (docs/install.md)", line)
	}
	t.Setenv("SMX_FILES_TRANSPORT", "virtiofs")
}

// TestFilesVirtioFS serves a mount over virtio-fs (the supervisor as the
// vhost-user-fs backend) and checks that reads and writes reach the host
// folder and every rule holds, with its record.
func TestFilesVirtioFS(t *testing.T) {
	requireVirtioFS(t)
	dir := filesDir(t)
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "src", "escape")); err != nil {
		t.Fatal(err)
	}
	v := startSandbox(t, "files-vfs", "--profile", writeProfile(t, filesProfile), "-v", dir+":/work")
	res := v.steps(t, [][2]string{
		{"mounted", "grep -q ' /work virtiofs ' /proc/mounts"},
		{"read", "cat /work/src/a.txt"},
		{"write", "echo vfs > /work/src/vfs.txt && cat /work/src/vfs.txt"},
		{"big", "dd if=/dev/urandom of=/tmp/big bs=64k count=40 2>/dev/null && cp /tmp/big /work/src/big && cmp /tmp/big /work/src/big"},
		{"read-env", "cat /work/.env"},
		{"write-ro", "echo x >> /work/.github/ci.yml"},
		{"host-symlink", "readlink /work/src/escape && head -c 4 /work/src/escape/ 2>&1; cat /work/src/escape | grep -q root"},
		{"symlink-abs", "ln -s /etc/passwd /work/src/l1"},
	})
	for step, want := range map[string]string{"mounted": "ok", "read": "ok", "write": "ok", "big": "ok",
		"read-env": "No such file", "write-ro": "Read-only", "symlink-abs": "not permitted"} {
		if !strings.Contains(res[step], want) {
			t.Errorf("step %s: %q, want %q", step, res[step], want)
		}
	}
	// The guest follows the host's symlink itself, to its own /etc/passwd:
	// the host never does, so whatever the guest reads is its own file.
	if b, _ := os.ReadFile(filepath.Join(dir, "src/vfs.txt")); string(b) != "vfs\n" {
		t.Errorf("host src/vfs.txt = %q", b)
	}
	if st, err := os.Stat(filepath.Join(dir, "src/big")); err != nil || st.Size() != 40*64<<10 {
		t.Errorf("host src/big: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "src/l1")); err == nil {
		t.Error("symlink to /etc/passwd made on the host")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, ".github/ci.yml")); string(b) != "on: push\n" {
		t.Errorf("host .github/ci.yml = %q", b)
	}
	recs := v.fileRefusals(t)
	expectRefusal(t, recs, "walk", "/work/.env", `files.rules\[1\]`)
	expectRefusal(t, recs, "open", "/work/.github/ci.yml", `files.rules\[4\]`)
	expectRefusal(t, recs, "symlink", "/work/src/l1", `builtin`)
}

// TestFilesVirtioFSOpenAcrossRestore holds files and a working directory
// open in a virtio-fs mount across a snapshot, a fork and a suspend: the
// device's node and handle tables travel in the saved state and are
// resolved again through the restoring sandbox's gateways. A fork under a
// narrower profile loses the file its profile denies (the descriptor the
// parent opened fails, the refusal is recorded) and keeps the rest; the
// source and a resumed sandbox go on reading and appending. Forks and
// resumes do not ask for virtio-fs: the saved machine decides.
func TestFilesVirtioFSOpenAcrossRestore(t *testing.T) {
	requireVirtioFS(t)
	dir := testutil.WriteTree(t, t.TempDir(), map[string]string{
		"sub/x.txt":   "",
		"in.txt":      "line1\nline2\nline3\nline4\n",
		"private.txt": "p1\np2\np3\np4\n",
	})
	wide := writeProfile(t, "files:\n  rules:\n    - path: /work/**\n      access: rw\n")
	narrow := writeProfile(t, "files:\n  rules:\n    - path: /work/**\n      access: rw\n    - path: /work/private.txt\n      access: deny\n")
	v := startSandbox(t, "files-vkeep", "--memory", "256M", "--profile", wide, "-v", dir+":/work")
	os.Setenv("SMX_FILES_TRANSPORT", "tcp")
	daemon := `cat > /tmp/d.sh <<'X'
cd /work/sub || exit 1
exec 3>>/work/held.log 4</work/in.txt 5</work/private.txt
while :; do
  if [ -e /tmp/go ]; then
    n=$(cat /tmp/go); rm /tmp/go
    echo "$n" >&3 || echo fail-write > /tmp/err.$n
    read -r l <&4 && echo "$l" > /tmp/read.$n || echo fail-read > /tmp/err.$n
    read -r p <&5 && echo "$p" > /tmp/priv.$n || echo no-private > /tmp/priv.$n
    ls > /tmp/ls.$n 2>&1 || echo fail-ls > /tmp/err.$n
    touch /tmp/done.$n
  fi
  sleep 0.1
done
X
setsid sh /tmp/d.sh </dev/null >/dev/null 2>&1 &`
	if out, err := v.sh(daemon); err != nil {
		t.Fatalf("daemon: %v\n%s", err, out)
	}
	poke := func(name, tag, wantLine, wantPriv string) {
		t.Helper()
		// The guest's page cache is dropped first: what the parent read
		// before the snapshot is in every fork's memory (no device can
		// take it back); each read here must reach the device.
		script := `echo 3 > /proc/sys/vm/drop_caches; echo ` + tag + ` > /tmp/go; i=0; while [ ! -e /tmp/done.` + tag + ` ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
cat /tmp/err.` + tag + ` 2>/dev/null; cat /tmp/read.` + tag + ` /tmp/priv.` + tag + ` /tmp/ls.` + tag
		out, err := v.smx("agent", "exec", name, "--", "sh", "-c", script)
		if want := wantLine + "\n" + wantPriv + "\nx.txt\n"; err != nil || out != want {
			t.Fatalf("%s, %s: the held descriptors gave %q, %v; want %q", name, tag, out, err, want)
		}
	}
	poke("files-vkeep", "before", "line1", "p1")
	start := time.Now()
	if out, err := v.smx("snapshot", "create", "files-vkeep", "--name", "files-vkeep-s1"); err != nil {
		t.Fatalf("snapshot: %v\n%s", err, out)
	}
	t.Logf("snapshot with a virtio-fs mount: %v", time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() { v.smx("snapshot", "rm", "files-vkeep-s1") })
	if out, err := v.smx("agent", "restore", "files-vkeep-s1", "--name", "files-vkeep-fork", "--profile", narrow); err != nil {
		t.Fatalf("restore: %v\n%s", err, out)
	}
	t.Cleanup(func() { v.smx("agent", "rm", "-f", "files-vkeep-fork") })
	poke("files-vkeep-fork", "fork", "line2", "no-private")
	poke("files-vkeep", "source", "line2", "p2")
	poke("files-vkeep-fork", "fork2", "line3", "no-private")
	if out, err := v.smx("agent", "suspend", "files-vkeep"); err != nil {
		t.Fatalf("suspend: %v\n%s", err, out)
	}
	if out, err := v.smx("agent", "resume", "files-vkeep"); err != nil {
		t.Fatalf("resume: %v\n%s", err, out)
	}
	poke("files-vkeep", "resumed", "line3", "p3")
	b, err := os.ReadFile(filepath.Join(dir, "held.log"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Fields(string(b)), "before fork source fork2 resumed"; strings.Join(got, " ") != want {
		t.Errorf("host held.log = %q, want %q", got, want)
	}
	if out, err := v.sh("cat /work/held.log"); err != nil || out != string(b) {
		t.Errorf("guest held.log = %q, %v; host has %q", out, err, b)
	}
	fork := &vmEnv{t: t, bin: v.bin, home: v.home, name: "files-vkeep-fork"}
	expectRefusal(t, fork.fileRefusals(t), "walk", "/work/private.txt", `files.rules\[1\]`)
	if b, _ := os.ReadFile(filepath.Join(dir, "private.txt")); string(b) != "p1\np2\np3\np4\n" {
		t.Errorf("host private.txt = %q", b)
	}
}

// startInfo reads how a sandbox's last start went from `agent inspect
// --json`: what it was restored from ("" for a boot) and how long it took.
func (v *vmEnv) startInfo(t *testing.T, name string) (restoredFrom string, bootMS float64) {
	t.Helper()
	out, err := v.cmd("agent", "inspect", name, "--json").Output()
	if err != nil {
		t.Fatalf("inspect %s: %v", name, err)
	}
	var find func(x any)
	find = func(x any) {
		switch x := x.(type) {
		case map[string]any:
			for k, e := range x {
				switch k {
				case "restored_from":
					restoredFrom, _ = e.(string)
				case "boot_ms":
					bootMS, _ = e.(float64)
				default:
					find(e)
				}
			}
		case []any:
			for _, e := range x {
				find(e)
			}
		}
	}
	var doc any
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("inspect %s: %v\n%s", name, err, out)
	}
	find(doc)
	return restoredFrom, bootMS
}

// TestFilesVirtioFSTemplate: the boot template of a shape with a virtio-fs
// mount holds the device (and its empty state): the first sandbox of the
// shape boots and saves it, the next one starts from it and mounts its
// own folder, which it reads and writes, and nothing of the first one's.
// The start times of both, and of the same pair without a mount, are
// logged: what the template saves and what the mount costs.
func TestFilesVirtioFSTemplate(t *testing.T) {
	requireVirtioFS(t)
	dirA := testutil.WriteTree(t, t.TempDir(), map[string]string{"a-only": "A\n"})
	dirB := testutil.WriteTree(t, t.TempDir(), map[string]string{"b-only": "B\n"})
	// A memory size of its own: no other test made this shape's template.
	a := startSandbox(t, "files-vtpl-a", "--memory", "208M", "-v", dirA+":/work")
	b := startSandbox(t, "files-vtpl-b", "--memory", "208M", "-v", dirB+":/work")
	fromA, msA := a.startInfo(t, "files-vtpl-a")
	fromB, msB := b.startInfo(t, "files-vtpl-b")
	if fromA != "" || !strings.HasPrefix(fromB, "template ") {
		t.Fatalf("restored from: first %q, second %q; want a boot, then the template", fromA, fromB)
	}
	if out, err := b.sh("ls /work && echo hi > /work/new && cat /work/b-only"); err != nil || out != "b-only\nB\n" {
		t.Errorf("the templated sandbox's mount: %q, %v", out, err)
	}
	if got, _ := os.ReadFile(filepath.Join(dirB, "new")); string(got) != "hi\n" {
		t.Errorf("host new = %q", got)
	}
	if _, err := os.Stat(filepath.Join(dirA, "new")); err == nil {
		t.Error("the write reached the first sandbox's folder")
	}
	os.Setenv("SMX_FILES_TRANSPORT", "tcp") // no mount, no device: the plain shape
	c := startSandbox(t, "files-vtpl-c", "--memory", "208M")
	d := startSandbox(t, "files-vtpl-d", "--memory", "208M")
	_, msC := c.startInfo(t, "files-vtpl-c")
	fromD, msD := d.startInfo(t, "files-vtpl-d")
	t.Logf("start with a virtio-fs mount: boot %.0f ms, from its template %.0f ms; without a mount: boot %.0f ms, from its template %.0f ms (%s)", msA, msB, msC, msD, fromD)
}
