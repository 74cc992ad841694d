package cli_test

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/testutil"
)

// TestMountAddRemove adds a mount to a running sandbox over its virtio-fs
// device and removes it again while a guest process holds a file open, a
// file open for writing and its working directory in it: the guest writes
// reach the host while it is mounted, the profile's rules hold on it, the
// guest path is gone afterwards and every operation on what the process
// held fails without reaching the host; a mount point the profile denies
// is refused. Each change is a record in the sandbox's log.
func TestMountAddRemove(t *testing.T) {
	requireVirtioFS(t)
	prof := writeProfile(t, filesProfile+`    - path: /data/**
      access: rw
    - path: /data/.env
      access: deny
    - path: /nope/**
      access: deny
`)
	v := startSandbox(t, "mount-live", "--profile", prof, "-v", filesDir(t)+":/work")
	data := testutil.WriteTree(t, t.TempDir(), map[string]string{
		".env":     "SECRET\n",
		"held.txt": "HELD\n",
		"w.txt":    "",
		"sub/f":    "sub\n",
	})

	out, err := v.smx("agent", "mount", "add", v.name, data+":/data", "--json")
	if err != nil {
		t.Fatalf("mount add: %v\n%s", err, out)
	}
	var l struct {
		Sandbox string   `json:"sandbox"`
		Mounts  []string `json:"mounts"`
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil || l.Sandbox != v.name || len(l.Mounts) != 2 || l.Mounts[1] != data+":/data" {
		t.Fatalf("mount add --json: %v\n%s", err, out)
	}
	res := v.steps(t, [][2]string{
		{"mounted", "grep -q ' /data virtiofs ' /proc/mounts"},
		{"write", "echo from-guest > /data/new.txt"},
		{"read", "cat /data/sub/f"},
		{"read-env", "cat /data/.env"},
		{"work", "cat /work/src/a.txt"},
	})
	for step, want := range map[string]string{"mounted": "ok", "write": "ok", "read": "ok", "read-env": "No such file", "work": "ok"} {
		if !strings.Contains(res[step], want) {
			t.Errorf("step %s: %q, want %q", step, res[step], want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(data, "new.txt")); string(b) != "from-guest\n" {
		t.Errorf("host new.txt = %q", b)
	}
	expectRefusal(t, v.fileRefusals(t), "walk", "/data/.env", `files.rules\[6\]`)

	// A guest process holds a file open for reading (not read yet, so
	// nothing is in the guest's page cache), one for appending, and its
	// working directory in the mount, then waits for the removal.
	hold := v.cmd("agent", "exec", v.name, "--", "sh", "-c", `cd /data/sub && exec 3</data/held.txt 4>>/data/w.txt || exit 1
echo ready
while [ ! -e /tmp/go ]; do sleep 0.2; done
if cat <&3 >/tmp/r 2>/tmp/re; then echo "read=ok:$(cat /tmp/r)"; else echo "read=fail:$(cat /tmp/re)"; fi
if echo late >&4 2>/tmp/we; then echo write=ok; else echo "write=fail:$(cat /tmp/we)"; fi
if ls . >/dev/null 2>&1; then echo cwd=ok; else echo cwd=fail; fi`)
	stdout, err := hold.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	hold.Stderr = os.Stderr
	if err := hold.Start(); err != nil {
		t.Fatal(err)
	}
	defer hold.Process.Kill()
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || sc.Text() != "ready" {
		t.Fatalf("holder: %q", sc.Text())
	}

	if out, err := v.smx("agent", "mount", "rm", v.name, "/data"); err != nil {
		t.Fatalf("mount rm: %v\n%s", err, out)
	}
	if out, err := v.sh("touch /tmp/go"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	got := map[string]string{}
	for sc.Scan() {
		if k, val, ok := strings.Cut(sc.Text(), "="); ok {
			got[k] = val
		}
	}
	hold.Wait()
	for _, k := range []string{"read", "write", "cwd"} {
		if !strings.HasPrefix(got[k], "fail") {
			t.Errorf("%s on what the guest held in the removed mount: %q, want it to fail", k, got[k])
		}
	}
	if b, _ := os.ReadFile(filepath.Join(data, "w.txt")); len(b) != 0 {
		t.Errorf("host w.txt = %q after the mount was removed", b)
	}
	res = v.steps(t, [][2]string{
		{"unmounted", "! grep ' /data ' /proc/mounts"},
		{"gone", "ls /data"},
		{"create", "mkdir -p /data && echo x > /data/after.txt"},
	})
	if res["unmounted"] != "ok" || !strings.Contains(res["gone"], "No such file") {
		t.Errorf("guest after mount rm: %v", res)
	}
	if _, err := os.Lstat(filepath.Join(data, "after.txt")); err == nil {
		t.Error("a file the guest made at /data after the removal reached the host folder")
	}

	// A mount point the profile denies is refused, with the rule, and
	// recorded as a refusal; so is a guest path already mounted.
	nope := t.TempDir()
	out, err = v.smx("agent", "mount", "add", v.name, nope+":/nope")
	if err == nil || !strings.Contains(out, "profile denies /nope") || strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Errorf("mount add at a denied path: %v\n%s", err, out)
	}
	expectRefusal(t, v.fileRefusals(t), "mount", "/nope", `files.rules\[7\]`)
	if res := v.steps(t, [][2]string{{"nope", "grep ' /nope ' /proc/mounts"}}); res["nope"] == "ok" {
		t.Error("the denied mount is mounted in the guest")
	}
	if out, err := v.smx("agent", "mount", "add", v.name, nope+":/work"); err == nil || !strings.Contains(out, "already mounted") {
		t.Errorf("mount add over /work: %v\n%s", err, out)
	}
	if out, err := v.smx("agent", "mount", "rm", v.name, "/data"); err == nil || !strings.Contains(out, "nothing is mounted at /data") {
		t.Errorf("second mount rm: %v\n%s", err, out)
	}

	logs, err := v.cmd("agent", "logs", v.name, "--json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, line := range strings.Split(strings.TrimSpace(string(logs)), "\n") {
		var r logRecord
		if json.Unmarshal([]byte(line), &r) == nil && strings.HasPrefix(r.Kind, "mount.") {
			if r.f("guest") != "/data" || r.f("host") != data {
				t.Errorf("record %s: %v", r.Kind, r.Fields)
			}
			kinds = append(kinds, r.Kind)
		}
	}
	if strings.Join(kinds, " ") != "mount.add mount.remove" {
		t.Errorf("mount records: %v", kinds)
	}
}
