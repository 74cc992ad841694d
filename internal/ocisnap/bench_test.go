package ocisnap

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
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
	sn := benchSnapshot(b, a)
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

// BenchmarkPull pulls the snapshot BenchmarkPush describes into a fresh
// name each iteration (signature, digests, decompression, the disk chain
// rebased, the snapshot committed), beside pulling an ordinary image of
// the same memory state to a file, the way `docker pull` fetches a layer.
func BenchmarkPull(b *testing.B) {
	ctx := context.Background()
	a := newHost(b, []byte("kernel"))
	dst := newHost(b, []byte("kernel"))
	_, reg := newRegistry(b)
	sn := benchSnapshot(b, a)
	n := 0
	for _, c := range []string{CompressZstd, CompressNone} {
		ref := fmt.Sprintf("%s/bench/pull-%s:1", reg, c)
		if _, err := Push(ctx, PushOptions{State: a.state, Snapshot: sn, Ref: ref, Signer: a.signer, Compress: c}); err != nil {
			b.Fatal(err)
		}
		b.Run("smx-"+c, func(b *testing.B) {
			b.SetBytes(sn.MemoryStateBytes)
			for b.Loop() {
				n++
				if _, _, err := Pull(ctx, PullOptions{State: dst.state, Ref: ref, Name: fmt.Sprintf("p%d", n), Verifiers: verifiersOf(b, a.vkey), QEMUVersion: testQEMU}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	l, err := tarball.LayerFromFile(sn.MemoryPath())
	must(b, err)
	img, err := mutate.AppendLayers(empty.Image, l)
	must(b, err)
	iref := reg + "/bench/img:1"
	must(b, remote.Write(mustRef(b, iref), img))
	b.Run("image-gzip", func(b *testing.B) {
		b.SetBytes(sn.MemoryStateBytes)
		for b.Loop() {
			n++
			img, err := remote.Image(mustRef(b, iref))
			must(b, err)
			ls, err := img.Layers()
			must(b, err)
			rc, err := ls[0].Uncompressed()
			must(b, err)
			f, err := os.Create(fmt.Sprintf("%s/img-%d", b.TempDir(), n))
			must(b, err)
			_, err = io.Copy(f, rc)
			must(b, err)
			rc.Close()
			f.Close()
		}
	})
}

// benchSnapshot is a snapshot on h whose memory state is
// SMX_BENCH_MEMORY_STATE or 64 MiB, a quarter random, the rest zero.
func benchSnapshot(b *testing.B, a *host) *snapshot.Snapshot {
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
	return sn
}
