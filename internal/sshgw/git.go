package sshgw

import (
	"strings"

	"github.com/smx-dev/smx/internal/policy"
)

// GitRequest is one Git service an SSH session asks for, as
// `git-receive-pack 'acme/app.git'`.
type GitRequest struct {
	Service string // "git-upload-pack", "git-receive-pack" or "git-upload-archive"
	Path    string // the repository path as the client sent it
	Repo    string // "HOST/PATH" in the form policy.KindGit requests take
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
