#include "torch/op_def.h"

#include <ATen/SavedTensorHooks.h>
#include <ATen/ops/zeros.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/jit/frontend/function_schema_parser.h>

#include <algorithm>
#include <deque>

namespace baracuda::torch_ops {

namespace {
// Entries live as long as the process (the registered kernels point at them).
std::deque<OpEntry>& storage() {
  static std::deque<OpEntry> entries;
  return entries;
}
std::vector<const OpEntry*>& entry_list() {
  static std::vector<const OpEntry*> list;
  return list;
}

[[noreturn]] void declaration_error(const OpEntry& e, const std::string& what) {
  fail(PlanErrorKind::Internal, e.name, "op declaration: " + what);
}

bool is_tensor_type(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::TensorType) return true;
  if (auto opt = t->cast<c10::OptionalType>())
    return opt->getElementType()->kind() == c10::TypeKind::TensorType;
  return false;
}

std::string key(const char* prefix, int index) { return prefix + std::to_string(index); }

// reuse_saved's conditions on the call (see op_def.h): the graph is not kept (no later
// backward reads the saved tensors) nor recorded, and no dispatch mode, functionalization
// or Python dispatch sees the call.
bool may_reuse_now() {
  // (create_graph: the backward is recorded, and its in-place form is not differentiable)
  if (at::GradMode::is_enabled() || torch::autograd::get_current_graph_task_keep_graph()) return false;
  if (c10::impl::TorchDispatchModeTLS::any_modes_set()) return false;
  const auto tls = c10::impl::tls_local_dispatch_key_set();
  return !tls.included_.has_any(c10::DispatchKeySet(
      {c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot, c10::DispatchKey::Functionalize}));
}

// Whether the backward's `held` handles are the only references to t's TensorImpl. Where
// torch keeps a tensor's Python object alive by a strong reference from the object to the
// TensorImpl for as long as C++ holds it too (c10/util/intrusive_ptr.h, "PyObject
// preservation": PyObjectSlot::has_unique_reference), that object is one more reference,
// and no Python code may hold the object itself. Before that scheme, a Python object no one
// holds borrowed the TensorImpl (no count) and a held one owned a reference.
template <typename Slot>
auto only_held(const Slot& slot, const at::Tensor& t, size_t held, int)
    -> decltype(slot.has_unique_reference(), bool()) {
  if (slot.load_pyobj() == nullptr) return t.use_count() == held;
  return t.use_count() == held + 1 && slot.has_unique_reference();
}
template <typename Slot>
bool only_held(const Slot&, const at::Tensor& t, size_t held, long) {
  return t.use_count() == held;
}

// ... and on one tensor, `held` being the handles the backward itself holds: no one else
// refers to its TensorImpl or its storage, it is contiguous (the derivative's output
// layout), and no subclass, fake, functional or torch.func wrapper tensor.
bool held_alone(const at::Tensor& t, size_t held) {
  if (!t.defined() || !t.is_contiguous()) return false;
  if (t.key_set().has_any(c10::DispatchKeySet(
          {c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot, c10::DispatchKey::Functionalize,
           c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper,
           c10::DispatchKey::Conjugate, c10::DispatchKey::Negative})))
    return false;
  return only_held(*t.unsafeGetTensorImpl()->pyobj_slot(), t, held, 0) && t.storage().use_count() == 1;
}

// reuse_saved's saved tensor: held alone, on the CPU or a CUDA device, requires grad and
// is not a leaf (an intermediate of the forward).
bool may_overwrite(const at::Tensor& t, size_t held) {
  return t.defined() && t.requires_grad() && !t.is_leaf() && (t.is_cpu() || t.is_cuda()) && held_alone(t, held);
}

// reuse_grad's incoming gradient g: held alone, with the dtype, sizes and device of `like`
// (the derivative's output that goes over it), on the CPU or a CUDA device.
bool may_take_grad(const at::Tensor& g, const at::Tensor& like, size_t held) {
  if (!g.defined() || !like.defined() || g.scalar_type() != like.scalar_type() || g.device() != like.device() ||
      !g.sizes().equals(like.sizes()))
    return false;
  if (!(g.is_cpu() || g.is_cuda())) return false;
  return held_alone(g, held);
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// An optional output the op did not compute: the library returns an empty 1-D tensor
// there (output(k) passes it to an optional parameter of the derivative as None).
bool is_absent_output(const at::Tensor& t) { return t.dim() == 1 && t.sym_numel() == 0; }

// The Autograd kernel of a declared op (see op_def.h). Its inputs, as Function::apply
// counts them: the entry, the op handle, then one per tensor argument that is not None
// (Function::apply records every tensor input's device), then the full argument stack;
// gradients are returned in the same positions.
class DeclaredFunction : public torch::autograd::Function<DeclaredFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const OpEntry* e,
                               const c10::OperatorHandle* op, at::TensorList,
                               torch::jit::Stack args) {
    ctx->set_materialize_grads(false);
    ctx->saved_data["op"] = static_cast<int64_t>(e->id);
    // reuse_saved, reuse_grad: not with saved-tensor hooks (the tensors the backward
    // unpacks are theirs), which are taken when the tensors are saved, here
    if (!e->reuse.empty() || !e->reuse_grad.empty())
      ctx->saved_data["reuse"] = at::SavedTensorDefaultHooks::get_tls_state().stack.empty();
    // The arguments that are edges: the tensor arguments given (not None), in order.
    std::vector<int64_t> edges;
    for (size_t i = 0; i < args.size(); ++i)
      if (args[i].isTensor()) edges.push_back(static_cast<int64_t>(i));
    ctx->saved_data["edges"] = edges;
    torch::jit::Stack stack = args;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      op->callBoxed(stack);
    }
    variable_list outs;
    outs.reserve(stack.size());
    for (auto& v : stack) outs.push_back(std::move(v).toTensor());
    if (e->autograd != OpEntry::Autograd::Derivative) return outs;

    std::vector<at::Tensor> to_save;
    std::vector<bool> read(outs.size(), false);
    for (const GradSource& s : e->sources) {
      const c10::IValue* a = s.index >= 0 && s.kind != GradSource::Kind::Grad &&
                                     s.kind != GradSource::Kind::Output
                                 ? &args[s.index]
                                 : nullptr;
      switch (s.kind) {
        case GradSource::Kind::Grad: {
          // What a zero gradient of this output looks like, if one has to be made.
          const at::Tensor& o = outs[s.index];
          read[s.index] = true;
          ctx->saved_data[key("o", s.index)] = c10::IValue(o.sym_sizes());
          ctx->saved_data[key("t", s.index)] = o.scalar_type();
          ctx->saved_data[key("d", s.index)] = o.device();
          break;
        }
        case GradSource::Kind::Arg:
          if (e->is_tensor_arg(s.index))
            to_save.push_back(a->isTensor() ? a->toTensor() : at::Tensor());
          else
            ctx->saved_data[key("a", s.index)] = *a;
          break;
        case GradSource::Kind::Output: to_save.push_back(outs[s.index]); break;
        case GradSource::Kind::SizesOf:
          ctx->saved_data[key("s", s.index)] = c10::IValue(a->toTensor().sym_sizes());
          break;
        case GradSource::Kind::None: break;
      }
    }
    ctx->save_for_backward(to_save);
    variable_list constant;  // outputs whose gradient the derivative does not read
    for (size_t k = 0; k < outs.size(); ++k)
      if (!read[k]) constant.push_back(outs[k]);
    if (!constant.empty()) ctx->mark_non_differentiable(constant);
    return outs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const OpEntry& e = *op_entries()[ctx->saved_data["op"].toInt()];
    if (e.autograd == OpEntry::Autograd::NotDifferentiable)
      C10_THROW_ERROR(NotImplementedError, e.not_differentiable);
    const std::vector<int64_t> edges = ctx->saved_data["edges"].toIntVector();
    variable_list result(edges.size() + 3);
    bool any = false;
    for (const GradSource& s : e.sources)
      any = any || (s.kind == GradSource::Kind::Grad && grads[s.index].defined());
    if (!any) return result;

    const c10::OperatorHandle& op = e.derivative_op();
    const auto& params = op.schema().arguments();
    variable_list saved = ctx->get_saved_variables();
    std::vector<size_t> saved_at(e.sources.size());  // (a saved source's position in `saved`)
    size_t next = 0;
    torch::jit::Stack stack;
    for (size_t j = 0; j < e.sources.size(); ++j) {
      saved_at[j] = next;
      const GradSource& s = e.sources[j];
      switch (s.kind) {
        case GradSource::Kind::Grad: {
          at::Tensor g = grads[s.index];
          if (!g.defined() && params[j].type()->kind() == c10::TypeKind::OptionalType) {
            stack.emplace_back();
            break;
          }
          if (!g.defined())
            g = at::zeros_symint(ctx->saved_data[key("o", s.index)].toSymIntVector(),
                                 at::TensorOptions()
                                     .dtype(ctx->saved_data[key("t", s.index)].toScalarType())
                                     .device(ctx->saved_data[key("d", s.index)].toDevice()));
          stack.emplace_back(std::move(g));
          break;
        }
        case GradSource::Kind::Arg:
          if (e.is_tensor_arg(s.index)) {
            const at::Tensor& t = saved[next++];
            stack.push_back(t.defined() ? c10::IValue(t) : c10::IValue());
          } else {
            stack.push_back(ctx->saved_data[key("a", s.index)]);
          }
          break;
        case GradSource::Kind::Output: {
          const at::Tensor& t = saved[next++];
          if (is_absent_output(t) && params[j].type()->kind() == c10::TypeKind::OptionalType)
            stack.emplace_back();
          else
            stack.emplace_back(t);
          break;
        }
        case GradSource::Kind::SizesOf: stack.push_back(ctx->saved_data[key("s", s.index)]); break;
        case GradSource::Kind::None: stack.emplace_back(); break;
      }
    }
    // reuse_grad: the incoming gradient a derivative output would go over, held by the
    // node's inputs (CppNode::apply's), `grads` and `stack` alone
    int grad_over = -1;  // (its position in `stack`)
    if (!e.reuse_grad.empty() && ctx->saved_data["reuse"].toBool() && may_reuse_now()) {
      const auto [g, like] = e.reuse_grad_sources();
      if (stack[g].isTensor() && stack[like].isTensor() &&
          may_take_grad(stack[g].toTensor(), stack[like].toTensor(), 3))
        grad_over = g;
    }
    // reuse_saved: the saved tensors the gradients would go over, each held by its
    // SavedVariable, `saved` and `stack` alone
    std::vector<std::pair<int, size_t>> over;  // (derivative output, position in saved)
    if (!e.reuse.empty() && ctx->saved_data["reuse"].toBool() && may_reuse_now()) {
      for (const auto& [out, src] : e.reuse_over) over.emplace_back(out, saved_at[src]);
      for (const auto& [out, at] : over)
        if (!may_overwrite(saved[at], 3)) {
          over.clear();
          break;
        }
    }
    if (grad_over >= 0) {
      const at::Tensor g = stack[grad_over].toTensor();
      e.reuse_grad_op().callBoxed(stack);  // (bumps g's version) -> the derivative's other outputs
      torch::jit::Stack outs;
      const int n = static_cast<int>(op.schema().returns().size());
      for (int j = 0, k = 0; j < n; ++j) outs.push_back(j == e.reuse_grad_out ? c10::IValue(g) : stack[k++]);
      stack = std::move(outs);
    } else if (over.empty()) {
      op.callBoxed(stack);
    } else {
      e.reuse_op().callBoxed(stack);  // (bumps the overwritten tensors' versions)
      stack.clear();
      for (int j = 0; j < static_cast<int>(op.schema().returns().size()); ++j) stack.emplace_back();
      for (const auto& [out, at] : over) stack[out] = saved[at].detach();
    }
    for (const auto& [input, out] : e.gradients) {
      const auto edge = std::find(edges.begin(), edges.end(), input);
      if (edge == edges.end()) continue;  // a None argument
      const size_t slot = static_cast<size_t>(edge - edges.begin());
      if (ctx->needs_input_grad(slot)) result[2 + slot] = stack[out].toTensor();
    }
    return result;
  }
};

// The boxed Autograd-key kernel of a declared op.
class DeclaredAutogradKernel final : public c10::OperatorKernel {
 public:
  explicit DeclaredAutogradKernel(const OpEntry* e) : e_(e) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n = e_->schema.arguments().size();
    torch::jit::Stack args(std::make_move_iterator(stack->end() - n),
                           std::make_move_iterator(stack->end()));
    stack->erase(stack->end() - n, stack->end());
    std::vector<at::Tensor> tensors;
    for (const c10::IValue& a : args)
      if (a.isTensor()) tensors.push_back(a.toTensor());
    std::vector<at::Tensor> written;  // the arguments the op updates in place
    for (const int i : e_->mutated) {
      if (!args[i].isTensor()) continue;
      const at::Tensor& t = args[i].toTensor();
      if (at::GradMode::is_enabled() && t.requires_grad())
        C10_THROW_ERROR(NotImplementedError,
                        "baracuda::" + e_->name + ": " + e_->schema.arguments()[i].name() +
                            " is updated in place and must not require grad (the op is not "
                            "differentiable through it)");
      written.push_back(t);
    }
    variable_list outs =
        DeclaredFunction::apply(e_, &op, at::TensorList(tensors), std::move(args));
    for (const at::Tensor& t : written) torch::autograd::impl::bump_version(t);
    for (auto& t : outs) stack->emplace_back(std::move(t));
  }

 private:
  const OpEntry* e_;
};
}  // namespace

OpEntry::OpEntry(c10::FunctionSchema s) : schema(std::move(s)) {
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    tensor_arg.push_back(is_tensor_type(args[i].type()));
    if (args[i].alias_info() && args[i].alias_info()->isWrite())
      mutated.push_back(static_cast<int>(i));
  }
}

const c10::OperatorHandle& OpEntry::derivative_op() const {
  std::call_once(found_, [&] {
    const auto dot = derivative.find('.');
    const std::string base = "baracuda::" + derivative.substr(0, dot);
    const std::string overload = dot == std::string::npos ? "" : derivative.substr(dot + 1);
    derivative_op_ = c10::Dispatcher::singleton().findSchemaOrThrow(base.c_str(), overload.c_str());
  });
  return *derivative_op_;
}

const c10::OperatorHandle& OpEntry::reuse_op() const {
  std::call_once(reuse_found_, [&] {
    reuse_op_ = c10::Dispatcher::singleton().findSchemaOrThrow(("baracuda::" + reuse).c_str(), "");
    // (it returns nothing: every gradient of the derivative goes over a saved argument)
    if (!reuse_op_->schema().returns().empty() ||
        derivative_op().schema().returns().size() != reuse_over.size())
      declaration_error(*this, "reuse_saved: " + reuse + " must return nothing and take every output of " +
                                   derivative + " over a saved argument");
  });
  return *reuse_op_;
}

const c10::OperatorHandle& OpEntry::reuse_grad_op() const {
  std::call_once(reuse_grad_found_, [&] {
    reuse_grad_op_ = c10::Dispatcher::singleton().findSchemaOrThrow(("baracuda::" + reuse_grad).c_str(), "");
    const auto& d = derivative_op().schema();
    const auto& r = reuse_grad_op_->schema();
    const auto at = [&](const std::string& name) {
      const auto i = d.argumentIndexWithName(name);
      if (!i) declaration_error(*this, "reuse_grad: " + derivative + " has no argument '" + name + "'");
      return *i;
    };
    const int over = at(reuse_grad_over), like = at(reuse_grad_like);
    const c10::AliasInfo* written =
        r.arguments().size() == d.arguments().size() ? r.arguments()[over].alias_info() : nullptr;
    if (sources[over].kind != GradSource::Kind::Grad || written == nullptr || !written->isWrite() ||
        r.returns().size() + 1 != d.returns().size() || reuse_grad_out < 0 ||
        reuse_grad_out >= static_cast<int>(d.returns().size()))
      declaration_error(*this, "reuse_grad: " + reuse_grad + " must take " + derivative + "'s arguments, '" +
                                   reuse_grad_over + "' (a gradient) as Tensor(a!), and return its other outputs");
    reuse_grad_sources_ = {over, like};
  });
  return *reuse_grad_op_;
}

std::pair<int, int> OpEntry::reuse_grad_sources() const {
  reuse_grad_op();
  return reuse_grad_sources_;
}

int OpEntry::arg_index(const std::string& arg) const {
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].name() == arg) return static_cast<int>(i);
  declaration_error(*this, "no argument named '" + arg + "'");
}

const std::vector<const OpEntry*>& op_entries() { return entry_list(); }

const OpEntry* find_op_entry(const std::string& name) {
  for (const OpEntry* e : entry_list())
    if (e->name == name) return e;
  return nullptr;
}

OpDef::OpDef(torch::Library& m, const char* schema) : m_(m) {
  c10::FunctionSchema parsed = torch::jit::parseSchema(schema);
  const std::string overload = parsed.overload_name();
  OpEntry& e = storage().emplace_back(std::move(parsed));
  e.id = static_cast<int>(entry_list().size());
  e.name = e.schema.name() + (overload.empty() ? "" : "." + overload);
  entry_list().push_back(&e);
  entry_ = &e;
  m_.def(schema, {at::Tag::pt2_compliant_tag});
}

void OpDef::check_arity(const char* what, size_t n) const {
  if (n != entry_->schema.arguments().size())
    declaration_error(*entry_, std::string(what) + " takes " + std::to_string(n) +
                                   " arguments, the schema has " +
                                   std::to_string(entry_->schema.arguments().size()));
}

OpDef& OpDef::derivative(const char* op, std::vector<GradSource> sources,
                         std::vector<std::pair<const char*, int>> gradients) {
  OpEntry& e = *entry_;
  const int outputs = static_cast<int>(e.schema.returns().size());
  for (GradSource& s : sources) {
    if (s.kind == GradSource::Kind::Arg || s.kind == GradSource::Kind::SizesOf)
      s.index = e.arg_index(s.name);
    else if (s.kind != GradSource::Kind::None && (s.index < 0 || s.index >= outputs))
      declaration_error(e, "output " + std::to_string(s.index) + " does not exist");
    if (s.kind == GradSource::Kind::SizesOf && !e.is_tensor_arg(s.index))
      declaration_error(e, "sizes_of('" + s.name + "'): not a tensor argument");
  }
  for (const auto& [arg_name, out] : gradients) {
    const int i = e.arg_index(arg_name);
    if (!e.is_tensor_arg(i))
      declaration_error(e, std::string("gradient of '") + arg_name + "': not a tensor argument");
    e.gradients.emplace_back(i, out);
  }
  e.derivative = op;
  e.sources = std::move(sources);
  e.autograd = OpEntry::Autograd::Derivative;
  register_declared_autograd();
  return *this;
}

OpDef& OpDef::reuse_saved(const char* op, std::vector<std::pair<int, const char*>> over) {
  OpEntry& e = *entry_;
  if (e.autograd != OpEntry::Autograd::Derivative) declaration_error(e, "reuse_saved before derivative");
  for (const auto& [out, arg_name] : over) {
    const int a = e.arg_index(arg_name);
    int src = -1;
    for (size_t j = 0; j < e.sources.size(); ++j)
      if (e.sources[j].kind == GradSource::Kind::Arg && e.sources[j].index == a) src = static_cast<int>(j);
    if (src < 0 || !e.is_tensor_arg(a))
      declaration_error(e, std::string("reuse_saved: '") + arg_name + "' is not a saved tensor argument");
    e.reuse_over.emplace_back(out, src);
  }
  if (!e.reuse_grad.empty()) declaration_error(e, "reuse_saved with reuse_grad: one or the other");
  e.reuse = op;
  return *this;
}

OpDef& OpDef::reuse_grad(const char* op, int out, const char* over, const char* like) {
  OpEntry& e = *entry_;
  if (e.autograd != OpEntry::Autograd::Derivative) declaration_error(e, "reuse_grad before derivative");
  if (!e.reuse.empty()) declaration_error(e, "reuse_grad with reuse_saved: one or the other");
  e.reuse_grad = op;
  e.reuse_grad_out = out;
  e.reuse_grad_over = over;
  e.reuse_grad_like = like;
  return *this;
}

OpDef& OpDef::not_differentiable(std::string message) {
  entry_->not_differentiable = std::move(message);
  entry_->autograd = OpEntry::Autograd::NotDifferentiable;
  register_declared_autograd();
  return *this;
}

void OpDef::register_declared_autograd() {
  m_.impl(name().c_str(), torch::dispatch(c10::DispatchKey::Autograd,
                                  torch::CppFunction::makeFromBoxedFunctor(
                                      std::make_unique<DeclaredAutogradKernel>(entry_))));
}

OpDef& OpDef::vmap_rows(std::vector<const char*> rows, std::vector<const char*> dims) {
  for (const char* r : rows) {
    const int i = entry_->arg_index(r);
    if (!entry_->is_tensor_arg(i))
      declaration_error(*entry_, std::string("vmap_rows: '") + r + "' is not a tensor");
    entry_->vmap_rows.push_back(i);
  }
  for (const char* d : dims) entry_->vmap_dims.push_back(entry_->arg_index(d));
  return *this;
}

}  // namespace baracuda::torch_ops
