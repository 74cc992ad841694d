package testutil

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestNetHost checks the test upstream itself: its servers answer from the
// host on every address, a closed port refuses, and nothing is left behind.
func TestNetHost(t *testing.T) {
	var ns string
	t.Run("serve", func(t *testing.T) {
		h := NewNetHost(t)
		ns = h.NS
		for _, ip := range append(h.PublicIPs, h.PrivateIP) {
			resp, err := http.Get("http://" + ip.String() + "/")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != "hello from netns\n" {
				t.Fatalf("%v: got %q", ip, b)
			}
		}
		tc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		resp, err := tc.Get("https://" + h.PublicIPs[1].String() + "/bytes?n=1000")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if len(b) != 1000 {
			t.Fatalf("https /bytes: %d bytes", len(b))
		}
		c, err := net.Dial("udp", netip.AddrPortFrom(h.PublicIPs[0], NetHostUDPEcho).String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		c.Write([]byte("ping"))
		buf := make([]byte, 10)
		if n, err := c.Read(buf); err != nil || string(buf[:n]) != "ping" {
			t.Fatalf("udp echo: %q %v", buf[:n], err)
		}
		if _, err := net.DialTimeout("tcp", netip.AddrPortFrom(h.PublicIPs[0], NetHostClosed).String(), 3*time.Second); err == nil {
			t.Fatal("closed port accepted")
		}
	})
	if ns == "" {
		return
	}
	out, _ := exec.Command("ip", "netns", "list").Output()
	links, _ := exec.Command("ip", "-br", "link").Output()
	if strings.Contains(string(out), ns) || strings.Contains(string(links), ns) {
		t.Fatalf("%s left behind:\n%s\n%s", ns, out, links)
	}
}
