#!/usr/bin/env bash
# make deploy-check: validates what kvmesh ships besides its Go code.
#   1. the release build (make build-release, as the Dockerfile runs it): stripped, -trimpath,
#      the version, only glibc linked, and a node that starts, answers kvmesh health and
#      drains on SIGTERM on a host without the NVIDIA driver; a second node started with a
#      running node's name (a cloned host) refuses to start and the first keeps its traffic;
#   2. the systemd unit: systemd-analyze verify and its security exposure, the env file's and
#      the chart's KVMESH_* names against kvmesh's own;
#   3. deploy/check (a Go module of its own): the Dockerfile and .dockerignore, helm lint and
#      the rendered chart decoded strictly into the Kubernetes API types, the release
#      configuration and the .deb and .rpm nfpm builds from it;
#   4. goreleaser check, when goreleaser is on PATH (its module is not installed here).
# Tools it lacks are installed: helm and nfpm from the Go module proxy into $(go env GOPATH)/bin,
# kept there for the next run; systemd-analyze and dpkg-deb from Debian's packages.
set -euo pipefail
cd "$(dirname "$0")/.."

HELM_VERSION=v4.3.2
NFPM_VERSION=v2.48.0
GOBIN="$(go env GOPATH)/bin"
export PATH="$GOBIN:$PATH"

step() { printf '\n== %s\n' "$*"; }
fail() { echo "deploy-check: $*" >&2; exit 1; }

# go_tool NAME MODULE VERSION: install NAME from MODULE@VERSION unless that build is on PATH.
go_tool() {
  local name=$1 module=$2 version=$3 have
  have=$(command -v "$name" 2>/dev/null || true)
  if [ -n "$have" ] && go version -m "$have" 2>/dev/null | grep -qE "^[[:space:]]+mod[[:space:]]+${module%%/cmd/*}[[:space:]]+$version\b"; then
    echo "$name $version: $have"
    return
  fi
  echo "installing $name $version from the Go module proxy (once; kept in $GOBIN)"
  local start=$SECONDS
  GOBIN="$GOBIN" go install "$module@$version"
  echo "installed $name $version in $((SECONDS - start))s"
}

# deb_tool COMMAND PACKAGE: install PACKAGE from Debian's archive when COMMAND is missing.
deb_tool() {
  command -v "$1" >/dev/null && return
  command -v apt-get >/dev/null || fail "$1 is missing and there is no apt-get to install $2"
  echo "installing $2 for $1"
  local start=$SECONDS
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2" >/dev/null
  echo "installed $2 in $((SECONDS - start))s"
}

step "tools"
go_tool helm helm.sh/helm/v4/cmd/helm "$HELM_VERSION"
go_tool nfpm github.com/goreleaser/nfpm/v2/cmd/nfpm "$NFPM_VERSION"
deb_tool systemd-analyze systemd
deb_tool dpkg-deb dpkg
deb_tool readelf binutils
deb_tool curl curl

work=$(mktemp -d)
node_pid=""
pids=()
cleanup() {
  if [ -n "$node_pid" ]; then kill "$node_pid" 2>/dev/null || true; fi
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

step "release build (make build-release, as in the Dockerfile)"
version=$(deploy/version.sh)
make --no-print-directory build-release VERSION="$version" OUT="$work/kvmesh"
bin="$work/kvmesh"
[ "$("$bin" version)" = "kvmesh $version" ] || fail "the release binary says '$("$bin" version)', want 'kvmesh $version'"
if readelf -S --wide "$bin" | grep -qE '\.(symtab|debug_[a-z]+)\b'; then
  fail "the release binary has a symbol table or DWARF: -s -w did not apply"
fi
go version -m "$bin" | grep -q -- '-trimpath=true' || fail "the release binary was not built with -trimpath"
go version -m "$bin" | grep -q 'CGO_ENABLED=1' || fail "the release binary was built without cgo: go-nvml needs it"
needed=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort | tr '\n' ' ')
[ "$needed" = "libc.so.6 " ] || fail "the release binary links '$needed'; want only libc.so.6 (bookworm-slim's glibc; NVML is dlopened)"
echo "kvmesh $version: stripped, -trimpath, cgo, links only libc.so.6"

step "the release binary on a host without the NVIDIA driver"
"$bin" --log-format text node --insecure-dev --name check --http 127.0.0.1:0 --gossip 127.0.0.1:0 \
  --quic 127.0.0.1:0 --gpu auto --drain-timeout 5s >"$work/node.log" 2>&1 &
node_pid=$!
deadline=$((SECONDS + 30))
addr=""
until [ -n "$addr" ] && KVMESH_HTTP="$addr" "$bin" health --ready --timeout 1s 2>/dev/null; do
  kill -0 "$node_pid" 2>/dev/null || { cat "$work/node.log"; fail "the node exited at start"; }
  [ $SECONDS -lt $deadline ] || { cat "$work/node.log"; fail "the node was not ready in 30s"; }
  addr=$(sed -n 's/.* msg=serving .* http=\([^ ]*\) .*/\1/p' "$work/node.log")
  sleep 0.2
done
KVMESH_HTTP="$addr" "$bin" health || fail "kvmesh health failed against a ready node"
grep -q "msg=serving .* version=$version" "$work/node.log" || { cat "$work/node.log"; fail "the node does not log version=$version"; }
grep -q 'running without GPU telemetry' "$work/node.log" || { cat "$work/node.log"; fail "no 'running without GPU telemetry' line: NVML's absence was not handled as documented"; }
kill -TERM "$node_pid"
wait "$node_pid" || { cat "$work/node.log"; fail "the node did not exit 0 after SIGTERM"; }
node_pid=""
if "$bin" health --http "$addr" --timeout 1s 2>/dev/null; then fail "kvmesh health passed with no node"; fi
echo "started without libnvidia-ml, ready, healthy, drained and exited 0 on SIGTERM"

step "a second node with a running node's name (a cloned host or a restored backup)"
# start_node NAME ARGS...: a node on loopback ports under the shared dev CA; its log is
# $work/NAME.log (NAME.2.log for a second one), its pid in $pid.
start_node() {
  local name=$1 log=$work/$1.log; shift
  [ -e "$log" ] && log=$work/$name.2.log
  "$bin" --log-format text node --insecure-dev --dev-ca-dir "$work/dev-ca" --name "$name" \
    --http 127.0.0.1:0 --gossip 127.0.0.1:0 --quic 127.0.0.1:0 --drain-delay -1s "$@" >"$log" 2>&1 &
  pid=$!
  pids+=("$pid")
}
# serving LOG PID FIELD: the node's FIELD (http, gossip) from its serving line, once ready.
serving() {
  local log=$1 pid=$2 field=$3 deadline=$((SECONDS + 20)) v=""
  until [ -n "$v" ]; do
    kill -0 "$pid" 2>/dev/null || { cat "$log"; fail "$log: the node exited at start"; }
    [ $SECONDS -lt $deadline ] || { cat "$log"; fail "$log: not serving in 20s"; }
    sleep 0.2
    v=$(sed -n "s/.* msg=serving .* $field=\([^ ]*\) .*/\1/p" "$log")
  done
  echo "$v"
}

start_node n1 --model model-a; p1=$pid
gossip1=$(serving "$work/n1.log" "$p1" gossip)
start_node n2 --model model-b --join "$gossip1"; p2=$pid
http2=$(serving "$work/n2.log" "$p2" http)
# ask: n2 asked for model-a, which n1 alone serves; prints the node that ran it.
ask() {
  curl -sS -m 10 -o /dev/null -D - "http://$http2/v1/chat/completions" \
    -H 'Content-Type: application/json' \
    -d '{"model":"model-a","messages":[{"role":"user","content":"hi"}],"max_tokens":2}' |
    tr -d '\r' | sed -n 's/^[Xx]-[Kk]vmesh-[Nn]ode: //p'
}
deadline=$((SECONDS + 20))
until [ "$(ask 2>/dev/null)" = n1 ]; do
  [ $SECONDS -lt $deadline ] || { cat "$work/n1.log" "$work/n2.log"; fail "n2 did not forward model-a to n1 in 20s"; }
  sleep 0.2
done
start_node n1 --model model-a --join "$(serving "$work/n2.log" "$p2" gossip)"; dup=$pid
deadline=$((SECONDS + 20))
while kill -0 "$dup" 2>/dev/null; do
  [ $SECONDS -lt $deadline ] || { cat "$work/n1.2.log"; fail "a second n1 still runs after 20s"; }
  sleep 0.2
done
if wait "$dup"; then cat "$work/n1.2.log"; fail "a second n1 exited 0"; fi
grep -q 'name conflict' "$work/n1.2.log" || { cat "$work/n1.2.log"; fail "the second n1 does not say why it refused to start"; }
deadline=$((SECONDS + 10))
until grep -q 'level=ERROR .*name conflict' "$work/n1.log"; do
  [ $SECONDS -lt $deadline ] || { cat "$work/n1.log"; fail "n1 logged no ERROR about the second n1"; }
  sleep 0.2
done
for i in 1 2 3 4 5; do
  ran=$(ask) || fail "n2 failed model-a after the second n1"
  [ "$ran" = n1 ] || { cat "$work/n1.log" "$work/n2.log"; fail "model-a ran on '$ran' after the second n1, want n1"; }
done
kill "$p1" "$p2"; pids=()
echo "a second n1 refused to start, n1 logged the conflict and kept model-a's traffic"

step "systemd unit"
unit="$work/kvmesh.service"
sed "s#^ExecStart=/usr/bin/kvmesh #ExecStart=$bin #" deploy/systemd/kvmesh.service >"$unit"
grep -q "^ExecStart=$bin node" "$unit" || fail "kvmesh.service: no 'ExecStart=/usr/bin/kvmesh node' line to verify"
# verify exits 0 on unknown keys and bad values, printing them: any output is a failure.
out=$(systemd-analyze verify "$unit" 2>&1) || true
[ -z "$out" ] || fail "systemd-analyze verify kvmesh.service: $out"
# 1.5 with every setting in place; losing any one of the required ones raises it to 1.7 or more.
systemd-analyze security --offline=yes --threshold=16 "$unit" >"$work/security.txt" 2>&1 ||
  { cat "$work/security.txt"; fail "kvmesh.service's exposure rose above 1.6: a hardening setting was lost"; }
grep 'Overall exposure' "$work/security.txt"
for want in User=kvmesh NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes PrivateTmp=yes \
  CapabilityBoundingSet= 'RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK' \
  DevicePolicy=closed 'DeviceAllow=char-nvidia\* rw' StateDirectory=kvmesh Restart=on-failure \
  KillSignal=SIGTERM EnvironmentFile=/etc/kvmesh/kvmesh.env 'ExecReload=/bin/kill -HUP \$MAINPID'; do
  grep -qx "$want" deploy/systemd/kvmesh.service || fail "kvmesh.service lacks the line $want"
done
stop=$(sed -n 's/^TimeoutStopSec=\([0-9]*\)s$/\1/p' deploy/systemd/kvmesh.service)
drain=$("$bin" node --help | sed -n 's/.*--drain-timeout value.*(default: \([0-9]*\)s).*/\1/p')
if [ -z "$stop" ] || [ -z "$drain" ] || [ "$stop" -le "$drain" ]; then
  fail "TimeoutStopSec (${stop:-?}s) must exceed the default drain (${drain:-?}s)"
fi
echo "TimeoutStopSec=${stop}s outlasts the default drain (${drain}s)"

step "KVMESH_* names in the env file and the chart"
known=$( { "$bin" --help; "$bin" node --help; } | grep -o 'KVMESH_[A-Z][A-Z0-9_]*' | sort -u)
for f in deploy/systemd/kvmesh.env deploy/helm/kvmesh/templates/_helpers.tpl deploy/helm/kvmesh/values.yaml; do
  while read -r v; do
    grep -qx "$v" <<<"$known" || fail "$f names $v, which kvmesh node does not read"
  done < <(grep -o 'KVMESH_[A-Z][A-Z0-9_]*' "$f" | sort -u)
done
echo "every KVMESH_* variable named is one kvmesh node reads"

step "deploy/check: Dockerfile, Helm chart, release configuration, packages"
(cd deploy/check && go vet ./... && KVMESH_DEPLOY_CHECK_STRICT=1 go test -count=1 ./...)

step "goreleaser"
make --no-print-directory release-check
