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

# CUTLASS headers for the CUDA backend, from PyPI: the nvidia-cutlass wheel carries the C++
# headers under cutlass_library/source. Unpacked into .deps/ (ignored), never committed.
cutlass_version=4.2.0.0
cutlass_dir="$(cd "$(dirname "$0")/.." && pwd)/.deps/cutlass-$cutlass_version"
if [ ! -f "$cutlass_dir/include/cutlass/cutlass.h" ]; then
  command -v python3 >/dev/null || { echo "bootstrap: python3 is needed to fetch CUTLASS" >&2; exit 1; }
  download=$(mktemp -d)
  if ! python3 -m pip download -q --no-deps "nvidia-cutlass==$cutlass_version" -d "$download" >"$download/log" 2>&1; then
    cat "$download/log" >&2
    echo "bootstrap: could not download nvidia-cutlass==$cutlass_version from PyPI" >&2
    exit 1
  fi
  rm -rf "$cutlass_dir.partial"
  python3 - "$download" "$cutlass_dir.partial" <<'PY'
import glob, os, sys, zipfile
download, target = sys.argv[1], sys.argv[2]
wheel = glob.glob(os.path.join(download, "nvidia_cutlass-*.whl"))[0]
prefixes = {"cutlass_library/source/include/": "include/",
            "cutlass_library/source/tools/util/include/": "util/include/"}
with zipfile.ZipFile(wheel) as archive:
    for name in archive.namelist():
        for prefix, dest in prefixes.items():
            if name.startswith(prefix) and not name.endswith("/"):
                out = os.path.join(target, dest, name[len(prefix):])
                os.makedirs(os.path.dirname(out), exist_ok=True)
                with archive.open(name) as src, open(out, "wb") as dst:
                    dst.write(src.read())
PY
  mv "$cutlass_dir.partial" "$cutlass_dir"
  rm -rf "$download"
fi
