// CPU causal conv1d, forward and backward (core/causal_conv1d_plan.h has the formulas):
// any strides, every dtype (float32 math for float32/float16/bfloat16, its SiLU on AVX2
// registers where the processor has them; float64 for float64), any width. Parallel over
// tasks of (batch, kCausalConv1dCpuChannels channels, kCausalConv1dCpuChunk time steps); a task walks its steps in order and keeps, per
// channel, the last W inputs (and, backward, the last W gradients g) in a ring of rows,
// converted once, so that the inner loops run over contiguous channels. The backward
// writes each task's dweight/dbias sums to its (batch, chunk) row of the workspace, then
// sums the rows in order per channel: the same bits for any thread count.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels/causal_conv1d.h"
#include "kernels/causal_conv1d_math.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/loops.h"

namespace baracuda::kernels {

namespace {
using cpu::acc_t;

// v[i] = silu(v[i]) for i < n: on AVX2 registers for float32 math where they run.
template <typename Acc>
void silu_row(Acc* v, int64_t n) {
  if constexpr (std::is_same_v<Acc, float>) {
    if (cpu::cpu_has_avx2() && cpu::conv_silu_avx2(v, n)) return;
  }
  for (int64_t i = 0; i < n; ++i) v[i] = conv_silu<false>(v[i]);
}

// g[i] ·= silu'(pre[i]) for i < n, likewise.
template <typename Acc>
void silu_grad_row(const Acc* pre, Acc* g, int64_t n) {
  if constexpr (std::is_same_v<Acc, float>) {
    if (cpu::cpu_has_avx2() && cpu::conv_silu_grad_avx2(pre, g, n)) return;
  }
  for (int64_t i = 0; i < n; ++i) g[i] *= conv_silu_grad<false>(pre[i]);
}

// One task: batch b, channels [d0, d0 + dn), steps [t0, t1).
struct Task {
  int64_t b, d0, dn, t0, t1, row;
};

template <typename F>
void for_each_task(const CausalConv1dLaunch& l, F&& f) {
  const int64_t dblocks = (l.dim + kCausalConv1dCpuChannels - 1) / kCausalConv1dCpuChannels;
  const int64_t tasks = l.batch * l.chunks * dblocks;
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t blk = i % dblocks, c = i / dblocks % l.chunks, b = i / dblocks / l.chunks;
      Task t;
      t.b = b;
      t.d0 = blk * kCausalConv1dCpuChannels;
      t.dn = std::min(kCausalConv1dCpuChannels, l.dim - t.d0);
      t.t0 = c * l.chunk;
      t.t1 = std::min(l.seqlen, t.t0 + l.chunk);
      t.row = b * l.chunks + c;
      f(t);
    }
  });
}

// The state a task carries along time: per channel, the inputs x̃ of the last W steps (and
// the weights and bias, converted), and per step its seq_idx (−1 before time 0).
template <typename T, typename Wt>
struct Window {
  using Acc = acc_t<T>;
  const CausalConv1dLaunch& l;
  const Task& task;
  const int W;
  std::vector<Acc> x, w, bias;  // x: [W][dn] ring; w: [W][dn]; bias: [dn]
  std::vector<int32_t> seq;     // [W] ring

  Window(const CausalConv1dLaunch& launch, const Task& t)
      : l(launch), task(t), W(launch.width), x(W * t.dn), w(W * t.dn), bias(t.dn, Acc(0)),
        seq(W, -1) {
    const Wt* wp = static_cast<const Wt*>(l.weight);
    const Wt* bp = static_cast<const Wt*>(l.bias);
    for (int64_t i = 0; i < t.dn; ++i) {
      const int64_t d = t.d0 + i;
      for (int k = 0; k < W; ++k) w[k * t.dn + i] = Acc(wp[d * l.w_stride_d + k * l.w_stride_k]);
      if (bp) bias[i] = Acc(bp[d * l.bias_stride]);
    }
    for (int64_t tau = t.t0 - (W - 1); tau < t.t0; ++tau) load(tau);
  }

  // Ring slot of step tau (tau >= t0 − (W − 1)).
  int slot(int64_t tau) const { return static_cast<int>((tau - task.t0 + W) % W); }
  Acc* x_row(int64_t tau) { return x.data() + slot(tau) * task.dn; }
  int32_t seq_at(int64_t tau) const { return seq[slot(tau)]; }

  // x̃ and seq_idx of step tau (tau < L) into the ring.
  void load(int64_t tau) {
    Acc* row = x_row(tau);
    const T* src = nullptr;
    Strides3 s{};
    int64_t at = tau;
    if (tau >= 0) {
      src = static_cast<const T*>(l.x_data);
      s = l.x;
    } else if (l.has_initial_states) {
      src = static_cast<const T*>(l.initial_states);
      s = l.init;
      at = tau + W - 1;
    }
    const int64_t base = task.b * s.b + at * s.t + task.d0 * s.d;
    for (int64_t i = 0; i < task.dn; ++i) row[i] = src ? Acc(src[base + i * s.d]) : Acc(0);
    seq[slot(tau)] = l.has_seq_idx && tau >= 0 ? l.seq_idx[task.b * l.seq.b + tau * l.seq.t] : -1;
  }

  // Whether output step t is a padding step (seq_idx < 0), which is 0 and passes no
  // gradient; and whether its tap k is open (same sequence), for a step that is not.
  bool padding(int64_t t) const { return l.has_seq_idx && seq_at(t) < 0; }
  bool open(int64_t t, int k) const {
    return !l.has_seq_idx || seq_at(t - (W - 1) + k) == seq_at(t);
  }

  // pre[i] = bias + Σ_k w[k]·x̃[t − (W−1) + k] over the open taps, in tap order.
  void pre(int64_t t, Acc* out) {
    std::copy(bias.begin(), bias.end(), out);
    for (int k = 0; k < W; ++k) {
      if (!open(t, k)) continue;
      const Acc* xr = x_row(t - (W - 1) + k);
      const Acc* wk = w.data() + k * task.dn;
      for (int64_t i = 0; i < task.dn; ++i) out[i] += wk[i] * xr[i];
    }
  }

  // The last W − 1 inputs (final_states), once step L − 1 (or, for L = 0, the initial
  // steps) is in the ring.
  void write_final(T* dst, const Strides3& s) {
    for (int j = 0; j < W - 1; ++j) {
      const Acc* xr = x_row(l.seqlen - (W - 1) + j);
      const int64_t base = task.b * s.b + j * s.t + task.d0 * s.d;
      for (int64_t i = 0; i < task.dn; ++i) dst[base + i * s.d] = static_cast<T>(xr[i]);
    }
  }
};

template <typename T, typename Wt>
void forward(const CausalConv1dLaunch& l) {
  using Acc = acc_t<T>;
  T* out = static_cast<T*>(l.out_data);
  for_each_task(l, [&](const Task& task) {
    Window<T, Wt> win(l, task);
    std::vector<Acc> acc(task.dn);
    for (int64_t t = task.t0; t < task.t1; ++t) {
      win.load(t);
      T* o = out + task.b * l.out.b + t * l.out.t + task.d0 * l.out.d;
      if (win.padding(t)) {
        for (int64_t i = 0; i < task.dn; ++i) o[i * l.out.d] = static_cast<T>(0.0f);
        continue;
      }
      win.pre(t, acc.data());
      if (l.silu) silu_row(acc.data(), task.dn);
      for (int64_t i = 0; i < task.dn; ++i) o[i * l.out.d] = static_cast<T>(acc[i]);
    }
    if (task.t1 == l.seqlen) win.write_final(static_cast<T*>(l.final_states), l.final);
  });
}

template <typename T, typename Wt>
void backward(const CausalConv1dLaunch& l) {
  using Acc = acc_t<T>;
  const T* dout = static_cast<const T*>(l.dout_data);
  const T* dfinal = static_cast<const T*>(l.dfinal_states);
  T* dx = static_cast<T*>(l.out_data);
  Acc* ws = static_cast<Acc*>(l.workspace);
  const int W = l.width;
  const int64_t L = l.seqlen, cols = W + 1;
  for_each_task(l, [&](const Task& task) {
    const int64_t dn = task.dn;
    Window<T, Wt> win(l, task);
    std::vector<Acc> g(W * dn), pre(dn), part(dn * cols, Acc(0));
    std::vector<char> live(W, 0);  // ring: whether step's g exists (t < L, not padding)
    const bool first = task.t0 == 0 && l.has_initial_states;
    std::vector<Acc> dinit(first ? (W - 1) * dn : 0, Acc(0));
    std::vector<Acc> acc(dn);
    for (int64_t t = task.t0; t < task.t1 + W - 1; ++t) {
      Acc* gt = g.data() + win.slot(t) * dn;
      const bool in = t < L;
      if (in) win.load(t);
      const bool is_live = in && !win.padding(t);
      live[win.slot(t)] = is_live;
      if (is_live) {
        const T* d = dout + task.b * l.dout.b + t * l.dout.t + task.d0 * l.dout.d;
        if (l.silu) win.pre(t, pre.data());
        for (int64_t i = 0; i < dn; ++i) gt[i] = Acc(d[i * l.dout.d]);
        if (l.silu) silu_grad_row(pre.data(), gt, dn);
        if (t < task.t1) {  // this task's dweight/dbias terms
          for (int k = 0; k < W; ++k) {
            if (!win.open(t, k)) continue;
            const Acc* xr = win.x_row(t - (W - 1) + k);
            for (int64_t i = 0; i < dn; ++i) part[i * cols + k] += gt[i] * xr[i];
          }
          for (int64_t i = 0; i < dn; ++i) part[i * cols + W] += gt[i];
        }
        for (int64_t j = t; first && j < W - 1; ++j)  // dinit[j] += w[j − t]·g[t]
          for (int64_t i = 0; i < dn; ++i) dinit[j * dn + i] += win.w[(j - t) * dn + i] * gt[i];
      }
      const int64_t s = t - (W - 1);
      if (s < task.t0) continue;
      // dx[s] = Σ_k w[k]·g[s + W−1−k] over the live steps of s's sequence.
      std::fill(acc.begin(), acc.end(), Acc(0));
      for (int k = 0; k < W; ++k) {
        const int64_t to = s + W - 1 - k;
        if (!live[win.slot(to)] || (l.has_seq_idx && win.seq_at(to) != win.seq_at(s))) continue;
        const Acc* gk = g.data() + win.slot(to) * dn;
        const Acc* wk = win.w.data() + k * dn;
        for (int64_t i = 0; i < dn; ++i) acc[i] += wk[i] * gk[i];
      }
      const int64_t j = s - (L - (W - 1));
      if (dfinal && j >= 0) {
        const T* df = dfinal + task.b * l.final.b + j * l.final.t + task.d0 * l.final.d;
        for (int64_t i = 0; i < dn; ++i) acc[i] += Acc(df[i * l.final.d]);
      }
      T* o = dx + task.b * l.out.b + s * l.out.t + task.d0 * l.out.d;
      for (int64_t i = 0; i < dn; ++i) o[i * l.out.d] = static_cast<T>(acc[i]);
    }
    Acc* row = ws + (task.row * l.dim + task.d0) * cols;
    std::copy(part.begin(), part.end(), row);
    if (!first) return;
    T* di = static_cast<T*>(l.dinitial_states);
    for (int64_t j = 0; j < W - 1; ++j) {
      T* o = di + task.b * l.dinit.b + j * l.dinit.t + task.d0 * l.dinit.d;
      const T* df = dfinal && j >= L ? dfinal + task.b * l.final.b + (j - L) * l.final.t +
                                            task.d0 * l.final.d
                                      : nullptr;
      for (int64_t i = 0; i < dn; ++i)
        o[i * l.dinit.d] = static_cast<T>(dinit[j * dn + i] + (df ? Acc(df[i * l.final.d]) : Acc(0)));
    }
  });
  // dweight[d, k] and dbias[d]: the rows' sums in order (zeros without rows).
  Wt* dw = static_cast<Wt*>(l.dweight);
  Wt* db = static_cast<Wt*>(l.dbias);
  at::parallel_for(0, l.dim, std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(l.partial_rows * cols, 1)),
                   [&](int64_t d0, int64_t d1) {
                     for (int64_t d = d0; d < d1; ++d)
                       for (int64_t k = 0; k < cols; ++k) {
                         Acc s = 0;
                         for (int64_t r = 0; r < l.partial_rows; ++r) s += ws[(r * l.dim + d) * cols + k];
                         if (k < W)
                           dw[d * W + k] = static_cast<Wt>(s);
                         else if (db)
                           db[d] = static_cast<Wt>(s);
                       }
                   });
}
}  // namespace

CausalConv1dWork causal_conv1d_cpu_work(const CausalConv1dLaunch&) {
  return {kCausalConv1dCpuChunk, 0, 1, 1};
}

void causal_conv1d_cpu(const CausalConv1dLaunch& l) {
  cpu::dispatch_floating(l.element, [&](auto t) {
    using T = decltype(t);
    const auto run = [&](auto w) {
      using Wt = decltype(w);
      if (l.backward)
        backward<T, Wt>(l);
      else
        forward<T, Wt>(l);
    };
    if (l.weight_element == ElementKind::F32)
      run(float{});
    else
      run(T{});
  });
}

}  // namespace baracuda::kernels
