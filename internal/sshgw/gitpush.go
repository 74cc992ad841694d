package sshgw

import (
	"context"
	"io"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/crypto/ssh"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/gitgw"
	"github.com/smx-dev/smx/internal/policy"
)

// pushFilter is the Git gateway's push filter for an allowed
// git-receive-pack session: every ref update is decided by gitgw (the
// same code as a push over HTTPS), fast-forward on a host-side mirror
// the gateway updates over its own upstream connection. It returns nil
// and a reason when the repository path has no identity.
func (c *conn) pushFilter(gr GitRequest) (*gitgw.StreamPush, string) {
	repo, err := policy.NormalizeRepo(gr.Repo)
	if err != nil {
		return nil, err.Error()
	}
	fields := map[string]any{"transport": "ssh", "host": c.t.name(), "user": c.user}
	if v, ok := c.auth["credential"]; ok {
		fields["credential"] = v
	}
	return &gitgw.StreamPush{
		Profile: c.prof,
		Repo:    repo,
		Mirrors: c.g.cfg.GitMirrors,
		Fetch:   gitgw.StreamFetcher(c.uploadPack(gr.Path)),
		Log:     c.g.cfg.Log,
		Fields:  fields,
		Ask:     c.g.cfg.GitAsk,
	}, ""
}

// uploadPack opens git-upload-pack for path on the upstream connection,
// for the mirror's fetch.
func (c *conn) uploadPack(path string) func(ctx context.Context) (io.WriteCloser, io.Reader, func(), error) {
	return func(ctx context.Context) (io.WriteCloser, io.Reader, func(), error) {
		ch, reqs, err := c.up.OpenChannel("session", nil)
		if err != nil {
			return nil, nil, nil, err
		}
		go ssh.DiscardRequests(reqs)
		cmd := "git-upload-pack '" + strings.ReplaceAll(path, "'", `'\''`) + "'"
		ok, err := ch.SendRequest("exec", true, ssh.Marshal(struct{ Command string }{cmd}))
		if err == nil && !ok {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			ch.Close()
			return nil, nil, nil, err
		}
		go io.Copy(io.Discard, ch.Stderr())
		var once sync.Once
		return closeWriter{ch}, ch, func() { once.Do(func() { ch.Close() }) }, nil
	}
}

// fetchTap keeps the start of what the guest sends to an allowed
// git-upload-pack (its wants and haves) for the session's git.fetch
// record, the one the Git gateway writes for a clone over HTTPS.
type fetchTap struct {
	fields map[string]any
	head   []byte
}

const fetchTapMax = 1 << 20

func (c *conn) fetchTap(gr GitRequest, rule string) *fetchTap {
	repo, err := policy.NormalizeRepo(gr.Repo)
	if err != nil {
		repo = gr.Repo
	}
	f := map[string]any{"repo": repo, "service": "git-upload-pack", "rule": rule, "transport": "ssh", "host": c.t.name(), "user": c.user}
	if v, ok := c.auth["credential"]; ok {
		f["credential"] = v
	}
	return &fetchTap{fields: f}
}

// Write implements io.Writer for io.TeeReader; it never fails.
func (t *fetchTap) Write(p []byte) (int, error) {
	if room := fetchTapMax - len(t.head); room > 0 {
		t.head = append(t.head, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (t *fetchTap) record(c *conn, bytesIn int64) {
	if gitgw.FetchRecord(t.fields, t.head, bytesIn) {
		c.g.cfg.Log(audit.KindGitFetch, t.fields)
	}
}

// closeWriter closes a channel's write side only.
type closeWriter struct{ ch ssh.Channel }

func (w closeWriter) Write(p []byte) (int, error) { return w.ch.Write(p) }
func (w closeWriter) Close() error                { return w.ch.CloseWrite() }

type countReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

type countWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
}
