package testutil

import (
	"net"
	"testing"
)

// ServeTCP listens on a free port of host loopback until the test ends and
// hands each connection to handle, as ServeConns does.
func ServeTCP(t testing.TB, handle func(net.Conn)) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ServeConns(t, ln, handle)
	return ln
}

// ServeConns accepts on ln until it is closed, which it is when the test
// ends, and hands each connection to handle on a goroutine of its own.
// handle owns the connection.
func ServeConns(t testing.TB, ln net.Listener, handle func(net.Conn)) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
}
