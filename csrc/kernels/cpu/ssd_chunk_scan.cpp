// CPU SSD chunk scan: the exact sequential recurrence, in float64 for every dtype (the
// ground truth the CUDA kernels are tested against), with every option of the launch
// (kernels/ssd_chunk_scan.h): D, the z gate, dt_bias/softplus/limits, initial and final
// states, seq_idx resets. Any strides; outputs dense.
//
// Forward, per (b, h), with the D × N state in float64 (h_{-1} = initial_states or 0):
//   dt_t    = clamp(softplus?(dt_t + dt_bias), dt_min, dt_max)
//   decay_t = exp(dt_t A_h)     (0 where seq_idx changes at t: the state resets)
//   h_t     = decay_t h_{t-1} + (dt_t x_t) ⊗ B_t
//   y_t     = h_t C_t + D ∘ x_t;   with z: y_pre_t = y_t, out_t = y_t · silu(z_t)
//
// Backward, with dh = dL/dh_t carried backwards (dfinal_states after the last step):
//   dy_t     = dout_t · silu(z_t)  (dout_t without z);  dz_t = dout_t y_pre_t silu'(z_t)
//   dh      += dy_t ⊗ C_t
//   dC_t[n] += Σ_d dy_t[d] h_t[d, n]                 (summed over the group's heads)
//   dx_t[d]  = dt_t Σ_n dh[d, n] B_t[n] + D[d] dy_t[d]
//   dB_t[n] += dt_t Σ_d dh[d, n] x_t[d]               (summed over the group's heads)
//   s_t      = Σ_{d,n} dh[d, n] h_{t-1}[d, n]          (0 at a reset)
//   ddt_t    = (Σ_d x_t[d] Σ_n dh[d, n] B_t[n] + A decay_t s_t) · dt'(raw dt)
//   dA      += dt_t decay_t s_t;   dD += dy_t ∘ x_t;  ddt_bias += ddt_t
//   dh      *= decay_t                                (now dL/dh_{t-1}; 0 at a reset)
// and dinitial_states = dh after the first step.
// Memory stays O(B·H·⌈L/Q⌉·D·N): a first pass stores only the state entering each
// chunk (in the workspace); the reverse pass recomputes one chunk's states at a time
// from it (the same float64 operations, so the same bits as the forward's states).
// Every reduction runs in a fixed order: deterministic and independent of threads.
// The plan never launches a problem with an empty extent (B, L, H, D, N >= 1 here).
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/ssd_chunk_scan_common.h"

namespace baracuda::kernels {

namespace {

using ssd_cpu::Inputs;
using ssd_cpu::sigmoid;

// h = decay h + (dt x) ⊗ Bt (h = (dt x) ⊗ Bt at a reset), for a D × N row-major state.
// The forward and the backward's recomputation both call this, so their states agree
// bit for bit.
inline void recurrence_step(double* h, int64_t D, int64_t N, bool reset, double decay,
                            double dtv, const double* xt, const double* bt) {
  for (int64_t d = 0; d < D; ++d) {
    const double u = dtv * xt[d];
    double* row = h + d * N;
    if (reset)
      for (int64_t n = 0; n < N; ++n) row[n] = u * bt[n];
    else
      for (int64_t n = 0; n < N; ++n) row[n] = decay * row[n] + u * bt[n];
  }
}

template <typename T, typename DT, typename CT>
void forward(const SsdChunkScanLaunch& l) {
  const Inputs<T, DT, CT> in(l);
  const int64_t L = l.seqlen, H = l.heads, D = l.head_dim, N = l.state_dim;
  const int64_t heads_per_group = H / l.groups;
  T* y = static_cast<T*>(l.y);
  T* y_pre = static_cast<T*>(l.y_pre_out);
  CT* final_states = static_cast<CT*>(l.final_states);
  T* kept = static_cast<T*>(l.states);  // (keep_states: H_c, the state entering chunk c)
  const int64_t Q = l.chunk_size, nc = l.nchunks();
  at::parallel_for(0, l.batch * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> state(D * N), xt(D), bt(N), ct(N), zt(D), Dh(D);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H, g = h / heads_per_group;
      const double a = in.a(h);
      in.load_D(h, Dh.data());
      in.load_state(l.initial_states, l.init_stride, b, h, state.data());
      for (int64_t t = 0; t < L; ++t) {
        if (kept && t % Q == 0)  // (before step t's reset)
          for (int64_t i = 0; i < D * N; ++i) kept[(bh * nc + t / Q) * D * N + i] = static_cast<T>(state[i]);
        const double dtv = in.step(b, t, h);
        in.load_row(l.x, l.x_stride, b, t, h, xt.data());
        in.load_bc(l.B, l.B_stride, b, t, g, bt.data());
        in.load_bc(l.C, l.C_stride, b, t, g, ct.data());
        recurrence_step(state.data(), D, N, in.reset(b, t), std::exp(dtv * a), dtv, xt.data(),
                        bt.data());
        const int64_t o = ((b * L + t) * H + h) * D;
        if (l.z) in.load_row(l.z, l.z_stride, b, t, h, zt.data());
        for (int64_t d = 0; d < D; ++d) {
          const double* row = state.data() + d * N;
          double acc = 0.0;
          for (int64_t n = 0; n < N; ++n) acc += ct[n] * row[n];
          acc += Dh[d] * xt[d];
          if (l.z) {
            if (y_pre) y_pre[o + d] = static_cast<T>(acc);
            acc *= zt[d] * sigmoid(zt[d]);
          }
          y[o + d] = static_cast<T>(acc);
        }
      }
      if (final_states)
        for (int64_t i = 0; i < D * N; ++i) final_states[bh * D * N + i] = static_cast<CT>(state[i]);
    }
  });
}

// Workspace of the backward, all float64: the state entering each chunk
// [B, H, nc, D, N], then the per-(b, h) partial sums of dA [B, H], ddt_bias [B, H] and
// dD [B, H, D].
int64_t state_doubles(const SsdChunkScanLaunch& l) {
  return l.batch * l.heads * l.nchunks() * l.head_dim * l.state_dim;
}
int64_t partial_doubles(const SsdChunkScanLaunch& l) {
  return l.batch * l.heads * (2 + l.head_dim);
}

template <typename T, typename DT, typename CT>
void backward(const SsdChunkScanLaunch& l) {
  const Inputs<T, DT, CT> in(l);
  const int64_t L = l.seqlen, H = l.heads, D = l.head_dim, N = l.state_dim, G = l.groups;
  const int64_t Q = l.chunk_size, nc = l.nchunks(), DN = D * N;
  const int64_t heads_per_group = H / G;
  double* chunk_states = static_cast<double*>(l.workspace);
  double* dA_partial = chunk_states + state_doubles(l);
  double* dbias_partial = dA_partial + l.batch * H;
  double* dD_partial = dbias_partial + l.batch * H;

  // Pass 1, per (b, h): the recurrence, keeping the state entering each chunk.
  at::parallel_for(0, l.batch * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> state(DN), xt(D), bt(N);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H, g = h / heads_per_group;
      const double a = in.a(h);
      in.load_state(l.initial_states, l.init_stride, b, h, state.data());
      for (int64_t c = 0; c < nc; ++c) {
        std::copy(state.begin(), state.end(), chunk_states + (bh * nc + c) * DN);
        const int64_t t_end = std::min(L, (c + 1) * Q);
        for (int64_t t = c * Q; t < t_end; ++t) {
          const double dtv = in.step(b, t, h);
          in.load_row(l.x, l.x_stride, b, t, h, xt.data());
          in.load_bc(l.B, l.B_stride, b, t, g, bt.data());
          recurrence_step(state.data(), D, N, in.reset(b, t), std::exp(dtv * a), dtv,
                          xt.data(), bt.data());
        }
      }
    }
  });

  // Pass 2, per (b, g): chunks in reverse; inside a chunk the group's heads in order,
  // so that dB and dC sum over heads in a fixed order without atomics.
  T* dx = static_cast<T*>(l.dx);
  DT* ddt = static_cast<DT*>(l.ddt);
  T* dB = static_cast<T*>(l.dB);
  T* dC = static_cast<T*>(l.dC);
  T* dz = static_cast<T*>(l.dz);
  CT* dinit = static_cast<CT*>(l.dinitial_states);
  const int64_t Qmax = std::min(Q, L);
  at::parallel_for(0, l.batch * G, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> dh(heads_per_group * DN);        // dL/dh per head of the group
    std::vector<double> states((Qmax + 1) * DN);         // h_{t0-1} .. h_{t0+q-1}
    std::vector<double> Bc(Qmax * N), Cc(Qmax * N);      // the chunk's B and C
    std::vector<double> dB_acc(Qmax * N), dC_acc(Qmax * N);
    std::vector<double> dA_acc(heads_per_group), dbias_acc(heads_per_group);
    std::vector<double> dD_acc(heads_per_group * D);
    std::vector<double> xt(D), dyt(D), zt(D), ypt(D), Dh(D), sum_n(D), sum_d(N);
    for (int64_t bg = begin; bg < end; ++bg) {
      const int64_t b = bg / G, g = bg % G;
      for (int64_t hl = 0; hl < heads_per_group; ++hl)
        in.load_state(l.dfinal_states, l.dfinal_stride, b, g * heads_per_group + hl,
                      dh.data() + hl * DN);
      std::fill(dA_acc.begin(), dA_acc.end(), 0.0);
      std::fill(dbias_acc.begin(), dbias_acc.end(), 0.0);
      std::fill(dD_acc.begin(), dD_acc.end(), 0.0);
      for (int64_t c = nc - 1; c >= 0; --c) {
        const int64_t t0 = c * Q, q = std::min(Q, L - t0);
        for (int64_t j = 0; j < q; ++j) {
          in.load_bc(l.B, l.B_stride, b, t0 + j, g, Bc.data() + j * N);
          in.load_bc(l.C, l.C_stride, b, t0 + j, g, Cc.data() + j * N);
        }
        std::fill(dB_acc.begin(), dB_acc.begin() + q * N, 0.0);
        std::fill(dC_acc.begin(), dC_acc.begin() + q * N, 0.0);
        for (int64_t hl = 0; hl < heads_per_group; ++hl) {
          const int64_t h = g * heads_per_group + hl;
          const double a = in.a(h);
          in.load_D(h, Dh.data());
          // Recompute the chunk's states from the stored one.
          const double* entry = chunk_states + ((b * H + h) * nc + c) * DN;
          std::copy(entry, entry + DN, states.begin());
          for (int64_t j = 0; j < q; ++j) {
            const double dtv = in.step(b, t0 + j, h);
            in.load_row(l.x, l.x_stride, b, t0 + j, h, xt.data());
            double* next = states.data() + (j + 1) * DN;
            std::copy(next - DN, next, next);
            recurrence_step(next, D, N, in.reset(b, t0 + j), std::exp(dtv * a), dtv, xt.data(),
                            Bc.data() + j * N);
          }
          double* G_ = dh.data() + hl * DN;
          double* dDh = dD_acc.data() + hl * D;
          for (int64_t j = q - 1; j >= 0; --j) {
            const int64_t t = t0 + j;
            double slope = 1.0;
            const double dtv = in.step(b, t, h, &slope);
            const bool reset = in.reset(b, t);
            const double decay = std::exp(dtv * a);
            in.load_row(l.x, l.x_stride, b, t, h, xt.data());
            in.load_row(l.dy, l.dy_stride, b, t, h, dyt.data());
            const int64_t o = ((b * L + t) * H + h) * D;
            if (l.z) {
              // dy (the gradient of y_pre) = dout · silu(z); dz = dout · y_pre · silu'(z).
              in.load_row(l.z, l.z_stride, b, t, h, zt.data());
              in.load_row(l.y_pre, l.y_pre_stride, b, t, h, ypt.data());
              for (int64_t d = 0; d < D; ++d) {
                const double sg = sigmoid(zt[d]);
                dz[o + d] = static_cast<T>(dyt[d] * ypt[d] * sg * (1.0 + zt[d] * (1.0 - sg)));
                dyt[d] *= zt[d] * sg;
              }
            }
            for (int64_t d = 0; d < D; ++d) dDh[d] += dyt[d] * xt[d];
            const double* bt = Bc.data() + j * N;
            const double* ct = Cc.data() + j * N;
            const double* h_t = states.data() + (j + 1) * DN;
            const double* h_prev = states.data() + j * DN;
            // dh += dy ⊗ C; then the sums over n (per d) and over d (per n) of dh.
            std::fill(sum_d.begin(), sum_d.end(), 0.0);
            double s = 0.0;
            for (int64_t d = 0; d < D; ++d) {
              double* row = G_ + d * N;
              const double* hp = h_prev + d * N;
              double acc = 0.0;
              for (int64_t n = 0; n < N; ++n) {
                row[n] += dyt[d] * ct[n];
                acc += row[n] * bt[n];
                sum_d[n] += row[n] * xt[d];
                if (!reset) s += row[n] * hp[n];
              }
              sum_n[d] = acc;
            }
            // dC_t[n] += Σ_d dy[d] h_t[d, n]
            double* dc = dC_acc.data() + j * N;
            for (int64_t d = 0; d < D; ++d) {
              const double* row = h_t + d * N;
              for (int64_t n = 0; n < N; ++n) dc[n] += dyt[d] * row[n];
            }
            double* db = dB_acc.data() + j * N;
            for (int64_t n = 0; n < N; ++n) db[n] += dtv * sum_d[n];
            double ddt_t = 0.0;
            for (int64_t d = 0; d < D; ++d) {
              dx[o + d] = static_cast<T>(dtv * sum_n[d] + Dh[d] * dyt[d]);
              ddt_t += xt[d] * sum_n[d];
            }
            ddt_t += a * decay * s;
            ddt_t *= slope;
            ddt[(b * L + t) * H + h] = static_cast<DT>(ddt_t);
            dbias_acc[hl] += ddt_t;
            dA_acc[hl] += dtv * decay * s;
            if (reset)
              std::fill(G_, G_ + DN, 0.0);
            else
              for (int64_t i = 0; i < DN; ++i) G_[i] *= decay;
          }
        }
        for (int64_t j = 0; j < q; ++j) {
          T* dbt = dB + ((b * L + t0 + j) * G + g) * N;
          T* dct = dC + ((b * L + t0 + j) * G + g) * N;
          for (int64_t n = 0; n < N; ++n) {
            dbt[n] = static_cast<T>(dB_acc[j * N + n]);
            dct[n] = static_cast<T>(dC_acc[j * N + n]);
          }
        }
      }
      for (int64_t hl = 0; hl < heads_per_group; ++hl) {
        const int64_t bh = b * H + g * heads_per_group + hl;
        dA_partial[bh] = dA_acc[hl];
        dbias_partial[bh] = dbias_acc[hl];
        std::copy(dD_acc.begin() + hl * D, dD_acc.begin() + (hl + 1) * D, dD_partial + bh * D);
        if (dinit)
          for (int64_t i = 0; i < DN; ++i)
            dinit[bh * DN + i] = static_cast<CT>(dh[hl * DN + i]);
      }
    }
  });

  ssd_cpu::reduce_partials<CT>(l, dA_partial, dbias_partial, dD_partial);
}

}  // namespace

size_t ssd_chunk_scan_cpu_forward_workspace(const SsdChunkScanLaunch&) { return 0; }

size_t ssd_chunk_scan_cpu_backward_workspace(const SsdChunkScanLaunch& l) {
  return static_cast<size_t>(state_doubles(l) + partial_doubles(l)) * sizeof(double);
}

void ssd_chunk_scan_cpu_forward(const SsdChunkScanLaunch& l) {
  ssd_cpu::dispatch(l, [&](auto t, auto dt, auto ct) {
    forward<decltype(t), decltype(dt), decltype(ct)>(l);
  });
}

void ssd_chunk_scan_cpu_backward(const SsdChunkScanLaunch& l) {
  ssd_cpu::dispatch(l, [&](auto t, auto dt, auto ct) {
    backward<decltype(t), decltype(dt), decltype(ct)>(l);
  });
}

}  // namespace baracuda::kernels
