package guest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// GitConfig keeps a block of settings in the guest's system git config
// (/etc/gitconfig) so that git in the guest works on a shared repository
// whose .git/config it may not write: the host's git obeys that file, so
// every profile keeps it read-only to the guest (see internal/policy,
// protected). The block is rewritten at every boot; the rest of the file is
// the image's.
//
//   - push.default=current: `git push` of a branch with no upstream
//     pushes it to origin under its own name, without -u (which would
//     write branch.NAME.remote into .git/config; push.autoSetupRemote
//     would try the same);
//   - branch.autoSetupMerge=false: `git checkout -b x origin/main` does not
//     try to record the upstream in .git/config (git would create the
//     branch, fail to write the config and stop);
//   - repack.updateServerInfo=false: gc does not rewrite .git/info/refs.
//
// What still writes .git/config (git remote add, git config without
// --global, push -u, branch --set-upstream-to) fails with "Read-only file
// system", and the refusal is in the log for smx-why.
type GitConfig struct {
	Root string // "/" in the guest; a temporary directory in tests
}

// SystemGitConfig is git's system-wide config file on Debian and most
// distributions.
const SystemGitConfig = "/etc/gitconfig"

const (
	gitBegin = "# smx: the shared folders' .git/config is read-only to this sandbox (rewritten at every boot)\n"
	gitEnd   = "# end smx\n"
	gitBody  = "[push]\n\tdefault = current\n[branch]\n\tautoSetupMerge = false\n[repack]\n\tupdateServerInfo = false\n"
)

func (GitConfig) String() string { return "git config " + SystemGitConfig }

func (g GitConfig) Run(b *Boot) error {
	root := g.Root
	if root == "" {
		root = "/"
	}
	p := filepath.Join(root, SystemGitConfig)
	if r, err := filepath.EvalSymlinks(p); err == nil {
		p = r
	}
	old, err := os.ReadFile(p)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("guest: git config: %w", err)
	}
	next := replaceBlock(old, []byte(gitBody), gitBegin, gitEnd)
	if string(next) == string(old) {
		return nil
	}
	if err := writeAtomic(p, next); err != nil {
		return fmt.Errorf("guest: git config: %w", err)
	}
	return nil
}
