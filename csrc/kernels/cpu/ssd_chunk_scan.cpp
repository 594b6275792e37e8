// CPU SSD chunk scan: the exact sequential recurrence, in float64 for every dtype (the
// ground truth the CUDA kernels are tested against). Any strides; outputs dense.
//
// Forward, per (b, h), with the D × N state in float64:
//   decay_t = exp(dt_t A_h),  h_t = decay_t h_{t-1} + (dt_t x_t) ⊗ B_t,  y_t = h_t C_t.
//
// Backward, with dh = dL/dh_t carried backwards (zero after the last step):
//   dh      += dy_t ⊗ C_t
//   dC_t[n] += Σ_d dy_t[d] h_t[d, n]                 (summed over the group's heads)
//   dx_t[d]  = dt_t Σ_n dh[d, n] B_t[n]
//   dB_t[n] += dt_t Σ_d dh[d, n] x_t[d]               (summed over the group's heads)
//   s_t      = Σ_{d,n} dh[d, n] h_{t-1}[d, n]
//   ddt_t    = Σ_d x_t[d] Σ_n dh[d, n] B_t[n] + A decay_t s_t
//   dA      += dt_t decay_t s_t                       (summed over b and t)
//   dh      *= decay_t                                (now dL/dh_{t-1})
// Memory stays O(B·H·⌈L/Q⌉·D·N): a first pass stores only the state entering each
// chunk (in the workspace); the reverse pass recomputes one chunk's states at a time
// from it (the same float64 operations, so the same bits as the forward's states).
// Every reduction runs in a fixed order: deterministic and independent of threads.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/ssd_chunk_scan.h"

namespace baracuda::kernels {

namespace {

// Strided reads of the inputs (element strides from the launch).
template <typename T>
struct Inputs {
  const T* x;
  const T* dt;
  const T* A;
  const T* B;
  const T* C;
  const T* dy;
  const SsdChunkScanLaunch& l;

  explicit Inputs(const SsdChunkScanLaunch& launch)
      : x(static_cast<const T*>(launch.x)),
        dt(static_cast<const T*>(launch.dt)),
        A(static_cast<const T*>(launch.A)),
        B(static_cast<const T*>(launch.B)),
        C(static_cast<const T*>(launch.C)),
        dy(static_cast<const T*>(launch.dy)),
        l(launch) {}

  double a(int64_t h) const { return static_cast<double>(A[h * l.A_stride]); }
  double step(int64_t b, int64_t t, int64_t h) const {
    return static_cast<double>(dt[b * l.dt_stride[0] + t * l.dt_stride[1] + h * l.dt_stride[2]]);
  }
  // out[d] = x[b, t, h, d]
  void load_x(int64_t b, int64_t t, int64_t h, double* out) const {
    const T* p = x + b * l.x_stride[0] + t * l.x_stride[1] + h * l.x_stride[2];
    for (int64_t d = 0; d < l.head_dim; ++d) out[d] = static_cast<double>(p[d * l.x_stride[3]]);
  }
  void load_dy(int64_t b, int64_t t, int64_t h, double* out) const {
    const T* p = dy + b * l.dy_stride[0] + t * l.dy_stride[1] + h * l.dy_stride[2];
    for (int64_t d = 0; d < l.head_dim; ++d) out[d] = static_cast<double>(p[d * l.dy_stride[3]]);
  }
  // out[n] = B[b, t, g, n] (or C)
  void load_B(int64_t b, int64_t t, int64_t g, double* out) const {
    const T* p = B + b * l.B_stride[0] + t * l.B_stride[1] + g * l.B_stride[2];
    for (int64_t n = 0; n < l.state_dim; ++n) out[n] = static_cast<double>(p[n * l.B_stride[3]]);
  }
  void load_C(int64_t b, int64_t t, int64_t g, double* out) const {
    const T* p = C + b * l.C_stride[0] + t * l.C_stride[1] + g * l.C_stride[2];
    for (int64_t n = 0; n < l.state_dim; ++n) out[n] = static_cast<double>(p[n * l.C_stride[3]]);
  }
};

// h = decay h + (dt x) ⊗ Bt, for a D × N row-major state. The forward and the
// backward's recomputation both call this, so their states agree bit for bit.
inline void recurrence_step(double* h, int64_t D, int64_t N, double decay, double dtv,
                            const double* xt, const double* bt) {
  for (int64_t d = 0; d < D; ++d) {
    const double u = dtv * xt[d];
    double* row = h + d * N;
    for (int64_t n = 0; n < N; ++n) row[n] = decay * row[n] + u * bt[n];
  }
}

template <typename T>
void forward(const SsdChunkScanLaunch& l) {
  const Inputs<T> in(l);
  const int64_t L = l.seqlen, H = l.heads, D = l.head_dim, N = l.state_dim;
  const int64_t heads_per_group = H / l.groups;
  T* y = static_cast<T*>(l.y);
  at::parallel_for(0, l.batch * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> state(D * N), xt(D), bt(N), ct(N);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H, g = h / heads_per_group;
      const double a = in.a(h);
      std::fill(state.begin(), state.end(), 0.0);
      for (int64_t t = 0; t < L; ++t) {
        const double dtv = in.step(b, t, h);
        in.load_x(b, t, h, xt.data());
        in.load_B(b, t, g, bt.data());
        in.load_C(b, t, g, ct.data());
        recurrence_step(state.data(), D, N, std::exp(dtv * a), dtv, xt.data(), bt.data());
        T* yt = y + ((b * L + t) * H + h) * D;
        for (int64_t d = 0; d < D; ++d) {
          const double* row = state.data() + d * N;
          double acc = 0.0;
          for (int64_t n = 0; n < N; ++n) acc += ct[n] * row[n];
          yt[d] = static_cast<T>(acc);
        }
      }
    }
  });
}

// Workspace of the backward: the state entering each chunk, [B, H, nc, D, N], then the
// per-(b, h) partial sums of dA, [B, H]; all float64.
int64_t state_doubles(const SsdChunkScanLaunch& l) {
  return l.batch * l.heads * l.nchunks() * l.head_dim * l.state_dim;
}

template <typename T>
void backward(const SsdChunkScanLaunch& l) {
  const Inputs<T> in(l);
  const int64_t L = l.seqlen, H = l.heads, D = l.head_dim, N = l.state_dim, G = l.groups;
  const int64_t Q = l.chunk_size, nc = l.nchunks(), DN = D * N;
  const int64_t heads_per_group = H / G;
  double* chunk_states = static_cast<double*>(l.workspace);
  double* dA_partial = chunk_states + state_doubles(l);

  // Pass 1, per (b, h): the recurrence, keeping the state entering each chunk.
  at::parallel_for(0, l.batch * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> state(DN), xt(D), bt(N);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H, g = h / heads_per_group;
      const double a = in.a(h);
      std::fill(state.begin(), state.end(), 0.0);
      for (int64_t c = 0; c < nc; ++c) {
        std::copy(state.begin(), state.end(), chunk_states + (bh * nc + c) * DN);
        const int64_t t_end = std::min(L, (c + 1) * Q);
        for (int64_t t = c * Q; t < t_end; ++t) {
          const double dtv = in.step(b, t, h);
          in.load_x(b, t, h, xt.data());
          in.load_B(b, t, g, bt.data());
          recurrence_step(state.data(), D, N, std::exp(dtv * a), dtv, xt.data(), bt.data());
        }
      }
    }
  });

  // Pass 2, per (b, g): chunks in reverse; inside a chunk the group's heads in order,
  // so that dB and dC sum over heads in a fixed order without atomics.
  T* dx = static_cast<T*>(l.dx);
  T* ddt = static_cast<T*>(l.ddt);
  T* dB = static_cast<T*>(l.dB);
  T* dC = static_cast<T*>(l.dC);
  const int64_t Qmax = std::min(Q, L);
  at::parallel_for(0, l.batch * G, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> dh(heads_per_group * DN);        // dL/dh per head of the group
    std::vector<double> states((Qmax + 1) * DN);         // h_{t0-1} .. h_{t0+q-1}
    std::vector<double> Bc(Qmax * N), Cc(Qmax * N);      // the chunk's B and C
    std::vector<double> dB_acc(Qmax * N), dC_acc(Qmax * N);
    std::vector<double> dA_acc(heads_per_group);
    std::vector<double> xt(D), dyt(D), sum_n(D), sum_d(N);
    for (int64_t bg = begin; bg < end; ++bg) {
      const int64_t b = bg / G, g = bg % G;
      std::fill(dh.begin(), dh.end(), 0.0);
      std::fill(dA_acc.begin(), dA_acc.end(), 0.0);
      for (int64_t c = nc - 1; c >= 0; --c) {
        const int64_t t0 = c * Q, q = std::min(Q, L - t0);
        for (int64_t j = 0; j < q; ++j) {
          in.load_B(b, t0 + j, g, Bc.data() + j * N);
          in.load_C(b, t0 + j, g, Cc.data() + j * N);
        }
        std::fill(dB_acc.begin(), dB_acc.begin() + q * N, 0.0);
        std::fill(dC_acc.begin(), dC_acc.begin() + q * N, 0.0);
        for (int64_t hl = 0; hl < heads_per_group; ++hl) {
          const int64_t h = g * heads_per_group + hl;
          const double a = in.a(h);
          // Recompute the chunk's states from the stored one.
          const double* entry = chunk_states + ((b * H + h) * nc + c) * DN;
          std::copy(entry, entry + DN, states.begin());
          for (int64_t j = 0; j < q; ++j) {
            const double dtv = in.step(b, t0 + j, h);
            in.load_x(b, t0 + j, h, xt.data());
            double* next = states.data() + (j + 1) * DN;
            std::copy(next - DN, next, next);
            recurrence_step(next, D, N, std::exp(dtv * a), dtv, xt.data(), Bc.data() + j * N);
          }
          double* G_ = dh.data() + hl * DN;
          for (int64_t j = q - 1; j >= 0; --j) {
            const int64_t t = t0 + j;
            const double dtv = in.step(b, t, h);
            const double decay = std::exp(dtv * a);
            in.load_x(b, t, h, xt.data());
            in.load_dy(b, t, h, dyt.data());
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
                s += row[n] * hp[n];
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
            T* dxt = dx + ((b * L + t) * H + h) * D;
            for (int64_t d = 0; d < D; ++d) {
              dxt[d] = static_cast<T>(dtv * sum_n[d]);
              ddt_t += xt[d] * sum_n[d];
            }
            ddt_t += a * decay * s;
            ddt[(b * L + t) * H + h] = static_cast<T>(ddt_t);
            dA_acc[hl] += dtv * decay * s;
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
      for (int64_t hl = 0; hl < heads_per_group; ++hl)
        dA_partial[b * H + g * heads_per_group + hl] = dA_acc[hl];
    }
  });

  // dA[h] = Σ_b partial[b, h], in order of b (zero for an empty batch).
  T* dA = static_cast<T*>(l.dA);
  for (int64_t h = 0; h < H; ++h) {
    double acc = 0.0;
    for (int64_t b = 0; b < l.batch; ++b) acc += dA_partial[b * H + h];
    dA[h] = static_cast<T>(acc);
  }
}

}  // namespace

size_t ssd_chunk_scan_cpu_forward_workspace(const SsdChunkScanLaunch&) { return 0; }

size_t ssd_chunk_scan_cpu_backward_workspace(const SsdChunkScanLaunch& l) {
  return static_cast<size_t>(state_doubles(l) + l.batch * l.heads) * sizeof(double);
}

void ssd_chunk_scan_cpu_forward(const SsdChunkScanLaunch& l) {
  cpu::dispatch_floating(l.element, [&](auto tag) { forward<decltype(tag)>(l); });
}

void ssd_chunk_scan_cpu_backward(const SsdChunkScanLaunch& l) {
  cpu::dispatch_floating(l.element, [&](auto tag) { backward<decltype(tag)>(l); });
}

}  // namespace baracuda::kernels
