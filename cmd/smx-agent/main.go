// Command smx-agent is the init (PID 1) of an smx guest microVM. Build it
// with CGO_ENABLED=0: it runs from the initramfs, where there is no libc.
package main

import "github.com/smx-dev/smx/internal/guest"

func main() { guest.Main() }
