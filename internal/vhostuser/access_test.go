package vhostuser

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// serveWith runs Serve with cfg on one end of a socketpair and returns a
// front-end on the other (send and recv only).
func serveWith(t *testing.T, cfg Config) *frontEnd {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "vhost-user")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	f := &frontEnd{t: t, conn: conn(fds[0]), done: make(chan error, 1)}
	back := conn(fds[1])
	go func() { f.done <- Serve(context.Background(), back, cfg) }()
	t.Cleanup(func() {
		f.conn.Close()
		select {
		case <-f.done:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after the front-end hung up")
		}
	})
	return f
}

// QEMU refuses a device with iommu_platform=on unless the backend offers
// its request channel: offered with FeatureAccessPlatform, and only then.
func TestAccessPlatformOffersBackendChannel(t *testing.T) {
	f := serveWith(t, Config{Queues: 2, Handler: echo{}, Features: FeatureAccessPlatform})
	f.send(reqGetFeatures, 0, nil)
	if feat := binary.LittleEndian.Uint64(f.recv(reqGetFeatures)); feat&FeatureAccessPlatform == 0 {
		t.Fatalf("features %#x lack ACCESS_PLATFORM", feat)
	}
	f.send(reqGetProtocolFeatures, 0, nil)
	pf := binary.LittleEndian.Uint64(f.recv(reqGetProtocolFeatures))
	if pf&ProtocolBackendReq == 0 || pf&ProtocolReplyAck == 0 {
		t.Fatalf("protocol features %#x lack BACKEND_REQ or REPLY_ACK", pf)
	}
	f.send(reqSetProtocolFeatures, 0, u64(ProtocolReplyAck|ProtocolMQ|ProtocolBackendReq))
	f.send(reqSetFeatures, flagNeedReply, u64(FeatureVersion1|FeatureProtocolFeatures|FeatureAccessPlatform))
	f.ack(reqSetFeatures)
	ev, _ := unix.Eventfd(0, unix.EFD_CLOEXEC)
	f.send(reqSetBackendReqFD, flagNeedReply, nil, ev)
	unix.Close(ev)
	f.ack(reqSetBackendReqFD)

	plain := serveWith(t, Config{Queues: 2, Handler: echo{}})
	plain.send(reqGetProtocolFeatures, 0, nil)
	if pf := binary.LittleEndian.Uint64(plain.recv(reqGetProtocolFeatures)); pf&ProtocolBackendReq != 0 {
		t.Fatalf("protocol features %#x offer BACKEND_REQ without ACCESS_PLATFORM", pf)
	}
	ev, _ = unix.Eventfd(0, unix.EFD_CLOEXEC)
	plain.send(reqSetBackendReqFD, 0, nil, ev)
	unix.Close(ev)
	select {
	case err := <-plain.done:
		if !errors.Is(err, ErrMalformed) {
			t.Fatalf("Serve: %v, want ErrMalformed", err)
		}
		plain.done <- err
	case <-time.After(10 * time.Second):
		t.Fatal("Serve accepted a backend channel it did not offer")
	}
}
