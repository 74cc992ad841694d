// Command hanginit is a guest init that never answers the host: it stands
// in for a guest agent that hangs, in TestGuestAgentNotAnswering.
package main

import "time"

func main() {
	for {
		time.Sleep(time.Hour)
	}
}
