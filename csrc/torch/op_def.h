// One declaration per op: its schema, its kernels, its explain and its derivative, in the
// family's <family>_ops.cpp, inside a TORCH_LIBRARY_FRAGMENT(baracuda, m) block:
//
//   OpDef(m, "gated_activation(Tensor x, str kind, int dim=-1, bool gate_first=False) -> Tensor")
//       .kernel(&gated_activation_kernel)   // CPU and (CUDA builds) CUDA
//       .meta(&gated_activation_meta)       // fake tensors, torch.compile
//       .explain(&forward_plan)             // baracuda_torch.explain
//       .derivative("gated_activation_backward",
//                   {grad(0), arg("x"), arg("kind"), arg("dim"), arg("gate_first")},
//                   {{"x", 0}})
//       .vmap_rows({"x"}, {"dim"});
//
// The derivative is the common pattern of the library: the forward saves some inputs,
// outputs and scalars; its backward calls the public backward op with them and the
// output gradients, and hands the backward op's outputs to the inputs; the backward op's
// own backward is either another op (`derivative` again) or a clear NotImplementedError
// (`not_differentiable`). From that one declaration:
//   - C++: the op's Autograd kernel, a torch::autograd::Function (eager, torch.compile,
//     opcheck, CUDA graphs);
//   - Python: baracuda_torch/_autograd.py reads the table (_C._op_table()) and builds the
//     torch.func rules (grad, vjp, vmap; forward-mode AD only where a family adds a jvp).
// An op whose autograd does not fit (broadcast gradients summed down, gradients computed
// with ATen ops) registers its own Function with `.autograd(&fn)` and its own torch.func
// rules in Python.
#pragma once

#include <ATen/core/boxing/impl/make_boxed_from_unboxed_functor.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/stack.h>
#include <c10/util/TypeList.h>
#include <torch/library.h>

#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "torch/common.h"

namespace baracuda::torch_ops {

// Where an argument of the derivative op comes from.
struct GradSource {
  enum class Kind : uint8_t { Grad, Arg, Output, SizesOf, None };
  Kind kind = Kind::Arg;
  int index = -1;    // Grad, Output: the forward output; Arg, SizesOf: resolved arg index
  std::string name;  // Arg, SizesOf: the forward argument's schema name
};
// The gradient of forward output k (None for an optional parameter when no gradient
// flows into that output, zeros of its shape for a required one).
inline GradSource grad(int k) { return {GradSource::Kind::Grad, k, ""}; }
// A forward argument, by schema name (tensors are saved for the backward).
inline GradSource arg(const char* name) { return {GradSource::Kind::Arg, -1, name}; }
// Forward output k (saved for the backward). For an optional (Tensor?) parameter of the
// derivative, an output the op did not compute (an empty 1-D tensor, the library's absent
// output) is None.
inline GradSource output(int k) { return {GradSource::Kind::Output, k, ""}; }
// The (symbolic) sizes of a tensor argument, as a SymInt[] parameter.
inline GradSource sizes_of(const char* name) { return {GradSource::Kind::SizesOf, -1, name}; }
// None, for an optional parameter the derivative does not use here.
inline GradSource none() { return {GradSource::Kind::None, -1, ""}; }

// What baracuda_torch.explain runs for an op: its plan, selected from the op's own
// arguments (a stack in schema order, defaults filled in) under a preference.
using ExplainFn = std::function<PlanInfo(torch::jit::Stack&, PlanPreference)>;

// The registry entry of one op (stable address: entries are never freed).
struct OpEntry {
  int id = -1;
  std::string name;  // "gated_activation", "lerp.Tensor"
  c10::FunctionSchema schema;
  ExplainFn explain;
  enum class Autograd : uint8_t { None, Custom, Derivative, NotDifferentiable };
  Autograd autograd = Autograd::None;
  std::string derivative;            // the derivative op ("gated_activation_backward")
  std::vector<GradSource> sources;   // its arguments, in its schema order
  std::vector<std::pair<int, int>> gradients;  // (forward arg, derivative op output)
  std::string not_differentiable;    // the NotImplementedError message
  std::vector<int> vmap_rows, vmap_dims;  // see OpDef::vmap_rows
  std::vector<bool> tensor_arg;  // per argument: Tensor or Tensor?
  // The arguments the op writes in place (Tensor(a!) in the schema). The Autograd kernel
  // refuses one that requires grad (the declared derivatives know nothing of in-place
  // updates) and bumps its version counter after the call, as ATen's in-place ops do.
  std::vector<int> mutated;
  // OpDef::reuse_saved: the derivative's in-place form, and for each of its gradients the
  // saved tensor argument it writes over: (derivative output j, index in `sources`).
  std::string reuse;
  std::vector<std::pair<int, int>> reuse_over;
  // OpDef::reuse_grad: the derivative's form that writes output reuse_grad_out over its
  // argument named reuse_grad_over (an incoming gradient) when that gradient has the
  // dtype and sizes of its argument named reuse_grad_like.
  std::string reuse_grad;
  int reuse_grad_out = -1;
  std::string reuse_grad_over, reuse_grad_like;

  explicit OpEntry(c10::FunctionSchema s);
  int arg_index(const std::string& arg) const;  // Internal error naming the op if absent
  bool is_tensor_arg(int i) const { return tensor_arg[i]; }
  // The derivative op and reuse_saved's op, found on first use (they may be defined in a
  // later fragment).
  const c10::OperatorHandle& derivative_op() const;
  const c10::OperatorHandle& reuse_op() const;
  // reuse_grad's op, and the positions in `sources` of its `over` and `like` arguments.
  const c10::OperatorHandle& reuse_grad_op() const;
  std::pair<int, int> reuse_grad_sources() const;

 private:
  mutable std::once_flag found_, reuse_found_, reuse_grad_found_;
  mutable std::optional<c10::OperatorHandle> derivative_op_, reuse_op_, reuse_grad_op_;
  mutable std::pair<int, int> reuse_grad_sources_{-1, -1};
};

// Every op declared through OpDef, in registration order; the one named `name` or null.
const std::vector<const OpEntry*>& op_entries();
const OpEntry* find_op_entry(const std::string& name);

// The `index`-th argument of a stack as the C++ type T of a kernel parameter (as the
// dispatcher unboxes it).
template <class T>
decltype(auto) stack_arg(c10::IValue& v) {
  using D = std::conditional_t<std::is_same_v<std::decay_t<T>, at::Tensor>, T, std::decay_t<T>>;
  return c10::impl::ivalue_to_arg<D, false>::call(v);
}

template <class F, size_t... I>
auto call_with_stack(F* f, torch::jit::Stack& s, PlanPreference pref, std::index_sequence<I...>) {
  using Params = typename c10::guts::infer_function_traits_t<F>::parameter_types;
  return f(stack_arg<c10::guts::typelist::element_t<I, Params>>(s[I])..., pref);
}

class OpDef {
 public:
  // Defines the op (schema string as in TORCH_LIBRARY's m.def), tagged
  // pt2_compliant_tag: every op passes torch.library.opcheck (tests/test_ops.py).
  OpDef(torch::Library& m, const char* schema);

  // The CPU and CUDA kernel (one function: its plan picks the backend from the device).
  template <class F>
  OpDef& kernel(F* f) {
    m_.impl(name().c_str(), torch::dispatch(c10::DispatchKey::CPU, f));
#ifdef BARACUDA_WITH_CUDA
    m_.impl(name().c_str(), torch::dispatch(c10::DispatchKey::CUDA, f));
#endif
    return *this;
  }

  // The Meta kernel: the plan's problem checks on symbolic sizes, then empty outputs.
  template <class F>
  OpDef& meta(F* f) {
    m_.impl(name().c_str(), torch::dispatch(c10::DispatchKey::Meta, f));
    return *this;
  }

  // `make_plan(<the op's arguments as its kernel takes them>..., PlanPreference)`: the plan
  // a call would run. baracuda_torch.explain(<op>, ...) reports its PlanInfo.
  template <class F>
  OpDef& explain(F* make_plan) {
    using Params = typename c10::guts::infer_function_traits_t<F>::parameter_types;
    constexpr size_t n = c10::guts::typelist::size<Params>::value - 1;
    static_assert(std::is_same_v<c10::guts::typelist::element_t<n, Params>, PlanPreference>,
                  "make_plan's last parameter is the PlanPreference");
    check_arity("explain", n);
    entry_->explain = [make_plan](torch::jit::Stack& s, PlanPreference pref) {
      return plan_info(call_with_stack(make_plan, s, pref, std::make_index_sequence<n>()), pref);
    };
    return *this;
  }

  // The derivative: `op(sources...)`, whose output j is the gradient of the forward
  // arguments named in `gradients` ({arg, j}; one output may feed several arguments).
  // Outputs that no grad(k) source reads are not differentiable (saved values such as a
  // normalization's rstd).
  OpDef& derivative(const char* op, std::vector<GradSource> sources,
                    std::vector<std::pair<const char*, int>> gradients);
  // Memory: where the backward is the last use of some saved tensor arguments, the
  // derivative may write its gradients over them instead of into new tensors (as
  // Liger-Kernel's SwiGLU backward does, but only when no one can tell): `op` is the
  // derivative's in-place form (the same arguments, those it overwrites `Tensor(a!)`,
  // returning nothing) and `over` pairs each derivative output j (every one) with the
  // saved argument that receives it. The backward takes it when every such tensor is held by this node
  // alone (not by the caller, another node, a view, a saved-tensor hook or a later
  // backward: the graph is not kept), is contiguous, requires grad and is not a leaf, and
  // nothing traces the call (no fake, functional or torch.func tensor, no dispatch mode);
  // else it calls the derivative. The values are the same either way.
  OpDef& reuse_saved(const char* op, std::vector<std::pair<int, const char*>> over);
  // Memory, the same way for an incoming gradient: derivative output `out` may be written
  // over the derivative's argument named `over` (a grad(k) source), as Liger-Kernel's
  // RMSNorm backward writes dx over dy (always: there over the caller's dy too). `op` is the
  // derivative's form that takes `over` as `Tensor(a!)` and returns the derivative's other
  // outputs, in order. The backward takes it when that gradient has the dtype and sizes of
  // the derivative's argument named `like`, is held by this node alone (not by the caller,
  // another node, a hook, `.grad` or a view), is contiguous, on the CPU or a CUDA
  // device, and nothing traces the call or keeps the graph; else it calls the
  // derivative. The values are the same either way.
  OpDef& reuse_grad(const char* op, int out, const char* over, const char* like);
  // Differentiating this op raises NotImplementedError(message) (name the forward op).
  OpDef& not_differentiable(std::string message);
  // An Autograd kernel written by hand (its torch.func rules too, in Python).
  template <class F>
  OpDef& autograd(F* f) {
    entry_->autograd = OpEntry::Autograd::Custom;
    m_.impl(name().c_str(), torch::dispatch(c10::DispatchKey::Autograd, f));
    return *this;
  }

  // vmap (torch.func): the op treats any number of leading dims of the `rows` tensor
  // arguments alike (they share them; every output has them too), so the vmapped dim
  // becomes one more leading dim: one call. `dims` are int arguments that count dims of
  // those tensors (shifted by one when non-negative). Other batched arguments (or a
  // 0-dim sample) run the op once per sample.
  OpDef& vmap_rows(std::vector<const char*> rows, std::vector<const char*> dims = {});

 private:
  const std::string& name() const { return entry_->name; }
  void check_arity(const char* what, size_t n) const;
  void register_declared_autograd();

  torch::Library& m_;
  OpEntry* entry_;
};

}  // namespace baracuda::torch_ops
