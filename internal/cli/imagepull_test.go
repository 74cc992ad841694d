package cli_test

import (
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/smx-dev/smx/internal/testutil"
)

// TestImagePull: `smx image pull` against a registry served in-process
// names the image after the reference, prints the pinned digest, and shows
// it in `smx image ls` with the pinned source.
func TestImagePull(t *testing.T) {
	bin := testutil.Binaries(t)
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	layer, err := random.Layer(4096, "application/vnd.oci.image.layer.v1.tar")
	if err != nil {
		t.Fatal(err)
	}
	img, _ := mutate.AppendLayers(empty.Image, layer)
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	img, _ = mutate.ConfigFile(img, cf)
	ref, _ := name.ParseReference(host + "/acme/tool:1.0")
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	dig, _ := img.Digest()
	v := &vmEnv{t: t, bin: bin, home: t.TempDir()}
	out, err := v.smx("image", "pull", host+"/acme/tool:1.0")
	if err != nil {
		t.Fatalf("pull: %v\n%s", err, out)
	}
	pinned := host + "/acme/tool@" + dig.String()
	if !strings.Contains(out, "pulled "+pinned) || !strings.Contains(out, "tool-1.0 sha256:") || !strings.Contains(out, "layer 1/1") {
		t.Fatalf("pull output:\n%s", out)
	}
	ls, _ := v.smx("image", "ls", "--json")
	if !strings.Contains(ls, `"registry:`+pinned+`"`) {
		t.Fatalf("image ls:\n%s", ls)
	}
	if _, err := os.Stat(filepath.Join(v.home, "images", "tool-1.0", "disk.qcow2")); err != nil {
		t.Fatal(err)
	}
	if out, err := v.smx("image", "pull", host+"/acme/nosuch:1"); err == nil || !strings.Contains(out, "smx:") {
		t.Fatalf("pull of a missing image: %v\n%s", err, out)
	}
}
