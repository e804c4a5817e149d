#!/usr/bin/env bash
# Installs every build and test dependency of tilemoe from the registries (Debian packages).
# Idempotent and quiet: it installs only what is missing and says nothing when all is there.
set -euo pipefail

# name of the Debian package : a file (glob) whose presence shows it is installed
required=(
  "cmake:/usr/bin/cmake"
  "g++:/usr/bin/g++"
  "make:/usr/bin/make"
  "libgtest-dev:/usr/include/gtest/gtest.h"
  "libcli11-dev:/usr/include/CLI/CLI.hpp"
  "nlohmann-json3-dev:/usr/include/nlohmann/json.hpp"
  "clang:/usr/bin/clang++"
  "libclang-rt-dev:/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a"
)

missing=()
for entry in "${required[@]}"; do
  package=${entry%%:*}
  marker=${entry#*:}
  compgen -G "$marker" >/dev/null || missing+=("$package")
done

if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "bootstrap: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  log=$(mktemp)
  trap 'rm -f "$log"' EXIT
  if ! { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "bootstrap: could not install ${missing[*]}" >&2
    exit 1
  fi
fi
