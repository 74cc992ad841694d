package netstack

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/smx-dev/smx/internal/testutil"
)

// tcpSink accepts connections and discards what it reads; with push set
// it writes zeros until the client closes.
func tcpSink(b testing.TB, push bool) string {
	return testutil.ServeTCP(b, func(c net.Conn) {
		defer c.Close()
		if push {
			buf := make([]byte, 64<<10)
			for {
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}
		io.Copy(io.Discard, c)
	}).Addr().String()
}

// BenchmarkUpload is bulk TCP guest → upstream through the stack and the
// socketpair; MB/s is the figure.
func BenchmarkUpload(b *testing.B) {
	r := newRig(b)
	r.route("tcp", "198.51.100.10:80", tcpSink(b, false))
	c, err := r.dialTCP(context.Background(), "198.51.100.10:80")
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 1<<20)
	b.SetBytes(int64(len(buf)))
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDownload is bulk TCP upstream → guest.
func BenchmarkDownload(b *testing.B) {
	r := newRig(b)
	r.route("tcp", "198.51.100.10:80", tcpSink(b, true))
	c, err := r.dialTCP(context.Background(), "198.51.100.10:80")
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 1<<20)
	b.SetBytes(int64(len(buf)))
	b.ResetTimer()
	for range b.N {
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkConnect is connection setup from the guest: SYN, policy, host
// dial, handshake; then close.
func BenchmarkConnect(b *testing.B) {
	r := newRig(b, func(c *Config) { c.MaxFlows = 100000 })
	r.route("tcp", "198.51.100.10:80", tcpSink(b, false))
	b.ResetTimer()
	for range b.N {
		c, err := r.dialTCP(context.Background(), "198.51.100.10:80")
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}

// BenchmarkIdleFlows reports the heap the gateway and the guest rig hold
// for 1000 idle TCP flows (both stacks' endpoints, the splice goroutines
// and host sockets), per flow.
func BenchmarkIdleFlows(b *testing.B) {
	const n = 1000
	for range b.N {
		b.StopTimer()
		r := newRig(b, func(c *Config) { c.MaxFlows = 2 * n })
		r.route("tcp", "198.51.100.10:80", tcpSink(b, false))
		runtime.GC()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		g0 := runtime.NumGoroutine()
		b.StartTimer()
		conns := make([]net.Conn, 0, n)
		for range n {
			c, err := r.dialTCP(context.Background(), "198.51.100.10:80")
			if err != nil {
				b.Fatal(err)
			}
			conns = append(conns, c)
		}
		b.StopTimer()
		time.Sleep(200 * time.Millisecond)
		runtime.GC()
		runtime.ReadMemStats(&m1)
		b.ReportMetric(float64(m1.HeapInuse-m0.HeapInuse)/n, "heapB/flow")
		b.ReportMetric(float64(runtime.NumGoroutine()-g0)/n, "goroutines/flow")
		if got := r.s.Stats().Flows; got != n {
			b.Fatalf("%d flows live, want %d", got, n)
		}
		for _, c := range conns {
			c.Close()
		}
		r.s.Close()
		b.StartTimer()
	}
}

// BenchmarkHostAddrCheck is the cost the host-address check adds to every
// new flow: one rtnetlink route lookup.
func BenchmarkHostAddrCheck(b *testing.B) {
	a := netip.MustParseAddr("203.0.113.77")
	for b.Loop() {
		if isHostAddr(a) {
			b.Fatal("203.0.113.77 is local")
		}
	}
}

// BenchmarkHTTPDownload fetches 32 MiB over plain HTTP through the
// gateway: "spliced" on a flow a cidr rule allows (bytes copied as they
// are), "proxied" on one a domain rule allows (every request decided and
// forwarded by the gateway's HTTP server, httpgw.go).
func BenchmarkHTTPDownload(b *testing.B) {
	const size = 32 << 20
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		buf := make([]byte, 256<<10)
		for n := 0; n < size; n += len(buf) {
			w.Write(buf)
		}
	}))
	b.Cleanup(srv.Close)
	for _, c := range []struct{ name, dst, host string }{
		{"spliced", "198.51.100.10:80", "198.51.100.10"},
		{"proxied", "203.0.113.5:80", "allowed.test"},
	} {
		b.Run(c.name, func(b *testing.B) {
			r, _ := inspectRig(b)
			r.route("tcp", c.dst, strings.TrimPrefix(srv.URL, "http://"))
			r.resolveB(b, "allowed.test")
			cl := &http.Client{Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return r.dialTCP(ctx, c.dst) },
			}}
			defer cl.CloseIdleConnections()
			b.SetBytes(size)
			for b.Loop() {
				resp, err := cl.Get("http://" + c.host + "/")
				if err != nil {
					b.Fatal(err)
				}
				if n, err := io.Copy(io.Discard, resp.Body); err != nil || n != size {
					b.Fatalf("%d bytes, %v", n, err)
				}
				resp.Body.Close()
			}
		})
	}
}

func (r *rig) resolveB(b *testing.B, name string) {
	b.Helper()
	if m, err := r.query(name, dns.TypeA, false); err != nil || m.Rcode != dns.RcodeSuccess {
		b.Fatalf("resolve %s: %v, %v", name, m, err)
	}
}
