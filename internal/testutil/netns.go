package testutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// NetHost is a test upstream in its own network namespace, reached from the
// host over a veth pair: a real remote host as far as the sandbox gateway
// (which dials from the host) can tell, with no traffic leaving the
// machine. It has two subnets:
//
//   - Public (198.18.N.0/29, the benchmarking range): not private to the
//     policy, so domain rules and allow-all reach it. The namespace holds
//     PublicIPs[0..3] (.2 to .5), so several test names can map to
//     distinct addresses of the one host.
//   - Private (10.200.N.0/30): a private range, closed unless a cidr rule
//     names it. The namespace holds PrivateIP (.2).
//
// Servers listen on every address of the namespace: HTTP on 80, HTTPS on
// 443 (self-signed, any name), UDP echo on 7. Nothing listens on TCP 81.
type NetHost struct {
	NS        string
	N         int
	Public    netip.Prefix
	Private   netip.Prefix
	PublicIPs []netip.Addr
	PrivateIP netip.Addr

	hostIf string
}

// Ports of the servers in a NetHost.
const (
	NetHostHTTP    = 80
	NetHostHTTPS   = 443
	NetHostUDPEcho = 7
	NetHostClosed  = 81
)

// RequireNetNS needs root and iproute2's ip.
func RequireNetNS(t testing.TB) {
	t.Helper()
	_, err := exec.LookPath("ip")
	Require(t, os.Geteuid() == 0 && err == nil, "root and iproute2 (network namespaces)", "run as root; apt-get install iproute2")
}

// NewNetHost creates the namespace, the veth pair and the servers; all of
// it is removed when the test ends, whether it passed or not.
func NewNetHost(t testing.TB) *NetHost { t.Helper(); return newNetHost(t, true) }

// NewNetHostNoHTTPS is NewNetHost without the HTTPS server on 443, for a
// test that serves its own HTTPS there (a real API's port under its name).
func NewNetHostNoHTTPS(t testing.TB) *NetHost { t.Helper(); return newNetHost(t, false) }

func newNetHost(t testing.TB, https bool) *NetHost {
	t.Helper()
	RequireNetNS(t)
	var h *NetHost
	// The namespace name is the lock on N: another test binary running at
	// the same time picks another.
	for try := 0; ; try++ {
		n := 1 + mrand.IntN(250)
		ns := fmt.Sprintf("smxt-%d", n)
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			if try < 20 {
				continue
			}
			t.Fatalf("ip netns add %s: %v\n%s", ns, err, out)
		}
		h = &NetHost{NS: ns, N: n, hostIf: ns + "h"}
		break
	}
	t.Cleanup(h.remove)
	h.Public = netip.MustParsePrefix(fmt.Sprintf("198.18.%d.0/29", h.N))
	h.Private = netip.MustParsePrefix(fmt.Sprintf("10.200.%d.0/30", h.N))
	for i := 2; i <= 5; i++ {
		h.PublicIPs = append(h.PublicIPs, netip.MustParseAddr(fmt.Sprintf("198.18.%d.%d", h.N, i)))
	}
	h.PrivateIP = netip.MustParseAddr(fmt.Sprintf("10.200.%d.2", h.N))
	nsIf := h.NS + "n"
	cmds := [][]string{
		{"link", "add", h.hostIf, "type", "veth", "peer", "name", nsIf},
		{"link", "set", nsIf, "netns", h.NS},
		{"addr", "add", fmt.Sprintf("198.18.%d.1/29", h.N), "dev", h.hostIf},
		{"addr", "add", fmt.Sprintf("10.200.%d.1/30", h.N), "dev", h.hostIf},
		{"link", "set", h.hostIf, "up"},
		{"-n", h.NS, "link", "set", "lo", "up"},
		{"-n", h.NS, "link", "set", nsIf, "up"},
		{"-n", h.NS, "addr", "add", h.PrivateIP.String() + "/30", "dev", nsIf},
	}
	for _, ip := range h.PublicIPs {
		cmds = append(cmds, []string{"-n", h.NS, "addr", "add", ip.String() + "/29", "dev", nsIf})
	}
	cmds = append(cmds,
		[]string{"-n", h.NS, "route", "add", "default", "via", fmt.Sprintf("198.18.%d.1", h.N)})
	for _, c := range cmds {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(c, " "), err, out)
		}
	}
	h.serve(t, https)
	// Addresses are usable once DAD-free IPv4 is up; check the path.
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(h.PublicIPs[0], NetHostHTTP).String(), time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("netns %s: host cannot reach its HTTP server: %v", h.NS, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return h
}

func (h *NetHost) remove() {
	exec.Command("ip", "netns", "del", h.NS).Run()
	exec.Command("ip", "link", "del", h.hostIf).Run() // gone with the netns, unless a socket pins it
}

// In runs fn on an OS thread that has entered the namespace. Sockets fn
// opens stay in the namespace whatever thread later uses them.
func (h *NetHost) In(fn func() error) error { return inNetNS(h.NS, fn) }

func inNetNS(name string, fn func() error) error {
	h := struct{ NS string }{name}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer unix.Close(orig)
		ns, err := unix.Open("/run/netns/"+h.NS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer unix.Close(ns)
		if err := unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", h.NS, err)
			return
		}
		err = fn()
		// A thread that cannot go back stays locked, so it exits with
		// this goroutine instead of serving others in the wrong netns.
		if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// Listen opens a listener inside the namespace; it is closed when the
// test ends.
func (h *NetHost) Listen(t testing.TB, network, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := h.In(func() (err error) { ln, err = net.Listen(network, addr); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// ListenPacket is Listen for datagram sockets.
func (h *NetHost) ListenPacket(t testing.TB, network, addr string) net.PacketConn {
	t.Helper()
	var pc net.PacketConn
	if err := h.In(func() (err error) { pc, err = net.ListenPacket(network, addr); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc
}

// NetHostHandler serves "/" ("hello from netns\n"), "/bytes?n=N" (N zero
// bytes) and "/hold" (a line, then silence until the client goes away).
func NetHostHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello from netns")
	})
	mux.HandleFunc("/bytes", func(w http.ResponseWriter, r *http.Request) {
		var n int64
		fmt.Sscan(r.URL.Query().Get("n"), &n)
		ServeZeros(w, n)
	})
	return mux
}

// ServeZeros writes n zero bytes with a Content-Length.
func ServeZeros(w http.ResponseWriter, n int64) {
	w.Header().Set("Content-Length", fmt.Sprint(n))
	buf := make([]byte, 256<<10)
	for n > 0 {
		k := min(n, int64(len(buf)))
		if _, err := w.Write(buf[:k]); err != nil {
			return
		}
		n -= k
	}
}

func (h *NetHost) serve(t testing.TB, https bool) {
	httpLn := h.Listen(t, "tcp4", fmt.Sprintf(":%d", NetHostHTTP))
	srv := &http.Server{Handler: NetHostHandler(), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(httpLn)
	t.Cleanup(func() { srv.Close() })
	if https {
		tlsLn := h.Listen(t, "tcp4", fmt.Sprintf(":%d", NetHostHTTPS))
		tsrv := &http.Server{Handler: NetHostHandler(), ReadHeaderTimeout: 10 * time.Second,
			TLSConfig: &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}}}
		go tsrv.ServeTLS(tlsLn, "", "")
		t.Cleanup(func() { tsrv.Close() })
	}
	// One UDP socket per address: a socket bound to the wildcard address
	// answers from the interface's primary address, which a client
	// connected to a secondary one drops.
	for _, ip := range append(append([]netip.Addr{}, h.PublicIPs...), h.PrivateIP) {
		udp := h.ListenPacket(t, "udp4", netip.AddrPortFrom(ip, NetHostUDPEcho).String())
		go func() {
			buf := make([]byte, 65536)
			for {
				n, a, err := udp.ReadFrom(buf)
				if err != nil {
					if errors.Is(err, net.ErrClosed) {
						return
					}
					continue
				}
				udp.WriteTo(buf[:n], a)
			}
		}()
	}
}

// selfSigned makes a certificate for any name: clients in the guest skip
// verification, the point is a real TLS handshake through the gateway.
func selfSigned(t testing.TB) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "smx test host"},
		DNSNames:     []string{"*.example.test", "example.test", "*.test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// HostsFile writes a hosts table ("ADDR NAME" per line) into a test
// directory and returns its path, for SMX_HOSTS_FILE.
func HostsFile(t testing.TB, entries map[string]string) string {
	t.Helper()
	var b strings.Builder
	for name, addr := range entries {
		fmt.Fprintf(&b, "%s %s\n", addr, name)
	}
	p := t.TempDir() + "/hosts"
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

var (
	probeOnce sync.Once
	probePath string
	probeErr  error
)

// NetProbe builds testdata/netprobe, a static program tests copy into
// guests (see its doc comment), once per test binary.
func NetProbe(t testing.TB) string {
	t.Helper()
	probeOnce.Do(func() {
		// One file per user and checkout, replaced atomically: nothing
		// piles up in /tmp, and two checkouts testing at once (worktrees)
		// do not run each other's build.
		root := sha256.Sum256([]byte(RepoRoot()))
		probePath = filepath.Join(os.TempDir(), fmt.Sprintf("smx-netprobe-%d-%x", os.Getuid(), root[:4]))
		tmp := fmt.Sprintf("%s.%d", probePath, os.Getpid())
		defer os.Remove(tmp)
		cmd := exec.Command("go", "build", "-o", tmp, "./internal/testutil/testdata/netprobe")
		cmd.Dir = RepoRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			probeErr = fmt.Errorf("build netprobe: %v\n%s", err, out)
			return
		}
		probeErr = os.Rename(tmp, probePath)
	})
	if probeErr != nil {
		t.Fatal(probeErr)
	}
	return probePath
}

// NetNS is a bare network namespace, only its loopback up: a host of its
// own for a process run in it (Command), with no route anywhere until
// Reach links it to another.
type NetNS struct {
	Name  string
	links int
}

// NewNetNS creates a namespace; it is removed when the test ends.
func NewNetNS(t testing.TB) *NetNS {
	t.Helper()
	RequireNetNS(t)
	for try := 0; ; try++ {
		name := fmt.Sprintf("smxn-%d", 1+mrand.IntN(9999))
		if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
			if try < 20 {
				continue
			}
			t.Fatalf("ip netns add %s: %v\n%s", name, err, out)
		}
		n := &NetNS{Name: name}
		t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
		if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
			t.Fatalf("netns %s: lo up: %v\n%s", name, err, out)
		}
		return n
	}
}

// Reach gives n one address (10.202.0.1, on its loopback) that each of
// peers reaches over a veth pair of its own, and returns it: a server
// listening in n on that address (Listen) serves all the peers under one
// name, and nothing else can reach it.
func (n *NetNS) Reach(t testing.TB, peers ...*NetNS) netip.Addr {
	t.Helper()
	addr := netip.MustParseAddr("10.202.0.1")
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if n.links == 0 {
		run("-n", n.Name, "addr", "add", addr.String()+"/32", "dev", "lo")
	}
	for _, p := range peers {
		n.links++
		// Named in n first, then moved: names are per namespace, and the
		// pair is born in the test's own.
		here, there := fmt.Sprintf("%s-%d", strings.TrimPrefix(n.Name, "smxn-"), n.links), fmt.Sprintf("%s-p%d", strings.TrimPrefix(n.Name, "smxn-"), n.links)
		near := fmt.Sprintf("10.201.%d.1", n.links)
		far := fmt.Sprintf("10.201.%d.2", n.links)
		run("link", "add", "smxv"+here, "type", "veth", "peer", "name", "smxv"+there)
		run("link", "set", "smxv"+here, "netns", n.Name)
		run("link", "set", "smxv"+there, "netns", p.Name)
		run("-n", n.Name, "addr", "add", near+"/30", "dev", "smxv"+here)
		run("-n", p.Name, "addr", "add", far+"/30", "dev", "smxv"+there)
		run("-n", n.Name, "link", "set", "smxv"+here, "up")
		run("-n", p.Name, "link", "set", "smxv"+there, "up")
		run("-n", p.Name, "route", "add", addr.String()+"/32", "via", near)
	}
	return addr
}

// Listen opens a listener inside the namespace; it is closed when the
// test ends.
func (n *NetNS) Listen(t testing.TB, network, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := inNetNS(n.Name, func() (err error) { ln, err = net.Listen(network, addr); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// Command is a command run in the namespace (by `ip netns exec`, which
// also gives it a mount namespace of its own, slave to the host's).
func (n *NetNS) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}

// Inode is the namespace's inode number, what /proc/PID/ns/net of a
// process in it links to ("net:[INODE]").
func (n *NetNS) Inode(t testing.TB) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat("/run/netns/"+n.Name, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}
