package guest

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Network configures the one NIC (virtio-net) whose other end is the
// supervisor's gateway: a static address, a default route through the
// gateway, and the gateway as the only resolver. It runs only when the
// command line names a network (smx.net=GUEST/PREFIX,GATEWAY).
type Network struct{}

func (Network) String() string { return "configure the network" }

func (Network) Run(b *Boot) error {
	if b.Cmdline.Net == "" {
		return nil
	}
	addr, gw, mtu, err := parseNet(b.Cmdline.Net)
	if err != nil {
		b.Log.Warn("network", "err", err)
		return nil
	}
	ifname, err := firstNIC()
	if err != nil {
		b.Log.Warn("network", "err", err)
		return nil
	}
	if err := configureNIC(ifname, addr, gw, mtu); err != nil {
		b.Log.Warn("network", "nic", ifname, "err", err)
		return nil
	}
	// The gateway is the only resolver the guest can reach; anything else
	// on port 53 is refused on the host.
	if err := os.WriteFile("/etc/resolv.conf", []byte("nameserver "+gw.String()+"\n"), 0o644); err != nil {
		b.Log.Warn("network: resolv.conf", "err", err)
	}
	addHost(b, gw.String(), "host.smx.internal")
	b.Log.Debug("network up", "nic", ifname, "addr", addr, "gateway", gw)
	return nil
}

// parseNet reads ADDR/PREFIX,GATEWAY[,MTU].
func parseNet(s string) (netip.Prefix, netip.Addr, int, error) {
	parts := strings.Split(s, ",")
	if len(parts) < 2 || len(parts) > 3 {
		return netip.Prefix{}, netip.Addr{}, 0, fmt.Errorf("smx.net=%q: want ADDR/PREFIX,GATEWAY[,MTU]", s)
	}
	p, err := netip.ParsePrefix(parts[0])
	if err != nil {
		return p, netip.Addr{}, 0, err
	}
	gw, err := netip.ParseAddr(parts[1])
	if err != nil || !p.Addr().Is4() || !gw.Is4() {
		return p, gw, 0, fmt.Errorf("smx.net=%q: want IPv4 ADDR/PREFIX,GATEWAY", s)
	}
	mtu := 0
	if len(parts) == 3 {
		if mtu, err = strconv.Atoi(parts[2]); err != nil || mtu < 576 || mtu > 65535 {
			return p, gw, 0, fmt.Errorf("smx.net=%q: bad MTU", s)
		}
	}
	return p, gw, mtu, nil
}

// firstNIC is the first interface that is not loopback.
func firstNIC() (string, error) {
	ents, err := os.ReadDir("/sys/class/net")
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		if e.Name() != "lo" {
			return e.Name(), nil
		}
	}
	return "", fmt.Errorf("no network interface (is virtio_net loaded?)")
}

func configureNIC(name string, addr netip.Prefix, gw netip.Addr, mtu int) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	set := func(req uint, a netip.Addr) error {
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			return err
		}
		if err := ifr.SetInet4Addr(a.AsSlice()); err != nil {
			return err
		}
		return unix.IoctlIfreq(fd, req, ifr)
	}
	if err := set(unix.SIOCSIFADDR, addr.Addr()); err != nil {
		return fmt.Errorf("set address: %w", err)
	}
	mask := netip.AddrFrom4([4]byte(net4Mask(addr.Bits())))
	if err := set(unix.SIOCSIFNETMASK, mask); err != nil {
		return fmt.Errorf("set netmask: %w", err)
	}
	if mtu > 0 {
		// A large MTU: the link is a socketpair to the host, not a wire,
		// and fewer, bigger frames are what makes it fast under TCG.
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			return err
		}
		ifr.SetUint32(uint32(mtu))
		if err := unix.IoctlIfreq(fd, unix.SIOCSIFMTU, ifr); err != nil {
			return fmt.Errorf("set MTU %d: %w", mtu, err)
		}
	}
	quietIPv6(name)
	if err := linkUp(name); err != nil {
		return err
	}
	return addDefaultRoute(fd, gw)
}

// quietIPv6 has the NIC skip duplicate address detection and router
// solicitations: the gateway is the link's only other end and has no IPv6
// (it refuses every IPv6 frame), so they would only put frames on the
// wire for it to refuse, and keep kernel timers running for seconds after
// boot, into every sandbox restored from a boot template. The link-local
// address stays, and so does what a process sends from it. A kernel
// without IPv6 has no such settings.
func quietIPv6(nic string) {
	for _, k := range []string{"accept_dad", "accept_ra"} {
		_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+nic+"/"+k, []byte("0\n"), 0o644)
	}
}

func net4Mask(bits int) []byte {
	m := uint32(0xffffffff) << (32 - bits)
	if bits == 0 {
		m = 0
	}
	return []byte{byte(m >> 24), byte(m >> 16), byte(m >> 8), byte(m)}
}

// rtentry is struct rtentry from <net/route.h> on 64-bit Linux, for the
// SIOCADDRT ioctl (the one route a sandbox needs; no netlink library).
type rtentry struct {
	pad1    uint64
	dst     unix.RawSockaddrInet4
	gateway unix.RawSockaddrInet4
	genmask unix.RawSockaddrInet4
	flags   uint16
	pad2    int16
	_       [4]byte
	pad3    uint64
	pad4    uintptr
	metric  int16
	_       [6]byte
	dev     uintptr
	mtu     uint64
	window  uint64
	irtt    uint16
	_       [6]byte
}

func addDefaultRoute(fd int, gw netip.Addr) error {
	var rt rtentry
	rt.dst.Family = unix.AF_INET
	rt.genmask.Family = unix.AF_INET
	rt.gateway.Family = unix.AF_INET
	rt.gateway.Addr = gw.As4()
	rt.flags = unix.RTF_UP | unix.RTF_GATEWAY
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCADDRT, uintptr(unsafe.Pointer(&rt))); errno != 0 && errno != unix.EEXIST {
		return fmt.Errorf("add default route via %s: %w", gw, errno)
	}
	return nil
}

// addHost appends "ip name" to /etc/hosts unless name is already there.
func addHost(b *Boot, ip, name string) {
	data, _ := os.ReadFile("/etc/hosts")
	for _, l := range strings.Split(string(data), "\n") {
		for _, f := range strings.Fields(l)[min(1, len(strings.Fields(l))):] {
			if f == name {
				return
			}
		}
	}
	if len(data) > 0 && !strings.HasSuffix(string(data), "\n") {
		data = append(data, '\n')
	}
	data = append(data, []byte(ip+"\t"+name+"\n")...)
	if err := os.WriteFile("/etc/hosts", data, 0o644); err != nil {
		b.Log.Warn("network: /etc/hosts", "err", err)
	}
}
