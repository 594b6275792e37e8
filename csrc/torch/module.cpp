// baracuda_torch._C: importing it registers the ops (TORCH_LIBRARY blocks in this
// library); the Python-facing objects that are not ops live here: the plan preference,
// plan introspection (PlanInfo; _explain for the ops, all declared through OpDef), the
// declarations' table (_op_table) and gather's error checks.
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/extension.h>

#include <atomic>
#include <vector>

#include "core/rmsnorm_plan.h"
#include "core/rope_cos_sin_plan.h"
#include "core/selective_state_update_plan.h"
#include "core/ssd_chunk_scan_plan.h"
#include "kernels/common.h"
#include "kernels/ssd_chunk_scan.h"
#include "torch/common.h"
#include "torch/op_def.h"
#include "torch/ops.h"

namespace py = pybind11;
using namespace baracuda;
using namespace baracuda::torch_ops;

namespace {
const char* math_name(MathPrecision m) { return m == MathPrecision::F64 ? "float64" : "float32"; }

// A test switch set by name: "auto" restores the plan's own choice (std::nullopt), any other
// name must be one of `names`; `force` sets the switch and returns its previous setting,
// which this returns by name ("auto" for the plan's choice).
template <typename V, size_t K, typename Force>
std::string named_switch(const char* fn, const std::pair<const char*, V> (&names)[K], const std::string& name,
                         Force&& force) {
  std::optional<V> want;
  for (const auto& [n, k] : names)
    if (name == n) want = k;
  if (!want && name != "auto") {
    std::string expected = "auto";
    for (size_t i = 0; i < K; ++i) expected += std::string(i + 1 < K ? ", " : " or ") + names[i].first;
    throw py::value_error(std::string(fn) + ": expected " + expected + ", got " + name);
  }
  const std::optional<V> previous = force(want);
  if (previous)
    for (const auto& [n, k] : names)
      if (*previous == k) return n;
  return "auto";
}

// Binds named_switch as the module function `fn` (a string literal), its names static.
template <typename V, size_t K, typename Force>
void def_switch(py::module_& m, const char* fn, const std::pair<const char*, V> (&names)[K], Force force) {
  m.def(fn, [fn, &names, force](const std::string& name) { return named_switch(fn, names, name, force); },
        py::arg("name"));
}

std::string plan_repr(const PlanInfo& p) {
  const auto& g = p.sku.precision;
  return "PlanInfo(" + p.sku.name() + ", math=" + math_name(g.math) +
         ", accumulator=" + element_name(g.accumulator) +
         ", deterministic=" + (g.deterministic ? "True" : "False") +
         ", bit_stable=" + (g.bit_stable_on_same_hardware ? "True" : "False") +
         ", workspace_bytes=" + std::to_string(p.workspace_bytes) +
         ", preference=" + preference_name(p.preference) + ")";
}

// explain of an op declared through OpDef: its arguments bound to its schema (defaults
// filled in, as a call of the op binds them), then its make_plan.
PlanInfo explain_declared(const std::string& name, const std::optional<std::string>& preference,
                          const py::tuple& args, const py::kwargs& kwargs) {
  const OpEntry* e = find_op_entry(name);
  if (e == nullptr || !e->explain)
    throw py::value_error("baracuda_torch.explain: no explain for op '" + name + "'");
  torch::jit::Stack stack =
      torch::jit::createStackForSchema(e->schema, torch::jit::tuple_slice(args), kwargs, std::nullopt);
  return translate_errors([&] { return e->explain(stack, preference_or_current(preference)); });
}

// The declarations baracuda_torch/_autograd.py builds the torch.func rules from.
py::list op_table() {
  static const char* kinds[] = {"grad", "arg", "output", "sizes_of", "none"};
  static const char* autograd[] = {"none", "custom", "derivative", "not_differentiable"};
  py::list out;
  for (const OpEntry* e : op_entries()) {
    py::list sources;
    for (const GradSource& s : e->sources)
      sources.append(py::make_tuple(kinds[static_cast<int>(s.kind)], s.index));
    py::dict d;
    d["name"] = e->name;
    d["explain"] = static_cast<bool>(e->explain);
    d["autograd"] = autograd[static_cast<int>(e->autograd)];
    d["derivative"] = e->derivative;
    d["sources"] = sources;
    d["gradients"] = e->gradients;
    d["message"] = e->not_differentiable;
    d["vmap_rows"] = e->vmap_rows;
    d["vmap_dims"] = e->vmap_dims;
    out.append(d);
  }
  return out;
}
}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "baracuda_torch native extension: ops are under torch.ops.baracuda";
#ifdef BARACUDA_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
  // How many threads this library's at::parallel_for really runs on (a build without
  // the parallel backend's compiler flags silently runs one); tests compare it with
  // torch.get_num_threads().
  // Tests only: the CPU chunked SSD's products on its plain loops (false) or the BLAS.
  m.def("_ssd_cpu_blas", &kernels::ssd_chunk_scan_cpu_chunked_use_blas, py::arg("enabled"));
  // Tests only: the CPU chunked SSD backward's wave budget in bytes (<= 0: the default, 256
  // MiB), so that small problems run in several waves; returns the previous budget.
  m.def("_ssd_cpu_wave_bytes", &kernels::ssd_chunk_scan_cpu_chunked_wave_bytes, py::arg("bytes"));
  // Tests only: caps the shared memory a CUDA block may opt into as every plan sees it (to
  // plan for a 99 KB device on a larger one), 0 for the device's own; returns the previous cap.
  m.def("_cuda_smem_optin_cap", &set_smem_optin_cap, py::arg("bytes"));
  // Tests and benchmarks only: the SSD's CUDA forward, "auto" (the plan's choice),
  // "staged", "fused_mma", "fused_mma_cb" or "fused_wgmma" (each where it takes the
  // problem); returns the previous setting.
  static const std::pair<const char*, SsdCudaForward> kSsdCudaForward[] = {
      {"staged", SsdCudaForward::Staged},
      {"fused_mma", SsdCudaForward::FusedMma},
      {"fused_mma_cb", SsdCudaForward::FusedMmaCb},
      {"fused_wgmma", SsdCudaForward::FusedWgmma}};
  def_switch(m, "_ssd_cuda_forward", kSsdCudaForward, ssd_force_cuda_forward);
  // Tests and benchmarks only: the SSD's CUDA backward, "auto" (the plan's choice),
  // "staged" (the per-head dB/dC products), "group_mma" (the intra-chunk dB/dC products
  // once per group, wherever they can run, on mma.sync) or "group_wgmma" (the same with the
  // dC/dB kernel's products on wgmma where the device and build allow, as the plan runs
  // them on Hopper); returns the previous setting.
  m.def("_ssd_cuda_backward", [](const std::string& name) {
    std::optional<bool> group, wgmma;
    if (name == "staged") {
      group = false;
    } else if (name == "group_mma") {
      group = true, wgmma = false;
    } else if (name == "group_wgmma") {
      group = true, wgmma = true;
    } else if (name != "auto") {
      throw py::value_error("_ssd_cuda_backward: expected auto, staged, group_mma or group_wgmma, got " + name);
    }
    const std::optional<bool> previous = ssd_force_group_products(group);
    const std::optional<bool> previous_wgmma = ssd_force_group_wgmma(wgmma);
    if (!previous) return std::string("auto");
    if (!*previous) return std::string("staged");
    return std::string(previous_wgmma.value_or(false) ? "group_wgmma" : "group_mma");
  }, py::arg("name"));
  // Tests and benchmarks only: whether the SSD's CUDA backward with the group products runs
  // kernels on side streams (SsdChunkScanLaunch::side_stream), "auto" (the plan's choice:
  // wherever the group products run) or "off" (every kernel on the caller's stream);
  // returns the previous setting.
  static const std::pair<const char*, bool> kOff[] = {{"off", false}};
  static const std::pair<const char*, bool> kOffOn[] = {{"off", false}, {"on", true}};
  def_switch(m, "_ssd_cuda_backward_side_stream", kOff, ssd_force_backward_side_stream);
  // Tests and benchmarks only: whether the SSD's tensor-core chunk-state kernel runs its
  // products on wgmma (SsdChunkScanLaunch::state_wgmma), "auto" (the plan's choice: on
  // sm_90a with 128 state columns a block) or "off" (mma.sync everywhere); returns the
  // previous setting.
  def_switch(m, "_ssd_cuda_state_wgmma", kOff, ssd_force_state_wgmma);
  // Tests and benchmarks only: whether the SSD's group dx kernel runs P·dy on wgmma
  // (SsdChunkScanLaunch::dx_wgmma), "auto" (the plan's choice: on sm_90a with D), "off"
  // (mma.sync everywhere) or "on" (wgmma wherever the kernel can, D or not); returns the
  // previous setting.
  def_switch(m, "_ssd_cuda_dx_wgmma", kOffOn, ssd_force_dx_wgmma);
  // Tests and benchmarks only: whether the SSD backward's gate kernel runs by positions'
  // rows (SsdChunkScanLaunch::gate_rows), "auto" (the plan's choice: with z and dD's
  // partials from dx) or "off" (the segment kernel); returns the previous setting.
  def_switch(m, "_ssd_cuda_gate_rows", kOff, ssd_force_gate_rows);
  // Tests and benchmarks only: whether the SSD fused forward's two halves of a state tile
  // of 256 both take output rows (SsdChunkScanLaunch::fused_split_share), "auto" (the
  // plan's choice: with z), "off" (the first half's block takes them all) or "on" (shared,
  // z or not); returns the previous setting.
  def_switch(m, "_ssd_cuda_split_share", kOffOn, ssd_force_split_share);
  // Tests and benchmarks only: whether the SSD fused forward is launched as a programmatic
  // dependent of its C·Bᵀ table kernel (SsdChunkScanLaunch::fused_pdl), "auto" (the plan's
  // choice: FusedMmaCb on sm_90a) or "off" (after the table as any kernel); returns the
  // previous setting.
  def_switch(m, "_ssd_cuda_fused_pdl", kOff, ssd_force_fused_pdl);
  // Tests and benchmarks only: whether Mamba-2's decode step takes the state update's
  // whole-tiles kernel (StateUpdateLaunch::whole_tiles), "auto" (the plan's choice:
  // wherever it can), "on" (the same) or "off" (the generic lean kernel); returns the
  // previous setting.
  def_switch(m, "_state_update_whole_tiles", kOffOn, state_update_force_whole_tiles);
  // Tests and benchmarks only: the cos/sin RoPE's table reads on CUDA, "auto" (the plan's
  // rule), "any" (16-byte vectors wherever the table's runs are whole aligned vectors) or
  // "never"; returns the previous setting.
  static const std::pair<const char*, bool> kRopeCosSinTableVectors[] = {{"any", true}, {"never", false}};
  def_switch(m, "_rope_cos_sin_table_vectors", kRopeCosSinTableVectors, rope_cos_sin_force_table_vectors);
  // Tests and benchmarks only: whether the cos/sin RoPE's CUDA kernel walks its rows on
  // 32-bit offsets (RopeCosSinLaunch::walk32), "auto" (the plan's choice: wherever the
  // offsets fit) or "off" (the 64-bit kernel); returns the previous setting.
  def_switch(m, "_rope_cos_sin_walk32", kOff, rope_cos_sin_force_walk32);
  // Tests only: whether the plain RMSNorm backward may be staged on CUDA (the plan's choice
  // where it fits; False: never); returns the previous setting.
  m.def("_rms_norm_allow_stage", &rms_norm_allow_stage, py::arg("allow"));
  // Tests only: whether the build holds the architecture-specific kernels of compute
  // capability `arch` (sm_90a's wgmma kernels for 90).
  m.def("_arch_specific_kernels", [](int arch) {
#ifdef BARACUDA_WITH_CUDA
    return kernels::cuda_arch_specific_kernels(arch);
#else
    (void)arch;
    return false;
#endif
  }, py::arg("arch"));
  m.def("_parallel_for_threads", [] {
    std::vector<std::atomic<bool>> seen(at::get_num_threads());
    at::parallel_for(0, static_cast<int64_t>(seen.size()) * 64, 1, [&](int64_t, int64_t) {
      const int t = at::get_thread_num();
      if (t >= 0 && t < static_cast<int>(seen.size())) seen[t] = true;
    });
    int n = 0;
    for (const auto& s : seen) n += s ? 1 : 0;
    return n;
  });

  py::class_<PlanInfo>(m, "PlanInfo",
                       "The kernel a call would run and what it guarantees (see "
                       "baracuda_torch.explain).")
      .def_property_readonly("name", [](const PlanInfo& p) { return p.sku.name(); },
                             "Full SKU name: family.op/dtype/variant/backend")
      .def_property_readonly("family", [](const PlanInfo& p) { return p.sku.family; })
      .def_property_readonly("op", [](const PlanInfo& p) { return p.sku.op; })
      .def_property_readonly("dtype",
                             [](const PlanInfo& p) { return element_name(p.sku.element); })
      .def_property_readonly("index_dtype",
                             [](const PlanInfo& p) -> py::object {
                               if (!p.sku.index_element) return py::none();
                               return py::str(element_name(*p.sku.index_element));
                             })
      .def_property_readonly("variant", [](const PlanInfo& p) { return p.sku.variant; })
      .def_property_readonly("backend",
                             [](const PlanInfo& p) { return backend_name(p.sku.backend); })
      .def_property_readonly("arch", [](const PlanInfo& p) { return p.sku.arch; },
                             "SM version the CUDA kernel was chosen for (0 on the CPU)")
      .def_property_readonly("math_precision",
                             [](const PlanInfo& p) { return math_name(p.sku.precision.math); })
      .def_property_readonly(
          "accumulator", [](const PlanInfo& p) { return element_name(p.sku.precision.accumulator); })
      .def_property_readonly("deterministic",
                             [](const PlanInfo& p) { return p.sku.precision.deterministic; })
      .def_property_readonly(
          "bit_stable", [](const PlanInfo& p) { return p.sku.precision.bit_stable_on_same_hardware; })
      .def_property_readonly("workspace_bytes", [](const PlanInfo& p) { return p.workspace_bytes; })
      .def_property_readonly("preference",
                             [](const PlanInfo& p) { return preference_name(p.preference); })
      .def("__repr__", &plan_repr);

  m.def("get_preference", [] { return std::string(preference_name(library_preference())); });
  m.def("set_preference", [](const std::string& p) {
    translate_errors([&] { set_library_preference(parse_preference(p)); });
  });
  m.def("effective_preference",
        [] { return std::string(preference_name(current_preference())); });

  m.def("_op_table", &op_table,
        "Every op declared through OpDef (csrc/torch/op_def.h): its derivative and vmap "
        "declarations, for baracuda_torch/_autograd.py.");
  m.def("_explain",
        [](const std::string& name, const std::optional<std::string>& preference,
           const py::args& args, const py::kwargs& kwargs) {
          return explain_declared(name, preference, args, kwargs);
        },
        "explain of a declared op: _explain(name, preference, *args, **kwargs).");

  // ---- gather
  m.def("gather_check_errors", &gather_check_errors, py::arg("device"),
        "Raise IndexError for an out-of-range index a CUDA gather kernel recorded on `device` "
        "(no synchronization; baracuda_torch.check_errors synchronizes first).");
  m.def("set_index_checks", &set_index_checks, py::arg("mode"));
  m.def("get_index_checks", &get_index_checks);
}
