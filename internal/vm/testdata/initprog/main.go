// Command initprog is a stand-in PID 1 for vm tests: it loads the modules
// listed by the initramfs (if any), reports what it found on the console and
// powers the machine off.
package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"unsafe"
)

func main() {
	if b, err := os.ReadFile("/etc/smx/modules"); err == nil {
		empty := []byte{0}
		for _, m := range strings.Fields(string(b)) {
			f, err := os.Open(m)
			if err != nil {
				fmt.Printf("SMX-MODULE-FAIL %s: %v\n", m, err)
				continue
			}
			_, _, e := syscall.Syscall(sysFinitModule, f.Fd(), uintptr(unsafe.Pointer(&empty[0])), 0)
			f.Close()
			if e != 0 && e != syscall.EEXIST {
				fmt.Printf("SMX-MODULE-FAIL %s: %v\n", m, e)
			}
		}
	}
	// A kernel with everything built in has no module list: its devices
	// are there all the same.
	{
		os.Mkdir("/sys", 0o755)
		if err := syscall.Mount("sysfs", "/sys", "sysfs", 0, ""); err != nil {
			fmt.Printf("SMX-MOUNT-FAIL %v\n", err)
		}
		ents, _ := os.ReadDir("/sys/bus/virtio/devices")
		var ids []string
		for _, e := range ents {
			id, _ := os.ReadFile("/sys/bus/virtio/devices/" + e.Name() + "/device")
			ids = append(ids, strings.TrimSpace(string(id)))
		}
		fmt.Printf("SMX-VIRTIO-DEVICES %s\n", strings.Join(ids, ","))
		if _, err := os.Stat("/sys/class/block/vda"); err == nil {
			fmt.Println("SMX-DISK vda")
		}
		if ports, _ := os.ReadDir("/sys/class/virtio-ports"); len(ports) > 0 {
			for _, p := range ports {
				name, _ := os.ReadFile("/sys/class/virtio-ports/" + p.Name() + "/name")
				fmt.Printf("SMX-PORT %s\n", strings.TrimSpace(string(name)))
			}
		}
	}
	fmt.Println("SMX-INIT-OK")
	if os.Getpid() == 1 {
		syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF)
	}
}

// sysFinitModule is finit_module(2) on amd64; package syscall lacks it.
const sysFinitModule = 313
