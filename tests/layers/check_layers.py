#!/usr/bin/env python3
"""Checks the layering of src/ by reading every #include, headers included.

The build already fails on an upward include in a file a layer compiles (each layer's include
root holds only itself and the layers below: cmake/TilemoeLayers.cmake). A header that no file
of its own layer compiles could still include upwards unnoticed when a higher layer includes
it; this check reads every file. Also refused: includes that climb out of a folder ("../"),
which would bypass the include roots, and tools/ reaching past the public API.

Usage: check_layers.py <project root>; exit 1 and a line per violation when any is found.
"""
import pathlib
import re
import sys

LAYERS = ["core", "launch", "comm", "plan", "kernels", "exec", "strategies", "layer"]  # bottom first
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
SOURCES = {".cpp", ".hpp", ".cu", ".cuh", ".h"}


def violations(root: pathlib.Path):
    src = root / "src"
    for path in sorted(src.rglob("*")):
        if path.suffix not in SOURCES:
            continue
        layer = path.relative_to(src).parts[0]
        if layer not in LAYERS:
            yield f"{path.relative_to(root)}: src/{layer} is not a layer ({', '.join(LAYERS)})"
            continue
        for name in INCLUDE.findall(path.read_text(encoding="utf-8")):
            if ".." in pathlib.PurePosixPath(name).parts:
                yield f"{path.relative_to(root)}: includes \"{name}\", which climbs out of its folder"
                continue
            head = name.split("/")[0]
            if head in LAYERS and LAYERS.index(head) > LAYERS.index(layer):
                yield f"{path.relative_to(root)}: src/{layer} includes \"{name}\" of src/{head}, a layer above it"
    tools = root / "tools"
    for path in sorted(tools.rglob("*")):
        if path.suffix not in SOURCES:
            continue
        for name in INCLUDE.findall(path.read_text(encoding="utf-8")):
            head = name.split("/")[0]
            if head in LAYERS or ".." in pathlib.PurePosixPath(name).parts:
                yield f"{path.relative_to(root)}: includes \"{name}\"; tools/ reaches tilemoe through include/tilemoe only"
    public = root / "include" / "tilemoe"
    for path in sorted(public.rglob("*")):
        if path.suffix not in SOURCES:
            continue
        for name in INCLUDE.findall(path.read_text(encoding="utf-8")):
            if not name.startswith("tilemoe/"):
                yield f"{path.relative_to(root)}: the public API includes \"{name}\", which is not public"


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    found = list(violations(root))
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} layering violation(s); the layers, bottom first: {', '.join(LAYERS)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
