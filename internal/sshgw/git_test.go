package sshgw

import (
	"strings"
	"testing"
)

func TestParseGitCommand(t *testing.T) {
	for _, c := range []struct {
		cmd, svc, path string
	}{
		{"git-upload-pack 'acme/app.git'", "git-upload-pack", "acme/app.git"},
		{"git-receive-pack '/acme/app.git'", "git-receive-pack", "/acme/app.git"},
		{"git upload-pack 'acme/app.git'", "git-upload-pack", "acme/app.git"},
		{"git-upload-archive 'a/b'", "git-upload-archive", "a/b"},
		{`git-receive-pack 'it'\''s/x.git'`, "git-receive-pack", "it's/x.git"},
		{"git-upload-pack acme/app.git", "git-upload-pack", "acme/app.git"},
		{"  git-upload-pack 'a/b'  ", "git-upload-pack", "a/b"},
		{"git-upload-pack 'a/b' ; rm -rf /", "", ""},
		{"git-upload-pack 'a/b", "", ""},
		{"git-upload-pack ''", "", ""},
		{"git-upload-pack a b", "", ""},
		{"git-upload-packx 'a/b'", "", ""},
		{"echo git-upload-pack 'a/b'", "", ""},
		{"scp -t /tmp", "", ""},
	} {
		svc, p, ok := ParseGitCommand(c.cmd)
		if ok != (c.svc != "") || svc != c.svc || p != c.path {
			t.Errorf("%q: %q %q %v, want %q %q", c.cmd, svc, p, ok, c.svc, c.path)
		}
	}
}

// A command that is not exactly a Git service is not taken for one: it
// runs as an ordinary command (the ssh rule allowed the login), so the
// only risk is a Git command slipping past the git rules.
func FuzzParseGitCommand(f *testing.F) {
	for _, s := range []string{"git-upload-pack 'a/b'", `git-receive-pack 'it'\''s'`, "git upload-pack x", "git-upload-pack '"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, cmd string) {
		svc, p, ok := ParseGitCommand(cmd)
		if !ok {
			if strings.HasPrefix(strings.TrimSpace(cmd), "git-receive-pack ") && !strings.ContainsAny(cmd, "'\\\" ;|&$`\n") {
				t.Fatalf("%q not recognised", cmd)
			}
			return
		}
		if p == "" || svc == "" || strings.Contains(p, "\x00") && !strings.Contains(cmd, "\x00") {
			t.Fatalf("%q: %q %q", cmd, svc, p)
		}
	})
}

func TestIsSCP(t *testing.T) {
	for cmd, want := range map[string]bool{
		"scp -t /tmp/x": true, "scp -f /etc/passwd": true, "scp -r -t /d": true, "/usr/bin/scp -pt x": true,
		"scp --help": false, "echo scp -t": false, "rsync --server -t . x": false, "ls": false, "": false,
	} {
		if got := isSCP(cmd); got != want {
			t.Errorf("isSCP(%q) = %v", cmd, got)
		}
	}
}

func TestEnvAllowed(t *testing.T) {
	for _, c := range []struct {
		globs []string
		name  string
		want  bool
	}{
		{nil, "LANG", true}, {nil, "LC_ALL", true}, {nil, "LD_PRELOAD", false}, {nil, "PATH", false},
		{[]string{}, "LANG", false},
		{[]string{"CI_*"}, "CI_JOB", true}, {[]string{"CI_*"}, "LANG", false}, {[]string{"A?"}, "AB", true},
	} {
		if got := envAllowed(c.globs, c.name); got != c.want {
			t.Errorf("envAllowed(%v, %q) = %v", c.globs, c.name, got)
		}
	}
}

// Every spelling git-shell resolves to HOME/acme/app.git maps to
// acme/app.git; what the gateway cannot map is refused.
func TestRepoPath(t *testing.T) {
	for _, c := range []struct {
		path, root, want string // want "" means refused
	}{
		{"acme/app.git", "/home/git", "acme/app.git"},
		{"acme/app.git/", "/home/git", "acme/app.git"},
		{"/home/git/acme/app.git", "/home/git", "acme/app.git"},
		{"~/acme/app.git", "/home/git", "acme/app.git"},
		{"~git/acme/app.git", "/home/git", "acme/app.git"},
		{"~other/acme/app.git", "/home/git", ""},
		{"/home/gitx/acme/app.git", "/home/git", ""},
		{"/home/git", "/home/git", ""},
		{"/srv/acme/app.git", "/home/git", ""},
		{"/home/git/../git/acme/app.git", "/home/git", ""},
		{"./acme/app.git", "/home/git", ""},
		{"acme//app.git", "/home/git", ""},
		{"acme/x/../app.git", "/home/git", ""},
		{"acme/app/.git", "/home/git", ""},
		{"acme/app/.GIT", "/home/git", ""},
		{"acme/%61pp.git", "/home/git", ""},
		{`acme\app.git`, "/home/git", ""},
		{"acme/app.git\n", "/home/git", ""},
		{"acme/~/app.git", "/home/git", ""},
		{"~", "/home/git", ""},
		{"~/", "/home/git", ""},
		// A forge parses the path itself: a leading / (ssh:// URLs) is
		// dropped, ~ cannot be mapped.
		{"acme/app.git", "", "acme/app.git"},
		{"/acme/app.git", "", "acme/app.git"},
		{"~/acme/app.git", "", ""},
		{"~git/acme/app.git", "", ""},
		{"/acme//app.git", "", ""},
		{"/", "", ""},
	} {
		got, bad := RepoPath(c.path, "git", c.root)
		if got != c.want || (bad == "") != (c.want != "") {
			t.Errorf("RepoPath(%q, root %q) = %q, %q; want %q", c.path, c.root, got, bad, c.want)
		}
	}
}
