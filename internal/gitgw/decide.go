package gitgw

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/smx-dev/smx/internal/policy"
)

// Ancestry answers fast-forward questions about the repository as the
// forge has it plus the objects of the push being decided. IsAncestor
// reports whether old is an ancestor of (or equal to) new; an error means
// it could not be established, and the update is refused.
type Ancestry interface {
	IsAncestor(ctx context.Context, old, new string) (bool, error)
}

// RefDecision is the verdict on one command of a push.
type RefDecision struct {
	Command
	Ref     string // the full ref name decided (the command's, validated)
	Access  string // "push", "delete" or "force-push": what the update needed
	Allow   bool
	Rule    string // the policy rule (or "smx: ..." for the gateway's own refusals)
	Reason  string // the line the client sees after "ng REF" when refused
	Forced  bool   // an update that is not a fast-forward
	Checked bool   // fast-forward was decided against the forge's history
	// Ask (never with Allow): a rule says ask; AskRefs puts it to the
	// host user, and until then it counts as refused.
	Ask bool
}

// AskFunc puts one ref update a rule says ask about to the host user and
// blocks until the answer; what reads e.g. "push refs/heads/main
// (fast-forward) to example.test/acme/app". It returns whether it is
// allowed and, when not, why.
type AskFunc func(ctx context.Context, repo string, d RefDecision, what string) (allow bool, reason string)

// AskRefs resolves the decisions that say ask, one question per ref,
// before anything reaches the forge; with atomic, one refusal (asked or
// not) then refuses every command. A nil ask refuses them.
func AskRefs(ctx context.Context, repo string, ds []RefDecision, atomic bool, ask AskFunc) {
	for i := range ds {
		d := &ds[i]
		if !d.Ask {
			continue
		}
		d.Ask = false
		if ask == nil {
			continue
		}
		if atomic && anyRefused(ds) {
			break
		}
		how := "new ref"
		switch {
		case d.IsDelete():
			how = "delete"
		case d.Forced:
			how = "not a fast-forward"
		case !d.IsCreate():
			how = "fast-forward"
		}
		verb := d.Access
		if verb == "force-push" {
			verb = "force push"
		}
		allow, reason := ask(ctx, repo, *d, verb+" "+d.Ref+" ("+how+") to "+repo)
		if allow {
			d.Allow, d.Reason = true, ""
		} else {
			d.Reason = "smx: " + d.Access + " of " + d.Ref + " was asked of the host user: " + reason
		}
	}
	if atomic {
		applyAtomic(ds)
	}
}

func anyRefused(ds []RefDecision) bool {
	for _, d := range ds {
		if !d.Allow && !d.Ask {
			return true
		}
	}
	return false
}

// DecidePush decides every command of a push to repo (a normalised
// identity, see policy.NormalizeRepo) under profile p. It is the one place
// git push rules are applied, whichever transport carried the push.
//
// Creates need push; deletes need delete; an update of an existing ref
// needs push, and force-push unless it is a fast-forward. Fast-forward is
// asked of anc (built lazily by ancestry, only when some update is allowed
// to push but not to force-push): never taken from the client. A tag that
// already exists is never "fast-forwarded": moving it needs force-push.
// Ref names are decided as sent, in full: a name that is not a valid full
// ref (HEAD, main, refs/heads/../x) is refused, never completed.
//
// With atomic (the client asked for an atomic push) one refusal refuses
// every command.
func DecidePush(ctx context.Context, p *policy.Profile, repo string, cmds []Command, atomic bool, ancestry func(context.Context) (Ancestry, error)) []RefDecision {
	out := make([]RefDecision, len(cmds))
	var (
		anc    Ancestry
		ancErr error
		built  bool
	)
	for i, c := range cmds {
		d := RefDecision{Command: c, Ref: c.Ref}
		decide := func(access string) policy.Decision {
			return p.Decide(policy.Request{Kind: policy.KindGit, Access: access, Repo: repo, Ref: c.Ref})
		}
		switch {
		case c.IsDelete():
			d.Access = "delete"
			pd := decide("delete")
			d.Allow, d.Ask, d.Rule, d.Reason = pd.Allow, pd.Ask, pd.Rule, refusal("delete of", c.Ref, pd, p.Name)
		case c.IsCreate():
			d.Access = "push"
			pd := decide("push")
			d.Allow, d.Ask, d.Rule, d.Reason = pd.Allow, pd.Ask, pd.Rule, refusal("push to", c.Ref, pd, p.Name)
		default:
			d.Access = "push"
			pd := decide("push")
			d.Allow, d.Ask, d.Rule, d.Reason = pd.Allow, pd.Ask, pd.Rule, refusal("push to", c.Ref, pd, p.Name)
			if !pd.Allow && !pd.Ask {
				break
			}
			fd := decide("force-push")
			if fd.Allow {
				if pd.Allow {
					d.Rule = fd.Rule
				}
				break // a forced update would be allowed too: no need to look
			}
			if strings.HasPrefix(c.Ref, "refs/tags/") {
				d.Access, d.Forced, d.Allow, d.Ask, d.Rule = "force-push", true, false, fd.Ask, fd.Rule
				d.Reason = refusal("moving existing tag", c.Ref, fd, p.Name)
				break
			}
			if !built {
				anc, ancErr = ancestry(ctx)
				built = true
			}
			ok, err := false, ancErr
			if err == nil {
				ok, err = anc.IsAncestor(ctx, c.Old, c.New)
			}
			d.Checked = err == nil
			switch {
			case err != nil:
				d.Allow, d.Ask, d.Rule = false, false, RuleNoAncestry
				d.Reason = "smx: cannot tell whether the update of " + c.Ref + " is a fast-forward (" + oneLine(err.Error()) + "); refused"
			case !ok:
				d.Access, d.Forced, d.Allow, d.Ask, d.Rule = "force-push", true, false, fd.Ask, fd.Rule
				d.Reason = refusal("force push (not a fast-forward of "+short(c.Old)+") to", c.Ref, fd, p.Name)
			}
		}
		if d.Allow {
			d.Reason = ""
		}
		out[i] = d
	}
	if atomic {
		applyAtomic(out)
	}
	return out
}

// applyAtomic refuses every command when one is refused (one that waits
// for an answer is not refused yet).
func applyAtomic(out []RefDecision) {
	refused := ""
	for _, d := range out {
		if !d.Allow && !d.Ask {
			refused = d.Ref
			break
		}
	}
	if refused == "" {
		return
	}
	for i := range out {
		if out[i].Allow || out[i].Ask {
			out[i].Allow, out[i].Ask, out[i].Rule = false, false, RuleAtomic
			out[i].Reason = "smx: atomic push refused because " + refused + " was refused"
		}
	}
}

// DecideRequest decides a whole push: its push options first (see
// policy.Profile.DecidePushOption), then its commands (DecidePush). An
// option the profile does not allow refuses every command, so nothing
// reaches the forge: an option can ask for more than a ref update (a merge
// request into a protected branch, CI variables).
func DecideRequest(ctx context.Context, p *policy.Profile, repo string, req *PushRequest, ancestry func(context.Context) (Ancestry, error)) []RefDecision {
	for _, o := range req.Options {
		od := p.DecidePushOption(repo, o)
		if od.Allow {
			continue
		}
		name, _, _ := strings.Cut(o, "=")
		out := make([]RefDecision, len(req.Commands))
		for i, c := range req.Commands {
			out[i] = RefDecision{Command: c, Ref: c.Ref, Access: "push-option", Rule: od.Rule,
				Reason: refusal("push option", strconv.Quote(truncate(name, 64)), od, p.Name)}
		}
		return out
	}
	return DecidePush(ctx, p, repo, req.Commands, req.Has("atomic"), ancestry)
}

// DecideAndAsk is DecideRequest followed by AskRefs: the one sequence both
// transports run before anything reaches the forge.
func DecideAndAsk(ctx context.Context, p *policy.Profile, repo string, req *PushRequest, ancestry func(context.Context) (Ancestry, error), ask AskFunc) []RefDecision {
	ds := DecideRequest(ctx, p, repo, req, ancestry)
	AskRefs(ctx, repo, ds, req.Has("atomic"), ask)
	return ds
}

// The gateway's own refusals (Rule values that are not profile rules).
const (
	RuleNoAncestry = "gitgw: fast-forward unknown"
	RuleAtomic     = "gitgw: atomic push"
	RuleMalformed  = "gitgw: malformed request"
	RuleNoReport   = "gitgw: no report-status"
)

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// refusal is the one line a Git client shows for a refused ref or repo,
// e.g. "smx: push to refs/heads/main denied by rule git.repos[0].refs[0]
// repo github.com/acme/* ref refs/heads/main (profile dev, team.yaml:12:11)".
func refusal(what, subject string, d policy.Decision, profile string) string {
	if d.Allow {
		return ""
	}
	pos, rest, ok := strings.Cut(d.Rule, " ")
	if ok && strings.Count(pos, ":") >= 2 && !strings.HasSuffix(pos, ":") {
		// The file's base name: the agent needs the rule, not the host's paths
		// (the log keeps the whole label).
		return "smx: " + what + " " + subject + " denied by rule " + rest + " (profile " + profile + ", " + filepath.Base(pos) + ")"
	}
	return "smx: " + what + " " + subject + " denied: " + d.Reason + " (" + d.Rule + ", profile " + profile + ")"
}

// ReadRefusal is the ERR line a client gets for a repository it may not
// read.
func ReadRefusal(repo string, d policy.Decision, profile string) string {
	return refusal("reading", repo, d, profile)
}
