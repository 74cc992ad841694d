package netstack

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/usage"
)

// Usage accounting on brokered requests. A request the credential goes
// with is first admitted by the meter: past the binding's budget it is
// answered here with the provider's own quota error (usage.WriteExhausted)
// and a net.refused record, and nothing goes upstream. An admitted
// request asks upstream for an unencoded answer, and the answer's body
// is read through a meteredBody: each chunk the proxy reads is scanned
// (usage.Scanner) before the proxy writes it to the guest, so a stream
// is not held back; when the body ends, its usage is added to the meter
// and recorded as cred.usage.
//
// What the guest sends cannot change the count: the Accept-Encoding it
// asks for is replaced, a streamed Chat Completions request is made to
// ask for usage at its end (OpenAI sends none otherwise), an answer encoded anyway with gzip or deflate is
// decoded on the way (the guest gets it plain), and the count lives in
// the meter, on the host, per credential, whatever connection, stream
// flag or endpoint the request used.

// budgetKey names a refusal for a spent budget in its rule, after the
// binding's position: FILE:LINE:COL credentials NAME.budget.
const budgetKey = "budget"

// admit decides a brokered request under the credential's budget. It
// reports whether the request may go on; if not, it has answered it.
// Past a budget that says ask, the request is held here (in the goroutine
// already serving it) until the host user answers: allowed, it goes on
// and is counted; allowed for the sandbox, the budget stops nothing more
// in this sandbox; denied or unanswered, it gets the quota error.
func (s *Stack) admit(w http.ResponseWriter, r *http.Request, f Flow, sni string, cred policy.Credential, meter *usage.Meter, prov usage.Provider, model bool) bool {
	budget := s.budget(f, cred)
	err := meter.Admit(cred.Name, budget, model)
	if err == nil {
		return true
	}
	reason := err.Error()
	if budget != nil && budget.Ask {
		if s.cfg.AskBudget == nil {
			reason += "; the budget says ask, and nobody can be asked"
		} else {
			what := r.Method + " https://" + sni + r.URL.Path + " with credential " + cred.Name + ", past its budget (" + err.Error() + ")"
			allow, lift, why := s.cfg.AskBudget(r.Context(), f, cred, what)
			if allow {
				if lift {
					s.lifted.Store(cred.Name, struct{}{})
				}
				meter.Admit(cred.Name, nil, model) // counted, as every request that goes
				return true
			}
			reason += "; going on was asked of the host user: " + why
		}
	}
	msg := "smx: " + reason + ", so smx did not send this request; raise budget in credentials " + cred.Name +
		" of the sandbox's profile (" + cred.Pos.String() + ") and apply it with `smx agent policy SANDBOX PROFILE`"
	s.emit(Event{Kind: audit.KindNetRefused, Flow: f, SNI: sni, HTTPHost: r.Host, Credential: cred.Name, Secret: cred.From,
		Method: r.Method, Path: r.URL.Path, Usage: &UsageReport{Provider: prov},
		Decision: policy.Decision{Rule: credRule(cred, budgetKey), Reason: reason}})
	usage.WriteExhausted(w, prov, msg)
	return false
}

// includeUsage makes a streamed Chat Completions request ask for usage
// at the end of its stream (usage.IncludeUsage). A body larger than
// usage.MaxRewrite, or encoded, goes as it is.
func includeUsage(r *http.Request) {
	if r.Body == nil || r.Header.Get("Content-Encoding") != "" {
		return
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, usage.MaxRewrite+1))
	if err != nil || len(b) > usage.MaxRewrite {
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(b), r.Body), r.Body}
		return
	}
	r.Body.Close()
	if nb, changed := usage.IncludeUsage(b); changed {
		b = nb
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	r.ContentLength = int64(len(b))
	r.Header.Set("Content-Length", strconv.Itoa(len(b)))
	r.Header.Del("Transfer-Encoding")
}

// budget is the credential's budget now: one raised by a profile change
// applies on connections already open, so the binding is looked up again.
// A budget the host user lifted for the sandbox is none.
func (s *Stack) budget(f Flow, cred policy.Credential) *policy.Budget {
	if _, ok := s.lifted.Load(cred.Name); ok {
		return nil
	}
	if cf := s.creds.Load(); cf != nil && *cf != nil {
		if c, ok := (*cf)(f); ok && c.Name == cred.Name {
			return c.Budget
		}
	}
	return cred.Budget
}

// meterUpgrade counts a WebSocket session's answers (OpenAI's Responses
// API over WebSocket): every usage object the server sends is another
// request's, reported to each. When each returns false (the budget is
// spent) the session ends after the bytes at hand: the client's next
// request is a new upgrade, or a POST, which admit refuses. The upgrade
// asked for no permessage-deflate (see the broker), so the frames are
// readable; a frame header falling inside a usage object makes it
// unreadable, which only a message fragmented there can do.
func meterUpgrade(resp *http.Response, each func(t usage.Tokens, model string) bool) {
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		return
	}
	mc := &meteredConn{ReadWriteCloser: rwc}
	mc.sc.Each = func(t usage.Tokens, model string) {
		if !each(t, model) {
			mc.stop = true
		}
	}
	resp.Body = mc
}

// meteredConn scans what the server sends on an upgraded connection.
type meteredConn struct {
	io.ReadWriteCloser
	sc   usage.Scanner
	stop bool // the budget is spent: end the session after this read
}

func (c *meteredConn) Read(p []byte) (int, error) {
	if c.stop {
		c.ReadWriteCloser.Close()
		return 0, io.EOF
	}
	n, err := c.ReadWriteCloser.Read(p)
	if n > 0 {
		c.sc.Write(p[:n])
	}
	return n, err
}

// meterResponse makes resp's body readable for usage (decoding gzip or
// deflate) and counts it as it is read. done is called once, when the
// body ends or is closed.
func meterResponse(resp *http.Response, done func(sc *usage.Scanner, unread string)) {
	unread := ""
	switch enc := strings.ToLower(strings.TrimSpace(resp.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip", "x-gzip", "deflate":
		var dec io.ReadCloser
		if enc == "deflate" {
			dec = flate.NewReader(resp.Body)
		} else {
			gz, err := gzip.NewReader(resp.Body)
			if err != nil {
				unread = "gzip: " + err.Error()
				break
			}
			dec = gz
		}
		resp.Body = &decodedBody{ReadCloser: dec, under: resp.Body}
		resp.Header.Del("Content-Encoding")
		resp.Header.Del("Content-Length")
		resp.ContentLength = -1
	default:
		unread = "Content-Encoding " + enc
	}
	resp.Body = &meteredBody{ReadCloser: resp.Body, done: done, unread: unread}
}

type decodedBody struct {
	io.ReadCloser
	under io.ReadCloser
}

func (b *decodedBody) Close() error {
	b.ReadCloser.Close()
	return b.under.Close()
}

// meteredBody scans what is read through it.
type meteredBody struct {
	io.ReadCloser
	sc     usage.Scanner
	unread string
	once   sync.Once
	done   func(*usage.Scanner, string)
}

func (b *meteredBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 && b.unread == "" {
		b.sc.Write(p[:n])
	}
	if err != nil {
		b.finish()
	}
	return n, err
}

func (b *meteredBody) Close() error {
	b.finish()
	return b.ReadCloser.Close()
}

func (b *meteredBody) finish() { b.once.Do(func() { b.done(&b.sc, b.unread) }) }
