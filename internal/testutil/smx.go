package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

var (
	smxHomeOnce sync.Once
	smxHome     string
	smxHomeErr  error
)

// SmxHome is a state directory shared by one test binary's VM tests: the
// cached guest kernels linked in and a busybox image built once. The
// caller removes what it creates; CleanupSmxHome (from TestMain) removes
// any sandbox left and the directory.
func SmxHome(t testing.TB, bin string) string {
	t.Helper()
	RequireQEMU(t)
	kernels := KernelCache(t)
	smxHomeOnce.Do(func() {
		smxHome, smxHomeErr = os.MkdirTemp("", "smx-home-")
		if smxHomeErr != nil {
			return
		}
		if smxHomeErr = os.Symlink(kernels, filepath.Join(smxHome, "kernels")); smxHomeErr != nil {
			return
		}
		cmd := SmxCmd(bin, smxHome, "image", "build", "busybox", "--from", "busybox")
		if out, err := cmd.CombinedOutput(); err != nil {
			smxHomeErr = fmt.Errorf("build busybox image: %v\n%s", err, out)
		}
	})
	if smxHomeErr != nil {
		t.Fatal(smxHomeErr)
	}
	return smxHome
}

// SmxCmd is bin/smx with args against the state directory home (log key
// pins kept beside it).
func SmxCmd(bin, home string, args ...string) *exec.Cmd {
	c := exec.Command(filepath.Join(bin, "smx"), args...)
	c.Env = append(os.Environ(), "SMX_HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, ".config"))
	return c
}

// CleanupSmxHome removes every sandbox left in SmxHome's directory (so
// no VM outlives the test binary), then the directory.
func CleanupSmxHome(bin string) {
	if smxHome == "" {
		return
	}
	ents, _ := os.ReadDir(filepath.Join(smxHome, "sandboxes"))
	for _, e := range ents {
		if e.IsDir() && e.Name()[0] != '.' {
			SmxCmd(bin, smxHome, "agent", "rm", "-f", e.Name()).Run()
		}
	}
	time.Sleep(100 * time.Millisecond)
	os.RemoveAll(smxHome)
}

// AwaitSandboxesGone registers a cleanup, run before t.TempDir's removal
// of home when called after it, that waits for the supervisors of
// throwaway sandboxes to finish retiring them: `smx run` returns with the
// command's status while its supervisor still removes the sandbox's
// directory, and removing home under it would race. Sandboxes still there
// after a minute are force-removed.
func AwaitSandboxesGone(t testing.TB, bin, home string) {
	t.Helper()
	t.Cleanup(func() {
		dir := filepath.Join(home, "sandboxes")
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if len(liveEntries(dir)) == 0 {
				return
			}
		}
		for _, name := range liveEntries(dir) {
			SmxCmd(bin, home, "agent", "rm", "-f", name).Run()
		}
		if left := liveEntries(dir); len(left) > 0 {
			t.Errorf("sandboxes left in %s after a minute and rm -f: %v", dir, left)
		}
	})
}

// liveEntries names dir's entries but the table's lock file: a sandbox
// or a tombstone (dot name) means a supervisor is still at work.
func liveEntries(dir string) []string {
	ents, _ := os.ReadDir(dir)
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		if e.Name() != ".lock" {
			names = append(names, e.Name())
		}
	}
	return names
}
