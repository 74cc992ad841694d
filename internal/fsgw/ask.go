package fsgw

import (
	"context"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/policy"
)

// Files rules that say ask (access: ask, ask-write) hold the operation
// they answer until the host user answers (Config.Ask). What is asked:
//
//   - for write (both kinds): every change — open for writing, create,
//     mkdir, symlink, link, rename, unlink, setattr, xattr changes, write
//     locks, and a write through a descriptor opened before the rule said
//     ask;
//   - for read (access: ask): opening a regular file for reading and
//     reading through a descriptor not opened under an answer. Names,
//     attributes and directory listings stay visible without a question:
//     the guest kernel looks them up on every path it walks, and a question
//     per stat would leave the user nothing to answer sensibly.
//
// An answer covers the descriptor the operation opened (the writes through
// it), and the operations on the same path the guest kernel sends to
// finish the same call within onceWindow under the same profile (the 9P
// client opens a second descriptor for its page cache and truncates after
// an open with O_TRUNC), which is what makes an answer of once cover one
// call. A rename is one
// question naming both paths. A refusal — deny, timeout, too many questions — is EACCES with
// the usual refusal record; the approval's own records say who answered.

// Question is one operation Config.Ask puts to the host user.
type Question struct {
	Op     string // the gateway's operation: open, create, rename, ...
	Path   string // the path as the guest sees it
	Access string // ro or rw
	// What names it for the user: "write /work/src/app.go".
	What string
	// Decision is the profile's, which said ask (its Rule is the rule's
	// file:line label).
	Decision policy.Decision
}

// Answer is the host user's answer to a Question, or the refusal that
// stands for one (timeout, too many questions, the gateway closing).
type Answer struct {
	Allow bool
	// Rule is what the log names for an allowed operation; Reason says why
	// a refused one was refused.
	Rule, Reason string
}

// onceWindow is how long an answer also covers the same path and access
// (and the same wording): the operations the guest kernel sends to finish
// one call. It is what makes once usable; sandbox and always grant more
// anyway.
const onceWindow = 2 * time.Second

// onceGrants are the paths recently allowed by an answer.
type onceGrants struct {
	mu sync.Mutex
	m  map[string]onceGrant // guest path, or a question's wording → grant
}

type onceGrant struct {
	rw    bool
	until time.Time
	rule  string
	prof  *policy.Profile // the profile the answer was given under
}

// get finds a grant for p (or a wording) under profile prof: a profile
// change ends the window.
func (o *onceGrants) get(p, access string, prof *policy.Profile) (string, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	g, ok := o.m[p]
	if !ok || g.prof != prof || time.Now().After(g.until) || access == "rw" && !g.rw {
		return "", false
	}
	return g.rule, true
}

func (o *onceGrants) add(p, access, rule string, prof *policy.Profile) {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[string]onceGrant{}
	}
	for k, g := range o.m {
		if now.After(g.until) {
			delete(o.m, k)
		}
	}
	o.m[p] = onceGrant{rw: access == "rw", until: now.Add(onceWindow), rule: rule, prof: prof}
}

// contentOp reports whether op, with read access, reads a file's content
// (asked under access: ask) rather than names or attributes (not asked).
func contentOp(op string) bool {
	return op == "open" || op == "read"
}

// verb names an operation for the question.
func verb(op, access string) string {
	switch op {
	case "open":
		if access == "rw" {
			return "write"
		}
		return "read"
	case "unlink":
		return "remove"
	case "setattr", "chmod", "truncate":
		return "change"
	}
	return op
}

// ask settles a decision that says ask for guest path p: a read of names
// or attributes passes, a grant the descriptor f (nil: none) or a recent
// once answer holds passes, anything else is put to the host user. It
// returns the decision to apply.
func (g *Gateway) ask(prof *policy.Profile, op, p, access, what string, d policy.Decision, f *file) policy.Decision {
	if access == "ro" && (!contentOp(op) || op == "open" && f != nil && g.isDir(f.rel())) {
		// A directory opened to list it: listing is not asked. (Should
		// the name turn into a file before the open, each read through
		// the descriptor is still asked.)
		return policy.Decision{Allow: true, Rule: d.Rule, Reason: "names and attributes are visible under a rule that asks before a read"}
	}
	if f != nil && f.granted != "" && (access == "ro" || f.write) {
		return policy.Decision{Allow: true, Rule: f.granted, Reason: "the host user allowed the open this descriptor came from"}
	}
	if rule, ok := g.grants.get(p, access, prof); ok {
		return policy.Decision{Allow: true, Rule: rule, Reason: "the host user allowed this path just before (once)"}
	}
	if what == "" {
		what = verb(op, access) + " " + p
	} else if rule, ok := g.grants.get(what, "rw", prof); ok {
		// The other path of an operation on two (rename) the host user
		// was just asked about, by the same question.
		return policy.Decision{Allow: true, Rule: rule, Reason: "the host user allowed " + what}
	}
	if g.cfg.Ask == nil {
		return policy.Decision{Rule: d.Rule, Reason: d.Reason + "; this mount cannot hold an operation for a question (" + g.noAsk() + "), so it is refused without asking"}
	}
	a := g.cfg.Ask(g.askContext(), Question{Op: op, Path: p, Access: access, What: what, Decision: d})
	if !a.Allow {
		return policy.Decision{Rule: d.Rule, Reason: a.Reason}
	}
	// The same path and wording for onceWindow, whatever the scope: the
	// guest kernel's follow-ups of this call, and the other name of a
	// rename, which another rule may ask about.
	g.grants.add(p, access, a.Rule, prof)
	g.grants.add(what, "rw", a.Rule, prof)
	if f != nil && (op == "open" || op == "create") {
		f.granted = a.Rule
	}
	return policy.Decision{Allow: true, Rule: a.Rule, Reason: "the host user allowed " + what}
}

// noAsk says why a mount has no Config.Ask.
func (g *Gateway) noAsk() string {
	if g.cfg.NoAsk != "" {
		return g.cfg.NoAsk
	}
	return "no one to ask"
}

// isDir reports whether rel is a directory (not following a symlink).
func (g *Gateway) isDir(rel string) bool {
	st, err := g.lstat(rel)
	return err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR
}

// askContext is what a question waits under: the latest 9P session's
// context (it ends with the session), or the gateway's (it ends at Close)
// for callers without one (virtio-fs).
func (g *Gateway) askContext() context.Context {
	g.sessMu.Lock()
	defer g.sessMu.Unlock()
	if g.sessCtx != nil && g.sessCtx.Err() == nil {
		return g.sessCtx
	}
	return g.ctx
}
