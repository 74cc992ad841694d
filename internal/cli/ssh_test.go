package cli_test

import (
	"bytes"
	"crypto/ed25519"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/smx-dev/smx/internal/testutil"
)

// sshEnv is a Debian sandbox whose guest reaches two real sshd servers in a
// network namespace through the SSH gateway: A trusts the smx user CA, B
// only a host-held key (the ssh_host credential legacy).
type sshEnv struct {
	*egressEnv
	a, b      *testutil.SSHD
	legacyKey []byte
	work      string // a host directory the sshd sessions (running on the host) write into
	hostEnv   []string
}

const sshTestProfile = `network:
  mode: default-deny
ssh:
  cert_ttl: 5m
  allow:
    - host: build1.test
      user: root
      sftp: allow
    - host: nosftp.test
      user: root
    - host: legacy.test
      user: root
    - host: changed.test
      user: root
    - host: forge.test
      user: root
  deny:
    - host: "*"
      user: admin
      ports: ["1-65535"]
git:
  repos:
    - repo: "forge.test/**/acme/app"
      read: allow
      push: allow
    - repo: "forge.test/**/acme/secret"
      read: deny
    - repo: "forge.test/**/acme/protected"
      read: allow
      push: allow
      refs:
        - ref: refs/heads/main
          push: deny
credentials:
  - name: legacy
    from: legacy-key
    ssh_host: legacy.test
`

func startSSHEnv(t *testing.T, name string) *sshEnv {
	t.Helper()
	testutil.RequireQEMU(t)
	testutil.RequireSSHD(t)
	h := testutil.NewNetHost(t)
	bin := testutil.Binaries(t)
	e := &sshEnv{egressEnv: &egressEnv{vmEnv: &vmEnv{t: t, bin: bin, home: vmHome(t, bin), name: name}, h: h, dir: t.TempDir()}}
	e.work = t.TempDir()
	image := testutil.DebianImage(t, e.home)

	caKey, err := e.cmd("ssh-ca", "show", "--key").Output()
	if err != nil {
		t.Fatalf("ssh-ca show: %v", err)
	}
	caFile := filepath.Join(e.dir, "smx_user_ca.pub")
	os.WriteFile(caFile, caKey, 0o644)
	pair := testutil.StartSSHHostPair(t, h, caFile, e.dir)
	e.a, e.b = pair.A, pair.B
	e.legacyKey, _ = os.ReadFile(pair.Legacy)
	if out, err := e.smx("creds", "set", "legacy-key", "--from-file", pair.Legacy); err != nil {
		t.Fatalf("creds set: %v\n%s", err, out)
	}
	kh := filepath.Join(e.dir, "known_hosts")
	testutil.WriteKnownHosts(t, kh, e.a.KnownHostsLine("build1.test"), e.a.KnownHostsLine("nosftp.test"),
		e.b.KnownHostsLine("legacy.test"), e.a.KnownHostsLine("forge.test"), pair.ChangedLine("changed.test"))
	hosts := testutil.HostsFile(t, map[string]string{
		"build1.test": h.PublicIPs[0].String(), "nosftp.test": h.PublicIPs[0].String(), "changed.test": h.PublicIPs[0].String(),
		"other.test": h.PublicIPs[0].String(), "legacy.test": h.PublicIPs[1].String(), "forge.test": h.PublicIPs[0].String(),
	})

	e.smx("agent", "rm", "-f", name)
	if out, err := e.smx("agent", "create", name, "--image", image, "--memory", "512M", "--profile", e.profile("ssh", sshTestProfile)); err != nil {
		t.Fatalf("create: %v\n%s", err, out)
	}
	t.Cleanup(func() { e.smx("agent", "rm", "-f", name) })
	e.hostEnv = []string{"SMX_HOSTS_FILE=" + hosts, "SMX_SSH_KNOWN_HOSTS=" + kh}
	c := e.cmd("agent", "start", name)
	c.Env = append(c.Env, e.hostEnv...)
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("start: %v\n%s", err, out)
	}
	return e
}

// guestSSH runs a shell script in the guest; ssh there is plain OpenSSH
// with no key and no configuration of its own.
func (e *sshEnv) guestSSH(script string) (string, int) {
	c := e.cmd("agent", "exec", e.name, "--", "sh", "-c", script)
	out, err := c.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		e.t.Fatal(err)
	}
	return string(out), code
}

const sshOpts = "-o BatchMode=yes -o ConnectTimeout=30"

// TestSSHGateway drives real OpenSSH tools in a Debian guest through the
// gateway to real sshd servers, and checks what the guest sees and what the
// log holds. One boot, many steps.
func TestSSHGateway(t *testing.T) {
	e := startSSHEnv(t, "sshgw")

	t.Run("exec and exit status", func(t *testing.T) {
		out, code := e.guestSSH("ssh " + sshOpts + " root@build1.test 'echo hello from $(hostname -s); exit 3'")
		if code != 3 || !strings.Contains(out, "hello from") {
			t.Fatalf("code %d out %q", code, out)
		}
		r := e.expect(t, want{kind: "ssh.session", host: "build1.test"})
		if r.f("auth") != "certificate" || !strings.Contains(r.f("cert_key_id"), "sandbox=sshgw") || r.f("exit_status") != "3" ||
			!strings.Contains(r.f("command"), "echo hello") {
			t.Fatalf("record %s", r)
		}
		if !strings.Contains(e.a.Log(), "sandbox=sshgw") {
			t.Fatalf("sshd did not see the sandbox's certificate:\n%s", e.a.Log())
		}
	})

	t.Run("pty and ctrl-c", func(t *testing.T) {
		start := time.Now()
		out, code := e.guestSSH("(sleep 3; printf '\\003') | ssh -tt " + sshOpts + " root@build1.test 'tty; sleep 60; echo not interrupted'")
		if !strings.Contains(out, "/dev/pts/") || strings.Contains(out, "not interrupted") || code == 0 {
			t.Fatalf("code %d out %q", code, out)
		}
		if time.Since(start) > 50*time.Second {
			t.Fatalf("Ctrl-C did not reach the remote command")
		}
		e.expect(t, want{kind: "ssh.session", host: "build1.test"})
	})

	t.Run("scp sftp rsync", func(t *testing.T) {
		dst := filepath.Join(e.work, "up.bin")
		out, code := e.guestSSH(fmt.Sprintf("head -c 3000000 /dev/urandom > /tmp/up.bin && scp %s /tmp/up.bin root@build1.test:%s && "+
			"scp %s root@build1.test:%s /tmp/down.bin && cmp /tmp/up.bin /tmp/down.bin && "+
			"echo 'ls %s' | sftp %s -b - root@build1.test && "+
			"rsync -a -e 'ssh %s' /etc/hostname root@build1.test:%s/rsynced && echo ALL-OK", sshOpts, dst, sshOpts, dst, e.work, sshOpts, sshOpts, e.work))
		if code != 0 || !strings.Contains(out, "ALL-OK") {
			t.Fatalf("code %d:\n%s", code, out)
		}
		if st, err := os.Stat(dst); err != nil || st.Size() != 3000000 {
			t.Fatalf("upload: %v", err)
		}
		guestName, _ := e.guestSSH("cat /etc/hostname")
		if b, err := os.ReadFile(filepath.Join(e.work, "rsynced")); err != nil || string(b) != guestName || len(b) == 0 {
			t.Fatalf("rsync: %q %v", b, err)
		}
		// Denied where the rule has no sftp: allow.
		for _, cmd := range []string{"scp " + sshOpts + " /etc/hostname root@nosftp.test:/tmp/x",
			"scp -O " + sshOpts + " /etc/hostname root@nosftp.test:/tmp/x",
			"echo ls | sftp " + sshOpts + " -b - root@nosftp.test"} {
			out, code := e.guestSSH(cmd)
			if code == 0 || !strings.Contains(out, "the rule needs sftp: allow") {
				t.Fatalf("%s: code %d:\n%s", cmd, code, out)
			}
		}
		e.expect(t, want{kind: "ssh.refused", host: "nosftp.test", rule: `ssh.allow\[1\]`, reason: "sftp: allow"})
	})

	t.Run("forwarding refused", func(t *testing.T) {
		cases := []struct{ cmd, request string }{
			{"ssh " + sshOpts + " -W 127.0.0.1:22 root@build1.test </dev/null", "direct-tcpip"}, // -J uses this
			{"ssh " + sshOpts + " -f -N -L 127.0.0.1:9922:127.0.0.1:22 root@build1.test && sleep 1 && " +
				"bash -c 'exec 3<>/dev/tcp/127.0.0.1/9922; sleep 2'", "direct-tcpip"},
			// SOCKS5: no authentication, then CONNECT 127.0.0.1:22.
			{"ssh " + sshOpts + " -f -N -D 127.0.0.1:9923 root@build1.test && sleep 1 && " +
				"bash -c 'exec 3<>/dev/tcp/127.0.0.1/9923; printf \"\\x05\\x01\\x00\\x05\\x01\\x00\\x01\\x7f\\x00\\x00\\x01\\x00\\x16\" >&3; sleep 2'", "direct-tcpip"},
			{"ssh " + sshOpts + " -o ExitOnForwardFailure=yes -R 127.0.0.1:0:127.0.0.1:22 root@build1.test true", "tcpip-forward"},
			{"eval $(ssh-agent) >/dev/null && ssh " + sshOpts + " -A root@build1.test true; ssh-agent -k >/dev/null", "auth-agent-req@openssh.com"},
		}
		for _, c := range cases {
			e.use(t, e.profile("same", sshTestProfile)) // a new step: only this case's records
			out, _ := e.guestSSH(c.cmd)
			r := e.expect(t, want{kind: "ssh.refused", host: "build1.test"})
			if r.f("request") != c.request {
				t.Fatalf("%s: refused %s, want %s (guest: %s)", c.cmd, r.f("request"), c.request, out)
			}
		}
		e.guestSSH("pkill -f 'ssh .* -N' ; true")
	})

	t.Run("disallowed user host port", func(t *testing.T) {
		for _, c := range []struct{ cmd, msg string }{
			{"ssh " + sshOpts + " admin@build1.test true", "smx: ssh to admin@build1.test port 22 is denied"},
			{"ssh " + sshOpts + " alice@build1.test true", "no ssh rule allows alice@build1.test port 22"},
			{"ssh " + sshOpts + " -p 2222 root@build1.test true", "no ssh rule allows root@build1.test port 2222"},
			{"ssh " + sshOpts + " root@other.test true", "Could not resolve hostname other.test"},
		} {
			out, code := e.guestSSH(c.cmd)
			if code != 255 || c.msg != "" && !strings.Contains(out, c.msg) {
				t.Fatalf("%s: code %d:\n%s", c.cmd, code, out)
			}
		}
		e.expect(t, want{kind: "ssh.refused", host: "build1.test", rule: `ssh.deny\[0\]`})
		// Port 2222 and other.test are named by no ssh rule: the network
		// section decides them, and default-deny refuses; the SSH gateway
		// only explains the port to the guest's ssh.
		e.expect(t, want{kind: "net.refused", dst: ":2222$"})
		e.expect(t, want{kind: "ssh.refused", host: "build1.test", rule: "default deny", reason: "port 2222"})
		e.expect(t, want{kind: "net.refused", host: "other.test"})
	})

	t.Run("host-held key", func(t *testing.T) {
		out, code := e.guestSSH("ssh " + sshOpts + " root@legacy.test 'echo via legacy key'")
		if code != 0 || !strings.Contains(out, "via legacy key") {
			t.Fatalf("code %d:\n%s", code, out)
		}
		r := e.expect(t, want{kind: "ssh.session", host: "legacy.test"})
		if r.f("auth") != "key" || r.f("credential") != "legacy" {
			t.Fatalf("record %s", r)
		}
	})

	t.Run("changed host key", func(t *testing.T) {
		out, code := e.guestSSH("ssh " + sshOpts + " root@changed.test true")
		if code != 255 || !strings.Contains(out, "does not match") {
			t.Fatalf("code %d:\n%s", code, out)
		}
		e.expect(t, want{kind: "ssh.refused", host: "changed.test", rule: "upstream host key changed"})
	})

	t.Run("git over ssh", func(t *testing.T) {
		// Bare repositories on the host (sshd runs there), each with a main branch.
		forge := filepath.Join(e.work, "acme")
		for _, r := range []string{"app", "secret", "protected"} {
			testutil.BareRepo(t, filepath.Join(forge, r+".git"), "init", nil)
		}
		gitEnv := "export GIT_SSH_COMMAND='ssh " + sshOpts + "' GIT_AUTHOR_NAME=a GIT_AUTHOR_EMAIL=a@a GIT_COMMITTER_NAME=a GIT_COMMITTER_EMAIL=a@a; cd /tmp && rm -rf app secret protected; "
		url := "root@forge.test:" + forge
		out, code := e.guestSSH(gitEnv + "git clone -q " + url + "/app.git && cd app && git commit -q --allow-empty -m from-guest && git push -q origin main && echo PUSHED")
		if code != 0 || !strings.Contains(out, "PUSHED") {
			t.Fatalf("clone and push app: %d\n%s", code, out)
		}
		if log, err := exec.Command("git", "-C", filepath.Join(forge, "app.git"), "log", "--format=%s", "-1", "main").Output(); err != nil || strings.TrimSpace(string(log)) != "from-guest" {
			t.Fatalf("the push did not land: %q %v", log, err)
		}
		out, code = e.guestSSH(gitEnv + "git clone -q " + url + "/secret.git")
		if code == 0 || !strings.Contains(out, "secret is denied") {
			t.Fatalf("clone secret: %d\n%s", code, out)
		}
		// Ref rules over SSH are the Git gateway's, as over HTTPS: main is
		// protected, another branch is not; a fast-forward is checked on the
		// sandbox's mirror of the forge, a rewrite is refused.
		out, code = e.guestSSH(gitEnv + "git clone -q " + url + "/protected.git && cd protected && git commit -q --allow-empty -m x && git push origin main")
		wantMain := "! [remote rejected] main -> main (smx: push to refs/heads/main denied by rule git.repos[2].refs[0] repo forge.test/**/acme/protected ref refs/heads/main (profile "
		if code == 0 || !strings.Contains(out, wantMain) {
			t.Fatalf("push protected main: %d\n%s\nwant %q", code, out, wantMain)
		}
		out, code = e.guestSSH(strings.Replace(gitEnv, "rm -rf app secret protected; ", "", 1) + "cd protected && git push -q origin main:agent/x && git commit -q --allow-empty -m y && git push -q origin main:agent/x && " +
			"git commit -q --amend --allow-empty -m z && git push --force origin main:agent/x")
		if code == 0 || !strings.Contains(out, "smx: force push (not a fast-forward of ") {
			t.Fatalf("push protected agent/x: %d\n%s", code, out)
		}
		if log, err := exec.Command("git", "-C", filepath.Join(forge, "protected.git"), "log", "--format=%s", "-1", "agent/x").Output(); err != nil || strings.TrimSpace(string(log)) != "y" {
			t.Fatalf("agent/x on the forge: %q %v", log, err)
		}
		e.expect(t, want{kind: "ssh.refused", host: "forge.test", rule: `git.repos\[1\]`})
		e.expect(t, want{kind: "git.refused", host: "forge.test", rule: `git.repos\[2\].refs\[0\]`})
		e.expect(t, want{kind: "git.refused", host: "forge.test", reason: `force push \(not a fast-forward`})
		e.expect(t, want{kind: "git.push", host: "forge.test"})
		e.expect(t, want{kind: "git.fetch", host: "forge.test"})
		e.expect(t, want{kind: "ssh.session", host: "forge.test"})
	})

	t.Run("parallel sessions", func(t *testing.T) {
		out, code := e.guestSSH("for i in $(seq 1 12); do ssh " + sshOpts + " root@build1.test \"echo s$i\" > /tmp/par.$i 2>&1 & done; wait; cat /tmp/par.*")
		for i := 1; i <= 12; i++ {
			if !strings.Contains(out, fmt.Sprintf("s%d\n", i)) {
				t.Fatalf("session %d missing (code %d):\n%s", i, code, out)
			}
		}
	})

	t.Run("fork trusts its own CA", func(t *testing.T) {
		// A marker in guest RAM shows the memory scan below can find things.
		marker, _ := e.guestSSH("head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \\n' | tee /dev/shm/marker")
		marker = strings.TrimSpace(marker)
		if len(marker) != 48 {
			t.Fatalf("marker %q", marker)
		}
		if out, err := e.smx("snapshot", "create", e.name, "--name", "sshgw-snap"); err != nil {
			t.Fatalf("snapshot: %v\n%s", err, out)
		}
		t.Cleanup(func() { e.smx("snapshot", "rm", "sshgw-snap") })
		r := e.cmd("agent", "restore", "sshgw-snap", "--name", "sshgw-fork")
		r.Env = append(r.Env, e.hostEnv...)
		if out, err := r.CombinedOutput(); err != nil {
			t.Fatalf("restore: %v\n%s", err, out)
		}
		t.Cleanup(func() { e.smx("agent", "rm", "-f", "sshgw-fork") })
		src, _ := e.guestSSH("grep cert-authority /etc/ssh/ssh_known_hosts")
		fork, err := e.smx("agent", "exec", "sshgw-fork", "--", "sh", "-c",
			"grep cert-authority /etc/ssh/ssh_known_hosts; ssh "+sshOpts+" root@build1.test 'echo from fork'")
		if err != nil || !strings.Contains(fork, "from fork") {
			t.Fatalf("ssh from the fork: %v\n%s", err, fork)
		}
		if strings.Count(fork, "@cert-authority") != 1 || !strings.Contains(fork, "smx-sandbox-sshgw-fork") || strings.Contains(fork, strings.TrimSpace(src)) {
			t.Fatalf("fork's known_hosts:\n%s\nsource's:\n%s", fork, src)
		}
		// The snapshot's memory is the guest's RAM after all the sessions
		// above: no private key the gateway used may be in it.
		mem, err := os.ReadFile(filepath.Join(e.home, "snapshots", "sshgw-snap", "memory.state"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(mem, []byte(marker)) {
			t.Fatal("the memory scan does not find a marker the guest holds in RAM")
		}
		userCA, _ := os.ReadFile(filepath.Join(e.home, "ssh", "user_ca"))
		hostCA, _ := os.ReadFile(filepath.Join(e.home, "sandboxes", e.name, "ssh_host_ca"))
		for what, pemKey := range map[string][]byte{"user CA": userCA, "host CA": hostCA, "legacy key": e.legacyKey} {
			k, err := ssh.ParseRawPrivateKey(pemKey)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			priv, ok := k.(*ed25519.PrivateKey)
			if !ok {
				t.Fatalf("%s: %T", what, k)
			}
			if bytes.Contains(mem, priv.Seed()) {
				t.Fatalf("the guest's memory holds the %s", what)
			}
			for _, line := range strings.Split(string(pemKey), "\n") {
				if len(line) > 20 && !strings.HasPrefix(line, "-----") && bytes.Contains(mem, []byte(line)) {
					t.Fatalf("the guest's memory holds the %s (PEM)", what)
				}
			}
		}
		// The source still works, with its own CA.
		if out, code := e.guestSSH("ssh " + sshOpts + " root@build1.test 'echo from source'"); code != 0 || !strings.Contains(out, "from source") {
			t.Fatalf("source after the fork: %d\n%s", code, out)
		}
	})

	t.Run("no keys in the guest or the log", func(t *testing.T) {
		out, _ := e.guestSSH("ls -a /root/.ssh 2>/dev/null; env | grep -i -e ssh_auth -e private; " +
			"grep -rl -e 'PRIVATE KEY' /root /etc /tmp /home /var/tmp 2>/dev/null; echo END")
		if strings.Contains(out, "id_") || strings.Contains(out, "SSH_AUTH_SOCK") || strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(out), "END")) != "" &&
			!onlyKnownHosts(out) {
			t.Fatalf("guest holds keys or key material:\n%s", out)
		}
		// The guest trusts the sandbox's SSH host CA, and nothing else was put there.
		kh, _ := e.guestSSH("cat /etc/ssh/ssh_known_hosts")
		if strings.Count(kh, "@cert-authority * ssh-ed25519 ") != 1 || strings.Contains(kh, "PRIVATE") {
			t.Fatalf("ssh_known_hosts:\n%s", kh)
		}
		logs, err := e.cmd("agent", "logs", e.name, "--json").Output()
		if err != nil {
			t.Fatal(err)
		}
		ca, _ := os.ReadFile(filepath.Join(e.home, "ssh", "user_ca"))
		for what, key := range map[string][]byte{"legacy key": e.legacyKey, "user CA": ca} {
			for _, line := range strings.Split(string(key), "\n") {
				if len(line) > 20 && !strings.HasPrefix(line, "-----") && strings.Contains(string(logs), line) {
					t.Fatalf("the log holds the %s", what)
				}
			}
		}
	})

	// Last: it changes the profile.
	t.Run("profile change closes live sessions", func(t *testing.T) {
		e.guestSSH("setsid sh -c 'ssh " + sshOpts + " root@build1.test \"echo started; sleep 120; echo finished\" > /tmp/live.out 2>&1; echo exit=$? >> /tmp/live.out' </dev/null >/dev/null 2>&1 &")
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(300 * time.Millisecond) {
			out, _ := e.guestSSH("cat /tmp/live.out")
			if strings.Contains(out, "started") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("session did not start: %q", out)
			}
		}
		prev := e.mark
		if recs := e.records(t, false); len(recs) > 0 {
			prev = recs[len(recs)-1].Seq
		}
		e.use(t, e.profile("nossh", strings.Replace(sshTestProfile, "    - host: build1.test\n      user: root\n      sftp: allow\n", "", 1)))
		e.mark = prev // the closing is logged while the profile changes
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(300 * time.Millisecond) {
			out, _ := e.guestSSH("cat /tmp/live.out")
			if strings.Contains(out, "finished") {
				t.Fatalf("the session outlived the rule: %q", out)
			}
			if strings.Contains(out, "exit=") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the session is still running: %q", out)
			}
		}
		e.expect(t, want{kind: "net.refused", host: "build1.test", reason: "policy changed"})
		// No rule names build1.test any more: it does not even resolve.
		out, code := e.guestSSH("ssh " + sshOpts + " root@build1.test true")
		if code != 255 || !strings.Contains(out, "Could not resolve hostname build1.test") {
			t.Fatalf("after the change: %d\n%s", code, out)
		}
		e.expect(t, want{kind: "net.refused", proto: "dns", host: "build1.test"})
	})
}

// onlyKnownHosts reports whether the guest's listing names nothing but
// the known_hosts files (which hold public keys only).
func onlyKnownHosts(out string) bool {
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || l == "END" || l == "." || l == ".." || l == "known_hosts" || strings.HasSuffix(l, "known_hosts") {
			continue
		}
		return false
	}
	return true
}
