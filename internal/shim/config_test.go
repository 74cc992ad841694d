package shim

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	runtimeoptions "github.com/containerd/containerd/pkg/runtimeoptions/v1"
	ptypes "github.com/containerd/containerd/protobuf/types"
	"github.com/containerd/typeurl/v2"
	"golang.org/x/mod/sumdb/note"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/ocisnap"
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

// TestPodRestoreFrom: the node decides which registries and repositories
// a pod may be restored from, and whose signatures count. By default none;
// a prefix admits whole path components only (team admits team/x, never
// team-b/x nor another registry's team/x); an entry without a registry
// host, or with a tag, does not load; a node with prefixes but no key
// refuses too; every refusal says what to change, and where.
func TestPodRestoreFrom(t *testing.T) {
	state := t.TempDir()
	ann := func(ref string) map[string]string { return map[string]string{FromSnapshotAnnotation: ref} }
	check := func(c *Config, ref string, ok bool, want string) {
		t.Helper()
		_, got, err := c.restoreRef(ann(ref))
		if ok {
			if err != nil || got == nil {
				t.Fatalf("ref %q: %v, %v; want it admitted", ref, got, err)
			}
			return
		}
		if !errors.Is(err, errdefs.ErrDenied) && !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("ref %q: %v, %v; want it refused", ref, got, err)
		}
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("ref %q: refusal %q does not say %q", ref, err, want)
		}
		t.Logf("refused: %v", err)
	}
	write := func(body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(state, ConfigFile), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	def, err := loadConfig(state, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, got, err := def.restoreRef(map[string]string{}); got != nil || err != nil {
		t.Fatalf("no annotation: %v, %v", got, err)
	}
	check(def, "registry.example.com/agents/base:1", false, "lets no pod restore from a registry: ask the node's owner to add the repository to pod_restore_from in "+filepath.Join(state, ConfigFile))

	_, vkey, err := note.GenerateKey(rand.Reader, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	write("pod_restore_from: [registry.example.com/team/, 'localhost:5000', docker.io/acme/agents]\npod_restore_keys: ['" + vkey + "']\n")
	c, err := loadConfig(state, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{
		"registry.example.com/team/snap:1",
		"registry.example.com/team/a/b@sha256:" + strings.Repeat("ab", 32),
		"localhost:5000/anything/at/all:latest",
		"docker.io/acme/agents:v2",
		"acme/agents:v2", // Docker Hub by its short form
		"index.docker.io/acme/agents/sub:v2",
	} {
		check(c, ref, true, "")
	}
	for _, ref := range []string{
		"registry.example.com/team-b/snap:1",    // a sibling with the prefix's letters
		"registry.example.com/teamsnap:1",       // no component boundary
		"registry.example.com/snap:1",           // above the prefix
		"registry.example.com.evil.test/team/x", // another host that starts alike
		"evil.test/registry.example.com/team/x", // the prefix further in
		"localhost:5001/x:1",                    // another port
		"acme/other:v2",                         // Docker Hub, another repository
		"docker.io/acme/agents-evil:v2",
	} {
		check(c, ref, false, `to pod_restore_from in `)
	}
	check(c, "Not A Ref!", false, "is not an image reference")

	// A template reference is admitted by the same rules, and is a
	// template's; a pod naming both a snapshot and a template is refused.
	tplRef := "registry.example.com/team/tpl:1"
	if kind, got, err := c.restoreRef(map[string]string{FromTemplateAnnotation: tplRef}); err != nil || got == nil || kind != fromTemplate {
		t.Fatalf("template %q: %v, %v, %v; want it admitted as a template", tplRef, kind, got, err)
	}
	if kind, _, err := c.restoreRef(ann(tplRef)); err != nil || kind != fromSnapshot {
		t.Fatalf("snapshot %q: %v, %v; want a snapshot", tplRef, kind, err)
	}
	if _, _, err := c.restoreRef(map[string]string{FromTemplateAnnotation: "registry.example.com/team-b/tpl:1"}); !errors.Is(err, errdefs.ErrDenied) || !strings.Contains(err.Error(), FromTemplateAnnotation) {
		t.Fatalf("a template outside pod_restore_from: %v, want refused naming %s", err, FromTemplateAnnotation)
	}
	if _, got, err := c.restoreRef(map[string]string{FromTemplateAnnotation: tplRef, FromSnapshotAnnotation: tplRef}); !errors.Is(err, errdefs.ErrInvalid) || got != nil || !strings.Contains(err.Error(), "not both") {
		t.Fatalf("both annotations: %v, %v; want refused", got, err)
	}

	// Entries the node's owner must fix.
	for _, bad := range []string{"team/agents", "registry.example.com/team:1", "registry.example.com/x@sha256:00"} {
		write("pod_restore_from: ['" + bad + "']\n")
		if _, err := loadConfig(state, nil); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "pod_restore_from") {
			t.Fatalf("entry %q: %v, want it refused at load", bad, err)
		}
	}
	write("pod_restore_from: [registry.example.com]\npod_restore_keys: [not-a-key]\n")
	if _, err := loadConfig(state, nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("a bad key: %v, want it refused at load", err)
	}
	// Prefixes without a key: refused, saying so.
	write("pod_restore_from: [registry.example.com]\n")
	if c, err = loadConfig(state, nil); err != nil {
		t.Fatal(err)
	}
	check(c, "registry.example.com/x:1", false, "trusts no signing key for pods")

	// Keys from a file (trusted-log-keys format) and inline.
	keyFile := filepath.Join(t.TempDir(), "keys")
	_, vkey2, _ := note.GenerateKey(rand.Reader, "node-b")
	os.WriteFile(keyFile, []byte("# node b\nnode-b "+vkey2+"\n"), 0o644)
	write("pod_restore_from: [registry.example.com]\npod_restore_keys: ['" + vkey + "', " + keyFile + "]\n")
	if c, err = loadConfig(state, nil); err != nil {
		t.Fatal(err)
	}
	keys, err := c.restoreKeys()
	if err != nil {
		t.Fatal(err)
	}
	verifiers, n, err := ocisnap.Verifiers(keys...)
	if err != nil || n != 2 {
		t.Fatalf("verifiers: %d, %v", n, err)
	}
	va, _ := note.NewVerifier(vkey)
	vb, _ := note.NewVerifier(vkey2)
	_, vc, _ := note.GenerateKey(rand.Reader, "node-a") // same name, another key
	vcv, _ := note.NewVerifier(vc)
	for _, tc := range []struct {
		signer string
		ok     bool
	}{
		{fmt.Sprintf("%s+%08x", va.Name(), va.KeyHash()), true},
		{fmt.Sprintf("%s+%08x", vb.Name(), vb.KeyHash()), true},
		{fmt.Sprintf("%s+%08x", vcv.Name(), vcv.KeyHash()), false},
		{"node-a", false},
		{"", false},
	} {
		if got := signerTrusted(verifiers, tc.signer); got != tc.ok {
			t.Errorf("signerTrusted(%q) = %v, want %v", tc.signer, got, tc.ok)
		}
	}
}
