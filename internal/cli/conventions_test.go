package cli

import "testing"

func TestUserMessage(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"tarfs: esc/sub/f: mkdirat esc/sub: statat esc/sub: path escapes from parent", "esc/sub/f: path escapes from parent"},
		{"sandbox dev is created: start it first: failed precondition", "sandbox dev is created: start it first"},
		{"supervisor: QEMU exited during boot: cannot set up guest memory 'microvm.ram': Cannot allocate memory",
			"QEMU exited during boot: cannot set up guest memory 'microvm.ram': Cannot allocate memory"},
		{"guest: exec: start x: exec: \"x\": executable file not found in $PATH", "start x: exec: \"x\": executable file not found in $PATH"},
		{"sandbox x failed to start: boom\nlast console lines:\n  a", "sandbox x failed to start: boom\nlast console lines:\n  a"},
		{"invalid --disk 1K: image busybox needs at least 64.0 MiB: invalid argument", "invalid --disk 1K: image busybox needs at least 64.0 MiB"},
	} {
		if got := userMessage(tt.in); got != tt.want {
			t.Errorf("userMessage(%q)\n = %q\nwant %q", tt.in, got, tt.want)
		}
	}
}
