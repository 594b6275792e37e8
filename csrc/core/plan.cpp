#include "core/plan.h"

#include <algorithm>
#include <utility>

namespace baracuda {

const char* element_name(ElementKind e) {
  switch (e) {
    case ElementKind::F32: return "float32";
    case ElementKind::F16: return "float16";
    case ElementKind::BF16: return "bfloat16";
    case ElementKind::F64: return "float64";
    case ElementKind::I32: return "int32";
    case ElementKind::I64: return "int64";
  }
  return "?";
}

int element_size(ElementKind e) {
  switch (e) {
    case ElementKind::F16:
    case ElementKind::BF16: return 2;
    case ElementKind::F32:
    case ElementKind::I32: return 4;
    case ElementKind::F64:
    case ElementKind::I64: return 8;
  }
  return 0;
}

const char* backend_name(Backend b) { return b == Backend::Cuda ? "cuda" : "cpu"; }

const char* preference_name(PlanPreference p) {
  switch (p) {
    case PlanPreference::Deterministic: return "deterministic";
    case PlanPreference::Precise: return "precise";
    case PlanPreference::Fastest: break;
  }
  return "fastest";
}

std::string KernelSku::name() const {
  std::string s = family + "." + op + "/" + element_name(element);
  if (index_element) s += std::string("+") + element_name(*index_element);
  s += "/" + variant + "/" + backend_name(backend);
  if (backend == Backend::Cuda) s += "_sm" + std::to_string(arch);
  return s;
}

KernelSku kernel_sku(std::string family, std::string op, ElementKind element,
                     std::string variant, const DeviceInfo& device, bool fixed_order) {
  KernelSku sku;
  sku.family = std::move(family);
  sku.op = std::move(op);
  sku.element = element;
  sku.variant = std::move(variant);
  sku.backend = device.backend;
  sku.arch = device.arch;
  const bool f64 = element == ElementKind::F64;
  sku.precision = {f64 ? MathPrecision::F64 : MathPrecision::F32,
                   f64 ? ElementKind::F64 : ElementKind::F32, fixed_order, fixed_order};
  return sku;
}

void fail(PlanErrorKind kind, const std::string& op, const std::string& rule) {
  throw PlanError(kind, "baracuda::" + op + ": " + rule);
}

void fail_no_cuda_kernels(const std::string& op) {
  fail(PlanErrorKind::Unsupported, op, "this build of baracuda_torch has no CUDA kernels");
}

int64_t TensorLayout::numel() const {
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= sizes[d];
  return n;
}

bool TensorLayout::is_contiguous() const {
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (sizes[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

int64_t TensorLayout::max_offset() const {
  int64_t off = 0;
  for (int d = 0; d < rank; ++d) {
    if (sizes[d] == 0) return 0;
    off += (sizes[d] - 1) * strides[d];
  }
  return off;
}

namespace {
// t's dims by increasing stride, size-0 and size-1 dims last (insertion sort: rank <= 8).
void stride_order(const TensorLayout& t, int (&perm)[kMaxRank]) {
  const auto before = [&](int a, int b) {
    if (t.sizes[a] < 2) return false;
    if (t.sizes[b] < 2) return true;
    return t.strides[a] < t.strides[b];
  };
  for (int i = 0; i < t.rank; ++i) {
    int j = i;
    for (; j > 0 && before(i, perm[j - 1]); --j) perm[j] = perm[j - 1];
    perm[j] = i;
  }
}
}  // namespace

bool TensorLayout::is_non_overlapping_and_dense() const {
  if (is_contiguous()) return true;  // includes every empty tensor, as in torch
  if (rank == 1) return sizes[0] < 2 || strides[0] == 1;
  int perm[kMaxRank];
  stride_order(*this, perm);
  int64_t required = 1;
  for (int i = 0; i < rank; ++i) {
    const int d = perm[i];
    if (sizes[d] < 2) return true;
    if (strides[d] != required) return false;
    required *= sizes[d];
  }
  return true;
}

bool TensorLayout::is_non_overlapping() const {
  if (numel() == 0) return true;
  int perm[kMaxRank];
  stride_order(*this, perm);
  int64_t reach = 0;  // the farthest element offset of the dims so far
  for (int i = 0; i < rank; ++i) {
    const int d = perm[i];
    if (sizes[d] < 2) return true;
    if (strides[d] <= reach) return false;
    reach += (sizes[d] - 1) * strides[d];
  }
  return true;
}

namespace {
std::string layout_sizes(const TensorLayout& t) { return sizes_str(t.sizes.data(), t.rank); }
}  // namespace

void check_rank(const std::string& op, const char* what, int rank) {
  if (rank > kMaxRank)
    fail(PlanErrorKind::Unsupported, op,
         std::string(what) + " has " + std::to_string(rank) + " dims, at most " +
             std::to_string(kMaxRank) + " are supported");
}

int normalize_dim(const std::string& op, const char* what, int64_t dim, int rank) {
  if (dim < -rank || dim >= rank)
    fail(PlanErrorKind::IndexOutOfRange, op,
         std::string(what) + " must be in [" + std::to_string(-rank) + ", " +
             std::to_string(rank - 1) + "] for a " + std::to_string(rank) + "-d tensor, got " +
             std::to_string(dim));
  return static_cast<int>(dim < 0 ? dim + rank : dim);
}

void check_same_layout(const std::string& op, const char* what, const TensorLayout& expected,
                       const TensorLayout& got) {
  bool same = expected.dtype == got.dtype && expected.rank == got.rank;
  for (int d = 0; same && d < expected.rank; ++d)
    same = expected.sizes[d] == got.sizes[d] && expected.strides[d] == got.strides[d];
  if (!same)
    fail(PlanErrorKind::Internal, op,
         std::string(what) + " does not match the layout the plan was selected for (got sizes " +
             layout_sizes(got) + ", expected " + layout_sizes(expected) + ")");
  if (got.alignment < expected.alignment)
    fail(PlanErrorKind::Internal, op,
         std::string(what) + " is less aligned than the plan was selected for");
}

void check_output(const std::string& op, const char* what, const TensorLayout& expected,
                  const MutTensorRef& out) {
  check_same_layout(op, what, expected, out.layout);
  if (out.data == nullptr && out.layout.numel() > 0)
    fail(PlanErrorKind::Internal, op, std::string(what) + " has no data");
}

void check_workspace(const std::string& op, size_t needed, const Workspace& ws) {
  if (ws.bytes < needed || (needed > 0 && ws.data == nullptr))
    fail(PlanErrorKind::Internal, op,
         "workspace too small: need " + std::to_string(needed) + " bytes, got " +
             std::to_string(ws.bytes));
}

std::array<int64_t, kMaxRank> contiguous_strides(const std::array<int64_t, kMaxRank>& sizes,
                                                 int rank) {
  std::array<int64_t, kMaxRank> st{};
  int64_t s = 1;
  for (int d = rank - 1; d >= 0; --d) {
    st[d] = s;
    s *= std::max<int64_t>(sizes[d], 1);
  }
  return st;
}

TensorLayout dense_output_layout(ElementKind dtype, int rank, const int64_t* sizes) {
  TensorLayout t;
  t.dtype = dtype;
  t.rank = rank;
  for (int d = 0; d < rank; ++d) t.sizes[d] = sizes[d];
  t.strides = contiguous_strides(t.sizes, rank);
  t.alignment = 16;
  return t;
}

TensorLayout dense_output_layout(const TensorLayout& like) {
  return dense_output_layout(like.dtype, like.rank, like.sizes.data());
}

TensorLayout output_layout_like(const TensorLayout& like) {
  TensorLayout t = like.is_non_overlapping_and_dense() ? like : dense_output_layout(like);
  t.alignment = 16;
  return t;
}

TensorLayout empty_like_layout(const TensorLayout& like) {
  if (like.is_non_overlapping_and_dense()) return output_layout_like(like);
  // Dims from the innermost out: a stable insertion sort by increasing stride, starting
  // from the row-major order; a stride-0 dim keeps its place, and of two equal strides
  // the dim of the smaller size goes first (torch's rule, as its TensorIterator orders).
  const int n = like.rank;
  int perm[kMaxRank];
  for (int i = 0; i < n; ++i) perm[i] = n - 1 - i;
  const auto after = [&](int a, int b) {  // whether dim a goes after dim b
    const int64_t sa = like.strides[a], sb = like.strides[b];
    if (sa == 0 || sb == 0) return false;
    return sa > sb || (sa == sb && like.sizes[a] > like.sizes[b]);
  };
  const auto before = [&](int a, int b) {
    const int64_t sa = like.strides[a], sb = like.strides[b];
    return sa != 0 && sb != 0 && sa < sb;
  };
  for (int i = 1; i < n; ++i) {
    int at = i;
    for (int j = i - 1; j >= 0; --j) {
      if (after(perm[j], perm[at])) {
        std::swap(perm[j], perm[at]);
        at = j;
      } else if (before(perm[j], perm[at])) {
        break;
      }
    }
  }
  TensorLayout t = like;
  int64_t stride = 1;
  for (int i = 0; i < n; ++i) {
    t.strides[perm[i]] = stride;
    if (like.sizes[perm[i]] > 1) stride *= like.sizes[perm[i]];
  }
  t.alignment = 16;
  return t;
}

CoalescedDims coalesce_dims(int rank, const std::array<int64_t, kMaxRank>& sizes,
                            const std::array<int64_t, kMaxRank>* const* operand_strides,
                            int num_operands) {
  CoalescedDims out;
  // Walk from the innermost dim outwards, keeping the current (outermost kept) dim open
  // for merging with the next one out.
  std::array<int64_t, kMaxRank> rsizes{};
  std::array<std::array<int64_t, kMaxRank>, kMaxOperands> rstrides{};
  int n = 0;
  for (int d = rank - 1; d >= 0; --d) {
    if (sizes[d] == 1) continue;
    if (n > 0) {
      bool linear = true;
      for (int k = 0; k < num_operands && linear; ++k)
        linear = (*operand_strides[k])[d] == rstrides[k][n - 1] * rsizes[n - 1];
      if (linear) {
        rsizes[n - 1] *= sizes[d];
        continue;
      }
    }
    rsizes[n] = sizes[d];
    for (int k = 0; k < num_operands; ++k) rstrides[k][n] = (*operand_strides[k])[d];
    ++n;
  }
  if (n == 0) {  // every dim had size 1
    rsizes[0] = 1;
    for (int k = 0; k < num_operands; ++k) rstrides[k][0] = 1;
    n = 1;
  }
  out.rank = n;
  for (int i = 0; i < n; ++i) {
    out.sizes[i] = rsizes[n - 1 - i];
    for (int k = 0; k < num_operands; ++k) out.strides[k][i] = rstrides[k][n - 1 - i];
  }
  return out;
}

}  // namespace baracuda
