package cli_test

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestAgentRunPublish: `smx agent run -p` publishes the dev server the
// agent starts (a node HTTP server in the claude preset's image, standing
// in for the agent's `npm run dev`), reached from the host; the
// connection is a port.accept record, and 0.0.0.0 without
// --publish-external is refused before anything is built or booted.
func TestAgentRunPublish(t *testing.T) {
	server := `command: [node, -e, "require('http').createServer((q, s) => s.end('dev server of the agent\\n')).listen(5173)"]`
	bin, home := claudeStandIn(t, server)

	v := &vmEnv{t: t, bin: bin, home: home}
	const name = "pub-agent"
	t.Cleanup(func() { v.smx("agent", "rm", "-f", name) })
	work := t.TempDir()

	out, err := v.smx("agent", "run", "claude", work, "-d", "--name", name, "-p", "0.0.0.0:0:5173")
	if err == nil || !strings.Contains(out, "add --publish-external") {
		t.Fatalf("0.0.0.0 without --publish-external: %v\n%s", err, out)
	}
	if ls, _ := v.smx("agent", "ls"); strings.Contains(ls, name) {
		t.Fatalf("a refused -p left a sandbox:\n%s", ls)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	out, err = v.smx("agent", "run", "claude", work, "-d", "--name", name, "--memory", "512M", "-p", port+":5173")
	if err != nil || !strings.Contains(out, "smx: published 5173/tcp -> 127.0.0.1:"+port+"\n") {
		t.Fatalf("agent run -p: %v\n%s", err, out)
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var body []byte
	for end := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Second) {
		if resp, err := c.Get("http://127.0.0.1:" + port + "/"); err == nil {
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(body) == "dev server of the agent\n" {
				break
			}
		}
		if time.Now().After(end) {
			t.Fatalf("the agent's dev server was not reached through 127.0.0.1:%s (last body %q)", port, body)
		}
	}
	logs, _ := v.smx("agent", "logs", name)
	if !strings.Contains(logs, "port.accept") || !strings.Contains(logs, `host="127.0.0.1:`+port+`"`) {
		t.Errorf("no port.accept record:\n%s", logs)
	}
}
