package supervisor

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/publish"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/supproto"
)

// publishPorts binds the spec's published ports before anything else
// starts, so a host port already taken fails the start at once, with the
// line that says what to do, and leaves nothing to undo. Connections that
// arrive before the guest's network is up are closed (and recorded).
func (s *Supervisor) publishPorts() error {
	s.ports = publish.New(publish.Config{
		Dial:   s.dialGuest,
		Log:    s.audit,
		Logger: s.log,
	})
	s.defer_(s.ports.Close)
	for _, p := range s.spec.Ports {
		b, err := s.ports.Add(p)
		if err != nil {
			return err
		}
		s.log.Info("published", "port", b.String())
	}
	return nil
}

// dialGuest reaches the guest's port through the sandbox's gateway.
func (s *Supervisor) dialGuest(ctx context.Context, port uint16) (net.Conn, error) {
	st := s.netReady.Load()
	if st == nil {
		return nil, fmt.Errorf("the sandbox is still starting: %w", errdefs.ErrUnavailable)
	}
	return st.DialGuest(ctx, port)
}

// handlePort publishes, withdraws or lists ports on the running sandbox.
// A change is written to the spec (so later starts publish the same
// ports) and recorded.
func (s *Supervisor) handlePort(c io.Writer, req *supproto.Request) {
	if req.Op != supproto.OpPortList {
		if req.Port == nil {
			supproto.WriteError(c, fmt.Errorf("supervisor: %s without a port: %w", req.Op, errdefs.ErrInvalid))
			return
		}
		if err := s.changePort(req.Op, *req.Port); err != nil {
			supproto.WriteError(c, err)
			return
		}
	}
	supproto.WriteResult(c, supproto.Result{OK: true, Ports: s.ports.List()})
}

func (s *Supervisor) changePort(op string, p publish.Port) error {
	// opMu: a snapshot reads the spec's ports under it.
	s.opMu.Lock()
	defer s.opMu.Unlock()
	ports := slices.Clone(s.spec.Ports)
	var b publish.Binding
	var err error
	kind := audit.KindPortPublish
	if op == supproto.OpPortAdd {
		if b, err = s.ports.Add(p); err != nil {
			return err
		}
		ports = append(ports, p)
	} else {
		kind = audit.KindPortUnpublish
		if b, err = s.ports.Remove(p); err != nil {
			return err
		}
		if i := slices.Index(ports, b.Port); i >= 0 {
			ports = slices.Delete(ports, i, i+1)
		}
	}
	if err := s.writePorts(ports); err != nil {
		// Served but not kept: serve what the spec says.
		if op == supproto.OpPortAdd {
			s.ports.Remove(publish.Port{HostIP: b.HostIP, HostPort: b.Bound})
		} else {
			s.ports.Add(b.Port)
		}
		return err
	}
	s.spec.Ports = ports // the one field changed: readers of the others do not race
	s.audit(kind, map[string]any{"host": b.Host(b.Bound), "guest_port": b.GuestPort, "external": b.External})
	return nil
}

// writePorts changes the ports in spec.json and nothing else, under the
// lock the service holds for its own spec changes (a profile change
// writes the spec while this process runs; its copy of the rest may be
// stale).
func (s *Supervisor) writePorts(ports []publish.Port) error {
	lock, err := (&sandbox.Manager{State: s.opts.State}).LockAll()
	if err != nil {
		return err
	}
	defer lock.Unlock()
	return sandbox.UpdateSpec(s.paths, func(sp *sandbox.Spec) { sp.Ports = ports })
}

// portStrings are the spec's published ports in -p notation, for a
// snapshot's metadata.
func (s *Supervisor) portStrings() []string {
	var out []string
	for _, p := range s.spec.Ports {
		out = append(out, p.String())
	}
	return out
}
