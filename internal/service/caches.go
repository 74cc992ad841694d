package service

import (
	"context"
	"fmt"

	"github.com/smx-dev/smx/internal/cache"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/sandbox"
)

// Package caches (internal/cache): named folders in the state dir that
// sandboxes share, which `smx agent rm` leaves and `smx cache rm|prune`
// removes.

// CacheInfo is one cache as `smx cache ls` shows it: the sandboxes that
// use it by name.
type CacheInfo struct {
	cache.Info
	UsedBy []string `json:"used_by,omitempty"`
}

func (s *Service) caches() cache.Store { return cache.For(s.state) }

// parseCaches reads the profile's files.caches, then the flags', for the
// guest user owner (root when nil), makes the caches that do not exist
// yet, and checks their guest paths against the mounts.
func (s *Service) parseCaches(flags []string, owner *cacheOwner, prof *policy.Profile, mounts []sandbox.Mount) ([]cache.Use, error) {
	if owner == nil {
		owner = &cacheOwner{Home: "/root"}
	}
	var specs []string
	for _, c := range prof.Files.Caches {
		specs = append(specs, c.Spec)
	}
	specs = append(specs, flags...)
	var out []cache.Use
	seen := map[string]int{} // name -> index in out
	for _, v := range specs {
		u, err := cache.Parse(v, owner.Home)
		if err != nil {
			return nil, err
		}
		if i, ok := seen[u.Name]; ok {
			// The flag names again a cache the profile uses: the later
			// one says where and how.
			out = append(out[:i], out[i+1:]...)
			for n, j := range seen {
				if j > i {
					seen[n] = j - 1
				}
			}
		}
		u.UID, u.GID = owner.UID, owner.GID
		if u, err = s.caches().Ensure(u); err != nil {
			return nil, err
		}
		seen[u.Name] = len(out)
		out = append(out, u)
	}
	for i, u := range out {
		for _, prev := range out[:i] {
			if prev.Guest == u.Guest {
				return nil, fmt.Errorf("--volume-cache: caches %s and %s both use %s: %w", prev.Name, u.Name, u.Guest, errdefs.ErrInvalid)
			}
		}
		for _, m := range mounts {
			if m.Guest == u.Guest {
				return nil, fmt.Errorf("--volume-cache %s: -v %s mounts %s already: %w", u.Name, m, u.Guest, errdefs.ErrInvalid)
			}
		}
		for _, pm := range prof.Files.Mounts {
			if pm.Guest == u.Guest {
				return nil, fmt.Errorf("--volume-cache %s: the profile mounts %s at %s already (%s): %w", u.Name, pm.Host, pm.Guest, pm.Pos, errdefs.ErrInvalid)
			}
		}
	}
	return out, nil
}

// Caches lists the caches and the sandboxes using each.
func (s *Service) Caches(ctx context.Context) ([]CacheInfo, error) {
	list, err := s.caches().List()
	if err != nil {
		return nil, err
	}
	users, err := s.cacheUsers()
	if err != nil {
		return nil, err
	}
	out := make([]CacheInfo, 0, len(list))
	for _, in := range list {
		out = append(out, CacheInfo{Info: in, UsedBy: users[in.Name]})
	}
	return out, nil
}

// cacheUsers maps cache names to the sandboxes that use them.
func (s *Service) cacheUsers() (map[string][]string, error) {
	sbs, err := s.manager().List()
	if err != nil {
		return nil, err
	}
	users := map[string][]string{}
	for _, in := range sbs {
		for _, c := range in.Spec.Caches {
			users[c.Name] = append(users[c.Name], in.Spec.Name)
		}
	}
	return users, nil
}

// CacheRemoveRequest names caches to remove.
type CacheRemoveRequest struct {
	Names []string `json:"names"`
}

// RemoveCaches removes caches no sandbox uses (as docker volume rm, a
// cache in use is refused: remove the sandbox first).
func (s *Service) RemoveCaches(ctx context.Context, req CacheRemoveRequest) error {
	lock, err := s.manager().LockAll()
	if err != nil {
		return err
	}
	defer lock.Unlock()
	users, err := s.cacheUsers()
	if err != nil {
		return err
	}
	for _, n := range req.Names {
		if u := users[n]; len(u) > 0 {
			return fmt.Errorf("cache %s is used by sandbox %s: remove the sandbox first (smx agent rm %s): %w", n, u[0], u[0], errdefs.ErrInUse)
		}
		if err := s.caches().Remove(n); err != nil {
			return err
		}
	}
	return nil
}

// PruneCaches removes every cache no sandbox uses and returns their
// names.
func (s *Service) PruneCaches(ctx context.Context) ([]string, error) {
	lock, err := s.manager().LockAll()
	if err != nil {
		return nil, err
	}
	defer lock.Unlock()
	users, err := s.cacheUsers()
	if err != nil {
		return nil, err
	}
	list, err := s.caches().List()
	if err != nil {
		return nil, err
	}
	var gone []string
	for _, in := range list {
		if len(users[in.Name]) > 0 {
			continue
		}
		if err := s.caches().Remove(in.Name); err != nil {
			return gone, err
		}
		gone = append(gone, in.Name)
	}
	return gone, nil
}
