package netstack

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Resolver resolves names on the host. network is "ip4" or "ip6". A name
// that does not exist must be reported as a *net.DNSError with IsNotFound
// set (the guest then gets NXDOMAIN; any other error is SERVFAIL).
// *net.Resolver satisfies it. Implementations must be safe for concurrent
// use.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// HostsResolver answers from a hosts-format table ("ADDR NAME [ALIAS...]",
// "#" comments) and from nothing else: for tests and for users' test hosts.
type HostsResolver struct {
	m map[string][]netip.Addr // lower-case name without trailing dot
}

// NewHostsResolver reads a hosts file.
func NewHostsResolver(path string) (*HostsResolver, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("netstack: hosts: %w", err)
	}
	defer f.Close()
	return ParseHosts(f, path)
}

// ParseHosts reads a hosts table from r; name is used in errors.
func ParseHosts(r io.Reader, name string) (*HostsResolver, error) {
	h := &HostsResolver{m: map[string][]netip.Addr{}}
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		ip, err := netip.ParseAddr(fields[0])
		if err != nil || len(fields) < 2 {
			return nil, fmt.Errorf("netstack: hosts: %s:%d: want ADDR NAME [ALIAS...]", name, line)
		}
		for _, n := range fields[1:] {
			n = canonicalName(n)
			h.m[n] = append(h.m[n], ip.WithZone("").Unmap())
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("netstack: hosts: %s: %w", name, err)
	}
	return h, nil
}

// LookupNetIP implements Resolver.
func (h *HostsResolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, ip := range h.m[canonicalName(host)] {
		if network == "ip" || network == "ip4" && ip.Is4() || network == "ip6" && ip.Is6() {
			out = append(out, ip)
		}
	}
	if len(out) == 0 {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return out, nil
}

func canonicalName(n string) string { return strings.ToLower(strings.TrimSuffix(n, ".")) }

// HostsFileResolver is a HostsResolver over a file that it reads again
// whenever the file changes (size, modification time or inode), checked
// at each lookup: a test host or a user's entry added while a sandbox runs
// resolves at once. A file that cannot be read or parsed keeps the last
// good table; Err reports why.
type HostsFileResolver struct {
	path string
	mu   sync.Mutex
	h    *HostsResolver
	id   fileID
	err  error
}

type fileID struct {
	size, ino int64
	mtime     time.Time
}

// NewHostsFileResolver reads path once, so a bad file is reported at
// start.
func NewHostsFileResolver(path string) (*HostsFileResolver, error) {
	r := &HostsFileResolver{path: path}
	r.reload()
	if r.err != nil {
		return nil, r.err
	}
	return r, nil
}

func (r *HostsFileResolver) reload() {
	fi, err := os.Stat(r.path)
	if err != nil {
		r.err = fmt.Errorf("netstack: hosts: %w", err)
		return
	}
	id := fileID{size: fi.Size(), mtime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id.ino = int64(st.Ino)
	}
	if r.h != nil && id == r.id {
		return
	}
	h, err := NewHostsResolver(r.path)
	if err != nil {
		r.err = err
		return
	}
	r.h, r.id, r.err = h, id, nil
}

// Err returns why the last reload failed, if it did.
func (r *HostsFileResolver) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// LookupNetIP implements Resolver.
func (r *HostsFileResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	r.reload()
	h := r.h
	r.mu.Unlock()
	return h.LookupNetIP(ctx, network, host)
}
