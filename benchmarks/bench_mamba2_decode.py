"""Mamba-2 decoding: the SSM state update and the conv step at a Mamba-2 2.7B layer's shape,
and tokens/s of a small model's ``generate``, stock transformers against the same model
after ``apply_baracuda``.

State update (``selective_state_update``): 80 heads of 64, d_state 128, 1 group, bfloat16
x/dt/B/C, a float32 state, Mamba-2's per-head A, dt, D and dt_bias expanded (stride 0), dt
softplus, no z; batch 1, 8 and 64. Providers: baracuda; torch = mamba_ssm's own fallback step
in eager PyTorch (softplus, exp, the einsums, ``state.copy_``: what Mamba2.step runs
without the kernel); compile = torch.compile of it; mamba_ssm = its Triton
``selective_state_update`` where peers/ has it (benchmarks/peers.py), after a check that
its out and state agree with ours from the same start; baracuda and mamba_ssm also
replayed from a CUDA graph (``forward (CUDA graph)``: no launch cost, L2 not flushed
between calls; ``harness.time_us_graph``). Plus baracuda's
``selective_state_update_tokens`` with 4 tokens at batch 64 (a speculative-decoding
verify), against 4 single steps.
Bytes (the fewest a step must move; n = B·H·P·N state elements, s = 4 bytes of float32
state, e = 2 bytes of bfloat16):
  2·n·s                 the state, read and written: 5.2 MB at batch 1, 336 MB at 64
  + B·H·P·e·2           x read, out written
  + B·H·e + 2·B·G·N·e   dt (per head), B and C
  (A, D, dt_bias: H values each, negligible); T tokens: 2·n·s + T·(the rest). ``× copy`` is
  a same-run device copy of those bytes over our time: the fraction of the floor.

Conv step (``causal_conv1d_update``): 5376 channels (x, B, C of the 2.7B layer), width 4,
bias, SiLU, mamba_ssm's channel-last bfloat16 state of width 4; batch 1 and 64. Providers:
baracuda; torch = mamba_ssm's fallback (roll the state, write x, multiply-sum, SiLU);
causal_conv1d = the causal-conv1d package's ``causal_conv1d_update`` where installed.
Bytes: B·D·(2·W + 2)·e (the state read and written, x read, out written).

generate: a Mamba2ForCausalLM with hidden 768, 8 layers, d_state 128, head_dim 64, 1 group,
vocab 8192, bfloat16; prompts of 64 tokens, 128 new tokens (greedy, no early stop), batch 1
and 8: wall time of one ``generate`` (median of 3 after a warm-up, synchronized) and
tokens/s = batch · new tokens / time; stock is whatever transformers runs (its PyTorch
paths, or mamba_ssm's kernels when it imported them: the note says which), patched the
same model after ``apply_baracuda``. The note also says whether the greedy tokens agree
(bfloat16 rounding may flip a near-tie).

CPU (``run_cpu``, or ``python benchmarks/bench_mamba2_decode.py --cpu``; also what runs
without a GPU): a smoke run at tiny shapes (state update B2 H4 P16 N16, conv step D96,
a 2-layer model of hidden 64 generating 8 tokens), float32, baracuda against the eager
providers, timed alternately; no peers.
"""
from __future__ import annotations

import copy
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import baracuda_torch as bt
from baracuda_torch.causal_conv1d import causal_conv1d_update
from harness import Row, format_cpu_table, format_table, measure, measure_interleaved
import peers

FAMILY = "mamba2_decode"
H, P, N, G = 80, 64, 128, 1   # Mamba-2 2.7B: d_inner 5120 = 80 heads of 64, d_state 128
CONV_D, W = 5120 + 2 * G * N, 4


# ---- the state update -----------------------------------------------------------------------


def make_step(batch: int, device: str, dtype=torch.bfloat16, h=H, p=P, n=N, tokens=None) -> dict:
    """Inputs of one step (x, dt, B, C with a T dim when ``tokens`` is given): dt per head
    [B, H] and A, D, dt_bias per head [H], as Mamba2.step has them before expanding."""
    t = () if tokens is None else (tokens,)
    return dict(state=0.1 * torch.randn(batch, h, p, n, device=device),
                x=torch.randn(batch, *t, h, p, device=device, dtype=dtype),
                dt=torch.randn(batch, *t, h, device=device, dtype=dtype),
                A=-torch.exp(torch.rand(h, device=device)), B=torch.randn(batch, *t, G, n, device=device, dtype=dtype),
                C=torch.randn(batch, *t, G, n, device=device, dtype=dtype), D=torch.randn(h, device=device),
                dt_bias=torch.randn(h, device=device) - 2)


def ours_step(s: dict, state=None):
    """baracuda's op with Mamba2.step's expanded operands (no copies)."""
    st = s["state"] if state is None else state
    b, h, p, n = st.shape
    return bt.selective_state_update(
        st, s["x"], s["dt"][..., None].expand(b, h, p), s["A"][:, None, None].expand(h, p, n), s["B"], s["C"],
        s["D"][:, None].expand(h, p), dt_bias=s["dt_bias"][:, None].expand(h, p), dt_softplus=True)


def ours_tokens(s: dict):
    st = s["state"]
    b, h, p, n = st.shape
    T = s["x"].shape[1]
    return bt.selective_state_update_tokens(
        st, s["x"], s["dt"][..., None].expand(b, T, h, p), s["A"][:, None, None].expand(h, p, n), s["B"], s["C"],
        s["D"][:, None].expand(h, p), dt_bias=s["dt_bias"][:, None].expand(h, p), dt_softplus=True)


def eager_step(state, x, dt, A, B, C, D, dt_bias):
    """mamba_ssm's Mamba2.step without selective_state_update (1 group), in place on
    state, in float32; out in x's dtype."""
    dt = F.softplus(dt.float() + dt_bias)                                   # [B, H]
    dA = torch.exp(dt * A)
    dBx = torch.einsum("bh,bn,bhp->bhpn", dt, B[:, 0].float(), x.float())
    state.copy_(state * dA[..., None, None] + dBx)
    y = torch.einsum("bhpn,bn->bhp", state, C[:, 0].float())
    return (y + D[:, None] * x.float()).to(x.dtype)


def eager_of(s: dict, state=None):
    return eager_step(s["state"] if state is None else state, s["x"], s["dt"], s["A"], s["B"], s["C"], s["D"],
                      s["dt_bias"])


def peer_of(fn, s: dict, state=None):
    st = s["state"] if state is None else state
    b, h, p, n = st.shape
    return fn(st, s["x"], s["dt"][..., None].expand(b, h, p), s["A"][:, None, None].expand(h, p, n), s["B"], s["C"],
              s["D"][:, None].expand(h, p), dt_bias=s["dt_bias"][:, None].expand(h, p), dt_softplus=True)


def step_bytes(batch: int, tokens: int = 1, h=H, p=P, n=N, e=2) -> int:
    return 2 * batch * h * p * n * 4 + tokens * (2 * batch * h * p * e + batch * h * e + 2 * batch * G * n * e)


def state_update_rows(batch: int, providers) -> list[Row]:
    s = make_step(batch, "cuda")
    case = f"state update B{batch} H{H} P{P} N{N} G{G} bf16 x, fp32 state"
    info = bt.explain("selective_state_update", s["state"], s["x"], s["dt"][..., None].expand(batch, H, P),
                      s["A"][:, None, None].expand(H, P, N), s["B"], s["C"])
    fns = {"baracuda": lambda: ours_step(s), "torch": lambda: eager_of(s)}
    notes = {"baracuda": f"variant {info.variant}"}
    if "compile" in providers:
        torch._dynamo.reset()
        compiled = torch.compile(eager_step)
        fns["compile"] = lambda: compiled(s["state"], s["x"], s["dt"], s["A"], s["B"], s["C"], s["D"], s["dt_bias"])
    peer = peers.selective_state_update() if "mamba_ssm" in providers else None
    if peer is not None:
        a, b = s["state"].clone(), s["state"].clone()
        with torch.no_grad():
            out_a, out_b = ours_step(s, a), peer_of(peer, s, b)
        notes["mamba_ssm"] = (peers.agree(out_a, out_b, "selective_state_update out", 1e-2) + "; state " +
                              peers.agree(a, b, "selective_state_update state", 1e-5))
        fns["mamba_ssm"] = lambda: peer_of(peer, s)
    rows = []
    with torch.no_grad():
        for prov in [p for p in providers if p in fns]:
            rows.append(measure(FAMILY, case, torch.bfloat16, prov, "forward", fns[prov],
                                nbytes=step_bytes(batch), note=notes.get(prov, "")))
        # the kernels without their launches: replayed from a CUDA graph, as a decode loop
        # under CUDA graphs runs them (eager, a small batch can time the launch instead)
        for prov in [p for p in ("baracuda", "mamba_ssm") if p in fns]:
            rows.append(measure(FAMILY, case, torch.bfloat16, prov, "forward (CUDA graph)", fns[prov],
                                nbytes=step_bytes(batch), note="20 calls a graph replay, L2 not flushed",
                                graph=True))
    return rows


def tokens_rows(batch: int = 64, T: int = 4) -> list[Row]:
    s = make_step(batch, "cuda", tokens=T)
    singles = [dict(s, x=s["x"][:, t], dt=s["dt"][:, t], B=s["B"][:, t], C=s["C"][:, t]) for t in range(T)]
    case = f"{T} tokens B{batch} H{H} P{P} N{N} G{G} bf16 x, fp32 state"
    with torch.no_grad():
        return [measure(FAMILY, case, torch.bfloat16, "baracuda", "forward", lambda: ours_tokens(s),
                        nbytes=step_bytes(batch, T), note="selective_state_update_tokens: the state read once"),
                measure(FAMILY, case, torch.bfloat16, "baracuda", "forward (T single steps)",
                        lambda: [ours_step(q, s["state"]) for q in singles], nbytes=step_bytes(batch, T),
                        note=f"{T} x selective_state_update: the state read {T} times")]


# ---- the conv step ---------------------------------------------------------------------------


def make_conv(batch: int, device: str, dtype=torch.bfloat16, d=CONV_D):
    state = torch.randn(batch, W, d, device=device, dtype=dtype).transpose(1, 2)  # mamba_ssm's layout
    return (torch.randn(batch, d, device=device, dtype=dtype), state,
            0.5 * torch.randn(d, W, device=device, dtype=dtype), torch.randn(d, device=device, dtype=dtype))


def eager_conv(x, conv_state, w, b):
    """mamba_ssm's Mamba2.step without causal_conv1d_update."""
    conv_state.copy_(torch.roll(conv_state, shifts=-1, dims=-1))
    conv_state[:, :, -1] = x
    return F.silu(torch.sum(conv_state * w, dim=-1) + b).to(x.dtype)


def conv_rows(batch: int, providers) -> list[Row]:
    x, st, w, b = make_conv(batch, "cuda")
    case = f"conv step B{batch} D{CONV_D} W{W} bf16 silu"
    nbytes = batch * CONV_D * (2 * W + 2) * 2
    fns = {"baracuda": lambda: causal_conv1d_update(x, st, w, b, "silu"), "torch": lambda: eager_conv(x, st, w, b)}
    notes = {}
    peer = peers.causal_conv1d_update() if "causal_conv1d" in providers else None
    if peer is not None:
        s1, s2 = st.clone(), st.clone()
        with torch.no_grad():
            notes["causal_conv1d"] = peers.agree(causal_conv1d_update(x, s1, w, b, "silu"), peer(x, s2, w, b, "silu"),
                                                 "causal_conv1d_update", 1e-2)
        fns["causal_conv1d"] = lambda: peer(x, st, w, b, "silu")
    rows = []
    with torch.no_grad():
        for prov in [p for p in providers if p in fns]:
            rows.append(measure(FAMILY, case, torch.bfloat16, prov, "forward", fns[prov], nbytes=nbytes,
                                note=notes.get(prov, "")))
    return rows


# ---- generate ---------------------------------------------------------------------------------


def small_model(device: str, dtype, tiny: bool = False):
    import transformers
    torch.manual_seed(0)
    kw = (dict(vocab_size=96, hidden_size=64, num_hidden_layers=2, state_size=16, num_heads=8, head_dim=16)
          if tiny else dict(vocab_size=8192, hidden_size=768, num_hidden_layers=8, state_size=128, num_heads=24,
                            head_dim=64))
    cfg = transformers.Mamba2Config(**kw, expand=2, n_groups=1, chunk_size=64, pad_token_id=0,
                                    tie_word_embeddings=False)
    return transformers.Mamba2ForCausalLM(cfg).to(device=device, dtype=dtype).eval()


def stock_kernels() -> str:
    """What transformers' Mamba-2 decoding runs in this process: its PyTorch fallbacks, or
    the packages it imported. The globals it calls: fallback-decorated functions in newer
    releases (a fused kernel where the decorator found the package); in older ones (5.3:
    no ``mamba2_selective_state_update``) the packages' own functions, or None without
    them (its lazy loader sets them on the first forward)."""
    from baracuda_torch.integrations import huggingface as hf
    m2 = sys.modules["transformers.models.mamba2.modeling_mamba2"]
    used = []
    for name in ("causal_conv1d_update", "mamba2_selective_state_update", "selective_state_update"):
        fn = getattr(m2, name, None)
        if fn is None:
            continue
        package = getattr(fn, "__module__", "").split(".")[0]
        if hf._runs_fused_kernel(fn) or package in ("causal_conv1d", "mamba_ssm"):
            used.append(name)
    return "stock runs " + (", ".join(used) + " from its packages" if used else "transformers' PyTorch paths")


def time_generate(model, ids, new: int, repeats: int) -> tuple[float, torch.Tensor]:
    """(median seconds, tokens) of greedy generate of exactly `new` tokens."""
    def once():
        if ids.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             pad_token_id=0)
        if ids.is_cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0, out
    once()  # warm-up
    runs = [once() for _ in range(repeats)]
    return statistics.median(t for t, _ in runs), runs[-1][1]


def generate_rows(device: str, dtype, batches, prompt: int, new: int, repeats: int, tiny: bool = False) -> list[Row]:
    from baracuda_torch.integrations.huggingface import apply_baracuda
    stock = small_model(device, dtype, tiny)
    patched = copy.deepcopy(stock)
    apply_baracuda(patched)
    cfg = stock.config
    rows = []
    for batch in batches:
        ids = torch.randint(1, cfg.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(batch)).to(device)
        case = (f"generate B{batch} prompt {prompt} new {new}, Mamba2 hidden {cfg.hidden_size} x "
                f"{cfg.num_hidden_layers} layers N{cfg.state_size}")
        with torch.no_grad():
            t_stock, tok_stock = time_generate(stock, ids, new, repeats)
            t_ours, tok_ours = time_generate(patched, ids, new, repeats)
        agree = torch.equal(tok_stock, tok_ours)
        if not agree:
            diff = (tok_stock != tok_ours).any(0).nonzero()
            agree_note = f"tokens differ from step {int(diff[0]) - prompt}"
        else:
            agree_note = "same tokens"
        for prov, t in (("transformers", t_stock), ("baracuda", t_ours)):
            note = f"{batch * new / t:.0f} tokens/s"
            note += f"; {stock_kernels()}" if prov == "transformers" else f"; apply_baracuda, {agree_note}"
            rows.append(Row(FAMILY, case, str(dtype).replace("torch.", ""), prov, "generate", t * 1e6, t * 1e6,
                            t * 1e6, note=note))
    return rows


# ---- entry points -----------------------------------------------------------------------------


def run(providers=("baracuda", "torch", "compile", "mamba_ssm", "causal_conv1d")) -> list[Row]:
    rows: list[Row] = []
    for batch in (1, 8, 64):
        rows += state_update_rows(batch, providers)
    rows += tokens_rows()
    for batch in (1, 64):
        rows += conv_rows(batch, providers)
    torch.cuda.empty_cache()
    rows += generate_rows("cuda", torch.bfloat16, (1, 8), prompt=64, new=128, repeats=3)
    return rows


def run_cpu(repeats: int = 15, dtype=torch.float32) -> list[Row]:
    """The CPU smoke run: tiny shapes, baracuda against the eager providers, no peers."""
    h, p, n, b = 4, 16, 16, 2
    s = make_step(b, "cpu", dtype, h, p, n)
    rows = []
    with torch.no_grad():
        rows += measure_interleaved(FAMILY, f"state update B{b} H{h} P{p} N{n} G{G}", dtype, "forward",
                                    {"baracuda": lambda: ours_step(s), "torch": lambda: eager_of(s)},
                                    nbytes=step_bytes(b, 1, h, p, n, 4), repeats=repeats)
        x, st, w, bias = make_conv(b, "cpu", dtype, 96)
        rows += measure_interleaved(FAMILY, f"conv step B{b} D96 W{W}", dtype, "forward",
                                    {"baracuda": lambda: causal_conv1d_update(x, st, w, bias, "silu"),
                                     "torch": lambda: eager_conv(x, st, w, bias)},
                                    nbytes=b * 96 * (2 * W + 2) * 4, repeats=repeats)
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("bench_mamba2_decode: transformers not installed, generate skipped", file=sys.stderr)
        return rows
    gen = generate_rows("cpu", dtype, (1,), prompt=8, new=8, repeats=max(1, min(repeats, 3)), tiny=True)
    # format_cpu_table pairs "baracuda" with "torch": the stock model is the torch side here.
    for r in gen:
        if r.provider == "transformers":
            r.provider = "torch"
    return rows + gen


if __name__ == "__main__":
    if torch.cuda.is_available() and "--cpu" not in sys.argv:
        print(format_table(run()))
    else:
        cpu_rows = run_cpu(repeats=5)
        print(format_cpu_table(cpu_rows))
        for r in cpu_rows:
            if r.mode == "generate":
                print(f"{r.case} | {'transformers' if r.provider == 'torch' else r.provider} | "
                      f"{r.median_us / 1e3:.1f} ms | {r.note}")
