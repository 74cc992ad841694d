package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	wire "github.com/smx-dev/smx/api"
	"github.com/smx-dev/smx/client"
	"github.com/smx-dev/smx/internal/testutil"
)

var testBin string

// servers maps a vmServer socket to its `smx serve`.
var servers sync.Map

// openFDs counts the file descriptors of the `smx serve` behind sock.
func openFDs(t testing.TB, sock string) int {
	v, ok := servers.Load(sock)
	if !ok {
		t.Fatalf("no server for %s", sock)
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", v.(*served).cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.CleanupSmxHome(testBin)
	os.Exit(code)
}

// serve runs `smx serve` with args against home until the test ends and
// returns its log.
type served struct {
	cmd *exec.Cmd
	log *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func serve(t testing.TB, bin, home string, args ...string) *served {
	t.Helper()
	return serveWith(t, bin, home, nil, args...)
}

func serveWith(t testing.TB, bin, home string, global []string, args ...string) *served {
	t.Helper()
	cmd := testutil.SmxCmd(bin, home, append(append(global, "serve"), args...)...)
	s := &served{cmd: cmd, log: &syncBuffer{}}
	cmd.Stdout, cmd.Stderr = s.log, s.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("smx serve log:\n%s", s.log)
		}
	})
	for deadline := time.Now().Add(20 * time.Second); ; {
		if strings.Contains(s.log.String(), "API listening") {
			return s
		}
		select {
		case <-done:
			t.Fatalf("smx serve exited: %s", s.log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("smx serve did not listen: %s", s.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// vmServer is a `smx serve` on a unix socket over the shared VM test
// state directory; global flags (--debug) go before serve.
func vmServer(t testing.TB, global ...string) (bin, home, sock string) {
	t.Helper()
	testutil.RequireQEMU(t)
	bin = testutil.Binaries(t)
	testBin = bin
	home = testutil.SmxHome(t, bin)
	sock = filepath.Join(home, "t-"+strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))+".sock")
	if len(sock) > 100 {
		t.Fatalf("socket path too long: %s", sock)
	}
	servers.Store(sock, serveWith(t, bin, home, global, "--listen", "unix:"+sock))
	return bin, home, sock
}

// openAPI loads api/openapi.yaml, validated, with a router that matches
// paths whatever the host.
func openAPI(t testing.TB) (*openapi3.T, routers.Router) {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(wire.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("api/openapi.yaml: %v", err)
	}
	doc.Servers = nil
	r, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return doc, r
}

// checker validates every answer against the OpenAPI document and records
// which operations were exercised.
type checker struct {
	t      testing.TB
	router routers.Router
	rt     http.RoundTripper
	seen   *sync.Map // operation IDs exercised
}

func (c *checker) mark(op string) { c.seen.Store(op, true) }

func (c *checker) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.rt.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	route, params, ferr := c.router.FindRoute(req)
	if ferr != nil {
		if resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed {
			c.t.Errorf("%s %s answered %d but is not in api/openapi.yaml", req.Method, req.URL.Path, resp.StatusCode)
		}
		return resp, nil
	}
	c.mark(route.Operation.OperationID)
	ct := resp.Header.Get("Content-Type")
	if !strings.HasPrefix(ct, "application/json") && resp.StatusCode < 300 {
		if strings.HasPrefix(ct, "application/x-ndjson") {
			resp.Body = c.ndjson(resp.Body, route, req)
		}
		return resp, nil
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	c.validate(req, route, params, resp.StatusCode, resp.Header, body)
	return resp, nil
}

func (c *checker) validate(req *http.Request, route *routers.Route, params map[string]string, status int, h http.Header, body []byte) {
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route},
		Status:                 status, Header: h,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	in.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		c.t.Errorf("%s %s: answer %d does not match api/openapi.yaml: %v\n%s", req.Method, req.URL.Path, status, err, body)
	}
}

// ndjson validates each line of a JSON-lines answer against the Record or
// Event schema.
func (c *checker) ndjson(body io.ReadCloser, route *routers.Route, req *http.Request) io.ReadCloser {
	schema := "Record"
	switch {
	case strings.HasSuffix(route.Path, "/events"):
		schema = "Event"
	case route.Path == "/v1/agents":
		schema = "AgentEvent"
	}
	ref := route.Spec.Components.Schemas[schema].Value
	pr, pw := io.Pipe()
	go func() {
		defer body.Close()
		sc := bufio.NewScanner(body)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			var v any
			if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
				c.t.Errorf("%s: bad JSON line %q: %v", req.URL.Path, sc.Bytes(), err)
			} else if err := ref.VisitJSON(v); err != nil {
				c.t.Errorf("%s: line does not match %s in api/openapi.yaml: %v\n%s", req.URL.Path, schema, err, sc.Bytes())
			}
			if _, err := pw.Write(append(sc.Bytes(), '\n')); err != nil {
				return
			}
		}
		pw.CloseWithError(sc.Err())
	}()
	return pr
}

// checkedClient is a client of sock whose answers are validated by c.
func checkedClient(t testing.TB, sock string) (*client.Client, *checker) {
	_, r := openAPI(t)
	chk := &checker{t: t, router: r, seen: &sync.Map{}}
	cl := client.New(sock).WithTransport(func(rt http.RoundTripper) http.RoundTripper { chk.rt = rt; return chk })
	return cl, chk
}

// raw sends a request straight to the socket (for bodies no client sends).
func raw(t testing.TB, chk *checker, sock, method, path, ctype string, body io.Reader) (int, string) {
	t.Helper()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	var rt http.RoundTripper = tr
	if chk != nil {
		rt = &checker{t: chk.t, router: chk.router, rt: tr, seen: chk.seen}
	}
	req, _ := http.NewRequest(method, "http://smx"+path, body)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := (&http.Client{Transport: rt}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func operations(doc *openapi3.T) []string {
	var ops []string
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			ops = append(ops, op.OperationID)
		}
	}
	sort.Strings(ops)
	return ops
}
