// Command containerd-shim-smx-v1 is smx's containerd runtime (runtime
// type io.containerd.smx.v1): each task runs in its own microVM behind
// smx's gateway. containerd starts it; see docs/kubernetes.md.
package main

import "github.com/smx-dev/smx/internal/shim"

func main() { shim.Main() }
