package fsgw

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/approval"
	"github.com/smx-dev/smx/internal/policy"
)

const askProfile = `files:
  rules:
    - path: /work/**
      access: rw
    - path: /work/src/**
      access: ask-write
    - path: /work/docs/**
      access: ask
    - path: /work/.env
      access: deny
`

// askEnv is a gateway whose questions go to a real approval.Holder, as the
// supervisor wires it; the test answers as the host user would.
type askEnv struct {
	*env
	h *approval.Holder

	recMu sync.Mutex
	recs  []string // approval record kinds with their what
}

func newAskEnv(t *testing.T, timeout time.Duration, max int, mods ...func(*Config)) *askEnv {
	t.Helper()
	a := &askEnv{}
	a.h = approval.New("sb", func(kind string, f map[string]any) {
		a.recMu.Lock()
		a.recs = append(a.recs, kind+" "+f["what"].(string))
		a.recMu.Unlock()
	}, func() (time.Duration, int) { return timeout, max })
	a.env = newEnvCfg(t, t.TempDir(), askProfile, false, Owner{}, nil, func(c *Config) {
		c.Ask = func(ctx context.Context, q Question) Answer {
			ans := a.h.Ask(ctx, approval.Question{Channel: "file", What: q.What, Rule: q.Decision.Rule,
				Key: "file " + q.Access + " " + strings.TrimPrefix(q.Decision.Rule, approval.SourceOf(q.Decision.Rule)+" ")})
			if !ans.Allow {
				return Answer{Reason: q.What + " was asked of the host user (approval " + ans.ID + "): " + ans.Reason}
			}
			return Answer{Allow: true, Rule: "approved " + ans.ID + " (" + ans.Decision + "), asked by " + q.Decision.Rule}
		}
		for _, m := range mods {
			m(c)
		}
	})
	return a
}

// pending waits for the one question that names what, and returns it.
func (a *askEnv) pending(what string) approval.Approval {
	a.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, p := range a.h.List() {
			if p.What == what {
				return p
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	a.t.Fatalf("no question %q pending; pending: %+v", what, a.h.List())
	return approval.Approval{}
}

func (a *askEnv) answer(what, decision string) {
	a.t.Helper()
	p := a.pending(what)
	if _, err := a.h.Answer(p.ID, decision, "test", nil); err != nil {
		a.t.Fatal(err)
	}
}

func (a *askEnv) recorded(s string) bool {
	a.recMu.Lock()
	defer a.recMu.Unlock()
	return slices.Contains(a.recs, s)
}

// write opens p for writing and writes data at offset 0, in the
// background; the result arrives on the channel.
func (a *askEnv) write(p, data string) <-chan error {
	ch := make(chan error, 1)
	go func() {
		f, err := a.walk(p)
		if err != nil {
			ch <- err
			return
		}
		defer f.Close()
		if _, _, err := f.Open(p9.WriteOnly | p9.OpenFlags(unix.O_TRUNC)); err != nil {
			ch <- err
			return
		}
		_, err = f.WriteAt([]byte(data), 0)
		ch <- err
	}()
	return ch
}

func (a *askEnv) create(dir, name, data string) <-chan error {
	ch := make(chan error, 1)
	go func() {
		f, _, _, err := a.mustWalk(dir).Create(name, p9.WriteOnly, 0o644, 0, 0)
		if err != nil {
			ch <- err
			return
		}
		defer f.Close()
		_, err = f.WriteAt([]byte(data), 0)
		ch <- err
	}()
	return ch
}

func wait(t *testing.T, what string, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: still held", what)
		return nil
	}
}

func (a *askEnv) host(rel string) string {
	b, err := os.ReadFile(filepath.Join(a.dir, rel))
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

// A write a rule asks about is held until the host user answers; while it
// waits the same 9P session serves other requests; once lets this write
// through (and the next one asks again), deny refuses it with EACCES and
// leaves the file as it was.
func TestAskWriteHeldOnceDeny(t *testing.T) {
	a := newAskEnv(t, time.Minute, 4)
	held := a.write("src/a.go", "package a // v2\n")
	q := a.pending("write /work/src/a.go")
	if !strings.Contains(q.Rule, "test.yaml:5:7 files.rules[1] ask-write /work/src/**") || q.Source != "test.yaml:5:7" || q.Channel != "file" {
		t.Fatalf("question %+v: want the rule's file:line", q)
	}
	// The session is not stuck behind the question: a read, a write
	// elsewhere and a listing of the held file's directory go on.
	if got, err := a.read(".github/ci.yml"); err != nil || got != "on: push\n" {
		t.Fatalf("read while a write is held: %q %v", got, err)
	}
	if err := wait(t, "write elsewhere", a.create("", "free.txt", "free\n")); err != nil || a.host("free.txt") != "free\n" {
		t.Fatalf("write while a write is held: %v %q", err, a.host("free.txt"))
	}
	if got := strings.Join(a.list("src"), " "); !strings.Contains(got, "a.go") {
		t.Fatalf("listing src while held: %q", got)
	}
	if a.host("src/a.go") != "package a\n" {
		t.Fatalf("held write reached the host: %q", a.host("src/a.go"))
	}
	a.answer("write /work/src/a.go", approval.Once)
	if err := wait(t, "held write", held); err != nil {
		t.Fatalf("write allowed once: %v", err)
	}
	if got := a.host("src/a.go"); got != "package a // v2\n" {
		t.Fatalf("host file after allow once: %q", got)
	}
	if !a.recorded(approval.KindRequested+" write /work/src/a.go") || !a.recorded(approval.KindGranted+" write /work/src/a.go") {
		t.Fatalf("records: %v", a.recs)
	}
	// The write through the allowed descriptor was not asked again, and
	// the log names the answer as the rule that allowed it.
	a.mu.Lock()
	w := slices.IndexFunc(a.wrote, func(f map[string]any) bool {
		return f["path"] == "/work/src/a.go" && strings.HasPrefix(f["rule"].(string), "approved ap-")
	})
	a.mu.Unlock()
	if w < 0 {
		t.Fatalf("no write record naming the approval: %v", a.wrote)
	}

	// Once covers this operation only: past the window the same write
	// asks again. Deny: EACCES, the host file stays as it was.
	time.Sleep(onceWindow + 100*time.Millisecond)
	held = a.write("src/a.go", "package a // v3\n")
	a.answer("write /work/src/a.go", approval.Deny)
	wantErr(t, "write denied", wait(t, "denied write", held), unix.EACCES)
	if got := a.host("src/a.go"); got != "package a // v2\n" {
		t.Fatalf("host file after deny: %q", got)
	}
	if r := a.refusal("open", "/work/src/a.go"); !strings.Contains(r["reason"].(string), "denied") || !strings.Contains(r["rule"].(string), "files.rules[1]") {
		t.Fatalf("refusal record: %v", r)
	}
	if !a.recorded(approval.KindDenied + " write /work/src/a.go") {
		t.Fatalf("records: %v", a.recs)
	}

	// A new file: the create is asked and names the new path.
	held = a.create("src", "new.go", "package a\n")
	a.answer("create /work/src/new.go", approval.Once)
	if err := wait(t, "create", held); err != nil || a.host("src/new.go") != "package a\n" {
		t.Fatalf("create allowed once: %v %q", err, a.host("src/new.go"))
	}
}

// Allow for the sandbox's life lets later changes under the same rule
// through without a question; a question left unanswered is refused at
// ask.timeout; more than ask.max held at once are refused at once.
func TestAskWriteSandboxTimeoutBound(t *testing.T) {
	a := newAskEnv(t, 300*time.Millisecond, 1)
	held := a.write("src/a.go", "v2\n")
	a.answer("write /work/src/a.go", approval.Sandbox)
	if err := wait(t, "write", held); err != nil {
		t.Fatal(err)
	}
	// A different file under the same rule, a mkdir and an unlink: no
	// question (the timeout would refuse them otherwise).
	if err := wait(t, "second write", a.create("src", "b.go", "b\n")); err != nil || a.host("src/b.go") != "b\n" {
		t.Fatalf("write under a sandbox grant: %v", err)
	}
	if _, err := a.mustWalk("src").Mkdir("sub", 0o755, 0, 0); err != nil {
		t.Fatalf("mkdir under a sandbox grant: %v", err)
	}
	if err := a.mustWalk("src").UnlinkAt("b.go", 0); err != nil {
		t.Fatalf("unlink under a sandbox grant: %v", err)
	}
	if n := len(a.h.List()); n != 0 {
		t.Fatalf("%d questions pending", n)
	}

	// docs/** asks before reads and writes: unanswered, refused at the
	// timeout, with EACCES.
	b := newAskEnv(t, 300*time.Millisecond, 1)
	_, err := b.read("docs/readme.txt")
	wantErr(t, "read left unanswered", err, unix.EACCES)
	if !b.recorded(approval.KindTimeout + " read /work/docs/readme.txt") {
		t.Fatalf("records: %v", b.recs)
	}
	if r := b.refusal("open", "/work/docs/readme.txt"); !strings.Contains(r["reason"].(string), "ask.timeout") {
		t.Fatalf("refusal: %v", r)
	}

	// ask.max 1: a second question while one waits is refused at once.
	c := newAskEnv(t, time.Minute, 1)
	first := c.write("src/a.go", "x\n")
	c.pending("write /work/src/a.go")
	start := time.Now()
	err = wait(t, "second question", c.write("src/keys/k.pem", "y\n"))
	wantErr(t, "over ask.max", err, unix.EACCES)
	if time.Since(start) > 10*time.Second {
		t.Fatalf("the question over the bound waited %v", time.Since(start))
	}
	c.answer("write /work/src/a.go", approval.Deny)
	wantErr(t, "first, denied", wait(t, "first", first), unix.EACCES)
}

// Under access: ask, names, attributes and listings stay visible without
// a question; opening a file's content asks. Files the host runs stay
// read-only without a question, and a mount with no one to ask refuses.
func TestAskReadVisibleProtectedNoAsk(t *testing.T) {
	a := newAskEnv(t, time.Minute, 4)
	if got := strings.Join(a.list("docs"), " "); !strings.Contains(got, "readme.txt") || !strings.Contains(got, "sub") {
		t.Fatalf("listing docs under ask: %q", got)
	}
	f := a.mustWalk("docs/readme.txt")
	if _, _, _, err := f.GetAttr(p9.AttrMaskAll); err != nil {
		t.Fatalf("getattr under ask: %v", err)
	}
	f.Close()
	if n := len(a.h.List()); n != 0 {
		t.Fatalf("a listing asked %d questions", n)
	}
	done := make(chan string, 1)
	go func() { s, err := a.read("docs/readme.txt"); done <- s + errString(err) }()
	a.answer("read /work/docs/readme.txt", approval.Once)
	if got := <-done; got != "hi\n" {
		t.Fatalf("read allowed once: %q", got)
	}

	// A .git/config under an ask-write rule: read-only, never asked.
	if err := os.MkdirAll(filepath.Join(a.dir, "src/.git"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(a.dir, "src/.git/config"), []byte("[core]\n"), 0o644)
	err := wait(t, "protected", a.write("src/.git/config", "[core]\n\tfsmonitor = evil\n"))
	wantErr(t, "write .git/config", err, unix.EROFS)
	if n := len(a.h.List()); n != 0 || a.recorded(approval.KindRequested+" write /work/src/.git/config") {
		t.Fatalf("a protected file was asked about: %v", a.recs)
	}

	// No Ask (no one to put the question to): refused at once, saying why.
	n := newEnvCfg(t, t.TempDir(), askProfile, false, Owner{}, nil, func(c *Config) { c.NoAsk = "test transport" })
	_, err = n.read("docs/readme.txt")
	wantErr(t, "no ask", err, unix.EACCES)
	if r := n.refusal("open", "/work/docs/readme.txt"); !strings.Contains(r["reason"].(string), "test transport") {
		t.Fatalf("refusal: %v", r)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return " error: " + err.Error()
}

// A rename is one question naming both paths, even when both names are
// under rules that ask.
func TestAskRenameOneQuestion(t *testing.T) {
	a := newAskEnv(t, time.Minute, 4)
	ch := make(chan error, 1)
	go func() { ch <- a.mustWalk("src").RenameAt("a.go", a.mustWalk("src"), "b.go") }()
	a.answer("rename /work/src/a.go to /work/src/b.go", approval.Once)
	if err := wait(t, "rename", ch); err != nil {
		t.Fatalf("rename allowed once: %v", err)
	}
	if a.host("src/b.go") != "package a\n" {
		t.Fatalf("after rename: %q", a.host("src/b.go"))
	}
	a.recMu.Lock()
	n := 0
	for _, r := range a.recs {
		if strings.HasPrefix(r, approval.KindRequested) {
			n++
		}
	}
	a.recMu.Unlock()
	if n != 1 {
		t.Fatalf("%d questions for one rename: %v", n, a.recs)
	}
	// Into an asked place from a free one: asked, and denied.
	os.WriteFile(filepath.Join(a.dir, "free.txt"), []byte("f\n"), 0o644)
	go func() { ch <- a.mustWalk("").RenameAt("free.txt", a.mustWalk("src"), "c.go") }()
	a.answer("rename /work/free.txt to /work/src/c.go", approval.Deny)
	wantErr(t, "rename denied", wait(t, "rename denied", ch), unix.EACCES)
	if a.host("free.txt") != "f\n" || !strings.Contains(a.host("src/c.go"), "no such file") {
		t.Fatalf("after a denied rename: %q %q", a.host("free.txt"), a.host("src/c.go"))
	}
}

// The short window an answer covers ends when the profile changes.
func TestAskWindowEndsWithProfile(t *testing.T) {
	var cur atomic.Pointer[policy.Profile]
	p1, _ := policy.Parse("test.yaml", []byte(askProfile), nil)
	cur.Store(p1)
	a := newAskEnv(t, time.Minute, 4, func(c *Config) { c.Profile = cur.Load })
	held := a.write("src/a.go", "v2\n")
	a.answer("write /work/src/a.go", approval.Once)
	if err := wait(t, "write", held); err != nil {
		t.Fatal(err)
	}
	// Within the window, same profile: the kernel's follow-up passes.
	if err := wait(t, "follow-up", a.write("src/a.go", "v3\n")); err != nil {
		t.Fatal(err)
	}
	p2, _ := policy.Parse("test.yaml", []byte(askProfile), nil)
	cur.Store(p2)
	held = a.write("src/a.go", "v4\n")
	a.answer("write /work/src/a.go", approval.Deny)
	wantErr(t, "after a profile change", wait(t, "denied", held), unix.EACCES)
	if got := a.host("src/a.go"); !strings.HasPrefix(got, "v3\n") { // 9P's open does not truncate
		t.Fatalf("host file: %q", got)
	}
}
