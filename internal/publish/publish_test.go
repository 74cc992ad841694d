package publish

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
)

func TestParsePort(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		external bool
		err      string
	}{
		{in: "8080:80", want: "127.0.0.1:8080:80/tcp"},
		{in: "8080:80/tcp", want: "127.0.0.1:8080:80/tcp"},
		{in: "0:80", want: "127.0.0.1:0:80/tcp"},
		{in: "127.0.0.2:8080:80", want: "127.0.0.2:8080:80/tcp"},
		{in: "[::1]:8080:80", want: "[::1]:8080:80/tcp"},
		{in: "0.0.0.0:8080:80", external: true, want: "0.0.0.0:8080:80/tcp"},
		{in: "192.0.2.1:8080:80", external: true, want: "192.0.2.1:8080:80/tcp"},
		// Anything but loopback must be asked for.
		{in: "0.0.0.0:8080:80", err: "reachable from other machines; add --publish-external"},
		{in: "[::]:8080:80", err: "reachable from other machines"},
		{in: "192.0.2.1:8080:80", err: "reachable from other machines"},
		{in: "80", err: "want [HOSTIP:]HOSTPORT:GUESTPORT"},
		{in: "8080:80/udp", err: "only tcp"},
		{in: "8080:0", err: "guest port"},
		{in: "70000:80", err: "host port"},
		{in: "localhost:8080:80", err: "not an IP address"},
		{in: "[fe80::1%eth0]:8080:80", err: "not an IP address"},
	} {
		p, err := ParsePort(tc.in, tc.external)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("ParsePort(%q) = %v, %v; want error %q", tc.in, p, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParsePort(%q): %v", tc.in, err)
			continue
		}
		if got := p.Host(p.HostPort) + ":" + strconv.Itoa(int(p.GuestPort)) + "/tcp"; got != tc.want {
			t.Errorf("ParsePort(%q) = %s, want %s", tc.in, got, tc.want)
		}
		if p.External != tc.external {
			t.Errorf("ParsePort(%q).External = %v", tc.in, p.External)
		}
	}
	if _, err := ParsePorts([]string{"8080:80", "127.0.0.1:8080:81"}, false); err == nil || !strings.Contains(err.Error(), "published twice") {
		t.Errorf("two ports on one host port: %v", err)
	}
	if _, err := ParsePorts([]string{"0:80", "0:81"}, false); err != nil {
		t.Errorf("two free ports: %v", err)
	}
}

// guest is a stand-in for the sandbox's gateway: a loopback echo server
// per "guest port".
type guest struct {
	mu    sync.Mutex
	addrs map[uint16]string
}

func (g *guest) dial(ctx context.Context, port uint16) (net.Conn, error) {
	g.mu.Lock()
	a, ok := g.addrs[port]
	g.mu.Unlock()
	if !ok {
		return nil, errors.New("connection refused")
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", a)
}

func echo(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

type records struct {
	mu   sync.Mutex
	list []map[string]any
}

func (r *records) log(kind string, f map[string]any) {
	if kind != audit.KindPortAccept {
		panic(kind)
	}
	r.mu.Lock()
	r.list = append(r.list, f)
	r.mu.Unlock()
}

func roundTrip(t *testing.T, addr, msg string) (string, error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	io.WriteString(c, msg)
	c.(*net.TCPConn).CloseWrite()
	b, err := io.ReadAll(c)
	return string(b), err
}

func TestServer(t *testing.T) {
	g := &guest{addrs: map[uint16]string{80: echo(t)}}
	var rec records
	s := New(Config{Dial: g.dial, Log: rec.log})
	defer s.Close()

	p, _ := ParsePort("0:80", false)
	b, err := s.Add(p)
	if err != nil {
		t.Fatal(err)
	}
	if b.Bound == 0 || b.HostPort != 0 {
		t.Fatalf("binding %+v: want a picked port", b)
	}
	addr := b.Host(b.Bound)
	if got, err := roundTrip(t, addr, "ping"); err != nil || got != "ping" {
		t.Fatalf("through the published port: %q, %v", got, err)
	}
	rec.mu.Lock()
	if len(rec.list) != 1 || rec.list[0]["host"] != addr || rec.list[0]["guest_port"] != uint16(80) || rec.list[0]["error"] != nil ||
		!strings.HasPrefix(rec.list[0]["peer"].(string), "127.0.0.1:") {
		t.Errorf("records %v", rec.list)
	}
	rec.mu.Unlock()

	// The same host port again, or one any other program holds: one
	// actionable line.
	again, _ := ParsePort(addr+":80", false)
	if _, err := s.Add(again); !errors.Is(err, errdefs.ErrInUse) || !strings.Contains(err.Error(), "port is already allocated") ||
		!strings.Contains(err.Error(), "-p 0:80 for a free one") {
		t.Errorf("a bound port again: %v", err)
	}

	// A guest port nothing listens on: the connection is accepted,
	// closed, and recorded with why.
	p81, _ := ParsePort("0:81", false)
	b81, err := s.Add(p81)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := roundTrip(t, b81.Host(b81.Bound), "x"); got != "" {
		t.Errorf("a dead guest port answered %q", got)
	}
	rec.mu.Lock()
	if n := len(rec.list); n != 2 || !strings.Contains(rec.list[1]["error"].(string), "nothing answered on the guest's port 81") {
		t.Errorf("records %v", rec.list)
	}
	rec.mu.Unlock()
	if l := s.List(); len(l) != 2 || l[0] != b || l[1] != b81 {
		t.Errorf("List = %v", l)
	}

	// Removed by its bound port: no longer served, and free again.
	if _, err := s.Remove(again); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(t, addr, "x"); err == nil {
		t.Error("a removed port still accepts")
	}
	if _, err := s.Remove(again); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("removing it twice: %v", err)
	}
	if l := s.List(); len(l) != 1 || l[0] != b81 {
		t.Errorf("List = %v", l)
	}

	// Not loopback and not External: refused here too.
	ext := Port{HostIP: DefaultPortIP, GuestPort: 80}
	ext.HostIP = ext.HostIP.Next().Prev() // still loopback
	if _, err := s.Add(ext); err != nil {
		t.Errorf("loopback: %v", err)
	}
	wild, _ := ParsePort("0.0.0.0:0:80", true)
	wild.External = false
	if _, err := s.Add(wild); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("0.0.0.0 without External: %v", err)
	}

	s.Close()
	if _, err := roundTrip(t, b81.Host(b81.Bound), "x"); err == nil {
		t.Error("a closed server still accepts")
	}
}

func TestSelects(t *testing.T) {
	pub := func(s string) Port { p, _ := ParsePort(s, true); return p }
	for _, tc := range []struct {
		sel   string
		port  Port
		bound uint16
		want  bool
	}{
		{"8080", pub("8080:80"), 8080, true},
		{"8080", pub("8080:80"), 0, true},
		{"8080:80", pub("8080:80"), 8080, true},
		{"8080:81", pub("8080:80"), 8080, false},
		{"127.0.0.1:8080", pub("8080:80"), 8080, true},
		{"0.0.0.0:8080", pub("8080:80"), 8080, false},
		{"0.0.0.0:8080", pub("0.0.0.0:8080:80"), 8080, true},
		{"41000", pub("0:80"), 41000, true},
		{"41000", pub("0:80"), 0, false},
		{"0:80", pub("0:80"), 41000, true},
		{"0:81", pub("0:80"), 41000, false},
		{"0:80", pub("8080:80"), 8080, false},
		{"8081", pub("8080:80"), 8080, false},
	} {
		sel, err := ParseSelector(tc.sel)
		if err != nil {
			t.Errorf("ParseSelector(%q): %v", tc.sel, err)
			continue
		}
		if got := Selects(sel, tc.port, tc.bound); got != tc.want {
			t.Errorf("Selects(%q, %v, %d) = %v", tc.sel, tc.port, tc.bound, got)
		}
	}
	for _, bad := range []string{"", "x", "0", "host:8080", "8080:x"} {
		if _, err := ParseSelector(bad); err == nil {
			t.Errorf("ParseSelector(%q) accepted", bad)
		}
	}
}

// TestServerMaxConns: a connection over the bound is closed at once and
// recorded; the port serves again once one ends.
func TestServerMaxConns(t *testing.T) {
	g := &guest{addrs: map[uint16]string{80: echo(t)}}
	var rec records
	s := New(Config{Dial: g.dial, Log: rec.log, MaxConns: 1})
	defer s.Close()
	p, _ := ParsePort("0:80", false)
	b, err := s.Add(p)
	if err != nil {
		t.Fatal(err)
	}
	addr := b.Host(b.Bound)
	held, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(held, "x") // echoed once carried
	buf := make([]byte, 1)
	if _, err := io.ReadFull(held, buf); err != nil {
		t.Fatal(err)
	}
	if got, _ := roundTrip(t, addr, "y"); got != "" {
		t.Errorf("a connection over the bound answered %q", got)
	}
	rec.mu.Lock()
	if n := len(rec.list); n != 2 || !strings.Contains(fmt.Sprint(rec.list[1]["error"]), "already carry 1 connections") {
		t.Errorf("records %v", rec.list)
	}
	rec.mu.Unlock()
	held.Close()
	for i := 0; ; i++ {
		if got, _ := roundTrip(t, addr, "z"); got == "z" {
			break
		}
		if i == 50 {
			t.Fatal("the port did not serve again after the held connection ended")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
