"""What scripts/install.sh needs to decide whether the built extension is current.

    python scripts/build_stamp.py inputs ROOT     # prints a hash of the build's inputs
    python scripts/build_stamp.py installed ROOT  # exit 0 if this interpreter imports ROOT's package

The inputs: every file under ROOT/csrc and ROOT/setup.py (path and content), the torch
this interpreter would build against (its location and version file, which holds the
version and CUDA version), this interpreter (path and version), the C++ compiler and
nvcc that would be used (resolved path and ``--version`` output), and the build
settings in the environment. With ``BARACUDA_FORCE_CPU=1`` (setup.py's CPU-only
extension) neither csrc/kernels/cuda nor nvcc counts: that build compiles none of those
files and no CPU source includes them (tests/test_install.py checks it), so a change to a
CUDA kernel does not rebuild it. The settings: ``BARACUDA_*`` (but ``BARACUDA_REBUILD``),
``TORCH_CUDA_ARCH_LIST``, ``CUDA_HOME``, ``CUDA_PATH``, ``CC``, ``CXX`` and the compiler
and linker flags. ``MAX_JOBS`` only changes how fast the build runs, so it is not one.
Standard library only; it imports neither torch nor baracuda_torch.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys

ENV_KEYS = ("TORCH_CUDA_ARCH_LIST", "CUDA_HOME", "CUDA_PATH", "CC", "CXX", "CFLAGS", "CXXFLAGS",
            "CPPFLAGS", "LDFLAGS", "NVCC_FLAGS", "NVCC_APPEND_FLAGS")


def _tool(name: str) -> str | None:
    cands = []
    if name == "nvcc":
        cands += [os.path.join(os.environ[k], "bin", "nvcc") for k in ("CUDA_HOME", "CUDA_PATH")
                  if k in os.environ]
    cands += [shutil.which(name)]
    if name == "nvcc":
        cands.append("/usr/local/cuda/bin/nvcc")
    return next((c for c in cands if c and os.path.exists(c)), None)


def inputs(root: str) -> str:
    h = hashlib.sha256()

    def add(*parts: object) -> None:
        for p in parts:
            h.update(repr(p).encode() + b"\0")

    cpu_only = os.environ.get("BARACUDA_FORCE_CPU") == "1"
    cuda_dir = os.path.join(root, "csrc", "kernels", "cuda")
    files = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(root, "csrc")) for f in fs
             if not (cpu_only and (d == cuda_dir or d.startswith(cuda_dir + os.sep)))]
    for path in sorted(files) + [os.path.join(root, "setup.py")]:
        with open(path, "rb") as f:
            add(os.path.relpath(path, root), hashlib.sha256(f.read()).hexdigest())
    spec = importlib.util.find_spec("torch")
    torch_dir = os.path.dirname(os.path.realpath(spec.origin)) if spec and spec.origin else None
    add("torch", torch_dir)
    if torch_dir and os.path.exists(os.path.join(torch_dir, "version.py")):
        with open(os.path.join(torch_dir, "version.py"), "rb") as f:
            add(f.read())
    add("python", os.path.realpath(sys.executable), sys.version)
    env = {k: v for k, v in os.environ.items()
           if (k.startswith("BARACUDA_") and k != "BARACUDA_REBUILD") or k in ENV_KEYS}
    add(sorted(env.items()))
    for name in ([] if cpu_only else ["nvcc"]) + [os.environ.get("CXX", "c++")]:
        exe = _tool(name)
        add(name, exe and os.path.realpath(exe), exe and _version(exe))
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _version(exe: str) -> str:
    try:
        return subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return repr(e)


def installed(root: str) -> bool:
    spec = importlib.util.find_spec("baracuda_torch")
    return (spec is not None and spec.origin is not None
            and os.path.realpath(os.path.dirname(spec.origin))
            == os.path.realpath(os.path.join(root, "baracuda_torch")))


if __name__ == "__main__":
    what, root = sys.argv[1], os.path.abspath(sys.argv[2])
    if what == "inputs":
        print(inputs(root))
    elif what == "installed":
        sys.exit(0 if installed(root) else 1)
    else:
        sys.exit(f"usage: {sys.argv[0]} inputs|installed ROOT")
