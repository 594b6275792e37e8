// CPU gated-activation kernels (both ops): the AVX2 kernels of gated_activation_avx2.cpp
// for the rows layout of float32/float16/bfloat16 on processors with AVX2; otherwise one
// scalar strided loop for every layout (the plan's coalesced index space makes
// contiguous inputs a unit-stride inner loop).
#include "kernels/gated_activation.h"
#include "kernels/gated_activation_math.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/loops.h"

namespace baracuda::kernels {

namespace {
using cpu::acc_t;

template <typename T, GatedKind K>
void forward(const GatedActivationLaunch& l) {
  using Acc = acc_t<T>;
  const T* x = static_cast<const T*>(l.x);
  const T* xa = static_cast<const T*>(l.a);
  T* y = static_cast<T*>(l.out);
  const int last = l.dims.rank - 1;
  const int ka = l.a_operand();
  const int64_t sx = l.dims.strides[0][last], sy = l.dims.strides[1][last],
                sa = l.dims.strides[ka][last];
  cpu::parallel_for_each_run<4>(l.dims, [&](const int64_t* off, int64_t n) {
    const T* a = xa + off[ka] + l.x_a_offset;
    const T* b = x + off[0] + l.x_b_offset;
    T* out = y + off[1];
    for (int64_t i = 0; i < n; ++i)
      out[i * sy] = T(gated_forward<K, false>(static_cast<Acc>(a[i * sa]), static_cast<Acc>(b[i * sx])));
  });
}

template <typename T, GatedKind K>
void backward(const GatedActivationLaunch& l) {
  using Acc = acc_t<T>;
  const T* x = static_cast<const T*>(l.x);
  const T* xa = static_cast<const T*>(l.a);
  const T* dy = static_cast<const T*>(l.dy);
  T* dx = static_cast<T*>(l.out);
  T* dxa = static_cast<T*>(l.out_a);
  const int last = l.dims.rank - 1;
  const int ka = l.a_operand();
  const int64_t sx = l.dims.strides[0][last], sdx = l.dims.strides[1][last],
                sdy = l.dims.strides[2][last], sa = l.dims.strides[ka][last];
  cpu::parallel_for_each_run<4>(l.dims, [&](const int64_t* off, int64_t n) {
    const T* a = xa + off[ka] + l.x_a_offset;
    const T* b = x + off[0] + l.x_b_offset;
    T* da = dxa + off[1] + l.out_a_offset;
    T* db = dx + off[1] + l.out_b_offset;
    const T* g = dy + off[2];
    for (int64_t i = 0; i < n; ++i) {
      Acc ga, gb;
      gated_backward<K, false>(static_cast<Acc>(g[i * sdy]), static_cast<Acc>(a[i * sa]),
                        static_cast<Acc>(b[i * sx]), ga, gb);
      da[i * sdx] = T(ga);
      db[i * sdx] = T(gb);
    }
  });
}

template <typename T>
void dispatch_kind(const GatedActivationLaunch& l) {
  auto go = [&](auto kind_tag) {
    constexpr GatedKind K = decltype(kind_tag)::value;
    if (l.backward)
      backward<T, K>(l);
    else
      forward<T, K>(l);
  };
  with_gated_kind(l.kind, go);
}
}  // namespace

void gated_activation_cpu(const GatedActivationLaunch& l) {
  if (cpu::cpu_has_avx2() && cpu::gated_activation_avx2(l)) return;
  cpu::dispatch_floating(l.element, [&](auto tag) { dispatch_kind<decltype(tag)>(l); });
}

}  // namespace baracuda::kernels
