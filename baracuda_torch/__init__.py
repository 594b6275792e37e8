"""baracuda_torch: fused forward and backward training kernels for PyTorch.

Importing the package registers the ops under ``torch.ops.baracuda`` (CPU, CUDA, Meta
and Autograd kernels) and exposes documented wrappers:

* gated activations: :func:`gated_activation`, :func:`glu`, :func:`reglu`,
  :func:`swiglu`, :func:`geglu`; :func:`gated_activation_pair` (``act(gate) * up``)

Plan introspection: :func:`explain` tells which kernel a call would run and what it
guarantees, without running it; :func:`set_preference` / :func:`preference` choose
between the fastest and the deterministic kernels.
"""
import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C  # noqa: F401  (registers torch.ops.baracuda.*)
from . import functional, nn, reference
from ._plan import PlanInfo, explain, get_preference, preference, set_preference
from .functional import *  # noqa: F401,F403  (every wrapper in functional.__all__)

__version__ = "0.1.0"

#: True when the extension was built with its CUDA kernels.
with_cuda: bool = _C.with_cuda

__all__ = [
    "PlanInfo", "explain", "get_preference", "set_preference", "preference", "with_cuda",
    "functional", "nn", "reference",
] + functional.__all__
