package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	wire "github.com/smx-dev/smx/api"
	"github.com/smx-dev/smx/client"
	"github.com/smx-dev/smx/internal/testutil"
)

// The approvals tests put real flows from a real guest on hold through the
// real gateway, and answer them from other processes (the CLI, and
// `smx serve`'s API through the Go client), as a user in another terminal
// would.

// bg runs a shell script in the guest without waiting for it.
func (e *egressEnv) bg(script string) <-chan string {
	ch := make(chan string, 1)
	go func() {
		out, _ := e.sh(script)
		ch <- out
	}()
	return ch
}

// waitApproval polls `smx approvals --json` until a question not in seen
// appears.
func (e *egressEnv) waitApproval(t *testing.T, seen map[string]bool) wire.Approval {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		l := e.pending(t)
		for _, a := range l {
			if !seen[a.ID] {
				seen[a.ID] = true
				return a
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new question within 90s; pending: %+v", l)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

func wait(t *testing.T, ch <-chan string, what string) string {
	t.Helper()
	select {
	case out := <-ch:
		return out
	case <-time.After(120 * time.Second):
		t.Fatalf("%s: the guest's request did not finish", what)
	}
	return ""
}

// get with the path /left-pad and a long idle timeout (the flow is held).
func heldGet(host string) string {
	return fmt.Sprintf(`printf 'GET /left-pad HTTP/1.0\r\nHost: %s\r\n\r\n' | nc -w 100 %s 80`, host, host)
}

func TestApprovalsNetwork(t *testing.T) {
	e := startEgress(t, "ask-net")
	seen := map[string]bool{}
	prof := e.profile("ask", "# the team's profile: keep this comment\nnetwork:\n  mode: ask # ask for what no rule names\n"+
		"  allow:\n    # the one host we trust\n    - domain: www.example.test\n      ports: [80]\nask:\n  timeout: 50s\n")
	e.use(t, prof)

	// smx serve, answering through the API from another process; its TCP
	// listener is one more address the guest will try.
	sock := filepath.Join(e.dir, "api.sock")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	apiPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	tok := filepath.Join(e.dir, "token")
	os.WriteFile(tok, []byte("s3cret-token-for-the-test\n"), 0o600)
	srv := e.cmd("serve", "--listen", "unix:"+sock, "--listen", fmt.Sprintf("tcp:127.0.0.1:%d", apiPort), "--token-file", tok)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	cl := client.NewTCP(fmt.Sprintf("127.0.0.1:%d", apiPort), "s3cret-token-for-the-test")
	ctx := context.Background()
	// The event stream, from another process: approval lines as they happen.
	events := &syncBuf{}
	ev := e.cmd("events", "--json", "--sandbox", e.name)
	ev.Stdout = events
	if err := ev.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ev.Process.Kill(); ev.Wait() })
	time.Sleep(time.Second) // it follows the log from when it starts
	var onceID string

	t.Run("once", func(t *testing.T) {
		done := e.bg(heldGet("api.example.test"))
		a := e.waitApproval(t, seen)
		if a.Channel != "network" || a.What != "GET http://api.example.test/left-pad" || a.Sandbox != e.name || a.State != "pending" ||
			!strings.Contains(a.Rule, "network.mode ask") || !strings.HasPrefix(a.Source, prof+":3:") {
			t.Fatalf("approval %+v", a)
		}
		select {
		case out := <-done:
			t.Fatalf("the request finished before an answer: %s", out)
		case <-time.After(time.Second):
		}
		if out, err := e.smx("approve", a.ID); err != nil || !strings.Contains(out, "allowed "+a.ID) {
			t.Fatalf("approve: %v\n%s", err, out)
		}
		if out := wait(t, done, "once"); !strings.Contains(out, hello) {
			t.Fatalf("after approve, the guest got:\n%s", out)
		}
		e.expect(t, want{kind: "approval.granted", rule: "network.mode ask"})
		onceID = a.ID
		// The same request again is asked again; deny it.
		done = e.bg(heldGet("api.example.test"))
		b := e.waitApproval(t, seen)
		if b.What != a.What {
			t.Fatalf("second question %+v", b)
		}
		if out, err := e.smx("deny", b.ID); err != nil {
			t.Fatalf("deny: %v\n%s", err, out)
		}
		out := wait(t, done, "deny")
		if strings.Contains(out, hello) || !strings.Contains(out, "403 Forbidden") || !strings.Contains(out, "denied it") {
			t.Fatalf("after deny, the guest got:\n%s", out)
		}
		e.expect(t, want{kind: "approval.denied"})
		// An answered question cannot be answered again.
		if out, err := e.smx("approve", b.ID); err == nil || !strings.Contains(out, "not pending") {
			t.Fatalf("approve twice: %v\n%s", err, out)
		}
	})

	t.Run("guest-cannot-answer", func(t *testing.T) {
		done := e.bg(heldGet("api.example.test"))
		a := e.waitApproval(t, seen)
		body := `{"decision":"always"}`
		post := func(addr string) string {
			return fmt.Sprintf(`printf 'POST /v1/approvals/%s HTTP/1.0\r\nHost: x\r\nAuthorization: Bearer s3cret-token-for-the-test\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' | nc -w 3 %s; echo`, a.ID, len(body), body, addr)
		}
		// Every address the guest can name: the gateway (every port it
		// serves, and the API's port), host loopback by name and by
		// address, its own loopback, the host's other addresses.
		var script strings.Builder
		for _, addr := range []string{"10.0.2.2 5639", fmt.Sprintf("10.0.2.2 %d", apiPort), fmt.Sprintf("host.smx.internal %d", apiPort),
			fmt.Sprintf("127.0.0.1 %d", apiPort), fmt.Sprintf("10.0.2.15 %d", apiPort), "10.0.2.2 564", "10.0.2.2 80", "10.0.2.2 443"} {
			script.WriteString(post(addr) + "\n")
		}
		script.WriteString("smx-why 2>&1 || wget -qO- http://10.0.2.2:5639/ 2>&1\n")
		out, _ := e.sh(script.String())
		if !strings.Contains(out, a.ID) || !strings.Contains(out, "wait for the host user's answer") {
			t.Errorf("smx-why does not show the waiting question:\n%s", out)
		}
		if p := e.pending(t); len(p) != 1 || p[0].ID != a.ID {
			t.Fatalf("after the guest's tries the question is not pending as it was: %+v\nguest:\n%s", p, out)
		}
		select {
		case out := <-done:
			t.Fatalf("the held request finished without the host user: %s", out)
		default:
		}
		// The host user answers it through the API: for the sandbox's life.
		got, err := cl.Answer(ctx, a.ID, wire.DecideSandbox)
		if err != nil || got.State != "granted" || got.Decision != "sandbox" || !strings.HasPrefix(got.By, "api") {
			t.Fatalf("answer through the API: %+v %v", got, err)
		}
		if out := wait(t, done, "sandbox"); !strings.Contains(out, hello) {
			t.Fatalf("after approve --sandbox, the guest got:\n%s", out)
		}
		// Granted for the sandbox's life: no question the next time.
		if out, _ := e.sh(heldGet("api.example.test")); !strings.Contains(out, hello) {
			t.Fatalf("a request granted for the sandbox was not let through:\n%s", out)
		}
		if p := e.pending(t); len(p) != 0 {
			t.Fatalf("asked again after a sandbox grant: %+v", p)
		}
		l, err := cl.Approvals(ctx, e.name)
		if err != nil || len(l) != 0 {
			t.Fatalf("GET /v1/approvals: %+v %v", l, err)
		}
	})

	t.Run("always", func(t *testing.T) {
		done := e.bg(heldGet("example.test"))
		a := e.waitApproval(t, seen)
		out, err := e.smx("approve", a.ID, "--always")
		if err != nil || !strings.Contains(out, "wrote network.allow: {domain: example.test, ports: [80]} to "+prof) {
			t.Fatalf("approve --always: %v\n%s", err, out)
		}
		if out := wait(t, done, "always"); !strings.Contains(out, hello) {
			t.Fatalf("after approve --always, the guest got:\n%s", out)
		}
		data, _ := os.ReadFile(prof)
		for _, w := range []string{"# the team's profile: keep this comment", "# ask for what no rule names", "# the one host we trust",
			"added by smx approve --always", "approval " + a.ID, "domain: example.test"} {
			if !strings.Contains(string(data), w) {
				t.Errorf("profile lacks %q:\n%s", w, data)
			}
		}
		if out, err := e.smx("profile", "check", prof); err != nil {
			t.Fatalf("profile check after always: %v\n%s", err, out)
		}
		if out, _ := e.sh(heldGet("example.test")); !strings.Contains(out, hello) {
			t.Fatalf("the rule written by always does not let the request through:\n%s", out)
		}
		if p := e.pending(t); len(p) != 0 {
			t.Fatalf("asked again after always: %+v", p)
		}
		r := e.expect(t, want{kind: "approval.granted", rule: ""})
		_ = r
		found := false
		for _, r := range e.records(t, false) {
			if r.Kind == "approval.granted" && r.f("scope") == "always" && strings.Contains(r.f("rule_written"), "example.test") && strings.HasPrefix(r.f("by"), "cli") {
				found = true
			}
		}
		if !found {
			t.Fatalf("no approval.granted record with scope always, the rule and who")
		}
	})

	t.Run("timeout", func(t *testing.T) {
		e.use(t, e.profile("short", "network:\n  mode: ask\nask:\n  timeout: 3s\n"))
		start := time.Now()
		out, _ := e.sh(heldGet("other.test"))
		if strings.Contains(out, hello) || !strings.Contains(out, "403 Forbidden") || !strings.Contains(out, "no answer within ask.timeout 3s") {
			t.Fatalf("after the timeout, the guest got:\n%s", out)
		}
		if d := time.Since(start); d < 3*time.Second {
			t.Fatalf("refused after %v, before ask.timeout", d)
		}
		e.expect(t, want{kind: "approval.timeout"})
		e.expect(t, want{kind: "approval.requested"})
	})

	t.Run("events", func(t *testing.T) {
		for i := 0; i < 100 && !strings.Contains(events.String(), `"state":"timeout"`); i++ {
			time.Sleep(200 * time.Millisecond)
		}
		var pending, granted, timedOut bool
		for _, line := range strings.Split(events.String(), "\n") {
			var x wire.Event
			if json.Unmarshal([]byte(line), &x) != nil || x.Type != "approval" || x.Approval == nil {
				continue
			}
			switch {
			case x.Approval.ID == onceID && x.Approval.State == "pending" && x.Approval.What == "GET http://api.example.test/left-pad":
				pending = true
			case x.Approval.ID == onceID && x.Approval.State == "granted" && x.Approval.Decision == "once" && strings.HasPrefix(x.Approval.By, "cli"):
				granted = true
			case x.Approval.State == "timeout":
				timedOut = true
			}
		}
		if !pending || !granted || !timedOut {
			t.Fatalf("event stream: pending %v granted %v timeout %v:\n%s", pending, granted, timedOut, events.String())
		}
	})
}

// TestApprovalsGitPush holds a real git push to main in the Git gateway
// until the host user answers: denied, the forge's main does not move;
// approved once, it does.
func TestApprovalsGitPush(t *testing.T) {
	testutil.RequireQEMU(t)
	h := testutil.NewNetHost(t)
	const token = "ghp_vmtest_ask_4b1e7c90d2"
	v, forge, image := newForgeVM(t, h, h.PublicIPs[0].String(), token, "ask-git")
	forge.NewRepo(t, "acme/app.git", 3)
	e := &egressEnv{vmEnv: v, h: h, dir: t.TempDir()}
	profile := filepath.Join(t.TempDir(), "git.yaml")
	os.WriteFile(profile, []byte(`network:
  mode: default-deny
  allow:
    - domain: forge.test
      ports: [8443]
git:
  repos:
    - repo: forge.test/acme/*
      read: allow
      push: allow
      refs:
        - ref: refs/heads/main
          push: ask
credentials:
  - name: forge
    from: forge-token
    forge: forge.test
ask:
  timeout: 120s
`), 0o644)
	hosts := testutil.HostsFile(t, map[string]string{"forge.test": h.PublicIPs[0].String()})
	v.createStart(v.name, image, profile, []string{"SMX_HOSTS_FILE=" + hosts, "SMX_EXTRA_CA_FILE=" + forge.CAFile})
	bare := filepath.Join(forge.Root, "acme/app.git")
	main0 := testutil.Git(t, bare, "rev-parse", "refs/heads/main")
	out, err := e.sh(`export HOME=/root; cd /root
git config --global user.name agent; git config --global user.email agent@example.test
git clone -q https://forge.test:8443/acme/app app && cd app && echo fix > fix.txt && git add fix.txt && git commit -qm fix && git rev-parse HEAD`)
	if err != nil {
		t.Fatalf("clone and commit: %v\n%s", err, out)
	}
	lines := strings.Fields(out)
	head := lines[len(lines)-1]
	seen := map[string]bool{}
	push := "export HOME=/root; cd /root/app; git push origin HEAD:main 2>&1; echo PUSH-RC=$?"

	done := e.bg(push)
	a := e.waitApproval(t, seen)
	if a.Channel != "git" || a.What != "push refs/heads/main (fast-forward) to forge.test/acme/app" || !strings.Contains(a.Rule, "git.repos[0].refs[0]") {
		t.Fatalf("approval %+v", a)
	}
	if got := testutil.Git(t, bare, "rev-parse", "refs/heads/main"); got != main0 {
		t.Fatalf("main moved on the forge while the push was held: %s", got)
	}
	if out, err := e.smx("deny", a.ID); err != nil {
		t.Fatalf("deny: %v\n%s", err, out)
	}
	out = wait(t, done, "git deny")
	if !strings.Contains(out, "PUSH-RC=1") || !strings.Contains(out, "asked of the host user") {
		t.Fatalf("denied push, the guest saw:\n%s", out)
	}
	if got := testutil.Git(t, bare, "rev-parse", "refs/heads/main"); got != main0 {
		t.Fatalf("main moved on the forge after a deny: %s", got)
	}

	done = e.bg(push)
	a = e.waitApproval(t, seen)
	if out, err := e.smx("approve", a.ID); err != nil {
		t.Fatalf("approve: %v\n%s", err, out)
	}
	out = wait(t, done, "git approve")
	if !strings.Contains(out, "PUSH-RC=0") {
		t.Fatalf("approved push, the guest saw:\n%s", out)
	}
	if got := testutil.Git(t, bare, "rev-parse", "refs/heads/main"); got != head {
		t.Fatalf("after approval the forge's main is %s, want %s", got, head)
	}
}

// TestApprovalsSSH holds a real OpenSSH login in the SSH gateway until the
// host user answers: denied, the guest's ssh fails with the reason;
// approved once, the command runs on the real sshd.
func TestApprovalsSSH(t *testing.T) {
	e := startSSHEnv(t, "ask-ssh")
	e.use(t, e.profile("askssh", "network:\n  mode: default-deny\nssh:\n  allow:\n    - host: build1.test\n      user: root\n      ask: true\nask:\n  timeout: 90s\n"))
	seen := map[string]bool{}
	cmd := "ssh " + sshOpts + " root@build1.test 'echo hello-from-asked-login'; echo SSH-RC=$?"

	done := e.bg(cmd)
	a := e.waitApproval(t, seen)
	if a.Channel != "ssh" || a.What != "ssh root@build1.test port 22" || !strings.Contains(a.Rule, "ssh.allow[0]") {
		t.Fatalf("approval %+v", a)
	}
	if out, err := e.smx("deny", a.ID); err != nil {
		t.Fatalf("deny: %v\n%s", err, out)
	}
	out := wait(t, done, "ssh deny")
	if strings.Contains(out, "hello-from-asked-login") || !strings.Contains(out, "asked of the host user") || strings.Contains(out, "SSH-RC=0") {
		t.Fatalf("denied login, the guest saw:\n%s", out)
	}

	done = e.bg(cmd)
	a = e.waitApproval(t, seen)
	if out, err := e.smx("approve", a.ID); err != nil {
		t.Fatalf("approve: %v\n%s", err, out)
	}
	if out := wait(t, done, "ssh approve"); !strings.Contains(out, "hello-from-asked-login") || !strings.Contains(out, "SSH-RC=0") {
		t.Fatalf("approved login, the guest saw:\n%s", out)
	}
	e.expect(t, want{kind: "approval.granted", rule: "ssh.allow"})
	e.expect(t, want{kind: "ssh.session", host: "build1.test"})
}

// TestApprovalsCredential holds a brokered request whose binding says ask
// before the secret is used: denied, the upstream sees nothing; approved
// for the sandbox, it gets the secret, and the next request is not asked.
func TestApprovalsCredential(t *testing.T) {
	testutil.RequireQEMU(t)
	h := testutil.NewNetHost(t)
	probe := testutil.NetProbe(t)
	bin := testutil.Binaries(t)
	const secret = "sk-test-ask-5e8a1c"
	const port = 8443
	caFile, keys := modelUpstream(t, h, port)

	home := t.TempDir()
	os.Symlink(testutil.KernelCache(t), filepath.Join(home, "kernels"))
	v := &vmEnv{t: t, bin: bin, home: home, name: "ask-cred"}
	e := &egressEnv{vmEnv: v, h: h, dir: t.TempDir()}
	if out, err := v.smx("image", "build", "busybox"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	v.setCred("model-key", secret)
	profile := e.profile("model", fmt.Sprintf(`network:
  mode: default-deny
  allow:
    - domain: api.model.test
      ports: [%d]
credentials:
  - name: model
    from: model-key
    domain: api.model.test
    header: x-api-key
    ask: true
`, port))
	hosts := testutil.HostsFile(t, map[string]string{"api.model.test": h.PublicIPs[0].String()})
	if out, err := v.smx("agent", "create", v.name, "--memory", "256M", "--profile", profile, "-e", "MODEL_API_KEY=smx-placeholder"); err != nil {
		t.Fatalf("create: %v\n%s", err, out)
	}
	t.Cleanup(func() { v.smx("agent", "rm", "-f", v.name) })
	start := v.cmd("agent", "start", v.name)
	start.Env = append(start.Env, "SMX_HOSTS_FILE="+hosts, "SMX_EXTRA_CA_FILE="+caFile)
	if out, err := start.CombinedOutput(); err != nil {
		t.Fatalf("start: %v\n%s", err, out)
	}
	if out, err := v.smx("agent", "cp", probe, v.name+":/usr/bin/netprobe"); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	req := fmt.Sprintf(`netprobe vget https://api.model.test:%d/v1/messages x-api-key "$MODEL_API_KEY"`, port)
	seen := map[string]bool{}

	done := e.bg(req)
	a := e.waitApproval(t, seen)
	if a.Channel != "credential" || a.What != "use credential model (secret model-key) for api.model.test" || !strings.Contains(a.Rule, "credentials model ask") {
		t.Fatalf("approval %+v", a)
	}
	if out, err := e.smx("deny", a.ID); err != nil {
		t.Fatalf("deny: %v\n%s", err, out)
	}
	if out := wait(t, done, "credential deny"); strings.Contains(out, "model says hi") {
		t.Fatalf("denied, the guest got:\n%s", out)
	}
	if got := keys(); len(got) != 0 {
		t.Fatalf("the upstream saw %q after a deny", got)
	}

	done = e.bg(req)
	a = e.waitApproval(t, seen)
	if out, err := e.smx("approve", a.ID, "--sandbox"); err != nil {
		t.Fatalf("approve: %v\n%s", err, out)
	}
	if out := wait(t, done, "credential approve"); !strings.Contains(out, "model says hi") {
		t.Fatalf("approved, the guest got:\n%s", out)
	}
	if out, _ := e.sh(req); !strings.Contains(out, "model says hi") {
		t.Fatalf("granted for the sandbox, the next request got:\n%s", out)
	}
	if p := e.pending(t); len(p) != 0 {
		t.Fatalf("asked again after a sandbox grant: %+v", p)
	}
	if got := keys(); len(got) != 2 || got[0] != secret || got[1] != secret {
		t.Fatalf("upstream saw %q, want the host's secret twice", got)
	}
}

// countKind is the number of this step's records of kind.
func (e *egressEnv) countKind(t *testing.T, kind string) int {
	t.Helper()
	n := 0
	for _, r := range e.records(t, false) {
		if r.Kind == kind {
			n++
		}
	}
	return n
}

// questionFor waits for a new question while the guest's request runs; a
// request that ends first fails the test with what the guest saw.
func (e *egressEnv) questionFor(t *testing.T, seen map[string]bool, done <-chan string) wire.Approval {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		for _, a := range e.pending(t) {
			if !seen[a.ID] {
				seen[a.ID] = true
				return a
			}
		}
		select {
		case out := <-done:
			t.Fatalf("the guest's request ended without a question:\n%s", out)
		case <-time.After(300 * time.Millisecond):
		}
	}
	t.Fatal("no question within 90s")
	return wire.Approval{}
}

// TestApprovalsNameAndUDP: a guest's wget of a name that only an ask rule
// names (on one port) resolves and gives exactly one question, naming the
// request (the old gateway answered NXDOMAIN: nothing was asked, the
// guest saw a resolution failure); under mode ask the same for a name no
// rule names; a UDP session an ask rule covers is held, its datagram
// kept, and echoed once approved, and a grant for the sandbox lets the
// next one through unasked.
func TestApprovalsNameAndUDP(t *testing.T) {
	e := startEgress(t, "ask-dns")
	seen := map[string]bool{}
	e.use(t, e.profile("ports", "network:\n  ask:\n    - domain: newhost.test\n      ports: [80]\n"+
		"    - domain: newhost.test\n      proto: udp\n      ports: [7]\nask:\n  timeout: 50s\n"))

	t.Run("name", func(t *testing.T) {
		done := e.bg("wget -q -O- http://newhost.test/left-pad 2>&1")
		a := e.questionFor(t, seen, done)
		if a.Channel != "network" || a.What != "GET http://newhost.test/left-pad" || !strings.Contains(a.Rule, "network.ask[0]") {
			t.Fatalf("approval %+v", a)
		}
		if out, err := e.smx("approve", a.ID); err != nil {
			t.Fatalf("approve: %v\n%s", err, out)
		}
		if out := wait(t, done, "wget"); !strings.Contains(out, hello) {
			t.Fatalf("after approve, wget got:\n%s", out)
		}
		if n := e.countKind(t, "approval.requested"); n != 1 {
			t.Fatalf("%d questions for one wget, want 1", n)
		}
		e.expectNone(t, want{kind: "net.refused", host: "newhost.test"})
	})

	t.Run("udp", func(t *testing.T) {
		e.use(t, e.profile("ports2", "network:\n  ask:\n    - domain: newhost.test\n      ports: [80]\n"+
			"    - domain: newhost.test\n      proto: udp\n      ports: [7]\nask:\n  timeout: 50s\n"))
		probe := fmt.Sprintf("netprobe udp newhost.test:%d held-datagram 100s 2>&1", testutil.NetHostUDPEcho)
		done := e.bg(probe)
		a := e.questionFor(t, seen, done)
		if a.What != fmt.Sprintf("udp newhost.test:%d (%s)", testutil.NetHostUDPEcho, e.h.PublicIPs[1]) || !strings.Contains(a.Rule, "network.ask[1]") {
			t.Fatalf("approval %+v", a)
		}
		select {
		case out := <-done:
			t.Fatalf("the datagram was answered before the host user: %s", out)
		case <-time.After(time.Second):
		}
		if out, err := e.smx("approve", a.ID, "--sandbox"); err != nil {
			t.Fatalf("approve --sandbox: %v\n%s", err, out)
		}
		if out := wait(t, done, "udp"); !strings.Contains(out, "held-datagram") {
			t.Fatalf("after approve, netprobe got:\n%s", out)
		}
		if out, _ := e.sh(probe); !strings.Contains(out, "held-datagram") {
			t.Fatalf("a session granted for the sandbox was not let through:\n%s", out)
		}
		if n := e.countKind(t, "approval.requested"); n != 1 {
			t.Fatalf("%d questions, want 1 (the grant covers the second session)", n)
		}
	})

	t.Run("mode-ask", func(t *testing.T) {
		e.use(t, e.profile("mode", "network:\n  mode: ask\nask:\n  timeout: 50s\n"))
		done := e.bg("wget -q -O- http://other.test/ 2>&1; echo wget-exit=$?")
		a := e.questionFor(t, seen, done)
		if a.What != "GET http://other.test/" {
			t.Fatalf("approval %+v", a)
		}
		if out, err := e.smx("deny", a.ID); err != nil {
			t.Fatalf("deny: %v\n%s", err, out)
		}
		out := wait(t, done, "wget")
		if strings.Contains(out, hello) || !strings.Contains(out, "403") || strings.Contains(out, "bad address") {
			t.Fatalf("after deny, wget got:\n%s", out)
		}
		if n := e.countKind(t, "approval.requested"); n != 1 {
			t.Fatalf("%d questions for one wget, want 1", n)
		}
	})
}
