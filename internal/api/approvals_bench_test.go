package api_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	wire "github.com/smx-dev/smx/api"
	"github.com/smx-dev/smx/client"
	"github.com/smx-dev/smx/internal/api"
	"github.com/smx-dev/smx/internal/approval"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/supproto"
)

// approvalBackend answers the approval routes as ServiceBackend does for
// one running sandbox: over its control socket (sandbox.Client, the real
// supproto client), without the state-directory lookups.
type approvalBackend struct {
	api.Backend // nil: only the approval routes are served
	c           *sandbox.Client
}

func (b approvalBackend) Approvals(ctx context.Context, _ string) ([]wire.Approval, error) {
	l, err := b.c.Approvals(ctx)
	out := make([]wire.Approval, 0, len(l))
	for _, a := range l {
		out = append(out, wire.Approval{ID: a.ID, Sandbox: a.Sandbox, Channel: a.Channel, What: a.What, Rule: a.Rule, State: a.State})
	}
	return out, err
}

func (b approvalBackend) Answer(ctx context.Context, id, decision, by string) (*wire.Approval, error) {
	a, err := b.c.Approve(ctx, id, decision, by, nil)
	if err != nil {
		return nil, err
	}
	return &wire.Approval{ID: a.ID, State: a.State, Decision: a.Decision}, nil
}

// serveSup serves OpApprovals and OpApprove on a unix socket as the
// supervisor's handleApprovals does, for holder h.
func serveSup(b *testing.B, path string, h *approval.Holder) {
	l, err := net.Listen("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				req, err := supproto.ReadRequest(c)
				if err != nil {
					return
				}
				if req.Op == supproto.OpApprovals {
					supproto.WriteResult(c, supproto.Result{OK: true, Approvals: h.List()})
					return
				}
				a, err := h.Answer(req.ID, req.Decision, req.By, req.Extra)
				if err != nil {
					supproto.WriteError(c, err)
					return
				}
				supproto.WriteResult(c, supproto.Result{OK: true, Approval: &a})
			}()
		}
	}()
}

// BenchmarkApprovalOnce: the machinery's cost of holding a request and
// releasing it with an `allow once` given through the API (GET
// /v1/approvals, then POST /v1/approvals/{id}, each hop over the
// supervisor's control socket) beside its nearest peer, the policy
// deciding a plain allow. No person is in the loop: the answer is sent
// as soon as the question is published.
func BenchmarkApprovalOnce(b *testing.B) {
	p, err := policy.Parse("b.yaml", []byte("network:\n  mode: ask\n  allow:\n    - domain: packages.example.test\n      ports: [443]\n"), nil)
	if err != nil {
		b.Fatal(err)
	}
	allowReq := policy.Request{Kind: policy.KindNet, Host: "packages.example.test", Port: 443}
	askReq := policy.Request{Kind: policy.KindNet, Host: "other.example.test", Port: 443}

	b.Run("decide-allow", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if d := p.Decide(allowReq); !d.Allow {
				b.Fatal(d)
			}
		}
	})

	b.Run("ask-once-via-api", func(b *testing.B) {
		dir, err := os.MkdirTemp("", "smxb")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
		h := approval.New("bench", func(string, map[string]any) {}, func() (time.Duration, int) { return time.Minute, 16 })
		paths := sandbox.Paths{Dir: dir}
		serveSup(b, paths.Socket(), h)
		srv := &api.Server{Backend: approvalBackend{c: &sandbox.Client{Paths: paths}}}
		sock := filepath.Join(dir, "api.sock")
		l, err := net.Listen("unix", sock)
		if err != nil {
			b.Fatal(err)
		}
		hs := &http.Server{Handler: srv}
		go hs.Serve(l)
		b.Cleanup(func() { hs.Close() })
		cl := client.New(sock)
		ctx := context.Background()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			changed := h.Changed()
			res := make(chan approval.Answer, 1)
			go func() {
				d := p.Decide(askReq)
				if !d.Ask {
					res <- approval.Answer{Reason: "not ask"}
					return
				}
				res <- h.Ask(ctx, approval.Question{Channel: "network", What: "TLS to other.example.test:443", Rule: d.Rule})
			}()
			<-changed
			var id string
			for id == "" {
				l, err := cl.Approvals(ctx, "")
				if err != nil {
					b.Fatal(err)
				}
				if len(l) > 0 {
					id = l[0].ID
				}
			}
			if _, err := cl.Answer(ctx, id, wire.DecideOnce); err != nil {
				b.Fatal(err)
			}
			if a := <-res; !a.Allow {
				b.Fatal(errors.New(a.Reason))
			}
		}
	})
}
