#!/usr/bin/env bash
# Installs the Debian packages dsinfer builds with, when any is missing (see README "Dependencies").
set -euo pipefail

packages=(g++ cmake ninja-build pkg-config nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev
          libopenblas-dev libgtest-dev openmpi-bin libopenmpi-dev libpcre2-dev
          clang libclang-rt-14-dev libcpp-httplib-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing: ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
