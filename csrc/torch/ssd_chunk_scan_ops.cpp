// baracuda::ssd_chunk_scan, baracuda::ssd_chunk_scan_combined and their backwards:
// CPU/CUDA kernels (tensors -> plan -> run), meta kernels (shapes only), their plans for
// explain, and their declarations (torch/op_def.h: each forward's derivative is its
// backward op, whose own backward raises NotImplementedError).
//
// The op layer converts the caller's small parameter tensors (A, D, dt_bias,
// initial_states, dfinal_states; dt when it is neither x's dtype nor the compute type)
// to the compute type (float32, float64 for float64 inputs) the kernels read, and the
// gradients the kernels write in the compute type back to the caller's dtypes.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "core/ssd_chunk_scan_plan.h"
#include "torch/common.h"
#include "torch/op_def.h"

namespace baracuda::torch_ops {

namespace {
constexpr const char* kOp = "ssd_chunk_scan";
constexpr const char* kBackwardOp = "ssd_chunk_scan_backward";
constexpr const char* kCombinedOp = "ssd_chunk_scan_combined";
constexpr const char* kCombinedBackwardOp = "ssd_chunk_scan_combined_backward";

using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using Outs4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using Grads9 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                          at::Tensor, at::Tensor, at::Tensor>;
using OptT = std::optional<at::Tensor>;

// The options of ssd_chunk_scan_combined as the op receives them (undefined: absent).
struct Options {
  at::Tensor D, z, dt_bias, initial_states, seq_idx;
  bool dt_softplus = false;
  double dt_min = 0.0, dt_max = std::numeric_limits<double>::infinity();
  std::optional<at::ScalarType> state_dtype;
  bool keep_states = false;  // the combined forward's keep_states
};

at::Tensor value_or_undefined(const OptT& t) { return t.has_value() ? *t : at::Tensor(); }

Options make_options(const OptT& D, const OptT& z, const OptT& dt_bias, const OptT& init,
                     const OptT& seq_idx, bool dt_softplus, double dt_min,
                     std::optional<double> dt_max, std::optional<at::ScalarType> state_dtype) {
  Options o;
  o.D = value_or_undefined(D);
  o.z = value_or_undefined(z);
  o.dt_bias = value_or_undefined(dt_bias);
  o.initial_states = value_or_undefined(init);
  o.seq_idx = value_or_undefined(seq_idx);
  o.dt_softplus = dt_softplus;
  o.dt_min = dt_min;
  if (dt_max) o.dt_max = *dt_max;
  o.state_dtype = state_dtype;
  return o;
}

template <class Int>
SsdOperand<Int> operand(const at::Tensor& t, const std::string& op, const char* name,
                        const std::vector<Int>& sizes) {
  return {name, element_of(t, op, name), static_cast<int>(sizes.size()), sizes.data()};
}

// The backward's extra operands (undefined: absent).
struct BackwardExtras {
  at::Tensor dy, dfinal_states, y_pre, states;
};

// The problem checks on the tensors' sizes, before anything else looks at them, so that
// eager calls and meta kernels raise the same error for the same bad input (a 9-dim x
// is a ValueError here too, not the layout's rank limit). `sizes_of` gives int64_t
// sizes (eager) or SymInts (meta). `strict`: the plain op's dtype rule (dt and A in x's
// dtype).
template <class Int, class SizesOf>
void check_problem(const std::string& op, const at::Tensor& x, const at::Tensor& dt,
                   const at::Tensor& A, const at::Tensor& B, const at::Tensor& C,
                   int64_t chunk_size, bool cuda, bool strict, const Options& o,
                   const BackwardExtras* bwd, SizesOf sizes_of) {
  const at::Tensor none;
  check_same_device(op, {{"x", &x}, {"dt", &dt}, {"A", &A}, {"B", &B}, {"C", &C}, {"D", &o.D},
                         {"z", &o.z}, {"dt_bias", &o.dt_bias},
                         {"initial_states", &o.initial_states}, {"seq_idx", &o.seq_idx},
                         {"dy", bwd ? &bwd->dy : &none},
                         {"dfinal_states", bwd ? &bwd->dfinal_states : &none},
                         {"y_pre", bwd ? &bwd->y_pre : &none},
                         {"states", bwd ? &bwd->states : &none}});
  const std::vector<Int> xs = sizes_of(x), dts = sizes_of(dt), As = sizes_of(A),
                         Bs = sizes_of(B), Cs = sizes_of(C);
  const SsdOperand<Int> xo = operand(x, op, "x", xs);
  const SsdSizes<Int> s =
      check_ssd_problem(op, xo, operand(dt, op, "dt", dts), operand(A, op, "A", As),
                        operand(B, op, "B", Bs), operand(C, op, "C", Cs), chunk_size, cuda,
                        strict);
  std::vector<Int> sz[7];
  SsdOperand<Int> ops[7];
  SsdOptionOperands<Int> opts;
  auto add = [&](int i, const at::Tensor& t, const char* name, const SsdOperand<Int>** slot) {
    if (!t.defined()) return;
    sz[i] = sizes_of(t);
    ops[i] = operand(t, op, name, sz[i]);
    *slot = &ops[i];
  };
  add(0, o.D, "D", &opts.D);
  add(1, o.z, "z", &opts.z);
  add(2, o.dt_bias, "dt_bias", &opts.dt_bias);
  add(3, o.initial_states, "initial_states", &opts.initial_states);
  add(4, o.seq_idx, "seq_idx", &opts.seq_idx);
  if (bwd) {
    add(5, bwd->dfinal_states, "dfinal_states", &opts.dfinal_states);
    add(6, bwd->y_pre, "y_pre", &opts.y_pre);
  }
  check_ssd_options(op, xo, s, opts, o.dt_min, o.dt_max, bwd != nullptr);
  if (o.state_dtype && !at::isFloatingType(*o.state_dtype))
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("state_dtype must be a floating dtype, got ") +
             c10::toString(*o.state_dtype));
  if (bwd) {
    const std::vector<Int> dys = sizes_of(bwd->dy);
    check_ssd_dy(op, xo, operand(bwd->dy, op, "dy", dys));
    if (bwd->states.defined()) {
      const std::vector<Int> sts = sizes_of(bwd->states);
      check_ssd_kept_states(op, xo, s, chunk_size, operand(bwd->states, op, "states", sts));
    }
  }
}

std::vector<int64_t> concrete_sizes(const at::Tensor& t) { return t.sizes().vec(); }

at::ScalarType compute_type_of(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

at::Tensor to_type(const at::Tensor& t, at::ScalarType s) {
  return t.defined() ? t.to(s) : t;
}

// The caller's tensors with A, D, dt_bias, initial_states (and dt where needed) in the
// kernels' types.
struct Prepared {
  at::Tensor dt, A;
  Options o;
  at::Tensor dfinal_states;
  SsdChunkScanDescriptor desc;
};

Prepared prepare(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                 const at::Tensor& B, const at::Tensor& C, int64_t chunk_size, const Options& o,
                 bool strict, bool want_final, const std::string& op,
                 const BackwardExtras* bwd) {
  const DeviceInfo device = device_info(x, op);
  check_problem<int64_t>(op, x, dt, A, B, C, chunk_size, device.backend == Backend::Cuda, strict,
                         o, bwd, concrete_sizes);
  const at::ScalarType ck = compute_type_of(x);
  Prepared p;
  p.dt = (dt.scalar_type() == x.scalar_type() || dt.scalar_type() == ck) ? dt : dt.to(ck);
  p.A = A.to(ck);
  p.o = o;
  p.o.D = to_type(o.D, ck);
  p.o.dt_bias = to_type(o.dt_bias, ck);
  p.o.initial_states = to_type(o.initial_states, ck);
  if (bwd) p.dfinal_states = to_type(bwd->dfinal_states, ck);
  SsdChunkScanDescriptor& d = p.desc;
  d.x = layout_of(x, op, "x");
  d.dt = layout_of(p.dt, op, "dt");
  d.A = layout_of(p.A, op, "A");
  d.B = layout_of(B, op, "B");
  d.C = layout_of(C, op, "C");
  d.chunk_size = chunk_size;
  d.device = device;
  SsdChunkScanOptions& so = d.options;
  auto opt = [&](const at::Tensor& t, const char* name, TensorLayout& l, bool& has) {
    has = t.defined();
    if (has) l = layout_of(t, op, name);
  };
  opt(p.o.D, "D", so.D, so.has_D);
  opt(p.o.z, "z", so.z, so.has_z);
  opt(p.o.dt_bias, "dt_bias", so.dt_bias, so.has_dt_bias);
  opt(p.o.initial_states, "initial_states", so.initial_states, so.has_initial_states);
  opt(p.o.seq_idx, "seq_idx", so.seq_idx, so.has_seq_idx);
  so.dt_softplus = o.dt_softplus;
  so.dt_min = o.dt_min;
  so.dt_max = o.dt_max;
  so.final_states = want_final;
  so.keep_states = o.keep_states;
  return p;
}

SsdChunkScanBackwardDescriptor backward_descriptor(const Prepared& p, const BackwardExtras& e,
                                                   const std::string& op) {
  SsdChunkScanBackwardDescriptor desc;
  desc.forward = p.desc;
  desc.dy = layout_of(e.dy, op, "dy");
  desc.has_dfinal_states = p.dfinal_states.defined();
  if (desc.has_dfinal_states) desc.dfinal_states = layout_of(p.dfinal_states, op, "dfinal_states");
  if (e.y_pre.defined()) desc.y_pre = layout_of(e.y_pre, op, "y_pre");
  desc.has_states = e.states.defined();
  if (desc.has_states) desc.states = layout_of(e.states, op, "states");
  return desc;
}

TensorRef opt_ref(const at::Tensor& t, const std::string& op, const char* name) {
  return t.defined() ? ref_of(t, op, name) : TensorRef{};
}
MutTensorRef opt_mut_ref(at::Tensor& t, const std::string& op, const char* name) {
  return t.defined() ? mut_ref_of(t, op, name) : MutTensorRef{};
}

// D broadcast against [B, L, H, D].
at::Tensor D_view(const at::Tensor& D) { return D.dim() == 1 ? D.view({D.size(0), 1}) : D; }

// Whether the forward returns kept chunk states: o.keep_states where the plan writes them
// (ssd_keeps_states, by the dtype alone, so that the meta kernel, which sees no device,
// gives the same shapes). x's dtype is checked before.
bool returns_states(const at::Tensor& x, const Options& o, const std::string& op) {
  return o.keep_states && ssd_keeps_states(element_of(x, op, "x"));
}

// Forward: (out, final_states in the compute type or undefined, y_pre or undefined, the
// kept chunk states or undefined).
Outs4 run_forward(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                  const at::Tensor& B, const at::Tensor& C, int64_t chunk_size, const Options& o,
                  bool strict, bool want_final, const std::string& op) {
  c10::DeviceGuard guard(x.device());
  const Prepared p = prepare(x, dt, A, B, C, chunk_size, o, strict, want_final, op, nullptr);
  const auto plan = SsdChunkScanPlan::select(p.desc, current_preference());
  at::Tensor final_states, y_pre, states;
  // (empty in the zeros variant, where the plan writes none: its shape has a zero)
  if (returns_states(x, o, op)) states = allocate(plan.states_layout(), x);
  if (plan.zero_fill_outputs()) {
    // An empty extent: no state contributes to y (N = 0 or L = 0), y = D·x gated by z,
    // and the final state is the initial one (L = 0) or empty/zero.
    const at::ScalarType ck = compute_type_of(x);
    at::Tensor y = p.o.D.defined() ? x.to(ck) * D_view(p.o.D)
                                   : at::zeros(x.sizes(), x.options().dtype(ck));
    if (p.o.z.defined()) {
      y_pre = y.to(x.scalar_type()).contiguous();
      y = y * at::silu(p.o.z.to(ck));
    }
    at::Tensor out = y.to(x.scalar_type()).contiguous();
    if (want_final) {
      const int64_t b = x.size(0), h = x.size(2), d = x.size(3), n = B.size(3);
      final_states = (x.size(1) == 0 && p.o.initial_states.defined())
                         ? p.o.initial_states.contiguous().clone()
                         : at::zeros({b, h, d, n}, x.options().dtype(ck));
    }
    return Outs4{out, final_states, y_pre, states};
  }
  at::Tensor y = allocate(plan.output_layout(), x);
  if (want_final) final_states = allocate(plan.final_states_layout(), x);
  if (p.o.z.defined()) y_pre = allocate(plan.output_layout(), x);
  at::Tensor ws = allocate_workspace(plan.workspace_size(), x);
  SsdChunkScanArgs args{ref_of(x, op, "x"), ref_of(p.dt, op, "dt"), ref_of(p.A, op, "A"),
                        ref_of(B, op, "B"), ref_of(C, op, "C"), mut_ref_of(y, op, "y")};
  args.D = opt_ref(p.o.D, op, "D");
  args.z = opt_ref(p.o.z, op, "z");
  args.dt_bias = opt_ref(p.o.dt_bias, op, "dt_bias");
  args.initial_states = opt_ref(p.o.initial_states, op, "initial_states");
  args.seq_idx = opt_ref(p.o.seq_idx, op, "seq_idx");
  args.final_states = opt_mut_ref(final_states, op, "final_states");
  args.y_pre = opt_mut_ref(y_pre, op, "y_pre");
  if (plan.keeps_states()) args.states = mut_ref_of(states, op, "states");
  plan.run(current_stream(x), workspace_of(ws), args);
  return Outs4{y, final_states, y_pre, states};
}

// Backward: (dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states) in the caller's
// dtypes (undefined where the input is absent).
Grads9 run_backward(const BackwardExtras& e, const at::Tensor& x, const at::Tensor& dt,
                    const at::Tensor& A, const at::Tensor& B, const at::Tensor& C,
                    int64_t chunk_size, const Options& o, bool strict, const std::string& op) {
  c10::DeviceGuard guard(x.device());
  const Prepared p = prepare(x, dt, A, B, C, chunk_size, o, strict, false, op, &e);
  const auto plan =
      SsdChunkScanBackwardPlan::select(backward_descriptor(p, e, op), current_preference());
  at::Tensor dx, ddt, dA, dB, dC, dD, dz, dbias, dinit;
  if (plan.zero_fill_outputs()) {
    // An empty extent: no state (see run_forward); only D, z and the initial state's
    // pass-through (L = 0) have gradients.
    const at::ScalarType ck = compute_type_of(x);
    at::Tensor dy = e.dy.to(ck);
    if (p.o.z.defined()) {
      const at::Tensor zc = p.o.z.to(ck), sg = at::sigmoid(zc);
      dz = (dy * e.y_pre.to(ck) * sg * (1 + zc * (1 - sg))).to(x.scalar_type()).contiguous();
      dy = dy * zc * sg;
    }
    if (p.o.D.defined()) {
      dx = (dy * D_view(p.o.D)).to(x.scalar_type()).contiguous();
      const at::Tensor prod = dy * x.to(ck);
      dD = p.o.D.dim() == 1 ? prod.sum(std::vector<int64_t>{0, 1, 3}) : prod.sum(std::vector<int64_t>{0, 1});
    } else {
      dx = at::zeros(x.sizes(), x.options());
    }
    ddt = at::zeros(p.dt.sizes(), p.dt.options());
    dA = at::zeros(p.A.sizes(), p.A.options());
    dB = at::zeros(B.sizes(), B.options());
    dC = at::zeros(C.sizes(), C.options());
    if (p.o.dt_bias.defined()) dbias = at::zeros(p.o.dt_bias.sizes(), p.o.dt_bias.options());
    if (p.o.initial_states.defined())
      dinit = (x.size(1) == 0 && p.dfinal_states.defined())
                  ? p.dfinal_states.contiguous().clone()
                  : at::zeros(p.o.initial_states.sizes(), p.o.initial_states.options());
  } else {
    const auto& layouts = plan.output_layouts();
    const auto& opt_layouts = plan.option_output_layouts();
    dx = allocate(layouts[0], x);
    ddt = allocate(layouts[1], x);
    dA = allocate(layouts[2], x);
    dB = allocate(layouts[3], x);
    dC = allocate(layouts[4], x);
    if (p.o.D.defined()) dD = allocate(opt_layouts[0], x);
    if (p.o.z.defined()) dz = allocate(opt_layouts[1], x);
    if (p.o.dt_bias.defined()) dbias = allocate(opt_layouts[2], x);
    if (p.o.initial_states.defined()) dinit = allocate(opt_layouts[3], x);
    at::Tensor ws = allocate_workspace(plan.workspace_size(), x);
    SsdChunkScanBackwardArgs args{ref_of(e.dy, op, "dy"), ref_of(x, op, "x"),
                                  ref_of(p.dt, op, "dt"), ref_of(p.A, op, "A"),
                                  ref_of(B, op, "B"),     ref_of(C, op, "C"),
                                  mut_ref_of(dx, op, "dx"), mut_ref_of(ddt, op, "ddt"),
                                  mut_ref_of(dA, op, "dA"), mut_ref_of(dB, op, "dB"),
                                  mut_ref_of(dC, op, "dC")};
    args.D = opt_ref(p.o.D, op, "D");
    args.z = opt_ref(p.o.z, op, "z");
    args.dt_bias = opt_ref(p.o.dt_bias, op, "dt_bias");
    args.initial_states = opt_ref(p.o.initial_states, op, "initial_states");
    args.seq_idx = opt_ref(p.o.seq_idx, op, "seq_idx");
    args.dfinal_states = opt_ref(p.dfinal_states, op, "dfinal_states");
    args.y_pre = opt_ref(e.y_pre, op, "y_pre");
    args.states = opt_ref(e.states, op, "states");
    args.dD = opt_mut_ref(dD, op, "dD");
    args.dz = opt_mut_ref(dz, op, "dz");
    args.ddt_bias = opt_mut_ref(dbias, op, "ddt_bias");
    args.dinitial_states = opt_mut_ref(dinit, op, "dinitial_states");
    plan.run(current_stream(x), workspace_of(ws), args);
  }
  // Back to the caller's dtypes (no copy where they already match).
  ddt = ddt.to(dt.scalar_type());
  dA = dA.to(A.scalar_type());
  if (dD.defined()) dD = dD.to(o.D.scalar_type());
  if (dbias.defined()) dbias = dbias.to(o.dt_bias.scalar_type());
  if (dinit.defined()) dinit = dinit.to(o.initial_states.scalar_type());
  return Grads9{dx, ddt, dA, dB, dC, dD, dz, dbias, dinit};
}

// ---- the plain op ----------------------------------------------------------------

// The plain op has no options; its dt is used as given (no clamp: dt_min = -inf).
Options plain_options() {
  Options o;
  o.dt_min = -std::numeric_limits<double>::infinity();
  return o;
}

at::Tensor ssd_chunk_scan_kernel(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                                 const at::Tensor& B, const at::Tensor& C, int64_t chunk_size) {
  return translate_errors([&] {
    return std::get<0>(run_forward(x, dt, A, B, C, chunk_size, plain_options(), true, false, kOp));
  });
}

Grads ssd_chunk_scan_backward_kernel(const at::Tensor& dy, const at::Tensor& x,
                                     const at::Tensor& dt, const at::Tensor& A,
                                     const at::Tensor& B, const at::Tensor& C,
                                     int64_t chunk_size) {
  return translate_errors([&] {
    BackwardExtras e{dy, at::Tensor(), at::Tensor()};
    auto g = run_backward(e, x, dt, A, B, C, chunk_size, plain_options(), true, kBackwardOp);
    return Grads{std::get<0>(g), std::get<1>(g), std::get<2>(g), std::get<3>(g), std::get<4>(g)};
  });
}

// Meta (fake) kernels: the plans' problem checks on symbolic sizes, then the shapes.
// The device is unknown here, so the CUDA-only D, N limit is left to the real kernel.
at::Tensor ssd_chunk_scan_meta(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                               const at::Tensor& B, const at::Tensor& C, int64_t chunk_size) {
  return translate_errors([&] {
    check_problem<c10::SymInt>(kOp, x, dt, A, B, C, chunk_size, false, true, plain_options(), nullptr,
                               sym_sizes_of);
    return at::empty_symint(x.sym_sizes(), x.options());
  });
}

Grads ssd_chunk_scan_backward_meta(const at::Tensor& dy, const at::Tensor& x,
                                   const at::Tensor& dt, const at::Tensor& A,
                                   const at::Tensor& B, const at::Tensor& C,
                                   int64_t chunk_size) {
  return translate_errors([&] {
    BackwardExtras e{dy, at::Tensor(), at::Tensor()};
    check_problem<c10::SymInt>(kBackwardOp, x, dt, A, B, C, chunk_size, false, true, plain_options(),
                               &e, sym_sizes_of);
    const auto o = x.options();
    return Grads{at::empty_symint(x.sym_sizes(), o), at::empty_symint(dt.sym_sizes(), o),
                 at::empty_symint(A.sym_sizes(), o), at::empty_symint(B.sym_sizes(), o),
                 at::empty_symint(C.sym_sizes(), o)};
  });
}

// ---- the combined op -------------------------------------------------------------

// What an absent optional output is: an empty tensor of x's dtype.
at::Tensor absent(const at::Tensor& x) { return at::empty({0}, x.options()); }

at::ScalarType final_dtype(const at::Tensor& x, const Options& o) {
  return o.state_dtype ? *o.state_dtype : compute_type_of(x);
}

Outs4 ssd_chunk_scan_combined_kernel(const at::Tensor& x, const at::Tensor& dt,
                                     const at::Tensor& A, const at::Tensor& B,
                                     const at::Tensor& C, int64_t chunk_size, const OptT& D,
                                     const OptT& z, const OptT& dt_bias, const OptT& init,
                                     const OptT& seq_idx, bool dt_softplus, double dt_min,
                                     std::optional<double> dt_max,
                                     std::optional<at::ScalarType> state_dtype, bool keep_states) {
  return translate_errors([&] {
    Options o = make_options(D, z, dt_bias, init, seq_idx, dt_softplus, dt_min, dt_max, state_dtype);
    o.keep_states = keep_states;
    auto [out, final_states, y_pre, states] =
        run_forward(x, dt, A, B, C, chunk_size, o, false, true, kCombinedOp);
    final_states = final_states.to(final_dtype(x, o));
    return Outs4{out, final_states, y_pre.defined() ? y_pre : absent(x),
                 states.defined() ? states : absent(x)};
  });
}

Grads9 ssd_chunk_scan_combined_backward_kernel(
    const at::Tensor& dout, const OptT& dfinal_states, const at::Tensor& x, const at::Tensor& dt,
    const at::Tensor& A, const at::Tensor& B, const at::Tensor& C, int64_t chunk_size,
    const OptT& D, const OptT& z, const OptT& dt_bias, const OptT& init, const OptT& seq_idx,
    const OptT& y_pre, bool dt_softplus, double dt_min, std::optional<double> dt_max,
    const OptT& states) {
  return translate_errors([&] {
    const Options o =
        make_options(D, z, dt_bias, init, seq_idx, dt_softplus, dt_min, dt_max, std::nullopt);
    BackwardExtras e{dout, value_or_undefined(dfinal_states), value_or_undefined(y_pre),
                     value_or_undefined(states)};
    auto g = run_backward(e, x, dt, A, B, C, chunk_size, o, false, kCombinedBackwardOp);
    auto fill = [&](at::Tensor& t) {
      if (!t.defined()) t = absent(x);
    };
    fill(std::get<5>(g));
    fill(std::get<6>(g));
    fill(std::get<7>(g));
    fill(std::get<8>(g));
    return g;
  });
}

at::Tensor meta_like(const at::Tensor& t) { return at::empty_symint(t.sym_sizes(), t.options()); }
at::Tensor meta_absent(const at::Tensor& x) {
  return at::empty_symint({c10::SymInt(0)}, x.options());
}

Outs4 ssd_chunk_scan_combined_meta(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                                   const at::Tensor& B, const at::Tensor& C, int64_t chunk_size,
                                   const OptT& D, const OptT& z, const OptT& dt_bias,
                                   const OptT& init, const OptT& seq_idx, bool dt_softplus,
                                   double dt_min, std::optional<double> dt_max,
                                   std::optional<at::ScalarType> state_dtype, bool keep_states) {
  return translate_errors([&] {
    Options o = make_options(D, z, dt_bias, init, seq_idx, dt_softplus, dt_min, dt_max, state_dtype);
    o.keep_states = keep_states;
    check_problem<c10::SymInt>(kCombinedOp, x, dt, A, B, C, chunk_size, false, false, o, nullptr,
                               sym_sizes_of);
    const auto xs = x.sym_sizes();
    const c10::SymInt N = B.sym_sizes()[3];
    at::Tensor final_states =
        at::empty_symint({xs[0], xs[2], xs[3], N}, x.options().dtype(final_dtype(x, o)));
    at::Tensor states = returns_states(x, o, kCombinedOp)
                            ? at::empty_symint({xs[0], xs[2], (xs[1] + (chunk_size - 1)) / chunk_size, xs[3], N},
                                               x.options())
                            : meta_absent(x);
    return Outs4{meta_like(x), final_states, o.z.defined() ? meta_like(x) : meta_absent(x), states};
  });
}

Grads9 ssd_chunk_scan_combined_backward_meta(
    const at::Tensor& dout, const OptT& dfinal_states, const at::Tensor& x, const at::Tensor& dt,
    const at::Tensor& A, const at::Tensor& B, const at::Tensor& C, int64_t chunk_size,
    const OptT& D, const OptT& z, const OptT& dt_bias, const OptT& init, const OptT& seq_idx,
    const OptT& y_pre, bool dt_softplus, double dt_min, std::optional<double> dt_max,
    const OptT& states) {
  return translate_errors([&] {
    const Options o =
        make_options(D, z, dt_bias, init, seq_idx, dt_softplus, dt_min, dt_max, std::nullopt);
    BackwardExtras e{dout, value_or_undefined(dfinal_states), value_or_undefined(y_pre),
                     value_or_undefined(states)};
    check_problem<c10::SymInt>(kCombinedBackwardOp, x, dt, A, B, C, chunk_size, false, false, o,
                               &e, sym_sizes_of);
    auto like_or_absent = [&](const at::Tensor& t) {
      return t.defined() ? meta_like(t) : meta_absent(x);
    };
    return Grads9{meta_like(x),          meta_like(dt),        meta_like(A),
                  meta_like(B),          meta_like(C),         like_or_absent(o.D),
                  like_or_absent(o.z),   like_or_absent(o.dt_bias),
                  like_or_absent(o.initial_states)};
  });
}

// ---- plans (baracuda_torch.explain) ----------------------------------------------

SsdChunkScanPlan forward_plan(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                              const at::Tensor& B, const at::Tensor& C, int64_t chunk_size,
                              PlanPreference pref) {
  const Prepared p = prepare(x, dt, A, B, C, chunk_size, plain_options(), true, false, kOp, nullptr);
  return SsdChunkScanPlan::select(p.desc, pref);
}

SsdChunkScanBackwardPlan backward_plan(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& dt,
                                       const at::Tensor& A, const at::Tensor& B, const at::Tensor& C,
                                       int64_t chunk_size, PlanPreference pref) {
  BackwardExtras e{dy, at::Tensor(), at::Tensor()};
  const Prepared p = prepare(x, dt, A, B, C, chunk_size, plain_options(), true, false, kBackwardOp, &e);
  return SsdChunkScanBackwardPlan::select(backward_descriptor(p, e, kBackwardOp), pref);
}

SsdChunkScanPlan combined_plan(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                               const at::Tensor& B, const at::Tensor& C, int64_t chunk_size, const OptT& D,
                               const OptT& z, const OptT& dt_bias, const OptT& initial_states,
                               const OptT& seq_idx, bool dt_softplus, double dt_min,
                               std::optional<double> dt_max, std::optional<at::ScalarType> state_dtype,
                               bool keep_states, PlanPreference pref) {
  Options o = make_options(D, z, dt_bias, initial_states, seq_idx, dt_softplus, dt_min, dt_max, state_dtype);
  o.keep_states = keep_states;
  const Prepared p = prepare(x, dt, A, B, C, chunk_size, o, false, true, kCombinedOp, nullptr);
  return SsdChunkScanPlan::select(p.desc, pref);
}

SsdChunkScanBackwardPlan combined_backward_plan(
    const at::Tensor& dout, const OptT& dfinal_states, const at::Tensor& x, const at::Tensor& dt,
    const at::Tensor& A, const at::Tensor& B, const at::Tensor& C, int64_t chunk_size, const OptT& D,
    const OptT& z, const OptT& dt_bias, const OptT& initial_states, const OptT& seq_idx,
    const OptT& y_pre, bool dt_softplus, double dt_min, std::optional<double> dt_max,
    const OptT& states, PlanPreference pref) {
  const Options o =
      make_options(D, z, dt_bias, initial_states, seq_idx, dt_softplus, dt_min, dt_max, std::nullopt);
  BackwardExtras e{dout, value_or_undefined(dfinal_states), value_or_undefined(y_pre),
                   value_or_undefined(states)};
  const Prepared p = prepare(x, dt, A, B, C, chunk_size, o, false, false, kCombinedBackwardOp, &e);
  return SsdChunkScanBackwardPlan::select(backward_descriptor(p, e, kCombinedBackwardOp), pref);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(baracuda, m) {
  OpDef(m, "ssd_chunk_scan(Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, int chunk_size=256) -> Tensor")
      .kernel(&ssd_chunk_scan_kernel)
      .meta(&ssd_chunk_scan_meta)
      .explain(&forward_plan)
      .derivative("ssd_chunk_scan_backward",
                  {grad(0), arg("x"), arg("dt"), arg("A"), arg("B"), arg("C"), arg("chunk_size")},
                  {{"x", 0}, {"dt", 1}, {"A", 2}, {"B", 3}, {"C", 4}});
  // -> (dx, ddt, dA, dB, dC)
  OpDef(m,
        "ssd_chunk_scan_backward(Tensor dy, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, "
        "int chunk_size=256) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")
      .kernel(&ssd_chunk_scan_backward_kernel)
      .meta(&ssd_chunk_scan_backward_meta)
      .explain(&backward_plan)
      .not_differentiable("baracuda::ssd_chunk_scan: double backward is not implemented");
  // mamba_ssm's mamba_chunk_scan_combined contract: returns (out, final_states, y_pre,
  // states); y_pre is the pre-gate output saved for the backward when z is given, states
  // the chunk states kept for the backward with keep_states and 16-bit inputs (an empty
  // tensor otherwise, which the derivative receives as None); dt_max=None is +inf.
  OpDef(m,
        "ssd_chunk_scan_combined(Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, "
        "int chunk_size=256, Tensor? D=None, Tensor? z=None, Tensor? dt_bias=None, "
        "Tensor? initial_states=None, Tensor? seq_idx=None, bool dt_softplus=False, "
        "float dt_min=0., float? dt_max=None, ScalarType? state_dtype=None, "
        "bool keep_states=False) -> (Tensor, Tensor, Tensor, Tensor)")
      .kernel(&ssd_chunk_scan_combined_kernel)
      .meta(&ssd_chunk_scan_combined_meta)
      .explain(&combined_plan)
      .derivative("ssd_chunk_scan_combined_backward",
                  {grad(0), grad(1), arg("x"), arg("dt"), arg("A"), arg("B"), arg("C"), arg("chunk_size"),
                   arg("D"), arg("z"), arg("dt_bias"), arg("initial_states"), arg("seq_idx"), output(2),
                   arg("dt_softplus"), arg("dt_min"), arg("dt_max"), output(3)},
                  {{"x", 0}, {"dt", 1}, {"A", 2}, {"B", 3}, {"C", 4}, {"D", 5}, {"z", 6}, {"dt_bias", 7},
                   {"initial_states", 8}});
  // -> (dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states); the last four are
  // empty tensors where their input is None.
  OpDef(m,
        "ssd_chunk_scan_combined_backward(Tensor dout, Tensor? dfinal_states, Tensor x, "
        "Tensor dt, Tensor A, Tensor B, Tensor C, int chunk_size, Tensor? D=None, "
        "Tensor? z=None, Tensor? dt_bias=None, Tensor? initial_states=None, "
        "Tensor? seq_idx=None, Tensor? y_pre=None, bool dt_softplus=False, float dt_min=0., "
        "float? dt_max=None, Tensor? states=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor, "
        "Tensor, Tensor, Tensor, Tensor)")
      .kernel(&ssd_chunk_scan_combined_backward_kernel)
      .meta(&ssd_chunk_scan_combined_backward_meta)
      .explain(&combined_backward_plan)
      .not_differentiable("baracuda::ssd_chunk_scan_combined: double backward is not implemented");
}

}  // namespace baracuda::torch_ops
