# Builds the two binaries smx needs side by side: the CLI (which is also the
# per-sandbox supervisor) and the static guest agent it puts in the initramfs.
GO ?= go
BIN ?= bin

.PHONY: all test clean
all: $(BIN)/smx $(BIN)/smx-agent $(BIN)/containerd-shim-smx-v1

$(BIN)/smx: FORCE
	$(GO) build -o $@ ./cmd/smx

# containerd's runtime io.containerd.smx.v1 (docs/kubernetes.md).
$(BIN)/containerd-shim-smx-v1: FORCE
	$(GO) build -o $@ ./cmd/containerd-shim-smx-v1

$(BIN)/smx-agent: FORCE
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $@ ./cmd/smx-agent

test: all
	$(GO) test ./...

clean:
	rm -rf $(BIN)

FORCE:
