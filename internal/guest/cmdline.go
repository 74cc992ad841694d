package guest

import (
	"strings"
)

// Cmdline is what smx-agent takes from the kernel command line.
type Cmdline struct {
	// Root is the block device holding the ext4 root filesystem
	// (smx.root=). Empty means the initramfs stays the root.
	Root string
	// Hostname is smx.hostname=, "smx" when absent.
	Hostname string
	// Debug is smx.debug=1: log every step to the console.
	Debug bool
	// Net is smx.net=ADDR/PREFIX,GATEWAY: configure the NIC. Empty: no
	// network.
	Net string
	// Shares is smx.shares=1: the sandbox has host folders mounted, so
	// the 9p modules are loaded at boot.
	Shares bool
	// ModuleParams holds "modname.param=value" arguments by module name
	// (with '-' folded to '_', as the kernel does), in the form finit_module
	// wants them: "param=value".
	ModuleParams map[string][]string
}

// ParseCmdline parses the contents of /proc/cmdline.
func ParseCmdline(s string) Cmdline {
	c := Cmdline{Hostname: "smx", ModuleParams: map[string][]string{}}
	for _, arg := range splitCmdline(s) {
		key, val, _ := strings.Cut(arg, "=")
		switch key {
		case "smx.root":
			c.Root = val
			continue
		case "smx.hostname":
			if val != "" {
				c.Hostname = val
			}
			continue
		case "smx.net":
			c.Net = val
			continue
		case "smx.shares":
			c.Shares = val == "1"
			continue
		case "smx.debug":
			c.Debug = val == "1" || val == "true" || val == "yes"
			continue
		}
		mod, param, ok := strings.Cut(key, ".")
		if !ok || mod == "" || param == "" || mod == "smx" {
			continue
		}
		p := param
		if strings.Contains(arg, "=") {
			if strings.ContainsAny(val, " \t") {
				// finit_module parses its argument string like the kernel
				// command line, so a value with blanks must be quoted again.
				val = `"` + val + `"`
			}
			p = param + "=" + val
		}
		name := moduleName(mod)
		c.ModuleParams[name] = append(c.ModuleParams[name], p)
	}
	return c
}

// moduleName normalises a module name: the kernel treats '-' and '_' alike.
func moduleName(s string) string {
	return strings.ReplaceAll(s, "-", "_")
}

// splitCmdline splits on blanks outside double quotes and drops the quotes,
// the way the kernel's next_arg does.
func splitCmdline(s string) []string {
	var (
		args  []string
		cur   strings.Builder
		quote bool
		have  bool
	)
	for _, r := range s {
		switch {
		case r == '"':
			quote = !quote
			have = true
		case !quote && (r == ' ' || r == '\t' || r == '\n'):
			if have {
				args = append(args, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteRune(r)
			have = true
		}
	}
	if have {
		args = append(args, cur.String())
	}
	return args
}
