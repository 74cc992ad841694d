package netstack

import (
	"context"
	"io"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
)

// TestDialGuest: the gateway reaches a server listening in the guest (a
// published port's way in), from the gateway's address; a guest port
// with no listener is refused at once, and nothing is logged as a flow.
func TestDialGuest(t *testing.T) {
	r := newRig(t)
	ln, err := gonet.ListenTCP(r.guest, tcpip.FullAddress{NIC: 1, Addr: tcpAddr(guestIP), Port: 8000}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		peer <- c.RemoteAddr().String()
		io.WriteString(c, "hello from the guest")
		c.Close()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := r.s.DialGuest(ctx, 8000)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c)
	c.Close()
	if err != nil || string(b) != "hello from the guest" {
		t.Fatalf("read %q, %v", b, err)
	}
	if p := <-peer; p[:len("10.0.2.2:")] != "10.0.2.2:" {
		t.Errorf("the guest saw the connection from %s, want the gateway 10.0.2.2", p)
	}
	if _, err := r.s.DialGuest(ctx, 8001); err == nil {
		t.Error("DialGuest to a port nothing listens on succeeded")
	}
	if ev := r.eventsSnapshot(); len(ev) != 0 {
		t.Errorf("events %v, want none", ev)
	}
}
