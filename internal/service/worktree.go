package service

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/sandbox"
)

// Worktrees: `--worktree NAME` gives a sandbox its own Git worktree of a
// host repository, on branch agent/NAME, made from the repository's HEAD
// (or reused when it exists). The worktree is the workspace; the main
// repository's .git is shared at its own path in the guest so the
// worktree's gitfile resolves and a commit in the guest lands in the host
// repository at once. The supervisor narrows the profile to that branch
// (policy.Profile.Worktree): in the shared .git the guest writes only
// objects, its branch and its worktree's own files; through the Git
// gateway it pushes only its branch.
//
// The host's git never trusts the worktree: it runs with a clean
// environment, no system or global config, hooks and fsmonitor off and
// no transport allowed, and with GIT_DIR named explicitly rather than
// found through a gitfile the guest might have written.

// WorktreeBranchPrefix is the prefix of a worktree sandbox's branch.
const WorktreeBranchPrefix = "agent/"

// hostGit runs git for a worktree on the host, hardened as above, in dir
// (with gitDir, when set, as GIT_DIR; dir is a safe.directory), and
// returns its trimmed stdout. args may begin with one -c pair.
func hostGit(ctx context.Context, dir, gitDir string, args ...string) (string, error) {
	hard := []string{
		"-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
		"-c", "core.untrackedCache=false", "-c", "protocol.allow=never",
		"-c", "submodule.recurse=false", "-c", "core.sshCommand=false",
	}
	// The folder named is the user's (smx under sudo is root, the
	// checkout the user's): git's ownership check would refuse it.
	hard = append(hard, "-c", "safe.directory="+dir)
	sub := args[0]
	if sub == "-c" && len(args) > 2 {
		sub = args[2]
	}
	cmd := exec.CommandContext(ctx, "git", append(hard, args...)...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=/nonexistent", "LC_ALL=C",
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0", "GIT_OPTIONAL_LOCKS=0"}
	if gitDir != "" {
		cmd.Env = append(cmd.Env, "GIT_DIR="+gitDir)
	}
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = err.Error()
		}
		return "", fmt.Errorf("git %s: %s", sub, msg)
	}
	return strings.TrimSpace(out.String()), nil
}

// validWorktreeName checks NAME of --worktree: a sandbox-like name that
// also makes a valid branch name agent/NAME.
func validWorktreeName(name string) error {
	if sandbox.ValidName(name) != nil || strings.Contains(name, "..") || strings.HasSuffix(name, ".lock") || strings.HasSuffix(name, ".") {
		return fmt.Errorf("invalid --worktree %q: use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit, with no '..' and not ending in '.' or '.lock' (it names branch agent/NAME): %w", name, errdefs.ErrInvalid)
	}
	return nil
}

// prepareWorktree creates, or reuses, the worktree NAME of the repository
// at repo: under dir when given (dir/NAME), else in the state dir.
func (s *Service) prepareWorktree(ctx context.Context, repo, name, dir string) (*sandbox.Worktree, error) {
	if err := validWorktreeName(name); err != nil {
		return nil, err
	}
	repo, err := filepath.Abs(repo)
	if err != nil {
		return nil, err
	}
	out, err := hostGit(ctx, repo, "", "rev-parse", "--path-format=absolute", "--show-toplevel", "--git-common-dir")
	if err != nil {
		return nil, fmt.Errorf("--worktree: %s is not a Git repository's folder (%v): %w", repo, err, errdefs.ErrInvalid)
	}
	lines := strings.Split(out, "\n")
	if len(lines) != 2 {
		return nil, fmt.Errorf("--worktree: %s: cannot tell the repository's folder: %w", repo, errdefs.ErrInvalid)
	}
	top, gitDir := filepath.Clean(lines[0]), filepath.Clean(lines[1])
	if filepath.Base(gitDir) != ".git" {
		return nil, fmt.Errorf("--worktree: the repository's git dir %s is not a folder named .git (a separate git dir or a bare repository): use a plain clone: %w", gitDir, errdefs.ErrInvalid)
	}
	if dir == "" {
		sum := sha256.Sum256([]byte(gitDir))
		dir = filepath.Join(s.state.Root, "worktrees", filepath.Base(top)+"-"+hex.EncodeToString(sum[:4]))
	} else if dir, err = filepath.Abs(dir); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, name)
	wt := &sandbox.Worktree{Repo: top, GitDir: gitDir, Path: path, Branch: WorktreeBranchPrefix + name}
	if _, err := os.Lstat(path); err == nil {
		// Reused: it must be this repository's worktree on this branch.
		if wt.Name, err = worktreeAdminName(path, gitDir); err != nil {
			return nil, err
		}
		head, err := hostGit(ctx, top, filepath.Join(gitDir, "worktrees", wt.Name), "symbolic-ref", "-q", "HEAD")
		if err != nil || head != "refs/heads/"+wt.Branch {
			return nil, fmt.Errorf("--worktree: %s exists but is not on branch %s (it is on %q): remove it or name another worktree: %w", path, wt.Branch, head, errdefs.ErrExists)
		}
		trackingDirs(ctx, top, gitDir)
		return wt, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	args := []string{"worktree", "add", "--quiet"}
	if _, err := hostGit(ctx, top, gitDir, "rev-parse", "--verify", "-q", "refs/heads/"+wt.Branch); err == nil {
		// The branch outlived an earlier worktree: take it up again.
		args = append(args, path, wt.Branch)
	} else {
		args = append(args, "-b", wt.Branch, path, "HEAD")
	}
	if _, err := hostGit(ctx, top, gitDir, args...); err != nil {
		return nil, fmt.Errorf("--worktree: %v", err)
	}
	if wt.Name, err = worktreeAdminName(path, gitDir); err != nil {
		return nil, err
	}
	trackingDirs(ctx, top, gitDir)
	// Fresh, before any sandbox has seen it: what git made as root (smx
	// under sudo) becomes the repository owner's, or git in the guest,
	// which sees only that owner as its user, calls it dubious.
	chownLike(gitDir, path, filepath.Join(gitDir, "worktrees", wt.Name), filepath.Join(gitDir, "refs/heads/agent"),
		filepath.Join(gitDir, "logs/refs/heads/agent"), filepath.Join(gitDir, "refs/remotes"), filepath.Join(gitDir, "logs/refs/remotes"))
	return wt, nil
}

// chownLike gives the trees at paths (links not followed) the owner of
// like, when smx runs as root and like is someone else's.
func chownLike(like string, paths ...string) {
	var st unix.Stat_t
	if os.Geteuid() != 0 || unix.Lstat(like, &st) != nil || st.Uid == 0 {
		return
	}
	for _, p := range paths {
		filepath.WalkDir(p, func(q string, _ os.DirEntry, err error) error {
			if err == nil {
				os.Lchown(q, int(st.Uid), int(st.Gid))
			}
			return nil
		})
	}
}

// trackingDirs makes, for each remote R, refs/remotes/R/agent and its
// reflog's folder: the guest may write its branch's remote-tracking ref
// (a push updates it) but no folder above it.
func trackingDirs(ctx context.Context, top, gitDir string) {
	out, err := hostGit(ctx, top, gitDir, "remote")
	if err != nil {
		return
	}
	for _, r := range strings.Fields(out) {
		for _, base := range []string{"refs/remotes", "logs/refs/remotes"} {
			root := filepath.Join(gitDir, base)
			d := filepath.Join(root, r, strings.TrimSuffix(WorktreeBranchPrefix, "/"))
			if strings.HasPrefix(d, root+"/") {
				os.MkdirAll(d, 0o755)
			}
		}
	}
}

// worktreeAdminName reads the worktree's gitfile (never following a
// link) and returns the name of its directory under gitDir/worktrees,
// refusing a gitfile that points anywhere else.
func worktreeAdminName(path, gitDir string) (string, error) {
	fd, err := unix.Open(filepath.Join(path, ".git"), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return "", fmt.Errorf("--worktree: %s is not a worktree (%v): remove it or name another worktree: %w", path, err, errdefs.ErrExists)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	b := make([]byte, 4097)
	n, _ := f.Read(b)
	line := strings.TrimSuffix(string(b[:n]), "\n")
	rest, ok := strings.CutPrefix(line, "gitdir: "+gitDir+"/worktrees/")
	if !ok || n > 4096 || rest == "" || strings.ContainsAny(rest, "/\n") || rest == "." || rest == ".." {
		return "", fmt.Errorf("--worktree: %s is not a worktree of %s: remove it or name another worktree: %w", path, gitDir, errdefs.ErrExists)
	}
	return rest, nil
}

// WorktreeRemoval says what became of a removed sandbox's worktree.
type WorktreeRemoval struct {
	Path    string `json:"path"`
	Branch  string `json:"branch"`
	Removed bool   `json:"removed"`
	// Reason says why the worktree was kept (when not Removed).
	Reason string `json:"reason,omitempty"`
}

// RemoveWorktree removes wt's worktree, once its sandbox is removed, when
// it is clean (no change, no untracked file) and no other sandbox works
// in it; its branch, with the agent's commits, stays. Otherwise the
// worktree is kept and Reason says why.
func (s *Service) RemoveWorktree(ctx context.Context, wt *sandbox.Worktree) (*WorktreeRemoval, error) {
	r := &WorktreeRemoval{Path: wt.Path, Branch: wt.Branch}
	if _, err := os.Lstat(wt.Path); os.IsNotExist(err) {
		r.Reason = "it is gone already"
		return r, nil
	}
	if list, err := s.List(ctx); err == nil {
		for _, sb := range list {
			if o := sb.Spec.Worktree; o != nil && o.Path == wt.Path {
				r.Reason = "sandbox " + sb.Spec.Name + " works in it too"
				return r, nil
			}
		}
	}
	admin := filepath.Join(wt.GitDir, "worktrees", wt.Name)
	// GIT_DIR and the work tree named here, not found through the
	// worktree's own gitfile.
	st, err := hostGit(ctx, wt.Path, admin, "--work-tree="+wt.Path, "status", "--porcelain", "--untracked-files=all")
	if err != nil {
		return nil, fmt.Errorf("worktree %s: %v", wt.Path, err)
	}
	if st != "" {
		r.Reason = fmt.Sprintf("it has %d uncommitted change(s)", strings.Count(st, "\n")+1)
		return r, nil
	}
	if _, err := hostGit(ctx, wt.Repo, wt.GitDir, "-c", "safe.directory="+wt.Path, "worktree", "remove", wt.Path); err != nil {
		return nil, fmt.Errorf("worktree %s: %v", wt.Path, err)
	}
	r.Removed = true
	return r, nil
}
