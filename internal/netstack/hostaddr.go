package netstack

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// The host's own addresses are closed like loopback: a service bound to
// 0.0.0.0 on the host answers on every interface address, not only on
// 127.0.0.1, and the policy cannot know which public-looking addresses are
// the host's. So before dialling, the gateway asks the kernel how it
// would route the destination (RTM_GETROUTE, as `ip route get` does): a
// local or broadcast route means the connection would end on this host.
// The question is asked for every new flow, so addresses added after the
// sandbox started are covered as well. Only host_ports, reached as
// host.smx.internal, open host services.

// RuleHostAddr refuses a flow to an address of the host itself.
const RuleHostAddr = "netstack: host address"

// hostAddrFunc reports whether a is an address of the host; tests replace
// it.
var hostAddrFunc = isHostAddr

// isHostAddr reports whether a connection to a from this host would be
// delivered locally. If the kernel cannot be asked, it falls back to the
// interface address list.
func isHostAddr(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	local, err := routeIsLocal(a)
	if err == nil {
		return local
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return true // cannot tell: fail closed
	}
	for _, ia := range addrs {
		if n, ok := ia.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == a {
				return true
			}
		}
	}
	return false
}

// routeIsLocal asks the kernel for its route to a over rtnetlink.
func routeIsLocal(a netip.Addr) (bool, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return false, os.NewSyscallError("socket", err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 1}); err != nil {
		return false, err
	}
	family, bits := byte(unix.AF_INET), byte(32)
	if a.Is6() {
		family, bits = unix.AF_INET6, 128
	}
	dst := a.AsSlice()
	attrLen := unix.SizeofRtAttr + len(dst)
	msgLen := unix.SizeofNlMsghdr + unix.SizeofRtMsg + attrLen
	b := make([]byte, msgLen)
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], uint32(msgLen))
	ne.PutUint16(b[4:], unix.RTM_GETROUTE)
	ne.PutUint16(b[6:], unix.NLM_F_REQUEST)
	ne.PutUint32(b[8:], 1) // seq
	rt := b[unix.SizeofNlMsghdr:]
	rt[0], rt[1] = family, bits // rtm_family, rtm_dst_len; the rest zero
	at := rt[unix.SizeofRtMsg:]
	ne.PutUint16(at[0:], uint16(attrLen))
	ne.PutUint16(at[2:], unix.RTA_DST)
	copy(at[unix.SizeofRtAttr:], dst)
	if err := unix.Sendto(fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return false, os.NewSyscallError("sendto", err)
	}
	buf := make([]byte, 8192)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return false, os.NewSyscallError("recvfrom", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return false, err
		}
		for _, m := range msgs {
			if m.Header.Seq != 1 {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if errno := int32(ne.Uint32(m.Data)); errno != 0 {
						// No route at all (ENETUNREACH): nothing local.
						if syscall.Errno(-errno) == unix.ENETUNREACH || syscall.Errno(-errno) == unix.EHOSTUNREACH {
							return false, nil
						}
						return false, syscall.Errno(-errno)
					}
				}
				return false, errors.New("rtnetlink: empty answer")
			case unix.RTM_NEWROUTE:
				if len(m.Data) < unix.SizeofRtMsg {
					return false, errors.New("rtnetlink: short route message")
				}
				typ := m.Data[7] // rtm_type
				return typ == unix.RTN_LOCAL || typ == unix.RTN_BROADCAST || typ == unix.RTN_MULTICAST, nil
			}
		}
	}
}
