// Command smx runs AI coding agents in microVMs behind a host-side
// permission gateway. See README.md.
package main

import (
	"context"
	"os"

	"github.com/smx-dev/smx/internal/cli"
)

func main() {
	os.Exit(cli.Main(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
