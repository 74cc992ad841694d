package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestApprovalsFileWrite holds a real guest's write to a host folder in
// the file gateway until the host user answers from another process:
// allowed once, the file appears on the host with the content, and the
// next write asks again; denied, the guest gets "Permission denied" and the
// host file stays as it was; unanswered, the same at ask.timeout. While a
// write waits, the guest goes on reading and writing elsewhere in the same
// mount, and a file the host runs (.git/config) stays read-only without a
// question.
func TestApprovalsFileWrite(t *testing.T) { testApprovalsFileWrite(t, "ask-files") }

// TestApprovalsFileWriteVirtioFS is the same over virtio-fs, whose device
// serves one request queue: the held request hands it over.
func TestApprovalsFileWriteVirtioFS(t *testing.T) {
	requireVirtioFS(t)
	testApprovalsFileWrite(t, "ask-files-vfs")
}

func testApprovalsFileWrite(t *testing.T, name string) {
	dir := filesDir(t)
	os.MkdirAll(filepath.Join(dir, ".git"), 0o755)
	os.WriteFile(filepath.Join(dir, ".git/config"), []byte("[core]\n"), 0o644)
	profDir := t.TempDir()
	prof := filepath.Join(profDir, "askfiles.yaml")
	os.WriteFile(prof, []byte(`files:
  rules:
    - path: /work/**
      access: ask-write
    - path: /work/pub/**
      access: rw
    - path: /work/secret/**
      access: ask
ask:
  timeout: 90s
`), 0o644)
	v := startSandbox(t, name, "--profile", prof, "-v", dir+":/work")
	e := &egressEnv{vmEnv: v, dir: profDir}
	seen := map[string]bool{}
	host := func(rel string) string {
		b, err := os.ReadFile(filepath.Join(dir, rel))
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return string(b)
	}
	write := `echo %s > /work/src/a.txt; echo RC=$?`

	t.Run("once", func(t *testing.T) {
		done := e.bg(strings.Replace(write, "%s", "second-version", 1))
		a := e.waitApproval(t, seen)
		if a.Channel != "file" || a.What != "write /work/src/a.txt" || a.Sandbox != v.name ||
			!strings.Contains(a.Rule, "files.rules[0] ask-write /work/**") || a.Source != prof+":3:7" {
			t.Fatalf("approval %+v", a)
		}
		// The held write holds nothing else: the guest reads, writes and
		// lists elsewhere in the mount meanwhile.
		out, err := v.sh("cat /work/pub/f && echo other > /work/pub/new && ls /work/src && echo FREE-OK")
		if err != nil || !strings.Contains(out, "PUBLIC") || !strings.Contains(out, "FREE-OK") || host("pub/new") != "other\n" {
			t.Fatalf("while a write was held: %v\n%s", err, out)
		}
		select {
		case out := <-done:
			t.Fatalf("the write finished before an answer: %s", out)
		default:
		}
		if host("src/a.txt") != "hello\n" {
			t.Fatalf("the held write reached the host: %q", host("src/a.txt"))
		}
		if out, err := e.smx("approve", a.ID); err != nil || !strings.Contains(out, "allowed "+a.ID) {
			t.Fatalf("approve: %v\n%s", err, out)
		}
		if out := wait(t, done, "once"); !strings.Contains(out, "RC=0") {
			t.Fatalf("after approve, the guest saw:\n%s", out)
		}
		if got := host("src/a.txt"); got != "second-version\n" {
			t.Fatalf("host file after approve: %q", got)
		}
		e.expect(t, want{kind: "approval.requested", rule: "files.rules\\[0\\]"})
		e.expect(t, want{kind: "approval.granted", rule: "files.rules\\[0\\]"})

		// Once is once: the next write asks again; deny it.
		time.Sleep(3 * time.Second)
		done = e.bg(strings.Replace(write, "%s", "third-version", 1))
		b := e.waitApproval(t, seen)
		if b.What != a.What || b.ID == a.ID {
			t.Fatalf("second question %+v", b)
		}
		if out, err := e.smx("deny", b.ID); err != nil {
			t.Fatalf("deny: %v\n%s", err, out)
		}
		out = wait(t, done, "deny")
		if !strings.Contains(out, "Permission denied") || strings.Contains(out, "RC=0") {
			t.Fatalf("after deny, the guest saw:\n%s", out)
		}
		if got := host("src/a.txt"); got != "second-version\n" {
			t.Fatalf("host file after deny: %q", got)
		}
		e.expect(t, want{kind: "approval.denied"})
		e.expect(t, want{kind: "file.refused", rule: "files.rules\\[0\\]", reason: "denied it"})
	})

	t.Run("protected", func(t *testing.T) {
		out, _ := v.sh("echo '[core] fsmonitor = evil' >> /work/.git/config; echo RC=$?")
		if !strings.Contains(out, "Read-only file system") {
			t.Fatalf("write to .git/config: %s", out)
		}
		if p := e.pending(t); len(p) != 0 {
			t.Fatalf(".git/config was asked about: %+v", p)
		}
		if got := host(".git/config"); got != "[core]\n" {
			t.Fatalf(".git/config on the host: %q", got)
		}
	})

	t.Run("always", func(t *testing.T) {
		done := e.bg("echo made > /work/src/b.txt; echo RC=$?")
		a := e.waitApproval(t, seen)
		if a.What != "create /work/src/b.txt" {
			t.Fatalf("approval %+v", a)
		}
		out, err := e.smx("approve", a.ID, "--always")
		if err != nil || !strings.Contains(out, "wrote files.rules: {path: /work/src/b.txt, access: rw} to "+prof) {
			t.Fatalf("approve --always: %v\n%s", err, out)
		}
		if out := wait(t, done, "always"); !strings.Contains(out, "RC=0") || host("src/b.txt") != "made\n" {
			t.Fatalf("after approve --always, the guest saw:\n%s", out)
		}
		data, _ := os.ReadFile(prof)
		if !strings.Contains(string(data), "approval "+a.ID) || !strings.Contains(string(data), "path: /work/src/b.txt") {
			t.Fatalf("profile after always:\n%s", data)
		}
		if out, err := e.smx("profile", "check", prof); err != nil {
			t.Fatalf("profile check after always: %v\n%s", err, out)
		}
		time.Sleep(3 * time.Second)
		if out, _ := v.sh("echo again > /work/src/b.txt; echo RC=$?"); !strings.Contains(out, "RC=0") || host("src/b.txt") != "again\n" {
			t.Fatalf("the rule written by always does not let the write through:\n%s", out)
		}
		if p := e.pending(t); len(p) != 0 {
			t.Fatalf("asked again after always: %+v", p)
		}
	})

	t.Run("sandbox", func(t *testing.T) {
		done := e.bg("mkdir /work/src/d; echo RC=$?")
		a := e.waitApproval(t, seen)
		if a.What != "mkdir /work/src/d" {
			t.Fatalf("approval %+v", a)
		}
		if out, err := e.smx("approve", a.ID, "--sandbox"); err != nil {
			t.Fatalf("approve --sandbox: %v\n%s", err, out)
		}
		if out := wait(t, done, "sandbox"); !strings.Contains(out, "RC=0") {
			t.Fatalf("after approve --sandbox, the guest saw:\n%s", out)
		}
		// Later changes under the same rule go through without a question.
		out, _ := v.sh("echo e > /work/src/d/e.txt && mv /work/src/d/e.txt /work/f.txt && rm /work/src/a.txt; echo RC=$?")
		if !strings.Contains(out, "RC=0") || host("f.txt") != "e\n" || !strings.Contains(host("src/a.txt"), "no such file") {
			t.Fatalf("under a sandbox grant:\n%s", out)
		}
		if p := e.pending(t); len(p) != 0 {
			t.Fatalf("asked again after a sandbox grant: %+v", p)
		}
	})

	t.Run("read", func(t *testing.T) {
		// Under access: ask the names are visible without a question;
		// reading the content is asked.
		if out, err := v.sh("ls -l /work/secret"); err != nil || !strings.Contains(out, " f") {
			t.Fatalf("ls under ask: %v\n%s", err, out)
		}
		if p := e.pending(t); len(p) != 0 {
			t.Fatalf("a listing was asked about: %+v", p)
		}
		done := e.bg("cat /work/secret/f; echo RC=$?")
		a := e.waitApproval(t, seen)
		if a.What != "read /work/secret/f" || !strings.Contains(a.Rule, "files.rules[2] ask /work/secret/**") {
			t.Fatalf("approval %+v", a)
		}
		if out, err := e.smx("approve", a.ID); err != nil {
			t.Fatalf("approve: %v\n%s", err, out)
		}
		if out := wait(t, done, "read"); !strings.Contains(out, "SECRET-DIR") || !strings.Contains(out, "RC=0") {
			t.Fatalf("after approve, the guest read:\n%s", out)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		os.WriteFile(filepath.Join(dir, "src/a.txt"), []byte("second-version\n"), 0o644)
		// Another rule than the one granted for the sandbox's life.
		os.WriteFile(prof, []byte("files:\n  rules:\n    - path: /work/**\n      access: rw\n    - path: /work/src/**\n      access: ask-write\nask:\n  timeout: 3s\n"), 0o644)
		e.use(t, prof)
		start := time.Now()
		out, _ := v.sh(strings.Replace(write, "%s", "late-version", 1))
		if !strings.Contains(out, "Permission denied") || strings.Contains(out, "RC=0") {
			t.Fatalf("after the timeout, the guest saw:\n%s", out)
		}
		if d := time.Since(start); d < 3*time.Second {
			t.Fatalf("refused after %v, before ask.timeout", d)
		}
		if got := host("src/a.txt"); got != "second-version\n" {
			t.Fatalf("host file after the timeout: %q", got)
		}
		e.expect(t, want{kind: "approval.timeout"})
		e.expect(t, want{kind: "file.refused", reason: "no answer within ask.timeout 3s"})
		// The agent in the guest can read why.
		if out, _ := v.sh("smx-why 2>&1 || wget -qO- http://10.0.2.2:5639/ 2>&1"); !strings.Contains(out, "/work/src/a.txt") || !strings.Contains(out, "no answer within ask.timeout") {
			t.Fatalf("smx-why after the timeout:\n%s", out)
		}
	})
}
