package testutil

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// SSHD is OpenSSH's sshd (Debian openssh-server) running in a NetHost's
// namespace: a real SSH server for the SSH gateway's tests.
type SSHD struct {
	Addr netip.AddrPort
	// HostKey is the server's public host key, "ssh-ed25519 AAAA...".
	HostKey string
	// HostKeyFile is the server's private host key (tests that replace a
	// host's key start a second sshd with another).
	HostKeyFile string
	// AuthorizedKeysFile is read at every login: tests may add keys.
	AuthorizedKeysFile string

	mu  sync.Mutex
	log bytes.Buffer
}

// SSHDConfig says how to run an sshd.
type SSHDConfig struct {
	Addr netip.AddrPort
	// TrustedUserCAKeys is a file of CA public keys whose user
	// certificates sshd accepts; "" for none.
	TrustedUserCAKeys string
	// AuthorizedKeys are public key lines accepted for every user.
	AuthorizedKeys []string
	// HostKeyFile reuses a host key; "" makes a new ed25519 one.
	HostKeyFile string
	// Extra are more sshd_config lines.
	Extra []string
	// Passwd are more /etc/passwd lines (e.g. a git user whose shell is
	// git-shell), seen only by this sshd and what it runs: a copy of
	// /etc/passwd with them is bind-mounted in sshd's mount namespace.
	Passwd []string
}

// RequireSSHD needs OpenSSH's sshd and ssh-keygen.
func RequireSSHD(t testing.TB) {
	t.Helper()
	_, err1 := os.Stat("/usr/sbin/sshd")
	_, err2 := exec.LookPath("ssh-keygen")
	Require(t, err1 == nil && err2 == nil, "OpenSSH sshd", "apt-get install openssh-server")
}

// StartSSHD runs sshd in h's namespace until the test ends. Root may log
// in with a key or certificate; the sftp subsystem is internal-sftp; TCP
// forwarding and agent forwarding are allowed (the gateway decides).
func StartSSHD(t testing.TB, h *NetHost, c SSHDConfig) *SSHD {
	t.Helper()
	RequireSSHD(t)
	dir := t.TempDir()
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil { // privilege separation directory
		t.Fatal(err)
	}
	hostKey := c.HostKeyFile
	if hostKey == "" {
		hostKey = filepath.Join(dir, "host_ed25519")
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "test-host", "-f", hostKey).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen: %v\n%s", err, out)
		}
	}
	pub, err := exec.Command("ssh-keygen", "-y", "-f", hostKey).Output()
	if err != nil {
		t.Fatalf("ssh-keygen -y: %v", err)
	}
	ak := filepath.Join(dir, "authorized_keys")
	if err := os.WriteFile(ak, []byte(strings.Join(c.AuthorizedKeys, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := []string{
		"ListenAddress " + c.Addr.String(),
		"HostKey " + hostKey,
		"PidFile none",
		"UsePAM no",
		"StrictModes no",
		"PermitRootLogin prohibit-password",
		"PasswordAuthentication no",
		"KbdInteractiveAuthentication no",
		"AuthorizedKeysFile " + ak,
		"Subsystem sftp internal-sftp",
		"AllowTcpForwarding yes",
		"AllowAgentForwarding yes",
		"AcceptEnv LANG LC_* SMXTEST_*",
		"LogLevel VERBOSE",
		"MaxStartups 100:30:200",
		"MaxSessions 100",
	}
	if c.TrustedUserCAKeys != "" {
		cfg = append(cfg, "TrustedUserCAKeys "+c.TrustedUserCAKeys)
	}
	cfg = append(cfg, c.Extra...)
	cfgPath := filepath.Join(dir, "sshd_config")
	if err := os.WriteFile(cfgPath, []byte(strings.Join(cfg, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &SSHD{Addr: c.Addr, HostKey: strings.Join(strings.Fields(string(pub))[:2], " "), HostKeyFile: hostKey, AuthorizedKeysFile: ak}
	cmd := exec.Command("ip", "netns", "exec", h.NS, "/usr/sbin/sshd", "-D", "-e", "-f", cfgPath)
	if len(c.Passwd) > 0 {
		base, err := os.ReadFile("/etc/passwd")
		if err != nil {
			t.Fatal(err)
		}
		pw := filepath.Join(dir, "passwd")
		if err := os.WriteFile(pw, append(base, []byte(strings.Join(c.Passwd, "\n")+"\n")...), 0o644); err != nil {
			t.Fatal(err)
		}
		// ip netns exec runs in a mount namespace of its own (slave to the
		// host's), so the bind mount is not seen outside.
		cmd = exec.Command("ip", "netns", "exec", h.NS, "sh", "-c", `mount --bind "$0" /etc/passwd && exec /usr/sbin/sshd -D -e -f "$1"`, pw, cfgPath)
	}
	cmd.Stdout, cmd.Stderr = (*sshdLog)(s), (*sshdLog)(s)
	if err := cmd.Start(); err != nil {
		t.Fatalf("sshd: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("sshd %s log:\n%s", c.Addr, s.Log())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", c.Addr.String(), time.Second)
		if err == nil {
			conn.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sshd on %s did not come up: %v\n%s", c.Addr, err, s.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return s
}

// Log is what sshd wrote so far.
func (s *SSHD) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.String()
}

type sshdLog SSHD

func (l *sshdLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.log.Write(p)
}

// KnownHostsLine is the known_hosts line for this server under name.
func (s *SSHD) KnownHostsLine(name string) string {
	host := name
	if s.Addr.Port() != 22 {
		host = fmt.Sprintf("[%s]:%d", name, s.Addr.Port())
	}
	return host + " " + s.HostKey
}

// SSHKey makes an unencrypted ed25519 key pair at path and path+".pub" with
// ssh-keygen and returns the public key line (no trailing newline).
func SSHKey(t testing.TB, path string) string {
	t.Helper()
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	pub, err := os.ReadFile(path + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(pub))
}

// SSHHostPair is the SSH gateway tests' two upstream servers in one
// NetHost: A, on PublicIPs[0], accepts user certificates of a CA; B, on
// PublicIPs[1], accepts only the key in Legacy (a key the host holds, for
// targets that do not trust the CA). OtherPub is a host key neither server
// has: a known_hosts line with it stands for a host whose key changed.
type SSHHostPair struct {
	A, B      *SSHD
	Legacy    string // private key file B accepts
	LegacyPub string // its public key line
	OtherPub  string
}

// StartSSHHostPair starts the pair, A trusting the CA public keys in
// caFile, with its key files in dir.
func StartSSHHostPair(t testing.TB, h *NetHost, caFile, dir string) *SSHHostPair {
	t.Helper()
	p := &SSHHostPair{Legacy: filepath.Join(dir, "legacy")}
	p.LegacyPub = SSHKey(t, p.Legacy)
	p.A = StartSSHD(t, h, SSHDConfig{Addr: netip.AddrPortFrom(h.PublicIPs[0], 22), TrustedUserCAKeys: caFile})
	p.B = StartSSHD(t, h, SSHDConfig{Addr: netip.AddrPortFrom(h.PublicIPs[1], 22), AuthorizedKeys: []string{p.LegacyPub}})
	p.OtherPub = SSHKey(t, filepath.Join(dir, "other"))
	return p
}

// ChangedLine is a known_hosts line giving host a key its server does not
// have.
func (p *SSHHostPair) ChangedLine(host string) string {
	return host + " " + strings.Join(strings.Fields(p.OtherPub)[:2], " ")
}

// WriteKnownHosts writes a known_hosts file of lines.
func WriteKnownHosts(t testing.TB, path string, lines ...string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}
