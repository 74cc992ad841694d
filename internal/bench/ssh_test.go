package bench

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/testutil"
)

// BenchmarkSSH compares SSH through the smx SSH gateway with ssh from the
// host to the same sshd (the peer), and with ssh from the same
// guest straight to that sshd with a key of its own (the network gateway
// splicing TCP, no SSH termination): the last isolates what terminating
// and re-originating SSH costs from what running the client under TCG
// costs. sshd runs in a network namespace and trusts the smx user CA.
// Sub-benchmarks:
//
//   - setup: 10 sequential `ssh HOST true` (connect, authenticate, exec,
//     close), timed where the client runs (ms per session);
//   - scp-200MB: scp of a 200 MB file to the server's /dev/null (MB/s).
//
// The ratios are logged at the end (run with -v).
func BenchmarkSSH(b *testing.B) {
	setup(b)
	testutil.RequireSSHD(b)
	h := testutil.NewNetHost(b)
	image := testutil.DebianImage(b, home)
	dir := b.TempDir()

	caKey, err := smx("ssh-ca", "show", "--key")
	if err != nil {
		b.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pub")
	os.WriteFile(caFile, []byte(caKey), 0o644)
	hostKey := filepath.Join(dir, "id")
	hostPub := testutil.SSHKey(b, hostKey)
	sshd := testutil.StartSSHD(b, h, testutil.SSHDConfig{Addr: netip.AddrPortFrom(h.PublicIPs[0], 22), TrustedUserCAKeys: caFile,
		AuthorizedKeys: []string{hostPub}})
	kh := filepath.Join(dir, "known_hosts")
	os.WriteFile(kh, []byte(sshd.KnownHostsLine("bench.test")+"\n"+sshd.KnownHostsLine(h.PublicIPs[0].String())+"\n"), 0o644)
	hosts := testutil.HostsFile(b, map[string]string{"bench.test": h.PublicIPs[0].String()})

	name := "bench-ssh"
	prof := filepath.Join(dir, "ssh.yaml")
	os.WriteFile(prof, []byte(fmt.Sprintf(`network:
  mode: default-deny
  allow:
    - cidr: 198.18.%d.0/29
      ports: [22]
ssh:
  allow:
    - host: bench.test
      user: root
      sftp: allow
`, h.N)), 0o644)
	smx("agent", "rm", "-f", name)
	if out, err := smx("agent", "create", name, "--image", image, "--memory", "1G", "--disk", "2G", "--profile", prof); err != nil {
		b.Fatal(err, out)
	}
	defer smx("agent", "rm", "-f", name)
	start := exec.Command(filepath.Join(bin, "smx"), "agent", "start", name)
	start.Env = append(os.Environ(), "SMX_HOME="+home, "SMX_HOSTS_FILE="+hosts, "SMX_SSH_KNOWN_HOSTS="+kh)
	if out, err := start.CombinedOutput(); err != nil {
		b.Fatal(err, string(out))
	}
	guest := func(script string) string {
		out, err := smx("agent", "exec", name, "--", "sh", "-c", script)
		if err != nil {
			b.Fatal(err)
		}
		return out
	}
	// The guest's own key, for the direct path only.
	gpub := guest("ssh-keygen -q -t ed25519 -N '' -f /root/.ssh/id_ed25519 </dev/null >/dev/null 2>&1; cat /root/.ssh/id_ed25519.pub")
	ak, _ := os.ReadFile(sshd.AuthorizedKeysFile)
	os.WriteFile(sshd.AuthorizedKeysFile, append(ak, []byte(strings.TrimSpace(gpub)+"\n")...), 0o600)
	guest(fmt.Sprintf("echo '%s' >> /root/.ssh/known_hosts; head -c 200000000 /dev/zero > /root/f200", sshd.KnownHostsLine(h.PublicIPs[0].String())))
	os.WriteFile(filepath.Join(dir, "f200"), make([]byte, 200000000), 0o644)

	opts := "-o BatchMode=yes -o StrictHostKeyChecking=yes"
	hostOpts := fmt.Sprintf("-F /dev/null -i %s -o IdentitiesOnly=yes -o UserKnownHostsFile=%s %s", hostKey, kh, opts)
	paths := []struct{ name, where, target, opts string }{
		{"host", "host", "root@bench.test -o HostName=" + h.PublicIPs[0].String(), hostOpts},
		{"guest-direct", "guest", "root@" + h.PublicIPs[0].String(), opts + " -o IdentitiesOnly=yes -i /root/.ssh/id_ed25519"},
		{"gateway", "guest", "root@bench.test", opts + " -o IdentityFile=/dev/null"},
	}
	// run times script where the client runs and returns seconds.
	run := func(where, script string) float64 {
		timed := "s=$(date +%s%N); " + script + " >/dev/null 2>&1 || echo FAILED; e=$(date +%s%N); echo $(( (e - s) / 1000 ))"
		var out string
		if where == "host" {
			o, err := exec.Command("sh", "-c", timed).CombinedOutput()
			if err != nil {
				b.Fatal(err, string(o))
			}
			out = string(o)
		} else {
			out = guest(timed)
		}
		if strings.Contains(out, "FAILED") {
			b.Fatalf("%s: %s failed", where, script)
		}
		us, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
		if err != nil {
			b.Fatalf("%q", out)
		}
		return us / 1e6
	}
	setupMS := map[string]float64{}
	for _, p := range paths {
		b.Run("setup/"+p.name, func(b *testing.B) {
			var sum float64
			for i := 0; i < b.N; i++ {
				sum += run(p.where, fmt.Sprintf("for i in 1 2 3 4 5 6 7 8 9 10; do ssh %s %s true || exit 1; done", p.opts, p.target))
			}
			setupMS[p.name] = sum / float64(b.N) / 10 * 1000
			b.ReportMetric(setupMS[p.name], "ms/session")
		})
	}
	mbps := map[string]float64{}
	for _, p := range paths {
		b.Run("scp-200MB/"+p.name, func(b *testing.B) {
			file := "/root/f200"
			target := p.target
			if p.where == "host" {
				file = filepath.Join(dir, "f200")
				target = "root@bench.test"
			}
			scpOpts := p.opts
			if p.where == "host" {
				scpOpts += " -o HostName=" + h.PublicIPs[0].String()
			}
			var sum float64
			for i := 0; i < b.N; i++ {
				sum += run(p.where, fmt.Sprintf("scp %s %s %s:/dev/null", scpOpts, file, strings.Fields(target)[0]))
			}
			mbps[p.name] = 200 * float64(b.N) / sum
			b.ReportMetric(mbps[p.name], "MB/s")
		})
	}
	if len(setupMS) == 3 && len(mbps) == 3 {
		b.Logf("session setup: gateway %.0f ms, host ssh %.0f ms (ratio %.2f, goal <= 1.5), guest direct %.0f ms (gateway/direct %.2f)",
			setupMS["gateway"], setupMS["host"], setupMS["gateway"]/setupMS["host"], setupMS["guest-direct"], setupMS["gateway"]/setupMS["guest-direct"])
		b.Logf("scp 200 MB: gateway %.1f MB/s, host scp %.1f MB/s (ratio %.2f, goal >= 0.8), guest direct %.1f MB/s (gateway/direct %.2f)",
			mbps["gateway"], mbps["host"], mbps["gateway"]/mbps["host"], mbps["guest-direct"], mbps["gateway"]/mbps["guest-direct"])
	}
}
