package service

import (
	"context"
	"fmt"
	"slices"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/publish"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/supproto"
)

// PortRequest publishes or withdraws one port of a sandbox.
type PortRequest struct {
	Name string `json:"name"`
	// Port is in -p notation, [HOSTIP:]HOSTPORT:GUESTPORT[/tcp]; to
	// withdraw one, [HOSTIP:]HOSTPORT (the port bound) is enough.
	Port string `json:"port"`
	// PublishExternal allows a HOSTIP that is not a loopback address.
	PublishExternal bool `json:"publish_external,omitempty"`
}

// PortList is a sandbox's published ports. Bound is the host port each is
// served on now; it is 0 for every port when the sandbox does not run
// (Running false): they are bound again at its next start.
type PortList struct {
	Name    string            `json:"name"`
	Running bool              `json:"running"`
	Ports   []publish.Binding `json:"ports"`
}

// AddPort publishes a port: on a running (or paused) sandbox its
// supervisor binds it at once, keeps it in the spec and records it; on
// one that does not run it goes into the spec for the next start. A host
// port already taken on the host is errdefs.ErrInUse.
func (s *Service) AddPort(ctx context.Context, req PortRequest) (*PortList, error) {
	p, err := publish.ParsePort(req.Port, req.PublishExternal)
	if err != nil {
		return nil, err
	}
	return s.changePort(ctx, req.Name, supproto.OpPortAdd, p)
}

// RemovePort withdraws a published port; connections through it are
// closed. A port not published is errdefs.ErrNotFound.
func (s *Service) RemovePort(ctx context.Context, req PortRequest) (*PortList, error) {
	sel, err := publish.ParseSelector(req.Port)
	if err != nil {
		return nil, err
	}
	return s.changePort(ctx, req.Name, supproto.OpPortRemove, sel)
}

func (s *Service) changePort(ctx context.Context, name, op string, p publish.Port) (*PortList, error) {
	in, t, err := s.check(name, sandbox.OpPort)
	if err != nil {
		return nil, err
	}
	if t.Supervisor {
		b, err := s.client(name).Ports(ctx, op, &p)
		if err != nil {
			return nil, err
		}
		return &PortList{Name: name, Running: true, Ports: nonNilPorts(b)}, nil
	}
	// Not running: the spec alone changes, under the lock that
	// serialises create, start and remove.
	m := s.manager()
	lock, err := m.LockAll()
	if err != nil {
		return nil, err
	}
	var changed publish.Port
	var ferr error
	err = sandbox.UpdateSpec(m.Paths(name), func(sp *sandbox.Spec) {
		i := slices.IndexFunc(sp.Ports, func(q publish.Port) bool {
			if op == supproto.OpPortAdd {
				return p.Same(q)
			}
			return publish.Selects(p, q, 0)
		})
		switch {
		case op == supproto.OpPortAdd && i >= 0:
			ferr = fmt.Errorf("sandbox %s already publishes host port %s: %w", name, p.Host(p.HostPort), errdefs.ErrExists)
		case op == supproto.OpPortAdd:
			sp.Ports = append(sp.Ports, p)
			changed = p
		case i < 0:
			ferr = fmt.Errorf("port %s is not published: `smx agent port ls %s` lists those that are: %w", p.Named(), name, errdefs.ErrNotFound)
		default:
			changed = sp.Ports[i]
			sp.Ports = slices.Delete(sp.Ports, i, i+1)
		}
	})
	lock.Unlock()
	if err == nil {
		err = ferr
	}
	if err != nil {
		return nil, err
	}
	kind := audit.KindPortPublish
	if op == supproto.OpPortRemove {
		kind = audit.KindPortUnpublish
	}
	s.logEvent(ctx, name, kind, map[string]any{
		"host": changed.Host(changed.HostPort), "guest_port": changed.GuestPort, "external": changed.External, "status": string(in.State.Status),
	})
	return s.Ports(ctx, name)
}

// Ports lists a sandbox's published ports: those its supervisor serves
// when it runs, otherwise those its next start binds.
func (s *Service) Ports(ctx context.Context, name string) (*PortList, error) {
	in, err := s.manager().Get(name)
	if err != nil {
		return nil, err
	}
	if t, err := sandbox.Check(in, sandbox.OpPort); err == nil && t.Supervisor {
		b, err := s.client(name).Ports(ctx, supproto.OpPortList, nil)
		if err != nil {
			return nil, err
		}
		return &PortList{Name: name, Running: true, Ports: nonNilPorts(b)}, nil
	}
	out := &PortList{Name: name, Ports: []publish.Binding{}}
	for _, p := range in.Spec.Ports {
		out.Ports = append(out.Ports, publish.Binding{Port: p})
	}
	return out, nil
}

func nonNilPorts(b []publish.Binding) []publish.Binding {
	if b == nil {
		return []publish.Binding{}
	}
	return b
}
