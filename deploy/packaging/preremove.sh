#!/bin/sh
# kvmesh .deb/.rpm pre-remove: stop and disable the node on removal (not on upgrade).
# dpkg passes "remove" (or "upgrade"), rpm the number of versions left after it (0: removal).
set -e
case "$1" in
  remove|0)
    if [ -d /run/systemd/system ]; then
      systemctl disable --now kvmesh.service >/dev/null 2>&1 || true
    fi
    ;;
esac
