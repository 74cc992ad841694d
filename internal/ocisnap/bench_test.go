package ocisnap

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/smx-dev/smx/internal/snapshot"
)

// BenchmarkPush pushes one snapshot to a fresh repository of a loopback
// registry each iteration (nothing deduplicated), zstd and uncompressed,
// beside the nearest peer: an ordinary image whose one layer holds the
// same memory state, pushed the way `docker push` sends layers (gzip).
// The memory state is SMX_BENCH_MEMORY_STATE (a real snapshot's
// memory.state) or else 64 MiB of which a quarter is random, the rest zero
// pages, about what a small guest's RAM looks like.
func BenchmarkPush(b *testing.B) {
	ctx := context.Background()
	a := newHost(b, []byte("kernel"))
	_, reg := newRegistry(b)
	base := makeBase(b, a)
	mem := make([]byte, 64<<20)
	for i := 0; i < len(mem); i += 4 << 12 {
		rand.Read(mem[i : i+4096])
	}
	if p := os.Getenv("SMX_BENCH_MEMORY_STATE"); p != "" {
		var err error
		if mem, err = os.ReadFile(p); err != nil {
			b.Fatal(err)
		}
	}
	store := &snapshot.Store{Dir: a.state.Snapshots()}
	bld, err := store.Begin("bench")
	must(b, err)
	must(b, os.WriteFile(bld.MemoryPath(), mem, 0o600))
	qemuImg(b, "create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", bld.DiskPath())
	must(b, os.WriteFile(bld.ProfilePath(), []byte("name: locked\n"), 0o600))
	sn, err := bld.Commit(snapshot.Snapshot{Source: "bench", Image: "busybox", ImageBase: base,
		Host: snapshot.Host{QEMUVersion: testQEMU, Kernel: testKernel}})
	must(b, err)
	n := 0
	for _, c := range []string{CompressZstd, CompressNone} {
		b.Run("smx-"+c, func(b *testing.B) {
			b.SetBytes(sn.MemoryStateBytes)
			for b.Loop() {
				n++
				if _, err := Push(ctx, PushOptions{State: a.state, Snapshot: sn, Ref: fmt.Sprintf("%s/bench/%s%d:1", reg, c, n), Signer: a.signer, Compress: c}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("image-gzip", func(b *testing.B) {
		b.SetBytes(sn.MemoryStateBytes)
		for b.Loop() {
			n++
			l, err := tarball.LayerFromFile(sn.MemoryPath())
			if err != nil {
				b.Fatal(err)
			}
			img, err := mutate.AppendLayers(empty.Image, l)
			if err != nil {
				b.Fatal(err)
			}
			if err := remote.Write(mustRef(b, fmt.Sprintf("%s/bench/img%d:1", reg, n)), img); err != nil {
				b.Fatal(err)
			}
		}
	})
}
