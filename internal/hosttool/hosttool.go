// Package hosttool finds the host programs smx runs (mkfs.ext4, debugfs,
// depmod, qemu-img, ...). Debian installs several of them in /usr/sbin,
// which is not on an ordinary user's PATH, so a rootless `smx setup` must
// look there too instead of reporting them missing.
package hosttool

import (
	"os/exec"
	"path/filepath"
)

// sbinDirs are searched, in order, after PATH.
var sbinDirs = []string{"/usr/local/sbin", "/usr/sbin", "/sbin"}

// Look returns the path of the program name: from PATH when it is there,
// else from the distribution's sbin directories. A name with a slash is
// checked as it is. The error is exec.LookPath's for PATH.
func Look(name string) (string, error) {
	p, err := exec.LookPath(name)
	if err == nil || filepath.Base(name) != name {
		return p, err
	}
	for _, d := range sbinDirs {
		if q, err2 := exec.LookPath(filepath.Join(d, name)); err2 == nil {
			return q, nil
		}
	}
	return "", err
}
