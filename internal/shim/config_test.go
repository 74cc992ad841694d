package shim

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	runtimeoptions "github.com/containerd/containerd/pkg/runtimeoptions/v1"
	ptypes "github.com/containerd/containerd/protobuf/types"
	"github.com/containerd/typeurl/v2"

	"github.com/smx-dev/smx/internal/errdefs"
)

// TestPodProfiles: the node decides which profiles a pod's annotation may
// name. Without settings only locked and dev (never open, an installed
// profile or a file path); a settings file (in the state directory, or
// named by containerd's runtime option ConfigPath) widens or narrows it;
// "*" admits names, never paths; a refusal says what to do.
func TestPodProfiles(t *testing.T) {
	state := t.TempDir()
	ann := func(p string) map[string]string { return map[string]string{ProfileAnnotation: p} }
	check := func(c *Config, profile string, ok bool) {
		t.Helper()
		got, err := c.podProfile(ann(profile))
		if ok && (err != nil || (got != profile && profile != "")) {
			t.Fatalf("profile %q: %q, %v; want it admitted", profile, got, err)
		}
		if !ok {
			if !errors.Is(err, errdefs.ErrDenied) {
				t.Fatalf("profile %q: %q, %v; want it refused", profile, got, err)
			}
			if !strings.Contains(err.Error(), "pod_profiles") || !strings.Contains(err.Error(), profile) {
				t.Fatalf("refusal does not say what to change: %v", err)
			}
			t.Logf("refused: %v", err)
		}
	}

	def, err := loadConfig(state, nil)
	if err != nil {
		t.Fatal(err)
	}
	check(def, "", true) // the default profile, locked
	check(def, "locked", true)
	check(def, "dev", true)
	for _, p := range []string{"open", "podfiles", "/etc/smx/wide.yaml", "../profiles/open"} {
		check(def, p, false)
	}

	// The state directory's file.
	write := func(p, body string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(state, ConfigFile), "pod_profiles: [locked, podfiles]\n")
	c, err := loadConfig(state, nil)
	if err != nil {
		t.Fatal(err)
	}
	check(c, "podfiles", true)
	check(c, "dev", false)
	check(c, "open", false)

	// "*": any name, no path.
	write(filepath.Join(state, ConfigFile), "pod_profiles: ['*']\n")
	if c, err = loadConfig(state, nil); err != nil {
		t.Fatal(err)
	}
	check(c, "open", true)
	check(c, "podfiles", true)
	check(c, "/tmp/x.yaml", false)

	// containerd's runtime option ConfigPath names another file.
	other := filepath.Join(t.TempDir(), "smx-open.yaml")
	write(other, "pod_profiles: [open, /etc/smx/wide.yaml]\n")
	opts, err := typeurl.MarshalAny(&runtimeoptions.Options{ConfigPath: other})
	if err != nil {
		t.Fatal(err)
	}
	a := &ptypes.Any{TypeUrl: opts.GetTypeUrl(), Value: opts.GetValue()}
	if c, err = loadConfig(state, a); err != nil {
		t.Fatal(err)
	}
	check(c, "open", true)
	check(c, "/etc/smx/wide.yaml", true)
	check(c, "dev", false)

	// A file that is named but missing, or wrong, runs nothing.
	if _, err := loadConfig(state, mustAny(t, filepath.Join(state, "missing.yaml"))); err == nil {
		t.Fatal("a missing ConfigPath file was accepted")
	}
	write(filepath.Join(state, ConfigFile), "pod_profile: [open]\n")
	if _, err := loadConfig(state, nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("a misspelt setting: %v, want ErrInvalid", err)
	}
}

func mustAny(t *testing.T, path string) *ptypes.Any {
	t.Helper()
	o, err := typeurl.MarshalAny(&runtimeoptions.Options{ConfigPath: path})
	if err != nil {
		t.Fatal(err)
	}
	return &ptypes.Any{TypeUrl: o.GetTypeUrl(), Value: o.GetValue()}
}
