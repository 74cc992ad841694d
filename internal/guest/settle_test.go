package guest

import (
	"strings"
	"testing"
)

// Only a link-local address that is no longer tentative counts; a
// global one, a tentative one or a malformed line does not.
func TestParseIfInet6(t *testing.T) {
	in := strings.Join([]string{
		"fe80000000000000505400fffe123456 02 40 20 80     eth0",
		"00000000000000000000000000000001 01 80 10 80       lo",
		"fe80000000000000505400fffe654321 03 40 20 c0     eth1", // tentative
		"20010db8000000000000000000000001 04 40 00 80     eth2", // global scope
		"fe80000000000000505400fffe000001 05 40 20",             // cut short
		"fe80000000000000505400fffe000002 06 40 zz 80     eth4", // not hex
	}, "\n")
	got := parseIfInet6(strings.NewReader(in))
	if !got["eth0"] || len(got) != 1 {
		t.Fatalf("parseIfInet6 = %v, want only eth0", got)
	}
}
