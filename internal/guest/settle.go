package guest

import (
	"bufio"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/smx-dev/smx/internal/agentproto"
)

// settle waits, up to limit, until the kernel has done the work it defers
// from boot by about a second, and reports what it still waited for when
// it answered (nothing: settled). A boot template is saved right after
// the guest came up, earlier than that work; without this, every sandbox
// restored from the template did it anew, in a fresh emulator whose
// translation cache is empty (under TCG, some 4,000 translation blocks of
// kernel code in the first 0.3 s after a restore):
//
//   - the switch from the early TSC clocksource to the refined one (the
//     kernel recalibrates about a second after boot and stops every CPU to
//     switch);
//   - the IPv6 link-local address of each NIC that is up, which the kernel
//     adds once it has the link's new state (its link watch runs at most
//     once a second), with the neighbour and multicast set-up behind it.
func settle(limit time.Duration) []string {
	deadline := time.Now().Add(limit)
	for {
		pending := unsettled()
		if len(pending) == 0 || time.Now().After(deadline) {
			return pending
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// unsettled lists the deferred boot work that has not run yet.
func unsettled() []string {
	var pending []string
	if b, err := os.ReadFile("/sys/devices/system/clocksource/clocksource0/current_clocksource"); err == nil && strings.TrimSpace(string(b)) == "tsc-early" {
		pending = append(pending, "clocksource tsc-early")
	}
	ents, err := os.ReadDir("/sys/class/net")
	if err != nil {
		return pending
	}
	var linkLocal map[string]bool
	for _, e := range ents {
		nic := e.Name()
		if nic == "lo" || !nicUp(nic) || ipv6Disabled(nic) {
			continue
		}
		if linkLocal == nil {
			linkLocal = readLinkLocal()
		}
		if !linkLocal[nic] {
			pending = append(pending, "link-local address of "+nic)
		}
	}
	return pending
}

func nicUp(nic string) bool {
	b, err := os.ReadFile("/sys/class/net/" + nic + "/flags")
	if err != nil {
		return false
	}
	flags, err := strconv.ParseUint(strings.TrimSpace(string(b)), 0, 32)
	return err == nil && flags&1 != 0 // IFF_UP
}

func ipv6Disabled(nic string) bool {
	b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + nic + "/disable_ipv6")
	return err != nil || strings.TrimSpace(string(b)) != "0"
}

// readLinkLocal reports the NICs with a link-local IPv6 address that is
// no longer tentative.
func readLinkLocal() map[string]bool {
	f, err := os.Open("/proc/net/if_inet6")
	if err != nil {
		return nil
	}
	defer f.Close()
	return parseIfInet6(f)
}

// parseIfInet6 reads /proc/net/if_inet6: address, interface index, prefix
// length, scope, flags (hex), name.
func parseIfInet6(r io.Reader) map[string]bool {
	const scopeLink, flagTentative = 0x20, 0x40
	out := map[string]bool{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 6 {
			continue
		}
		scope, err1 := strconv.ParseUint(f[3], 16, 32)
		flags, err2 := strconv.ParseUint(f[4], 16, 32)
		if err1 == nil && err2 == nil && scope == scopeLink && flags&flagTentative == 0 {
			out[f[5]] = true
		}
	}
	return out
}

// settleRequest answers agentproto.OpSettle.
func settleRequest(w io.Writer, limitMS int64) error {
	limit := time.Duration(limitMS) * time.Millisecond
	if limit <= 0 || limit > 10*time.Second {
		limit = 3 * time.Second
	}
	return agentproto.WriteJSON(w, agentproto.FrameResult, agentproto.Result{OK: true, Pending: settle(limit)})
}
