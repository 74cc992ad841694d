package policy

import (
	"strings"
	"testing"
)

func TestAddRuleKeepsCommentsAndOrder(t *testing.T) {
	in := `# my profile: the team's
name: team
network:
  mode: ask # ask for the rest
  allow:
    # the registry we use
    - domain: registry.example.test
      ports: [443]
  deny:
    - domain: evil.example.test
files:
  rules:
    - {path: /work/**, access: rw}
`
	out, line, err := AddRule([]byte(in), "network.allow", [][2]string{{"domain", "packages.example.test"}, {"ports", "[443]"}}, "approval ap-1: TLS to packages.example.test:443")
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	for _, want := range []string{"# my profile: the team's", "mode: ask # ask for the rest", "# the registry we use", ApprovedMark,
		"# approval ap-1: TLS to packages.example.test:443", "domain: packages.example.test"} {
		if !strings.Contains(s, want) {
			t.Errorf("missing %q in\n%s", want, s)
		}
	}
	if strings.Index(s, "registry.example.test") > strings.Index(s, "packages.example.test") || strings.Index(s, "packages.example.test") > strings.Index(s, "deny:") {
		t.Errorf("order changed:\n%s", s)
	}
	if line != "network.allow: {domain: packages.example.test, ports: [443]}" {
		t.Errorf("line %q", line)
	}
	p, err := Parse("p.yaml", out, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, s)
	}
	if d := p.Decide(Request{Kind: KindNet, Host: "packages.example.test", Port: 443}); !d.Allow || !strings.Contains(d.Rule, "network.allow[1]") {
		t.Errorf("after always: %+v", d)
	}
	// A second rule joins the same marked section: one mark.
	out2, _, err := AddRule(out, "network.allow", [][2]string{{"domain", "b.example.test"}}, "approval ap-2")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(out2), ApprovedMark); n != 1 {
		t.Errorf("%d marks:\n%s", n, out2)
	}
	// A profile without the section gains it.
	out3, _, err := AddRule([]byte("extends: dev\n"), "network.allow", [][2]string{{"domain", "c.example.test"}}, "approval ap-3")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Parse("p.yaml", out3, nil); err != nil || !strings.Contains(string(out3), "c.example.test") {
		t.Fatalf("%v\n%s", err, out3)
	}
}

func TestAddRefRule(t *testing.T) {
	in := "git:\n  repos:\n    # our app\n    - repo: example.test/acme/app\n      push: allow\n      refs:\n        - ref: refs/heads/main\n          push: ask\n"
	out, line, err := AddRefRule([]byte(in), "example.test/acme/app", [][2]string{{"ref", "refs/heads/main"}, {"push", "allow"}}, "approval ap-9")
	if err != nil {
		t.Fatal(err)
	}
	p, err := Parse("p.yaml", out, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if d := p.Decide(Request{Kind: KindGit, Repo: "example.test/acme/app", Access: "push", Ref: "refs/heads/main"}); !d.Allow {
		t.Errorf("after always: %+v\n%s", d, out)
	}
	if !strings.Contains(string(out), "# our app") || !strings.Contains(line, "refs/heads/main") {
		t.Errorf("%s\n%s", line, out)
	}
	// A repository no entry names gets one.
	out, _, err = AddRefRule([]byte(in), "example.test/acme/lib", [][2]string{{"ref", "refs/heads/main"}, {"push", "allow"}}, "approval ap-10")
	if err != nil {
		t.Fatal(err)
	}
	p, err = Parse("p.yaml", out, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if d := p.Decide(Request{Kind: KindGit, Repo: "example.test/acme/lib", Access: "push", Ref: "refs/heads/main"}); !d.Allow {
		t.Errorf("new entry: %+v\n%s", d, out)
	}
}
