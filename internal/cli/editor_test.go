package cli_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/smx-dev/smx/internal/testutil"
)

// TestEditorSSH connects the system's OpenSSH client to a Debian sandbox
// the way an editor does: through `smx agent ssh-config`'s Host block,
// whose ProxyCommand carries the connection over the supervisor's socket.
// No port is opened on the host or in the guest.
func TestEditorSSH(t *testing.T) {
	testutil.RequireQEMU(t)
	if _, err := exec.LookPath("ssh"); err != nil {
		testutil.Require(t, false, "OpenSSH client", "apt-get install openssh-client")
	}
	bin := testutil.Binaries(t)
	img := testutil.DebianImage(t, vmHome(t, bin))
	v := startSandbox(t, "edssh", "--image", img, "--memory", "512M")
	dir := t.TempDir()

	out, err := v.cmd("agent", "ssh-config", v.name).Output()
	if err != nil {
		t.Fatalf("ssh-config: %v", err)
	}
	cfg := string(out)
	for _, want := range []string{"Host edssh\n", "ProxyCommand " + filepath.Join(v.bin, "smx") + " agent ssh-proxy edssh\n",
		"StrictHostKeyChecking yes\n", "User root\n"} {
		if !strings.Contains(cfg, want) {
			t.Fatalf("ssh-config lacks %q:\n%s", want, cfg)
		}
	}
	conf := filepath.Join(dir, "config")
	os.WriteFile(conf, out, 0o600)
	key := regexp.MustCompile(`IdentityFile (\S+)`).FindStringSubmatch(cfg)[1]
	if st, err := os.Stat(key); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("client key %s: %v %v", key, st.Mode(), err)
	}
	scp := func(args ...string) *exec.Cmd {
		c := exec.Command("scp", append([]string{"-F", conf, "-o", "BatchMode=yes"}, args...)...)
		c.Env = v.cmd().Env
		return c
	}
	sshc := func(conf string, args ...string) *exec.Cmd {
		c := exec.Command("ssh", append([]string{"-F", conf, "-o", "BatchMode=yes"}, args...)...)
		c.Env = v.cmd().Env
		return c
	}

	t.Run("uname", func(t *testing.T) {
		out, err := sshc(conf, "edssh", "uname").CombinedOutput()
		if err != nil || string(out) != "Linux\n" {
			t.Fatalf("ssh uname: %v %q", err, out)
		}
		err = sshc(conf, "edssh", "exit 3").Run()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
			t.Fatalf("exit 3: %v", err)
		}
		// smx agent ssh runs the same client.
		out, err = v.cmd("agent", "ssh", v.name, "--", "echo", "via-agent-ssh").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "via-agent-ssh") {
			t.Fatalf("agent ssh: %v %q", err, out)
		}
	})

	t.Run("pty", func(t *testing.T) {
		out, err := sshc(conf, "-tt", "edssh", "tty; stty size").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "/dev/pts/") {
			t.Fatalf("ssh -tt: %v %q", err, out)
		}
	})

	t.Run("scp", func(t *testing.T) {
		data := make([]byte, 3<<20)
		rand.Read(data)
		in, back := filepath.Join(dir, "in.bin"), filepath.Join(dir, "back.bin")
		os.WriteFile(in, data, 0o644)
		for _, mode := range []string{"-O", "-s"} { // scp's own protocol, then sftp
			os.Remove(back)
			if out, err := scp(mode, in, "edssh:/tmp/in.bin").CombinedOutput(); err != nil {
				t.Fatalf("scp %s in: %v %s", mode, err, out)
			}
			if out, err := scp(mode, "edssh:/tmp/in.bin", back).CombinedOutput(); err != nil {
				t.Fatalf("scp %s out: %v %s", mode, err, out)
			}
			if got, _ := os.ReadFile(back); !bytes.Equal(got, data) {
				t.Fatalf("scp %s: %d bytes came back, not the %d sent", mode, len(got), len(data))
			}
		}
	})

	t.Run("wrong key refused", func(t *testing.T) {
		_, priv, _ := ed25519.GenerateKey(rand.Reader)
		blk, _ := ssh.MarshalPrivateKey(priv, "")
		other := filepath.Join(dir, "other_key")
		os.WriteFile(other, pem.EncodeToMemory(blk), 0o600)
		bad := filepath.Join(dir, "config-other-key")
		os.WriteFile(bad, []byte(strings.Replace(cfg, key, other, 1)), 0o600)
		out, err := sshc(bad, "edssh", "echo should-not-run").CombinedOutput()
		if err == nil || strings.Contains(string(out), "should-not-run") || !strings.Contains(string(out), "Permission denied") {
			t.Fatalf("another key was let in: %v %q", err, out)
		}
		if r := v.refusals(t, "ssh.login.refused"); len(r) == 0 || r[len(r)-1].f("user") != "root" {
			t.Fatalf("no ssh.login.refused record for the wrong key: %v", r)
		}
		// A host key other than the one pinned is not trusted either.
		kh := filepath.Join(dir, "known_hosts")
		pub, _ := ssh.NewPublicKey(priv.Public())
		os.WriteFile(kh, []byte("smx-edssh "+string(ssh.MarshalAuthorizedKey(pub))), 0o600)
		khc := filepath.Join(dir, "config-other-hostkey")
		os.WriteFile(khc, []byte(regexp.MustCompile(`UserKnownHostsFile \S+`).ReplaceAllString(cfg, "UserKnownHostsFile "+kh)), 0o600)
		out, err = sshc(khc, "edssh", "echo should-not-run").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "Host key verification failed") {
			t.Fatalf("a different host key was accepted: %v %q", err, out)
		}
	})

	// What VS Code Remote-SSH does: run its install-and-start script
	// through an exec channel, read the port its server listens on
	// (guest loopback only), then reach it through a direct-tcpip
	// forward. A perl stand-in plays the server.
	t.Run("vscode-like", func(t *testing.T) {
		script := `set -e
setsid perl -MIO::Socket::INET -e '
  $s = IO::Socket::INET->new(LocalAddr => "127.0.0.1", LocalPort => 0, Listen => 5, ReuseAddr => 1) or die "listen: $!";
  open(F, ">", "/tmp/standin.port"); print F $s->sockport, "\n"; close F;
  while ($c = $s->accept) { $l = <$c>; print $c "standin-server got $l"; close $c }
' </dev/null >/tmp/standin.log 2>&1 &
i=0; while [ ! -s /tmp/standin.port ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
echo "listeningOn=$(cat /tmp/standin.port)"
`
		c := sshc(conf, "edssh", "bash")
		c.Stdin = strings.NewReader(script)
		out, err := c.CombinedOutput()
		m := regexp.MustCompile(`listeningOn=(\d+)`).FindStringSubmatch(string(out))
		if err != nil || m == nil {
			t.Fatalf("server script: %v %q", err, out)
		}
		fw := sshc(conf, "-W", "127.0.0.1:"+m[1], "edssh")
		fw.Stdin = strings.NewReader("hello-through-forward\n")
		out, err = fw.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "standin-server got hello-through-forward") {
			t.Fatalf("forward to guest loopback: %v %q", err, out)
		}
		// Forwards reach the guest's loopback only: not the network.
		fw = sshc(conf, "-W", "10.0.2.2:80", "edssh")
		out, err = fw.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "administratively prohibited") {
			t.Fatalf("a forward off the guest's loopback was opened: %v %q", err, out)
		}
	})

	t.Run("audit", func(t *testing.T) {
		out, err := v.cmd("agent", "logs", v.name, "--json").Output()
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, l := range strings.Split(string(out), "\n") {
			var r logRecord
			if json.Unmarshal([]byte(l), &r) != nil {
				continue
			}
			switch {
			case r.Kind == "ssh.login" && strings.HasPrefix(r.f("key"), "SHA256:"):
				seen["login"] = true
			case r.Kind == "exec.start" && strings.Contains(r.f("args"), "uname"):
				seen["exec"] = true
			case r.Kind == "ssh.tunnel" && r.f("host") == "127.0.0.1" && r.f("bytes_in") != "0":
				seen["forward"] = true
			case r.Kind == "ssh.tunnel.refused" && r.f("host") == "10.0.2.2":
				seen["tunnel refused"] = true
			}
		}
		for _, k := range []string{"login", "exec", "forward", "tunnel refused"} {
			if !seen[k] {
				t.Errorf("no %s record in the log", k)
			}
		}
	})
}
