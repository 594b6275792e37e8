// CPU kernel of the cos/sin RoPE (forward and backward, q and k in one pass), on
// rope_rows.h's walk over blocks of positions (rows: the heads of q, then of k, of every
// batch; table groups are batches when the table has a batch stride). A position's table
// row is converted once per block into rope_rows.h's coefficient arrays A and B (float32;
// float64 for float64 data),
//   forward:  y_u = c_u·u − s_u·v,   y_v = s_v·u + c_v·v
//   backward: y_u = c_u·u + s_v·v,   y_v = −s_u·u + c_v·v
// and applied to every head with rope_rows.h's kernels: AVX2 for rows of unit feature
// stride (either layout; float16/bfloat16 converted to float32 in registers), the scalar
// strided loop otherwise.
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
  // Table groups: batches when the table differs between them, else one for all.
  const bool per_batch = l.B > 1 && (l.cos_strides[0] != 0 || l.sin_strides[0] != 0);
  const int64_t heads = l.Hq + l.Hk;
  cpu::rope_walk<Acc>(
      per_batch ? l.B : 1, l.S, per_batch ? heads : l.B * heads, l.R, l.D,
      [&](int64_t g, int64_t s, Acc* A, Acc* B) { fill_coeffs<T, C>(l, g, s, A, B); },
      [&](int64_t g, int64_t r, int64_t s0, int64_t n, const Acc* A, const Acc* B, int64_t ab) {
        const int64_t b = per_batch ? g : r / heads;
        const int64_t j = per_batch ? r : r % heads;  // q heads, then k heads
        const bool is_q = j < l.Hq;
        const int64_t h = is_q ? j : j - l.Hq;
        const int64_t* xs = is_q ? l.q_strides : l.k_strides;
        const int64_t* ys = is_q ? l.yq_strides : l.yk_strides;
        const T* x = static_cast<const T*>(is_q ? l.q : l.k);
        T* y = static_cast<T*>(is_q ? l.yq : l.yk);
        cpu::rope_rows<T, Acc>(n, x + b * xs[0] + h * xs[1] + s0 * xs[2], xs[2], xs[3],
                               y + b * ys[0] + h * ys[1] + s0 * ys[2], ys[2], ys[3], A, B, ab,
                               l.R, l.D, l.interleaved);
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
