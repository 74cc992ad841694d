package sshgw

import (
	"slices"
	"strconv"
	"strings"

	"github.com/smx-dev/smx/internal/policy"
)

// GitRequest is one Git service an SSH session asks for, as
// `git-receive-pack 'acme/app.git'`.
type GitRequest struct {
	Service string // "git-upload-pack", "git-receive-pack" or "git-upload-archive"
	Path    string // the repository path as the client sent it
	Repo    string // the identity rules decide: policy.NormalizeRepo of HOST/RepoPath(Path)
	Host    string // the forge as the guest named it
	User    string // the SSH user (e.g. "git")
	Profile *policy.Profile
}

// Push reports whether r writes to the repository.
func (r GitRequest) Push() bool { return r.Service == "git-receive-pack" }

// GitGate decides Git over SSH at repository level: whether the session
// may start at all. Ref updates of an allowed git-receive-pack are then
// decided one by one by the Git gateway's push filter (gitgw.StreamPush,
// see gitpush.go), the same code that decides a push over HTTPS: ref
// rules, protected branches, deletes, force pushes (fast-forward checked
// on the forge's history), atomic pushes and report-status.
//
// Contract: Decide is called once per exec request of a Git service,
// before anything reaches the upstream; a refusal ends the guest's command
// with the decision's reason on its stderr and an ssh.refused record. It
// must be safe for concurrent use and must not block on the network.
type GitGate interface {
	Decide(r GitRequest) policy.Decision
}

// RepoGate decides as the Git gateway does over HTTPS before any ref is
// looked at: the repository must be readable (policy.KindGit, access
// read) for every service, a push included; what a push may change is
// the push filter's to decide.
type RepoGate struct{}

// Decide implements GitGate.
func (RepoGate) Decide(r GitRequest) policy.Decision {
	if r.Profile == nil {
		return policy.Decision{Rule: "sshgw: no policy", Reason: "the sandbox has no profile"}
	}
	return r.Profile.Decide(policy.Request{Kind: policy.KindGit, Repo: r.Repo, Access: "read"})
}

// gitRequest is the Git service an exec request asks for, with the one
// repository identity its path names on this connection's server (see
// RepoPath), or the reason the path is refused.
func (c *conn) gitRequest(svc, repoPath string) (GitRequest, string) {
	gr := GitRequest{Service: svc, Path: repoPath, Host: c.t.name(), User: c.user, Profile: c.prof}
	gr.Repo = gr.Host + "/" + strings.TrimPrefix(repoPath, "/")
	rel, bad := RepoPath(repoPath, c.user, c.rule.GitRoot)
	if bad != "" {
		return gr, bad
	}
	repo, err := policy.NormalizeRepo(gr.Host + "/" + rel)
	if err != nil {
		return gr, "repository path " + strconv.Quote(repoPath) + ": " + err.Error()
	}
	gr.Repo = repo
	return gr, ""
}

// RepoPath maps the repository path a Git client sent over SSH to the
// path git rules name it by (after the forge: "acme/app.git"), the way
// the server finds the repository, so that every spelling of one
// repository is decided as that repository.
//
// root is the ssh rule's git_root. When it is set the server is plain
// sshd + git-shell, where git resolves a relative path in the user's
// home (root), "~/" and "~USER/" (USER being the login's user) as that
// home, and an absolute path as it is: all are mapped to the path under
// root, and an absolute path elsewhere or another user's "~OTHER/" is
// refused, since the gateway cannot tell which repository it names.
// When root is "" the server is a forge that parses the path itself
// (GitHub, GitLab, Gitea, ...): a leading "/" (an ssh:// URL) is dropped
// and "~" spellings are refused.
//
// Either way the path must be clean: no empty, "." or ".." element (a
// trailing "/" is allowed), no ".git" element, no "%" or "\" (SSH paths
// are not URL-encoded; the server takes them literally), no control or
// non-ASCII characters. Case and a ".git" suffix are folded by
// policy.NormalizeRepo.
func RepoPath(p, user, root string) (string, string) {
	bad := func(why string) (string, string) {
		return "", "repository path " + strconv.Quote(p) + " " + why
	}
	if p == "" || len(p) > 1024 {
		return bad("is empty or too long")
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c < ' ' || c >= 0x7f || c == '%' || c == '\\' {
			return bad("is not clean: it holds a control, non-ASCII, % or \\ character")
		}
	}
	abs := strings.HasPrefix(p, "/")
	els := strings.Split(strings.TrimSuffix(strings.TrimPrefix(p, "/"), "/"), "/")
	for _, el := range els {
		if el == "" || el == "." || el == ".." || strings.EqualFold(el, ".git") {
			return bad("is not clean (an empty, ., .. or .git element); name the repository as owner/name.git")
		}
	}
	home := false
	if t, ok := strings.CutPrefix(els[0], "~"); ok && !abs {
		if t != "" && t != user {
			return bad("names the home directory of " + strconv.Quote(t) + ", which the gateway cannot map to a repository; name it as owner/name.git")
		}
		home, els = true, els[1:]
	}
	switch {
	case root == "" && home:
		return bad("starts with ~, which the gateway cannot map to a repository on a forge (an ssh rule's git_root maps it on a plain git-shell server); name it as owner/name.git")
	case root != "" && abs:
		r := strings.Split(strings.TrimPrefix(root, "/"), "/")
		if len(els) <= len(r) || !slices.Equal(els[:len(r)], r) {
			return bad("is outside " + root + ", the git_root of this host's ssh rule; name it as owner/name.git")
		}
		els = els[len(r):]
	}
	if len(els) == 0 {
		return bad("names no repository")
	}
	for _, el := range els {
		if strings.HasPrefix(el, "~") {
			return bad("has a ~ element the gateway cannot map; name the repository as owner/name.git")
		}
	}
	return strings.Join(els, "/"), ""
}

// ParseGitCommand recognises the command line of a Git service as Git's SSH
// transport sends it: `git-upload-pack 'path'`, `git-receive-pack 'path'`,
// `git-upload-archive 'path'` (also with a space: `git upload-pack`). The
// path is unquoted as Git's sq_quote wrote it.
func ParseGitCommand(cmd string) (service, repoPath string, ok bool) {
	cmd = strings.TrimSpace(cmd)
	for _, svc := range []string{"git-upload-pack", "git-receive-pack", "git-upload-archive"} {
		for _, prefix := range []string{svc + " ", "git " + strings.TrimPrefix(svc, "git-") + " "} {
			if rest, found := strings.CutPrefix(cmd, prefix); found {
				p, good := unquoteSQ(strings.TrimSpace(rest))
				if !good || p == "" {
					return "", "", false
				}
				return svc, p, true
			}
		}
	}
	return "", "", false
}

// unquoteSQ undoes Git's sq_quote: 'a'\”b' → a'b. An unquoted word is
// taken as it is.
func unquoteSQ(s string) (string, bool) {
	if !strings.HasPrefix(s, "'") {
		if strings.ContainsAny(s, " '\"\\") {
			return "", false
		}
		return s, true
	}
	var b strings.Builder
	for len(s) > 0 {
		if s[0] != '\'' {
			return "", false
		}
		end := strings.IndexByte(s[1:], '\'')
		if end < 0 {
			return "", false
		}
		b.WriteString(s[1 : 1+end])
		s = s[2+end:]
		if s == "" {
			break
		}
		if !strings.HasPrefix(s, `\'`) {
			return "", false
		}
		b.WriteByte('\'')
		s = s[2:]
	}
	return b.String(), true
}
