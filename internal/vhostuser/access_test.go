package vhostuser

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// QEMU refuses a device with iommu_platform=on unless the backend offers
// its request channel: offered with FeatureAccessPlatform, and only then.
func TestAccessPlatformOffersBackendChannel(t *testing.T) {
	f := newFrontEndWith(t, Config{Queues: 2, Handler: echo{}, Features: FeatureAccessPlatform})
	f.send(reqGetFeatures, 0, nil)
	if feat := binary.LittleEndian.Uint64(f.recv(reqGetFeatures)); feat&FeatureAccessPlatform == 0 {
		t.Fatalf("features %#x lack ACCESS_PLATFORM", feat)
	}
	f.send(reqGetProtocolFeatures, 0, nil)
	pf := binary.LittleEndian.Uint64(f.recv(reqGetProtocolFeatures))
	if pf&ProtocolBackendReq == 0 || pf&ProtocolReplyAck == 0 {
		t.Fatalf("protocol features %#x lack BACKEND_REQ or REPLY_ACK", pf)
	}
	f.send(reqSetProtocolFeatures, 0, u64(ProtocolReplyAck|ProtocolMQ|ProtocolBackendReq))
	f.send(reqSetFeatures, flagNeedReply, u64(FeatureVersion1|FeatureProtocolFeatures|FeatureAccessPlatform))
	f.ack(reqSetFeatures)
	ev, _ := unix.Eventfd(0, unix.EFD_CLOEXEC)
	f.send(reqSetBackendReqFD, flagNeedReply, nil, ev)
	unix.Close(ev)
	f.ack(reqSetBackendReqFD)

	plain := newFrontEndWith(t, Config{Queues: 2, Handler: echo{}})
	plain.send(reqGetProtocolFeatures, 0, nil)
	if pf := binary.LittleEndian.Uint64(plain.recv(reqGetProtocolFeatures)); pf&ProtocolBackendReq != 0 {
		t.Fatalf("protocol features %#x offer BACKEND_REQ without ACCESS_PLATFORM", pf)
	}
	ev, _ = unix.Eventfd(0, unix.EFD_CLOEXEC)
	plain.send(reqSetBackendReqFD, 0, nil, ev)
	unix.Close(ev)
	select {
	case err := <-plain.done:
		if !errors.Is(err, ErrMalformed) {
			t.Fatalf("Serve: %v, want ErrMalformed", err)
		}
		plain.done <- err
	case <-time.After(10 * time.Second):
		t.Fatal("Serve accepted a backend channel it did not offer")
	}
}
