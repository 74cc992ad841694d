package console

import (
	"context"
	"net"
	"net/http"
	"testing"

	"github.com/smx-dev/smx/internal/api"
	"github.com/smx-dev/smx/internal/service"
	"github.com/smx-dev/smx/internal/statedir"
)

// BenchmarkFrontDoor compares GET /v1/sandboxes through the console
// (Host and Origin checks, session cookie) with the same API server on
// TCP behind its bearer token, the nearest peer: both over loopback, on
// an empty state directory.
func BenchmarkFrontDoor(b *testing.B) {
	state := statedir.Dir{Root: b.TempDir()}
	if err := state.Ensure(); err != nil {
		b.Fatal(err)
	}
	backend := api.ServiceBackend{S: service.New(state, nil)}
	listen := func(h func(net.Addr) http.Handler) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		go api.Serve(ctx, ln, h(ln.Addr()))
		b.Cleanup(cancel)
		return "http://" + ln.Addr().String()
	}
	const token = "0123456789abcdef0123456789abcdef"
	bearer := listen(func(net.Addr) http.Handler { return &api.Server{Backend: backend, Token: token} })
	var login string
	console := listen(func(a net.Addr) http.Handler {
		c, t, err := New(&api.Server{Backend: backend}, a)
		if err != nil {
			b.Fatal(err)
		}
		login = t
		return c
	})
	cl := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := cl.Get(console + "/login?token=" + login)
	if err != nil {
		b.Fatal(err)
	}
	resp.Body.Close()
	cookie := resp.Cookies()[0]
	get := func(b *testing.B, url string, set func(*http.Request)) {
		for b.Loop() {
			req, _ := http.NewRequest("GET", url+"/v1/sandboxes", nil)
			set(req)
			resp, err := cl.Do(req)
			if err != nil || resp.StatusCode != http.StatusOK {
				b.Fatalf("%v %v", err, resp)
			}
			resp.Body.Close()
		}
	}
	b.Run("console", func(b *testing.B) { get(b, console, func(r *http.Request) { r.AddCookie(cookie) }) })
	b.Run("bearer", func(b *testing.B) {
		get(b, bearer, func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token) })
	})
}
