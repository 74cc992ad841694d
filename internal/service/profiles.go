package service

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/sandbox"
)

// ResolveProfile finds a profile by built-in name, by name in the state
// directory's profiles/ folder, or by file path.
func (s *Service) ResolveProfile(ref string) (*policy.Profile, error) {
	if _, ok := policy.Builtin(ref); ok {
		return policy.Resolve(ref)
	}
	if !strings.ContainsAny(ref, "/.") {
		p := filepath.Join(s.state.Profiles(), ref+".yaml")
		if _, err := os.Stat(p); err == nil {
			return policy.Load(p)
		}
	}
	return policy.Resolve(ref)
}

// ProfileInfo is one profile as ListProfiles reports it.
type ProfileInfo struct {
	Name   string `json:"name"`
	Source string `json:"source"` // "builtin" or the file
	Mode   string `json:"network_mode,omitempty"`
	Hash   string `json:"hash,omitempty"`
	Error  string `json:"error,omitempty"` // set for a file that does not load
}

// ListProfiles lists the built-in profiles, then those in the state
// directory's profiles/ folder; a file that does not load is listed with
// Error set.
func (s *Service) ListProfiles(ctx context.Context) ([]ProfileInfo, error) {
	var rows []ProfileInfo
	for _, n := range policy.BuiltinNames() {
		p, _ := policy.Builtin(n)
		rows = append(rows, ProfileInfo{Name: n, Source: "builtin", Mode: fmt.Sprint(p.Network.Mode), Hash: p.Hash})
	}
	files, _ := filepath.Glob(filepath.Join(s.state.Profiles(), "*.yaml"))
	sort.Strings(files)
	for _, f := range files {
		r := ProfileInfo{Name: strings.TrimSuffix(filepath.Base(f), ".yaml"), Source: f}
		if p, err := policy.Load(f); err != nil {
			r.Error = "invalid: run `smx profile check " + f + "`"
		} else {
			r.Mode, r.Hash = fmt.Sprint(p.Network.Mode), p.Hash
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// ProfileDoc is a profile as resolved (extends applied, defaults filled).
type ProfileDoc struct {
	Name   string `json:"name"`
	Source string `json:"source"`
	Hash   string `json:"hash"`
	YAML   string `json:"yaml"`
}

// ShowProfile resolves a profile and returns it as YAML.
func (s *Service) ShowProfile(ctx context.Context, ref string) (*ProfileDoc, error) {
	p, err := s.ResolveProfile(ref)
	if err != nil {
		return nil, err
	}
	b, err := p.YAML()
	if err != nil {
		return nil, err
	}
	return &ProfileDoc{Name: p.Name, Source: p.Source, Hash: p.Hash, YAML: string(b)}, nil
}

// frozenProfile loads the profile frozen into sandbox name.
func (s *Service) frozenProfile(name string) (*policy.Profile, error) {
	if err := sandbox.ValidName(name); err != nil {
		return nil, err
	}
	if _, err := s.manager().Get(name); err != nil {
		return nil, err
	}
	return policy.LoadFrozen(s.manager().Paths(name).Profile())
}

// SandboxProfile returns the profile frozen into a sandbox, the one its
// gateways enforce (not the file it came from, which may have changed).
func (s *Service) SandboxProfile(ctx context.Context, name string) (*ProfileDoc, error) {
	p, err := s.frozenProfile(name)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(s.manager().Paths(name).Profile())
	if err != nil {
		return nil, err
	}
	return &ProfileDoc{Name: p.Name, Source: p.Source, Hash: p.Hash, YAML: string(b)}, nil
}

// ProfileCheck is the outcome of checking one profile file.
type ProfileCheck struct {
	File string `json:"file"`
	OK   bool   `json:"ok"`
	Hash string `json:"hash,omitempty"`
	// Problems are file:line:col: message, one per problem.
	Problems []string `json:"problems,omitempty"`
	// Warnings are file:line:col: warning: message for what a valid
	// profile should not say: a file the host runs opened to the guest
	// (policy.Profile.Openings), a forge its network rules do not let the
	// guest reach (policy.Profile.UnreachableForges).
	Warnings []string `json:"warnings,omitempty"`
}

// CheckProfile validates a profile file, reporting every problem with its
// position.
func (s *Service) CheckProfile(ctx context.Context, file string) ProfileCheck {
	p, err := policy.Load(file)
	return checked(file, p, err)
}

// CheckProfileYAML validates a profile sent as text (the API's check),
// named file in its positions. It reads nothing: the profile may extend
// only built-in profiles, since the caller's files are not the server's
// to read.
func CheckProfileYAML(file string, yaml []byte) ProfileCheck {
	p, err := policy.Parse(file, yaml, nil)
	return checked(file, p, err)
}

// checked is the check of a profile as loaded: its problems when err is
// set, else its warnings, so the CLI and the API report the same lines.
func checked(file string, p *policy.Profile, err error) ProfileCheck {
	if err != nil {
		c := ProfileCheck{File: file}
		if verrs := policy.ValidationErrors(err); len(verrs) > 0 {
			for _, v := range verrs {
				c.Problems = append(c.Problems, v.Error())
			}
		} else {
			c.Problems = []string{err.Error()}
		}
		return c
	}
	c := ProfileCheck{File: file, OK: true, Hash: p.Hash}
	for _, o := range p.Openings() {
		c.Warnings = append(c.Warnings, fmt.Sprintf("%s: warning: %s: access rw on %s opens %s to the guest, which the host runs or obeys; only do this for a folder no host tool works in",
			o.Rule.Pos, o.Rule.Where, o.Rule.Path, o.What))
	}
	for _, u := range p.UnreachableForges() {
		c.Warnings = append(c.Warnings, strings.Replace(u.String(), ": ", ": warning: ", 1))
	}
	return c
}

// ExplainRequest asks whether a profile allows a request.
type ExplainRequest struct {
	Profile string `json:"profile"`
	// Sandbox, instead of Profile: the profile frozen into that sandbox
	// at create (or by its last policy change), the one its gateways
	// enforce, whose rules cite the file and line the user wrote.
	Sandbox string `json:"sandbox,omitempty"`
	// Request is https://host/path, tcp:H:P, udp:H:P, file:rw:/path,
	// git:push:forge/owner/repo:refs/heads/x or ssh:user@host:port.
	Request string `json:"request,omitempty"`
	// Git, instead of Request: ACCESS REPO [REF], ACCESS one of read
	// (clone, fetch), push, delete, force-push.
	Git []string `json:"git,omitempty"`
}

// Explanation is a profile's decision on one request.
type Explanation struct {
	Profile string `json:"profile"`
	Request string `json:"request"`
	Allow   bool   `json:"allow"`
	// Ask: the rule says ask; the gateway would hold the request and put
	// it to the host user (smx approvals).
	Ask    bool   `json:"ask,omitempty"`
	Rule   string `json:"rule"`
	Reason string `json:"reason"`
	// Details are what follows from the decision, one line each: the
	// credential the gateway sends with the request, how an SSH login is
	// made and what it may do, a forge the network rules do not reach.
	Details []string `json:"details,omitempty"`

	// The resolved profile and parsed request.
	Resolved *policy.Profile `json:"-"`
	Parsed   policy.Request  `json:"-"`
}

// ExplainProfile decides a request as the sandbox's gateways would, and
// says by which rule and why. It performs no I/O beyond loading the
// profile.
func (s *Service) ExplainProfile(ctx context.Context, req ExplainRequest) (*Explanation, error) {
	var p *policy.Profile
	var err error
	if req.Sandbox != "" {
		p, err = s.frozenProfile(req.Sandbox)
	} else {
		p, err = s.ResolveProfile(req.Profile)
	}
	if err != nil {
		return nil, err
	}
	var r policy.Request
	if len(req.Git) > 0 {
		r, err = gitRequest(req.Git)
	} else {
		r, err = policy.ParseRequest(req.Request)
	}
	if err != nil {
		return nil, err
	}
	d := p.Decide(r)
	return &Explanation{Profile: p.Name, Request: r.String(), Allow: d.Allow, Ask: d.Ask, Rule: d.Rule, Reason: d.Reason,
		Details: explainDetails(p, r, req.Request, d), Resolved: p, Parsed: r}, nil
}

// gitRequest reads `git ACCESS REPO [REF]` (after "git"): ACCESS is read
// (or clone, fetch), push, delete or force-push; REPO any spelling
// policy.NormalizeRepo accepts; REF a full ref name, for all but read.
func gitRequest(args []string) (policy.Request, error) {
	if len(args) < 2 || len(args) > 3 {
		return policy.Request{}, fmt.Errorf("git request: want ACCESS REPO [REF]: %w", errdefs.ErrInvalid)
	}
	access := args[0]
	switch access {
	case "clone", "fetch":
		access = "read"
	case "read", "push", "delete", "force-push":
	default:
		return policy.Request{}, fmt.Errorf("git access %q: want read, push, delete or force-push: %w", access, errdefs.ErrInvalid)
	}
	repo, err := policy.NormalizeRepo(args[1])
	if err != nil {
		return policy.Request{}, err
	}
	r := policy.Request{Kind: policy.KindGit, Access: access, Repo: repo}
	switch {
	case access == "read" && len(args) == 3:
		return policy.Request{}, fmt.Errorf("git read takes no ref: %w", errdefs.ErrInvalid)
	case access != "read" && len(args) != 3:
		return policy.Request{}, fmt.Errorf("git %s needs a ref, e.g. refs/heads/main: %w", access, errdefs.ErrInvalid)
	case access != "read":
		r.Ref = args[2]
		if !strings.HasPrefix(r.Ref, "refs/") {
			return policy.Request{}, fmt.Errorf("ref %q is not a full ref name; say refs/heads/%s (or refs/tags/%s): %w", r.Ref, r.Ref, r.Ref, errdefs.ErrInvalid)
		}
	}
	return r, nil
}
