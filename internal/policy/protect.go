package policy

import (
	"slices"
	"strings"
)

// Files the host runs. Programs on the host act on some files of a working
// tree by themselves: git obeys a repository's config (core.fsmonitor,
// core.hooksPath, core.sshCommand, diff.external and filter drivers run
// commands on the next `git status`, which shell prompts and editors run
// unasked) and runs its hooks; direnv runs `.envrc`; editors run tasks and
// terminal profiles from `.vscode/`, `.idea/` and `.devcontainer/`. A guest
// that could write them would run code on the host as the user. So in every
// profile, on every mount and at any depth, these names are read-only to
// the guest, whatever a broad rule or the mount's own mode says: creating,
// changing, renaming, removing or linking them is refused, reading is not.
//
// Elements compare case-insensitively, as on a case-insensitive host
// folder. Protected are:
//   - .git itself (so no new repository, no gitfile pointing at a config
//     the guest wrote, no swapping the repository for another);
//   - in a .git directory, or a bare repository named *.git: config,
//     config.worktree (and their .lock files, so git in the guest fails
//     at once with "Read-only file system"), commondir, hooks/**, info/**;
//     worktrees/*/config.worktree and worktrees/*/commondir; the same names
//     in submodule repositories under modules/ (at any depth, until
//     objects, refs or logs);
//   - a file named HEAD outside such a directory: git takes a directory
//     with HEAD, objects/ and refs/ for a bare repository and obeys the
//     config beside them, so the guest could make one anywhere;
//   - .gitmodules (the host's `git submodule update --init` fetches from
//     its URLs, local paths included);
//   - .envrc, .vscode/**, .idea/**, .devcontainer/**, .devcontainer.json.
//
// The rest of .git stays writable: objects, refs, HEAD, index, logs,
// packed-refs, FETCH_HEAD, so commit, branch, rebase and fetch work.
//
// A files rule with access rw opens a protected path only when its pattern
// spells the protected elements out (e.g. /work/.git/hooks/** for a hook,
// /**/.envrc for every .envrc); /work/** or /** never does. A deny rule
// still denies.

// protection is what protected found: the label for the log and the
// elements a rule must spell to open it.
type protection struct {
	what   string   // e.g. ".git/config", ".vscode/**"
	anchor []string // e.g. [".git", "config"], as spelled in the path
}

// ruleProtected names the built-in protection in decisions.
const ruleProtected = "builtin: files the host runs are read-only"

var (
	gitDirFiles   = []string{"config", "config.lock", "config.worktree", "config.worktree.lock", "commondir", "hooks", "info"}
	worktreeFiles = []string{"config.worktree", "commondir"}
	gitDataDirs   = []string{"objects", "refs", "logs"}
	hostRunNames  = []string{".envrc", ".gitmodules", ".devcontainer.json"}
	hostRunDirs   = []string{".vscode", ".idea", ".devcontainer"}
)

func foldIn(list []string, el string) bool {
	return slices.ContainsFunc(list, func(s string) bool { return strings.EqualFold(s, el) })
}

// protected reports whether clean guest path p (absolute, cleaned) is one
// of the files the host runs.
func protected(p string) (protection, bool) {
	if p == "/" || !mayProtect(p[1:]) {
		return protection{}, false
	}
	els := strings.Split(p[1:], "/")
	inGitDir := false
	for i, el := range els {
		switch {
		case foldIn(hostRunNames, el):
			return protection{what: strings.ToLower(el), anchor: []string{el}}, true
		case foldIn(hostRunDirs, el):
			return protection{what: strings.ToLower(el) + "/**", anchor: []string{el}}, true
		case strings.EqualFold(el, ".git") && i == len(els)-1:
			return protection{what: ".git", anchor: []string{el}}, true
		case hasSuffixFold(el, ".git"):
			inGitDir = true
			if i == len(els)-1 {
				break
			}
			if what, anchor, ok := gitDirProtected(els[i+1:]); ok {
				if !strings.EqualFold(el, ".git") {
					what = "*.git/" + what
				} else {
					what = ".git/" + what
				}
				return protection{what: what, anchor: append([]string{el}, anchor...)}, true
			}
		case el == "HEAD" && i == len(els)-1 && !inGitDir:
			return protection{what: "HEAD", anchor: []string{el}}, true
		}
	}
	return protection{}, false
}

// mayProtect is protected's quick test, without allocating (it runs on
// every write the file gateway decides): whether any element of s could
// start a protected path.
func mayProtect(s string) bool {
	for s != "" {
		var el string
		el, s, _ = strings.Cut(s, "/")
		if el == "HEAD" || hasSuffixFold(el, ".git") || foldIn(hostRunNames, el) || foldIn(hostRunDirs, el) {
			return true
		}
	}
	return false
}

func hasSuffixFold(s, suffix string) bool {
	return len(s) >= len(suffix) && strings.EqualFold(s[len(s)-len(suffix):], suffix)
}

// gitDirProtected decides a path inside a git directory (rest are the
// elements below it, at least one).
func gitDirProtected(rest []string) (what string, anchor []string, ok bool) {
	first := rest[0]
	switch {
	case foldIn(gitDirFiles, first):
		return gitLabel(first), []string{first}, true
	case strings.EqualFold(first, "worktrees"):
		if len(rest) >= 3 && foldIn(worktreeFiles, rest[2]) {
			return "worktrees/*/" + strings.ToLower(rest[2]), []string{first, rest[2]}, true
		}
	case strings.EqualFold(first, "modules"):
		// A submodule's name may hold slashes, so its repository is any
		// number of elements deep; the first element that is a git
		// directory's own file names the repository above it.
		for j := 2; j < len(rest); j++ {
			e := rest[j]
			switch {
			case foldIn(gitDataDirs, e):
				return "", nil, false
			case foldIn(gitDirFiles, e):
				return "modules/**/" + gitLabel(e), []string{first, e}, true
			case strings.EqualFold(e, "worktrees") && j+2 < len(rest) && foldIn(worktreeFiles, rest[j+2]):
				return "modules/**/worktrees/*/" + strings.ToLower(rest[j+2]), []string{first, e, rest[j+2]}, true
			}
		}
	}
	return "", nil, false
}

func gitLabel(el string) string {
	el = strings.ToLower(el)
	if el == "hooks" || el == "info" {
		return el + "/**"
	}
	return el
}

// opens reports whether rule elements segs spell out anchor: each anchor
// element appears as a literal element of the pattern, in order.
func opens(segs []string, anchor []string) bool {
	i := 0
	for _, s := range segs {
		if i < len(anchor) && s == anchor[i] {
			i++
		}
	}
	return i == len(anchor)
}

func (pr protection) refusal(clean string) Decision {
	return deny(ruleProtected+" ("+pr.what+")",
		clean+" is "+pr.describe()+", which the host runs or obeys; it is read-only to the guest unless a files rule that names it ("+
			"path: "+pr.example(clean)+", access: rw) opens it")
}

func (pr protection) describe() string {
	switch {
	case pr.what == ".git":
		return "a git repository's own directory entry"
	case pr.what == "HEAD":
		return "what makes a directory a bare git repository"
	case strings.HasSuffix(pr.what, "hooks/**"):
		return "a git hook"
	case strings.HasSuffix(pr.what, "info/**"):
		return "git's per-repository info (attributes select filters and diff drivers)"
	case strings.HasPrefix(pr.what, ".git/"), strings.HasPrefix(pr.what, "*.git/"):
		return "git configuration"
	case pr.what == ".envrc":
		return "a direnv script"
	case pr.what == ".gitmodules":
		return "the submodule list (URLs the host's git fetches)"
	}
	return "editor or dev-container configuration"
}

// example is a files rule path that opens the protected path clean: the
// path itself, with a protected directory's contents as /**.
func (pr protection) example(clean string) string {
	if strings.HasSuffix(pr.what, "/**") {
		// Cut after the anchor's last element.
		els := strings.Split(clean[1:], "/")
		last := pr.anchor[len(pr.anchor)-1]
		for i := len(els) - 1; i >= 0; i-- {
			if els[i] == last {
				return "/" + strings.Join(els[:i+1], "/") + "/**"
			}
		}
	}
	return clean
}

// Opening is a files rule that opens a protected path for writing.
type Opening struct {
	Rule FileRule
	What string // the protection it opens, e.g. ".git/hooks/**"
}

// Openings lists the rw files rules that open a file the host runs (see
// protected), for `smx profile check` to warn about.
func (p *Profile) Openings() []Opening {
	var out []Opening
	for _, r := range p.Files.Rules {
		if r.Access != ReadWrite {
			continue
		}
		segs := splitGlob(r.Path)
		seen := map[string]bool{}
		// Try the pattern as a path, each ** either gone or one element,
		// wildcards as a plain character.
		var stars []int
		for i, s := range segs {
			if s == "**" {
				stars = append(stars, i)
			}
		}
		for mask := 0; mask < 1<<len(stars); mask++ {
			var els []string
			k := 0
			for i, s := range segs {
				if k < len(stars) && stars[k] == i {
					if mask&(1<<k) != 0 {
						els = append(els, "x")
					}
					k++
					continue
				}
				els = append(els, strings.NewReplacer("*", "x", "?", "x").Replace(s))
			}
			pr, ok := protected("/" + strings.Join(els, "/"))
			if ok && opens(segs, pr.anchor) && !seen[pr.what] {
				seen[pr.what] = true
				out = append(out, Opening{Rule: r, What: pr.what})
			}
		}
	}
	return out
}
