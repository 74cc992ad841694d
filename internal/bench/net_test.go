package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/image"
	"github.com/smx-dev/smx/internal/initramfs"
	"github.com/smx-dev/smx/internal/kernel"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/statedir"
	"github.com/smx-dev/smx/internal/supervisor"
	"github.com/smx-dev/smx/internal/supproto"
	"github.com/smx-dev/smx/internal/testutil"
	"github.com/smx-dev/smx/internal/vm"
)

// BenchmarkNetwork compares guest networking through the smx gateway (the
// supervisor's policy-checking user-mode stack) with QEMU's own user-mode
// networking (`-netdev user`, slirp), on the same kernel, initramfs,
// smx-agent, image and guest size. Both guests fetch from one HTTP server
// on host loopback: the QEMU-user guest as 10.0.2.2:PORT, the smx guest as
// host.smx.internal:PORT (network.host_ports). Sub-benchmarks:
//
//   - download: wget of 100 MB to /dev/null (MB/s; goal smx ≥ 1.0× QEMU user);
//   - connect: 50 sequential HTTP requests, each on a new connection, timed
//     in the guest (avg-request-us; goal smx ≤ 1.5× QEMU user);
//   - idle-flows: host memory of the process holding the guest's network
//     (the supervisor for smx, QEMU for slirp) before and after the guest
//     opens 1000 idle connections.
//
// The ratios are logged at the end (run with -v).
func BenchmarkNetwork(b *testing.B) {
	setup(b)
	probe := testutil.NetProbe(b)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: testutil.NetHostHandler()}
	go srv.Serve(ln)
	defer srv.Close()
	port := ln.Addr().(*net.TCPAddr).Port

	guests := []struct {
		name string
		g    benchGuest
		host string
	}{
		{"qemu-user", startUserNetVM(b), "10.0.2.2"},
		{"smx", startSMXNet(b, port), "host.smx.internal"},
	}
	for _, g := range guests {
		defer g.g.Close()
		if _, err := g.g.Exec(bytes.NewReader(mustRead(b, probe)), "sh", "-c", "cat > /usr/bin/netprobe && chmod +x /usr/bin/netprobe"); err != nil {
			b.Fatal(err)
		}
	}

	const size = 100 << 20
	mbps := map[string]float64{}
	for _, g := range guests {
		b.Run("download-100MB/"+g.name, func(b *testing.B) {
			url := fmt.Sprintf("http://%s:%d/bytes?n=%d", g.host, port, size)
			b.SetBytes(size)
			start := time.Now()
			for i := 0; i < b.N; i++ {
				if out, err := g.g.Exec(nil, "wget", "-q", "-O", "/dev/null", url); err != nil {
					b.Fatal(err, out)
				}
			}
			mbps[g.name] = float64(size) * float64(b.N) / 1e6 / time.Since(start).Seconds()
		})
	}
	lat := map[string]float64{}
	for _, g := range guests {
		b.Run("connect/"+g.name, func(b *testing.B) {
			url := fmt.Sprintf("http://%s:%d/", g.host, port)
			var sum float64
			for i := 0; i < b.N; i++ {
				out, err := g.g.Exec(nil, "netprobe", "latency", "50", url)
				if err != nil {
					b.Fatal(err, out)
				}
				us, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(out, "avg_us=")))
				if err != nil {
					b.Fatalf("netprobe latency: %q", out)
				}
				sum += float64(us)
			}
			lat[g.name] = sum / float64(b.N)
			b.ReportMetric(lat[g.name], "avg-request-us")
		})
	}
	grow := map[string]float64{}
	for _, g := range guests {
		b.Run("idle-flows-1000/"+g.name, func(b *testing.B) {
			before := rssMiB(g.g.NetPID())
			addr := fmt.Sprintf("%s:%d", g.host, port)
			for i := 0; i < b.N; i++ {
				if out, err := g.g.Exec(nil, "sh", "-c", "setsid netprobe idle 1000 "+addr+" </dev/null >/tmp/idle 2>&1 &"); err != nil {
					b.Fatal(err, out)
				}
				deadline := time.Now().Add(2 * time.Minute)
				for {
					out, _ := g.g.Exec(nil, "cat", "/tmp/idle")
					if strings.Contains(out, "ready 1000") {
						break
					}
					if strings.Contains(out, "netprobe:") || time.Now().After(deadline) {
						b.Fatalf("1000 idle connections: %q", out)
					}
					time.Sleep(300 * time.Millisecond)
				}
				time.Sleep(time.Second)
				after := rssMiB(g.g.NetPID())
				grow[g.name] = after - before
				b.ReportMetric(before, "RSS-before-MiB")
				b.ReportMetric(after, "RSS-1000-flows-MiB")
				g.g.Exec(nil, "sh", "-c", "killall netprobe; sleep 1")
			}
		})
	}
	if len(mbps) == 2 && len(lat) == 2 {
		b.Logf("download: smx %.1f MB/s, qemu-user %.1f MB/s, ratio %.2f (goal >= 1.0)", mbps["smx"], mbps["qemu-user"], mbps["smx"]/mbps["qemu-user"])
		b.Logf("connect: smx %.0f us, qemu-user %.0f us per request, ratio %.2f (goal <= 1.5)", lat["smx"], lat["qemu-user"], lat["smx"]/lat["qemu-user"])
	}
	if len(grow) == 2 {
		b.Logf("1000 idle flows: smx supervisor RSS +%.1f MiB; QEMU-user QEMU RSS +%.1f MiB (slirp plus the guest RAM the flows touched, so an upper bound for slirp)", grow["smx"], grow["qemu-user"])
	}
}

func mustRead(b *testing.B, p string) []byte {
	data, err := os.ReadFile(p)
	if err != nil {
		b.Fatal(err)
	}
	return data
}

// benchGuest runs commands in a guest and names the host process that
// carries its network.
type benchGuest interface {
	Exec(stdin io.Reader, args ...string) (string, error)
	NetPID() int
	Close()
}

// smxGuest is a sandbox driven through the supervisor's API.
type smxGuest struct {
	name string
	c    *sandbox.Client
	pid  int
}

func startSMXNet(b *testing.B, port int) *smxGuest {
	name := "bench-net"
	prof := filepath.Join(b.TempDir(), "hp.yaml")
	if err := os.WriteFile(prof, []byte(fmt.Sprintf("network:\n  mode: default-deny\n  host_ports: [%d]\n", port)), 0o644); err != nil {
		b.Fatal(err)
	}
	smx("agent", "rm", "-f", name)
	if out, err := smx("agent", "create", name, "--memory", "512M", "--profile", prof); err != nil {
		b.Fatal(err, out)
	}
	if out, err := smx("agent", "start", name); err != nil {
		smx("agent", "rm", "-f", name)
		b.Fatal(err, out)
	}
	m := &sandbox.Manager{State: statedir.Dir{Root: home}}
	in, err := m.Get(name)
	if err != nil {
		b.Fatal(err)
	}
	return &smxGuest{name: name, c: &sandbox.Client{Paths: m.Paths(name)}, pid: in.State.SupervisorPID}
}

func (g *smxGuest) Exec(stdin io.Reader, args ...string) (string, error) {
	var out bytes.Buffer
	st, err := g.c.Exec(context.Background(), supproto.ExecRequest{Args: args, Stdin: stdin != nil},
		sandbox.ExecIO{Stdin: stdin, Stdout: &out, Stderr: &out})
	if err == nil && st.Code != 0 {
		err = fmt.Errorf("%v: exit %d", args, st.Code)
	}
	return out.String(), err
}

func (g *smxGuest) NetPID() int { return g.pid }
func (g *smxGuest) Close()      { smx("agent", "rm", "-f", g.name) }

// userNet is QEMU's user-mode network (slirp) on a virtio NIC: the peer
// smx's gateway is measured against. 10.0.2.2 is the host.
type userNet struct{}

func (userNet) Args(ids *vm.IDs) []string {
	id := ids.New("net")
	return []string{"-netdev", "user,id=" + id, "-device", "virtio-net-device,netdev=" + id + ",mac=52:54:00:12:34:56"}
}

// userVM is a guest booted like a sandbox (same kernel, initramfs, agent,
// image overlay, memory) but with QEMU user networking, driven over its
// control channel exactly as the supervisor does.
type userVM struct {
	m    *vm.Machine
	conn net.Conn
	sess *yamux.Session
}

func startUserNetVM(b *testing.B) *userVM {
	return startPeerVM(b, "busybox", "qemu-user", " smx.net=10.0.2.15/24,10.0.2.2", userNet{})
}

// startPeerVM boots a guest like a sandbox (same kernel, initramfs, agent,
// image overlay, memory) with the peer's own device in place of smx's
// gateway, driven over its control channel as the supervisor does.
// sharedPeer is a peer device served by another process: its files are
// passed to QEMU after the channel (fd 4 on) and guest RAM is shared.
type sharedPeer interface {
	vm.Device
	peerFiles() []*os.File
}

func startPeerVM(b *testing.B, imageName, hostname, cmdline string, peer vm.Device) *userVM {
	ctx := context.Background()
	st := statedir.Dir{Root: home}
	k, err := kernel.Find(st.Kernels())
	if err != nil {
		b.Fatal(err)
	}
	initrd, err := initramfs.Build(ctx, k, filepath.Join(bin, "smx-agent"), st.Initramfs())
	if err != nil {
		b.Fatal(err)
	}
	img, err := (&image.Store{Dir: st.Images()}).Get(imageName)
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	disk := filepath.Join(dir, "disk.qcow2")
	if err := img.CreateOverlay(ctx, disk, 0); err != nil {
		b.Fatal(err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	hostEnd, guestEnd := os.NewFile(uintptr(fds[0]), "ctl-host"), os.NewFile(uintptr(fds[1]), "ctl-guest")
	conn, err := net.FileConn(hostEnd)
	hostEnd.Close()
	if err != nil {
		b.Fatal(err)
	}
	accel, _ := vm.DetectAccel()
	cfg := vm.Config{
		Accel: accel, CPUs: 1, MemoryMiB: 512,
		Kernel: k.BootImage(), Initrd: initrd,
		Cmdline:   supervisor.Cmdline(hostname) + cmdline,
		QMPSocket: filepath.Join(dir, "qmp.sock"),
		Devices: []vm.Device{
			vm.Console{LogPath: filepath.Join(dir, "console.log")},
			vm.SerialPort{Name: agentproto.PortName, FD: 3},
			vm.Disk{Path: disk, Format: "qcow2"},
			vm.RNG{},
			peer,
		},
		ExtraFiles: []*os.File{guestEnd},
	}
	if sp, ok := peer.(sharedPeer); ok {
		cfg.ExtraFiles = append(cfg.ExtraFiles, sp.peerFiles()...)
		cfg.SharedRAM = true
	}
	m, err := vm.Start(ctx, cfg, nil)
	guestEnd.Close()
	if err != nil {
		conn.Close()
		b.Fatal(err)
	}
	u := &userVM{m: m, conn: conn}
	if err := u.awaitHello(60 * time.Second); err != nil {
		u.Close()
		console, _ := os.ReadFile(filepath.Join(dir, "console.log"))
		b.Fatalf("%s guest: %v\n%s", hostname, err, strings.TrimSpace(string(console)))
	}
	ycfg := yamux.DefaultConfig()
	ycfg.EnableKeepAlive = false
	ycfg.ConnectionWriteTimeout = 5 * time.Minute
	ycfg.MaxStreamWindowSize = 4 << 20
	ycfg.LogOutput = io.Discard
	u.sess, _ = yamux.Client(conn, ycfg)
	return u
}

// awaitHello discards the channel up to the agent's session hello.
func (u *userVM) awaitHello(timeout time.Duration) error {
	u.conn.SetReadDeadline(time.Now().Add(timeout))
	defer u.conn.SetReadDeadline(time.Time{})
	hello := agentproto.SessionHello
	var seen []byte
	buf := make([]byte, 1)
	for !bytes.HasSuffix(seen, []byte(hello)) {
		if _, err := u.conn.Read(buf); err != nil {
			return err
		}
		seen = append(seen, buf[0])
		if len(seen) > 4096 {
			seen = seen[len(seen)-len(hello):]
		}
	}
	return nil
}

func (u *userVM) Exec(stdin io.Reader, args ...string) (string, error) {
	st, err := u.sess.OpenStream()
	if err != nil {
		return "", err
	}
	defer st.Close()
	req := &agentproto.Request{Op: agentproto.OpExec, Exec: &agentproto.ExecRequest{Args: args, Stdin: stdin != nil}}
	if err := agentproto.WriteJSON(st, agentproto.FrameRequest, req); err != nil {
		return "", err
	}
	if stdin != nil {
		go func() {
			io.Copy(agentproto.FrameWriter{W: st, Type: agentproto.FrameStdin}, stdin)
			agentproto.WriteFrame(st, agentproto.FrameStdinEOF, nil)
		}()
	}
	var out bytes.Buffer
	for {
		t, p, err := agentproto.ReadFrame(st, nil)
		if err != nil {
			return out.String(), err
		}
		switch t {
		case agentproto.FrameStdout, agentproto.FrameStderr:
			out.Write(p)
		case agentproto.FrameError:
			return out.String(), agentproto.DecodeError(p)
		case agentproto.FrameExit:
			var es agentproto.ExitStatus
			if err := json.Unmarshal(p, &es); err != nil {
				return out.String(), err
			}
			if es.Code != 0 {
				return out.String(), fmt.Errorf("%v: exit %d", args, es.Code)
			}
			return out.String(), nil
		}
	}
}

func (u *userVM) NetPID() int { return u.m.PID() }

func (u *userVM) Close() {
	if u.sess != nil {
		u.sess.Close()
	}
	u.conn.Close()
	u.m.Close()
}
