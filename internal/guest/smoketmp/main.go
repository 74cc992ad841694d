// Temporary manual smoke client; deleted after use.
package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/hashicorp/yamux"

	"smx/internal/agentproto"
	"smx/internal/guest"
)

func main() {
	var c net.Conn
	var err error
	for i := 0; i < 600; i++ {
		c, err = net.Dial("unix", os.Args[1])
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		panic(err)
	}
	sess, err := yamux.Client(c, guest.YamuxConfig())
	if err != nil {
		panic(err)
	}
	t0 := time.Now()
	one := func(req agentproto.Request) {
		st, err := sess.OpenStream()
		if err != nil {
			panic(err)
		}
		defer st.Close()
		agentproto.WriteJSON(st, agentproto.FrameRequest, req)
		if req.Exec != nil && req.Exec.Stdin {
			agentproto.WriteFrame(st, agentproto.FrameStdin, []byte("typed\n"))
			agentproto.WriteFrame(st, agentproto.FrameStdinEOF, nil)
		}
		n := 0
		for {
			typ, p, err := agentproto.ReadFrame(st, nil)
			if err != nil {
				fmt.Println("read:", err)
				return
			}
			switch typ {
			case agentproto.FrameStdout, agentproto.FrameStderr:
				n += len(p)
				if n < 4000 {
					fmt.Printf("[%s] %s", typ, p)
				}
			case agentproto.FrameData:
				n += len(p)
			default:
				fmt.Printf("[%s] %s (%d bytes out) t=%v\n", typ, p, n, time.Since(t0).Round(time.Millisecond))
				if typ != agentproto.FrameStarted {
					return
				}
			}
		}
	}
	// The first request waits until the guest serves.
	one(agentproto.Request{Op: agentproto.OpHealth})
	one(agentproto.Request{Op: agentproto.OpExec, Exec: &agentproto.ExecRequest{Args: []string{"cat", "/proc/version"}}})
	one(agentproto.Request{Op: agentproto.OpExec, Exec: &agentproto.ExecRequest{Args: []string{"sh", "-c", "id; hostname; pwd; cat /proc/mounts; ls -la /dev /tmp | head -50; ls /; cat /proc/1/status | grep -i vmrss; ip addr 2>/dev/null; cat /sys/class/net/lo/operstate"}}})
	one(agentproto.Request{Op: agentproto.OpExec, Exec: &agentproto.ExecRequest{Args: []string{"sh", "-c", "id; pwd; echo $HOME"}, User: "alice"}})
	one(agentproto.Request{Op: agentproto.OpExec, Exec: &agentproto.ExecRequest{Args: []string{"sh", "-c", "tty; stty size; read x; echo got $x"}, TTY: true, Stdin: true, Size: &agentproto.WindowSize{Rows: 33, Cols: 99}}})
	one(agentproto.Request{Op: agentproto.OpExec, Exec: &agentproto.ExecRequest{Args: []string{"head", "-c", "50000000", "/dev/zero"}}})
	one(agentproto.Request{Op: agentproto.OpExec, Exec: &agentproto.ExecRequest{Args: []string{"dd", "if=/dev/zero", "bs=65536", "count=800"}}})
	one(agentproto.Request{Op: agentproto.OpExec, Exec: &agentproto.ExecRequest{Args: []string{"sh", "-c", "time dd if=/dev/zero of=/dev/null bs=65536 count=800"}}})
	one(agentproto.Request{Op: agentproto.OpExec, Exec: &agentproto.ExecRequest{Args: []string{"nope"}}})
	one(agentproto.Request{Op: agentproto.OpSetTime, TimeUnixNano: time.Now().UnixNano()})
	ent := make([]byte, 64)
	one(agentproto.Request{Op: agentproto.OpAddEntropy, Entropy: ent})
	one(agentproto.Request{Op: agentproto.OpCopyOut, Path: "/etc"})
	one(agentproto.Request{Op: agentproto.OpExec, Exec: &agentproto.ExecRequest{Args: []string{"sh", "-c", "sleep 100 & sleep 0.2; echo orphan started"}}})
	one(agentproto.Request{Op: agentproto.OpExec, Exec: &agentproto.ExecRequest{Args: []string{"sh", "-c", "date; ps -o pid,ppid,stat,comm"}}})
	_ = json.Marshal
	if len(os.Args) > 2 {
		return
	}
	one(agentproto.Request{Op: agentproto.OpPowerOff})
	time.Sleep(500 * time.Millisecond)
}
