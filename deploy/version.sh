#!/usr/bin/env bash
# Prints kvmesh's version from git, semver-shaped: v0.1.0 on a release tag, v0.1.0-3-gabc1234
# three commits after it, v0.0.0-42-gabc1234 before the first tag; -dirty when the work tree
# has changes. Outside a git checkout: v0.0.0-dev.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo v0.0.0-dev
  exit 0
fi
if v=$(git describe --tags --match 'v[0-9]*.[0-9]*.[0-9]*' --abbrev=7 --dirty 2>/dev/null); then
  echo "$v"
  exit 0
fi
dirty=""
git diff --quiet HEAD -- 2>/dev/null || dirty=-dirty
echo "v0.0.0-$(git rev-list --count HEAD)-g$(git rev-parse --short=7 HEAD)$dirty"
