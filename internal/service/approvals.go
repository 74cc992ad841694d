package service

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/smx-dev/smx/internal/approval"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/statedir"
)

// The broker. Questions live in the supervisors (internal/approval: the
// gateways that hold requests run there, and there is no daemon); this is
// the one place the CLI, `smx serve` (API and console) and the MCP server
// list and answer them, over each supervisor's control socket. Nothing in a
// guest can reach that socket, so nothing in a guest can answer.
//
// Answering is a policy operation in the transition table (OpPolicy): a
// sandbox whose supervisor runs (running, paused, blocked) holds its
// questions; any other holds none.

// AnswerRequest answers one approval.
type AnswerRequest struct {
	ID       string `json:"id"`
	Sandbox  string `json:"sandbox,omitempty"` // "" searches every running sandbox
	Decision string `json:"decision"`          // deny, once, sandbox, always
	// By names who answers through which interface ("cli", "api",
	// "mcp", "console"); the service adds the host user.
	By string `json:"by"`
}

// ListApprovals returns the questions pending in sandbox (every running
// sandbox when ""), oldest first.
func (s *Service) ListApprovals(ctx context.Context, name string) ([]approval.Approval, error) {
	var names []string
	if name != "" {
		names = []string{name}
	} else {
		list, err := s.manager().List()
		if err != nil {
			return nil, err
		}
		for _, in := range list {
			names = append(names, in.Spec.Name)
		}
	}
	out := []approval.Approval{}
	for _, n := range names {
		_, t, err := s.check(n, sandbox.OpPolicy)
		if err != nil {
			if name != "" {
				return nil, err
			}
			continue
		}
		if !t.Supervisor {
			continue
		}
		as, err := s.client(n).Approvals(ctx)
		if err != nil {
			if name != "" {
				return nil, err
			}
			continue // it stopped meanwhile
		}
		out = append(out, as...)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	for i := range out {
		out[i].Key, out[i].Suggest = "", nil
	}
	return out, nil
}

// who is the host user, for the record of an answer.
func who(by string) string {
	u := os.Getenv("USER")
	if u == "" {
		u = fmt.Sprintf("uid %d", os.Getuid())
	}
	if by == "" {
		by = "cli"
	}
	return by + " (" + u + ")"
}

// AnswerApproval answers a held question. For always it first writes the
// rule into the sandbox's profile file (in a marked section, keeping the
// file's comments and order), checks the file still parses, and reloads
// the sandbox's profile; the request is released after.
func (s *Service) AnswerApproval(ctx context.Context, req AnswerRequest) (*approval.Approval, error) {
	switch req.Decision {
	case approval.Deny, approval.Once, approval.Sandbox, approval.Always:
	default:
		return nil, fmt.Errorf("decision %q: want deny, once, sandbox or always: %w", req.Decision, errdefs.ErrInvalid)
	}
	a, err := s.findApproval(ctx, req.ID, req.Sandbox)
	if err != nil {
		return nil, err
	}
	var extra map[string]any
	var written, file string
	if req.Decision == approval.Always {
		written, file, err = s.writeApproved(ctx, a)
		if err != nil {
			return nil, err
		}
		extra = map[string]any{"rule_written": written, "profile_file": file}
	}
	got, err := s.client(a.Sandbox).Approve(ctx, a.ID, req.Decision, who(req.By), extra)
	if err != nil {
		return nil, err
	}
	got.Key, got.Suggest = "", nil
	got.RuleWritten, got.ProfileFile = written, file
	return got, nil
}

func (s *Service) findApproval(ctx context.Context, id, name string) (approval.Approval, error) {
	if id == "" {
		return approval.Approval{}, fmt.Errorf("approval: no id given: %w", errdefs.ErrInvalid)
	}
	var names []string
	if name != "" {
		names = []string{name}
	} else {
		list, err := s.manager().List()
		if err != nil {
			return approval.Approval{}, err
		}
		for _, in := range list {
			names = append(names, in.Spec.Name)
		}
	}
	for _, n := range names {
		_, t, err := s.check(n, sandbox.OpPolicy)
		if err != nil || !t.Supervisor {
			continue
		}
		as, err := s.client(n).Approvals(ctx)
		if err != nil {
			continue
		}
		for _, a := range as {
			if a.ID == id {
				return a, nil
			}
		}
	}
	return approval.Approval{}, fmt.Errorf("approval %s is not pending (answered, timed out, or unknown): `smx approvals` lists those that are: %w", id, errdefs.ErrNotFound)
}

// sourceFile is the FILE of a "FILE:LINE:COL" rule source, or "".
func sourceFile(src string) string {
	for range 2 {
		i := strings.LastIndexByte(src, ':')
		if i < 0 {
			return ""
		}
		src = src[:i]
	}
	return src
}

// writeApproved adds a's suggested rule to the sandbox's profile file and
// reloads the sandbox's profile. It returns the rule as written and the
// file.
func (s *Service) writeApproved(ctx context.Context, a approval.Approval) (string, string, error) {
	if a.Suggest == nil {
		return "", "", fmt.Errorf("approval %s (%s) has no rule to write; answer once or sandbox: %w", a.ID, a.Channel, errdefs.ErrFailed)
	}
	in, err := s.manager().Get(a.Sandbox)
	if err != nil {
		return "", "", err
	}
	ref := in.Spec.Profile
	prof, err := s.ResolveProfile(ref)
	if err != nil {
		return "", "", err
	}
	file := prof.Source
	if gen := filepath.Join(s.state.Root, "presets") + string(filepath.Separator); strings.HasPrefix(file, gen) {
		// `agent run` writes the sandbox's profile from the preset, on top
		// of the user's profile, at every run: the rule goes into the file
		// that holds the rule that asked (the user's), which it extends.
		if src := sourceFile(a.Source); strings.HasPrefix(src, "/") && !strings.HasPrefix(src, gen) {
			file = src
		} else {
			return "", "", fmt.Errorf("sandbox %s runs a profile `smx agent run` rewrites at every run (%s), and the rule that asked is not in a file of yours; answer once or sandbox, or run the agent with --profile FILE: %w",
				a.Sandbox, file, errdefs.ErrFailed)
		}
	}
	if file == "" || file == "builtin" || !strings.HasPrefix(file, "/") {
		return "", "", fmt.Errorf("sandbox %s runs the built-in profile %s, which cannot be edited; answer once or sandbox, or give it a profile file (extends: %s) with `smx agent policy`: %w",
			a.Sandbox, prof.Name, prof.Name, errdefs.ErrFailed)
	}
	st, err := os.Stat(file)
	if err != nil {
		return "", "", fmt.Errorf("profile file %s: %w", file, err)
	}
	old, err := os.ReadFile(file)
	if err != nil {
		return "", "", fmt.Errorf("profile file %s: %w", file, err)
	}
	comment := fmt.Sprintf("approval %s, %s, sandbox %s: %s", a.ID, time.Now().UTC().Format(time.RFC3339), a.Sandbox, a.What)
	var data []byte
	var line string
	if a.Suggest.Repo != "" {
		data, line, err = policy.AddRefRule(old, a.Suggest.Repo, a.Suggest.Fields, comment)
	} else {
		data, line, err = policy.AddRule(old, a.Suggest.Section, a.Suggest.Fields, comment)
	}
	if err != nil {
		return "", "", err
	}
	if _, err := policy.Parse(file, data, func(r string) (*policy.Profile, error) { return s.ResolveProfile(r) }); err != nil {
		return "", "", fmt.Errorf("the rule would make %s invalid, so it was not written: %w", file, err)
	}
	if err := statedir.WriteFileAtomic(file, data, st.Mode().Perm()); err != nil {
		return "", "", err
	}
	if _, err := s.SetPolicy(ctx, PolicyRequest{Name: a.Sandbox, Profile: ref}); err != nil {
		// The rule is written; the sandbox goes on with its old profile.
		return line, file, fmt.Errorf("the rule was written to %s but sandbox %s did not reload it: %w", file, a.Sandbox, err)
	}
	return line, file, nil
}
