#!/usr/bin/env python3
"""Checks that no include reaches up a layer (docs/ARCHITECTURE.md).

The folders of src/ are layers, read top-down:

    cli -> api -> cluster -> runner -> engine / tokenizer / download / net -> proto -> core

A file may include headers of its own folder and of any folder below its
own. The four folders of the middle layer are independent of each other.
Prints every violation and exits 1 if there is any.
"""
import pathlib
import re
import sys

RANK = {
    "cli": 6, "api": 5, "cluster": 4, "runner": 3,
    "engine": 2, "tokenizer": 2, "download": 2, "net": 2,
    "proto": 1, "core": 0,
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/')


def main() -> int:
    root = pathlib.Path(__file__).resolve().parent.parent / "src"
    bad = []
    for path in sorted([*root.rglob("*.[ch]"), *root.rglob("*.cu")]):
        layer = path.relative_to(root).parts[0]
        if layer not in RANK:
            bad.append(f"{path}: folder {layer} has no layer in tools/check_layers.py")
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = m.group(1)
            if target not in RANK:
                bad.append(f"{path}:{n}: includes unknown folder {target}")
            elif target != layer and RANK[target] >= RANK[layer]:
                bad.append(f"{path}:{n}: {layer} includes {target}, which is not below it")
    for b in bad:
        print(b)
    print(f"layers: {len(bad)} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
