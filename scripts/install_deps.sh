#!/usr/bin/env bash
# Installs every build and test dependency of moeshard from Debian 12's packages.
# Idempotent: does nothing when all packages are present. Runs as root (CI) or via sudo.
set -euo pipefail
# The build's packages: deploy/docker/Dockerfile.cpu installs the same (tests/deploy checks it).
PKGS=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  libabsl-dev prometheus-cpp-dev libgtest-dev libgmock-dev libgloo-dev
  libpcre2-dev libicu-dev nlohmann-json3-dev libcpp-httplib-dev libssl-dev zlib1g-dev
)
# What only the tests use (tests/deploy: compose, YAML, Prometheus checks; xz unpacks tests/testdata).
PKGS+=(
  curl prometheus docker-compose yamllint python3 python3-yaml xz-utils
)
# make test-fuzz: clang's libFuzzer and sanitizer runtimes; tests/security: ps, ss.
PKGS+=(
  clang libclang-rt-14-dev procps iproute2
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm (for the real-client tests): any install will do; Debian's if none.
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
echo "install_deps: installing ${missing[*]}"
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
