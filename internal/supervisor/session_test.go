package supervisor

import (
	"net"
	"sync"
	"testing"
)

// The control session is replaced by the boot's goroutine while cleanup
// and request handlers read or close it: run under -race, this is the
// race on s.session that waitGuest's goroutine had with cleanup. After
// endSessions no new session starts.
func TestSessionGuard(t *testing.T) {
	host, guest := net.Pipe()
	defer guest.Close()
	defer host.Close()
	s := &Supervisor{ctlConn: host}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		for range 20 {
			s.newSession()
		}
	}()
	go func() {
		defer wg.Done()
		for range 200 {
			if sess := s.currentSession(); sess != nil {
				_ = sess.IsClosed()
			}
		}
	}()
	go func() {
		defer wg.Done()
		s.endSessions()
	}()
	wg.Wait()
	s.newSession()
	if s.currentSession() != nil {
		t.Fatal("a session was started after endSessions")
	}
	if _, err := s.call(t.Context(), nil); err == nil {
		t.Fatal("call without a session succeeded")
	}
}
