package policy

import (
	"net/netip"
	"strings"
	"testing"
)

const sshOptionsProfile = `ssh:
  allow:
    - host: build1.corp.example
      user: deploy
      sftp: allow
      forward: [local, agent]
      env: [LANG, "LC_*", "CI_?"]
      host_key: "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU"
    - host: "*.corp.example"
    - host: 10.1.2.3
      ports: [2222]
  deny:
    - host: vault.corp.example
git:
  repos:
    - repo: forge.example/acme/*
      read: allow
      push: allow
    - repo: forge.example/acme/protected
      refs:
        - ref: refs/heads/main
          push: deny
    - repo: forge.example/acme/frozen
      push: deny
`

func TestSSHOptions(t *testing.T) {
	p := mustParse(t, "o.yaml", sshOptionsProfile)
	d, r := p.DecideSSH(Request{Kind: KindSSH, Host: "build1.corp.example", User: "deploy"})
	if !d.Allow || r.SFTP != Allow || !r.Forwards(ForwardLocal) || !r.Forwards(ForwardAgent) || r.Forwards(ForwardRemote) ||
		strings.Join(r.Env, ",") != "LANG,LC_*,CI_?" || !strings.HasPrefix(r.HostKey, "SHA256:47DEQ") {
		t.Fatalf("%+v %+v", d, r)
	}
	d, r = p.DecideSSH(Request{Kind: KindSSH, Host: "build2.corp.example", User: "x"})
	if !d.Allow || r.SFTP != Unset || len(r.Forward) != 0 || r.Env != nil || r.HostKey != "" {
		t.Fatalf("second rule: %+v %+v", d, r)
	}
	if d, r := p.DecideSSH(Request{Kind: KindSSH, Host: "vault.corp.example", User: "x"}); d.Allow || r.Host != "" {
		t.Fatalf("denied host: %+v %+v", d, r)
	}
	// The options survive the frozen profile's round trip, including an
	// explicitly empty env list.
	p2 := mustParse(t, "o.yaml", strings.Replace(sshOptionsProfile, `    - host: "*.corp.example"`, "    - host: \"*.corp.example\"\n      env: []", 1))
	y, err := p2.YAML()
	if err != nil {
		t.Fatal(err)
	}
	p3 := mustParse(t, "frozen.yaml", string(y))
	if p3.Hash != p2.Hash || p3.SSH.Allow[1].Env == nil || len(p3.SSH.Allow[1].Env) != 0 || p3.SSH.Allow[0].SFTP != Allow {
		t.Fatalf("round trip:\n%s\n%+v", y, p3.SSH.Allow)
	}
}

func TestSSHOptionErrors(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{"ssh:\n  deny:\n    - host: a.example\n      sftp: allow\n", "sftp applies to allow rules only"},
		{"ssh:\n  allow:\n    - host: a.example\n      forward: [dynamic]\n", `"dynamic": want local, remote, agent or x11`},
		{"ssh:\n  allow:\n    - host: a.example\n      env: [\"A=B\"]\n", `env: "A=B"`},
		{"ssh:\n  allow:\n    - host: a.example\n      host_key: \"MD5:aa\"\n", "want a SHA256 fingerprint"},
		{"ssh:\n  allow:\n    - host: a.example\n      sftp: maybe\n", `"maybe" is not allow or deny`},
		{"ssh:\n  allow:\n    - host: a.example\n      git_root: home/git\n", "want the Git user's home directory"},
		{"ssh:\n  allow:\n    - host: a.example\n      git_root: /home/git\n", "git_root is one user's home; name that user"},
		{"ssh:\n  allow:\n    - host: a.example\n      user: \"g*\"\n      git_root: /home/git\n", "git_root is one user's home; name that user"},
		{"ssh:\n  allow:\n    - host: a.example\n      user: git\n      git_root: /home/git/\n", "want the Git user's home directory"},
		{"ssh:\n  allow:\n    - host: a.example\n      git_root: /home/../git\n", "want the Git user's home directory"},
		{"ssh:\n  allow:\n    - host: a.example\n      git_root: /\n", "want the Git user's home directory"},
		{"ssh:\n  deny:\n    - host: a.example\n      git_root: /home/git\n", "git_root applies to allow rules only"},
		{"credentials:\n  - name: a\n    from: \"@ssh-agent\"\n    forge: github.com\n", `from "@ssh-agent" is only for ssh_host credentials`},
		{"credentials:\n  - name: a\n    from: \"@other\"\n    ssh_host: a.example\n", `from "@other": name the secret`},
	} {
		_, err := Parse("p.yaml", []byte(c.src), nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got %v, want %q", c.src, err, c.want)
		}
	}
}

func TestSSHAgentCredential(t *testing.T) {
	p := mustParse(t, "a.yaml", "ssh:\n  allow:\n    - host: a.example\ncredentials:\n  - name: mine\n    from: \"@ssh-agent\"\n    ssh_host: a.example\n")
	c, ok := p.CredentialFor(Request{Kind: KindSSH, Host: "a.example", User: "u"})
	if !ok || c.From != SSHAgentSecret {
		t.Fatalf("%+v %v", c, ok)
	}
}

func TestSSHRoute(t *testing.T) {
	p := mustParse(t, "o.yaml", sshOptionsProfile)
	ip := netip.MustParseAddr("203.0.113.9")
	for _, c := range []struct {
		host string
		ip   netip.Addr
		port uint16
		want string // rule fragment, "" for not routed
	}{
		{"build1.corp.example", ip, 22, "ssh.allow[0]"},
		{"BUILD1.corp.example.", ip, 22, "ssh.allow[0]"},
		{"vault.corp.example", ip, 22, "ssh.allow[1]"}, // routed by *.corp.example; the gateway then applies the deny
		{"build1.corp.example", ip, 2222, ""},
		{"", netip.MustParseAddr("10.1.2.3"), 2222, "ssh.allow[2]"},
		{"", netip.MustParseAddr("10.1.2.3"), 22, ""},
		{"corp.example", ip, 22, ""},
		{"evilcorp.example", ip, 22, ""},
		{"localhost", ip, 22, ""},
		{"x.corp.example", netip.MustParseAddr("169.254.169.254"), 22, ""},
		{"x.corp.example", netip.MustParseAddr("127.0.0.1"), 22, ""},
	} {
		d, ok := p.SSHRoute(c.host, c.ip, c.port)
		if ok != (c.want != "") || !strings.Contains(d.Rule, c.want) {
			t.Errorf("SSHRoute(%q, %v, %d) = %v %q, want %q", c.host, c.ip, c.port, ok, d.Rule, c.want)
		}
	}
	if _, ok := p.SSHName("build7.corp.example"); !ok {
		t.Error("SSHName: allowed host not resolvable")
	}
	// A pattern of only wildcards does not open private addresses; a
	// pattern with literal text does (corporate build hosts are private).
	open := mustParse(t, "o2.yaml", "ssh:\n  allow:\n    - host: \"*\"\n    - host: \"build*.corp.example\"\n")
	priv := netip.MustParseAddr("10.0.0.5")
	if _, ok := open.SSHRoute("", priv, 22); ok {
		t.Error("host * routed a private address")
	}
	if d := open.Decide(Request{Kind: KindSSH, Host: "10.0.0.5", User: "u"}); d.Allow || !strings.Contains(d.Reason, "private address") {
		t.Errorf("host * allowed a private address: %+v", d)
	}
	if d := open.Decide(Request{Kind: KindSSH, Host: "anything.example", IP: priv, User: "u"}); d.Allow {
		t.Errorf("host * allowed a name resolving to a private address: %+v", d)
	}
	if _, ok := open.SSHRoute("build1.corp.example", priv, 22); !ok {
		t.Error("a named host at a private address not routed")
	}
	if d := open.Decide(Request{Kind: KindSSH, Host: "build1.corp.example", IP: priv, User: "u"}); !d.Allow || !strings.Contains(d.Rule, "ssh.allow[1]") {
		t.Errorf("named host at a private address: %+v", d)
	}
	if _, ok := open.SSHRoute("", netip.MustParseAddr("203.0.113.7"), 22); !ok {
		t.Error("host * did not route a public address")
	}
	// A deny rule alone routes nothing, however wide.
	wide := mustParse(t, "w.yaml", "ssh:\n  deny:\n    - host: \"*\"\n      ports: [\"1-65535\"]\n")
	if _, ok := wide.SSHRoute("example.com", ip, 443); ok {
		t.Error("a deny-only ssh section routed a flow")
	}
	for _, n := range []string{"vault2.example", "localhost", "metadata.google.internal", ""} {
		if _, ok := p.SSHName(n); ok {
			t.Errorf("SSHName(%q) allowed", n)
		}
	}
}

func TestSSHUserHint(t *testing.T) {
	p := mustParse(t, "o.yaml", sshOptionsProfile)
	ip := netip.MustParseAddr("203.0.113.9")
	for _, c := range []struct {
		host string
		port uint16
		want string
	}{
		{"build1.corp.example", 22, "deploy"}, // allow[0] names one user
		{"build2.corp.example", 22, ""},       // allow[1] names none
		{"build1.corp.example", 2200, ""},     // not routed
	} {
		if got := p.SSHUserHint(c.host, ip, c.port); got != c.want {
			t.Errorf("SSHUserHint(%s, %d) = %q, want %q", c.host, c.port, got, c.want)
		}
	}
	g := mustParse(t, "g.yaml", "ssh:\n  allow:\n    - host: a.example\n      user: \"dep*\"\n")
	if got := g.SSHUserHint("a.example", ip, 22); got != "" {
		t.Errorf("glob user hinted as %q", got)
	}
}
