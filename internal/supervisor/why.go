package supervisor

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/smx-dev/smx/internal/audit"
)

// WhyPort is the gateway port (10.0.2.2) where the guest reads its own
// sandbox's recent refusals: `smx-why` in the guest asks it. It rides the
// network link every sandbox has, served in-process like the file
// gateway's ports, so nothing listens on the host. The guest learns only
// what it was refused and by which rule, which is about its own actions.
const WhyPort = 5639

// whyMax is how many refusals the answer lists, newest last.
const whyMax = 30

// localService is the network stack's Config.Local: smx-why's port, then
// the file gateway's.
func (s *Supervisor) localService(port uint16) func(net.Conn) {
	if port == WhyPort {
		return s.serveWhy
	}
	return s.shareService(port)
}

// serveWhy answers one HTTP/1.x request with the recent refusals as text.
func (s *Supervisor) serveWhy(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	req, err := http.ReadRequest(bufio.NewReader(c))
	if err != nil {
		return
	}
	req.Body.Close()
	body := s.whyWaiting() + s.whyText()
	resp := &http.Response{StatusCode: http.StatusOK, ProtoMajor: 1, ProtoMinor: 0, Close: true,
		Header: http.Header{"Content-Type": {"text/plain; charset=utf-8"}}, ContentLength: int64(len(body)),
		Body: http.NoBody}
	w := bufio.NewWriter(c)
	resp.Write(w)
	w.WriteString(body)
	w.Flush()
}

// whyCache bounds what a guest can make the host do: the log is scanned at
// most once a second, however often smx-why is asked (a supervisor serves
// one sandbox, so one cache per process is one per sandbox).
var whyCache struct {
	sync.Mutex
	at   time.Time
	text string
}

func (s *Supervisor) whyText() string {
	whyCache.Lock()
	defer whyCache.Unlock()
	if time.Since(whyCache.at) < time.Second {
		return whyCache.text
	}
	whyCache.text, whyCache.at = s.scanWhy(), time.Now()
	return whyCache.text
}

func (s *Supervisor) scanWhy() string {
	var recs []audit.Record
	// Only this sandbox's own: an earlier sandbox of the same name wrote
	// to the same log, and its refusals are not this agent's to learn.
	err := audit.Scan(audit.Dir(s.opts.State.Logs(), s.opts.Name), audit.Filter{Refusals: true, Sandbox: s.self}, func(r audit.Record) error {
		recs = append(recs, r)
		if len(recs) > whyMax {
			recs = recs[1:]
		}
		return nil
	})
	if err != nil {
		return "smx-why: the sandbox's log could not be read: " + err.Error() + "\n"
	}
	if len(recs) == 0 {
		return "No refusals in this sandbox so far.\n"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "The %d most recent refusals in sandbox %s (newest last). Each is the sandbox's\n"+
		"policy, decided on the host: do not retry or work around it; tell the user what was\n"+
		"refused and which rule refused it, so they can change the profile if it is needed.\n\n", len(recs), s.opts.Name)
	for _, r := range recs {
		fmt.Fprintf(&b, "%s %s %s\n", r.Time.UTC().Format(time.TimeOnly), r.Kind, whatOf(r.Fields))
		if v, ok := r.Fields["rule"].(string); ok && v != "" {
			fmt.Fprintf(&b, "    rule: %s\n", v)
		}
		if v, ok := r.Fields["reason"].(string); ok && v != "" {
			fmt.Fprintf(&b, "    why:  %s\n", v)
		}
	}
	return b.String()
}

// whatOf names what a refusal was about from its record's fields.
func whatOf(f map[string]any) string {
	var parts []string
	for _, k := range []string{"host", "dst", "http_host", "method", "path", "op", "repo", "ref", "user", "command"} {
		if v, ok := f[k]; ok {
			if s := fmt.Sprint(v); s != "" {
				parts = append(parts, k+"="+s)
			}
		}
	}
	if len(parts) == 0 {
		keys := make([]string, 0, len(f))
		for k := range f {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s=%v", k, f[k]))
		}
	}
	return strings.Join(parts, " ")
}
