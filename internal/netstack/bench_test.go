package netstack

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/testutil"
	"github.com/smx-dev/smx/internal/usage"
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

// BenchmarkBrokerUsage is the credential broker with usage accounting
// ("metered": every answer scanned for usage, the totals kept) against
// the same broker without it ("plain"), on two answers: a 4 MiB Anthropic
// stream of text deltas (MB/s) and a 2 KiB JSON message (requests).
// Compare the medians of -count runs: metered/plain is the cost.
func BenchmarkBrokerUsage(b *testing.B) {
	var stream bytes.Buffer
	stream.Write(fixtureB(b, "anthropic.sse")[:bytes.Index(fixtureB(b, "anthropic.sse"), []byte("event: content_block_start"))])
	delta := []byte(`event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"` +
		strings.Repeat("The model writes code and prose. ", 6) + `"}}` + "\n\n")
	for stream.Len() < 4<<20 {
		stream.Write(delta)
	}
	stream.WriteString("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":40000}}\n\n")
	small := fixtureB(b, "anthropic.json")
	small = append(small[:len(small)-1], bytes.Repeat([]byte(" "), 2048-len(small))...)
	srvBody := map[string][]byte{"/v1/messages": stream.Bytes(), "/v1/complete": small}
	for _, shape := range []struct{ name, path string }{{"stream4MiB", "/v1/messages"}, {"json2KiB", "/v1/complete"}} {
		for _, mode := range []string{"plain", "metered"} {
			b.Run(shape.name+"/"+mode, func(b *testing.B) {
				var meter *usage.Meter
				if mode == "metered" {
					meter, _ = usage.NewMeter(filepath.Join(b.TempDir(), "usage.json"), nil)
				}
				u := newUsageRigWith(b, meter, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					io.Copy(io.Discard, r.Body)
					w.Header().Set("Content-Type", "text/event-stream")
					w.Write(srvBody[r.URL.Path])
				}))
				cl := u.client(b, "free.model.test")
				body := srvBody[shape.path]
				b.SetBytes(int64(len(body)))
				cpu0 := processCPU()
				for b.Loop() {
					req, _ := http.NewRequest("POST", "https://free.model.test"+shape.path, strings.NewReader(`{"stream":true}`))
					resp, err := cl.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					if n, err := io.Copy(io.Discard, resp.Body); err != nil || n != int64(len(body)) {
						time.Sleep(500 * time.Millisecond)
						ev := u.eventsSnapshot()
						b.Fatalf("%d bytes, %v; last events %v", n, err, ev[max(0, len(ev)-4):])
					}
					resp.Body.Close()
				}
				b.StopTimer()
				// CPU time per request (the guest, the gateway and the
				// upstream all run in this process): on a shared, loaded
				// machine it varies far less than ns/op.
				b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
				if meter != nil && meter.Spent()["free"].Requests == 0 {
					b.Fatal("metered, yet nothing was counted")
				}
			})
		}
	}
}

func fixtureB(b testing.TB, name string) []byte { return fixture(b, name) }

// processCPU is the user and system CPU time this process has used.
func processCPU() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
