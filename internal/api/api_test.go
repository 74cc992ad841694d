package api_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"

	wire "github.com/smx-dev/smx/api"
	"github.com/smx-dev/smx/client"
	"github.com/smx-dev/smx/internal/testutil"
)

func mustTar(t testing.TB, name, content string) *bytes.Buffer {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: name, Mode: 0o640, Size: int64(len(content)), Typeflag: tar.TypeReg})
	tw.Write([]byte(content))
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

func wantClass(t testing.TB, what string, err error, status int, class error) {
	t.Helper()
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != status || !errors.Is(err, class) {
		t.Errorf("%s: got %v (%#v), want status %d class %v", what, err, ae, status, class)
	}
}

// TestAPI drives every endpoint of a real `smx serve` with real VMs, and
// checks every answer against api/openapi.yaml.
func TestAPI(t *testing.T) {
	// --debug: every request, the exec upgrade included, goes through
	// the request logger.
	bin, home, sock := vmServer(t, "--debug")
	c, chk := checkedClient(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	const name, fork, snap = "api1", "api1-fork", "api1-snap"
	t.Cleanup(func() {
		c.Remove(context.Background(), fork, true)
		c.Remove(context.Background(), name, true)
		c.RemoveSnapshot(context.Background(), snap)
	})

	// Read-only endpoints.
	if info, err := c.Info(ctx); err != nil || info.API != "v1" {
		t.Fatalf("info: %v %+v", err, info)
	}
	if code, body := raw(t, chk, sock, "GET", "/v1/openapi.yaml", "", nil); code != 200 || !strings.Contains(body, "openapi: 3") {
		t.Errorf("openapi.yaml: %d", code)
	}
	if imgs, err := c.Images(ctx); err != nil || len(imgs) == 0 || imgs[0].Name != "busybox" {
		t.Errorf("images: %v %+v", err, imgs)
	}
	// Images: build, inspect, remove; one in use is kept.
	if im, err := c.BuildImage(ctx, client.ImageRequest{Name: "api-img", From: "busybox"}); err != nil || im.Name != "api-img" || im.Digest == "" {
		t.Errorf("build image: %v %+v", err, im)
	}
	_, err := c.BuildImage(ctx, client.ImageRequest{Name: "api-img", From: "busybox"})
	wantClass(t, "build an image twice", err, 409, client.ErrExists)
	_, err = c.BuildImage(ctx, client.ImageRequest{Name: "api-img2", From: "plan9"})
	wantClass(t, "build from nothing known", err, 400, client.ErrInvalid)
	if im, err := c.InspectImage(ctx, "api-img"); err != nil || im.Source != "busybox" {
		t.Errorf("inspect image: %v %+v", err, im)
	}
	if err := c.RemoveImage(ctx, "api-img"); err != nil {
		t.Errorf("rm image: %v", err)
	}
	_, err = c.InspectImage(ctx, "api-img")
	wantClass(t, "inspect removed image", err, 404, client.ErrNotFound)
	if ps, err := c.Profiles(ctx); err != nil || len(ps) < 3 {
		t.Errorf("profiles: %v %+v", err, ps)
	}
	if p, err := c.ShowProfile(ctx, "locked"); err != nil || p.YAML == "" || p.Hash == "" {
		t.Errorf("show: %v %+v", err, p)
	}
	_, err = c.ShowProfile(ctx, "no-such-profile")
	wantClass(t, "show missing profile", err, 404, client.ErrNotFound)
	if r, err := c.CheckProfile(ctx, "extends: locked\n"); err != nil || !r.OK {
		t.Errorf("check good: %v %+v", err, r)
	}
	if r, err := c.CheckProfile(ctx, "network:\n  mode: sideways\n"); err != nil || r.OK || len(r.Problems) == 0 || !strings.Contains(r.Problems[0], "profile.yaml:") {
		t.Errorf("check bad: %v %+v", err, r)
	}
	if ex, err := c.Explain(ctx, "locked", "https://example.com/"); err != nil || ex.Allow || ex.Rule == "" {
		t.Errorf("explain locked: %v %+v", err, ex)
	}
	if ex, err := c.Explain(ctx, "open", "https://example.com/"); err != nil || !ex.Allow {
		t.Errorf("explain open: %v %+v", err, ex)
	}
	_, err = c.Explain(ctx, "open", "gopher://x")
	wantClass(t, "explain bad request", err, 400, client.ErrInvalid)

	// Approvals (TestApprovalsNetwork in internal/cli holds real flows and
	// answers them through this API): none pending; refusals.
	if l, err := c.Approvals(ctx, ""); err != nil || len(l) != 0 {
		t.Errorf("approvals: %v %v", l, err)
	}
	_, err = c.Answer(ctx, "ap-000000000000", "once")
	wantClass(t, "answer an unknown approval", err, 404, client.ErrNotFound)
	_, err = c.Answer(ctx, "ap-000000000000", "maybe")
	wantClass(t, "answer with a bad decision", err, 400, client.ErrInvalid)

	// Bad bodies are refused cleanly, before anything is created.
	for _, b := range []struct {
		body   string
		status int
	}{
		{`{bad`, 400}, {`{"name":"x","cpus":"two"}`, 400}, {`{"name":"x","bogus":1}`, 400},
		{`{"name":"x"} {"name":"y"}`, 400}, {`{"name":"x","pad":"` + strings.Repeat("a", 2<<20) + `"}`, 413},
	} {
		code, body := raw(t, chk, sock, "POST", "/v1/sandboxes", "application/json", strings.NewReader(b.body))
		if code != b.status || !strings.Contains(body, `"class"`) {
			t.Errorf("POST %.40q: %d %s, want %d", b.body, code, body, b.status)
		}
	}
	if code, _ := raw(t, chk, sock, "GET", "/v1/nope", "", nil); code != 404 {
		t.Errorf("unknown route: %d", code)
	}
	if code, _ := raw(t, chk, sock, "PATCH", "/v1/sandboxes", "", nil); code != 405 {
		t.Errorf("wrong method: %d", code)
	}
	if l, err := c.List(ctx); err != nil {
		t.Fatal(err)
	} else {
		for _, s := range l {
			if s.Name == "x" {
				t.Errorf("a refused create left sandbox x")
			}
		}
	}

	// Lifecycle.
	events := make(chan client.Event, 256)
	evctx, evcancel := context.WithCancel(ctx)
	defer evcancel()
	go c.Events(evctx, []string{name}, func(ev client.Event) error { events <- ev; return nil })

	sb, err := c.Create(ctx, client.CreateRequest{Name: name, Memory: "256M"})
	if err != nil || sb.Status != "created" {
		t.Fatalf("create: %v %+v", err, sb)
	}
	_, err = c.Create(ctx, client.CreateRequest{Name: name})
	wantClass(t, "create twice", err, 409, client.ErrExists)
	// The frozen profile (default dev) and explain against it.
	if p, err := c.SandboxProfile(ctx, name); err != nil || p.Name != "dev" || !strings.Contains(p.YAML, "registry.npmjs.org") {
		t.Errorf("sandbox profile: %v %+v", err, p)
	}
	if ex, err := c.ExplainSandbox(ctx, name, "https://registry.npmjs.org/"); err != nil || !ex.Allow || !strings.Contains(ex.Rule, "dev.yaml:") {
		t.Errorf("explain against the sandbox: %v %+v", err, ex)
	}
	if ex, err := c.ExplainSandbox(ctx, name, "tcp:192.0.2.1:22"); err != nil || ex.Allow {
		t.Errorf("explain a refusal against the sandbox: %v %+v", err, ex)
	}
	_, err = c.SandboxProfile(ctx, "nope")
	wantClass(t, "profile of a missing sandbox", err, 404, client.ErrNotFound)
	_, err = c.ExplainSandbox(ctx, "bad name!", "tcp:192.0.2.1:22")
	wantClass(t, "explain with a bad sandbox name", err, 400, client.ErrInvalid)
	_, err = c.Run(ctx, name, client.ExecRequest{Args: []string{"true"}})
	wantClass(t, "exec on a created sandbox", err, 412, client.ErrFailed)
	// The stream reports the statuses it reads (one that lasts less than
	// a read may be skipped): created lasts until the start below, so it
	// is read, however late a loaded machine gets to it.
	var early []client.Event
	for deadline := time.After(10 * time.Second); len(early) == 0 || early[len(early)-1].Status != "created"; {
		select {
		case ev := <-events:
			early = append(early, ev)
			continue
		case <-deadline:
			t.Fatalf("events: no status created within 10 s of the create: %+v", early)
		}
	}
	if sb, err = c.Start(ctx, name); err != nil || sb.Status != "running" {
		t.Fatalf("start: %v %+v", err, sb)
	}
	_, err = c.Start(ctx, name)
	wantClass(t, "start twice", err, 409, client.ErrExists)
	if sb, err = c.Inspect(ctx, name); err != nil || len(sb.QEMUArgs) == 0 {
		t.Errorf("inspect: %v %+v", err, sb)
	}
	_, err = c.Inspect(ctx, "nope")
	wantClass(t, "inspect missing", err, 404, client.ErrNotFound)
	_, err = c.Inspect(ctx, "bad name!")
	wantClass(t, "inspect bad name", err, 400, client.ErrInvalid)
	err = c.Remove(ctx, name, false)
	wantClass(t, "rm running without force", err, 409, client.ErrInUse)

	// Published ports: bound by the live supervisor, listed, a taken host
	// port refused as in use, non-loopback refused unless asked, withdrawn.
	pl, err := c.AddPort(ctx, name, client.PortRequest{Port: "0:8000"})
	if err != nil || !pl.Running || len(pl.Ports) != 1 || pl.Ports[0].Bound == 0 || pl.Ports[0].HostIP != "127.0.0.1" {
		t.Fatalf("add port: %v %+v", err, pl)
	}
	bound := strconv.Itoa(pl.Ports[0].Bound)
	_, err = c.AddPort(ctx, name, client.PortRequest{Port: bound + ":8001"})
	wantClass(t, "publish a bound host port", err, 409, client.ErrInUse)
	_, err = c.AddPort(ctx, name, client.PortRequest{Port: "0.0.0.0:0:8000"})
	wantClass(t, "publish 0.0.0.0 without publish_external", err, 400, client.ErrInvalid)
	if pl, err = c.Ports(ctx, name); err != nil || len(pl.Ports) != 1 {
		t.Fatalf("ports: %v %+v", err, pl)
	}
	if pl, err = c.RemovePort(ctx, name, bound); err != nil || len(pl.Ports) != 0 {
		t.Fatalf("remove port: %v %+v", err, pl)
	}
	_, err = c.RemovePort(ctx, name, bound)
	wantClass(t, "remove a port not published", err, 404, client.ErrNotFound)
	// Mounts on a running sandbox ride its virtio-fs device, which a
	// sandbox started without a mount lacks (TestMountAddRemove in
	// internal/cli adds and removes one on a sandbox that has it).
	_, err = c.AddMount(ctx, name, client.MountRequest{Mount: t.TempDir() + ":/data"})
	wantClass(t, "mount add without the virtio-fs device", err, 503, client.ErrUnavailable)
	_, err = c.AddMount(ctx, name, client.MountRequest{Mount: "/no/such/dir:/data"})
	wantClass(t, "mount add of a missing folder", err, 400, client.ErrInvalid)
	_, err = c.AddMount(ctx, "nope", client.MountRequest{Mount: t.TempDir() + ":/data"})
	wantClass(t, "mount add to a missing sandbox", err, 404, client.ErrNotFound)
	_, err = c.RemoveMount(ctx, name, "data")
	wantClass(t, "mount rm of a relative path", err, 400, client.ErrInvalid)
	_, err = c.RemoveMount(ctx, name, "/data")
	wantClass(t, "mount rm without the virtio-fs device", err, 503, client.ErrUnavailable)
	err = c.RemoveImage(ctx, "busybox")
	wantClass(t, "rm an image in use", err, 409, client.ErrInUse)
	if l, err := c.List(ctx); err != nil || len(l) == 0 {
		t.Errorf("ls: %v %+v", err, l)
	}

	// Buffered exec.
	r, err := c.Run(ctx, name, client.ExecRequest{Args: []string{"sh", "-c", "echo out; echo err >&2; cat; exit 3"}, StdinData: "in\n"})
	if err != nil || r.ExitCode != 3 || r.Stdout != "out\nin\n" || r.Stderr != "err\n" {
		t.Errorf("run: %v %+v", err, r)
	}
	_, err = c.Run(ctx, name, client.ExecRequest{Args: []string{"/no/such/cmd"}})
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.ExitCode != 127 || ae.Status != 412 || !strings.Contains(ae.Message, "/no/such/cmd") ||
		strings.Contains(ae.Message, "failed precondition") || strings.HasPrefix(ae.Message, "guest:") {
		t.Errorf("run missing command: %v %#v", err, ae)
	}
	_, err = c.Run(ctx, name, client.ExecRequest{})
	wantClass(t, "run without args", err, 400, client.ErrInvalid)

	// Streaming exec: stdin, stdout, stderr, exit status.
	chk.mark("execStream")
	var stdout, stderr bytes.Buffer
	st, err := c.Exec(ctx, name, client.ExecRequest{Args: []string{"sh", "-c", "tr a-z A-Z; echo done >&2; exit 5"}},
		client.ExecIO{Stdin: strings.NewReader("hello api\n"), Stdout: &stdout, Stderr: &stderr})
	if err != nil || st.Code != 5 || stdout.String() != "HELLO API\n" || stderr.String() != "done\n" {
		t.Errorf("exec: %v %+v %q %q", err, st, stdout.String(), stderr.String())
	}
	_, err = c.Exec(ctx, name, client.ExecRequest{Args: []string{"/no/such/cmd"}}, client.ExecIO{})
	var ee *client.ExecError
	if !errors.As(err, &ee) || ee.ExitCode != 127 {
		t.Errorf("exec missing command: %v", err)
	}
	_, err = c.Exec(ctx, "nope", client.ExecRequest{Args: []string{"true"}}, client.ExecIO{})
	wantClass(t, "exec on a missing sandbox", err, 404, client.ErrNotFound)

	// Signals reach the process; a TTY works.
	t.Run("signal", func(t *testing.T) {
		pr, pw := io.Pipe()
		sigs := make(chan int, 1)
		go func() {
			buf := make([]byte, 64)
			var seen string
			for !strings.Contains(seen, "ready") {
				n, err := pr.Read(buf)
				if err != nil {
					return
				}
				seen += string(buf[:n])
			}
			sigs <- 15
			io.Copy(io.Discard, pr)
		}()
		var out bytes.Buffer
		st, err := c.Exec(ctx, name, client.ExecRequest{Args: []string{"sh", "-c", `trap 'echo got TERM; exit 7' TERM; echo ready; while :; do sleep 0.1; done`}},
			client.ExecIO{Stdout: io.MultiWriter(pw, &out), Signal: sigs})
		pw.Close()
		if err != nil || st.Code != 7 || !strings.Contains(out.String(), "got TERM") {
			t.Errorf("signal: %v %+v %q", err, st, out.String())
		}
		var tty bytes.Buffer
		st, err = c.Exec(ctx, name, client.ExecRequest{Args: []string{"sh", "-c", "test -t 0 && stty size"}, TTY: true, Rows: 33, Cols: 101},
			client.ExecIO{Stdin: strings.NewReader(""), Stdout: &tty})
		if err != nil || st.Code != 0 || !strings.Contains(tty.String(), "33 101") {
			t.Errorf("tty: %v %+v %q", err, st, tty.String())
		}
		// A resize reaches the terminal while the command runs.
		inR, inW := io.Pipe()
		resize := make(chan [2]uint16, 1)
		var tty2 bytes.Buffer
		go func() {
			resize <- [2]uint16{40, 120}
			time.Sleep(500 * time.Millisecond)
			inW.Write([]byte("go\n"))
			inW.Close()
		}()
		st, err = c.Exec(ctx, name, client.ExecRequest{Args: []string{"sh", "-c", "read x; stty size"}, TTY: true, Rows: 10, Cols: 20},
			client.ExecIO{Stdin: inR, Stdout: &tty2, Resize: resize})
		if err != nil || st.Code != 0 || !strings.Contains(tty2.String(), "40 120") {
			t.Errorf("resize: %v %+v %q", err, st, tty2.String())
		}
	})

	// Concurrent requests on one sandbox.
	t.Run("concurrent", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if i%2 == 0 {
					r, err := c.Run(ctx, name, client.ExecRequest{Args: []string{"echo", strconv.Itoa(i)}})
					if err != nil || r.Stdout != fmt.Sprintf("%d\n", i) {
						t.Errorf("run %d: %v %+v", i, err, r)
					}
					return
				}
				var out bytes.Buffer
				st, err := c.Exec(ctx, name, client.ExecRequest{Args: []string{"sh", "-c", fmt.Sprintf("seq 1 %d", 1000*i)}}, client.ExecIO{Stdout: &out})
				if err != nil || st.Code != 0 || strings.Count(out.String(), "\n") != 1000*i {
					t.Errorf("exec %d: %v %+v lines %d", i, err, st, strings.Count(out.String(), "\n"))
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Inspect(ctx, name); err != nil {
				t.Error(err)
			}
		}()
		wg.Wait()
	})

	// A client that goes away mid-exec: the guest process is killed.
	t.Run("disconnect", func(t *testing.T) {
		c.Run(ctx, name, client.ExecRequest{Args: []string{"true"}}) // the client's connection pool is warm
		fds := openFDs(t, sock)
		dctx, dcancel := context.WithCancel(ctx)
		pid := make(chan int, 1)
		done := make(chan error, 1)
		go func() {
			_, err := c.Exec(dctx, name, client.ExecRequest{Args: []string{"sleep", "1000"}}, client.ExecIO{Started: func(p int) { pid <- p }})
			done <- err
		}()
		var p int
		select {
		case p = <-pid:
		case err := <-done:
			t.Fatalf("exec ended early: %v", err)
		case <-time.After(60 * time.Second):
			t.Fatal("no started message")
		}
		check := func() string {
			r, err := c.Run(ctx, name, client.ExecRequest{Args: []string{"sh", "-c", fmt.Sprintf("cat /proc/%d/cmdline 2>/dev/null | tr '\\0' ' '", p)}})
			if err != nil {
				t.Fatal(err)
			}
			return r.Stdout
		}
		if got := check(); !strings.Contains(got, "sleep 1000") {
			t.Fatalf("process %d is not the sleep: %q", p, got)
		}
		if during := openFDs(t, sock); during <= fds {
			t.Fatalf("smx serve holds %d descriptors during the exec, %d before: the count sees nothing", during, fds)
		}
		dcancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("exec after cancel: %v", err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for check() != "" {
			if time.Now().After(deadline) {
				t.Fatalf("guest process %d still runs after its client left", p)
			}
			time.Sleep(200 * time.Millisecond)
		}
		// Nothing of the exec stays open in the server: neither the
		// client's connection nor the stream to the supervisor.
		for deadline := time.Now().Add(10 * time.Second); openFDs(t, sock) > fds; {
			if time.Now().After(deadline) {
				t.Fatalf("smx serve holds %d descriptors after the exec, %d before", openFDs(t, sock), fds)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	// File copy, both ways.
	n, err := c.CopyIn(ctx, name, "/tmp", mustTar(t, "api-file.txt", "copied in\n"))
	if err != nil || n == 0 {
		t.Fatalf("copy in: %v %d", err, n)
	}
	if r, err := c.Run(ctx, name, client.ExecRequest{Args: []string{"sh", "-c", "stat -c %a /tmp/api-file.txt; cat /tmp/api-file.txt"}}); err != nil || r.Stdout != "640\ncopied in\n" {
		t.Errorf("after copy in: %v %+v", err, r)
	}
	rc, err := c.CopyOut(ctx, name, "/tmp/api-file.txt")
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(rc)
	h, err := tr.Next()
	if err != nil || h.Name != "api-file.txt" {
		t.Fatalf("copy out: %v %+v", err, h)
	}
	if b, _ := io.ReadAll(tr); string(b) != "copied in\n" {
		t.Errorf("copy out content %q", b)
	}
	rc.Close()
	_, err = c.CopyOut(ctx, name, "/no/such/file")
	if err == nil {
		t.Errorf("copy out of a missing file succeeded")
	}
	if code, _ := raw(t, chk, sock, "PUT", "/v1/sandboxes/"+name+"/files?path=relative", "application/x-tar", strings.NewReader("")); code != 400 {
		t.Errorf("copy in to a relative path: %d", code)
	}

	// Policy change on a running sandbox.
	if pr, err := c.SetPolicy(ctx, name, "locked"); err != nil || !pr.Applied {
		t.Errorf("policy: %v %+v", err, pr)
	}
	if sb, err := c.Inspect(ctx, name); err != nil || sb.Profile != "locked" {
		t.Errorf("after policy: %v %+v", err, sb)
	}
	// A refused connection under the new profile: a refusal event.
	if _, err := c.Run(ctx, name, client.ExecRequest{Args: []string{"sh", "-c", "nslookup evil.example || true"}}); err != nil {
		t.Fatal(err)
	}
	_, err = c.SetPolicy(ctx, name, "no-such-profile")
	wantClass(t, "policy missing profile", err, 404, client.ErrNotFound)

	// Pause, resume.
	if sb, err := c.Pause(ctx, name); err != nil || sb.Status != "paused" {
		t.Errorf("pause: %v %+v", err, sb)
	}
	_, err = c.Run(ctx, name, client.ExecRequest{Args: []string{"true"}})
	wantClass(t, "exec on a paused sandbox", err, 412, client.ErrFailed)
	_, err = c.Exec(ctx, name, client.ExecRequest{Args: []string{"true"}}, client.ExecIO{})
	wantClass(t, "streaming exec on a paused sandbox", err, 412, client.ErrFailed)
	if sb, err := c.Resume(ctx, name); err != nil || sb.Status != "running" {
		t.Errorf("resume: %v %+v", err, sb)
	}

	// Logs: read, follow, verify.
	var kinds []string
	if err := c.Logs(ctx, name, client.LogOptions{}, func(r client.Record) error { kinds = append(kinds, r.Kind); return nil }); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(kinds, " "), "sandbox.create") || !strings.Contains(strings.Join(kinds, " "), "exec.start") {
		t.Errorf("log kinds: %v", kinds)
	}
	fctx, fcancel := context.WithTimeout(ctx, 60*time.Second)
	followed := make(chan string, 64)
	go c.Logs(fctx, name, client.LogOptions{Follow: true, Since: time.Now()}, func(r client.Record) error {
		if args, _ := r.Fields["args"].([]any); len(args) > 0 {
			followed <- fmt.Sprint(args...)
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond)
	c.Run(ctx, name, client.ExecRequest{Args: []string{"echo", "followme"}})
	select {
	case a := <-followed:
		if !strings.Contains(a, "followme") {
			t.Errorf("followed record args %q", a)
		}
	case <-fctx.Done():
		t.Errorf("log follow saw no new exec record")
	}
	fcancel()
	if rep, err := c.VerifyLog(ctx, name); err != nil || !rep.OK || rep.Records == 0 || rep.Key != "pinned" {
		t.Errorf("verify (want ok, against the pinned key): %v %+v", err, rep)
	}
	_, err = c.VerifyLog(ctx, "never-existed")
	wantClass(t, "verify missing log", err, 404, client.ErrNotFound)
	err = c.Logs(ctx, "never-existed", client.LogOptions{}, func(client.Record) error { return nil })
	wantClass(t, "logs missing", err, 404, client.ErrNotFound)

	// Snapshot and fork.
	sn, err := c.Snapshot(ctx, name, client.SnapshotRequest{Name: snap})
	if err != nil || sn.Name != snap || sn.MemoryStateBytes == 0 {
		t.Fatalf("snapshot: %v %+v", err, sn)
	}
	_, err = c.Snapshot(ctx, name, client.SnapshotRequest{Name: snap})
	wantClass(t, "snapshot twice", err, 409, client.ErrExists)
	if l, err := c.Snapshots(ctx); err != nil || len(l) == 0 {
		t.Errorf("snapshots: %v %+v", err, l)
	}
	if sn, err := c.GetSnapshot(ctx, snap, true); err != nil || !sn.Verified {
		t.Errorf("snapshot verify: %v %+v", err, sn)
	}
	// Through a registry and back (TestSnapshotMovesBetweenHosts and
	// TestTemplateMovesBetweenHosts move them between hosts).
	regSrv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer regSrv.Close()
	reg := strings.TrimPrefix(regSrv.URL, "http://")
	logKey, err := testutil.SmxCmd(bin, home, "logs", "export-key").Output()
	if err != nil {
		t.Fatalf("logs export-key: %v", err)
	}
	keys := []string{strings.TrimSpace(string(logKey))}
	if pr, err := c.PushSnapshot(ctx, snap, client.PushRequest{Ref: reg + "/api/snap:1"}); err != nil || pr.Kind != "snapshot" || pr.BytesSent == 0 || len(pr.Layers) < 5 {
		t.Errorf("push snapshot: %v %+v", err, pr)
	}
	if pl, err := c.PullSnapshot(ctx, client.PullRequest{Ref: reg + "/api/snap:1", Name: snap + "-pulled", Keys: keys}); err != nil || pl.Snapshot != snap+"-pulled" || pl.Bytes == 0 {
		t.Errorf("pull snapshot: %v %+v", err, pl)
	} else if err := c.RemoveSnapshot(ctx, snap+"-pulled"); err != nil {
		t.Errorf("rm pulled snapshot: %v", err)
	}
	_, err = c.PullTemplate(ctx, client.PullRequest{Ref: reg + "/api/snap:1", Keys: keys})
	wantClass(t, "pull a snapshot as a template", err, 400, client.ErrInvalid)
	_, err = c.PushTemplate(ctx, "tpl-no-such", client.PushRequest{Ref: reg + "/api/tpl:1"})
	wantClass(t, "push a missing template", err, 404, client.ErrNotFound)
	if tpls, _ := c.Templates(ctx); len(tpls) > 0 {
		if pr, err := c.PushTemplate(ctx, tpls[0].Name, client.PushRequest{Ref: reg + "/api/tpl:1"}); err != nil || pr.Kind != "template" {
			t.Errorf("push template: %v %+v", err, pr)
		}
		// This host has it: nothing is fetched.
		if pl, err := c.PullTemplate(ctx, client.PullRequest{Ref: reg + "/api/tpl:1", Keys: keys}); err != nil || !pl.Present || pl.Snapshot != tpls[0].Name {
			t.Errorf("pull template: %v %+v", err, pl)
		}
	}
	_, err = c.PushSnapshot(ctx, "no-such-snap", client.PushRequest{Ref: reg + "/api/x:1"})
	wantClass(t, "push a missing snapshot", err, 404, client.ErrNotFound)

	fsb, err := c.Fork(ctx, snap, client.ForkRequest{Name: fork, IdleStop: "2h"})
	if err != nil || fsb.Status != "running" || fsb.Snapshot != snap {
		t.Fatalf("fork: %v %+v", err, fsb)
	}
	if fsb.IdleStop != "2h" || fsb.Timeout != "" {
		t.Errorf("fork with idle_stop 2h: idle_stop %q, timeout %q", fsb.IdleStop, fsb.Timeout)
	}
	if r, err := c.Run(ctx, fork, client.ExecRequest{Args: []string{"cat", "/tmp/api-file.txt"}}); err != nil || r.Stdout != "copied in\n" {
		t.Errorf("fork has the file: %v %+v", err, r)
	}
	err = c.RemoveSnapshot(ctx, snap)
	wantClass(t, "rm snapshot in use", err, 409, client.ErrInUse)
	if err := c.Remove(ctx, fork, true); err != nil {
		t.Errorf("rm fork: %v", err)
	}
	if err := c.RemoveSnapshot(ctx, snap); err != nil {
		t.Errorf("rm snapshot: %v", err)
	}
	_, err = c.GetSnapshot(ctx, snap, false)
	wantClass(t, "get removed snapshot", err, 404, client.ErrNotFound)

	// Suspend and resume with its processes; stop and start.
	if _, err := c.Run(ctx, name, client.ExecRequest{Args: []string{"sh", "-c", "echo kept > /dev/shm/mark"}}); err != nil {
		t.Fatal(err)
	}
	if sb, err := c.Suspend(ctx, name); err != nil || sb.Status != "suspended" {
		t.Fatalf("suspend: %v %+v", err, sb)
	}
	if sb, err := c.Resume(ctx, name); err != nil || sb.Status != "running" {
		t.Fatalf("resume suspended: %v %+v", err, sb)
	}
	if r, err := c.Run(ctx, name, client.ExecRequest{Args: []string{"cat", "/dev/shm/mark"}}); err != nil || r.Stdout != "kept\n" {
		t.Errorf("memory after suspend: %v %+v", err, r)
	}
	if sb, err := c.Stop(ctx, name, 10*time.Second); err != nil || sb.Status != "stopped" {
		t.Errorf("stop: %v %+v", err, sb)
	}
	_, err = c.Pause(ctx, name)
	wantClass(t, "pause a stopped sandbox", err, 412, client.ErrFailed)
	if err := c.Remove(ctx, name, false); err != nil {
		t.Errorf("rm stopped: %v", err)
	}
	_, err = c.Inspect(ctx, name)
	wantClass(t, "inspect removed", err, 404, client.ErrNotFound)
	// The log outlives the sandbox.
	if rep, err := c.VerifyLog(ctx, name); err != nil || !rep.OK || !rep.Closed {
		t.Errorf("verify after rm: %v %+v", err, rep)
	}

	// Events saw the lifecycle as it happened: every persisting status
	// (a brief one between two polls may be skipped) and every lifecycle
	// record (never skipped).
	var statuses, records []string
	refusal := false
	seen := func(list []string, want string) bool {
		return strings.Contains(" "+strings.Join(list, " ")+" ", " "+want+" ")
	}
	note := func(ev client.Event) {
		if ev.Type == "status" {
			statuses = append(statuses, ev.Status)
		} else {
			records = append(records, ev.Record.Kind)
			refusal = refusal || ev.Refusal
		}
	}
	for _, ev := range early {
		note(ev)
	}
	for deadline := time.After(30 * time.Second); !seen(statuses, "removed") || !seen(records, "sandbox.remove"); {
		select {
		case ev := <-events:
			note(ev)
			continue
		case <-deadline:
		}
		break
	}
	evcancel()
	if !refusal {
		t.Errorf("events: no refusal among %v", records)
	}
	for _, want := range []string{"created", "running", "suspended", "stopped", "removed"} {
		if !seen(statuses, want) {
			t.Errorf("events: no status %s in %v", want, statuses)
		}
	}
	for _, want := range []string{"sandbox.create", "sandbox.start", "profile.change", "sandbox.pause", "sandbox.resume",
		"snapshot.create", "sandbox.suspend", "sandbox.stop", "sandbox.remove"} {
		if !seen(records, want) {
			t.Errorf("events: no record %s in %v", want, records)
		}
	}
	chk.mark("events")

	// Agents (TestAgentAPI launches real ones): refusals.
	_, err = c.RunAgent(ctx, client.AgentRequest{Preset: "nosuch", Workspace: "/"}, nil)
	wantClass(t, "agent of an unknown preset", err, 404, client.ErrNotFound)
	_, err = c.Agent(ctx, "no-such-agent")
	wantClass(t, "inspect a missing agent", err, 404, client.ErrNotFound)

	// Credentials (TestCredsAPI checks no answer holds a value).
	if _, err := c.SetCredential(ctx, "api-test-cred", []byte("v4lue")); err != nil {
		t.Errorf("set credential: %v", err)
	}
	if l, err := c.Credentials(ctx); err != nil || !slices.ContainsFunc(l, func(c client.Credential) bool { return c.Name == "api-test-cred" }) {
		t.Errorf("credentials: %v %+v", err, l)
	}
	if err := c.RemoveCredential(ctx, "api-test-cred"); err != nil {
		t.Errorf("rm credential: %v", err)
	}
	_, err = c.Login(ctx, client.LoginRequest{Preset: "shell", Key: "k"})
	wantClass(t, "login to a preset without a credential", err, 400, client.ErrInvalid)

	// The SSH user CA (TestSSHCAAPI checks a rotation).
	if ca, err := c.SSHUserCA(ctx); err != nil || ca.Fingerprint == "" {
		t.Errorf("ssh-ca: %v %+v", err, ca)
	}
	if ca, err := c.RotateSSHUserCA(ctx); err != nil || ca.Replaced == "" {
		t.Errorf("ssh-ca rotate: %v %+v", err, ca)
	}

	// Kernels and the host (TestHostAPI checks more).
	if ks, err := c.Kernels(ctx); err != nil || len(ks) == 0 || !ks[0].Default {
		t.Errorf("kernels: %v %+v", err, ks)
	}
	_, err = c.BuildKernel(ctx, wire.KernelBuildRequest{Jobs: -1})
	wantClass(t, "build a kernel with -1 jobs", err, 400, client.ErrInvalid)
	err = c.RemoveKernel(ctx, "0.0.0-no-such")
	wantClass(t, "rm a kernel not cached", err, 404, client.ErrNotFound)
	if rep, err := c.Doctor(ctx); err != nil || !rep.OK || rep.Accel == "" {
		t.Errorf("doctor: %v %+v", err, rep)
	}

	// Templates and logs (TestTemplatesLogsAPI checks more).
	if _, err := c.Templates(ctx); err != nil {
		t.Errorf("templates: %v", err)
	}
	err = c.RemoveTemplate(ctx, "tpl-no-such")
	wantClass(t, "rm a missing template", err, 404, client.ErrNotFound)
	if l, err := c.LogNames(ctx); err != nil || len(l) == 0 {
		t.Errorf("log names: %v %v", err, l)
	}
	_, err = c.PruneLogs(ctx, []string{"../" + name}, false)
	wantClass(t, "prune a log named by a path", err, 400, client.ErrInvalid)

	// Every operation in the document was exercised.
	doc, _ := openAPI(t)
	for _, op := range operations(doc) {
		if _, ok := chk.seen.Load(op); !ok {
			t.Errorf("operation %s was not exercised", op)
		}
	}
	_ = http.StatusOK
}
