// Command poweroff is the init of the bare-QEMU baseline: it powers the
// machine off at once.
package main

import "syscall"

func main() {
	syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF)
	select {}
}
