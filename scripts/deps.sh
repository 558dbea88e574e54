#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 machine: installs whatever hmla's build, tests and
# benches need from Debian's packages, and does nothing when everything is already there.
set -euo pipefail

packages=(
  cmake ninja-build g++ make pkg-config
  googletest libgtest-dev libgmock-dev
  nlohmann-json3-dev libyaml-cpp-dev libcli11-dev
  libsimdjson-dev libzstd-dev zstd  # prepare-data: JSON Lines and zstd-compressed inputs (zstd: cli.corpus makes one)
  libopenblas-openmp-dev
  openmpi-bin libopenmpi-dev
  python3 python3-numpy python3-torch
  libtorch-dev python3-dev pybind11-dev  # hmla.torch (python/): built and tested by make build / make test
  librsvg2-bin  # rsvg-convert: the report test rasterises its SVGs
  libicu-dev libpcre2-dev  # hmla_text: the NF* normalizers (ICU unorm2) and the pre-tokenizer regexes (PCRE2)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
