//go:build !amd64

package vm

func measureTSCKHz() int { return 0 }
