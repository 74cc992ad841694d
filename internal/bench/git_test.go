package bench

import (
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/statedir"
	"github.com/smx-dev/smx/internal/testutil"
)

// BenchmarkGit compares Git through the smx Git gateway with its peers,
// against one forge (git http-backend behind HTTPS and basic auth in a
// network namespace, reached by name through SMX_HOSTS_FILE):
//
//   - host: git on the host talking to the forge directly, with the token;
//   - smx-gateway: git in a Debian sandbox with no token, through the
//     gateway (TLS terminated, rules decided, token added upstream);
//   - open-token-in-guest: git in the same kind of sandbox under allow-all
//     networking with no forge named (plain TCP splice), holding the token.
//
// Sub-benchmarks: clone of a ~50 MB repository (incompressible blobs), and
// a push of 100 new commits that fast-forward an existing branch (through
// the gateway this includes the fast-forward check: mirror fetch,
// quarantine index, merge-base). Ratios are logged (run with -v).
func BenchmarkGit(b *testing.B) {
	setup(b)
	testutil.RequireGit(b)
	h := testutil.NewNetHost(b)
	const token = "ghp_bench_0b7d5e3f9a1c"
	forge := testutil.NewGitForge(b, "forge.test", token)
	work := forge.NewRepo(b, "acme/big.git", 1)
	blob := make([]byte, 1<<20)
	for i := 0; i < 50; i++ {
		rand.Read(blob)
		os.WriteFile(filepath.Join(work, fmt.Sprintf("blob%02d.bin", i)), blob, 0o644)
		if i%10 == 9 {
			testutil.Git(b, work, "add", ".")
			testutil.Git(b, work, "commit", "-q", "-m", fmt.Sprintf("blobs to %d", i))
		}
	}
	bare := filepath.Join(forge.Root, "acme/big.git")
	testutil.Git(b, work, "push", "-q", bare, "main", "main:refs/heads/bench-host", "main:refs/heads/bench-smx-gateway", "main:refs/heads/bench-open-token-in-guest")
	addr := h.PublicIPs[0].String()
	forge.Serve(b, h.Listen(b, "tcp4", addr+":8443"))
	hosts := testutil.HostsFile(b, map[string]string{"forge.test": addr})
	image := testutil.DebianImage(b, home)
	set := exec.Command(filepath.Join(bin, "smx"), "creds", "set", "forge-token")
	set.Env, set.Stdin = append(os.Environ(), "SMX_HOME="+home), strings.NewReader(token)
	if out, err := set.CombinedOutput(); err != nil {
		b.Fatalf("creds set: %v\n%s", err, out)
	}

	gw := startGitGuest(b, "bench-git-gw", image, hosts, forge.CAFile, `network:
  mode: default-deny
  allow:
    - domain: forge.test
      ports: [8443]
git:
  repos:
    - repo: forge.test/acme/*
      read: allow
      push: allow
credentials:
  - name: forge
    from: forge-token
    forge: forge.test
`)
	defer gw.Close()
	open := startGitGuest(b, "bench-git-open", image, hosts, forge.CAFile, "network:\n  mode: allow-all\n")
	defer open.Close()
	if _, err := open.Exec(strings.NewReader(string(forge.CA)), "sh", "-c", "cat > /root/forge-ca.pem"); err != nil {
		b.Fatal(err)
	}

	hostGit := func(dir string, args ...string) error {
		cmd := testutil.GitCmd(dir, append([]string{"-c", "http.curloptResolve=forge.test:8443:" + addr}, args...)...)
		cmd.Env = append(cmd.Env, "GIT_SSL_CAINFO="+forge.CAFile)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v\n%s", err, out)
		}
		return nil
	}
	const guestSetup = "export HOME=/root; git config --global user.name b; git config --global user.email b@example.test; "
	peers := []struct {
		name string
		url  string
		run  func(script string) error
	}{
		{"host", "https://x:" + token + "@forge.test:8443/acme/big", nil},
		{"smx-gateway", "https://forge.test:8443/acme/big", func(s string) error {
			out, err := gw.Exec(nil, "sh", "-c", guestSetup+s)
			if err != nil {
				return fmt.Errorf("%v\n%s", err, out)
			}
			return nil
		}},
		{"open-token-in-guest", "https://x:" + token + "@forge.test:8443/acme/big", func(s string) error {
			out, err := open.Exec(nil, "sh", "-c", guestSetup+"export GIT_SSL_CAINFO=/root/forge-ca.pem; "+s)
			if err != nil {
				return fmt.Errorf("%v\n%s", err, out)
			}
			return nil
		}},
	}
	hostDir := b.TempDir()

	secs := map[string]float64{}
	for _, p := range peers {
		b.Run("clone-50MB/"+p.name, func(b *testing.B) {
			var total time.Duration
			for i := 0; i < b.N; i++ {
				var err error
				start := time.Now()
				if p.run == nil {
					dst := filepath.Join(hostDir, fmt.Sprintf("clone%d", i))
					err = hostGit("", "clone", "-q", p.url, dst)
					total += time.Since(start)
					os.RemoveAll(dst)
				} else {
					err = p.run("rm -rf /root/c && git clone -q " + p.url + " /root/c")
					total += time.Since(start)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			secs["clone/"+p.name] = total.Seconds() / float64(b.N)
			b.ReportMetric(total.Seconds()/float64(b.N), "s/clone")
		})
	}

	// Push: each place has a clone; every iteration adds 100 commits on top
	// of its branch and pushes them (a fast-forward of an existing branch).
	hostWork := filepath.Join(hostDir, "push")
	if err := hostGit("", "clone", "-q", peers[0].url, hostWork); err != nil {
		b.Fatal(err)
	}
	const commits = `for i in $(seq 1 100); do echo "$i $RANDOM" > n.txt; git add n.txt; git commit -q -m "c $i"; done`
	for _, p := range peers {
		branch := "bench-" + p.name
		prepare := func(b *testing.B) {
			if p.run == nil {
				cmd := exec.Command("sh", "-c", "git checkout -q "+branch+" 2>/dev/null || git checkout -q -b "+branch+" origin/"+branch+"; "+commits)
				cmd.Dir = hostWork
				cmd.Env = testutil.GitCmd("").Env
				if out, err := cmd.CombinedOutput(); err != nil {
					b.Fatalf("%v\n%s", err, out)
				}
				return
			}
			if err := p.run("(test -d /root/c || git clone -q " + p.url + " /root/c) && cd /root/c && (git checkout -q " + branch + " 2>/dev/null || git checkout -q -b " + branch + " origin/" + branch + ") && " + commits); err != nil {
				b.Fatal(err)
			}
		}
		push := func() (time.Duration, error) {
			start := time.Now()
			var err error
			if p.run == nil {
				err = hostGit(hostWork, "push", "-q", "origin", branch)
			} else {
				err = p.run("cd /root/c && git push -q origin " + branch)
			}
			return time.Since(start), err
		}
		b.Run("push-100-commits/"+p.name, func(b *testing.B) {
			// The first push is timed on its own: through the gateway it
			// fills the host-side mirror (a full fetch of the repository).
			b.StopTimer()
			prepare(b)
			first, err := push()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(first.Seconds(), "s/first-push")
			var total time.Duration
			for i := 0; i < b.N; i++ {
				prepare(b)
				b.StartTimer()
				d, err := push()
				b.StopTimer()
				total += d
				if err != nil {
					b.Fatal(err)
				}
			}
			secs["push/"+p.name] = total.Seconds() / float64(b.N)
			secs["first-push/"+p.name] = first.Seconds()
			b.ReportMetric(total.Seconds()/float64(b.N), "s/push")
		})
	}
	for _, op := range []string{"clone", "push", "first-push"} {
		g, hst, o := secs[op+"/smx-gateway"], secs[op+"/host"], secs[op+"/open-token-in-guest"]
		if g > 0 && hst > 0 && o > 0 {
			b.Logf("%s: smx gateway %.2fs, host direct %.2fs (%.2f×), open networking with the token in the guest %.2fs (%.2f×)",
				op, g, hst, g/hst, o, g/o)
		}
	}
}

// startGitGuest starts a Debian sandbox with profile, whose supervisor
// resolves names with hosts and trusts caFile for upstreams.
func startGitGuest(b *testing.B, name, image, hosts, caFile, profile string) *smxGuest {
	prof := filepath.Join(b.TempDir(), name+".yaml")
	if err := os.WriteFile(prof, []byte(profile), 0o644); err != nil {
		b.Fatal(err)
	}
	smx("agent", "rm", "-f", name)
	if out, err := smx("agent", "create", name, "--image", image, "--memory", "1G", "--profile", prof); err != nil {
		b.Fatal(err, out)
	}
	start := exec.Command(filepath.Join(bin, "smx"), "agent", "start", name)
	start.Env = append(os.Environ(), "SMX_HOME="+home, "SMX_HOSTS_FILE="+hosts, "SMX_EXTRA_CA_FILE="+caFile)
	if out, err := start.CombinedOutput(); err != nil {
		smx("agent", "rm", "-f", name)
		b.Fatal(err, string(out))
	}
	m := &sandbox.Manager{State: statedir.Dir{Root: home}}
	in, err := m.Get(name)
	if err != nil {
		b.Fatal(err)
	}
	return &smxGuest{name: name, c: &sandbox.Client{Paths: m.Paths(name)}, pid: in.State.SupervisorPID}
}
