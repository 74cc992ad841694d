package service

import (
	"net/url"
	"strings"

	"github.com/smx-dev/smx/internal/policy"
)

// explainDetails is what follows from decision d on request r (raw as the
// caller wrote it) under profile p, one line each: which credential the
// gateway sends with it, how an allowed SSH connection logs in and what
// it may do, and whether the guest can reach the forge of an allowed Git
// request at all.
func explainDetails(p *policy.Profile, r policy.Request, raw string, d policy.Decision) []string {
	var out []string
	if c, ok := p.CredentialFor(r); ok && d.Allow {
		switch {
		case r.Kind == policy.KindGit:
			out = append(out, "credential "+c.Name+" (secret "+c.From+") is sent to "+c.Forge+" by the Git gateway")
		case r.Kind == policy.KindNet && c.HasMatchers():
			path := "/"
			if u, err := url.Parse(raw); err == nil && u.EscapedPath() != "" {
				path = u.EscapedPath()
			}
			if c.MatchRequest("GET", path, nil) {
				out = append(out, "credential "+c.Name+" (secret "+c.From+") is sent with GET "+path)
			} else {
				out = append(out, "credential "+c.Name+" is not sent with GET "+path+" (outside its methods, paths or headers)")
			}
		case r.Kind == policy.KindNet:
			out = append(out, "credential "+c.Name+" (secret "+c.From+") is sent with every request")
		}
	}
	if r.Kind == policy.KindSSH {
		out = append(out, explainSSH(p, r)...)
	}
	if r.Kind == policy.KindGit && d.Allow {
		forge, _, _ := strings.Cut(r.Repo, "/")
		if nd := p.Decide(policy.Request{Kind: policy.KindNet, Proto: "tcp", Host: forge, Port: 443}); !nd.Allow {
			out = append(out, "but the guest cannot reach "+forge+": the network rules refuse HTTPS to it ("+nd.Reason+"); git rules open no network path")
		}
	}
	return out
}

// explainSSH is what an allowed SSH connection may do and how the gateway
// logs in; nothing for a refused one.
func explainSSH(p *policy.Profile, r policy.Request) []string {
	d, rule := p.DecideSSH(r)
	if !d.Allow {
		return nil
	}
	sftp := "denied"
	if rule.SFTP == policy.Allow {
		sftp = "allowed"
	}
	fwd := "none"
	if len(rule.Forward) > 0 {
		fwd = strings.Join(rule.Forward, ", ")
	}
	env := policy.DefaultSSHEnv
	if rule.Env != nil {
		env = rule.Env
	}
	login := "certificate from the smx SSH user CA, valid " + p.SSH.CertTTL.String() + ", principal " + r.User
	if c, ok := p.CredentialFor(r); ok {
		login = "host-held key: credential " + c.Name + " (secret " + c.From + ")"
	}
	hostKey := "host user's known_hosts"
	if rule.HostKey != "" {
		hostKey = "pinned " + rule.HostKey
	}
	return []string{"login  " + login, "verify " + hostKey, "sftp   " + sftp + " (scp too)", "fwd    " + fwd, "env    " + strings.Join(env, " ")}
}
