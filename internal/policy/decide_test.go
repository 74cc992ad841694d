package policy

import (
	"net/netip"
	"strings"
	"testing"
)

func mustParse(t testing.TB, file, src string) *Profile {
	t.Helper()
	p, err := Parse(file, []byte(src), nil)
	if err != nil {
		t.Fatalf("Parse %s: %v", file, err)
	}
	return p
}

type decideCase struct {
	req   string // ParseRequest notation, or "" when r is set
	r     Request
	allow bool
	rule  string // substring of Decision.Rule
}

func runDecide(t *testing.T, p *Profile, cases []decideCase) {
	t.Helper()
	for _, c := range cases {
		r := c.r
		name := c.req
		if c.req != "" {
			var err error
			if r, err = ParseRequest(c.req); err != nil {
				t.Errorf("ParseRequest(%q): %v", c.req, err)
				continue
			}
		} else {
			name = r.String()
		}
		d := p.Decide(r)
		if d.Allow != c.allow || !strings.Contains(d.Rule, c.rule) || d.Rule == "" || d.Reason == "" {
			t.Errorf("%s: %s: got allow=%v rule=%q reason=%q; want allow=%v rule containing %q",
				p.Name, name, d.Allow, d.Rule, d.Reason, c.allow, c.rule)
		}
	}
}

func TestDecideNetwork(t *testing.T) {
	p := mustParse(t, "test.yaml", testProfile)
	ip := netip.MustParseAddr
	runDecide(t, p, []decideCase{
		// wildcard semantics
		{req: "https://api.github.com/v1", allow: true, rule: "test.yaml:5:7 network.allow[0] domain *.github.com ports 443"},
		{req: "https://a.b.github.com/", allow: true, rule: "network.allow[0]"},
		{req: "https://github.com/", allow: false, rule: "default deny"},
		{req: "https://evilgithub.com/", allow: false, rule: "default deny"},
		{req: "https://github.com.evil.com/", allow: false, rule: "default deny"},
		{req: "https://API.GitHub.COM./x", allow: true, rule: "network.allow[0]"},
		{req: "http://api.github.com/", allow: false, rule: "default deny"}, // port 80 not listed
		{req: "https://api.github.com:8443/", allow: false, rule: "default deny"},
		{r: Request{Kind: KindNet, Host: "Api.Github.Com.", Port: 443}, allow: true, rule: "network.allow[0]"},
		// deny beats allow, and a more specific allow does not override it
		{req: "https://evil.github.com/", allow: false, rule: "test.yaml:16:7 network.deny[0]"},
		{req: "https://EVIL.github.com./", allow: false, rule: "network.deny[0]"},
		{req: "https://x.bad.example.org/", allow: false, rule: "network.deny[2]"},
		{req: "https://bad.example.org/", allow: true, rule: "network.allow[4]"},
		{req: "tcp:example.com:22", allow: true, rule: "network.allow[1]"},
		{req: "tcp:www.example.com:443", allow: false, rule: "default deny"},
		// CIDRs, ports, protocols, private ranges
		{req: "tcp:10.1.0.5:5432", allow: true, rule: "network.allow[2] cidr 10.1.0.0/16 proto tcp ports 5432,8000-8100"},
		{req: "tcp:10.1.0.5:8050", allow: true, rule: "network.allow[2]"},
		{req: "tcp:10.1.0.5:8101", allow: false, rule: rulePrivate},
		{req: "udp:10.1.0.5:5432", allow: false, rule: rulePrivate},
		{req: "tcp:10.1.2.3:5432", allow: false, rule: "network.deny[1]"},
		{req: "tcp:10.0.0.5:5432", allow: false, rule: rulePrivate},
		{req: "tcp:192.168.1.1:853", allow: false, rule: rulePrivate}, // 0.0.0.0/0 does not name a private range
		{req: "tcp:100.64.0.1:853", allow: false, rule: rulePrivate},
		{req: "tcp:[fd12::1]:853", allow: false, rule: rulePrivate},
		{req: "tcp:8.8.8.8:853", allow: true, rule: "network.allow[3] cidr 0.0.0.0/0"},
		{req: "udp:1.1.1.1:53", allow: false, rule: "default deny"},
		{req: "tcp:[2001:db8::5]:443", allow: true, rule: "network.allow[5]"},
		// a domain allow does not open a private IP it resolves to (DNS rebinding)
		{r: Request{Kind: KindNet, Host: "example.com", IP: ip("10.1.0.9"), Port: 5432}, allow: true, rule: "network.allow[2]"},
		{r: Request{Kind: KindNet, Host: "example.com", IP: ip("192.168.0.1"), Port: 80}, allow: false, rule: rulePrivate},
		// always closed, whatever the rules say
		{req: "tcp:169.254.169.254:80", allow: false, rule: "cloud metadata"},
		{req: "tcp:[::ffff:169.254.169.254]:80", allow: false, rule: "cloud metadata"},
		{r: Request{Kind: KindNet, IP: ip("::ffff:169.254.169.254"), Port: 80}, allow: false, rule: "cloud metadata"},
		{r: Request{Kind: KindNet, IP: ip("64:ff9b::a9fe:a9fe"), Port: 80}, allow: false, rule: "cloud metadata"},
		{r: Request{Kind: KindNet, Host: "example.com", IP: ip("169.254.169.254"), Port: 22}, allow: false, rule: "cloud metadata"},
		{req: "tcp:[fd00:ec2::254]:80", allow: false, rule: "cloud metadata"},
		{req: "tcp:169.254.1.1:853", allow: false, rule: "link-local"},
		{req: "tcp:[fe80::1]:853", allow: false, rule: "link-local"},
		{r: Request{Kind: KindNet, IP: ip("fe80::1%eth0"), Port: 853}, allow: false, rule: "link-local"},
		{req: "tcp:127.0.0.1:853", allow: false, rule: "host loopback"},
		{req: "tcp:127.5.5.5:853", allow: false, rule: "host loopback"},
		{req: "tcp:[::1]:853", allow: false, rule: "host loopback"},
		{req: "tcp:0.0.0.0:853", allow: false, rule: "unspecified"},
		{req: "tcp:[::]:853", allow: false, rule: "unspecified"},
		{req: "udp:224.0.0.251:853", allow: false, rule: "multicast"},
		{req: "udp:[ff02::fb]:853", allow: false, rule: "multicast"},
		{req: "udp:255.255.255.255:853", allow: false, rule: "broadcast"},
		{req: "tcp:localhost:853", allow: false, rule: "always closed"},
		{req: "tcp:foo.localhost:853", allow: false, rule: "always closed"},
		{req: "tcp:metadata.google.internal:80", allow: false, rule: "always closed"},
		// host_ports
		{req: "tcp:host.smx.internal:11434", allow: true, rule: "test.yaml:19:16 network.host_ports 11434"},
		{req: "tcp:host.smx.internal:22", allow: false, rule: "host loopback"},
		{r: Request{Kind: KindNet, Host: "host.smx.internal", IP: ip("127.0.0.1"), Port: 11434}, allow: true, rule: "host_ports"},
		{r: Request{Kind: KindNet, Host: "host.smx.internal", IP: ip("169.254.169.254"), Port: 11434}, allow: false, rule: "builtin"},
		// malformed requests are denied, never guessed at
		{r: Request{Kind: KindNet, Host: "2130706433", Port: 443}, allow: false, rule: "malformed"},
		{r: Request{Kind: KindNet, Host: "0177.0.0.1", Port: 443}, allow: false, rule: "malformed"},
		{r: Request{Kind: KindNet, Host: "0x7f.1", Port: 443}, allow: false, rule: "malformed"},
		{r: Request{Kind: KindNet, Host: "a..github.com", Port: 443}, allow: false, rule: "malformed"},
		{r: Request{Kind: KindNet, Host: ".github.com", Port: 443}, allow: false, rule: "malformed"},
		{r: Request{Kind: KindNet, Host: "api.github.com/x", Port: 443}, allow: false, rule: "malformed"},
		{r: Request{Kind: KindNet, Host: "api.gitհub.com", Port: 443}, allow: false, rule: "malformed"},
		{r: Request{Kind: KindNet, Host: "127.0.0.1", IP: ip("8.8.8.8"), Port: 853}, allow: false, rule: "malformed"},
		{r: Request{Kind: KindNet, Host: "169.254.169.254", Port: 80}, allow: false, rule: "cloud metadata"},
		{r: Request{Kind: KindNet, Host: "api.github.com", Port: 0}, allow: false, rule: "malformed"},
		{r: Request{Kind: KindNet, Port: 443}, allow: false, rule: "malformed"},
		{r: Request{Kind: KindNet, Proto: "sctp", Host: "api.github.com", Port: 443}, allow: false, rule: "malformed"},
		{r: Request{}, allow: false, rule: "malformed"},
	})
}

func TestDecideModes(t *testing.T) {
	locked, _ := Builtin("locked")
	open, _ := Builtin("open")
	dev, _ := Builtin("dev")
	runDecide(t, locked, []decideCase{
		{req: "https://api.github.com/", allow: false, rule: "builtin/locked.yaml:5:9 network.mode deny-all"},
		{req: "udp:1.1.1.1:53", allow: false, rule: "network.mode deny-all"},
		{req: "file:ro:/work/x", allow: false, rule: "default deny"},
		{req: "git:read:github.com/acme/app", allow: false, rule: "default deny"},
		{req: "ssh:git@github.com", allow: false, rule: "default deny"},
	})
	runDecide(t, open, []decideCase{
		{req: "https://evilgithub.com/", allow: true, rule: "network.mode allow-all"},
		{req: "udp:1.1.1.1:53", allow: true, rule: "network.mode allow-all"},
		{req: "tcp:10.0.0.5:5432", allow: false, rule: rulePrivate},
		{req: "file:rw:/etc/passwd", allow: true, rule: "files.rules[0]"},
		{req: "git:push:github.com/acme/app:refs/heads/main", allow: true, rule: "git.repos[0]"},
		{req: "git:force-push:github.com/acme/app:refs/heads/main", allow: false, rule: "default deny"},
		{req: "git:delete:github.com/acme/app:refs/heads/main", allow: false, rule: "default deny"},
		{req: "ssh:deploy@build1", allow: true, rule: "ssh.allow[0]"},
		{req: "ssh:deploy@build1:2222", allow: false, rule: "default deny"},
	})
	runDecide(t, dev, []decideCase{
		{req: "https://api.github.com/", allow: true, rule: "domain *.github.com"},
		{req: "https://evilgithub.com/", allow: false, rule: "default deny"},
		{req: "https://github.com.evil.com/", allow: false, rule: "default deny"},
		{req: "https://proxy.golang.org/", allow: true, rule: "domain proxy.golang.org"},
		{req: "https://api.anthropic.com/v1/messages", allow: true, rule: "domain api.anthropic.com"},
		{req: "http://deb.debian.org/debian", allow: true, rule: "domain deb.debian.org"},
		{req: "tcp:pypi.org:22", allow: false, rule: "default deny"},
		{req: "file:rw:/work/app/main.go", allow: true, rule: "files.rules[0]"},
		{req: "file:ro:/etc/shadow", allow: false, rule: "default deny"},
		{req: "git:read:github.com/golang/go", allow: true, rule: "git.repos[0]"},
		{req: "git:push:github.com/golang/go:refs/heads/master", allow: false, rule: "default deny"},
	})
	// Metadata, link-local and loopback are closed in every built-in, under
	// every spelling.
	for _, name := range BuiltinNames() {
		p, _ := Builtin(name)
		for _, s := range []string{
			"tcp:169.254.169.254:80", "tcp:[::ffff:169.254.169.254]:80", "tcp:[::ffff:a9fe:a9fe]:80",
			"tcp:[64:ff9b::169.254.169.254]:80", "tcp:[fd00:ec2::254]:80", "http://169.254.169.254/latest/meta-data/",
			"tcp:169.254.0.1:443", "tcp:[fe80::1]:443", "tcp:127.0.0.1:443", "tcp:[::1]:443", "tcp:0.0.0.0:443",
			"tcp:[::ffff:127.0.0.1]:443", "udp:255.255.255.255:67", "udp:239.255.255.250:1900", "tcp:localhost:443",
			"https://metadata.google.internal/", "ssh:root@169.254.169.254", "ssh:root@localhost", "ssh:root@[::1]",
			"tcp:host.smx.internal:22",
		} {
			r, err := ParseRequest(s)
			if err != nil {
				t.Fatalf("ParseRequest(%q): %v", s, err)
			}
			if d := p.Decide(r); d.Allow || !strings.HasPrefix(d.Rule, "builtin: ") && !strings.Contains(d.Rule, "deny-all") {
				t.Errorf("%s: %s: %+v; want a built-in deny", name, s, d)
			}
		}
	}
}

func TestDecideFiles(t *testing.T) {
	p := mustParse(t, "test.yaml", testProfile)
	runDecide(t, p, []decideCase{
		{req: "file:rw:/work/app/main.go", allow: true, rule: "test.yaml:26:7 files.rules[0] rw /work/app/**"},
		{req: "file:rw:/work/app", allow: true, rule: "files.rules[0]"},
		{req: "file:ro:/work/app/", allow: true, rule: "files.rules[0]"},
		{req: "file:rw:/work/app/.env", allow: false, rule: "test.yaml:28:7 files.rules[1] deny /work/app/.env"},
		{req: "file:ro:/work/app/.env", allow: false, rule: "files.rules[1]"},
		{req: "file:ro:/work/app/./.env", allow: false, rule: "files.rules[1]"},
		{req: "file:ro:/work/app//.env", allow: false, rule: "files.rules[1]"},
		{req: "file:ro:/work/app/.env2", allow: true, rule: "files.rules[0]"},
		{req: "file:ro:/work/app/certs/key.pem", allow: false, rule: "files.rules[2]"},
		{req: "file:ro:/work/app/key.pem", allow: false, rule: "files.rules[2]"},       // ** matches zero elements
		{req: "file:ro:/work/app/a/b/c/key.pem", allow: false, rule: "files.rules[2]"}, // and many
		{req: "file:ro:/work/app/docs/key.pem", allow: false, rule: "files.rules[2]"},  // deny beats the more specific ro
		{req: "file:ro:/work/app/key.pem.txt", allow: true, rule: "files.rules[0]"},
		{req: "file:ro:/data/x.csv", allow: true, rule: "files.rules[3] ro /data/**"},
		{req: "file:rw:/data/x.csv", allow: false, rule: "files.rules[3]"},
		{req: "file:rw:/data/scratch/tmp", allow: true, rule: "files.rules[4] rw /data/scratch/**"}, // most specific allow wins
		{req: "file:rw:/data/scratchpad", allow: false, rule: "files.rules[3]"},
		{req: "file:rw:/work/app/docs/index.md", allow: false, rule: "files.rules[5] ro /work/app/docs/**"},
		{req: "file:ro:/work/app/docs/index.md", allow: true, rule: "files.rules[5]"},
		{req: "file:ro:/work/other", allow: false, rule: "default deny"},
		{req: "file:ro:/work", allow: false, rule: "default deny"},
		{req: "file:ro:/", allow: false, rule: "default deny"},
		// .. is refused outright, whether it escapes or not
		{req: "file:ro:/work/app/../../etc/passwd", allow: false, rule: "malformed"},
		{req: "file:ro:/work/app/src/../main.go", allow: false, rule: "malformed"},
		{req: "file:ro:/work/app/..", allow: false, rule: "malformed"},
		{r: Request{Kind: KindFile, Access: "ro", Path: "work/app/x"}, allow: false, rule: "malformed"},
		{r: Request{Kind: KindFile, Access: "ro", Path: "/work/app/x\x00"}, allow: false, rule: "malformed"},
		{r: Request{Kind: KindFile, Access: "wx", Path: "/work/app/x"}, allow: false, rule: "malformed"},
		{r: Request{Kind: KindFile, Access: "ro", Path: "/work/app/..."}, allow: true, rule: "files.rules[0]"},
	})
}

func TestDecideGit(t *testing.T) {
	p := mustParse(t, "test.yaml", testProfile)
	runDecide(t, p, []decideCase{
		{req: "git:read:github.com/acme/app", allow: true, rule: "test.yaml:40:7 git.repos[0] repo github.com/acme/*"},
		{req: "git:read:GitHub.com/Acme/App.git", allow: true, rule: "git.repos[0]"},
		{req: "git:read:github.com/acme/secret", allow: false, rule: "git.repos[1]"},
		{req: "git:read:github.com/acme/app/sub", allow: false, rule: "default deny"},
		{req: "git:read:github.com/acmecorp/app", allow: false, rule: "default deny"},
		{req: "git:read:gitlab.com/a/b/c", allow: true, rule: "git.repos[2]"},
		{req: "git:push:github.com/acme/app:refs/heads/dev", allow: true, rule: "git.repos[0] repo github.com/acme/*"},
		{req: "git:push:github.com/acme/app:refs/heads/main", allow: false, rule: "test.yaml:44:11 git.repos[0].refs[0]"},
		{req: "git:push:github.com/acme/app:refs/heads/main2", allow: true, rule: "git.repos[0] repo"},
		// A deny holds for every case of the name (a server on a
		// case-insensitive disk updates main for MAIN); allows stay exact.
		{req: "git:push:github.com/acme/app:refs/heads/MAIN", allow: false, rule: "refs[0]"},
		{req: "git:force-push:github.com/acme/app:refs/Heads/Main", allow: false, rule: "refs[0]"},
		{req: "git:delete:github.com/acme/app:refs/heads/Feature/x", allow: false, rule: "default deny"},
		{req: "git:force-push:github.com/acme/app:refs/heads/main", allow: false, rule: "refs[0]"},
		{req: "git:delete:github.com/acme/app:refs/heads/main", allow: false, rule: "refs[0]"},
		{req: "git:delete:github.com/acme/app:refs/heads/dev", allow: false, rule: "default deny"},
		{req: "git:force-push:github.com/acme/app:refs/heads/dev", allow: false, rule: "default deny"},
		{req: "git:force-push:github.com/acme/app:refs/heads/feature/x/y", allow: true, rule: "refs[1]"},
		{req: "git:delete:github.com/acme/app:refs/heads/feature/x", allow: true, rule: "refs[1]"},
		{req: "git:delete:github.com/acme/app:refs/heads/featurex", allow: false, rule: "default deny"},
		{req: "git:push:github.com/acme/app:refs/tags/v1.0", allow: true, rule: "git.repos[0] repo"},
		{req: "git:delete:github.com/acme/app:refs/tags/v1.0", allow: false, rule: "refs[2]"},
		{req: "git:push:gitlab.com/a/b:refs/heads/main", allow: false, rule: "default deny"},
		{r: Request{Kind: KindGit, Access: "push", Repo: "github.com/acme/app", Ref: "refs/heads/../main"}, allow: false, rule: "malformed"},
		{r: Request{Kind: KindGit, Access: "push", Repo: "github.com/acme/app", Ref: "main"}, allow: false, rule: "malformed"},
		{r: Request{Kind: KindGit, Access: "push", Repo: "github.com/acme/app", Ref: ""}, allow: false, rule: "malformed"},
		{r: Request{Kind: KindGit, Access: "admin", Repo: "github.com/acme/app", Ref: "refs/heads/x"}, allow: false, rule: "malformed"},
		{r: Request{Kind: KindGit, Access: "read", Repo: "github.com/acme/../acme/app"}, allow: false, rule: "malformed"},
		{r: Request{Kind: KindGit, Access: "read", Repo: "github.com//acme/app"}, allow: false, rule: "malformed"},
		{r: Request{Kind: KindGit, Access: "read", Repo: "github.com"}, allow: false, rule: "malformed"},
		{r: Request{Kind: KindGit, Access: "read", Repo: "localhost/acme/app"}, allow: false, rule: "always closed"},
	})
}

func TestDecideSSH(t *testing.T) {
	p := mustParse(t, "test.yaml", testProfile)
	runDecide(t, p, []decideCase{
		{req: "ssh:deploy@build1.corp.example:22", allow: true, rule: "test.yaml:58:7 ssh.allow[0] host build*.corp.example user deploy ports 22,2222"},
		{req: "ssh:deploy@build1.corp.example:2222", allow: true, rule: "ssh.allow[0]"},
		{req: "ssh:deploy@BUILD1.corp.example.", allow: true, rule: "ssh.allow[0]"},
		{req: "ssh:deploy@build1.corp.example:2200", allow: false, rule: "default deny"},
		{req: "ssh:alice@build1.corp.example", allow: false, rule: "default deny"},
		{req: "ssh:deploy@build1.corp.example.evil.com", allow: false, rule: "default deny"},
		{req: "ssh:deploy@evilbuild1.corp.example", allow: false, rule: "default deny"},
		{req: "ssh:alice@bastion.corp.example", allow: true, rule: "ssh.allow[1]"},
		{req: "ssh:alice@bastion.corp.example:2222", allow: false, rule: "default deny"}, // ports default to 22
		{req: "ssh:root@bastion.corp.example", allow: false, rule: "ssh.deny[0]"},
		{req: "ssh:root@build1.corp.example:2222", allow: false, rule: "ssh.deny[0]"},
		{req: "ssh:deploy@169.254.169.254", allow: false, rule: "cloud metadata"},
		{req: "ssh:deploy@host.smx.internal", allow: false, rule: "always closed"},
		{r: Request{Kind: KindSSH, User: "", Host: "bastion.corp.example"}, allow: false, rule: "malformed"},
		{r: Request{Kind: KindSSH, User: "a b", Host: "bastion.corp.example"}, allow: false, rule: "malformed"},
		{r: Request{Kind: KindSSH, User: "alice", Host: "bastion.corp.example"}, allow: true, rule: "ssh.allow[1]"},
	})
	if p.SSH.CertTTL.String() != "10m0s" {
		t.Errorf("CertTTL = %v", p.SSH.CertTTL)
	}
}

func TestCredentialFor(t *testing.T) {
	p := mustParse(t, "test.yaml", testProfile)
	for _, c := range []struct {
		req, want string
	}{
		{"https://api.openai.com/v1/chat", "openai"},
		{"https://API.openai.com./v1/chat", "openai"},
		{"https://openai.com/", ""},
		{"https://api.openai.com.evil.com/", ""},
		{"git:push:github.com/acme/app:refs/heads/x", "gh"},
		{"git:read:gitlab.com/a/b", ""},
		{"ssh:deploy@build7.corp.example", "deploy"},
		{"ssh:deploy@bastion.corp.example", ""},
	} {
		r, err := ParseRequest(c.req)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := p.CredentialFor(r)
		if got.Name != c.want || ok != (c.want != "") {
			t.Errorf("CredentialFor(%s) = %q, %v; want %q", c.req, got.Name, ok, c.want)
		}
	}
	c, _ := p.CredentialFor(Request{Kind: KindNet, Host: "api.openai.com", Port: 443})
	if c.Header != "Authorization" || c.Format != "Bearer {}" || c.From != "openai-key" {
		t.Errorf("openai credential = %+v", c)
	}
}

// A domain rule opens UDP only when it says proto: udp: the gateway checks
// the name a TCP stream carries, not the one inside QUIC.
func TestDecideUDPOnDomainRules(t *testing.T) {
	p := mustParse(t, "udp.yaml", `network:
  mode: default-deny
  allow:
    - domain: api.example.com
      ports: [443]
    - domain: quic.example.com
      proto: udp
    - domain: both.example.com
    - domain: both.example.com
      proto: udp
      ports: [443]
    - cidr: 198.51.100.0/24
`)
	runDecide(t, p, []decideCase{
		{req: "tcp:api.example.com:443", allow: true, rule: "network.allow[0]"},
		{req: "udp:api.example.com:443", allow: false, rule: "udp.yaml:4:7 network.allow[0] domain api.example.com ports 443"},
		{req: "udp:quic.example.com:443", allow: true, rule: "network.allow[1] domain quic.example.com proto udp"},
		{req: "tcp:quic.example.com:443", allow: false, rule: "default deny"},
		{req: "udp:both.example.com:443", allow: true, rule: "network.allow[3]"},
		{req: "udp:both.example.com:444", allow: false, rule: "network.allow[2]"},
		// A cidr rule opens UDP whatever name the address was resolved for.
		{r: Request{Kind: KindNet, Proto: "udp", Host: "api.example.com", IP: netip.MustParseAddr("198.51.100.7"), Port: 443}, allow: true, rule: "network.allow[4] cidr"},
	})
	d := p.Decide(Request{Kind: KindNet, Proto: "udp", Host: "api.example.com", Port: 443})
	if !strings.Contains(d.Reason, "only with proto: udp") {
		t.Errorf("reason %q does not say how to open UDP", d.Reason)
	}
	open, _ := Builtin("open")
	if d := open.Decide(Request{Kind: KindNet, Proto: "udp", Host: "any.example.com", Port: 443}); !d.Allow {
		t.Errorf("allow-all refused UDP to a name: %+v", d)
	}
}

// DecideName speaks of the name on every port, never of a port it probed.
func TestDecideName(t *testing.T) {
	p := mustParse(t, "n.yaml", `network:
  mode: default-deny
  allow:
    - domain: "*.example.com"
      ports: [8443]
  deny:
    - domain: bad.example.com
`)
	for _, c := range []struct {
		host         string
		allow        bool
		rule, reason string
	}{
		{"api.example.com", true, "network.allow[0]", "port 8443 matches"},
		{"evilexample.com", false, "default deny", "no rule allows evilexample.com on any port, so the name is not resolved"},
		{"bad.example.com", false, "network.deny[0]", "the name bad.example.com on every port is denied"},
		{"localhost", false, "always closed", "the name localhost on every port"},
	} {
		d := p.DecideName(c.host)
		if d.Allow != c.allow || !strings.Contains(d.Rule, c.rule) || !strings.Contains(d.Reason, c.reason) {
			t.Errorf("DecideName(%s) = %+v; want allow=%v rule ~ %q reason ~ %q", c.host, d, c.allow, c.rule, c.reason)
		}
		if !d.Allow && strings.Contains(d.Reason, "port 1") {
			t.Errorf("DecideName(%s) reason names a probed port: %q", c.host, d.Reason)
		}
	}
}
