#!/usr/bin/env python3
"""Checks the machine code of Loom's tensor-core kernels without a GPU.

For every kernel in the given binaries (SASS from `cuobjdump --dump-sass`):
  - the K loops: for each HGMMA instruction, the innermost loop around it (a backward branch
    whose range holds the HGMMA);
  - local-memory instructions (LDL, STL: spills or local arrays) inside those loops;
  - serialized wgmma: a loop whose every HGMMA waits for itself (each one ends a group, gsb0,
    and is waited for before the next). ptxas does this to every wgmma of a kernel when it finds
    one pipeline it cannot follow (C7510, e.g. accumulators live across a call into a body that
    was not inlined); asynchronous loops issue a K block's HGMMAs back to back and wait once.

Fails (exit 1) when no kernel of a binary holds an HGMMA (the wgmma path did not compile to
tensor-core instructions), when any K loop touches local memory, or when any is serialized.
Exit 77 (skipped) when no cuobjdump is found: give it with --cuobjdump, the LOOM_CUOBJDUMP
environment variable, or put it on PATH (scripts/install-deps.sh fetches NVIDIA's from PyPI where
the toolkit lacks it).

usage: sass_check.py [--cuobjdump PATH] BINARY...
"""
import os
import re
import shutil
import subprocess
import sys

SKIP = 77

INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*?);")
BRANCH_TARGET = re.compile(r"\s0x([0-9a-f]+)")
FUNCTION = re.compile(r"Function : (\S+)")


def find_cuobjdump(given):
    candidates = [given, os.environ.get("LOOM_CUOBJDUMP"), shutil.which("cuobjdump")]
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home:
            candidates.append(os.path.join(home, "bin", "cuobjdump"))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def functions(sass):
    """Yields (name, [(address, opcode, operands)]) for each function of a SASS dump."""
    name, body = None, []
    for line in sass.splitlines():
        m = FUNCTION.search(line)
        if m:
            if name:
                yield name, body
            name, body = m.group(1), []
            continue
        m = INSTRUCTION.search(line)
        if m and name:
            body.append((int(m.group(1), 16), m.group(3), m.group(4)))
    if name:
        yield name, body


def k_loops(body):
    """The innermost loop (start, end address) around each HGMMA, and the HGMMA count."""
    loops = []
    for address, opcode, operands in body:
        if opcode.split(".")[0] != "BRA":
            continue
        m = BRANCH_TARGET.search(operands)
        if m:
            target = int(m.group(1), 16)
            if target < address:  # backward: a loop (a branch to itself is the trap loop)
                loops.append((target, address))
    hgmma = [a for a, opcode, _ in body if opcode.startswith("HGMMA")]
    found = set()
    for a in hgmma:
        around = [l for l in loops if l[0] <= a <= l[1]]
        if around:
            found.add(min(around, key=lambda l: l[1] - l[0]))
    return sorted(found), len(hgmma)


def check(binary, cuobjdump):
    out = subprocess.run([cuobjdump, "--dump-sass", binary], capture_output=True, text=True)
    if out.returncode != 0:
        print(f"{binary}: cuobjdump failed: {out.stderr.strip()}")
        return False
    ok, any_hgmma = True, False
    for name, body in functions(out.stdout):
        loops, hgmma = k_loops(body)
        if hgmma == 0:
            continue
        any_hgmma = True
        local_total = sum(1 for _, op, _ in body if op.startswith(("LDL", "STL")))
        bad, serialized = [], []
        for start, end in loops:
            local = [(a, op) for a, op, _ in body if start <= a <= end and op.startswith(("LDL", "STL"))]
            if local:
                bad.append((start, end, local))
            groups = [ops for a, op, ops in body if start <= a <= end and op.startswith("HGMMA")]
            if len(groups) > 1 and all("gsb0" in ops for ops in groups):
                serialized.append((start, end, len(groups)))
        in_loops = sum(len(local) for _, _, local in bad)
        problems = (["local memory in a K loop"] if bad else []) + (
            ["serialized wgmma"] if serialized else [])
        status = "ok" if not problems else "FAILED: " + ", ".join(problems)
        print(f"{os.path.basename(binary)}: {name[:100]}: {hgmma} HGMMA in {len(loops)} K loops; "
              f"LDL/STL: {local_total} in the function, {in_loops} in the K loops; "
              f"{len(serialized)} serialized: {status}")
        for start, end, local in bad:
            ok = False
            shown = ", ".join(f"{op} at 0x{a:x}" for a, op in local[:8])
            print(f"  loop 0x{start:x}-0x{end:x}: {len(local)} local accesses ({shown})")
        for start, end, count in serialized:
            ok = False
            print(f"  loop 0x{start:x}-0x{end:x}: each of its {count} HGMMA waited for on its own")
    if not any_hgmma:
        print(f"{binary}: no kernel holds an HGMMA instruction (the wgmma path is missing)")
        ok = False
    return ok


def main(argv):
    given, binaries = None, []
    args = iter(argv)
    for a in args:
        if a == "--cuobjdump":
            given = next(args, None)
        elif a in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            binaries.append(a)
    if not binaries:
        print(__doc__)
        return 2
    cuobjdump = find_cuobjdump(given)
    if not cuobjdump:
        print("sass_check: no cuobjdump found (skipped)")
        return SKIP
    results = [check(b, cuobjdump) for b in binaries]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
