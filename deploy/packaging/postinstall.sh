#!/bin/sh
# kvmesh .deb/.rpm post-install: the kvmesh user, /etc/kvmesh/tls readable by it, systemd told
# of the unit. The node is not enabled or started: it needs /etc/kvmesh/kvmesh.env and its
# certificates first (docs/operating.md#systemd).
set -e
if command -v systemd-sysusers >/dev/null 2>&1; then
  systemd-sysusers /usr/lib/sysusers.d/kvmesh.conf
elif ! getent passwd kvmesh >/dev/null; then
  useradd --system --user-group --home-dir /var/lib/kvmesh --no-create-home \
    --shell /usr/sbin/nologin --comment "kvmesh node" kvmesh
fi
if [ ! -d /etc/kvmesh/tls ]; then
  install -d -m 0750 -o root -g kvmesh /etc/kvmesh/tls
fi
chmod 0600 /etc/kvmesh/kvmesh.env
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
fi
