package supervisor

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/smx-dev/smx/internal/approval"
	"github.com/smx-dev/smx/internal/fsgw"
	"github.com/smx-dev/smx/internal/gitgw"
	"github.com/smx-dev/smx/internal/netstack"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/supproto"
)

// The supervisor keeps its sandbox's questions (internal/approval): the
// gateways that hold requests run in this process, so the held request,
// the question and the grants for the sandbox's life live beside them, and
// die with them. The host user's answer arrives over sup.sock (OpApprove),
// which the guest cannot reach; the service's broker lists and answers
// questions of every sandbox through it.

// askLimits are the current profile's ask.timeout and ask.max.
func (s *Supervisor) askLimits() (time.Duration, int) {
	s.profMu.Lock()
	p := s.profile
	s.profMu.Unlock()
	if p == nil {
		return policy.DefaultAskTimeout, policy.DefaultAskMax
	}
	return p.AskTimeout(), p.AskMax()
}

func (s *Supervisor) approvals() *approval.Holder {
	s.askOnce.Do(func() { s.asks = approval.New(s.spec.Name, s.audit, s.askLimits) })
	return s.asks
}

// netKey is what a grant for the sandbox's life covers: the protocol, the
// name (or, without one, the address) and the port.
func netKey(f netstack.Flow) (key string, byName bool) {
	if f.Host != "" {
		return "network " + f.Proto + " " + f.Host + " " + strconv.Itoa(int(f.Dst.Port())), true
	}
	return "network " + f.Proto + " " + f.Dst.Addr().String() + " " + strconv.Itoa(int(f.Dst.Port())), false
}

// grantedPolicy lets through what the host user allowed for the sandbox's
// life: a decision that says ask for a flow whose key was granted.
func (s *Supervisor) grantedPolicy(base netstack.PolicyFunc) netstack.PolicyFunc {
	h := s.approvals()
	return func(f netstack.Flow) policy.Decision {
		d := base(f)
		if !d.Ask || f.Proto == netstack.ProtoDNS {
			return d
		}
		key, byName := netKey(f)
		id, ok := h.Granted(key)
		if !ok {
			return d
		}
		what := "cidr " + f.Dst.Addr().String() + "/" + strconv.Itoa(f.Dst.Addr().BitLen())
		if byName {
			what = "domain " + f.Host
		}
		return policy.Decision{Allow: true, Rule: netstack.RuleApproved + id + " (sandbox) " + what + " port " + strconv.Itoa(int(f.Dst.Port())) +
			", asked by " + d.Rule, Reason: "the host user allowed it for this sandbox's life"}
	}
}

// askNet is the network stack's Config.Ask.
func (s *Supervisor) askNet(ctx context.Context, f netstack.Flow, d policy.Decision, what string) policy.Decision {
	key, byName := netKey(f)
	sug := &approval.Rule{Section: "network.allow"}
	if byName {
		sug.Fields = [][2]string{{"domain", f.Host}}
	} else {
		a := f.Dst.Addr()
		sug.Fields = [][2]string{{"cidr", netip.PrefixFrom(a, a.BitLen()).String()}}
	}
	sug.Fields = append(sug.Fields, [2]string{"ports", "[" + strconv.Itoa(int(f.Dst.Port())) + "]"})
	if f.Proto == netstack.ProtoUDP {
		sug.Fields = append(sug.Fields, [2]string{"proto", "udp"})
	}
	ans := s.approvals().Ask(ctx, approval.Question{Channel: "network", What: what, Rule: d.Rule, Key: key, Suggest: sug})
	if !ans.Allow {
		return policy.Decision{Rule: d.Rule, Reason: what + " was asked of the host user (approval " + ans.ID + "): " + ans.Reason}
	}
	return policy.Decision{Allow: true, Rule: netstack.RuleApproved + ans.ID + " (" + ans.Decision + ") " + strings.Join(sug.Fields[0][:], " ") +
		", asked by " + d.Rule, Reason: "the host user allowed " + what}
}

// askGit is the Git gateways' AskFunc: one question per ref update. A
// grant for the sandbox's life covers the same access to the same ref of
// the same repository; always writes a ref rule under the repository.
func (s *Supervisor) askGit(ctx context.Context, repo string, d gitgw.RefDecision, what string) (bool, string) {
	key := "git " + d.Access + " " + repo + " " + d.Ref
	field := map[string]string{"push": "push", "delete": "delete", "force-push": "force_push"}[d.Access]
	sug := &approval.Rule{Section: "git.repos", Repo: repo, Fields: [][2]string{{"ref", d.Ref}, {field, "allow"}}}
	ans := s.approvals().Ask(ctx, approval.Question{Channel: "git", What: what, Rule: d.Rule, Key: key, Suggest: sug})
	if !ans.Allow {
		return false, ans.Reason + " (approval " + ans.ID + ")"
	}
	return true, ""
}

// askSSH is the SSH gateway's Ask: one question per login. A grant for
// the sandbox's life covers the same user, host and port; always writes
// an ssh allow rule for them.
func (s *Supervisor) askSSH(ctx context.Context, req policy.Request, d policy.Decision, what string) (bool, string) {
	port := req.Port
	if port == 0 {
		port = 22
	}
	key := "ssh " + req.User + "@" + req.Host + ":" + strconv.Itoa(int(port))
	sug := &approval.Rule{Section: "ssh.allow", Fields: [][2]string{{"host", req.Host}, {"user", req.User}, {"ports", "[" + strconv.Itoa(int(port)) + "]"}}}
	ans := s.approvals().Ask(ctx, approval.Question{Channel: "ssh", What: what, Rule: d.Rule, Key: key, Suggest: sug})
	if !ans.Allow {
		return false, ans.Reason + " (approval " + ans.ID + ")"
	}
	return true, ""
}

// askFile is the file gateways' Ask: one question per file operation. A
// grant for the sandbox's life covers the same access under the same
// files rule; always writes a rule for the very path (rw for a change,
// ask-write for a read under access: ask, so that a change is still
// asked), more specific than the rule that asked. hold, when not nil, is
// called before the question waits (see virtiofs.Server.Hold).
func (s *Supervisor) askFile(ctx context.Context, q fsgw.Question, hold func()) fsgw.Answer {
	rule := q.Decision.Rule
	key := "file " + q.Access + " " + strings.TrimPrefix(rule, approval.SourceOf(rule)+" ")
	if id, ok := s.approvals().Granted(key); ok {
		return fsgw.Answer{Allow: true, Rule: netstack.RuleApproved + id + " (sandbox) " + q.What + ", asked by " + rule}
	}
	if hold != nil {
		hold()
	}
	var sug *approval.Rule
	if !strings.ContainsAny(q.Path, "*?[]{}\\") {
		access := "rw"
		if q.Access == "ro" {
			access = string(policy.AskWrite)
		}
		sug = &approval.Rule{Section: "files.rules", Fields: [][2]string{{"path", q.Path}, {"access", access}}}
	}
	ans := s.approvals().Ask(ctx, approval.Question{Channel: "file", What: q.What, Rule: rule, Key: key, Suggest: sug, Narrow: true})
	if !ans.Allow {
		return fsgw.Answer{Reason: q.What + " was asked of the host user (approval " + ans.ID + "): " + ans.Reason}
	}
	return fsgw.Answer{Allow: true,
		Rule: netstack.RuleApproved + ans.ID + " (" + ans.Decision + ") " + q.What + ", asked by " + rule}
}

// askCred is the network broker's AskCredential: the first use of a
// binding that says ask. A grant for the sandbox's life covers the
// binding; always has no rule to write (the binding itself says ask).
func (s *Supervisor) askCred(ctx context.Context, f netstack.Flow, cred policy.Credential, what string) (bool, string) {
	rule := "credential " + cred.Name
	if cred.Pos.File != "" {
		rule = cred.Pos.String() + " credentials " + cred.Name + " ask"
	}
	ans := s.approvals().Ask(ctx, approval.Question{Channel: "credential", What: what, Rule: rule, Key: "credential " + cred.Name})
	if !ans.Allow {
		return false, ans.Reason + " (approval " + ans.ID + ")"
	}
	return true, ""
}

// askBudget is the network broker's AskBudget: a request past a budget
// that says ask. A grant for the sandbox's life lifts the budget (the
// broker keeps it so); always has no rule to write (raise the budget in
// the profile instead).
func (s *Supervisor) askBudget(ctx context.Context, f netstack.Flow, cred policy.Credential, what string) (bool, bool, string) {
	rule := "credential " + cred.Name + " budget"
	if cred.Pos.File != "" {
		rule = cred.Pos.String() + " credentials " + cred.Name + ".budget"
	}
	ans := s.approvals().Ask(ctx, approval.Question{Channel: "credential", What: what, Rule: rule, Key: "budget " + cred.Name})
	if !ans.Allow {
		return false, false, ans.Reason + " (approval " + ans.ID + ")"
	}
	return true, ans.Decision == approval.Sandbox || ans.Decision == approval.Always, ""
}

// handleApprovals answers OpApprovals and OpApprove.
func (s *Supervisor) handleApprovals(c io.Writer, req *supproto.Request) {
	h := s.approvals()
	if req.Op == supproto.OpApprovals {
		supproto.WriteResult(c, supproto.Result{OK: true, Approvals: h.List()})
		return
	}
	by := req.By
	if by == "" {
		by = "unknown"
	}
	a, err := h.Answer(req.ID, req.Decision, by, req.Extra)
	if err != nil {
		supproto.WriteError(c, err)
		return
	}
	supproto.WriteResult(c, supproto.Result{OK: true, Approval: &a})
}

// whyWaiting lists the questions waiting for the host user, for smx-why.
func (s *Supervisor) whyWaiting() string {
	list := s.approvals().List()
	if len(list) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d request(s) wait for the host user's answer (they continue or are refused when answered;\n"+
		"nothing in the sandbox can answer them):\n", len(list))
	for _, a := range list {
		fmt.Fprintf(&b, "  %s %s %s (asked by %s; refused at %s unless answered)\n", a.ID, a.Channel, a.What, a.Rule, a.Expires.Format(time.TimeOnly))
	}
	return b.String() + "\n"
}
