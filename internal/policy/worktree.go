package policy

import (
	"path"
	"strings"
)

// Worktree narrows p for a sandbox that works in a Git worktree of a host
// repository (`smx agent run --worktree NAME`): the worktree's repository,
// gitDir (the main repository's .git, absolute and clean, shared at the
// same path in the guest so the worktree's gitfile resolves), and the
// branch the worktree checked out (agent/NAME).
//
// Files: gitDir is read-only except what a commit on branch writes:
// objects/**, the branch's ref and reflog (and its remote-tracking
// copies, which a push updates), and gitDir/worktrees/WT/** (the
// worktree's own HEAD, index, logs, FETCH_HEAD), WT being the worktree's
// directory name there. So the guest cannot move the repository's other
// branches (main, the other agents'), and the built-in protection still
// keeps config, hooks, info and worktrees/*/commondir read-only.
//
// Git: a push, delete or force push through the Git gateway is allowed
// only for refs/heads/BRANCH, to any repository, and only where the
// profile's git rules allow it too: the narrowing grants nothing.
//
// Worktree recompiles p; call it before p is shared.
func (p *Profile) Worktree(gitDir, wt, branch string) {
	gitDir = path.Clean(gitDir)
	rule := func(p string, a Access) FileRule {
		return FileRule{Path: p, Access: a, Where: "worktree " + branch + " files"}
	}
	p.Files.Rules = append(p.Files.Rules,
		rule(gitDir+"/**", ReadOnly),
		rule(gitDir+"/objects/**", ReadWrite),
		rule(gitDir+"/refs/heads/"+branch, ReadWrite),
		rule(gitDir+"/refs/heads/"+branch+".lock", ReadWrite),
		rule(gitDir+"/logs/refs/heads/"+branch, ReadWrite),
		// The remote-tracking copy of the branch a push updates.
		rule(gitDir+"/refs/remotes/*/"+branch, ReadWrite),
		rule(gitDir+"/refs/remotes/*/"+branch+".lock", ReadWrite),
		rule(gitDir+"/logs/refs/remotes/*/"+branch, ReadWrite),
		rule(gitDir+"/worktrees/"+wt+"/**", ReadWrite),
	)
	p.pushOnly = "refs/heads/" + branch
	p.c = compile(p)
}

// PushOnly is the one ref Worktree narrowed pushes to ("" when none).
func (p *Profile) PushOnly() string { return p.pushOnly }

// decidePushOnly refuses a push, delete or force push of any ref but
// p.pushOnly (ok false when it does not apply).
func (p *Profile) decidePushOnly(r Request, repo string) (Decision, bool) {
	if p.pushOnly == "" || r.Ref == p.pushOnly {
		return Decision{}, false
	}
	branch := strings.TrimPrefix(p.pushOnly, "refs/heads/")
	return deny("worktree "+branch+": pushes only "+p.pushOnly,
		r.Access+" of "+r.Ref+" in "+repo+" is denied: this sandbox works on the worktree of branch "+branch+" and may push only that branch"), true
}
