// CPU SSD chunk scan, the chunked (state-space-duality) algorithm: the same function as
// the float64 recurrence of kernels/cpu/ssd_chunk_scan.cpp, with every option of the
// launch (kernels/ssd_chunk_scan.h), evaluated in S = float (double for float64 inputs)
// as a few small matrix products per chunk (the CPU BLAS's gemm). Any strides; outputs
// dense.
//
// The chunks are the chunk_size grid split further at every seq_idx reset, so no
// product ever spans two packed sequences (where a zero decay would still carry a NaN or
// Inf across, 0 · NaN = NaN), and the state entering a chunk that starts at a reset is
// zero, not a product with a zero decay. Per (b, h) and chunk [t0, t0 + q) with
// processed dt w_j, T_j = Σ_{i<=j} w_i (double), cs_j = A T_j, and h0 the state
// entering the chunk:
//   decay[j, i] = exp(cs_j - cs_i) where i <= j, else 0
//   ex_j        = exp(cs_j)                        (from the chunk's start to j)
//   e_i         = decay[q-1, i]                    (from i to the chunk's end)
//   Y           = (decay ∘ C Bᵀ) diag(w) X + diag(ex) C h0ᵀ + X diag(D)
//   h_exit      = ex_{q-1} h0 + (diag(e ∘ w) X)ᵀ B
// The decays come from two exponentials per position (exp(cs_j - m) exp(m - cs_i), m set
// by the chunk's first step, in double) while the range allows, else one per pair; row
// j's from steps 0..j only (Chunked::load).
//
// Backward, per chunk in reverse with dh = dL/dh_exit (dfinal_states after the last
// chunk), dY the gradient of Y (dout · silu(z) with the gate), P = dY Xᵀ:
//   Q1 = decay ∘ P diag(w)     dX = (decay ∘ C Bᵀ diag(w))ᵀ dY + diag(e ∘ w) B dhᵀ + D dY
//   dC = Q1 B + diag(ex) dY h0        dB = Q1ᵀ C + diag(e ∘ w) X dh
//   dh0 = ex_{q-1} dh + (diag(ex) dY)ᵀ C   (dinitial_states after the first chunk)
//   dw_i  = Σ_j (decay ∘ C Bᵀ ∘ P)_{ji} + e_i x_i · (B dhᵀ)_i
//   dcs_j = Σ_i Z_{ji} - Σ_k Z_{kj} + ex_j C_j · (dY h0)_j - u_j
//           + [j = q-1] (ex_{q-1} <dh, h0> + Σ_i u_i),
//           Z = decay ∘ C Bᵀ ∘ P diag(w),  u_i = e_i w_i x_i · (B dhᵀ)_i
//   ddt_i = (dw_i + A Σ_{k>=i} dcs_k) · d(processed)/d(raw);   dA += Σ_k dcs_k T_k
//   (dA summed by parts: Σ_{j>=i} Z_ji (T_j - T_i) + Σ_i u_i (T_{q-1} - T_i) + ..., so
//   that close pairs add small terms instead of two large sums cancelling)
// Tasks are (b, h) pairs. For each, the backward first packs x and dy and recomputes
// the state entering each grid chunk (in the task's scratch: ⌈L/Q⌉·D·N + 2·L·D). dB and
// dC, which sum over a group's heads, go through per-head partials in the workspace, the
// tasks run in waves and each wave's partials are added to the group's sums in head order
// (written directly when a group has one head), and dA,
// ddt_bias, dD through per-(b, h) partials summed in order of b: the same bits for any
// number of threads.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/ssd_chunk_scan_common.h"

namespace baracuda::kernels {

namespace {

using ssd_cpu::Inputs;

// The Fortran BLAS that libtorch_cpu links (and exports: MKL's sgemm_/dgemm_ in the x86
// wheels), bound weakly: where the running libtorch has none, the products run on the
// plain loops below instead (slower, the same results up to rounding).
extern "C" {
void sgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
            const float* beta, float* c, const int* ldc) __attribute__((weak));
void dgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k,
            const double* alpha, const double* a, const int* lda, const double* b,
            const int* ldb, const double* beta, double* c, const int* ldc) __attribute__((weak));
// MKL's per-thread thread count, bound weakly too: each task's products are small and
// the tasks already fill the cores, so a task asks for one BLAS thread (nested BLAS
// threads on top of ATen's were measured at 3–6x slower with 2 threads).
int MKL_Set_Num_Threads_Local(int n) __attribute__((weak));
}

struct OneBlasThread {
  int previous = 0;
  OneBlasThread() {
    if (MKL_Set_Num_Threads_Local) previous = MKL_Set_Num_Threads_Local(1);
  }
  ~OneBlasThread() {
    if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(previous);
  }
};

template <typename S>
void blas_gemm(const char* ta, const char* tb, const int* m, const int* n, const int* k,
               const S* alpha, const S* a, const int* lda, const S* b, const int* ldb,
               const S* beta, S* c, const int* ldc) {
  if constexpr (std::is_same_v<S, float>)
    sgemm_(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    dgemm_(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Cleared by tests (ssd_chunk_scan_cpu_chunked_use_blas) to run the plain loops here too.
std::atomic<bool> g_use_blas{true};
// The budget of a backward wave's per-head dB/dC (Chunked::workspace_elems).
constexpr int64_t kDefaultWaveBytes = int64_t{256} << 20;
std::atomic<int64_t> g_wave_bytes{kDefaultWaveBytes};

template <typename S>
bool have_blas() {
  if (!g_use_blas.load(std::memory_order_relaxed)) return false;
  if constexpr (std::is_same_v<S, float>)
    return sgemm_ != nullptr;
  else
    return dgemm_ != nullptr;
}

// Row-major C[M × N] = op(A) op(B) + beta C (op: transpose when the flag is set; beta 0
// ignores C's contents), through the column-major BLAS: Cᵀ = op(B)ᵀ op(A)ᵀ. Every
// extent here is a chunk length, D or N (far below 2^31).
template <typename S>
void matmul(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const S* A,
            int64_t lda, const S* B, int64_t ldb, S beta, S* C, int64_t ldc) {
  if (have_blas<S>()) {
    const char ta = trans_b ? 'T' : 'N', tb = trans_a ? 'T' : 'N';
    const int m = static_cast<int>(N), n = static_cast<int>(M), k = static_cast<int>(K);
    const int la = static_cast<int>(ldb), lb = static_cast<int>(lda), lc = static_cast<int>(ldc);
    const S one = 1;
    blas_gemm<S>(&ta, &tb, &m, &n, &k, &one, B, &la, A, &lb, &beta, C, &lc);
    return;
  }
  for (int64_t i = 0; i < M; ++i) {
    S* row = C + i * ldc;
    if (beta == S(0))
      std::fill(row, row + N, S(0));
    else
      for (int64_t j = 0; j < N; ++j) row[j] *= beta;
    for (int64_t p = 0; p < K; ++p) {
      const S av = trans_a ? A[p * lda + i] : A[i * lda + p];
      if (trans_b)
        for (int64_t j = 0; j < N; ++j) row[j] += av * B[j * ldb + p];
      else
        for (int64_t j = 0; j < N; ++j) row[j] += av * B[p * ldb + j];
    }
  }
}

// One task's scratch, allocated once per parallel_for range: every per-chunk matrix,
// sized for the longest chunk Qm.
template <typename S>
struct Scratch {
  std::vector<S> X, Bc, Cc, Y, Xs;         // Qm × D or Qm × N
  std::vector<S> decay, CB, M1;            // Qm × Qm
  std::vector<S> dY, BH, dYs, dB, dC, R;   // backward only
  std::vector<S> P, Q1, colW, Wrow;
  std::vector<S> w, slope, ex, e, Dh, zt, ypt, h;
  std::vector<double> T, fexp, gexp, dcs, dw;
  Scratch(int64_t Qm, int64_t D, int64_t N, bool backward)
      : X(Qm * D), Bc(Qm * N), Cc(Qm * N), Y(Qm * D), Xs(Qm * D), decay(Qm * Qm),
        CB(Qm * Qm), M1(Qm * Qm), w(Qm), slope(Qm), ex(Qm), e(Qm), Dh(D), zt(D), ypt(D),
        h(D * N), T(Qm), fexp(Qm), gexp(Qm) {
    if (!backward) return;
    for (auto* v : {&dY, &BH, &dYs}) v->resize(Qm * D);
    for (auto* v : {&dB, &dC, &R}) v->resize(Qm * N);
    for (auto* v : {&P, &Q1}) v->resize(Qm * Qm);
    colW.resize(Qm);
    Wrow.resize(Qm);
    dcs.resize(Qm);
    dw.resize(Qm);
  }
};

template <typename T, typename DT, typename CT>
struct Chunked {
  using S = CT;
  const SsdChunkScanLaunch& l;
  Inputs<T, DT, CT> in;
  int64_t L, H, D, N, G, Q, nc, DN, hpg;
  explicit Chunked(const SsdChunkScanLaunch& launch)
      : l(launch), in(launch), L(launch.seqlen), H(launch.heads), D(launch.head_dim),
        N(launch.state_dim), G(launch.groups), Q(launch.chunk_size), nc(launch.nchunks()),
        DN(launch.head_dim * launch.state_dim), hpg(launch.heads / launch.groups) {}
  int64_t q_max() const { return std::min(Q, L); }

  // The chunks of steps [begin, end) of row b (begin on the grid), in order, as (start,
  // length): each ends at the grid chunk's end or before the next reset, whichever
  // comes first.
  using Chunks = std::vector<std::pair<int64_t, int64_t>>;
  void chunks(int64_t b, int64_t begin, int64_t end, Chunks& out) const {
    out.clear();
    for (int64_t t0 = begin, t = begin + 1; t0 < end; t0 = t++) {
      const int64_t grid_end = std::min(end, (t0 / Q + 1) * Q);
      while (t < grid_end && !in.reset(b, t)) ++t;
      out.emplace_back(t0, t - t0);
    }
  }

  // Loads the chunk [t0, t0 + q) of (b, h): w, slope, T, X, B, then the decays ex, e
  // and (`full`) the whole decay matrix and C.
  // `xp`: this (b, h)'s x already packed as [L, D] in S (the backward's copy), else null.
  void load(Scratch<S>& s, int64_t b, int64_t h, int64_t t0, int64_t q, bool full,
            const S* xp = nullptr) const {
    const int64_t g = h / hpg;
    const double a = in.a(h);
    double run = 0.0;
    for (int64_t j = 0; j < q; ++j) {
      double sl = 1.0;
      const double v = in.step(b, t0 + j, h, &sl);
      s.w[j] = static_cast<S>(v);
      s.slope[j] = static_cast<S>(sl);
      run += v;
      s.T[j] = run;
      if (!xp) in.load_row(l.x, l.x_stride, b, t0 + j, h, s.X.data() + j * D);
      in.load_bc(l.B, l.B_stride, b, t0 + j, g, s.Bc.data() + j * N);
      if (full) in.load_bc(l.C, l.C_stride, b, t0 + j, g, s.Cc.data() + j * N);
    }
    // exp(cs_j - cs_i) = exp(cs_j - m) exp(m - cs_i), m = cs_0, for the rows j < nf, those
    // before the first step with |cs - m| > 700 (or a NaN): both factors finite and normal
    // in double, over cs_0 - 700 .. cs_0 (the decays shrink cs from cs_0 where dt >= 0);
    // one exponential per pair from there on. Row j's choice and values depend on steps
    // 0..j only, so a later step (a NaN in its dt included) never changes the bits of an
    // earlier output (m at the middle of the whole chunk's range let a later step move it).
    // Each factor's exponent is rounded to about |cs - m|·ε, so m is the chunk's first
    // cumsum itself: an offset from it (cs_0 - 600 once, for a range of 1200) put every
    // factor's error at about 600·ε, some 1e-13 of every float64 output and gradient.
    const double m = q > 0 ? a * s.T[0] : 0.0;
    int64_t nf = 0;
    while (nf < q && std::abs(a * s.T[nf] - m) <= 700.0) {
      s.fexp[nf] = std::exp(a * s.T[nf] - m);
      s.gexp[nf] = std::exp(m - a * s.T[nf]);
      ++nf;
    }
    if (xp) std::copy(xp + t0 * D, xp + (t0 + q) * D, s.X.begin());
    for (int64_t j = full ? 0 : q - 1; j < q; ++j) {
      const double csj = a * s.T[j];
      S* row = s.decay.data() + j * q;
      if (j < nf) {
        const double fj = s.fexp[j];
        const double* gi = s.gexp.data();
        for (int64_t i = 0; i <= j; ++i) row[i] = static_cast<S>(fj * gi[i]);
      } else {
        for (int64_t i = 0; i <= j; ++i) row[i] = static_cast<S>(std::exp(csj - a * s.T[i]));
      }
      std::fill(row + j + 1, row + q, S(0));
    }
    for (int64_t j = 0; j < q; ++j) s.ex[j] = static_cast<S>(std::exp(a * s.T[j]));
    for (int64_t i = 0; i < q; ++i) s.e[i] = s.decay[(q - 1) * q + i];
  }

  // h = ex_{q-1} h + (diag(e ∘ w) X)ᵀ B: the state leaving the loaded chunk.
  void advance_state(Scratch<S>& s, int64_t q, S* h) const {
    for (int64_t i = 0; i < q; ++i) {
      const S f = s.e[i] * s.w[i];
      for (int64_t d = 0; d < D; ++d) s.Xs[i * D + d] = f * s.X[i * D + d];
    }
    matmul<S>(true, false, D, N, q, s.Xs.data(), D, s.Bc.data(), N, s.ex[q - 1], h, N);
  }

  // M1 = decay ∘ C Bᵀ diag(w), with CB = C Bᵀ. Only the causal part (i <= j) is
  // computed and read anywhere: a NaN in a later step's B or x never reaches an earlier
  // output through a 0 · NaN.
  void intra_weights(Scratch<S>& s, int64_t q) const {
    matmul<S>(false, true, q, q, N, s.Cc.data(), N, s.Bc.data(), N, S(0), s.CB.data(), q);
    for (int64_t j = 0; j < q; ++j) {
      S* m1 = s.M1.data() + j * q;
      for (int64_t i = 0; i <= j; ++i) m1[i] = s.decay[j * q + i] * s.CB[j * q + i] * s.w[i];
      std::fill(m1 + j + 1, m1 + q, S(0));
    }
  }

  // out = M R (trans false: out_j = Σ_{i<=j} M_ji R_i) or Mᵀ R (trans true:
  // out_i = Σ_{j>=i} M_ji R_j) for a lower-triangular q × q M (row stride q) and q × K
  // rows R, touching only the rows of R inside the triangle: row block [r0, r1) of out
  // takes the rows of R outside the block by a GEMM and its own triangle by plain
  // loops. So a NaN in one step never reaches another step's output through a 0 · NaN
  // (the recurrence's reach, forward and backward).
  static void tri_product(bool trans, int64_t q, int64_t K, const S* M, const S* R, S* out) {
    constexpr int64_t kBlock = 16;
    for (int64_t r0 = 0; r0 < q; r0 += kBlock) {
      const int64_t r1 = std::min(q, r0 + kBlock), rows = r1 - r0;
      S* o = out + r0 * K;
      if (!trans && r0 > 0)
        matmul<S>(false, false, rows, K, r0, M + r0 * q, q, R, K, S(0), o, K);
      else if (trans && r1 < q)
        matmul<S>(true, false, rows, K, q - r1, M + r1 * q + r0, q, R + r1 * K, K, S(0), o, K);
      else
        std::fill(o, o + rows * K, S(0));
      for (int64_t a = r0; a < r1; ++a) {
        S* orow = out + a * K;
        for (int64_t c = trans ? a : r0; c < (trans ? r1 : a + 1); ++c) {
          const S m = trans ? M[c * q + a] : M[a * q + c];
          const S* rr = R + c * K;
          for (int64_t k = 0; k < K; ++k) orow[k] += m * rr[k];
        }
      }
    }
  }

  void forward() const {
    T* y = static_cast<T*>(l.y);
    T* y_pre = static_cast<T*>(l.y_pre_out);
    CT* final_states = static_cast<CT*>(l.final_states);
    T* kept = static_cast<T*>(l.states);  // (keep_states: H_c, the state entering grid chunk c)
    at::parallel_for(0, l.batch * H, 1, [&](int64_t begin, int64_t end) {
      const OneBlasThread one_blas_thread;
      Scratch<S> s(q_max(), D, N, false);
      Chunks row;
      for (int64_t bh = begin; bh < end; ++bh) {
        const int64_t b = bh / H, h = bh % H;
        in.load_D(h, s.Dh.data());
        in.load_state(l.initial_states, l.init_stride, b, h, s.h.data());
        chunks(b, 0, L, row);
        for (const auto& [t0, q] : row) {
          if (kept && t0 % Q == 0)  // (every grid chunk starts a piece; before its reset)
            for (int64_t i = 0; i < DN; ++i) kept[(bh * nc + t0 / Q) * DN + i] = static_cast<T>(s.h[i]);
          if (in.reset(b, t0)) std::fill(s.h.begin(), s.h.end(), S(0));
          load(s, b, h, t0, q, true);
          intra_weights(s, q);
          // Y = M1 X + diag(ex) C h0ᵀ
          tri_product(false, q, D, s.M1.data(), s.X.data(), s.Y.data());
          for (int64_t j = 0; j < q; ++j)
            for (int64_t n = 0; n < N; ++n) s.Cc[j * N + n] *= s.ex[j];
          matmul<S>(false, true, q, D, N, s.Cc.data(), N, s.h.data(), N, S(1), s.Y.data(), D);
          advance_state(s, q, s.h.data());
          for (int64_t j = 0; j < q; ++j) {
            const int64_t o = ((b * L + t0 + j) * H + h) * D;
            if (l.z) in.load_row(l.z, l.z_stride, b, t0 + j, h, s.zt.data());
            for (int64_t d = 0; d < D; ++d) {
              S v = s.Y[j * D + d] + s.Dh[d] * s.X[j * D + d];
              if (l.z) {
                if (y_pre) y_pre[o + d] = static_cast<T>(v);
                const S zv = s.zt[d];
                v *= zv / (S(1) + std::exp(-zv));
              }
              y[o + d] = static_cast<T>(v);
            }
          }
        }
        if (final_states)
          for (int64_t i = 0; i < DN; ++i) final_states[bh * DN + i] = static_cast<CT>(s.h[i]);
      }
    });
  }

  // Workspace (in S): partials dA, ddt_bias [B, H] and dD [B, H, D]; with more than one
  // head per group, dB and dC summed over each group's heads ([B, G, L, N] each) and the
  // per-head dB and dC of a wave of (b, h) tasks ([wave, L, N] each), added to those sums
  // in head order after each wave (the same order, hence the same bits, for any wave).
  // The wave is at least 4 tasks a thread and otherwise what g_wave_bytes holds (256 MiB:
  // at the Mamba-2 2.7B shape, B4 H80 G1 L4096 N128 in float32, 64 heads' 268 MB where all
  // 320 took 1.34 GB). What one (b, h) needs alone (its entry states, x and dy packed)
  // lives in the task's scratch, reused for its next (b, h).
  int64_t tasks() const { return l.batch * H; }
  bool head_partials() const { return hpg > 1 && L * N > 0; }
  int64_t group_sum_elems() const { return head_partials() ? l.batch * G * L * N : 0; }  // each of dB, dC
  int64_t fixed_elems() const { return tasks() * (2 + D) + 2 * group_sum_elems(); }
  int64_t workspace_elems() const {
    if (!head_partials()) return fixed_elems();
    const int64_t per_task = 2 * L * N;
    const int64_t budget = g_wave_bytes.load(std::memory_order_relaxed);
    const int64_t wave = std::min(tasks(), std::max<int64_t>(4 * at::get_num_threads(),
                                                             budget / (per_task * static_cast<int64_t>(sizeof(S)))));
    return fixed_elems() + wave * per_task;
  }

  void backward() const {
    S* dA_partial = static_cast<S*>(l.workspace);
    S* dbias_partial = dA_partial + tasks();
    S* dD_partial = dbias_partial + tasks();
    S* dB_sum = dD_partial + tasks() * D;
    S* dC_sum = dB_sum + group_sum_elems();
    S* dB_heads = dC_sum + group_sum_elems();
    // the wave the workspace was sized for (workspace_elems), read back from its size
    const int64_t wave =
        head_partials()
            ? std::max<int64_t>(1, (static_cast<int64_t>(l.workspace_bytes / sizeof(S)) - fixed_elems()) / (2 * L * N))
            : tasks();
    S* dC_heads = dB_heads + wave * L * N;
    T* dx = static_cast<T*>(l.dx);
    DT* ddt = static_cast<DT*>(l.ddt);
    T* dz = static_cast<T*>(l.dz);
    CT* dinit = static_cast<CT*>(l.dinitial_states);
    int64_t wave0 = 0;  // the wave's first task
    const auto task = [&](int64_t begin, int64_t end) {
      const OneBlasThread one_blas_thread;
      Scratch<S> s(q_max(), D, N, true);
      std::vector<S> dh(DN);
      // This (b, h)'s entry state of every grid chunk, and its x and dy packed as [L, D]
      // (its chunks read contiguously, not one D-row every H·D elements); dx goes into
      // the dy copy (each chunk's rows are free once the chunk is done) and out at the end.
      std::vector<S> states(nc * DN), xp(L * D), dyp(L * D);
      const std::vector<S> zero_state(DN, S(0));
      std::vector<double> dD_acc(D);
      Chunks grid;  // the chunks of one grid chunk
      for (int64_t bh = begin; bh < end; ++bh) {
        const int64_t b = bh / H, h = bh % H, g = h / hpg;
        const double a = in.a(h);
        S* st = states.data();
        for (int64_t t = 0; t < L; ++t) {
          in.load_row(l.x, l.x_stride, b, t, h, xp.data() + t * D);
          in.load_row(l.dy, l.dy_stride, b, t, h, dyp.data() + t * D);
        }
        // The state entering each grid chunk.
        in.load_state(l.initial_states, l.init_stride, b, h, s.h.data());
        for (int64_t c = 0; c < nc; ++c) {
          std::copy(s.h.begin(), s.h.end(), st + c * DN);
          if (c + 1 == nc) break;
          chunks(b, c * Q, (c + 1) * Q, grid);
          for (const auto& [t0, q] : grid) {
            if (in.reset(b, t0)) std::fill(s.h.begin(), s.h.end(), S(0));
            load(s, b, h, t0, q, false, xp.data());
            advance_state(s, q, s.h.data());
          }
        }
        in.load_D(h, s.Dh.data());
        in.load_state(l.dfinal_states, l.dfinal_stride, b, h, dh.data());
        double dA_acc = 0.0, dbias_acc = 0.0;
        std::fill(dD_acc.begin(), dD_acc.end(), 0.0);
        for (int64_t c = nc - 1; c >= 0; --c) {
          chunks(b, c * Q, std::min(L, (c + 1) * Q), grid);
          for (auto chunk = grid.rbegin(); chunk != grid.rend(); ++chunk) {
            const auto [t0, q] = *chunk;
            // A chunk starting at a reset starts from the zero state, and no gradient flows
            // back across the reset.
            const bool fresh = in.reset(b, t0);
            const S* h0 = fresh ? zero_state.data() : st + c * DN;
            load(s, b, h, t0, q, true, xp.data());
            S* dyx = dyp.data() + t0 * D;  // this chunk's dy rows, then dx
            // dY (the gradient of the pre-gate output) and dz.
            for (int64_t j = 0; j < q; ++j) {
              S* dyr = s.dY.data() + j * D;
              std::copy(dyx + j * D, dyx + (j + 1) * D, dyr);
              if (l.z) {
                in.load_row(l.z, l.z_stride, b, t0 + j, h, s.zt.data());
                in.load_row(l.y_pre, l.y_pre_stride, b, t0 + j, h, s.ypt.data());
                const int64_t o = ((b * L + t0 + j) * H + h) * D;
                for (int64_t d = 0; d < D; ++d) {
                  const S zv = s.zt[d], sg = S(1) / (S(1) + std::exp(-zv));
                  dz[o + d] = static_cast<T>(dyr[d] * s.ypt[d] * sg * (S(1) + zv * (S(1) - sg)));
                  dyr[d] *= zv * sg;
                }
              }
              for (int64_t d = 0; d < D; ++d)
                dD_acc[d] += static_cast<double>(dyr[d]) * static_cast<double>(s.X[j * D + d]);
            }
            intra_weights(s, q);
            matmul<S>(false, true, q, q, D, s.dY.data(), D, s.X.data(), D, S(0), s.P.data(), q);
            double dA_chunk = 0.0;  // = Σ_k dcs_k T_k, summed by its parts
            // W = decay ∘ P ∘ C Bᵀ: dw_i = Σ_j W_ji; with Z = W diag(w), dcs_j gets the
            // row sums of Z and loses its column sums (w_i dw_i).
            std::fill(s.colW.begin(), s.colW.begin() + q, S(0));
            for (int64_t j = 0; j < q; ++j) {
              const S* dec = s.decay.data() + j * q;
              const S* pr = s.P.data() + j * q;
              const S* cb = s.CB.data() + j * q;
              S* q1 = s.Q1.data() + j * q;
              S* cw = s.colW.data();
              const S* w = s.w.data();
              S* wr = s.Wrow.data();
              for (int64_t i = 0; i <= j; ++i) {
                const S dp = dec[i] * pr[i];
                wr[i] = dp * cb[i];
                q1[i] = dp * w[i];
                cw[i] += wr[i];
              }
              // dA takes Σ_i Z_ji (T_j - T_i) directly (pairs close in time add small
              // terms), not Σ_k dcs_k T_k, a difference of two large sums.
              double zrow = 0, za = 0;
              for (int64_t i = 0; i <= j; ++i) {
                const double z = static_cast<double>(wr[i] * w[i]);
                zrow += z;
                za += z * (s.T[j] - s.T[i]);
              }
              dA_chunk += za;
              std::fill(q1 + j + 1, q1 + q, S(0));
              s.dcs[j] = zrow;
            }
            for (int64_t i = 0; i < q; ++i) {
              s.dw[i] = static_cast<double>(s.colW[i]);
              s.dcs[i] -= static_cast<double>(s.w[i] * s.colW[i]);
            }
            // dX = M1ᵀ dY + diag(e ∘ w) B dhᵀ + D dY   (in s.Y)
            tri_product(true, q, D, s.M1.data(), s.dY.data(), s.Y.data());
            matmul<S>(false, true, q, D, N, s.Bc.data(), N, dh.data(), N, S(0), s.BH.data(), D);
            double usum = 0.0;
            for (int64_t i = 0; i < q; ++i) {
              const S ew = s.e[i] * s.w[i];
              S xb = 0;
              S* dx_row = dyx + i * D;
              const S* bh_row = s.BH.data() + i * D;
              const S* x_row = s.X.data() + i * D;
              const S* y_row = s.Y.data() + i * D;
              const S* dy_row = s.dY.data() + i * D;
              for (int64_t d = 0; d < D; ++d) {
                xb += x_row[d] * bh_row[d];
                dx_row[d] = y_row[d] + ew * bh_row[d] + s.Dh[d] * dy_row[d];
              }
              s.dw[i] += static_cast<double>(s.e[i] * xb);
              const double u = static_cast<double>(ew * xb);
              s.dcs[i] -= u;
              dA_chunk += u * (s.T[q - 1] - s.T[i]);
              usum += u;
            }
            s.dcs[q - 1] += usum;
            // dC = Q1 B + R with R = diag(ex) dY h0; dcs_j += C_j · R_j.
            for (int64_t j = 0; j < q; ++j)
              for (int64_t d = 0; d < D; ++d) s.dYs[j * D + d] = s.ex[j] * s.dY[j * D + d];
            tri_product(false, q, N, s.Q1.data(), s.Bc.data(), s.dC.data());
            matmul<S>(false, false, q, N, D, s.dYs.data(), D, h0, N, S(0), s.R.data(), N);
            for (int64_t j = 0; j < q; ++j) {
              S cr = 0;
              const S* c_row = s.Cc.data() + j * N;
              const S* r_row = s.R.data() + j * N;
              S* dc_row = s.dC.data() + j * N;
              for (int64_t n = 0; n < N; ++n) {
                cr += c_row[n] * r_row[n];
                dc_row[n] += r_row[n];
              }
              s.dcs[j] += static_cast<double>(cr);
              dA_chunk += static_cast<double>(cr) * s.T[j];
            }
            // dB = Q1ᵀ C + diag(e ∘ w) X dh
            tri_product(true, q, N, s.Q1.data(), s.Cc.data(), s.dB.data());
            for (int64_t i = 0; i < q; ++i) {
              const S ew = s.e[i] * s.w[i];
              for (int64_t d = 0; d < D; ++d) s.Xs[i * D + d] = ew * s.X[i * D + d];
            }
            matmul<S>(false, false, q, N, D, s.Xs.data(), D, dh.data(), N, S(1), s.dB.data(), N);
            // dcs_{q-1} += ex_{q-1} <dh, h0>;  dh <- ex_{q-1} dh + (diag(ex) dY)ᵀ C.
            if (s.ex[q - 1] != S(0)) {
              double hh = 0.0;  // D·N terms: in double
              for (int64_t i = 0; i < DN; ++i) hh += static_cast<double>(dh[i] * h0[i]);
              s.dcs[q - 1] += static_cast<double>(s.ex[q - 1]) * hh;
              dA_chunk += static_cast<double>(s.ex[q - 1]) * hh * s.T[q - 1];
            }
            matmul<S>(true, false, D, N, q, s.dYs.data(), D, s.Cc.data(), N, s.ex[q - 1], dh.data(),
                      N);
            // ddt and the partial sums of dA and ddt_bias.
            dA_acc += dA_chunk;
            double suffix = 0.0;
            for (int64_t i = q - 1; i >= 0; --i) {
              suffix += s.dcs[i];
              const double g_raw = (s.dw[i] + a * suffix) * static_cast<double>(s.slope[i]);
              ddt[(b * L + t0 + i) * H + h] = static_cast<DT>(g_raw);
              dbias_acc += g_raw;
            }
            // dB, dC: straight out with one head per group, else this head's partial.
            for (int64_t j = 0; j < q; ++j) {
              const int64_t t = t0 + j;
              if (hpg == 1) {
                T* dbt = static_cast<T*>(l.dB) + ((b * L + t) * G + g) * N;
                T* dct = static_cast<T*>(l.dC) + ((b * L + t) * G + g) * N;
                for (int64_t n = 0; n < N; ++n) {
                  dbt[n] = static_cast<T>(s.dB[j * N + n]);
                  dct[n] = static_cast<T>(s.dC[j * N + n]);
                }
              } else {
                std::copy(s.dB.begin() + j * N, s.dB.begin() + (j + 1) * N,
                          dB_heads + ((bh - wave0) * L + t) * N);
                std::copy(s.dC.begin() + j * N, s.dC.begin() + (j + 1) * N,
                          dC_heads + ((bh - wave0) * L + t) * N);
              }
            }
            if (fresh) std::fill(dh.begin(), dh.end(), S(0));
          }
        }
        dA_partial[bh] = static_cast<S>(dA_acc);
        dbias_partial[bh] = static_cast<S>(dbias_acc);
        for (int64_t d = 0; d < D; ++d) dD_partial[bh * D + d] = static_cast<S>(dD_acc[d]);
        if (dinit)
          for (int64_t i = 0; i < DN; ++i) dinit[bh * DN + i] = static_cast<CT>(dh[i]);
        for (int64_t t = 0; t < L; ++t) {
          const S* src = dyp.data() + t * D;
          T* out = dx + ((b * L + t) * H + h) * D;
          for (int64_t d = 0; d < D; ++d) out[d] = static_cast<T>(src[d]);
        }
      }
    };
    for (; wave0 < tasks(); wave0 += wave) {
      const int64_t wave1 = std::min(tasks(), wave0 + wave);
      at::parallel_for(wave0, wave1, 1, task);
      if (!head_partials()) continue;
      // dB[b, t, g] = Σ_{heads of g, in order} partial: this wave's heads added to the
      // sums (from 0 at a group's first head), parallel over the wave's rows (b, t).
      at::parallel_for(wave0 / H * L, ((wave1 - 1) / H + 1) * L, 64, [&](int64_t begin, int64_t end) {
        for (int64_t bt = begin; bt < end; ++bt) {
          const int64_t b = bt / L, t = bt % L;
          for (int64_t g = 0; g < G; ++g) {
            S* accb = dB_sum + (bt * G + g) * N;
            S* accc = dC_sum + (bt * G + g) * N;
            const int64_t first = b * H + g * hpg;
            for (int64_t bh = std::max(first, wave0); bh < std::min(first + hpg, wave1); ++bh) {
              const int64_t off = ((bh - wave0) * L + t) * N;
              const bool start = bh == first;
              for (int64_t n = 0; n < N; ++n) {
                accb[n] = (start ? S(0) : accb[n]) + dB_heads[off + n];
                accc[n] = (start ? S(0) : accc[n]) + dC_heads[off + n];
              }
            }
          }
        }
      });
    }
    if (head_partials())
      at::parallel_for(0, l.batch * L * G * N, 4096, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          static_cast<T*>(l.dB)[i] = static_cast<T>(dB_sum[i]);
          static_cast<T*>(l.dC)[i] = static_cast<T>(dC_sum[i]);
        }
      });
    ssd_cpu::reduce_partials<CT>(l, dA_partial, dbias_partial, dD_partial);
  }
};

}  // namespace

bool ssd_chunk_scan_cpu_chunked_use_blas(bool enabled) { return g_use_blas.exchange(enabled); }

int64_t ssd_chunk_scan_cpu_chunked_wave_bytes(int64_t bytes) {
  return g_wave_bytes.exchange(bytes > 0 ? bytes : kDefaultWaveBytes);
}

size_t ssd_chunk_scan_cpu_chunked_forward_workspace(const SsdChunkScanLaunch&) { return 0; }

size_t ssd_chunk_scan_cpu_chunked_backward_workspace(const SsdChunkScanLaunch& l) {
  size_t bytes = 0;
  ssd_cpu::dispatch(l, [&](auto t, auto dt, auto ct) {
    using CT = decltype(ct);
    bytes = static_cast<size_t>(
                Chunked<decltype(t), decltype(dt), CT>(l).workspace_elems()) *
            sizeof(CT);
  });
  return bytes;
}

void ssd_chunk_scan_cpu_chunked_forward(const SsdChunkScanLaunch& l) {
  ssd_cpu::dispatch(l, [&](auto t, auto dt, auto ct) {
    Chunked<decltype(t), decltype(dt), decltype(ct)>(l).forward();
  });
}

void ssd_chunk_scan_cpu_chunked_backward(const SsdChunkScanLaunch& l) {
  ssd_cpu::dispatch(l, [&](auto t, auto dt, auto ct) {
    Chunked<decltype(t), decltype(dt), decltype(ct)>(l).backward();
  });
}

}  // namespace baracuda::kernels
