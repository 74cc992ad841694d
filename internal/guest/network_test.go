package guest

import (
	"testing"
	"unsafe"
)

// TestRtentryLayout pins struct rtentry's amd64 layout, which SIOCADDRT
// reads as raw memory.
func TestRtentryLayout(t *testing.T) {
	var rt rtentry
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"size", unsafe.Sizeof(rt), 120},
		{"dst", unsafe.Offsetof(rt.dst), 8},
		{"gateway", unsafe.Offsetof(rt.gateway), 24},
		{"genmask", unsafe.Offsetof(rt.genmask), 40},
		{"flags", unsafe.Offsetof(rt.flags), 56},
		{"metric", unsafe.Offsetof(rt.metric), 80},
		{"dev", unsafe.Offsetof(rt.dev), 88},
		{"irtt", unsafe.Offsetof(rt.irtt), 112},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.name, c.got, c.want)
		}
	}
}

func TestParseNet(t *testing.T) {
	p, gw, mtu, err := parseNet("10.0.2.15/24,10.0.2.2,65000")
	if err != nil || p.String() != "10.0.2.15/24" || gw.String() != "10.0.2.2" || mtu != 65000 {
		t.Fatalf("%v %v %v %v", p, gw, mtu, err)
	}
	for _, bad := range []string{"", "10.0.2.15/24", "x/24,10.0.2.2", "fd00::1/64,fd00::2", "10.0.2.15/24,10.0.2.2,9"} {
		if _, _, _, err := parseNet(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if m := net4Mask(24); m[0] != 255 || m[2] != 255 || m[3] != 0 {
		t.Errorf("mask %v", m)
	}
}
