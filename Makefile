SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := build

# v0.1.0 on a release tag, v0.1.0-3-gabc1234 after it, v0.0.0-N-gHASH before the first tag.
VERSION ?= $(shell deploy/version.sh)
LDFLAGS := -X github.com/kvmesh/kvmesh/node.Version=$(VERSION)
# Release binaries (the container image, make build-release): no symbol table or DWARF, no
# build paths. cgo stays on: go-nvml dlopens libnvidia-ml at run time, so a host without the
# driver still runs the binary (without GPU telemetry).
RELEASE_LDFLAGS := -s -w $(LDFLAGS)
OUT ?= bin/kvmesh
IMAGE ?= kvmesh
# go-nvml's headers warn about deprecated NVML calls; the warnings say nothing about kvmesh.
export CGO_CFLAGS ?= -Wno-deprecated-declarations
GO ?= go
NODES ?= 3
FUZZTIME ?= 10s
# The Mooncake conversation trace (kvcache-ai/Mooncake, FAST25-release/traces, Apache-2.0) the
# README's trace bench replays: pinned to a commit and checked against its SHA-256. TRACE_URL
# may name a mirror or a local copy (file:///path).
TRACE ?= traces/mooncake_conversation_trace.jsonl
TRACE_URL ?= https://raw.githubusercontent.com/kvcache-ai/Mooncake/a2a4b18ac537fd798d50e6e9f57031ce86419a37/FAST25-release/traces/conversation_trace.jsonl
TRACE_SHA256 := b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df

.PHONY: build build-release image test bench fuzz lint testnet trace tidy-check deploy-check release-check clean

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/kvmesh ./cmd/kvmesh

# The release build the Dockerfile runs: OUT (bin/kvmesh), stripped, -trimpath, cgo on.
build-release:
	CGO_ENABLED=1 $(GO) build -trimpath -ldflags '$(RELEASE_LDFLAGS)' -o $(OUT) ./cmd/kvmesh

# The container image (needs a Docker daemon with BuildKit); docs/operating.md#containers.
image:
	docker build --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION) .

test:
	$(GO) test -race -count=1 -timeout 15m ./...

# Go benchmarks (the minute-long mesh ones are run by hand, see the README), then a short
# goodput benchmark of the mesh.
bench: build
	$(GO) test -run '^$$' -bench . -skip 'Agents|PrefixPropagation16|ForwardHop|Scale' -benchmem -benchtime 500ms ./...
	bin/kvmesh --log-level error bench --nodes 2 --duration 5s --probe-duration 5s --loads 0.5,1.5 --policies cache-aware,kvmesh

# Each fuzz target runs for FUZZTIME; go test -fuzz takes one target at a time.
fuzz:
	for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

lint:
	$(GO) vet ./...
	test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }

testnet: build
	bin/kvmesh testnet --nodes $(NODES)

# Downloads TRACE once (a present file whose checksum matches is kept), for bench --trace.
# Not part of test or CI: it needs the network.
trace:
	sum() { if command -v sha256sum >/dev/null; then sha256sum "$$1"; else shasum -a 256 "$$1"; fi | cut -d' ' -f1; }; \
	if [ -f '$(TRACE)' ] && [ "$$(sum '$(TRACE)')" = '$(TRACE_SHA256)' ]; then echo '$(TRACE): present, checksum ok'; exit 0; fi; \
	mkdir -p "$$(dirname '$(TRACE)')"; \
	curl -fL --retry 3 -o '$(TRACE).part' '$(TRACE_URL)'; \
	got="$$(sum '$(TRACE).part')"; \
	if [ "$$got" != '$(TRACE_SHA256)' ]; then rm -f '$(TRACE).part'; echo "$(TRACE_URL): sha256 $$got, want $(TRACE_SHA256)" >&2; exit 1; fi; \
	mv '$(TRACE).part' '$(TRACE)'; echo '$(TRACE): downloaded, checksum ok'

tidy-check:
	cp go.mod /tmp/kvmesh-go.mod.bak; cp go.sum /tmp/kvmesh-go.sum.bak
	$(GO) mod tidy
	ok=1; git diff --quiet -- go.mod go.sum || ok=0; \
	cp /tmp/kvmesh-go.mod.bak go.mod; cp /tmp/kvmesh-go.sum.bak go.sum; \
	[ $$ok = 1 ] || { echo "go.mod/go.sum are not tidy: run go mod tidy"; exit 1; }

# The systemd unit, the Helm chart, the release build and the packaging files: deploy/check.sh.
deploy-check:
	deploy/check.sh

# goreleaser's own check of .goreleaser.yaml, when goreleaser is installed.
release-check:
	@if command -v goreleaser >/dev/null; then goreleaser check; else echo "goreleaser not on PATH: skipping goreleaser check"; fi

clean:
	rm -rf bin dist
