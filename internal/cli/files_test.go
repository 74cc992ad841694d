package cli_test

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"smx/internal/testutil"
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
	dir := t.TempDir()
	for name, body := range map[string]string{
		".env":           "SECRET-ENV\n",
		".github/ci.yml": "on: push\n",
		"src/a.txt":      "hello\n",
		"src/k.pem":      "SECRET-PEM\n",
		"secret/f":       "SECRET-DIR\n",
		"pub/f":          "PUBLIC\n",
	} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
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
	if len(res) != 24 {
		t.Fatalf("only %d steps reported: %v", len(res), res)
	}
	// Errors as documented: hidden → ENOENT, denied new name → EACCES,
	// read-only → EROFS, never-created kinds → EPERM.
	for step, msg := range map[string]string{
		"read-env": "No such file", "read-dotdot": "No such file", "read-pem": "No such file", "read-secret": "No such file",
		"create-env": "Permission denied", "create-pem": "Permission denied", "write-ro": "Read-only", "rm-ro": "Read-only",
		"symlink-abs": "not permitted", "symlink-out": "not permitted", "symlink-denied": "Permission denied",
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
	for _, name := range []string{"src/new.pem", "src/l1", "src/l2", "src/l3", "src/h1", "src/fifo", "src/null", "src/b.pem"} {
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
	expectRefusal(t, recs, "link", "/work/.github/ci.yml", rules+`\[4\]`)
	expectRefusal(t, recs, "rename", "/work/.env", rules+`\[1\]`)
	expectRefusal(t, recs, "rename", "/work/src/b.pem", rules+`\[2\]`)
	expectRefusal(t, recs, "mknod", "/work/src/fifo", "builtin: file gateway")
	expectRefusal(t, recs, "mknod", "/work/src/null", "builtin: file gateway")
	expectRefusal(t, recs, "connect", "/work", "builtin: file gateway")
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
