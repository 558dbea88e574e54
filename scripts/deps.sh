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

# cuDNN's fused attention (the CUDA backend's dense path on sm_90) is built against the pinned,
# header-only cudnn-frontend from PyPI, its wheel downloaded (--no-deps) and unpacked outside the tree, where CMake
# looks (HMLA_CUDNN_FRONTEND_DIR). A CPU-only machine (no nvcc) does not need it.
cudnn_frontend() {
  local version=1.32.0 dest="${HOME}/.cache/hmla/cudnn-frontend-1.32.0"
  [ -f "$dest/include/cudnn_frontend.h" ] && return 0
  command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || return 0
  if ! python3 -m pip --version >/dev/null 2>&1; then install_debian python3-pip; fi
  echo "deps: fetching nvidia-cudnn-frontend==$version (headers) into $dest"
  local tmp
  tmp=$(mktemp -d "${HOME}/.cache/hmla/.cudnn-frontend.XXXXXX")
  # Downloaded and unpacked, not installed: nothing enters any Python environment (Debian's
  # externally managed one included), and only the headers are used.
  python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$tmp/wheel" \
    "nvidia-cudnn-frontend==$version"
  python3 -m zipfile -e "$tmp"/wheel/nvidia_cudnn_frontend-"$version"-*.whl "$tmp/unpacked"
  [ -f "$tmp/unpacked/include/cudnn_frontend.h" ] || { echo "deps: nvidia-cudnn-frontend $version has no include/cudnn_frontend.h" >&2; exit 1; }
  mkdir -p "$tmp/pkg" && mv "$tmp/unpacked/include" "$tmp/pkg/include"
  rm -rf "$dest" && mv "$tmp/pkg" "$dest" && rm -rf "$tmp"  # whole or absent: a half-installed copy never looks installed
}

install_debian() {
  echo "deps: installing $*"
  local sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "$@"
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] || install_debian "${missing[@]}"
mkdir -p "${HOME}/.cache/hmla"
cudnn_frontend
