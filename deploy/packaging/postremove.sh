#!/bin/sh
# kvmesh .deb/.rpm post-remove: systemd forgets the unit. /etc/kvmesh, /var/lib/kvmesh and the
# kvmesh user stay (dpkg --purge removes the env file, as a conffile).
set -e
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
fi
