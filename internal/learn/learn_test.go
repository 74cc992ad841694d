package learn

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/policy"
)

type rec struct {
	kind   string
	fields map[string]any
}

// writeLog writes recs through a real audit log and reads them back as
// the service does, so fields have the types a stored log gives them.
func writeLog(t *testing.T, recs []rec) []audit.Record {
	t.Helper()
	dir := t.TempDir()
	k, err := audit.LoadOrCreateKey(filepath.Join(dir, "key"))
	if err != nil {
		t.Fatal(err)
	}
	logDir := filepath.Join(dir, "log")
	l, err := audit.Open(logDir, "web", k.Signer())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if _, err := l.Append(context.Background(), r.kind, r.fields); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	out, err := audit.Read(logDir, audit.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func flow(host, dst string, extra ...string) rec {
	f := map[string]any{"proto": "tcp", "src": "10.0.2.15:40000", "dst": dst, "rule": "open.yaml:5:3 network.mode allow-all", "bytes_in": 1, "bytes_out": 1}
	if host != "" {
		f["host"] = host
	}
	for i := 0; i+1 < len(extra); i += 2 {
		f[extra[i]] = extra[i+1]
	}
	return rec{audit.KindNetFlow, f}
}

func write(op, path string) rec {
	return rec{audit.KindFileWrite, map[string]any{"op": op, "path": path, "mount": "/work", "rule": "-v /h:/work"}}
}

func run() []rec {
	return []rec{
		{audit.KindSandboxCreate, map[string]any{"sandbox_id": "old", "mounts": []string{"/old:/old"}}},
		flow("earlier.sandbox.test", "198.18.0.7:443"), // an earlier sandbox of the same name
		{audit.KindSandboxCreate, map[string]any{"sandbox_id": "new", "mounts": []string{"/h:/work", "/d:/data:ro"}}},
		flow("a.svc.example.test", "198.18.0.2:80"),
		flow("b.svc.example.test", "198.18.0.3:443", "sni", "b.svc.example.test"),
		flow("b.svc.example.test", "198.18.0.3:443"),
		flow("api.single.test", "198.18.0.4:443"),
		flow("", "198.18.0.9:8080"),
		flow("db.corp.test", "10.20.0.5:5432"),
		flow("host.smx.internal", "10.0.2.2:11434"),
		{audit.KindNetFlow, map[string]any{"proto": "udp", "dst": "198.18.0.5:123", "host": "ntp.single.test"}},
		write("mkdir", "/work/out"),
		write("create", "/work/out/a.txt"),
		write("create", "/work/out/b/c.txt"),
		write("create", "/work/src/1.go"),
		write("create", "/work/src/2.go"),
		write("rename", "/work/src/3.go"),
		write("create", "/work/README.md"),
		{audit.KindGitFetch, map[string]any{"repo": "forge.test/acme/lib", "op": "fetch", "credential": "forge", "secret": "forge-token"}},
		{audit.KindGitPush, map[string]any{"repo": "forge.test/acme/app", "op": "push", "refs": []map[string]any{
			{"ref": "refs/heads/agent/fix", "access": "push", "result": "ok"},
			{"ref": "refs/heads/main", "access": "push", "result": "refused", "reason": "no"},
			{"ref": "refs/heads/old", "access": "delete", "result": "ok"},
		}}},
		{audit.KindGitRefused, map[string]any{"repo": "forge.test/acme/app", "op": "push", "ref": "refs/heads/main", "access": "push", "rule": "team.yaml:9:9 git.repos[0].refs[0]"}},
		{audit.KindSSHSession, map[string]any{"host": "build.example.test", "dst": "198.18.0.6:22", "port": 22, "user": "ci", "command": "make", "credential": "ci-key", "secret": "ci-ssh", "auth": "key"}},
		flow("build.example.test", "198.18.0.6:22"),
		{audit.KindCredUse, map[string]any{"credential": "model", "secret": "anthropic", "header": "X-Api-Key", "format": "Bearer {}", "sni": "api.model.test", "dst": "198.18.0.8:443", "method": "POST", "path": "/v1/messages"}},
		flow("api.model.test", "198.18.0.8:443", "sni", "api.model.test"),
		{audit.KindNetRefused, map[string]any{"proto": "tcp", "dst": "198.18.0.10:443", "host": "evil.test", "rule": "default deny", "reason": "no rule"}},
		{audit.KindNetRefused, map[string]any{"proto": "tcp", "dst": "169.254.169.254:80", "rule": "builtin: cloud metadata is always closed"}},
	}
}

func TestLearnCollapsesAndReplays(t *testing.T) {
	res, err := Learn(writeLog(t, run()), Options{Name: "learned"})
	if err != nil {
		t.Fatal(err)
	}
	y := string(res.YAML)
	t.Logf("learned:\n%s", y)
	for _, n := range res.Notes {
		if strings.Contains(n, "would still be refused") {
			t.Errorf("note: %s", n)
		}
	}
	p, err := policy.Parse("learned.yaml", res.YAML, nil)
	if err != nil {
		t.Fatal(err)
	}
	net := func(host, ip string, port uint16) bool {
		return p.Decide(policy.Request{Kind: policy.KindNet, Proto: "tcp", Host: host, IP: netip.MustParseAddr(ip), Port: port}).Allow
	}
	mounted := policy.FileMount{Guest: "/work", Rule: "-v /h:/work"}
	file := func(path string) bool { return p.DecideMounted(mounted, path, "rw").Allow }
	git := func(access, ref string) bool {
		return p.Decide(policy.Request{Kind: policy.KindGit, Access: access, Repo: "forge.test/acme/app", Ref: ref}).Allow
	}
	for _, c := range []struct {
		what string
		got  bool
		want bool
	}{
		// Two names under svc.example.test: a wildcard, with both ports.
		{"c.svc.example.test:443 (wildcard)", net("c.svc.example.test", "198.18.0.11", 443), true},
		{"a.svc.example.test:443", net("a.svc.example.test", "198.18.0.2", 443), true},
		{"svc.example.test itself", net("svc.example.test", "198.18.0.2", 443), false},
		{"a.svc.example.test:22", net("a.svc.example.test", "198.18.0.2", 22), false},
		// One name under single.test: exact, its own port.
		{"api.single.test:443", net("api.single.test", "198.18.0.4", 443), true},
		{"www.single.test:443", net("www.single.test", "198.18.0.4", 443), false},
		{"api.single.test:80", net("api.single.test", "198.18.0.4", 80), false},
		{"198.18.0.9:8080", net("", "198.18.0.9", 8080), true},
		{"198.18.0.9:8081", net("", "198.18.0.9", 8081), false},
		{"db.corp.test at its private address", net("db.corp.test", "10.20.0.5", 5432), true},
		{"another private address", net("", "10.20.0.6", 5432), false},
		{"earlier sandbox's host", net("earlier.sandbox.test", "198.18.0.7", 443), false},
		{"refused host (not learned)", net("evil.test", "198.18.0.10", 443), false},
		{"ssh host's port 22 as a plain flow", net("build.example.test", "198.18.0.6", 22), false},
		{"write /work/out/new", file("/work/out/new/deep.txt"), true},
		{"write /work/src/4.go (3 written there)", file("/work/src/4.go"), true},
		{"write /work/README.md", file("/work/README.md"), true},
		{"write /work/other.md", file("/work/other.md"), false},
		{"read /work/other.md", p.DecideMounted(mounted, "/work/other.md", "ro").Allow, true},
		{"push agent/fix", git("push", "refs/heads/agent/fix"), true},
		{"delete old", git("delete", "refs/heads/old"), true},
		{"push main (refused in the run)", git("push", "refs/heads/main"), false},
		{"push agent/other", git("push", "refs/heads/agent/other"), false},
		{"force-push agent/fix", git("force-push", "refs/heads/agent/fix"), false},
		{"read acme/lib", p.Decide(policy.Request{Kind: policy.KindGit, Access: "read", Repo: "forge.test/acme/lib"}).Allow, true},
		{"push acme/lib", p.Decide(policy.Request{Kind: policy.KindGit, Access: "push", Repo: "forge.test/acme/lib", Ref: "refs/heads/x"}).Allow, false},
	} {
		if c.got != c.want {
			t.Errorf("%s: allowed %v, want %v", c.what, c.got, c.want)
		}
	}
	if d, _ := p.DecideSSH(policy.Request{Kind: policy.KindSSH, Host: "build.example.test", User: "ci", Port: 22}); !d.Allow {
		t.Errorf("ssh ci@build.example.test refused: %s", d.Reason)
	}
	if d, _ := p.DecideSSH(policy.Request{Kind: policy.KindSSH, Host: "build.example.test", User: "root", Port: 22}); d.Allow {
		t.Error("ssh root@build.example.test allowed")
	}
	if len(p.Network.HostPorts) != 1 || p.Network.HostPorts[0].Port != 11434 {
		t.Errorf("host_ports %v", p.Network.HostPorts)
	}
	var creds []string
	for _, c := range p.Credentials {
		creds = append(creds, c.Name+" "+c.From+" "+c.Domain+c.SSHHost+c.Forge+" "+c.Header+" "+c.Format)
	}
	if strings.Join(creds, "|") != "ci-key ci-ssh build.example.test  |forge forge-token forge.test  |model anthropic api.model.test X-Api-Key Bearer {}" {
		t.Errorf("credentials %q", creds)
	}
	// Every rule names its records; the data mount (read-only) has none.
	for _, want := range []string{
		"# 2 names under svc.example.test reached: a.svc.example.test, b.svc.example.test; from net.flow #4 #5 #6",
		"# from net.flow #8 (no name: the address itself)",
		"# the run created it; from file.write #12 #13 #14",
		"# 3 or more paths written in it; from file.write #15 #16 #17",
		"# reads are not logged: the mount stays readable; writes only where the run wrote; from sandbox.create #3",
		"Refused actions are not learned",
	} {
		if !strings.Contains(y, want) {
			t.Errorf("learned profile lacks %q", want)
		}
	}
	if strings.Contains(y, "/data") || strings.Contains(y, "evil") || strings.Contains(y, "169.254") || strings.Contains(y, "path: /old") {
		t.Error("learned profile holds what it should not")
	}
}

func TestLearnRefused(t *testing.T) {
	res, err := Learn(writeLog(t, run()), Options{Refused: true})
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse("learned.yaml", res.YAML, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Decide(policy.Request{Kind: policy.KindNet, Proto: "tcp", Host: "evil.test", IP: netip.MustParseAddr("198.18.0.10"), Port: 443}).Allow {
		t.Error("--include-refused did not learn the refused host")
	}
	if !p.Decide(policy.Request{Kind: policy.KindGit, Access: "push", Repo: "forge.test/acme/app", Ref: "refs/heads/main"}).Allow {
		t.Error("--include-refused did not learn the refused push")
	}
	if strings.Contains(string(res.YAML), "169.254") {
		t.Error("a built-in refusal was learned")
	}
	if !strings.Contains(string(res.YAML), "It also allows what the run was refused (--include-refused; 2 refusal records read)") {
		t.Errorf("header does not say refusals were learned:\n%s", res.YAML)
	}
}

func TestLearnEmptyRunIsLocked(t *testing.T) {
	res, err := Learn(writeLog(t, []rec{{audit.KindSandboxCreate, map[string]any{"sandbox_id": "x", "mounts": []string{"/h:/work"}}}}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse("learned.yaml", res.YAML, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Network.Mode != policy.DefaultDeny || len(p.Network.Allow) != 0 {
		t.Errorf("network %+v", p.Network)
	}
	// A run that wrote nothing leaves its mount read-only, not open.
	if p.DecideMounted(policy.FileMount{Guest: "/work", Rule: "-v"}, "/work/x", "rw").Allow {
		t.Error("a mount the run never wrote stays writable")
	}
}

// TestLearnRefusedLookupAndPartlyRefusedSession: under a default-deny
// profile a refused host shows only as a refused lookup (the guest never
// connected); --include-refused learns the name on any port, and says so.
// An SSH session with a refused request in it was itself allowed: its
// host is learned without --include-refused, the refused request is not.
func TestLearnRefusedLookupAndPartlyRefusedSession(t *testing.T) {
	recs := writeLog(t, []rec{
		{audit.KindSandboxCreate, map[string]any{"sandbox_id": "x"}},
		{audit.KindNetRefused, map[string]any{"proto": "dns", "host": "pkgs.example.test", "rule": "default deny", "count": 2}},
		{audit.KindSSHSession, map[string]any{"host": "build.example.test", "dst": "198.18.0.6:22", "port": 22, "user": "ci",
			"command": "make; subsystem sftp", "refused": true}},
	})
	res, err := Learn(recs, Options{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse("learned.yaml", res.YAML, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.DecideName("pkgs.example.test").Allow {
		t.Error("a refused lookup was learned without --include-refused")
	}
	d, rule := p.DecideSSH(policy.Request{Kind: policy.KindSSH, Host: "build.example.test", User: "ci", Port: 22})
	if !d.Allow || rule.SFTP == policy.Allow {
		t.Errorf("ssh: allowed %v, sftp %v; want the host without sftp:\n%s", d.Allow, rule.SFTP, res.YAML)
	}

	res, err = Learn(recs, Options{Refused: true})
	if err != nil {
		t.Fatal(err)
	}
	if p, err = policy.Parse("learned.yaml", res.YAML, nil); err != nil {
		t.Fatal(err)
	}
	for _, port := range []uint16{443, 8080} {
		if !p.Decide(policy.Request{Kind: policy.KindNet, Proto: "tcp", Host: "pkgs.example.test", IP: netip.MustParseAddr("198.18.0.12"), Port: port}).Allow {
			t.Errorf("refused lookup not learned for port %d", port)
		}
	}
	if !strings.Contains(string(res.YAML), "(a refused lookup: the guest never connected, so any port)") {
		t.Errorf("the comment does not say why any port:\n%s", res.YAML)
	}
	if _, rule := p.DecideSSH(policy.Request{Kind: policy.KindSSH, Host: "build.example.test", User: "ci", Port: 22}); rule.SFTP != policy.Allow {
		t.Error("--include-refused did not learn the refused sftp")
	}
}

// TestLearnHostileNames: names and paths in the log are what the guest
// sent; none can inject rules or comments into the learned profile, make
// it fail to load, or widen what it allows.
func TestLearnHostileNames(t *testing.T) {
	recs := writeLog(t, []rec{
		{audit.KindSandboxCreate, map[string]any{"sandbox_id": "x", "mounts": []string{"/h:/work"}}},
		flow("", "198.18.0.2:443", "sni", "a.example.test\nnetwork:\n  mode: allow-all"),
		flow("", "198.18.0.3:443", "http_host", "*.example.test"),
		flow("", "198.18.0.4:443", "sni", "x # comment.example.test"),
		flow("", "198.18.0.5:443", "http_host", strings.Repeat("a", 64)+".example.test"),
		flow("", "198.18.0.6:80", "http_host", "Ok.Example.TEST:80"),
		write("create", "/work/a\n- path: /**\n  access: rw"),
		write("create", "/work/*"),
		write("create", "/work/dir/**/x"),
		{audit.KindNetRefused, map[string]any{"proto": "dns", "host": "b.example.test\nx: y", "rule": "default deny"}},
	})
	res, err := Learn(recs, Options{Refused: true})
	if err != nil {
		t.Fatal(err)
	}
	y := string(res.YAML)
	p, err := policy.Parse("learned.yaml", res.YAML, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	if p.Network.Mode != policy.DefaultDeny {
		t.Fatalf("mode %s:\n%s", p.Network.Mode, y)
	}
	for _, r := range p.Network.Allow {
		if r.Domain != "" && r.Domain != "ok.example.test" {
			t.Errorf("a hostile name became rule %q:\n%s", r.Domain, y)
		}
	}
	mounted := policy.FileMount{Guest: "/work", Rule: "-v"}
	for _, path := range []string{"/work/other", "/work/dir2/x", "/work/sub/deep"} {
		if p.DecideMounted(mounted, path, "rw").Allow {
			t.Errorf("%s is writable:\n%s", path, y)
		}
	}
	t.Logf("learned:\n%s", y)
	if !p.DecideMounted(mounted, "/work/a\n- path: /**\n  access: rw", "rw").Allow {
		t.Errorf("the path the run wrote is not writable:\n%s", y)
	}
}
