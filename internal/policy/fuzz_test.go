package policy

import (
	"net/netip"
	"path"
	"strings"
	"testing"
)

// fuzzAllow opens as much as a profile can; fuzzDeny extends it with denies.
// Adding deny rules must never turn a deny into an allow.
const fuzzAllow = `network:
  mode: allow-all
  allow:
    - cidr: 10.0.0.0/8
    - domain: "*.ok.example"
  host_ports: [8080]
files:
  rules:
    - path: /**
      access: rw
git:
  repos:
    - repo: "**"
      read: allow
      push: allow
      delete: allow
      force_push: allow
ssh:
  allow:
    - host: "*"
      ports: ["1-65535"]
`

const fuzzDeny = `extends: allow.yaml
network:
  deny:
    - domain: "*.evil.example"
    - cidr: 10.66.0.0/16
files:
  rules:
    - path: /work/**/secret/**
      access: deny
git:
  repos:
    - repo: "evil.example/**"
      read: deny
      push: deny
ssh:
  deny:
    - host: "*.evil.example"
      ports: ["1-65535"]
`

func fuzzProfiles(t testing.TB) (allowP, denyP *Profile, all []*Profile) {
	allowP = mustParse(t, "allow.yaml", fuzzAllow)
	denyP, err := Parse("deny.yaml", []byte(fuzzDeny), func(string) (*Profile, error) { return allowP, nil })
	if err != nil {
		t.Fatal(err)
	}
	all = []*Profile{allowP, denyP, mustParse(t, "test.yaml", testProfile)}
	for _, n := range BuiltinNames() {
		p, _ := Builtin(n)
		all = append(all, p)
	}
	return allowP, denyP, all
}

func FuzzDecide(f *testing.F) {
	for _, s := range []string{
		"https://api.github.com/v1", "tcp:10.66.1.1:5432", "udp:1.1.1.1:53", "file:rw:/work/app/secret/x",
		"git:push:evil.example/a/b:refs/heads/main", "ssh:deploy@build1:22", "tcp:[::ffff:169.254.169.254]:80",
		"https://x.EVIL.example./", "file:ro:/work/../work/secret", "tcp:host.smx.internal:8080",
	} {
		f.Add(s, "a.evil.example", []byte{169, 254, 169, 254}, uint16(443), uint8(1), "rw", "refs/heads/main")
	}
	f.Add("", "/work/a/secret", []byte{}, uint16(0), uint8(2), "ro", "")
	f.Add("", "Evil.Example/x/y", []byte{}, uint16(0), uint8(3), "delete", "refs/heads/x")
	f.Add("", "X.evil.example.", []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1}, uint16(22), uint8(4), "root", "")
	allowP, denyP, all := fuzzProfiles(f)
	f.Fuzz(func(t *testing.T, s, host string, ipb []byte, port uint16, kind uint8, access, ref string) {
		ip, _ := netip.AddrFromSlice(ipb)
		reqs := []Request{{
			Kind: Kind(kind % 5), Proto: []string{"", "tcp", "udp", "icmp"}[kind/5%4],
			Host: host, IP: ip, Port: port, Path: host, Access: access, Repo: host, Ref: ref, User: access,
		}}
		if r, err := ParseRequest(s); err == nil {
			reqs = append(reqs, r)
		}
		for _, r := range reqs {
			for _, p := range all {
				d := p.Decide(r)
				if d.Rule == "" || d.Reason == "" {
					t.Fatalf("%s: %#v: empty rule or reason: %+v", p.Name, r, d)
				}
				if d.Allow && (strings.Contains(d.Rule, ".deny[") || strings.HasPrefix(d.Rule, "builtin: ") || d.Rule == ruleDefault) {
					t.Fatalf("%s: %#v: allowed by a deny: %+v", p.Name, r, d)
				}
				if d.Allow && (r.Kind == KindNet || r.Kind == KindSSH) {
					if c := closedIP(canonicalIP(r.IP)); r.IP.IsValid() && c != nil {
						t.Fatalf("%s: %#v: always-closed %s allowed: %+v", p.Name, r, c.what, d)
					}
					if a, err := netip.ParseAddr(strings.TrimSuffix(r.Host, ".")); err == nil && closedIP(canonicalIP(a)) != nil {
						t.Fatalf("%s: %#v: always-closed host allowed: %+v", p.Name, r, d)
					}
				}
			}
			if r.Kind == KindFile {
				// On a case-insensitive host folder the decision is never
				// looser than the case-sensitive or the folded one.
				for _, p := range all {
					m := FileMount{Guest: "/work", Rule: "-v", FoldCase: true}
					fd := p.DecideMounted(m, r.Path, r.Access)
					if fd.Allow && (!p.decideMounted(m, r.Path, r.Access, false).Allow || !p.decideMounted(m, r.Path, r.Access, true).Allow) {
						t.Fatalf("%s: %#v: FoldCase allowed what one decision denies: %+v", p.Name, r, fd)
					}
				}
				m := FileMount{Guest: "/work", Rule: "-v", FoldCase: true}
				if l := strings.ToLower(path.Clean(r.Path)); denyP.DecideMounted(m, r.Path, r.Access).Allow && strings.HasPrefix(l, "/work/") && strings.Contains(l+"/", "/secret/") {
					t.Fatalf("%#v: denied path allowed in another case: %+v", r, denyP.DecideMounted(m, r.Path, r.Access))
				}
			}
			dd, da := denyP.Decide(r), allowP.Decide(r)
			if dd.Allow && !da.Allow {
				t.Fatalf("%#v: adding denies opened it: %+v vs %+v", r, dd, da)
			}
			if !dd.Allow {
				continue
			}
			// Independent restatements of the deny rules in fuzzDeny.
			h := strings.ToLower(strings.TrimSuffix(r.Host, "."))
			switch r.Kind {
			case KindNet, KindSSH:
				if strings.HasSuffix(h, ".evil.example") {
					t.Fatalf("%#v: denied domain allowed: %+v", r, dd)
				}
			case KindFile:
				c := path.Clean(r.Path)
				if strings.Contains("/"+r.Path+"/", "/../") {
					t.Fatalf("%#v: path with .. allowed: %+v", r, dd)
				}
				if strings.HasPrefix(c, "/work/") && strings.Contains(c+"/", "/secret/") {
					t.Fatalf("%#v: denied path allowed: %+v", r, dd)
				}
			case KindGit:
				if strings.HasPrefix(strings.ToLower(r.Repo), "evil.example/") && r.Access != "read" {
					t.Fatalf("%#v: denied repo allowed: %+v", r, dd)
				}
			}
		}
	})
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(testProfile))
	f.Add([]byte(fuzzAllow))
	f.Add([]byte("extends: dev\nnetwork:\n  allow:\n    - cidr: 10.0.0.0/8\n"))
	f.Add([]byte("network: {mode: allow-all, allow: [{cidr: 0.0.0.0/0}, {cidr: '::/0'}]}\n"))
	for _, n := range BuiltinNames() {
		src, _ := BuiltinSource(n)
		f.Add(src)
	}
	meta := []Request{
		{Kind: KindNet, IP: netip.MustParseAddr("169.254.169.254"), Port: 80},
		{Kind: KindNet, IP: netip.MustParseAddr("::ffff:127.0.0.1"), Port: 80},
		{Kind: KindNet, Host: "localhost", Port: 80},
		{Kind: KindSSH, Host: "fd00:ec2::254", User: "root"},
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse("f.yaml", data, nil)
		if err != nil {
			if len(ValidationErrors(err)) == 0 {
				t.Fatalf("error without position: %v", err)
			}
			return
		}
		for _, r := range meta {
			if d := p.Decide(r); d.Allow {
				t.Fatalf("profile opened %s: %+v\n%s", r, d, data)
			}
		}
		y, err := p.YAML()
		if err != nil {
			t.Fatal(err)
		}
		q, err := Parse("f.yaml", y, nil)
		if err != nil {
			t.Fatalf("YAML() does not re-parse: %v\n%s\nfrom\n%s", err, y, data)
		}
		if q.Hash != p.Hash {
			t.Fatalf("hash changed on round trip\n%s", y)
		}
	})
}

func BenchmarkDecide(b *testing.B) {
	dev, _ := Builtin("dev")
	test := mustParse(b, "test.yaml", testProfile)
	for _, c := range []struct {
		name string
		p    *Profile
		req  string
	}{
		{"net-allow-last-rule", dev, "https://accounts.google.com/"},
		{"net-allow-wildcard", dev, "https://api.github.com/"},
		{"net-default-deny", dev, "https://evilgithub.com/"},
		{"net-metadata", dev, "tcp:[::ffff:169.254.169.254]:80"},
		{"net-private-cidr", test, "tcp:10.1.0.5:5432"},
		{"file-deny-doublestar", test, "file:ro:/work/app/a/b/c/key.pem"},
		{"file-rw", test, "file:rw:/work/app/src/main.go"},
		{"git-push-ref", test, "git:push:github.com/acme/app:refs/heads/feature/x"},
		{"ssh-allow", test, "ssh:deploy@build1.corp.example:22"},
	} {
		r, err := ParseRequest(c.req)
		if err != nil {
			b.Fatal(err)
		}
		r.Host = strings.ToUpper(r.Host) // exercise normalisation
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = c.p.Decide(r)
			}
		})
	}
}
