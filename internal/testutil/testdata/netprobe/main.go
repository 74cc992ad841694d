// Command netprobe runs inside a test guest (static, CGO_ENABLED=0) and
// drives the network harder or more precisely than busybox can under TCG:
//
//	netprobe conns N HOST:PORT HOLD     open N TCP connections at once, keep
//	                                    them HOLD, print ok= refused= timeout= other=
//	netprobe udpflood HOST:PORT DUR     send UDP as fast as possible for DUR,
//	                                    print sent= echoed=
//	netprobe udp HOST:PORT MSG [WAIT]   send MSG, print the echo (WAIT: 3 s)
//	netprobe get URL                    one GET (TLS unverified), print status and body
//	netprobe tls HOST:PORT SNI          a TLS handshake naming SNI (unverified); print "handshake ok"
//	netprobe vget URL HEADER VALUE      one GET verified against the system
//	                                    trust store, sending HEADER: VALUE
//	netprobe latency N URL              N sequential GETs, each on a new
//	                                    connection; print avg_us=
//	netprobe idle N HOST:PORT           open N connections, print "ready N",
//	                                    then hold them until killed
//	netprobe tlshold HOST:PORT SNI DUR  a TLS connection naming SNI (unverified)
//	                                    that sends a line every 100 ms and reads
//	                                    it back; print "ready", then "closed
//	                                    after N lines: ERR" or "held N lines"
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	// PID 1's children start with 1024 descriptors.
	lim := syscall.Rlimit{Cur: 65536, Max: 65536}
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	if len(os.Args) < 3 {
		fail("usage: netprobe conns|udpflood|get|latency|idle ...")
	}
	switch os.Args[1] {
	case "conns":
		conns(atoi(os.Args[2]), os.Args[3], dur(os.Args[4]))
	case "udpflood":
		udpflood(os.Args[2], dur(os.Args[3]))
	case "udp":
		wait := 3 * time.Second
		if len(os.Args) > 4 {
			wait = dur(os.Args[4])
		}
		udpOnce(os.Args[2], os.Args[3], wait)
	case "tls":
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", os.Args[2],
			&tls.Config{ServerName: os.Args[3], InsecureSkipVerify: true})
		if err != nil {
			fail(err.Error())
		}
		conn.Close()
		fmt.Println("handshake ok")
	case "vget":
		vget(os.Args[2], os.Args[3], os.Args[4])
	case "get":
		get(os.Args[2])
	case "latency":
		latency(atoi(os.Args[2]), os.Args[3])
	case "idle":
		idle(atoi(os.Args[2]), os.Args[3])
	case "tlshold":
		tlshold(os.Args[2], os.Args[3], dur(os.Args[4]))
	default:
		fail("unknown command " + os.Args[1])
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "netprobe:", msg)
	os.Exit(2)
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		fail(err.Error())
	}
	return n
}

func dur(s string) time.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		fail(err.Error())
	}
	return d
}

func conns(n int, addr string, hold time.Duration) {
	var ok, refused, timeout, other atomic.Int64
	var mu sync.Mutex
	var open []net.Conn
	var firstOther atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("tcp", addr, 30*time.Second)
			switch {
			case err == nil:
				ok.Add(1)
				mu.Lock()
				open = append(open, c)
				mu.Unlock()
			case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET):
				refused.Add(1)
			case isTimeout(err):
				timeout.Add(1)
			default:
				other.Add(1)
				firstOther.CompareAndSwap(nil, err.Error())
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	time.Sleep(hold)
	for _, c := range open {
		c.Close()
	}
	fmt.Printf("ok=%d refused=%d timeout=%d other=%d elapsed_ms=%d\n", ok.Load(), refused.Load(), timeout.Load(), other.Load(), elapsed.Milliseconds())
	if e := firstOther.Load(); e != nil {
		fmt.Println("first other error:", e)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func udpflood(addr string, d time.Duration) {
	c, err := net.Dial("udp", addr)
	if err != nil {
		fail(err.Error())
	}
	var echoed atomic.Int64
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, err := c.Read(buf); err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue // ICMP errors surface here
			}
			echoed.Add(1)
		}
	}()
	msg := make([]byte, 64)
	var sent, errs int64
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		for i := 0; i < 64; i++ {
			if _, err := c.Write(msg); err != nil {
				errs++
			} else {
				sent++
			}
		}
	}
	time.Sleep(time.Second) // late echoes
	c.Close()
	fmt.Printf("sent=%d echoed=%d errors=%d\n", sent, echoed.Load(), errs)
}

func udpOnce(addr, msg string, wait time.Duration) {
	c, err := net.Dial("udp", addr)
	if err != nil {
		fail(err.Error())
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(wait))
	if _, err := c.Write([]byte(msg)); err != nil {
		fail(err.Error())
	}
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	if err != nil {
		fail(err.Error())
	}
	fmt.Printf("%s\n", buf[:n])
}

var client = &http.Client{
	Timeout: 30 * time.Second,
	Transport: &http.Transport{
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true},
		Proxy:             nil,
	},
}

func get(url string) {
	resp, err := client.Get(url)
	if err != nil {
		fail(err.Error())
	}
	defer resp.Body.Close()
	fmt.Println(resp.Status)
	io.Copy(os.Stdout, resp.Body)
}

func latency(n int, url string) {
	var total time.Duration
	for i := 0; i < n; i++ {
		t := time.Now()
		resp, err := client.Get(url)
		if err != nil {
			fail(err.Error())
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		total += time.Since(t)
	}
	fmt.Printf("avg_us=%d\n", (total / time.Duration(n)).Microseconds())
}

func idle(n int, addr string) {
	var cs []net.Conn
	d := net.Dialer{Timeout: 30 * time.Second}
	for i := 0; i < n; i++ {
		c, err := d.DialContext(context.Background(), "tcp", addr)
		if err != nil {
			fail(fmt.Sprintf("connection %d: %v", i, err))
		}
		cs = append(cs, c)
	}
	fmt.Printf("ready %d\n", len(cs))
	time.Sleep(24 * time.Hour) // killed by the test
	runtime.KeepAlive(cs)
}

// vget verifies the server against the guest's own trust store
// (/etc/ssl/certs), which is how an agent's HTTPS client behaves.
func vget(url, header, value string) {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		fail(err.Error())
	}
	req.Header.Set(header, value)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		fail(err.Error())
	}
	defer resp.Body.Close()
	fmt.Println(resp.Status)
	io.Copy(os.Stdout, resp.Body)
}

func tlshold(addr, sni string, d time.Duration) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr,
		&tls.Config{ServerName: sni, InsecureSkipVerify: true})
	if err != nil {
		fail(err.Error())
	}
	defer conn.Close()
	fmt.Println("ready")
	buf := make([]byte, 64)
	n := 0
	for end := time.Now().Add(d); time.Now().Before(end); n++ {
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Write([]byte("line\n")); err != nil {
			fmt.Printf("closed after %d lines: %v\n", n, err)
			return
		}
		if _, err := io.ReadFull(conn, buf[:5]); err != nil {
			fmt.Printf("closed after %d lines: %v\n", n, err)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Printf("held %d lines\n", n)
}
