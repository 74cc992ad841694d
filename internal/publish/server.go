// Package publish serves a sandbox's published ports (-p
// [HOSTIP:]HOSTPORT:GUESTPORT): the supervisor listens on the host port
// and carries each connection it accepts to the guest's port through the
// sandbox's own network gateway (netstack.Stack.DialGuest). The guest is
// never put on the host's network, and nothing but the published guest
// ports is reachable this way. Every accepted connection is an audit
// record (audit.KindPortAccept).
package publish

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
)

// Config wires a Server to its sandbox.
type Config struct {
	// Dial connects to the guest's TCP port through the sandbox's
	// gateway. It must honour ctx.
	Dial func(ctx context.Context, guestPort uint16) (net.Conn, error)
	// Log writes an audit record; it may block briefly (the log's fsync).
	Log func(kind string, fields map[string]any)
	// Logger gets what is not an audit record (a copy's error).
	Logger *slog.Logger
	// DialTimeout bounds the dial to the guest; 0 means 10 s.
	DialTimeout time.Duration
	// MaxConns bounds the connections carried at once over all ports;
	// 0 means 1024. One over the bound is closed and recorded.
	MaxConns int
}

// Server serves published ports until Close. Its methods are safe for
// concurrent use.
type Server struct {
	cfg    Config
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	ports  []*published
	closed bool
	slots  chan struct{}  // one per connection carried
	wg     sync.WaitGroup // accept loops and connections
}

// published is one bound port and the connections it carries.
type published struct {
	b     Binding
	ln    net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	gone  bool
}

// New returns a Server serving no port yet.
func New(cfg Config) *Server {
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = 1024
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &Server{cfg: cfg, slots: make(chan struct{}, cfg.MaxConns)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// Add binds p and serves it. A host address and port already bound on
// the host (by anything, this sandbox included) is errdefs.ErrInUse with
// a line that says what to do; a non-loopback HostIP without External is
// errdefs.ErrDenied, whatever the caller checked before.
func (s *Server) Add(p Port) (Binding, error) {
	if !p.HostIP.IsValid() || p.GuestPort == 0 {
		return Binding{}, fmt.Errorf("publish: port %v: %w", p, errdefs.ErrInvalid)
	}
	if !p.HostIP.IsLoopback() && !p.External {
		return Binding{}, fmt.Errorf("publish %s: %s is reachable from other machines and was not published with --publish-external: %w",
			p, p.HostIP, errdefs.ErrDenied)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Binding{}, fmt.Errorf("publish: the sandbox is stopping: %w", errdefs.ErrFailed)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(s.ctx, "tcp", p.Host(p.HostPort))
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return Binding{}, fmt.Errorf("bind for %s failed: port is already allocated; free it or publish another host port (-p %s, or -p 0:%d for a free one): %w",
				p.Host(p.HostPort), example(p), p.GuestPort, errdefs.ErrInUse)
		}
		if errors.Is(err, syscall.EADDRNOTAVAIL) {
			return Binding{}, fmt.Errorf("bind for %s failed: %s is not an address of this host: %w", p.Host(p.HostPort), p.HostIP, errdefs.ErrInvalid)
		}
		return Binding{}, fmt.Errorf("bind for %s failed: %w", p.Host(p.HostPort), err)
	}
	pub := &published{b: Binding{Port: p, Bound: uint16(ln.Addr().(*net.TCPAddr).Port)}, ln: ln, conns: map[net.Conn]struct{}{}}
	s.ports = append(s.ports, pub)
	s.wg.Add(1)
	go s.accept(pub)
	return pub.b, nil
}

// example is another host port to suggest for p.
func example(p Port) string {
	next := p.HostPort + 1
	if next == 0 {
		next = 8080
	}
	host := strconv.Itoa(int(next))
	if p.HostIP != DefaultPortIP {
		host = netip.AddrPortFrom(p.HostIP, next).String()
	}
	return host + ":" + strconv.Itoa(int(p.GuestPort))
}

// Remove stops serving the published port whose host address and port
// (bound or asked for) are p's; if p.GuestPort is set it must match too.
// Connections it carries are closed. A port not published is
// errdefs.ErrNotFound.
func (s *Server) Remove(p Port) (Binding, error) {
	s.mu.Lock()
	i := slices.IndexFunc(s.ports, func(q *published) bool { return q.matches(p) })
	if i < 0 {
		s.mu.Unlock()
		return Binding{}, fmt.Errorf("port %s is not published: `smx agent port ls` lists those that are: %w", p.Named(), errdefs.ErrNotFound)
	}
	pub := s.ports[i]
	s.ports = slices.Delete(s.ports, i, i+1)
	s.mu.Unlock()
	pub.close()
	return pub.b, nil
}

func (q *published) matches(sel Port) bool { return Selects(sel, q.b.Port, q.b.Bound) }

// List returns the ports served, in the order they were published.
func (s *Server) List() []Binding {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Binding, 0, len(s.ports))
	for _, p := range s.ports {
		out = append(out, p.b)
	}
	return out
}

// Close stops every port and connection and waits for them to end. It is
// idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	ports := s.ports
	s.ports, s.closed = nil, true
	s.mu.Unlock()
	s.cancel()
	for _, p := range ports {
		p.close()
	}
	s.wg.Wait()
	return nil
}

func (q *published) close() {
	q.mu.Lock()
	q.gone = true
	conns := q.conns
	q.conns = nil
	q.mu.Unlock()
	q.ln.Close()
	for c := range conns {
		c.Close()
	}
}

// track registers c with q, or reports false once q is closed.
func (q *published) track(c net.Conn) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.gone {
		return false
	}
	q.conns[c] = struct{}{}
	return true
}

func (q *published) untrack(c net.Conn) {
	q.mu.Lock()
	delete(q.conns, c)
	q.mu.Unlock()
}

func (s *Server) accept(pub *published) {
	defer s.wg.Done()
	for {
		c, err := pub.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of descriptors, or a connection reset before it was
			// accepted: the port keeps serving.
			s.cfg.Logger.Warn("publish: accept", "port", pub.b.String(), "err", err)
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		s.wg.Add(1)
		go s.serve(pub, c)
	}
}

// serve carries one accepted connection to the guest. The record is
// written once the guest answered or did not, so it says which.
func (s *Server) serve(pub *published, c net.Conn) {
	defer s.wg.Done()
	defer c.Close()
	if !pub.track(c) {
		return
	}
	defer pub.untrack(c)
	f := map[string]any{
		"peer": c.RemoteAddr().String(), "host": pub.b.Host(pub.b.Bound), "guest_port": pub.b.GuestPort,
	}
	var g net.Conn
	var err error
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.DialTimeout)
		g, err = s.cfg.Dial(ctx, pub.b.GuestPort)
		cancel()
		if err != nil {
			f["error"] = fmt.Sprintf("nothing answered on the guest's port %d (%v)", pub.b.GuestPort, err)
		}
	default:
		err = errors.New("too many connections")
		f["error"] = fmt.Sprintf("the sandbox's published ports already carry %d connections", s.cfg.MaxConns)
	}
	if s.cfg.Log != nil {
		s.cfg.Log(audit.KindPortAccept, f)
	}
	if err != nil {
		return
	}
	if !pub.track(g) {
		g.Close()
		return
	}
	defer pub.untrack(g)
	splice(c, g)
}

// splice copies both ways until both directions end; a half-close on one
// side is passed on to the other.
func splice(a, b net.Conn) {
	var wg sync.WaitGroup
	cp := func(dst, src net.Conn) {
		defer wg.Done()
		io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			dst.Close()
		}
	}
	wg.Add(2)
	go cp(a, b)
	go cp(b, a)
	wg.Wait()
	a.Close()
	b.Close()
}
