package sshgw

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/testutil"
)

// These tests put the gateway between a real OpenSSH client on the host
// and real sshd servers in a network namespace: sshd A trusts the smx user
// CA, sshd B trusts only a host-held key. The guest side (the VM) is
// covered by the CLI tests; here each case is quick.

type rec struct {
	kind   string
	fields map[string]any
}

func (r rec) f(k string) string {
	if v, ok := r.fields[k]; ok {
		return fmt.Sprint(v)
	}
	return ""
}

type gwEnv struct {
	t            testing.TB
	dir          string
	a, b, c      *testutil.SSHD
	gw           *Gateway
	hostCA       *CA
	userCAPath   string
	clientKH     string
	mu           sync.Mutex
	recs         []rec
	legacyKeyPEM []byte
	legacyKey    string // its file
	agentSock    string
}

const testProfile = `network:
  allow:
    - cidr: 198.18.0.0/15
      ports: [22]
ssh:
  cert_ttl: 5m
  allow:
    - host: build1.test
      user: root
      sftp: allow
      env: [LANG, "SMXTEST_OK*"]
    - host: nosftp.test
      user: root
    - host: fwd.test
      user: root
      forward: [local]
    - host: legacy.test
      user: root
    - host: changed.test
      user: root
    - host: unknown.test
      user: root
    - host: pinned.test
      user: root
      host_key: "{PIN}"
    - host: forge.test
      user: root
    - host: agent.test
      user: root
    - host: certca.test
      user: root
  deny:
    - host: "*"
      user: admin
      ports: ["1-65535"]
git:
  repos:
    - repo: forge.test/acme/*
      read: allow
      push: allow
    - repo: forge.test/acme/secret
      read: deny
    - repo: forge.test/acme/protected
      push: allow
      refs:
        - ref: refs/heads/main
          push: deny
credentials:
  - name: legacy
    from: legacy-key
    ssh_host: legacy.test
  - name: mine
    from: "@ssh-agent"
    ssh_host: agent.test
`

func newGWEnv(t testing.TB) *gwEnv {
	t.Helper()
	testutil.RequireSSHD(t)
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Skip("no ssh client")
	}
	h := testutil.NewNetHost(t)
	e := &gwEnv{t: t, dir: t.TempDir()}
	e.userCAPath = filepath.Join(e.dir, "state", UserCAFile)
	userCA, err := LoadOrCreateCA(e.userCAPath, "smx-user-ca")
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(e.userCAPath); st.Mode().Perm() != 0o600 {
		t.Fatalf("user CA mode %v, want 0600", st.Mode().Perm())
	}
	caPub := filepath.Join(e.dir, "trusted_ca.pub")
	os.WriteFile(caPub, []byte(userCA.AuthorizedKey()+"\n"), 0o644)

	pair := testutil.StartSSHHostPair(t, h, caPub, e.dir)
	e.a, e.b = pair.A, pair.B
	legacy := pair.Legacy
	e.legacyKeyPEM, _ = os.ReadFile(legacy)
	e.legacyKey = legacy

	// sshd C presents a host certificate from a CA known_hosts trusts.
	hca := filepath.Join(e.dir, "host_ca")
	hkey := filepath.Join(e.dir, "c_host")
	for _, c := range [][]string{{"-q", "-t", "ed25519", "-N", "", "-f", hca}, {"-q", "-t", "ed25519", "-N", "", "-f", hkey},
		{"-q", "-s", hca, "-I", "c", "-h", "-n", "certca.test", hkey + ".pub"}} {
		if out, err := exec.Command("ssh-keygen", c...).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen %v: %v\n%s", c, err, out)
		}
	}
	hcaPub, _ := os.ReadFile(hca + ".pub")
	e.c = testutil.StartSSHD(t, h, testutil.SSHDConfig{Addr: netip.AddrPortFrom(h.PublicIPs[2], 22), TrustedUserCAKeys: caPub,
		HostKeyFile: hkey, Extra: []string{"HostCertificate " + hkey + "-cert.pub"}})

	kh := filepath.Join(e.dir, "known_hosts")
	testutil.WriteKnownHosts(t, kh, e.a.KnownHostsLine("build1.test"), e.a.KnownHostsLine("nosftp.test"), e.a.KnownHostsLine("fwd.test"),
		e.a.KnownHostsLine("forge.test"), e.b.KnownHostsLine("legacy.test"), e.b.KnownHostsLine("agent.test"),
		pair.ChangedLine("changed.test"), "@cert-authority certca.test "+strings.TrimSpace(string(hcaPub)))

	pin, _, _, _, err := ssh.ParseAuthorizedKey([]byte(e.a.HostKey))
	if err != nil {
		t.Fatal(err)
	}
	prof, err := policy.Parse("test.yaml", []byte(strings.ReplaceAll(testProfile, "{PIN}", ssh.FingerprintSHA256(pin))), nil)
	if err != nil {
		t.Fatal(err)
	}
	e.hostCA, err = LoadOrCreateCA(filepath.Join(e.dir, "sandbox", HostCAFile), "smx-sandbox-test")
	if err != nil {
		t.Fatal(err)
	}
	// The host user's ssh-agent, holding the key sshd B accepts.
	e.agentSock = filepath.Join(e.dir, "agent.sock")
	ag := exec.Command("ssh-agent", "-D", "-a", e.agentSock)
	if err := ag.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ag.Process.Kill(); ag.Wait() })
	waitListening(t, e.agentSock)
	add := exec.Command("ssh-add", "-q", legacy)
	add.Env = append(os.Environ(), "SSH_AUTH_SOCK="+e.agentSock)
	if out, err := add.CombinedOutput(); err != nil {
		t.Fatalf("ssh-add: %v\n%s", err, out)
	}
	e.gw, err = New(Config{
		Sandbox:     "test",
		AgentSocket: e.agentSock,
		HostCA:      e.hostCA,
		UserCAPath:  e.userCAPath,
		KnownHosts:  []string{kh, filepath.Join(e.dir, "missing")},
		Secret: func(name string) ([]byte, error) {
			if name == "legacy-key" {
				return e.legacyKeyPEM, nil
			}
			return nil, os.ErrNotExist
		},
		Log: e.log,
	}, prof)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.gw.Close() })
	e.clientKH = filepath.Join(e.dir, "client_known_hosts")
	os.WriteFile(e.clientKH, []byte(e.hostCA.KnownHostsLine("smx")+"\n"), 0o644)
	return e
}

// log is the gateways' Config.Log: it keeps the record for the test.
func (e *gwEnv) log(kind string, f map[string]any) {
	e.mu.Lock()
	e.recs = append(e.recs, rec{kind, f})
	e.mu.Unlock()
}

// target starts a loopback listener whose connections the gateway serves
// as if the guest had dialled name at addr; it returns the port.
func (e *gwEnv) target(name string, addr netip.AddrPort) int {
	return e.serve(e.gw, name, addr)
}

// serve is target for another gateway than the env's.
func (e *gwEnv) serve(gw *Gateway, name string, addr netip.AddrPort) int {
	ln := testutil.ServeTCP(e.t, func(c net.Conn) {
		gw.Serve(context.Background(), c, Target{Host: name, Addr: addr})
	})
	return ln.Addr().(*net.TCPAddr).Port
}

// sshArgs are the OpenSSH client options that make it trust only the
// sandbox's host CA, as the guest does, and offer no key.
func (e *gwEnv) sshArgs(name string, port int) []string {
	return []string{"-F", "/dev/null", "-o", "HostName=127.0.0.1", "-o", "HostKeyAlias=" + name, "-o", "UserKnownHostsFile=" + e.clientKH,
		"-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
		"-o", "IdentityAgent=none", "-o", "IdentitiesOnly=yes", "-o", "IdentityFile=/dev/null",
		"-o", "ConnectTimeout=20", "-P", fmt.Sprint(port)}
}

func (e *gwEnv) ssh(name string, port int, stdin string, args ...string) (string, string, int) {
	cmd := exec.Command("ssh", append(fixP(e.sshArgs(name, port)), args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		e.t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// expect waits for a record of kind whose fields match (substring).
func (e *gwEnv) expect(t *testing.T, kind string, match map[string]string) rec {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		e.mu.Lock()
		recs := append([]rec(nil), e.recs...)
		e.mu.Unlock()
	next:
		for _, r := range recs {
			if r.kind != kind {
				continue
			}
			for k, v := range match {
				if !strings.Contains(r.f(k), v) {
					continue next
				}
			}
			return r
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, r := range recs {
				fmt.Fprintf(&b, "%s %v\n", r.kind, r.fields)
			}
			t.Fatalf("no %s record with %v; got:\n%s", kind, match, b.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestGateway(t *testing.T) {
	e := newGWEnv(t)
	build1 := e.target("build1.test", e.a.Addr)

	t.Run("exec", func(t *testing.T) {
		out, errs, code := e.ssh("build1.test", build1, "", "root@build1.test", "echo hello; echo oops >&2; exit 7")
		if out != "hello\n" || !strings.Contains(errs, "oops") || code != 7 {
			t.Fatalf("out %q err %q code %d", out, errs, code)
		}
		r := e.expect(t, KindSession, map[string]string{"command": "echo hello", "exit_status": "7"})
		if r.f("auth") != "certificate" || !strings.Contains(r.f("cert_key_id"), "sandbox=test") || r.f("user") != "root" {
			t.Fatalf("session record %v", r.fields)
		}
		// sshd saw the certificate the gateway made: its key ID names the sandbox.
		if log := e.a.Log(); !strings.Contains(log, "sandbox=test") {
			t.Fatalf("sshd log does not show the certificate's key ID:\n%s", log)
		}
	})

	t.Run("stdin", func(t *testing.T) {
		in := strings.Repeat("x", 1<<20)
		out, _, code := e.ssh("build1.test", build1, in, "root@build1.test", "wc -c")
		if strings.TrimSpace(out) != "1048576" || code != 0 {
			t.Fatalf("out %q code %d", out, code)
		}
	})

	t.Run("signal", func(t *testing.T) {
		_, _, code := e.ssh("build1.test", build1, "", "root@build1.test", "kill -TERM $$")
		if code != 255 {
			t.Fatalf("code %d, want 255 (killed by a signal)", code)
		}
		e.expect(t, KindSession, map[string]string{"command": "kill -TERM", "exit_signal": "TERM"})
	})

	t.Run("env", func(t *testing.T) {
		cmd := exec.Command("ssh", append(fixP(e.sshArgs("build1.test", build1)),
			"-o", "SendEnv=SMXTEST_OK1 SMXTEST_NO", "root@build1.test", "echo ok=$SMXTEST_OK1 no=$SMXTEST_NO")...)
		cmd.Env = append(os.Environ(), "SMXTEST_OK1=yes", "SMXTEST_NO=leak")
		out, err := cmd.Output()
		if err != nil || strings.TrimSpace(string(out)) != "ok=yes no=" {
			t.Fatalf("%q %v", out, err)
		}
		e.expect(t, KindSession, map[string]string{"env_refused": "SMXTEST_NO"})
	})

	t.Run("disallowed user", func(t *testing.T) {
		_, errs, code := e.ssh("build1.test", build1, "", "admin@build1.test", "true")
		if code != 255 || !strings.Contains(errs, "smx: ssh to admin@build1.test port 22 is denied") {
			t.Fatalf("code %d stderr %q", code, errs)
		}
		r := e.expect(t, audit.KindSSHRefused, map[string]string{"user": "admin", "request": "connect"})
		if !strings.Contains(r.f("rule"), "ssh.deny[0]") {
			t.Fatalf("rule %q", r.f("rule"))
		}
		_, errs, code = e.ssh("build1.test", build1, "", "alice@build1.test", "true")
		if code != 255 || !strings.Contains(errs, "no ssh rule allows alice@build1.test") {
			t.Fatalf("code %d stderr %q", code, errs)
		}
	})

	t.Run("disallowed host and port", func(t *testing.T) {
		p := e.target("other.test", e.a.Addr)
		_, errs, code := e.ssh("other.test", p, "", "root@other.test", "true")
		if code != 255 || !strings.Contains(errs, "no ssh rule allows root@other.test port 22") {
			t.Fatalf("code %d stderr %q", code, errs)
		}
		p = e.target("build1.test", netip.AddrPortFrom(e.a.Addr.Addr(), 2222))
		_, errs, code = e.ssh("build1.test", p, "", "root@build1.test", "true")
		if code != 255 || !strings.Contains(errs, "no ssh rule allows root@build1.test port 2222") {
			t.Fatalf("code %d stderr %q", code, errs)
		}
		e.expect(t, audit.KindSSHRefused, map[string]string{"host": "other.test", "rule": "default deny"})
	})

	t.Run("refused by the network, explained in ssh", func(t *testing.T) {
		// A flow the network gateway refused is handed over only to say
		// why: even for a user the ssh section allows, nothing is dialled.
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		defer ln.Close()
		refusal := &policy.Decision{Rule: "test: network", Reason: "the network section refuses this"}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go e.gw.Serve(context.Background(), c, Target{Host: "build1.test", Addr: e.a.Addr, Refusal: refusal})
			}
		}()
		before := strings.Count(e.a.Log(), "Connection from")
		_, errs, code := e.ssh("build1.test", ln.Addr().(*net.TCPAddr).Port, "", "root@build1.test", "true")
		if code != 255 || !strings.Contains(errs, "the network section refuses this") {
			t.Fatalf("code %d stderr %q", code, errs)
		}
		if strings.Count(e.a.Log(), "Connection from") != before {
			t.Fatal("the gateway dialled a refused destination")
		}
		e.expect(t, audit.KindSSHRefused, map[string]string{"rule": "test: network", "user": "root"})
	})

	t.Run("sftp", func(t *testing.T) {
		src := filepath.Join(e.dir, "up.bin")
		os.WriteFile(src, bytes.Repeat([]byte("smx"), 100000), 0o644)
		// scp (SFTP mode, the default) and the sftp subsystem where allowed.
		scp := exec.Command("scp", append(append([]string(nil), e.sshArgs("build1.test", build1)...), src, "root@build1.test:/tmp/smx-up.bin")...)
		if out, err := scp.CombinedOutput(); err != nil {
			t.Fatalf("scp: %v\n%s", err, out)
		}
		out, _, _ := e.ssh("build1.test", build1, "", "root@build1.test", "wc -c < /tmp/smx-up.bin; rm /tmp/smx-up.bin")
		if strings.TrimSpace(out) != "300000" {
			t.Fatalf("uploaded %q bytes", out)
		}
		// Denied where the rule does not say sftp: allow, in both scp modes.
		nosftp := e.target("nosftp.test", e.a.Addr)
		for _, mode := range []string{"-s", "-O"} {
			scp := exec.Command("scp", append(append([]string{mode}, append([]string(nil), e.sshArgs("nosftp.test", nosftp)...)...), src, "root@nosftp.test:/tmp/x")...)
			out, err := scp.CombinedOutput()
			if err == nil || !strings.Contains(string(out), "the rule needs sftp: allow") {
				t.Fatalf("scp %s to nosftp: %v\n%s", mode, err, out)
			}
		}
		sftp := exec.Command("sftp", append(append([]string(nil), e.sshArgs("nosftp.test", nosftp)...), "-b", "-", "root@nosftp.test")...)
		sftp.Stdin = strings.NewReader("ls /\n")
		if out, err := sftp.CombinedOutput(); err == nil || !strings.Contains(string(out), "sftp: allow") {
			t.Fatalf("sftp to nosftp: %v\n%s", err, out)
		}
		e.expect(t, audit.KindSSHRefused, map[string]string{"host": "nosftp.test", "request": "subsystem sftp"})
		e.expect(t, audit.KindSSHRefused, map[string]string{"host": "nosftp.test", "request": "exec"})
	})

	t.Run("forwarding refused", func(t *testing.T) {
		for _, c := range []struct {
			flag    []string
			request string
		}{
			{[]string{"-L", "127.0.0.1:0:127.0.0.1:22"}, "direct-tcpip"},
			{[]string{"-R", "127.0.0.1:0:127.0.0.1:22"}, "tcpip-forward"},
			{[]string{"-A"}, "auth-agent-req@openssh.com"},
		} {
			args := append(append([]string{"-o", "ExitOnForwardFailure=yes"}, c.flag...), "root@build1.test", "true")
			if c.flag[0] == "-L" {
				// -L listens on the client; only a connection through it opens a channel.
				args = []string{"-W", "127.0.0.1:22", "root@build1.test"}
			}
			if c.flag[0] == "-A" {
				sock := filepath.Join(e.dir, "agent.sock")
				ag := exec.Command("ssh-agent", "-D", "-a", sock)
				ag.Start()
				t.Cleanup(func() { ag.Process.Kill(); ag.Wait() })
				waitListening(t, sock)
				// First value wins: this agent instead of sshArgs' none.
				cmd := exec.Command("ssh", append(append([]string{"-o", "IdentityAgent=" + sock}, fixP(e.sshArgs("build1.test", build1))...), args...)...)
				cmd.Env = append(os.Environ(), "SSH_AUTH_SOCK="+sock)
				out, _ := cmd.CombinedOutput()
				t.Logf("ssh -A: %s", out)
			}
			_, _, _ = e.ssh("build1.test", build1, "", args...)
			e.expect(t, audit.KindSSHRefused, map[string]string{"request": c.request, "host": "build1.test"})
		}
	})

	t.Run("forwarding allowed", func(t *testing.T) {
		fwd := e.target("fwd.test", e.a.Addr)
		// -W opens a direct-tcpip channel to sshd's own port: the banner comes back.
		out, _, _ := e.ssh("fwd.test", fwd, "", "-W", e.a.Addr.String(), "root@fwd.test")
		if !strings.HasPrefix(out, "SSH-2.0-OpenSSH") {
			t.Fatalf("through -W: %q", out)
		}
		e.expect(t, KindForward, map[string]string{"host": "fwd.test", "channel": "direct-tcpip"})
	})

	t.Run("host-held key", func(t *testing.T) {
		p := e.target("legacy.test", e.b.Addr)
		out, errs, code := e.ssh("legacy.test", p, "", "root@legacy.test", "echo legacy")
		if out != "legacy\n" || code != 0 {
			t.Fatalf("out %q err %q code %d", out, errs, code)
		}
		r := e.expect(t, KindSession, map[string]string{"host": "legacy.test"})
		if r.f("auth") != "key" || r.f("credential") != "legacy" {
			t.Fatalf("record %v", r.fields)
		}
		// sshd B does not trust the CA: a certificate is turned away.
		p = e.target("build1.test", e.b.Addr)
		_, errs, code = e.ssh("build1.test", p, "", "root@build1.test", "true")
		if code != 255 || !strings.Contains(errs, "host key") && !strings.Contains(errs, "did not accept") {
			t.Fatalf("code %d stderr %q", code, errs)
		}
	})

	t.Run("host ssh-agent, opted in", func(t *testing.T) {
		p := e.target("agent.test", e.b.Addr)
		out, errs, code := e.ssh("agent.test", p, "", "root@agent.test", "echo via agent")
		if out != "via agent\n" || code != 0 {
			t.Fatalf("out %q err %q code %d", out, errs, code)
		}
		r := e.expect(t, KindSession, map[string]string{"host": "agent.test"})
		if r.f("auth") != "agent" || r.f("credential") != "mine" {
			t.Fatalf("record %v", r.fields)
		}
	})

	t.Run("host certificate", func(t *testing.T) {
		p := e.target("certca.test", e.c.Addr)
		if out, errs, code := e.ssh("certca.test", p, "", "root@certca.test", "echo certified"); out != "certified\n" || code != 0 {
			t.Fatalf("%q %q %d", out, errs, code)
		}
		// The same server under a name its certificate does not carry.
		p = e.target("unknown.test", e.c.Addr)
		if _, errs, code := e.ssh("unknown.test", p, "", "root@unknown.test", "true"); code != 255 || !strings.Contains(errs, "is not in") {
			t.Fatalf("uncertified name: %q %d", errs, code)
		}
	})

	t.Run("host keys", func(t *testing.T) {
		p := e.target("changed.test", e.a.Addr)
		_, errs, code := e.ssh("changed.test", p, "", "root@changed.test", "true")
		if code != 255 || !strings.Contains(errs, "does not match") {
			t.Fatalf("changed: code %d stderr %q", code, errs)
		}
		e.expect(t, audit.KindSSHRefused, map[string]string{"host": "changed.test", "rule": RuleHostKeyChanged})
		p = e.target("unknown.test", e.a.Addr)
		_, errs, code = e.ssh("unknown.test", p, "", "root@unknown.test", "true")
		if code != 255 || !strings.Contains(errs, "is not in") {
			t.Fatalf("unknown: code %d stderr %q", code, errs)
		}
		e.expect(t, audit.KindSSHRefused, map[string]string{"host": "unknown.test", "rule": RuleHostKeyUnknown})
		// Pinned in the profile: no known_hosts entry needed.
		p = e.target("pinned.test", e.a.Addr)
		if out, errs, code := e.ssh("pinned.test", p, "", "root@pinned.test", "echo pinned"); out != "pinned\n" || code != 0 {
			t.Fatalf("pinned: %q %q %d", out, errs, code)
		}
		// A pin that does not match sshd B's key.
		p = e.target("pinned.test", e.b.Addr)
		if _, errs, code := e.ssh("pinned.test", p, "", "root@pinned.test", "true"); code != 255 || !strings.Contains(errs, "as the profile pins it") {
			t.Fatalf("pin mismatch: %q %d", errs, code)
		}
	})

	t.Run("git", func(t *testing.T) {
		p := e.target("forge.test", e.a.Addr)
		_, errs, code := e.ssh("forge.test", p, "", "root@forge.test", "git-upload-pack 'acme/secret.git'")
		if code == 0 || !strings.Contains(errs, "reading forge.test/acme/secret is denied") {
			t.Fatalf("read secret: %d %q", code, errs)
		}
		// A push needs the repository readable, as over HTTPS; its refs are
		// decided by the push filter (gitpush_test.go).
		_, errs, code = e.ssh("forge.test", p, "", "root@forge.test", "git-receive-pack '/acme/secret.git'")
		if code == 0 || !strings.Contains(errs, "reading forge.test/acme/secret is denied") {
			t.Fatalf("push secret: %d %q", code, errs)
		}
		e.expect(t, audit.KindSSHRefused, map[string]string{"request": "exec git-receive-pack", "repo": "forge.test/acme/secret"})
		_, errs, code = e.ssh("forge.test", p, "", "root@forge.test", "git-receive-pack 'other/app.git'")
		if code == 0 || !strings.Contains(errs, "no git rule allows reading forge.test/other/app") {
			t.Fatalf("push other: %d %q", code, errs)
		}
		e.expect(t, audit.KindSSHRefused, map[string]string{"request": "exec git-upload-pack", "repo": "forge.test/acme/secret"})
		_, errs, code = e.ssh("forge.test", p, "", "root@forge.test", "git-upload-pack 'acme/secret.git'; true")
		if code == 0 || !strings.Contains(errs, "names a Git service but is not a plain Git request") {
			t.Fatalf("smuggled: %d %q", code, errs)
		}
		for _, cmd := range []string{"git-upload-pack 'acme/app/../secret.git'", "git-upload-pack '/acme//secret.git'", "git-upload-pack '/'"} {
			_, errs, code := e.ssh("forge.test", p, "", "root@forge.test", cmd)
			if code == 0 || !strings.Contains(errs, "is not clean") {
				t.Fatalf("%s: %d %q", cmd, code, errs)
			}
		}
	})

	t.Run("pty and window-change", func(t *testing.T) {
		nc, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", build1))
		if err != nil {
			t.Fatal(err)
		}
		// The guest's view: the name it typed, the sandbox's host CA.
		cc, chans, reqs, err := ssh.NewClientConn(nc, "build1.test:22", &ssh.ClientConfig{User: "root",
			HostKeyCallback: (&ssh.CertChecker{IsHostAuthority: func(k ssh.PublicKey, _ string) bool {
				return string(k.Marshal()) == string(e.hostCA.PublicKey().Marshal())
			}}).CheckHostKey})
		if err != nil {
			t.Fatal(err)
		}
		c := ssh.NewClient(cc, chans, reqs)
		defer c.Close()
		s, err := c.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		if err := s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}); err != nil {
			t.Fatal(err)
		}
		in, _ := s.StdinPipe()
		out := &syncBuffer{}
		s.Stdout = out
		if err := s.Shell(); err != nil {
			t.Fatal(err)
		}
		io.WriteString(in, "stty size\n")
		waitFor := func(what string) {
			for deadline := time.Now().Add(30 * time.Second); !strings.Contains(out.String(), what); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("no %q in:\n%s", what, out.String())
				}
			}
		}
		waitFor("24 80")
		if err := s.WindowChange(50, 132); err != nil {
			t.Fatal(err)
		}
		// The resize and the keystrokes travel on separate paths through the
		// gateway (a request, channel data): let the resize land first.
		time.Sleep(300 * time.Millisecond)
		io.WriteString(in, "stty size; exit 5\n")
		err = s.Wait()
		if ee, ok := err.(*ssh.ExitError); !ok || ee.ExitStatus() != 5 {
			t.Fatalf("shell: %v\n%s", err, out.String())
		}
		if !strings.Contains(out.String(), "24 80") || !strings.Contains(out.String(), "50 132") {
			t.Fatalf("sizes not seen:\n%s", out.String())
		}
		e.expect(t, KindSession, map[string]string{"command": "shell", "pty": "true", "exit_status": "5"})
	})

	t.Run("parallel", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan string, 16)
		for i := 0; i < 16; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out, se, code := e.ssh("build1.test", build1, "", "root@build1.test", fmt.Sprintf("echo %d", i))
				if out != fmt.Sprintf("%d\n", i) || code != 0 {
					errs <- fmt.Sprintf("session %d: %q %q %d", i, out, se, code)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for s := range errs {
			t.Error(s)
		}
	})
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// fixP turns the -P of sshArgs (scp's spelling) into ssh's -p.
func fixP(a []string) []string {
	a = append([]string(nil), a...)
	a[len(a)-2] = "-p"
	return a
}

// TestCertificateExpiry asks sshd itself: a certificate of the user CA is
// accepted while valid and refused once its TTL has passed.
func TestCertificateExpiry(t *testing.T) {
	testutil.RequireSSHD(t)
	h := testutil.NewNetHost(t)
	dir := t.TempDir()
	ca, err := LoadOrCreateCA(filepath.Join(dir, UserCAFile), "smx-user-ca")
	if err != nil {
		t.Fatal(err)
	}
	caPub := filepath.Join(dir, "ca.pub")
	os.WriteFile(caPub, []byte(ca.AuthorizedKey()+"\n"), 0o644)
	sshd := testutil.StartSSHD(t, h, testutil.SSHDConfig{Addr: netip.AddrPortFrom(h.PublicIPs[0], 22), TrustedUserCAKeys: caPub})
	login := func(uc *UserCert) error {
		c, err := ssh.Dial("tcp", sshd.Addr.String(), &ssh.ClientConfig{User: "root", Auth: []ssh.AuthMethod{ssh.PublicKeys(uc.Signer)},
			HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: 20 * time.Second})
		if err == nil {
			c.Close()
		}
		return err
	}
	short, err := ca.IssueUserCert(CertOptions{User: "root", TTL: 2 * time.Second, Sandbox: "s", Profile: "sha256:x"})
	if err != nil {
		t.Fatal(err)
	}
	if err := login(short); err != nil {
		t.Fatalf("fresh certificate refused: %v\n%s", err, sshd.Log())
	}
	time.Sleep(3 * time.Second)
	if err := login(short); err == nil {
		t.Fatal("sshd accepted an expired certificate")
	}
	if log := sshd.Log(); !strings.Contains(log, "expired") && !strings.Contains(log, "Certificate invalid") {
		t.Fatalf("sshd did not say why:\n%s", log)
	}
	// Another principal is refused too: the certificate names one user.
	other, _ := ca.IssueUserCert(CertOptions{User: "deploy", TTL: time.Minute, Sandbox: "s", Profile: "sha256:x"})
	if c, err := ssh.Dial("tcp", sshd.Addr.String(), &ssh.ClientConfig{User: "root", Auth: []ssh.AuthMethod{ssh.PublicKeys(other.Signer)},
		HostKeyCallback: ssh.InsecureIgnoreHostKey()}); err == nil {
		c.Close()
		t.Fatal("sshd accepted a certificate for another principal")
	}
}

// waitListening waits until a unix socket accepts connections. The file
// appears at bind, before listen: a client that only waits for the file can
// still get "connection refused" (ssh-agent -D did, once in CI).
func waitListening(t testing.TB, sock string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not listening after 5s: %v", sock, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
