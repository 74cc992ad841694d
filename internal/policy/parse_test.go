package policy

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/testutil"
)

func TestValidationErrors(t *testing.T) {
	for _, c := range []struct {
		name, src string
		want      []string // each error, exactly "file:line:col: " + a prefix of the message
	}{
		{"unknown top key", "name: x\nnetwrok:\n  mode: allow-all\n",
			[]string{`p.yaml:2:1: unknown key "netwrok" in profile`}},
		{"unknown nested key", "network:\n  allow:\n    - domain: a.com\n      port: 443\n",
			[]string{`p.yaml:4:7: unknown key "port" in network.allow[0]`}},
		{"bad cidr", "network:\n  allow:\n    - cidr: 10.0.0.0/33\n",
			[]string{`p.yaml:3:13: network.allow[0]: bad cidr "10.0.0.0/33"`}},
		{"cidr host bits", "network:\n  deny:\n    - cidr: 10.1.2.3/8\n",
			[]string{`p.yaml:3:13: network.deny[0]: cidr "10.1.2.3/8" has host bits set; did you mean 10.0.0.0/8?`}},
		{"cidr no length", "network:\n  deny:\n    - cidr: 10.1.2.3\n",
			[]string{`p.yaml:3:13: network.deny[0]: cidr "10.1.2.3" has no prefix length`}},
		{"mapped cidr", "network:\n  deny:\n    - cidr: ::ffff:10.0.0.0/104\n",
			[]string{`p.yaml:3:13: network.deny[0]: cidr "::ffff:10.0.0.0/104" is IPv4-mapped`}},
		{"cidr opens metadata", "network:\n  allow:\n    - cidr: 169.254.169.254/32\n",
			[]string{`p.yaml:3:13: network.allow[0]: cidr 169.254.169.254/32 overlaps cloud metadata`}},
		{"cidr opens link-local", "network:\n  allow:\n    - cidr: 169.254.0.0/16\n",
			[]string{`p.yaml:3:13: network.allow[0]: cidr 169.254.0.0/16 overlaps cloud metadata`}},
		{"cidr opens loopback", "network:\n  allow:\n    - cidr: 127.0.0.0/8\n    - cidr: ::1/128\n    - cidr: fe80::/64\n    - cidr: fd00:ec2::/32\n",
			[]string{`p.yaml:3:13: network.allow[0]: cidr 127.0.0.0/8 overlaps host loopback`,
				`p.yaml:4:13: network.allow[1]: cidr ::1/128 overlaps`,
				`p.yaml:5:13: network.allow[2]: cidr fe80::/64 overlaps link-local`,
				`p.yaml:6:13: network.allow[3]: cidr fd00:ec2::/32 overlaps cloud metadata`}},
		{"domain opens localhost", "network:\n  allow:\n    - domain: localhost\n",
			[]string{`p.yaml:3:15: network.allow[0]: domain "localhost" is always closed`}},
		{"domain names host", "network:\n  allow:\n    - domain: host.smx.internal\n",
			[]string{`p.yaml:3:15: network.allow[0]: domain "host.smx.internal" names the host`}},
		{"bad port", "network:\n  allow:\n    - domain: a.com\n      ports: [443, 70000, 0, \"9-8\", x]\n",
			[]string{`p.yaml:4:20: network.allow[0].ports: bad port "70000"`,
				`p.yaml:4:27: network.allow[0].ports: bad port "0"`,
				`p.yaml:4:30: network.allow[0].ports: bad port range "9-8"`,
				`p.yaml:4:37: network.allow[0].ports: bad port "x"`}},
		{"bad host port", "network:\n  host_ports: [11434, 99999]\n",
			[]string{`p.yaml:2:23: network.host_ports: bad port "99999"`}},
		{"bad mode", "network:\n  mode: allow\n",
			[]string{`p.yaml:2:9: network.mode: "allow" is not one of`}},
		{"domain and cidr", "network:\n  allow:\n    - domain: a.com\n      cidr: 1.0.0.0/8\n",
			[]string{`p.yaml:4:13: network.allow[0]: a rule has a domain or a cidr, not both`}},
		{"bad domains", "network:\n  allow:\n    - domain: \"*\"\n    - domain: \"*.com\"\n    - domain: \"a.*.com\"\n    - domain: 1.2.3.4\n    - domain: exämple.com\n    - domain: 2130706433\n",
			[]string{`p.yaml:3:15: network.allow[0]: domain "*": too broad`,
				`p.yaml:4:15: network.allow[1]: domain "*.com": too broad`,
				`p.yaml:5:15: network.allow[2]: domain "a.*.com": a wildcard is only allowed`,
				`p.yaml:6:15: network.allow[3]: domain "1.2.3.4": is an IP address`,
				`p.yaml:7:15: network.allow[4]: domain "exämple.com": not ASCII`,
				`p.yaml:8:15: network.allow[5]: domain "2130706433": looks like a number`}},
		{"unquoted wildcard", "network:\n  allow:\n    - domain: *.github.com\n",
			[]string{`p.yaml:3:`}},
		{"contradiction domain", "network:\n  allow:\n    - domain: a.example.com\n      ports: [443]\n  deny:\n    - domain: A.example.com.\n",
			[]string{`p.yaml:6:7: network.deny[0]: domain a.example.com is both allowed and denied (network.allow[0] at p.yaml:3:7)`}},
		{"no contradiction on other ports", "network:\n  allow:\n    - domain: a.example.com\n      ports: [443]\n  deny:\n    - domain: a.example.com\n      ports: [80]\n",
			nil},
		{"deny-all with allow", "network:\n  mode: deny-all\n  allow:\n    - domain: a.example.com\n  host_ports: [8080]\n",
			[]string{`p.yaml:4:7: network.allow[0]: network.mode is deny-all`,
				`p.yaml:5:16: network.host_ports: network.mode is deny-all`}},
		{"extends locked then allow", "extends: locked\nnetwork:\n  allow:\n    - domain: a.example.com\n",
			[]string{`p.yaml:4:7: network.allow[0]: network.mode is deny-all, so this allow rule can never apply; set mode: default-deny`}},
		{"duplicate key", "network:\n  mode: allow-all\n  mode: deny-all\n",
			[]string{`p.yaml:`}}, // the YAML library reports this one itself
		{"files", "files:\n  mounts:\n    - relative:/work\n    - /a:/work/x\n    - /b:/work/x\n    - /c\n  rules:\n    - path: work/**\n      access: rw\n    - path: /work/a**b\n      access: rw\n    - path: /work/[ab]\n      access: rw\n    - path: /work/../etc\n      access: ro\n    - path: /work/x\n      access: rwx\n    - path: /work/y\n      access: ro\n    - path: /work/y\n      access: deny\n",
			[]string{`p.yaml:3:7: files.mounts[0]: host path "relative" must be absolute`,
				`p.yaml:6:7: files.mounts[3]: "/c": want HOST:GUEST`,
				`p.yaml:8:13: files.rules[0]: path "work/**": must be an absolute guest path`,
				`p.yaml:10:13: files.rules[1]: path "/work/a**b": ** must be a whole element`,
				`p.yaml:12:13: files.rules[2]: path "/work/[ab]": unsupported glob character '['`,
				`p.yaml:14:13: files.rules[3]: path "/work/../etc": ".." elements are not allowed`,
				`p.yaml:17:15: files.rules[4]: access "rwx" is not rw, ro or deny`,
				`p.yaml:5:7: files.mounts: guest path /work/x is mounted twice (also at p.yaml:4:7)`,
				`p.yaml:20:7: files.rules[6]: /work/y is deny here but ro at p.yaml:18:7`}},
		{"git", "git:\n  repos:\n    - repo: github.com/a/*\n      push: deny\n      refs:\n        - ref: refs/heads/x\n          push: allow\n        - ref: main\n          push: allow\n        - ref: refs/heads/y\n          push: deny\n          delete: allow\n        - ref: refs/heads/z\n    - read: allow\n    - repo: github.com/b\n      read: maybe\n",
			[]string{`p.yaml:8:16: git.repos[0].refs[1]: ref "main": write the full ref name, e.g. refs/heads/main`,
				`p.yaml:13:11: git.repos[0].refs[3]: sets none of push, delete, force_push`,
				`p.yaml:14:7: git.repos[1]: needs repo`,
				`p.yaml:16:13: git.repos[2].read: "maybe" is not allow or deny`,
				`p.yaml:6:11: git.repos[0].refs[0]: allows pushing to refs/heads/x but the repo sets push: deny`,
				`p.yaml:10:11: git.repos[0].refs[2]: allows pushing to refs/heads/y but the repo sets push: deny`,
				`p.yaml:10:11: git.repos[0].refs[2]: push: deny wins over delete/force_push: allow`}},
		{"ssh", "ssh:\n  cert_ttl: 1s\n  allow:\n    - host: \"build/1\"\n    - host: a.example\n      user: \"bad user\"\n    - host: b.example\n      user: deploy\n  deny:\n    - host: b.example\n      user: deploy\n",
			[]string{`p.yaml:2:13: ssh.cert_ttl: 1s is outside 1m..24h`,
				`p.yaml:4:13: ssh.allow[0]: host "build/1": use host-name characters`,
				`p.yaml:6:13: ssh.allow[1]: user "bad user"`,
				`p.yaml:10:7: ssh.deny[0]: ssh to b.example is both allowed and denied (ssh.allow[2] at p.yaml:7:7)`}},
		{"credentials", "credentials:\n  - name: a\n    from: s\n  - name: b\n    from: s\n    domain: \"*\"\n    header: Authorization\n  - name: c\n    from: s\n    domain: \"\"\n    header: X\n  - name: d\n    from: s\n    domain: api.x.com\n  - name: e\n    from: s\n    forge: \"*\"\n  - name: f\n    from: s\n    ssh_host: \"*\"\n  - name: g\n    from: s\n    forge: github.com\n    ssh_host: h.example\n  - name: h\n    from: s\n    domain: api.x.com\n    header: A\n    format: Bearer\n  - name: i\n    from: s\n    forge: github.com\n  - name: i\n    from: t\n    forge: gitlab.com\n  - name: j\n    from: s\n    forge: github.com\n",
			[]string{`p.yaml:2:5: credentials[0]: credential "a" must be bound to exactly one of domain (with header), forge or ssh_host; a secret is never bound to anywhere`,
				`p.yaml:6:13: credentials[1]: domain "*": a secret is never bound to anywhere`,
				`p.yaml:10:13: credentials[2]: domain "": a secret is never bound to anywhere`,
				`p.yaml:12:5: credentials[3]: header "": a domain binding needs the HTTP header`,
				`p.yaml:17:12: credentials[4]: forge "*": a secret is never bound to anywhere`,
				`p.yaml:20:15: credentials[5]: ssh_host "*": a secret is never bound to anywhere`,
				`p.yaml:21:5: credentials[6]: credential "g" must be bound to exactly one`,
				`p.yaml:29:13: credentials[7]: format "Bearer" must contain {} exactly once`,
				`p.yaml:33:5: credential "i" is defined twice (also at p.yaml:30:5)`,
				`p.yaml:36:5: credential "j" is bound to the same place as "i" (at p.yaml:30:5)`}},
		{"aliases", "x: &a [1]\nnetwork:\n  allow: *a\n",
			[]string{`p.yaml:3:10: YAML aliases are not supported`}},
		{"wrong shapes", "network: [1]\nfiles: x\ngit:\n  repos: {}\n",
			[]string{`p.yaml:1:10: network: want a mapping`, `p.yaml:2:8: files: want a mapping`, `p.yaml:4:10: git.repos: want a list`}},
		{"extends unknown", "extends: nosuch\n",
			[]string{`p.yaml:1:10: extends "nosuch": "nosuch" is not a built-in profile`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(c.src), nil)
			if len(c.want) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error; want %q", c.want)
			}
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("error is not ErrInvalid: %v", err)
			}
			got := ValidationErrors(err)
			if len(got) != len(c.want) {
				t.Fatalf("got %d errors, want %d:\n%v", len(got), len(c.want), err)
			}
			for i, w := range c.want {
				if !strings.HasPrefix(got[i].Error(), w) {
					t.Errorf("error %d:\n got %s\nwant %s...", i, got[i], w)
				}
			}
		})
	}
}

func TestExtends(t *testing.T) {
	dir := testutil.WriteTree(t, t.TempDir(), map[string]string{
		"base/team.yaml": "extends: dev\nnetwork:\n  deny:\n    - domain: gist.github.com\nfiles:\n  rules:\n    - path: /work/**/.env\n      access: deny\n",
		"app.yaml":       "extends: base/team.yaml\nnetwork:\n  allow:\n    - domain: \"*.github.com\"\n      ports: [22]\n    - cidr: 10.9.0.0/16\n",
		"contra.yaml":    "extends: base/team.yaml\nnetwork:\n  allow:\n    - domain: gist.github.com\n",
		"a.yaml":         "extends: b.yaml\n",
		"b.yaml":         "# b\nextends: ./a.yaml\n",
		"self.yaml":      "extends: self.yaml\n",
		"bad.yaml":       "extends: broken.yaml\n",
		"broken.yaml":    "network:\n  mode: sideways\n",
		"missing.yaml":   "extends: nope.yaml\n",
		"abs.yaml":       "extends: /etc/x.yaml\n",
	})
	p, err := Load(filepath.Join(dir, "app.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "app" || p.Extends != "base/team.yaml" || p.Network.Mode != DefaultDeny {
		t.Errorf("name %q extends %q mode %q", p.Name, p.Extends, p.Network.Mode)
	}
	runDecide(t, p, []decideCase{
		{req: "https://api.github.com/", allow: true, rule: "builtin/dev.yaml:"},
		{req: "https://gist.github.com/", allow: false, rule: "team.yaml:4:7 network.deny[0]"},
		{req: "tcp:gist.github.com:22", allow: false, rule: "team.yaml:4:7 network.deny[0]"}, // a child cannot undo its base's deny
		{req: "tcp:10.9.1.1:5432", allow: true, rule: "app.yaml:6:7 network.allow[1]"},
		{req: "file:rw:/work/app/.env", allow: false, rule: "team.yaml:7:7 files.rules[0]"},
		{req: "file:rw:/work/app/x", allow: true, rule: "builtin/dev.yaml:"},
	})
	for _, c := range []struct{ file, want string }{
		{"a.yaml", "b.yaml:2:10: extends \"./a.yaml\": extends cycle: a.yaml -> b.yaml -> a.yaml"},
		{"self.yaml", "self.yaml:1:10: extends \"self.yaml\": extends cycle: self.yaml -> self.yaml"},
		{"bad.yaml", "broken.yaml:2:9: network.mode: \"sideways\""},
		{"missing.yaml", "missing.yaml:1:10: extends \"nope.yaml\": policy: load"},
		{"contra.yaml", "contra.yaml:4:7: network.allow[0]: domain gist.github.com is both allowed and denied (network.deny[0] at " + filepath.Join(dir, "base/team.yaml") + ":4:7)"},
		{"abs.yaml", "abs.yaml:1:10: extends \"/etc/x.yaml\": extends takes a path relative"},
	} {
		_, err := Load(filepath.Join(dir, c.file))
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Load(%s) = %v; want ErrInvalid containing %q", c.file, err, c.want)
		}
	}
	if _, err := Load(filepath.Join(dir, "nope.yaml")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Load(missing) = %v; want ErrNotFound", err)
	}
	if _, err := Resolve("nosuch"); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "locked, dev, open") {
		t.Errorf("Resolve(nosuch) = %v", err)
	}
	if p, err := Resolve("dev"); err != nil || p.Source != "builtin" {
		t.Errorf("Resolve(dev) = %v, %v", p, err)
	}
	if p, err := Resolve(filepath.Join(dir, "app.yaml")); err != nil || p.Name != "app" {
		t.Errorf("Resolve(path) = %v, %v", p, err)
	}
}

func TestYAMLRoundTrip(t *testing.T) {
	profiles := []*Profile{mustParse(t, "test.yaml", testProfile)}
	for _, n := range BuiltinNames() {
		p, _ := Builtin(n)
		profiles = append(profiles, p)
	}
	for _, p := range profiles {
		y, err := p.YAML()
		if err != nil {
			t.Fatal(err)
		}
		q, err := Parse("show.yaml", y, nil)
		if err != nil {
			t.Fatalf("%s: re-parse of YAML(): %v\n%s", p.Name, err, y)
		}
		if q.Hash != p.Hash || q.Name != p.Name {
			t.Errorf("%s: round trip changed name/hash: %s %s\n%s", p.Name, p.Hash, q.Hash, y)
		}
		if !strings.HasPrefix(p.Hash, "sha256:") || len(p.Hash) != 71 {
			t.Errorf("hash %q", p.Hash)
		}
	}
	// The hash covers the policy, not the name or comments.
	a := mustParse(t, "a.yaml", "name: a\nnetwork:\n  allow:\n    - domain: x.example\n")
	b := mustParse(t, "b.yaml", "# comment\nnetwork:\n  mode: default-deny\n  allow:\n    - domain: X.example.\n")
	c := mustParse(t, "c.yaml", "network:\n  allow:\n    - domain: y.example\n")
	if a.Hash != b.Hash || a.Hash == c.Hash {
		t.Errorf("hashes: a=%s b=%s c=%s", a.Hash, b.Hash, c.Hash)
	}
}

func TestParseRequest(t *testing.T) {
	for _, c := range []struct {
		in, want string // want: Request.String(), or "error"
	}{
		{"https://api.example.com/v1", "tcp:api.example.com:443"},
		{"http://api.example.com", "tcp:api.example.com:80"},
		{"HTTPS://API.Example.COM.:8443/x?y#z", "tcp:api.example.com:8443"},
		{"https://[2001:db8::1]/", "tcp:[2001:db8::1]:443"},
		{"tcp:10.0.0.5:5432", "tcp:10.0.0.5:5432"},
		{"udp:1.1.1.1:53", "udp:1.1.1.1:53"},
		{"tcp:[::ffff:169.254.169.254]:80", "tcp:[::ffff:169.254.169.254]:80"},
		{"file:rw:/work/app/.env", "file:rw:/work/app/.env"},
		{"git:push:github.com/acme/app:refs/heads/main", "git:push:github.com/acme/app:refs/heads/main"},
		{"git:read:github.com/acme/app", "git:read:github.com/acme/app"},
		{"ssh:deploy@build1:22", "ssh:deploy@build1:22"},
		{"ssh:deploy@build1", "ssh:deploy@build1:22"},
		{"ssh:deploy@[2001:db8::1]:2222", "ssh:deploy@[2001:db8::1]:2222"},
		{"ssh:deploy@[2001:db8::1]", "ssh:deploy@[2001:db8::1]:22"},
		// ambiguous IP spellings are rejected, not guessed
		{"tcp:2130706433:80", "error"},
		{"tcp:0177.0.0.1:80", "error"},
		{"tcp:0x7f.0.0.1:80", "error"},
		{"tcp:127.1:80", "error"},
		{"https://0x7f000001/", "error"},
		{"tcp:[fe80::1%eth0]:80", "error"},
		{"tcp:example.com:0", "error"},
		{"tcp:example.com:65536", "error"},
		{"tcp:example.com:080", "error"},
		{"tcp:example.com", "error"},
		{"https:///path", "error"},
		{"file:rx:/a", "error"},
		{"file:ro:relative", "error"},
		{"git:push:github.com/acme/app", "error"},
		{"git:read:github.com/acme/app:refs/heads/main", "error"},
		{"git:push:github.com/acme/app:main", "error"},
		{"git:shove:github.com/acme/app:refs/heads/main", "error"},
		{"ssh:build1", "error"},
		{"ssh:@build1", "error"},
		{"ftp://example.com/", "error"},
		{"example.com", "error"},
	} {
		r, err := ParseRequest(c.in)
		switch {
		case c.want == "error" && err == nil:
			t.Errorf("ParseRequest(%q) = %s; want an error", c.in, r)
		case c.want == "error":
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("ParseRequest(%q): %v is not ErrInvalid", c.in, err)
			}
		case err != nil:
			t.Errorf("ParseRequest(%q): %v", c.in, err)
		case r.String() != c.want:
			t.Errorf("ParseRequest(%q) = %s; want %s", c.in, r, c.want)
		}
	}
}
