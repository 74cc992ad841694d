package initramfs

import (
	"fmt"
	"io"
	"os"
	"strings"
)

// newcWriter writes the "newc" cpio format the kernel unpacks into its
// initial rootfs. It is written here rather than imported because smx needs
// only a handful of entry kinds, and a fixed ino/mtime keeps the output
// reproducible.
type newcWriter struct {
	w   io.Writer
	ino uint32
	off int64
}

const (
	modeDir  = 0o040000
	modeFile = 0o100000
	modeChar = 0o020000
)

func (c *newcWriter) write(p []byte) error {
	n, err := c.w.Write(p)
	c.off += int64(n)
	return err
}

func (c *newcWriter) pad() error {
	if n := c.off % 4; n != 0 {
		return c.write(make([]byte, 4-n))
	}
	return nil
}

// header writes one entry header and its name. Names have no leading "/".
func (c *newcWriter) header(name string, mode uint32, size int64, rdevMajor, rdevMinor uint32) error {
	name = strings.TrimPrefix(name, "/")
	c.ino++
	nlink := 1
	if mode&modeDir != 0 {
		nlink = 2
	}
	h := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.ino, mode, 0, 0, nlink, 0, size, 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	if err := c.write([]byte(h + name + "\x00")); err != nil {
		return err
	}
	return c.pad()
}

func (c *newcWriter) dir(name string) error {
	return c.header(name, modeDir|0o755, 0, 0, 0)
}

func (c *newcWriter) charDev(name string, perm, major, minor uint32) error {
	return c.header(name, modeChar|perm, 0, major, minor)
}

// file copies size bytes from r as a regular file.
func (c *newcWriter) file(name string, perm uint32, size int64, r io.Reader) error {
	if err := c.header(name, modeFile|perm, size, 0, 0); err != nil {
		return err
	}
	n, err := io.Copy(c.w, r)
	c.off += n
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("%s: wrote %d bytes, want %d (file changed?)", name, n, size)
	}
	return c.pad()
}

func (c *newcWriter) close() error {
	c.ino = 0
	return c.header("TRAILER!!!", 0, 0, 0, 0)
}

// WriteSingleInit writes an archive holding only /dev/console and /init
// (the file at prog). Benchmarks use it as the bare-QEMU baseline: the same
// kernel with nothing of smx's.
func WriteSingleInit(w io.Writer, prog string) error {
	f, err := os.Open(prog)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	c := &newcWriter{w: w}
	if err := c.dir("dev"); err != nil {
		return err
	}
	if err := c.charDev("dev/console", 0o600, 5, 1); err != nil {
		return err
	}
	if err := c.file("init", 0o755, fi.Size(), f); err != nil {
		return err
	}
	return c.close()
}
