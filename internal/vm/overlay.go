package vm

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/smx-dev/smx/internal/errdefs"
)

// qcow2 layout of an empty overlay, as `qemu-img create -f qcow2 -b BASE
// -F qcow2` writes it with its default 64 KiB clusters: the header (with
// the backing format extension and the backing file's name) in cluster 0,
// the refcount table in cluster 1, its one refcount block in cluster 2,
// and the L1 table from cluster 3. Every L1 entry is zero: nothing is
// allocated, so every read goes to the backing file.
const (
	qcowMagic       = 0x514649fb // "QFI\xfb"
	qcowClusterBits = 16
	qcowCluster     = 1 << qcowClusterBits
	qcowHeaderLen   = 112 // version 3 header with the compression type byte, padded
	qcowExtBacking  = 0xe2792aca
)

// CreateOverlay writes an empty qcow2 image of size bytes (rounded up to
// 512) at path, backed by the qcow2 image base (an absolute path: QEMU
// resolves a relative one against the overlay's directory). It is what
// `qemu-img create -f qcow2 -b BASE -F qcow2 PATH SIZE` makes, written
// directly: a sandbox start would otherwise run qemu-img, a process start
// of tens of milliseconds, once or twice. path must not exist.
func CreateOverlay(path, base string, size int64) error {
	if !filepath.IsAbs(base) {
		return invalid("overlay: backing file %q is not an absolute path", base)
	}
	if size <= 0 {
		return invalid("overlay: size %d", size)
	}
	size = (size + 511) &^ 511
	const (
		refTableOff = 1 * qcowCluster
		refBlockOff = 2 * qcowCluster
		l1Off       = 3 * qcowCluster
	)
	l2Covers := int64(qcowCluster) * (qcowCluster / 8) // bytes one L2 table maps
	l1Size := (size + l2Covers - 1) / l2Covers
	l1Clusters := (l1Size*8 + qcowCluster - 1) / qcowCluster
	clusters := 3 + l1Clusters
	if clusters > qcowCluster/2 {
		return invalid("overlay: size %d is too large", size)
	}

	hdr := make([]byte, qcowCluster)
	be := binary.BigEndian
	be.PutUint32(hdr[0:], qcowMagic)
	be.PutUint32(hdr[4:], 3)
	be.PutUint32(hdr[20:], qcowClusterBits)
	be.PutUint64(hdr[24:], uint64(size))
	be.PutUint32(hdr[36:], uint32(l1Size))
	be.PutUint64(hdr[40:], l1Off)
	be.PutUint64(hdr[48:], refTableOff)
	be.PutUint32(hdr[56:], 1) // refcount table clusters
	be.PutUint32(hdr[96:], 4) // refcount order: 16-bit refcounts
	be.PutUint32(hdr[100:], qcowHeaderLen)
	// Header extensions: the backing file's format, then the end marker.
	off := qcowHeaderLen
	be.PutUint32(hdr[off:], qcowExtBacking)
	be.PutUint32(hdr[off+4:], uint32(len("qcow2")))
	copy(hdr[off+8:], "qcow2")
	off += 8 + 8 // "qcow2" padded to 8 bytes
	off += 8     // end of extensions: type 0, length 0
	if off+len(base) > qcowCluster {
		return invalid("overlay: backing file name too long")
	}
	be.PutUint64(hdr[8:], uint64(off))
	be.PutUint32(hdr[16:], uint32(len(base)))
	copy(hdr[off:], base)

	refTable := make([]byte, 8)
	be.PutUint64(refTable, refBlockOff)
	refBlock := make([]byte, 2*clusters)
	for i := int64(0); i < clusters; i++ {
		be.PutUint16(refBlock[2*i:], 1)
	}

	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("vm: overlay: %w", err)
	}
	werr := func() error {
		for _, w := range []struct {
			off int64
			b   []byte
		}{{0, hdr}, {refTableOff, refTable}, {refBlockOff, refBlock}} {
			if _, err := f.WriteAt(w.b, w.off); err != nil {
				return err
			}
		}
		// The L1 table is all zeros: extending the file writes it.
		return f.Truncate(l1Off + l1Size*8)
	}()
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		os.Remove(path)
		return fmt.Errorf("vm: overlay: %w", werr)
	}
	return nil
}

// QCOW2Size returns the virtual size of the qcow2 image at path, from its
// header.
func QCOW2Size(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("vm: qcow2: %w", err)
	}
	defer f.Close()
	var h [32]byte
	if _, err := io.ReadFull(f, h[:]); err != nil {
		return 0, fmt.Errorf("vm: qcow2 %s: %w", path, err)
	}
	if binary.BigEndian.Uint32(h[0:]) != qcowMagic {
		return 0, fmt.Errorf("vm: %s is not a qcow2 image: %w", path, errdefs.ErrInvalid)
	}
	return int64(binary.BigEndian.Uint64(h[24:])), nil
}
