#!/usr/bin/env python3
"""PTX of every CUDA translation unit of a build, digested per kernel, for refactors that must
leave the kernels unchanged (no GPU needed).

  scripts/ptx-digest.py BUILD_DIR OUT.json [--arch compute_90a]   # compile every .cu to PTX, digest
  scripts/ptx-digest.py --compare A.json B.json                   # exit 1 when a kernel differs

Every .cu of BUILD_DIR/compile_commands.json (the library, tests, bench) is compiled with its own
flags to PTX for one virtual architecture. Each `.entry` / `.func` / global declaration is
normalised (`.loc`/`.file` line info, comments and blank lines removed) and hashed under its
mangled name (anonymous namespaces, which carry the file's name, are renamed alike), so moving
code between files, headers or folders leaves the digest unchanged while any change of generated
code shows up under the kernel's name.
"""
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor


def ptx_command(entry, arch, out):
    args = shlex.split(entry["command"])
    res, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-c"):
            skip = a == "-o"
            continue
        if a.startswith("-gencode") or a.startswith("--generate-code") or a.startswith("-arch"):
            if a in ("-gencode", "--generate-code", "-arch"):
                skip = True
            continue
        res.append(a)
    return res + [f"-arch={arch}", "-ptx", "-o", out]


# Anonymous namespaces are mangled with the file's name and a hash of it
# (_GLOBAL__N__54898a8b_14_insert_cuda_cu_a7aac843): moving a file renames them, nothing else.
ANON = re.compile(r"\d+_GLOBAL__N__[0-9a-f]{8}_\d+_[A-Za-z0-9_]*?_[0-9a-f]{8}(?:_\d+)?")
# file-local entities of the CUDA headers are mangled the same way (_INTERNAL_83ff9afc_12_link_cuda_cu_705df458)
INTERNAL = re.compile(r"\d+_INTERNAL_[0-9a-f]{8}_\d+_[A-Za-z0-9_]*?_[0-9a-f]{8}")


def units(text):
    """Top-level PTX units keyed by name: functions (with body) and global declarations."""
    text = ANON.sub("ANON", text)
    text = INTERNAL.sub("INTERNAL", text)
    # basic-block labels carry the function's index in its translation unit ($L__BB9_4)
    text = re.sub(r"\$L__BB\d+_", "$L__BB_", text)
    text = re.sub(r"__local_depot\d+", "__local_depot", text)
    lines = []
    for ln in text.splitlines():
        s = ln.strip()
        if not s or s.startswith("//") or s.startswith(".loc") or s.startswith(".file"):
            continue
        s = re.sub(r"\s*//.*$", "", s)
        lines.append(s)
    out, i = {}, 0
    header = re.compile(r"^(\.visible\s+|\.weak\s+|\.extern\s+)*\.(entry|func)\b")
    while i < len(lines):
        s = lines[i]
        if header.match(s):
            m = re.search(r"\.(?:entry|func)\s+(?:\([^)]*\)\s*)?([A-Za-z_$][\w$]*)", s)
            name = m.group(1) if m else s
            body, depth, started = [], 0, False
            while i < len(lines):
                t = lines[i]
                body.append(t)
                depth += t.count("{") - t.count("}")
                started = started or "{" in t
                i += 1
                if (started and depth == 0) or (not started and t.endswith(";")):
                    break
            key = name if name not in out else f"{name}#{len(out)}"
            out[key] = "\n".join(body)
            continue
        if s.startswith((".global", ".const", ".shared")) and s.endswith(";"):
            out[s] = s
        i += 1
    return out


def digest(build, out_path, arch):
    cc = json.load(open(os.path.join(build, "compile_commands.json")))
    entries = [e for e in cc if e["file"].endswith(".cu")]
    tmp = os.path.abspath(os.path.join(build, "ptx-digest"))
    os.makedirs(tmp, exist_ok=True)

    def one(e):
        ptx = os.path.join(tmp, os.path.basename(e["file"]) + f".{abs(hash(e['file']))}.ptx")
        cmd = ptx_command(e, arch, ptx)
        r = subprocess.run(cmd, cwd=e["directory"], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"nvcc failed for {e['file']}:\n{r.stderr}")
        return e["file"], units(open(ptx).read())

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        results = list(ex.map(one, entries))
    kernels = {}
    for _, us in results:
        for k, v in us.items():
            h = hashlib.sha256(v.encode()).hexdigest()
            kernels.setdefault(k, set()).add(h)
    data = {k: sorted(v) for k, v in sorted(kernels.items())}
    json.dump({"arch": arch, "units": len(entries), "kernels": data}, open(out_path, "w"), indent=1)
    print(f"{len(entries)} translation units, {len(data)} PTX units -> {out_path}")


def compare(a_path, b_path):
    a, b = json.load(open(a_path))["kernels"], json.load(open(b_path))["kernels"]
    entries = lambda d: {k for k in d if not k.startswith(".")}
    bad = 0
    for k in sorted(set(a) | set(b)):
        if k.startswith((".global", ".const", ".shared")) and (k in a) != (k in b):
            print(f"declaration {'only in ' + a_path if k in a else 'only in ' + b_path}: {k}")
            bad += 1
        elif k not in b:
            print(f"only in {a_path}: {k}")
            bad += 1
        elif k not in a:
            print(f"only in {b_path}: {k}")
            bad += 1
        elif a[k] != b[k]:
            print(f"differs: {k}")
            bad += 1
    n = len(entries(a))
    print(f"{n} functions in {a_path}, {len(entries(b))} in {b_path}: "
          + ("identical" if bad == 0 else f"{bad} differences"))
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    arch = "compute_90a"
    if "--arch" in sys.argv:
        arch = sys.argv[sys.argv.index("--arch") + 1]
    digest(sys.argv[1], sys.argv[2], arch)
