package gitgw

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/policy"
)

// push decides and forwards a receive-pack request.
func (s *session) push(w http.ResponseWriter, r *http.Request, p *policy.Profile, t target, auth string, cred policy.Credential, fields map[string]any) {
	ctx := r.Context()
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			gitError(w, r, t.service, false, "smx: bad gzip request body")
			return
		}
		body = zr
	}
	req, err := ParsePushRequest(body)
	if err != nil {
		fields["op"], fields["rule"], fields["reason"] = "push", RuleMalformed, err.Error()
		s.g.log(audit.KindGitRefused, fields)
		gitError(w, r, t.service, false, "smx: refused: "+err.Error())
		return
	}
	// Spooled beside the mirrors (the sandbox's directory) when there are
	// any, so a crash leaves nothing behind once the sandbox is removed.
	spoolDir := ""
	if m := s.g.cfg.Mirrors; m != nil && os.MkdirAll(m.Dir, 0o700) == nil {
		spoolDir = m.Dir
	}
	spool, err := os.CreateTemp(spoolDir, ".push-*.pack")
	if err != nil {
		gitError(w, r, t.service, false, "smx: gateway: "+err.Error())
		return
	}
	defer os.Remove(spool.Name())
	defer spool.Close()
	packBytes, err := io.Copy(spool, io.LimitReader(body, maxPack+1))
	if err != nil {
		gitError(w, r, t.service, false, "smx: reading the pack: "+err.Error())
		return
	}
	if packBytes > maxPack {
		fields["op"], fields["rule"], fields["reason"] = "push", RuleMalformed, "pack over 2 GiB"
		s.g.log(audit.KindGitRefused, fields)
		gitError(w, r, t.service, false, "smx: refused: the pushed pack is over 2 GiB")
		return
	}
	var quarantine *Quarantine
	defer func() {
		if quarantine != nil {
			quarantine.Close()
		}
	}()
	decisions := DecideAndAsk(ctx, p, t.repo, req, func(ctx context.Context) (Ancestry, error) {
		if s.g.cfg.Mirrors == nil {
			return nil, errors.New("the gateway keeps no mirror")
		}
		var pack io.Reader
		if packBytes > 0 {
			pack = io.NewSectionReader(spool, 0, packBytes)
		}
		q, err := s.g.cfg.Mirrors.Open(ctx, t.repo, s.fetcher(t, auth), pack)
		quarantine = q
		return q, err
	}, s.g.cfg.Ask)
	if quarantine != nil {
		quarantine.Close()
		quarantine = nil
	}

	sideband := req.Has("side-band-64k")
	status := 0
	var rep Report
	var upErr error
	allowed, refused := settle(req, decisions)
	if len(allowed) == 0 {
		rep.Unpack = "ok"
	} else {
		head := req.Encode(allowed)
		var upBody io.Reader = bytes.NewReader(head)
		size := int64(len(head))
		if hasUpdate(allowed) {
			upBody = io.MultiReader(bytes.NewReader(head), io.NewSectionReader(spool, 0, packBytes))
			size += packBytes
		}
		up, err := http.NewRequestWithContext(ctx, http.MethodPost, s.upstreamURL(t).String(), upBody)
		if err != nil {
			gitError(w, r, t.service, false, "smx: "+err.Error())
			return
		}
		up.ContentLength = size // known: the pack is spooled (some servers refuse chunked bodies)
		up.Host = r.Host
		up.Header.Set("Content-Type", "application/x-git-receive-pack-request")
		up.Header.Set("Accept", "application/x-git-receive-pack-result")
		if ua := r.Header.Get("User-Agent"); ua != "" {
			up.Header.Set("User-Agent", ua)
		}
		if gp := r.Header.Get("Git-Protocol"); gp != "" {
			up.Header.Set("Git-Protocol", gp)
		}
		if auth != "" {
			up.Header.Set("Authorization", auth)
		} else if a := r.Header.Get("Authorization"); a != "" {
			up.Header.Set("Authorization", a)
		}
		resp, err := s.rt.RoundTrip(up)
		if err != nil {
			upErr = err
		} else {
			defer resp.Body.Close()
			status = resp.StatusCode
			if resp.StatusCode != http.StatusOK {
				// Authentication and similar answers go back as they are.
				for k, v := range resp.Header {
					w.Header()[k] = v
				}
				w.WriteHeader(resp.StatusCode)
				io.Copy(w, resp.Body)
				fields["op"], fields["status"] = "push", status
				fields["refs"] = refFields(decisions, nil)
				s.g.log(audit.KindGitPush, fields)
				return
			}
		}
		w.Header().Set("Content-Type", "application/x-git-receive-pack-result")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		if upErr == nil {
			var data []byte
			if sideband {
				flusher, _ := w.(http.Flusher)
				data, upErr = Demux(resp.Body, func(b []byte) {
					w.Write(Sideband(2, b))
					if flusher != nil {
						flusher.Flush()
					}
				})
			} else {
				data, upErr = io.ReadAll(io.LimitReader(resp.Body, 64<<20))
			}
			if upErr == nil {
				rep, upErr = ParseReport(bytes.NewReader(data))
			}
		}
	}
	final, byRef := mergeReport(decisions, rep, upErr)
	if len(allowed) == 0 {
		w.Header().Set("Content-Type", "application/x-git-receive-pack-result")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
	}
	enc := final.Encode()
	if sideband {
		w.Write(append(Sideband(1, enc), Flush...))
	} else {
		w.Write(enc)
	}

	logPush(s.g.log, fields, t.repo, req, decisions, byRef, packBytes, status, cred.Name, refused)
}

func hasUpdate(cmds []Command) bool {
	for _, c := range cmds {
		if !c.IsDelete() {
			return true
		}
	}
	return false
}

func refFields(ds []RefDecision, upstream map[string]RefStatus) []map[string]any {
	out := make([]map[string]any, 0, len(ds))
	for _, d := range ds {
		m := map[string]any{"ref": d.Ref, "old": d.Old, "new": d.New, "access": d.Access, "rule": d.Rule}
		switch st, ok := upstream[d.Ref]; {
		case !d.Allow:
			m["result"], m["reason"] = "refused", d.Reason
		case ok && st.OK:
			m["result"] = "ok"
		case ok:
			m["result"], m["reason"] = "upstream refused", st.Reason
		default:
			m["result"] = "not reported"
		}
		if d.Forced {
			m["forced"] = true
		}
		if d.Checked {
			m["fast_forward_checked"] = true
		}
		out = append(out, m)
	}
	return out
}

// fetcher updates a mirror from the forge: host git fetches through a
// loopback relay that lives only for this fetch, answers only under a
// random path prefix and only for this repository's upload-pack, and
// forwards to the forge the way the guest's requests go (same transport,
// same credential).
func (s *session) fetcher(t target, auth string) Fetcher {
	return func(ctx context.Context, git, gitDir string) error {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		var key [16]byte
		rand.Read(key[:])
		prefix := "/" + hex.EncodeToString(key[:]) + "/" + t.path + "/"
		srv := &http.Server{ErrorLog: discardLog, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rest, ok := strings.CutPrefix(r.URL.Path, prefix)
			if !ok || !(rest == "info/refs" && r.URL.Query().Get("service") == "git-upload-pack" || rest == "git-upload-pack") {
				http.NotFound(w, r)
				return
			}
			rt := target{repo: t.repo, path: t.path, service: "git-upload-pack", advert: rest == "info/refs"}
			r.Host = s.host
			if s.base.Port() != "" {
				r.Host = s.base.Host
			}
			s.proxy(w, r, rt, auth)
		})}
		go srv.Serve(ln)
		defer srv.Close()
		var errb bytes.Buffer
		cmd := exec.CommandContext(ctx, git, "-c", "protocol.version=2", "fetch", "--quiet", "--no-tags", "--force", "--no-write-fetch-head",
			"http://"+ln.Addr().String()+prefix[:len(prefix)-1], "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")
		cmd.Env = append(gitEnv(), "GIT_DIR="+gitDir)
		cmd.Stderr = &errb
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("git fetch: %v: %s", err, lastLine(errb.String()))
		}
		return nil
	}
}
