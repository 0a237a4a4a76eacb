# syntax=docker/dockerfile:1
# kvmesh node image: docs/operating.md#containers.
#   docker build --build-arg VERSION=$(deploy/version.sh) -t kvmesh:$(deploy/version.sh) .   (or: make image)
#   docker run --gpus all -e KVMESH_GOSSIP_KEY -v /etc/kvmesh/tls:/etc/kvmesh/tls:ro \
#     -e KVMESH_TLS_DIR=/etc/kvmesh/tls -e KVMESH_NAME=gpu-01 --network host kvmesh:TAG
#
# The build stage compiles with cgo for go-nvml, which dlopens libnvidia-ml.so.1 at run time:
# the image carries no NVIDIA library. With the NVIDIA container runtime (--gpus, or
# runtimeClassName: nvidia) the driver's library is mounted and the node reads GPU telemetry;
# without it the node logs "running without GPU telemetry" and runs on.

ARG GO_IMAGE=golang:1.26-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${GO_IMAGE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=v0.0.0-dev
# make build-release: CGO_ENABLED=1, -trimpath, -ldflags "-s -w -X ...node.Version=$VERSION".
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    make build-release VERSION="${VERSION}" OUT=/out/kvmesh && /out/kvmesh version

# bookworm-slim, not distroless: the same glibc as the build stage, and a shell and coreutils
# for the Helm chart's init container, which places the node's certificate under its name.
FROM ${RUNTIME_IMAGE}
ARG VERSION=v0.0.0-dev
LABEL org.opencontainers.image.title="kvmesh" \
      org.opencontainers.image.description="Peer-to-peer admission and routing mesh for LLM inference" \
      org.opencontainers.image.source="https://github.com/kvmesh/kvmesh" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
# Root CAs for the carbon providers' HTTPS APIs, without apt in the final image.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
RUN groupadd --system --gid 65532 kvmesh \
 && useradd --system --uid 65532 --gid 65532 --home-dir /var/lib/kvmesh --no-create-home \
      --shell /usr/sbin/nologin kvmesh \
 && install -d -o 65532 -g 65532 -m 0750 /var/lib/kvmesh
COPY --from=build /out/kvmesh /usr/local/bin/kvmesh
# NVML needs the driver's "utility" capability only, not compute.
ENV NVIDIA_DRIVER_CAPABILITIES=utility \
    KVMESH_LOG_FORMAT=json
# HTTP API, /metrics, /healthz, /readyz
EXPOSE 8080/tcp
# gossip (memberlist): both UDP and TCP between every pair of nodes
EXPOSE 7946/tcp 7946/udp
# QUIC forwarding between nodes (mutual TLS)
EXPOSE 7443/udp
USER 65532:65532
WORKDIR /var/lib/kvmesh
# kvmesh health asks 127.0.0.1 on the port of KVMESH_HTTP, as the node listens.
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/kvmesh", "health"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/kvmesh"]
CMD ["node"]
