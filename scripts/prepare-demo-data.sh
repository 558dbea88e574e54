#!/usr/bin/env bash
# Rebuilds data/demo from Debian's `fortunes` package (six files, ~665 KB of text).
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download fortunes >/dev/null && dpkg-deb -x fortunes_*.deb root)
f="$tmp/root/usr/share/games/fortunes"
build/bin/hmla prepare-data "$f/computers" "$f/science" "$f/wisdom" "$f/people" "$f/education" "$f/humorists" \
  --out data/demo
