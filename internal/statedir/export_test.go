package statedir

import (
	"os"

	"golang.org/x/sys/unix"
)

func flockShared(f *os.File) error { return unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB) }
