"""Build baracuda_torch._C.

A CUDAExtension when nvcc and a CUDA build of torch are both present, a CPU-only
CppExtension otherwise (or when BARACUDA_FORCE_CPU=1). CUDA architectures come from
TORCH_CUDA_ARCH_LIST, defaulting to sm_80 through sm_90 plus PTX. Install with
`pip install --no-build-isolation -e .` (torch must already be installed).
"""
import glob
import os
import shutil

from setuptools import find_packages, setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
import torch

ROOT = os.path.dirname(os.path.abspath(__file__))
DEFAULT_ARCH_LIST = "8.0;8.6;8.9;9.0+PTX"


def sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))


def build_with_cuda():
    if os.environ.get("BARACUDA_FORCE_CPU", "0") == "1":
        return False
    if torch.version.cuda is None or CUDA_HOME is None:
        return False
    return shutil.which("nvcc") is not None or os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc"))


def extension():
    cpp = sources("csrc/core/*.cpp") + sources("csrc/kernels/cpu/*.cpp") + sources("csrc/torch/*.cpp")
    cxx = ["-O3", "-fvisibility=hidden"]  # no -std: BuildExtension adds the one torch needs
    include = [os.path.join(ROOT, "csrc")]
    if not build_with_cuda():
        print("baracuda_torch: building the CPU-only extension")
        return CppExtension("baracuda_torch._C", cpp, include_dirs=include,
                            extra_compile_args={"cxx": cxx})
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_ARCH_LIST)
    print("baracuda_torch: building with CUDA for TORCH_CUDA_ARCH_LIST="
          + os.environ["TORCH_CUDA_ARCH_LIST"])
    nvcc = ["-O3", "-lineinfo", "-DBARACUDA_WITH_CUDA"]
    return CUDAExtension("baracuda_torch._C", cpp + sources("csrc/kernels/cuda/*.cu"),
                         include_dirs=include,
                         extra_compile_args={"cxx": cxx + ["-DBARACUDA_WITH_CUDA"], "nvcc": nvcc})


setup(
    packages=find_packages(include=["baracuda_torch", "baracuda_torch.*"]),
    package_data={"baracuda_torch": ["py.typed"]},
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension},
)
