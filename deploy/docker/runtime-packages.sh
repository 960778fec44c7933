#!/bin/sh
# Prints the packages that own the shared libraries the given binaries load, one a line:
# the build stage of each Dockerfile writes this list and the runtime stage installs it, so
# the runtime image holds exactly what the build linked against. Needs ldd and dpkg.
# Libraries of a CUDA toolkit outside dpkg (/usr/local/cuda from NVIDIA's runfile) are left out:
# the CUDA base image provides them.
# Usage: runtime-packages.sh BINARY...
set -eu
for f in "$@"; do
  [ -x "$f" ] || { echo "runtime-packages: $f is not an executable" >&2; exit 1; }
done
libs=$(ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
pkgs=""
for lib in $libs; do
  real=$(readlink -f "$lib")
  owner=""
  # Debian 12 and Ubuntu 24.04 merge /lib into /usr/lib: dpkg may know either spelling.
  for p in "$lib" "$real" "/usr$lib" "/usr$real" "${lib#/usr}" "${real#/usr}"; do
    if owner=$(dpkg-query -S "$p" 2>/dev/null); then break; fi
    owner=""
  done
  if [ -z "$owner" ]; then
    case "$real" in
      # A CUDA toolkit installed outside dpkg (NVIDIA's runfile): its libraries (cuBLAS, NCCL,
      # cudart) come with the CUDA base image of Dockerfile.gpu, which dpkg does know.
      /usr/local/cuda*) echo "runtime-packages: $lib: from the CUDA toolkit (the CUDA base image holds it)" >&2; continue ;;
    esac
    echo "runtime-packages: no package owns $lib" >&2
    exit 1
  fi
  pkgs="$pkgs ${owner%%:*}"
done
printf '%s\n' $pkgs | sort -u
