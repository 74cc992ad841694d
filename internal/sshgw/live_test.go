package sshgw

import (
	"bufio"
	"io"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/policy"
)

// TestForwardDecidedByNetworkRules: a direct-tcpip channel (-L, -D, -W)
// over a connection whose rule allows forward: [local] reaches only
// destinations the profile's network rules allow, as a connection from
// the sandbox would: loopback, localhost, metadata and private addresses
// and ports no rule opens are refused with an ssh.refused record, and the
// guest's ssh is told why. Before, every destination was forwarded.
func TestForwardDecidedByNetworkRules(t *testing.T) {
	e := newGWEnv(t)
	fwd := e.target("fwd.test", e.a.Addr)
	pub80 := netip.AddrPortFrom(e.a.Addr.Addr(), 80) // NetHost serves HTTP there
	for _, tc := range []struct{ dest, rule string }{
		{"127.0.0.1:22", "builtin:"},
		{"localhost:22", "builtin: localhost and metadata names are always closed"},
		{"169.254.169.254:80", "builtin:"},
		{"[::1]:22", "builtin:"},
		{pub80.String(), "default deny"},
	} {
		t.Run(tc.dest, func(t *testing.T) {
			out, errs, code := e.ssh("fwd.test", fwd, "", "-W", tc.dest, "root@fwd.test")
			if code == 0 || out != "" || !strings.Contains(errs, "decided by the network rules") {
				t.Fatalf("-W %s: code %d out %q err %q", tc.dest, code, out, errs)
			}
			r := e.expect(t, audit.KindSSHRefused, map[string]string{"request": "direct-tcpip", "forward_to": strings.Trim(tc.dest, "[]"), "rule": tc.rule})
			t.Logf("refusal: %v", r.fields)
		})
	}
	// An allowed destination still works, and its record names the rule.
	out, _, _ := e.ssh("fwd.test", fwd, "", "-W", e.a.Addr.String(), "root@fwd.test")
	if !strings.HasPrefix(out, "SSH-2.0-OpenSSH") {
		t.Fatalf("through -W: %q", out)
	}
	e.expect(t, KindForward, map[string]string{"host": "fwd.test", "channel": "direct-tcpip", "forward_rule": "network.allow[0] cidr 198.18.0.0/15"})
}

// longRun is an ssh client process; done is closed when it has exited.
type longRun struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// exited waits up to d for the ssh client to end and reports whether it did.
func (l *longRun) exited(d time.Duration) bool {
	select {
	case <-l.done:
		return true
	case <-time.After(d):
		return false
	}
}

// longSSH starts ssh with args and waits for its first line of output; it
// returns the process and its stderr.
func (e *gwEnv) longSSH(t *testing.T, name string, port int, args ...string) (*longRun, *syncBuffer) {
	t.Helper()
	cmd := exec.Command("ssh", append(fixP(e.sshArgs(name, port)), args...)...)
	stdout, _ := cmd.StdoutPipe()
	errb := &syncBuffer{}
	cmd.Stderr = errb
	in, _ := cmd.StdinPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	l := &longRun{cmd: cmd, done: make(chan struct{})}
	line := make(chan string, 1)
	go func() {
		ln, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- ln
		io.Copy(io.Discard, stdout)
		cmd.Wait()
		close(l.done)
	}()
	t.Cleanup(func() { in.Close(); cmd.Process.Kill(); <-l.done })
	select {
	case ln := <-line:
		if ln == "" {
			t.Fatalf("ssh %v ended before its first line: %s", args, errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("ssh %v: no output: %s", args, errb.String())
	}
	return l, errb
}

func mustParse(t *testing.T, src string) *policy.Profile {
	t.Helper()
	p, err := policy.Parse("narrower.yaml", []byte(src), nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestProfileChangeEndsSessions: `smx agent policy` with a narrower profile
// decides live SSH connections again. A session whose user the new
// profile refuses, or whose rule it changes, is closed at once with an
// ssh.refused record and the reason on the session's stderr; one the
// change does not touch goes on; a live forward whose destination the new
// network rules refuse is closed. Before, every session ran on under the
// profile it opened with.
func TestProfileChangeEndsSessions(t *testing.T) {
	e := newGWEnv(t)
	build1 := e.target("build1.test", e.a.Addr)
	fwd := e.target("fwd.test", e.a.Addr)
	nosftp := e.target("nosftp.test", e.a.Addr)

	refused, refusedErr := e.longSSH(t, "build1.test", build1, "root@build1.test", "echo started; sleep 60")
	narrowed, narrowedErr := e.longSSH(t, "nosftp.test", nosftp, "root@nosftp.test", "echo started; sleep 60")
	kept, _ := e.longSSH(t, "fwd.test", fwd, "root@fwd.test", "echo started; sleep 60")
	forward, forwardErr := e.longSSH(t, "fwd.test", fwd, "-W", e.a.Addr.String(), "root@fwd.test")

	// build1.test now only for deploy; nosftp.test gains sftp (its rule
	// changed); fwd.test as before, but port 22 of the upstream is no
	// longer a network destination.
	pin, _, _, _, err := ssh.ParseAuthorizedKey([]byte(e.a.HostKey))
	if err != nil {
		t.Fatal(err)
	}
	narrower := strings.NewReplacer(
		"{PIN}", ssh.FingerprintSHA256(pin),
		"      ports: [22]\nssh:", "      ports: [80]\nssh:",
		"- host: build1.test\n      user: root", "- host: build1.test\n      user: deploy",
		"- host: nosftp.test\n      user: root", "- host: nosftp.test\n      user: root\n      sftp: allow",
	).Replace(testProfile)
	if strings.Count(narrower, "deploy") != 1 || !strings.Contains(narrower, "ports: [80]") || strings.Count(narrower, "sftp: allow") != 2 {
		t.Fatalf("narrower profile:\n%s", narrower)
	}
	e.gw.SetProfile(mustParse(t, narrower))
	if !refused.exited(10 * time.Second) {
		t.Fatal("a session whose user the new profile refuses is still running")
	}
	if !strings.Contains(refusedErr.String(), "smx: the sandbox's profile changed and no longer allows ssh to root@build1.test") {
		t.Errorf("the guest was not told why: %q", refusedErr.String())
	}
	r := e.expect(t, audit.KindSSHRefused, map[string]string{"host": "build1.test", "request": "profile change", "reason": "no ssh rule allows root@build1.test"})
	t.Logf("refusal: %v", r.fields)

	if !narrowed.exited(10 * time.Second) {
		t.Fatal("a session whose rule changed is still running")
	}
	if !strings.Contains(narrowedErr.String(), "changed the ssh rule") {
		t.Errorf("the guest was not told why: %q", narrowedErr.String())
	}
	r = e.expect(t, audit.KindSSHRefused, map[string]string{"host": "nosftp.test", "request": "profile change", "rule": RuleProfile})
	t.Logf("refusal: %v", r.fields)

	if !forward.exited(10 * time.Second) {
		t.Fatal("a forward the new network rules refuse is still open")
	}
	r = e.expect(t, audit.KindSSHRefused, map[string]string{"host": "fwd.test", "request": "direct-tcpip", "reason": "profile changed"})
	t.Logf("forward refusal: %v (ssh: %q)", r.fields, forwardErr.String())

	if kept.exited(time.Second) {
		t.Error("a session the change does not touch was closed")
	}
	// A new -W to the same destination is refused under the new profile.
	if _, errs, code := e.ssh("fwd.test", fwd, "", "-W", e.a.Addr.String(), "root@fwd.test"); code == 0 || !strings.Contains(errs, "decided by the network rules") {
		t.Errorf("new -W: %d %q", code, errs)
	}
}

// TestCertificateExpiryEndsSession: a session logged in with a
// certificate ends when the certificate expires (the upstream checks it
// only at login), with an ssh.refused record and the reason on the
// session's stderr. Before, it ran on as long as the guest kept it.
func TestCertificateExpiryEndsSession(t *testing.T) {
	e := newGWEnv(t)
	p := e.gw.prof.Load()
	short := *p
	short.SSH.CertTTL = 3 * time.Second // below what a profile may say (1m), to keep the test short
	short.Hash = p.Hash
	e.gw.SetProfile(&short)
	build1 := e.target("build1.test", e.a.Addr)
	start := time.Now()
	cmd, errb := e.longSSH(t, "build1.test", build1, "root@build1.test", "echo started; sleep 60")
	if !cmd.exited(15 * time.Second) {
		t.Fatal("the session outlived its certificate")
	}
	if d := time.Since(start); d < 2*time.Second {
		t.Errorf("closed after %v, before the certificate expired", d)
	}
	if !strings.Contains(errb.String(), "expired (ssh.cert_ttl 3s)") {
		t.Errorf("the guest was not told why: %q", errb.String())
	}
	r := e.expect(t, audit.KindSSHRefused, map[string]string{"host": "build1.test", "request": "certificate expiry", "rule": RuleCertExpired})
	t.Logf("refusal: %v", r.fields)
	// A host-held key has no expiry: legacy.test's session is not cut.
	legacy := e.target("legacy.test", e.b.Addr)
	cmd, _ = e.longSSH(t, "legacy.test", legacy, "root@legacy.test", "echo started; sleep 60")
	if cmd.exited(5 * time.Second) {
		t.Error("a session logged in with a host-held key was closed")
	}
}
