package image

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/smx-dev/smx/internal/errdefs"
)

// TestPull pulls from a registry served in-process (go-containerregistry's
// pkg/registry on loopback): by tag, by digest, from a multi-platform
// index (linux/amd64 picked), and refuses a digest the registry does not
// hold, a missing tag, and an index without linux/amd64.
func TestPull(t *testing.T) {
	requireBuildTools(t)
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	img := testImage(t)
	push := func(ref string, v remote.Taggable) {
		t.Helper()
		r, err := name.ParseReference(host + "/" + ref)
		if err != nil {
			t.Fatal(err)
		}
		switch x := v.(type) {
		case v1.Image:
			err = remote.Write(r, x)
		case v1.ImageIndex:
			err = remote.WriteIndex(r, x)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	push("team/app:v1", img)
	dig, _ := img.Digest()
	// An index whose first entry is arm64 (another image) and second amd64.
	other, _ := mutate.ConfigFile(img, func() *v1.ConfigFile {
		cf, _ := img.ConfigFile()
		cf = cf.DeepCopy()
		cf.Architecture = "arm64"
		return cf
	}())
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: other, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}})
	push("team/multi:latest", idx)
	push("team/armonly:1", mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: other, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}}))

	s := testStore(t)
	ctx := context.Background()
	var progress bytes.Buffer
	res, err := s.Pull(ctx, "app", host+"/team/app:v1", &progress)
	if err != nil {
		t.Fatalf("pull by tag: %v\n%s", err, progress.String())
	}
	want := host + "/team/app@" + dig.String()
	if res.Pinned != want || res.Image.Source != "registry:"+want {
		t.Fatalf("pinned %q, source %q; want %q", res.Pinned, res.Image.Source, want)
	}
	for _, line := range []string{"2 layers", "layer 1/2", "layer 2/2", "done"} {
		if !strings.Contains(progress.String(), line) {
			t.Errorf("progress lacks %q:\n%s", line, progress.String())
		}
	}
	if got := openExt4(t, res.Image).cat("/etc/new"); got != "added\n" {
		t.Errorf("/etc/new = %q", got)
	}
	if res.Image.Config == nil || res.Image.Config.WorkingDir != "/work" {
		t.Errorf("config not kept: %+v", res.Image.Config)
	}

	byDigest, err := s.Pull(ctx, "app2", want, nil)
	if err != nil || byDigest.Image.Digest != res.Image.Digest {
		t.Fatalf("pull by digest: %v (%+v)", err, byDigest)
	}
	multi, err := s.Pull(ctx, "multi", host+"/team/multi:latest", nil)
	if err != nil || multi.Pinned != host+"/team/multi@"+dig.String() {
		t.Fatalf("pull of an index: %v (%+v)", err, multi)
	}

	for ref, class := range map[string]error{
		host + "/team/app@sha256:" + strings.Repeat("0", 64): errdefs.ErrNotFound,
		host + "/team/app:nosuch":                            errdefs.ErrNotFound,
		host + "/team/armonly:1":                             errdefs.ErrInvalid,
		"Not A Ref":                                          errdefs.ErrInvalid,
	} {
		if _, err := s.Pull(ctx, "bad", ref, nil); !errors.Is(err, class) {
			t.Errorf("pull %s: %v, want %v", ref, err, class)
		}
	}
	if _, err := s.Pull(ctx, "app", host+"/team/app:v1", nil); !errors.Is(err, errdefs.ErrExists) {
		t.Errorf("pull over an existing name: %v", err)
	}
	assertNoTemp(t, s)
}
