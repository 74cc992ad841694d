package sshgw

import (
	"strings"

	"smx/internal/policy"
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

// GitGate decides Git over SSH. It is the seam between this gateway and the
// Git gateway (internal/gitgw), which owns Git's rules for both transports:
// one piece of code decides a push whether it came over HTTPS or SSH.
//
// Contract: Decide is called once per exec request of a Git service,
// before anything reaches the upstream; a refusal ends the guest's command
// with the decision's reason on its stderr and an ssh.refused record. It
// must be safe for concurrent use and must not block on the network.
//
// Today the gateway uses RepoGate, which decides at repository level only:
// read for git-upload-pack and git-upload-archive, push for
// git-receive-pack (policy.Profile.GitPushOverSSH, which refuses a push to
// a repository that has ref rules rather than ignore them). Ref rules (protected branches, deletes, force pushes)
// need the pushed commands, which travel inside the session's stream: the
// Git gateway will plug in by implementing GitGate plus a stream filter for
// allowed receive-pack sessions (parse the ref update commands from the
// guest, decide each, answer refused ones with report-status and pass only
// allowed ones upstream). Until it does, deletes and force pushes over SSH
// to a repository with a repository-level push: allow cannot be told from
// plain pushes and are let through.
type GitGate interface {
	Decide(r GitRequest) policy.Decision
}

// RepoGate decides Git over SSH at repository level with the profile's git
// rules (policy.KindGit).
type RepoGate struct{}

// Decide implements GitGate.
func (RepoGate) Decide(r GitRequest) policy.Decision {
	if r.Profile == nil {
		return policy.Decision{Rule: "sshgw: no policy", Reason: "the sandbox has no profile"}
	}
	if r.Push() {
		return r.Profile.GitPushOverSSH(r.Repo)
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
