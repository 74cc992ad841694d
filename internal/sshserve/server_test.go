package sshserve

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/audit"
)

// recorder keeps the audit records a server wrote.
type recorder struct {
	mu   sync.Mutex
	recs []string
}

func (r *recorder) log(kind string, f map[string]any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, kind)
}

func (r *recorder) has(kind string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range r.recs {
		if k == kind {
			return true
		}
	}
	return false
}

// fakeExec stands in for the guest agent's exec (the VM test in
// internal/cli runs the real one): it prints its arguments and exits 3.
type fakeExec struct {
	net.Conn
	end chan *agentproto.ExitStatus
}

func (f *fakeExec) End(exit *agentproto.ExitStatus, err error) { f.end <- exit }

// serve starts a server on one end of a pipe and returns the other, and
// what the guest was asked to dial.
func serve(t *testing.T, keys *Keys, rec *recorder, dialed chan uint16, ended chan *agentproto.ExitStatus) net.Conn {
	t.Helper()
	a, b := connPair(t)
	cfg := Config{
		Keys: keys,
		Log:  rec.log,
		Exec: func(ctx context.Context, req *agentproto.ExecRequest) (Exec, error) {
			g, h := net.Pipe()
			if req.Args[2] == "sleep" {
				// Runs until its stream is closed: that is the kill.
				go func() {
					io.Copy(io.Discard, h)
					ended <- &agentproto.ExitStatus{Code: 137, Signal: 9}
					h.Close()
				}()
				return &fakeExec{Conn: g, end: make(chan *agentproto.ExitStatus, 1)}, nil
			}
			go func() {
				defer h.Close()
				agentproto.WriteFrame(h, agentproto.FrameStdout, []byte(strings.Join(req.Args, " ")+"\n"))
				agentproto.WriteJSON(h, agentproto.FrameExit, agentproto.ExitStatus{Code: 3})
				io.Copy(io.Discard, h)
			}()
			return &fakeExec{Conn: g, end: ended}, nil
		},
		Dial: func(ctx context.Context, port uint16) (io.ReadWriteCloser, error) {
			dialed <- port
			g, h := net.Pipe()
			go func() { io.Copy(h, h) }() // echo
			return g, nil
		},
	}
	go Serve(context.Background(), cfg, a)
	t.Cleanup(func() { b.Close() })
	return b
}

// connPair is a connected loopback TCP pair: buffered, unlike net.Pipe,
// on which both sides' SSH version lines would wait for each other.
func connPair(t *testing.T) (net.Conn, net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	b, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}

func testKeys(t *testing.T) (*Keys, Files) {
	f := Files{Dir: t.TempDir()}
	k, err := f.Ensure()
	if err != nil {
		t.Fatal(err)
	}
	return k, f
}

func client(t *testing.T, c net.Conn, signer ssh.Signer, host ssh.PublicKey) (*ssh.Client, error) {
	conn, chans, reqs, err := ssh.NewClientConn(c, "sandbox", &ssh.ClientConfig{
		User: "root", Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: ssh.FixedHostKey(host),
	})
	if err != nil {
		return nil, err
	}
	cl := ssh.NewClient(conn, chans, reqs)
	t.Cleanup(func() { cl.Close() })
	return cl, nil
}

func TestOnlyTheSandboxKey(t *testing.T) {
	keys, _ := testKeys(t)
	rec := &recorder{}
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	other, _ := ssh.NewSignerFromKey(priv)
	c := serve(t, keys, rec, make(chan uint16, 1), make(chan *agentproto.ExitStatus, 1))
	if _, err := client(t, c, other, keys.Host.PublicKey()); err == nil {
		t.Fatal("a key other than the sandbox's signed in")
	}
	if !rec.has(audit.KindSSHLoginRefused) || rec.has(audit.KindSSHLogin) {
		t.Fatalf("records %v, want a login refusal and no login", rec.recs)
	}
}

func TestSessionAndForwards(t *testing.T) {
	keys, _ := testKeys(t)
	rec := &recorder{}
	dialed, ended := make(chan uint16, 1), make(chan *agentproto.ExitStatus, 1)
	cl, err := client(t, serve(t, keys, rec, dialed, ended), keys.Client, keys.Host.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	s, _ := cl.NewSession()
	out, err := s.Output("echo hi")
	var ee *ssh.ExitError
	if !errors.As(err, &ee) || ee.ExitStatus() != 3 || string(out) != "/bin/sh -c echo hi\n" {
		t.Fatalf("exec: %q %v", out, err)
	}
	if e := <-ended; e == nil || e.Code != 3 {
		t.Fatalf("exec's end was logged as %v", e)
	}

	// A session the client closes before its process ended kills the
	// process (its stream to the guest is closed).
	s, _ = cl.NewSession()
	if err := s.Start("sleep"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if e := <-ended; e == nil || e.Signal != 9 {
		t.Fatalf("the guest process of a closed session was not ended: %v", e)
	}

	// A forward to guest loopback is dialled in the guest.
	fw, err := cl.Dial("tcp", "127.0.0.1:5000")
	if err != nil {
		t.Fatal(err)
	}
	if p := <-dialed; p != 5000 {
		t.Fatalf("guest asked to dial %d", p)
	}
	fw.Write([]byte("ping"))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(fw, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("forward: %q %v", buf, err)
	}
	fw.Close()

	// Anything off the guest's loopback, remote forwards and agent
	// forwarding are refused.
	for _, addr := range []string{"10.0.2.2:80", "169.254.169.254:80", "example.com:443"} {
		if _, err := cl.Dial("tcp", addr); err == nil || !strings.Contains(err.Error(), "prohibited") {
			t.Errorf("forward to %s: %v", addr, err)
		}
	}
	select {
	case p := <-dialed:
		t.Fatalf("guest asked to dial %d for a refused forward", p)
	default:
	}
	if !rec.has(audit.KindSSHTunnelRefused) {
		t.Errorf("no tunnel refusal in %v", rec.recs)
	}
	if _, err := cl.Listen("tcp", "127.0.0.1:0"); err == nil {
		t.Error("a remote forward (-R) was accepted")
	}
	if ch, _, err := cl.OpenChannel("auth-agent@openssh.com", nil); err == nil {
		ch.Close()
		t.Error("an agent channel was accepted")
	}
}

func TestKeyFiles(t *testing.T) {
	k, f := testKeys(t)
	for _, p := range []string{f.ClientKey(), f.HostKey()} {
		st, err := os.Stat(p)
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", p, st.Mode(), err)
		}
	}
	again, err := f.Ensure()
	if err != nil || string(again.Host.PublicKey().Marshal()) != string(k.Host.PublicKey().Marshal()) {
		t.Fatalf("a second Ensure made a new host key: %v", err)
	}
	if err := f.WriteKnownHosts("smx-x", k); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(f.KnownHosts())
	if !strings.HasPrefix(string(b), "smx-x ssh-ed25519 ") {
		t.Fatalf("known_hosts %q", b)
	}
	if m, _ := filepath.Glob(filepath.Join(f.Dir, ".key-*")); len(m) != 0 {
		t.Fatalf("temporary files left: %v", m)
	}
}
