"""Build baracuda_torch._C.

A CUDAExtension when nvcc and a CUDA build of torch are both present, a CPU-only
CppExtension otherwise (or when BARACUDA_FORCE_CPU=1). When nvcc's CUDA major version
differs from torch's, the build stops with one line naming both and the ways out.
CUDA architectures come from TORCH_CUDA_ARCH_LIST, defaulting to sm_80 through sm_120
with PTX for the newest. The C++ standard is the one the installed torch asks for
(C++17 for older torch, C++20 for torch 2.15's headers): BuildExtension adds it. Where
torch's CPU parallel backend is OpenMP (the Linux wheels), the CPU kernels are compiled
and linked with -fopenmp (see openmp_flags).
Install with `pip install --no-build-isolation .` (torch must already be installed).
"""
import glob
import os
import re
import shutil
import subprocess
import sys

from setuptools import find_packages, setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
import torch

ROOT = os.path.dirname(os.path.abspath(__file__))
# Ampere, Ada, Hopper (as sm_90a: its wgmma kernels need the architecture-specific
# target, and sm_90a code runs on every sm_90 device), Blackwell (data centre and
# consumer), and PTX of the newest so that later GPUs still run through the driver's JIT.
DEFAULT_ARCH_LIST = "8.0;8.6;8.9;9.0a;10.0;12.0+PTX"


def sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))


def nvcc_path():
    if CUDA_HOME is not None and os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc")):
        return os.path.join(CUDA_HOME, "bin", "nvcc")
    return shutil.which("nvcc")


def nvcc_version(nvcc):
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def build_with_cuda():
    if os.environ.get("BARACUDA_FORCE_CPU", "0") == "1":
        return False
    if torch.version.cuda is None or CUDA_HOME is None:
        return False
    nvcc = nvcc_path()
    if nvcc is None:
        return False
    have = nvcc_version(nvcc)
    want = tuple(int(v) for v in torch.version.cuda.split(".")[:2])
    if have is not None and have[0] != want[0]:
        sys.exit(f"baracuda_torch: nvcc is CUDA {have[0]}.{have[1]} ({nvcc}) but torch "
                 f"{torch.__version__} was built with CUDA {torch.version.cuda}; install a CUDA "
                 f"{want[0]}.x toolkit (or a torch built for CUDA {have[0]}), or build CPU-only "
                 "with BARACUDA_FORCE_CPU=1")
    return True


def openmp_flags():
    """-fopenmp when torch's ATen parallel backend is OpenMP (the Linux wheels). There
    at::parallel_for is an inline template around `#pragma omp parallel`, which a compile
    without -fopenmp drops without a word: every CPU kernel then runs on one thread
    whatever torch.set_num_threads says. The link resolves libgomp.so.1 to the copy torch
    has already loaded, so there is one OpenMP runtime and one thread count."""
    config = os.path.join(os.path.dirname(torch.__file__), "include", "ATen", "Config.h")
    try:
        with open(config) as f:
            uses_openmp = re.search(r"#define\s+AT_PARALLEL_OPENMP\s+1", f.read()) is not None
    except OSError:
        uses_openmp = False
    return ["-fopenmp"] if uses_openmp and sys.platform.startswith("linux") else []


def extension():
    cpp = sources("csrc/core/*.cpp") + sources("csrc/kernels/cpu/*.cpp") + sources("csrc/torch/*.cpp")
    # No -std here: BuildExtension adds the standard the installed torch's headers need.
    omp = openmp_flags()
    # -ffp-contract=off: the CPU kernels round each product and sum as written, with fused
    # multiply-adds only where they call one. Otherwise the compiler may fuse a product and
    # a sum in one kernel and not in another that is meant to give the same bits (the
    # gated RMSNorm's y and its recomputed y differed so, with torch 2.9 to 2.12's
    # Vectorized headers), and which it fuses changes with torch's headers and the compiler.
    cxx = ["-O3", "-fvisibility=hidden", "-ffp-contract=off"] + omp
    include = [os.path.join(ROOT, "csrc")]
    if not build_with_cuda():
        print("baracuda_torch: building the CPU-only extension")
        return CppExtension("baracuda_torch._C", cpp, include_dirs=include,
                            extra_compile_args={"cxx": cxx}, extra_link_args=omp)
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_ARCH_LIST)
    print("baracuda_torch: building with CUDA for TORCH_CUDA_ARCH_LIST="
          + os.environ["TORCH_CUDA_ARCH_LIST"])
    nvcc = ["-O3", "-lineinfo", "-DBARACUDA_WITH_CUDA"]
    # sm_90a code (Hopper's wgmma kernels) is built when the list names 9.0a; the host
    # code learns it from this define (kernels::cuda_arch_specific_kernels).
    if "9.0a" in os.environ["TORCH_CUDA_ARCH_LIST"].replace(" ", ";").split(";"):
        nvcc.append("-DBARACUDA_SM90A")
    return CUDAExtension("baracuda_torch._C", cpp + sources("csrc/kernels/cuda/*.cu"),
                         include_dirs=include,
                         extra_compile_args={"cxx": cxx + ["-DBARACUDA_WITH_CUDA"], "nvcc": nvcc},
                         extra_link_args=omp)


setup(
    packages=find_packages(include=["baracuda_torch", "baracuda_torch.*"]),
    package_data={"baracuda_torch": ["py.typed"]},
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension},
)
