package cli_test

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/rogpeppe/go-internal/testscript"
)

// httpget URL fetches URL from the host and writes the body to stdout;
// it fails on an error or a status other than 200.
func cmdHTTPGet(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 1 {
		ts.Fatalf("usage: httpget URL")
	}
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(args[0])
	if err == nil {
		var b []byte
		b, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		ts.Stdout().Write(b)
		if err == nil && resp.StatusCode != http.StatusOK {
			ts.Logf("status %s", resp.Status)
			err = io.ErrUnexpectedEOF
		}
	}
	if neg {
		if err == nil {
			ts.Fatalf("GET %s succeeded", args[0])
		}
		return
	}
	ts.Check(err)
}

// freeport VAR sets VAR to a TCP port free on host loopback just now.
func cmdFreePort(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 1 {
		ts.Fatalf("usage: freeport VAR")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	ts.Check(err)
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	ts.Setenv(args[0], strconv.Itoa(port))
}
