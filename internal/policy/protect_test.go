package policy

import (
	"strings"
	"testing"
)

// protectedPaths are files the host runs, each at several depths, with the
// protection that should name them.
var protectedPaths = []struct{ path, what string }{
	{"/work/.git", ".git"},
	{"/work/.git/config", ".git/config"},
	{"/work/a/b/c/.git/config", ".git/config"},
	{"/src/.git/config", ".git/config"}, // any mount, not just /work
	{"/work/.git/config.worktree", ".git/config.worktree"},
	{"/work/.git/config.lock", ".git/config.lock"},
	{"/work/.git/commondir", ".git/commondir"},
	{"/work/.git/hooks", ".git/hooks/**"},
	{"/work/.git/hooks/pre-commit", ".git/hooks/**"},
	{"/work/x/.git/hooks/sub/post-checkout", ".git/hooks/**"},
	{"/work/.git/info", ".git/info/**"},
	{"/work/.git/info/attributes", ".git/info/**"},
	{"/work/deep/er/.git/info/exclude", ".git/info/**"},
	{"/work/.git/worktrees/wt/config.worktree", ".git/worktrees/*/config.worktree"},
	{"/work/.git/worktrees/wt/commondir", ".git/worktrees/*/commondir"},
	{"/work/.git/modules/lib/config", ".git/modules/**/config"},
	{"/work/.git/modules/vendor/lib/hooks/pre-push", ".git/modules/**/hooks/**"},
	{"/work/.git/modules/a/modules/b/info/attributes", ".git/modules/**/info/**"},
	{"/work/.git/modules/config/config", ".git/modules/**/config"}, // a submodule called config
	{"/work/.git/modules/a/worktrees/w/commondir", ".git/modules/**/worktrees/*/commondir"},
	{"/work/sub/.git", ".git"}, // a gitfile or a new nested repository
	{"/work/.gitmodules", ".gitmodules"},
	{"/work/.envrc", ".envrc"},
	{"/work/a/b/.envrc", ".envrc"},
	{"/work/.vscode", ".vscode/**"},
	{"/work/.vscode/tasks.json", ".vscode/**"},
	{"/work/pkg/.vscode/settings.json", ".vscode/**"},
	{"/work/.idea/workspace.xml", ".idea/**"},
	{"/work/.devcontainer/devcontainer.json", ".devcontainer/**"},
	{"/work/.devcontainer.json", ".devcontainer.json"},
	{"/work/.GIT/Config", ".git/config"},                         // a case-insensitive host folder
	{"/work/mirror.git/config", "*.git/config"},                  // a bare repository
	{"/work/forge/app.git/hooks/post-receive", "*.git/hooks/**"}, //
	{"/work/fake/HEAD", "HEAD"},                                  // HEAD makes any directory a bare repository
	{"/work/HEAD", "HEAD"},                                       //
	{"/work/.VSCode/tasks.json", ".vscode/**"},
}

// writablePaths are the rest of a repository, which git in the guest must
// be able to write.
var writablePaths = []string{
	"/work/.git/HEAD", "/work/.git/index", "/work/.git/ORIG_HEAD", "/work/.git/FETCH_HEAD",
	"/work/.git/index.lock", "/work/.git/packed-refs",
	"/work/.git/objects/ab/cdef", "/work/.git/objects/info/packs", "/work/.git/objects/pack/p.pack",
	"/work/.git/refs/heads/main", "/work/.git/refs/heads/config", "/work/.git/refs/heads/hooks/x",
	"/work/.git/logs/refs/heads/main", "/work/.git/rebase-merge/done", "/work/.git/worktrees/wt/HEAD",
	"/work/.git/modules/lib/HEAD", "/work/.git/modules/lib/objects/ab/cd", "/work/.git/modules/lib/refs/heads/config",
	"/work/.gitignore", "/work/.gitattributes", "/work/src/config", "/work/hooks/pre-commit", "/work/info/x",
	"/work/.git/logs/HEAD", "/work/.git/refs/remotes/origin/HEAD", "/work/.git/modules/lib/logs/HEAD",
	"/work/mirror.git/HEAD", "/work/mirror.git/objects/ab/cd", "/work/x/head", "/work/docs/intro.git",
	"/work/.github/workflows/ci.yml", "/work/git/config", "/work/.envrc.example", "/work/.vscode-test/x",
}

func TestProtectedReadOnlyEverywhere(t *testing.T) {
	locked, _ := Builtin("locked")
	dev, _ := Builtin("dev")
	open, _ := Builtin("open")
	mount := func(guest string) FileMount { return FileMount{Guest: guest, Rule: "-v /h:" + guest} }
	for _, c := range protectedPaths {
		m := mount("/work")
		if strings.HasPrefix(c.path, "/src") {
			m = mount("/src")
		}
		for name, p := range map[string]*Profile{"locked": locked, "dev": dev, "open": open} {
			d := p.DecideMounted(m, c.path, "rw")
			if d.Allow || d.Rule != ruleProtected+" ("+c.what+")" || !strings.Contains(d.Reason, c.path) {
				t.Errorf("%s: rw %s: got %+v, want refused by %s (%s)", name, c.path, d, ruleProtected, c.what)
			}
			if d := p.DecideMounted(m, c.path, "ro"); !d.Allow {
				t.Errorf("%s: ro %s: got %+v, want readable", name, c.path, d)
			}
		}
	}
	for _, path := range writablePaths {
		for name, p := range map[string]*Profile{"locked": locked, "dev": dev, "open": open} {
			if d := p.DecideMounted(mount("/work"), path, "rw"); !d.Allow {
				t.Errorf("%s: rw %s: got %+v, want writable", name, path, d)
			}
		}
	}
}

func TestProtectedOpenedExplicitly(t *testing.T) {
	p, err := Parse("t.yaml", []byte(`extends: dev
files:
  rules:
    - path: /work/app/.git/hooks/**
      access: rw
    - path: /**/.envrc
      access: rw
    - path: /work/tools/**
      access: rw
    - path: /work/web/.vscode/**
      access: rw
    - path: /work/web/.vscode/tasks.json
      access: ro
    - path: /work/secret/.git/**
      access: deny
    - path: /work/lib/.git/**
      access: rw
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	m := FileMount{Guest: "/work", Rule: "-v /h:/work"}
	for _, c := range []struct {
		path  string
		allow bool
		rule  string
	}{
		{"/work/app/.git/hooks/pre-commit", true, "t.yaml:4:7"},                  // named: opened
		{"/work/app/.git/config", false, ruleProtected},                          // a sibling stays closed
		{"/work/other/.git/hooks/pre-commit", false, ruleProtected},              // another repository
		{"/work/.envrc", true, "t.yaml:6:7"},                                     // /**/.envrc names it
		{"/work/a/b/.envrc", true, "t.yaml:6:7"},                                 //
		{"/work/tools/.envrc", true, "t.yaml:6:7"},                               // a more specific rw rule that does not name it does not apply
		{"/work/tools/.vscode/tasks.json", false, ruleProtected},                 // /work/tools/** does not name .vscode
		{"/work/web/.vscode/settings.json", true, "t.yaml:10:7"},                 //
		{"/work/web/.vscode/tasks.json", false, "t.yaml:12:7"},                   // ro beats it (more specific)
		{"/work/secret/.git/config", false, "t.yaml:14:7"},                       // deny beats everything
		{"/work/lib/.git", true, "t.yaml:16:7"},                                  // /work/lib/.git/** names .git
		{"/work/lib/.git/config", false, ruleProtected},                          // ...but not config
		{"/work/lib/.git/objects/ab/cd", true, "t.yaml:16:7"},                    //
		{"/work/app/.GIT/hooks/pre-commit", false, ruleProtected},                // the rule matches case-sensitively
		{"/work/web/.vscode/../.vscode/tasks.json", false, "builtin: malformed"}, //
	} {
		d := p.DecideMounted(m, c.path, "rw")
		if d.Allow != c.allow || !strings.HasPrefix(d.Rule, c.rule) {
			t.Errorf("rw %s: got %+v, want allow=%v rule %s...", c.path, d, c.allow, c.rule)
		}
	}
	// Explain (Decide, no mount) says the same.
	d := p.Decide(Request{Kind: KindFile, Path: "/work/x/.git/config", Access: "rw"})
	if d.Allow || !strings.HasPrefix(d.Rule, ruleProtected) || !strings.Contains(d.Reason, "path: /work/x/.git/config, access: rw") {
		t.Errorf("explain: %+v", d)
	}
	d = p.Decide(Request{Kind: KindFile, Path: "/work/x/.vscode/tasks.json", Access: "rw"})
	if !strings.Contains(d.Reason, "path: /work/x/.vscode/**, access: rw") {
		t.Errorf("explain: %+v", d)
	}
}

func TestProtectedUnprotectedMount(t *testing.T) {
	dev, _ := Builtin("dev")
	pod := FileMount{Guest: "/smx-pod", Unprotected: true, Rule: "-v /b/pod:/smx-pod:protect=off"}
	work := FileMount{Guest: "/work", Rule: "-v /h:/work"}
	// A pod share's containers clone and configure repositories of their own.
	if d := dev.DecideMounted(pod, "/smx-pod/c1/rootfs/src/.git/config", "rw"); !d.Allow || d.Rule != pod.Rule {
		t.Errorf("protect=off mount: %+v", d)
	}
	if d := dev.DecideMounted(work, "/work/.git/config", "rw"); d.Allow {
		t.Errorf("another mount of the same profile: %+v", d)
	}
	p, err := Parse("t.yaml", []byte("extends: dev\nfiles:\n  rules:\n    - path: /smx-pod/**/.env\n      access: deny\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := p.DecideMounted(pod, "/smx-pod/c1/.env", "ro"); d.Allow {
		t.Errorf("deny under a protect=off mount: %+v", d)
	}
}

func TestProtectedOpenings(t *testing.T) {
	p, err := Parse("t.yaml", []byte(`extends: open
files:
  rules:
    - path: /work/app/.git/hooks/**
      access: rw
    - path: /work/**
      access: rw
    - path: /work/lib/.git/**
      access: rw
    - path: /work/*/.git/modules/**/config
      access: rw
    - path: /**/.vscode/**
      access: ro
    - path: /**/.envrc
      access: rw
    - path: /work/.git/worktrees/*/commondir
      access: rw
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range p.Openings() {
		got = append(got, o.Rule.Pos.String()+" "+o.What)
	}
	want := []string{
		"t.yaml:4:7 .git/hooks/**", "t.yaml:8:7 .git", "t.yaml:10:7 .git/modules/**/config",
		"t.yaml:14:7 .envrc", "t.yaml:16:7 .git/worktrees/*/commondir",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("openings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, name := range BuiltinNames() {
		b, _ := Builtin(name)
		if o := b.Openings(); len(o) != 0 {
			t.Errorf("built-in %s opens %v", name, o)
		}
	}
}

func BenchmarkDecideWrite(b *testing.B) {
	dev, _ := Builtin("dev")
	m := FileMount{Guest: "/work", Rule: "-v /h:/work"}
	b.ReportAllocs()
	for b.Loop() {
		dev.DecideMounted(m, "/work/src/pkg/module/file.go", "rw")
	}
}
