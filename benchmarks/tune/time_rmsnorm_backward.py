"""Dev tool: RMSNorm backwards through autograd, µs (do_bench, L2 flushed): the LLaMA-7B layer's
[8192, 4096] bf16 (llama convention, a bf16 weight; dx and dw), against Liger-Kernel's
LigerRMSNormFunction (llama casting, its in-place default: dx written into dy) where peers/ has it,
and each side's kernels alone (torch.profiler, µs a call: Liger's autograd Function launches from
Python, which do_bench's times include), ours also kernel by kernel. In the LLaMA layer's profile (BENCHMARKS.md, eighteenth
session) our rows backward took 144 µs a call and Liger's 96; the bytes that must move (dy, x read,
dx written) take about 50 µs at the H200's copy rate. Run on the GPU from the repo root:
  PYTHONPATH=$PWD python benchmarks/tune/time_rmsnorm_backward.py LABEL"""
import re
import sys
import torch
import baracuda_torch  # noqa: F401
sys.path.insert(0, "benchmarks")
import peers  # noqa: E402,F401  (puts peers/site on sys.path)
from harness import kernel_breakdown, time_us  # noqa: E402
bf = torch.bfloat16
x = torch.randn(8192, 4096, dtype=bf, device="cuda", requires_grad=True)
w = (1 + 0.1 * torch.randn(4096, dtype=bf, device="cuda")).requires_grad_()
dy = torch.randn(8192, 4096, dtype=bf, device="cuda")
y = baracuda_torch.rms_norm(x, (4096,), w, 1e-6, convention="llama")
rstd = torch.empty(8192, device="cuda")
plan = baracuda_torch.explain("rms_norm_backward", dy, x, w, rstd, "llama")
print(sys.argv[1], "plan:", plan.name, plan.variant)


def kernel_us(fn):
    """µs of kernels a call (torch.profiler over 20 calls), and each kernel's (name, µs)."""
    rows = kernel_breakdown(fn, "cuda", iters=20)
    return sum(r[1] for r in rows), [(r[0], r[1]) for r in rows]


def short_name(kernel):
    """rms_norm_rows_backward of 'void ...::(anonymous namespace)::rms_norm_rows_backward<...>(...)'."""
    name = kernel.replace("(anonymous namespace)::", "")
    return re.sub(r"^void |<.*$|\(.*$", "", name).split("::")[-1]


ours = lambda: torch.autograd.grad(y, (x, w), dy, retain_graph=True)  # noqa: E731
ours_us, ours_kernels = kernel_us(ours)
res = {"rms bwd": time_us(ours)[0], "its kernels": ours_us}
print(sys.argv[1], "our kernels:", ", ".join(f"{short_name(k)} {us:.1f}" for k, us in ours_kernels))
try:
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    yl = LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", True)
    liger = lambda: torch.autograd.grad(yl, (x, w), dy.clone(), retain_graph=True)  # noqa: E731
    res["liger bwd"] = time_us(liger)[0]
    res["clone (in liger's)"] = time_us(lambda: dy.clone())[0]
    res["liger's kernels, clone included"], kernels = kernel_us(liger)
    print("liger kernels:", ", ".join(sorted({k[:40] for k, _ in kernels})))
except ImportError as e:
    res["liger"] = float("nan")
    print("no Liger:", e)
print(sys.argv[1] + ": " + " | ".join(f"{k} {v:.1f}" for k, v in res.items()))
