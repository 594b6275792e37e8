// CPU selective state update (core/selective_state_update_plan.h has the formulas): any
// strides, every dtype (float32 math for float32/float16/bfloat16 x, float64 for float64).
// Parallel over the state rows (b, h, p); a row is loaded once into an Acc buffer, updated
// token by token, and written back once.
#include <string>
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/selective_state_update.h"
#include "kernels/selective_state_update_math.h"

namespace baracuda::kernels {

namespace {
using cpu::acc_t;

// An operand of x's dtype T or float32.
template <typename T, typename Acc>
struct Small {
  const void* p = nullptr;
  bool f32 = false;
  Small(const void* data, ElementKind e) : p(data), f32(e == ElementKind::F32) {}
  Acc operator[](int64_t off) const {
    return f32 ? Acc(static_cast<const float*>(p)[off]) : Acc(static_cast<const T*>(p)[off]);
  }
};

int64_t index_at(const StateUpdateLaunch& l, int64_t b) {
  return l.index_el == ElementKind::I32
             ? static_cast<const int32_t*>(l.indices)[b * l.index_s]
             : static_cast<const int64_t*>(l.indices)[b * l.index_s];
}

// IndexError for a pool index past the pool, before anything is written.
void check_indices(const StateUpdateLaunch& l) {
  if (!l.has_indices) return;
  for (int64_t b = 0; b < l.batch; ++b) {
    const int64_t i = index_at(l, b);
    if (i >= l.pool)
      fail(PlanErrorKind::IndexOutOfRange,
           l.tokens_op ? "selective_state_update_tokens" : "selective_state_update",
           "state_batch_indices[" + std::to_string(b) + "] = " + std::to_string(i) +
               " is out of range for a state pool of " + std::to_string(l.pool) +
               " rows (negative values mark padding rows)");
  }
}

template <typename T, typename S>
void update(const StateUpdateLaunch& l) {
  using Acc = acc_t<T>;
  S* state = static_cast<S*>(l.state);
  const T* x = static_cast<const T*>(l.x);
  const T* z = static_cast<const T*>(l.z);
  T* out = static_cast<T*>(l.out);
  const Small<T, Acc> dt(l.dt, l.dt_el), A(l.A, l.A_el), B(l.B, l.B_el), C(l.C, l.C_el),
      D(l.D, l.D_el), dt_bias(l.dt_bias, l.dt_bias_el);
  const int64_t P = l.headdim, H = l.nheads, N = l.dstate, rows = l.batch * H * P;
  at::parallel_for(0, rows, kStateUpdateCpuGrain, [&](int64_t begin, int64_t end) {
    std::vector<Acc> s(static_cast<size_t>(N));
    for (int64_t r = begin; r < end; ++r) {
      const int64_t p = r % P, h = r / P % H, b = r / P / H;
      const int64_t i = l.has_indices ? index_at(l, b) : b;
      const int64_t xo = b * l.x_s[0] + h * l.x_s[2] + p * l.x_s[3];
      const int64_t oo = b * l.out_s[0] + h * l.out_s[2] + p * l.out_s[3];
      if (i < 0) {  // a padding row: out = 0, the pool untouched
        for (int64_t t = 0; t < l.tokens; ++t) out[oo + t * l.out_s[1]] = static_cast<T>(Acc(0));
        continue;
      }
      const int64_t g = h / l.heads_per_group;
      S* row = state + i * l.state_s[0] + h * l.state_s[1] + p * l.state_s[2];
      for (int64_t n = 0; n < N; ++n) s[n] = static_cast<Acc>(row[n * l.state_s[3]]);
      const int64_t ao = h * l.A_s[0] + p * l.A_s[1];
      const Acc bias = l.has_dt_bias ? dt_bias[h * l.dt_bias_s[0] + p * l.dt_bias_s[1]] : Acc(0);
      const Acc d_skip = l.has_D ? D[h * l.D_s[0] + p * l.D_s[1]] : Acc(0);
      for (int64_t t = 0; t < l.tokens; ++t) {
        const Acc xv = static_cast<Acc>(x[xo + t * l.x_s[1]]);
        const Acc delta = state_update_delta(
            dt[b * l.dt_s[0] + t * l.dt_s[1] + h * l.dt_s[2] + p * l.dt_s[3]] + bias, l.dt_softplus);
        const Acc dtx = delta * xv;
        const int64_t bo = b * l.B_s[0] + t * l.B_s[1] + g * l.B_s[2];
        const int64_t co = b * l.C_s[0] + t * l.C_s[1] + g * l.C_s[2];
        Acc y = 0;
        if (l.A_per_row && N > 0) {
          const Acc dA = math_exp(A[ao] * delta);
          for (int64_t n = 0; n < N; ++n) {
            s[n] = s[n] * dA + B[bo + n * l.B_s[3]] * dtx;
            y += s[n] * C[co + n * l.C_s[3]];
          }
        } else {
          for (int64_t n = 0; n < N; ++n) {
            s[n] = s[n] * math_exp(A[ao + n * l.A_s[2]] * delta) + B[bo + n * l.B_s[3]] * dtx;
            y += s[n] * C[co + n * l.C_s[3]];
          }
        }
        if (l.has_D) y += d_skip * xv;
        if (l.has_z) y = state_update_gate(y, static_cast<Acc>(z[b * l.z_s[0] + t * l.z_s[1] +
                                                                 h * l.z_s[2] + p * l.z_s[3]]));
        out[oo + t * l.out_s[1]] = static_cast<T>(y);
      }
      for (int64_t n = 0; n < N; ++n) row[n * l.state_s[3]] = static_cast<S>(s[n]);
    }
  });
}
}  // namespace

void selective_state_update_cpu(const StateUpdateLaunch& l) {
  check_indices(l);
  cpu::dispatch_floating(l.x_el, [&](auto xt) {
    using T = decltype(xt);
    if (l.state_el == l.x_el)
      update<T, T>(l);
    else
      update<T, float>(l);  // the plan allows x's dtype or float32
  });
}

}  // namespace baracuda::kernels
