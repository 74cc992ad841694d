package vm

import (
	"fmt"
	"strconv"
	"strings"
)

// Device is one piece of virtual hardware. Args returns the QEMU arguments
// that create it, taking ids from ids so that two devices never collide.
// Args must not fail: a Device that can be invalid also implements
// validator, which Config.Args calls first.
type Device interface {
	Args(ids *IDs) []string
}

// validator is implemented by devices whose fields can be wrong.
type validator interface {
	validate(nfiles int) error
}

// IDs hands out QEMU object ids and remembers machine-wide devices that
// must be created only once (the virtio-serial bus). The zero value is
// ready to use; one IDs serves one command line.
type IDs struct {
	next map[string]int
	once map[string]string
}

// New returns a fresh id starting with prefix: "ser0", "ser1", ...
func (ids *IDs) New(prefix string) string {
	if ids.next == nil {
		ids.next = map[string]int{}
	}
	n := ids.next[prefix]
	ids.next[prefix] = n + 1
	return prefix + strconv.Itoa(n)
}

// Once reports the id registered under key and whether it already existed;
// when it did not, it allocates one with prefix. Devices use it to add a
// shared parent (a bus) only for the first child.
func (ids *IDs) Once(key, prefix string) (id string, existed bool) {
	if ids.once == nil {
		ids.once = map[string]string{}
	}
	if id, ok := ids.once[key]; ok {
		return id, true
	}
	id = ids.New(prefix)
	ids.once[key] = id
	return id, false
}

// opt escapes a value for QEMU's option syntax, where a comma separates
// options and ",," is a literal comma (paths may contain commas).
func opt(s string) string { return strings.ReplaceAll(s, ",", ",,") }

func checkFD(what string, fd, nfiles int) error {
	if fd < 3 || fd >= 3+nfiles {
		return fmt.Errorf("%s: fd %d is not one of Config.ExtraFiles (fds 3..%d)", what, fd, 2+nfiles)
	}
	return nil
}

// SerialPort is a virtio-serial port connected to a stream socket the host
// already holds (one end of a socketpair passed in Config.ExtraFiles). The
// guest sees it as /dev/virtio-ports/NAME. Passing an fd rather than a path
// means no socket file exists that another local user could connect to.
type SerialPort struct {
	Name string // guest-visible port name
	FD   int    // fd number in QEMU: 3 + index in Config.ExtraFiles
}

func (p SerialPort) validate(nfiles int) error {
	if p.Name == "" || strings.ContainsAny(p.Name, ",= /") {
		return fmt.Errorf("serial port %q: name must be non-empty without ',', '=', ' ' or '/'", p.Name)
	}
	return checkFD("serial port "+p.Name, p.FD, nfiles)
}

func (p SerialPort) Args(ids *IDs) []string {
	var args []string
	bus, existed := ids.Once("virtio-serial", "vser")
	if !existed {
		// Few ports: the guest driver sets up two virtqueues per possible
		// port at probe time, and the default of 31 ports costs tens of
		// milliseconds of boot under TCG.
		args = append(args, "-device", "virtio-serial-device,id="+bus+",max_ports=4")
	}
	chr := ids.New("chr")
	return append(args,
		"-chardev", fmt.Sprintf("socket,id=%s,fd=%d", chr, p.FD),
		"-device", fmt.Sprintf("virtserialport,bus=%s.0,chardev=%s,name=%s", bus, chr, p.Name),
	)
}

// Disk is a virtio block device. The guest sees disks as /dev/vda, vdb, ...
// in the order they appear in Config.Devices.
type Disk struct {
	Path     string
	Format   string // "qcow2" or "raw"
	ReadOnly bool
	// Cache is QEMU's cache mode; empty means writeback. "none" needs
	// O_DIRECT, which tmpfs does not support.
	Cache string
}

func (d Disk) validate(int) error {
	if d.Path == "" {
		return fmt.Errorf("disk: empty path")
	}
	switch d.Format {
	case "qcow2", "raw":
	default:
		return fmt.Errorf("disk %s: format %q: want qcow2 or raw", d.Path, d.Format)
	}
	switch d.Cache {
	case "", "writeback", "none", "writethrough", "directsync", "unsafe":
	default:
		return fmt.Errorf("disk %s: cache mode %q unknown", d.Path, d.Cache)
	}
	return nil
}

func (d Disk) Args(ids *IDs) []string {
	id := ids.New("disk")
	cache := d.Cache
	if cache == "" {
		cache = "writeback"
	}
	drive := fmt.Sprintf("file=%s,format=%s,if=none,id=%s,cache=%s,discard=unmap", opt(d.Path), d.Format, id, cache)
	if d.ReadOnly {
		drive += ",readonly=on"
	}
	return []string{"-drive", drive, "-device", "virtio-blk-device,drive=" + id}
}

// Console sends the guest's serial console (ttyS0, the kernel log when the
// command line has console=ttyS0) to a file.
type Console struct {
	LogPath string
}

func (c Console) validate(int) error {
	if c.LogPath == "" {
		return fmt.Errorf("console: empty log path")
	}
	return nil
}

func (c Console) Args(ids *IDs) []string {
	id := ids.New("con")
	return []string{
		"-chardev", fmt.Sprintf("file,id=%s,path=%s", id, opt(c.LogPath)),
		"-serial", "chardev:" + id,
	}
}

// RNG gives the guest a virtio entropy source fed from the host's
// /dev/urandom, so early boot and TLS in the guest do not wait for entropy.
type RNG struct{}

func (RNG) Args(ids *IDs) []string {
	id := ids.New("rng")
	return []string{
		"-object", "rng-random,id=" + id + ",filename=/dev/urandom",
		"-device", "virtio-rng-device,rng=" + id,
	}
}

// NetDgram is a virtio NIC whose frames go to a datagram socket the host
// holds (one end of a SOCK_DGRAM socketpair in Config.ExtraFiles): each
// datagram is one Ethernet frame, read by the in-process network stack.
type NetDgram struct {
	FD  int
	MAC string // empty means 52:54:00:12:34:56, QEMU's own default
}

func (n NetDgram) validate(nfiles int) error {
	if n.MAC != "" && len(strings.Split(n.MAC, ":")) != 6 {
		return fmt.Errorf("net: MAC %q: want six colon-separated bytes", n.MAC)
	}
	return checkFD("net", n.FD, nfiles)
}

func (n NetDgram) Args(ids *IDs) []string {
	id := ids.New("net")
	mac := n.MAC
	if mac == "" {
		mac = "52:54:00:12:34:56"
	}
	return []string{
		"-netdev", fmt.Sprintf("dgram,id=%s,local.type=fd,local.str=%d", id, n.FD),
		"-device", fmt.Sprintf("virtio-net-device,netdev=%s,mac=%s", id, mac),
	}
}

// VirtioFS is a vhost-user-fs device (virtio-mmio) whose backend is at the
// other end of a stream socket the host holds (one end of a socketpair in
// Config.ExtraFiles): the supervisor serves FUSE on it (internal/virtiofs).
// The guest mounts it with `mount -t virtiofs TAG DIR`. It needs QEMU 8.2
// or newer to be migratable, and Config.SharedRAM.
type VirtioFS struct {
	Tag string
	FD  int // fd number in QEMU: 3 + index in Config.ExtraFiles
	// Bounce offers VIRTIO_F_ACCESS_PLATFORM (iommu_platform=on): a guest
	// booted with swiotlb=force then copies every buffer through a bounce
	// buffer with its own CPU. Under TCG that copy is what makes QEMU drop
	// translated code of page-cache pages the backend refilled (its
	// writes from another process are invisible to TCG's code tracking).
	Bounce bool
}

func (v VirtioFS) validate(nfiles int) error {
	if v.Tag == "" || len(v.Tag) > 36 || strings.ContainsAny(v.Tag, ",= /") {
		return fmt.Errorf("virtio-fs tag %q: 1-36 characters without ',', '=', ' ' or '/'", v.Tag)
	}
	return checkFD("virtio-fs "+v.Tag, v.FD, nfiles)
}

func (v VirtioFS) Args(ids *IDs) []string {
	chr := ids.New("vfs")
	bounce := ""
	if v.Bounce {
		bounce = ",iommu_platform=on"
	}
	var legacy []string
	if v.Bounce {
		// ACCESS_PLATFORM is a bit above 31: a legacy virtio-mmio
		// transport (microvm's default) cannot offer it.
		legacy = []string{"-global", "virtio-mmio.force-legacy=false"}
	}
	return append(legacy,
		"-chardev", fmt.Sprintf("socket,id=%s,fd=%d", chr, v.FD),
		// 1024 entries: a 1 MiB FUSE request is 256 page descriptors
		// (the backend offers no indirect descriptors).
		"-device", fmt.Sprintf("vhost-user-fs-device,chardev=%s,tag=%s,queue-size=1024%s", chr, v.Tag, bounce),
	)
}
