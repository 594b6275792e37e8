// CPU kernel of the cos/sin RoPE (forward and backward, q and k in one pass). Groups
// (b, s) are walked in parallel chunks; each group converts its table row once into
// rope_rows.h's coefficient arrays A and B (float32; float64 for float64 data),
//   forward:  y_u = c_u·u − s_u·v,   y_v = s_v·u + c_v·v
//   backward: y_u = c_u·u + s_v·v,   y_v = −s_u·u + c_v·v
// and applies them to every head of q and k at that (b, s) with rope_rows.h's kernels:
// AVX2 for rows of unit feature stride (either layout; float16/bfloat16 converted to
// float32 in registers), the scalar strided loop otherwise.
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/rope_rows.h"
#include "kernels/rope_cos_sin.h"

namespace baracuda::kernels {

namespace {
using cpu::acc_t;

template <typename T, typename C>
void fill_coeffs(const RopeCosSinLaunch& l, int64_t b, int64_t s, acc_t<T>* A, acc_t<T>* B) {
  using Acc = acc_t<T>;
  const int64_t half = l.R / 2;
  const C* cos = static_cast<const C*>(l.cos) + b * l.cos_strides[0] + s * l.cos_strides[1];
  const C* sin = static_cast<const C*>(l.sin) + b * l.sin_strides[0] + s * l.sin_strides[1];
  const int64_t cr = l.cos_strides[2], sr = l.sin_strides[2];
  for (int64_t p = 0; p < half; ++p) {
    int64_t fu, fv;
    cpu::rope_pair_features(p, half, l.interleaved, fu, fv);
    // Table entries of u and v: the features themselves, or the pair's one entry.
    const int64_t eu = l.full_table ? fu : p, ev = l.full_table ? fv : p;
    const Acc cu = static_cast<Acc>(cos[eu * cr]), su = static_cast<Acc>(sin[eu * sr]);
    const Acc cv = static_cast<Acc>(cos[ev * cr]), sv = static_cast<Acc>(sin[ev * sr]);
    A[fu] = cu;
    A[fv] = cv;
    B[fu] = l.backward ? sv : -su;
    B[fv] = l.backward ? -su : sv;
  }
}

template <typename T, typename C>
void run(const RopeCosSinLaunch& l) {
  using Acc = acc_t<T>;
  const int64_t ab = cpu::rope_table_stride(l.R);
  const int64_t heads = l.Hq + l.Hk;
  const int64_t grain = std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(1, heads * l.D));
  at::parallel_for(0, l.B * l.S, grain, [&](int64_t begin, int64_t end) {
    std::vector<Acc> A(ab, Acc(0)), B(ab, Acc(0));
    for (int64_t g = begin; g < end; ++g) {
      const int64_t b = g / l.S, s = g % l.S;
      fill_coeffs<T, C>(l, b, s, A.data(), B.data());
      for (const bool is_q : {true, false}) {
        const int64_t n = is_q ? l.Hq : l.Hk;
        if (n == 0) continue;  // no k (its pointers are null)
        const int64_t* xs = is_q ? l.q_strides : l.k_strides;
        const int64_t* ys = is_q ? l.yq_strides : l.yk_strides;
        const T* x = static_cast<const T*>(is_q ? l.q : l.k) + b * xs[0] + s * xs[2];
        T* y = static_cast<T*>(is_q ? l.yq : l.yk) + b * ys[0] + s * ys[2];
        cpu::rope_rows<T, Acc>(n, x, xs[1], xs[3], y, ys[1], ys[3], A.data(),
                               B.data(), 0, l.R, l.D, l.interleaved);
      }
    }
  });
}
}  // namespace

void rope_cos_sin_cpu(const RopeCosSinLaunch& l) {
  cpu::dispatch_floating(l.element, [&](auto tag) {
    using T = decltype(tag);
    if (l.table_element == l.element)
      run<T, T>(l);
    else if (l.table_element == ElementKind::F32)
      run<T, float>(l);
    else
      fail(PlanErrorKind::Internal, "rope_cos_sin", "cos/sin dtype is neither float32 nor x's");
  });
}

}  // namespace baracuda::kernels
