// Dev tool: cos/sin RoPE forward (half-split, bf16) written as plain elementwise kernels, at
// benchmarks/tune/time_rope_cos_sin.py's shapes, against a device copy of the same bytes,
// without PyTorch: flash-attention's layout (x [8, 4096, 32, 128], float32 [S, 64] tables)
// and the Hugging Face q [8, 32, 4096, 128] with k of 8 heads (bf16 [S, 128] tables, the
// v half's entries read from the table's second half). A thread takes U heads of one
// 16-byte item (8 pairs: 16 bytes of the u half and 16 of the v half), the table entries
// loaded once for its U heads; the grid covers every item (no loop beyond the U heads), so
// the bytes in flight come from resident threads rather than steps. Every variant's output
// is checked against a float reference on the host (at most one bf16 rounding apart).
// Build and run on the GPU from the repo root:
//   nvcc -O3 -std=c++17 -arch=sm_90a benchmarks/tune/tune_rope_cs_rows.cu -o /tmp/tune_rope && /tmp/tune_rope
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tune_common.cuh"

using bf16 = __nv_bfloat16;
constexpr int B = 8, S = 4096, H = 32, HK = 8, D = 128, HALF = D / 2, ITEMS = HALF / 8;

struct Tab {
  float c[8], s[8];
};

// Table entries of pairs 8·item .. 8·item + 7 at position s: float32 [S, 64] (flash) or
// bf16 [S, 128] (Hugging Face, the v entries at + 64; they are the u entries' copies there).
__device__ __forceinline__ Tab load_tab(const float* cs, const float* sn, int64_t s, int item) {
  Tab t;
  const float4* c4 = reinterpret_cast<const float4*>(cs + s * HALF + item * 8);
  const float4* s4 = reinterpret_cast<const float4*>(sn + s * HALF + item * 8);
  const float4 c0 = __ldg(c4), c1 = __ldg(c4 + 1), s0 = __ldg(s4), s1 = __ldg(s4 + 1);
  memcpy(t.c, &c0, 16), memcpy(t.c + 4, &c1, 16), memcpy(t.s, &s0, 16), memcpy(t.s + 4, &s1, 16);
  return t;
}
__device__ __forceinline__ void load_tab_hf(const bf16* cs, const bf16* sn, int64_t s, int item, Tab& u, Tab& v) {
  const uint4 cu = __ldg(reinterpret_cast<const uint4*>(cs + s * D + item * 8));
  const uint4 su = __ldg(reinterpret_cast<const uint4*>(sn + s * D + item * 8));
  const uint4 cv = __ldg(reinterpret_cast<const uint4*>(cs + s * D + HALF + item * 8));
  const uint4 sv = __ldg(reinterpret_cast<const uint4*>(sn + s * D + HALF + item * 8));
  bf16 a[8], b[8], c[8], d[8];
  memcpy(a, &cu, 16), memcpy(b, &su, 16), memcpy(c, &cv, 16), memcpy(d, &sv, 16);
#pragma unroll
  for (int j = 0; j < 8; ++j)
    u.c[j] = __bfloat162float(a[j]), u.s[j] = __bfloat162float(b[j]), v.c[j] = __bfloat162float(c[j]),
    v.s[j] = __bfloat162float(d[j]);
}

// y_u = c_u·u − s_u·v, y_v = s_v·u + c_v·v (the library's forward coefficients).
__device__ __forceinline__ void rotate(const uint4& a, const uint4& b, const Tab& tu, const Tab& tv, uint4& oa,
                                       uint4& ob) {
  bf16 u[8], v[8], yu[8], yv[8];
  memcpy(u, &a, 16), memcpy(v, &b, 16);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float fu = __bfloat162float(u[j]), fv = __bfloat162float(v[j]);
    yu[j] = __float2bfloat16(tu.c[j] * fu + -tu.s[j] * fv);
    yv[j] = __float2bfloat16(tv.s[j] * fu + tv.c[j] * fv);
  }
  memcpy(&oa, yu, 16), memcpy(&ob, yv, 16);
}

// Flash layout x [B, S, H, D]: thread (b, s, head block hb, item), heads hb·U .. hb·U + U − 1
// (a block's threads: items fastest, then head blocks, then positions).
template <int U, bool CS>
__global__ void __launch_bounds__(256) rope_flash(const bf16* x, bf16* y, const float* cs, const float* sn) {
  constexpr int HB = H / U;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (t >= int64_t{B} * S * HB * ITEMS) return;
  const int item = t % ITEMS;
  const int hb = (t / ITEMS) % HB;
  const int64_t bs = t / (ITEMS * HB);
  const int64_t s = bs % S;
  const Tab tab = load_tab(cs, sn, s, item);
  const int64_t base = (bs * H + hb * U) * D + item * 8;
  uint4 a[U], b[U];
#pragma unroll
  for (int k = 0; k < U; ++k) {
    const uint4* p = reinterpret_cast<const uint4*>(x + base + k * D);
    a[k] = CS ? __ldcs(p) : __ldg(p);
    b[k] = CS ? __ldcs(p + HALF / 8) : __ldg(p + HALF / 8);
  }
#pragma unroll
  for (int k = 0; k < U; ++k) {
    uint4 oa, ob;
    rotate(a[k], b[k], tab, tab, oa, ob);
    uint4* o = reinterpret_cast<uint4*>(y + base + k * D);
    if (CS) __stcs(o, oa), __stcs(o + HALF / 8, ob); else o[0] = oa, o[HALF / 8] = ob;
  }
}

// Hugging Face layout q [B, H, S, D] and k [B, HK, S, D] in one launch: thread (b, head block,
// s, item) with U heads of one tensor (heads h, h + HB, ... so that a warp's rows are one
// head's consecutive positions: 4 positions of 256 bytes a warp access).
template <int U>
__global__ void __launch_bounds__(256) rope_hf(const bf16* q, const bf16* k, bf16* yq, bf16* yk, const bf16* cs,
                                               const bf16* sn) {
  constexpr int QB = H / U, KB = HK / U;
  const int64_t per_b = int64_t{QB + KB} * S * ITEMS;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (t >= B * per_b) return;
  const int64_t b = t / per_b;
  int64_t r = t - b * per_b;
  const int item = r % ITEMS;
  r /= ITEMS;
  const int64_t s = r % S;
  const int hb = static_cast<int>(r / S);
  const bool is_q = hb < QB;
  const int nh = is_q ? H : HK;
  const int h0 = is_q ? hb : hb - QB, hstep = is_q ? QB : KB;
  const bf16* x = is_q ? q : k;
  bf16* y = is_q ? yq : yk;
  Tab tu, tv;
  load_tab_hf(cs, sn, s, item, tu, tv);
  uint4 a[U], bb[U];
  int64_t off[U];
#pragma unroll
  for (int j = 0; j < U; ++j) {
    off[j] = ((b * nh + h0 + j * hstep) * S + s) * D + item * 8;
    const uint4* p = reinterpret_cast<const uint4*>(x + off[j]);
    a[j] = __ldg(p);
    bb[j] = __ldg(p + HALF / 8);
  }
#pragma unroll
  for (int j = 0; j < U; ++j) {
    uint4 oa, ob;
    rotate(a[j], bb[j], tu, tv, oa, ob);
    uint4* o = reinterpret_cast<uint4*>(y + off[j]);
    o[0] = oa, o[HALF / 8] = ob;
  }
}

static float bf(bf16 v) { return __bfloat162float(v); }

// max |y − ref| in units of ref's bf16 spacing, over every (b, s, h) row's features.
static double check(const std::vector<bf16>& y, const std::vector<bf16>& x, int64_t rows,
                    const std::vector<float>& cu, const std::vector<float>& su, const std::vector<float>& cv,
                    const std::vector<float>& sv, int64_t (*pos_of)(int64_t)) {
  double worst = 0;
  for (int64_t r = 0; r < rows; r += 97) {  // a spread sample of rows
    const int64_t s = pos_of(r);
    for (int j = 0; j < HALF; ++j) {
      const float u = bf(x[r * D + j]), v = bf(x[r * D + HALF + j]);
      const float ru = cu[s * HALF + j] * u - su[s * HALF + j] * v, rv = sv[s * HALF + j] * u + cv[s * HALF + j] * v;
      const double ulp_u = std::max(std::ldexp(1.0, std::ilogb(std::fabs(ru)) - 7), 1e-30);
      const double ulp_v = std::max(std::ldexp(1.0, std::ilogb(std::fabs(rv)) - 7), 1e-30);
      worst = std::max(worst, std::fabs(bf(y[r * D + j]) - ru) / ulp_u);
      worst = std::max(worst, std::fabs(bf(y[r * D + HALF + j]) - rv) / ulp_v);
    }
  }
  return worst;
}

int main() {
  uint32_t seed = 7;
  auto rnd = [&] { seed = seed * 1664525u + 1013904223u; return (static_cast<int>(seed >> 9) % 2001 - 1000) / 500.0f; };
  // tables: angle s·f_j
  std::vector<float> ct(S * HALF), st(S * HALF);
  std::vector<bf16> ch(S * D), sh(S * D);
  std::vector<float> chf(S * HALF), shf(S * HALF);
  for (int s = 0; s < S; ++s)
    for (int j = 0; j < HALF; ++j) {
      const double a = s * std::pow(10000.0, -2.0 * j / D);
      ct[s * HALF + j] = static_cast<float>(std::cos(a));
      st[s * HALF + j] = static_cast<float>(std::sin(a));
      ch[s * D + j] = ch[s * D + HALF + j] = __float2bfloat16(static_cast<float>(std::cos(a)));
      sh[s * D + j] = sh[s * D + HALF + j] = __float2bfloat16(static_cast<float>(std::sin(a)));
      chf[s * HALF + j] = bf(ch[s * D + j]);
      shf[s * HALF + j] = bf(sh[s * D + j]);
    }
  const int64_t nx = int64_t{B} * S * H * D, nk = int64_t{B} * S * HK * D;
  std::vector<bf16> hx(nx), hk(nk);
  for (auto& v : hx) v = __float2bfloat16(rnd());
  for (auto& v : hk) v = __float2bfloat16(rnd());
  bf16 *x, *y, *k, *yk, *chd, *shd;
  float *ctd, *std_;
  CHECK(cudaMalloc(&x, nx * 2));
  CHECK(cudaMalloc(&y, nx * 2));
  CHECK(cudaMalloc(&k, nk * 2));
  CHECK(cudaMalloc(&yk, nk * 2));
  CHECK(cudaMalloc(&ctd, S * HALF * 4));
  CHECK(cudaMalloc(&std_, S * HALF * 4));
  CHECK(cudaMalloc(&chd, S * D * 2));
  CHECK(cudaMalloc(&shd, S * D * 2));
  CHECK(cudaMemcpy(x, hx.data(), nx * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(k, hk.data(), nk * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(ctd, ct.data(), S * HALF * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(std_, st.data(), S * HALF * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(chd, ch.data(), S * D * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(shd, sh.data(), S * D * 2, cudaMemcpyHostToDevice));
  const float copy_x = median_us([&] { CHECK(cudaMemcpyAsync(y, x, nx * 2, cudaMemcpyDeviceToDevice)); });
  const float copy_qk = median_us([&] {
    CHECK(cudaMemcpyAsync(y, x, nx * 2, cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpyAsync(yk, k, nk * 2, cudaMemcpyDeviceToDevice));
  });
  printf("copies: x %.1f us (%.2f TB/s), q + k %.1f us\n", copy_x, 4.0 * nx / copy_x * 1e-6, copy_qk);
  std::vector<bf16> hy(nx), hyk(nk);
  const auto flash = [&](const char* name, auto kernel, int U) {
    const int64_t threads = int64_t{B} * S * (H / U) * ITEMS;
    const unsigned grid = static_cast<unsigned>((threads + 255) / 256);
    cudaFuncAttributes fa;
    CHECK(cudaFuncGetAttributes(&fa, kernel));
    CHECK(cudaMemset(y, 0xff, nx * 2));
    kernel<<<grid, 256>>>(x, y, ctd, std_);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(hy.data(), y, nx * 2, cudaMemcpyDeviceToHost));
    const double err = check(hy, hx, int64_t{B} * S * H, ct, st, ct, st, [](int64_t r) { return (r / H) % S; });
    const float t = median_us([&] { kernel<<<grid, 256>>>(x, y, ctd, std_); });
    printf("flash %-10s %3d regs: %.1f us, %.3f x copy, worst %.2f bf16 units\n", name, fa.numRegs, t, copy_x / t, err);
  };
  flash("U1", rope_flash<1, false>, 1);
  flash("U2", rope_flash<2, false>, 2);
  flash("U4", rope_flash<4, false>, 4);
  flash("U8", rope_flash<8, false>, 8);
  flash("U2 cs", rope_flash<2, true>, 2);
  flash("U4 cs", rope_flash<4, true>, 4);
  const auto hf = [&](const char* name, auto kernel, int U) {
    const int64_t threads = int64_t{B} * (H + HK) / U * S * ITEMS;
    const unsigned grid = static_cast<unsigned>((threads + 255) / 256);
    cudaFuncAttributes fa;
    CHECK(cudaFuncGetAttributes(&fa, kernel));
    CHECK(cudaMemset(y, 0xff, nx * 2));
    CHECK(cudaMemset(yk, 0xff, nk * 2));
    kernel<<<grid, 256>>>(x, k, y, yk, chd, shd);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(hy.data(), y, nx * 2, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hyk.data(), yk, nk * 2, cudaMemcpyDeviceToHost));
    const double eq = check(hy, hx, int64_t{B} * H * S, chf, shf, chf, shf, [](int64_t r) { return r % S; });
    const double ek = check(hyk, hk, int64_t{B} * HK * S, chf, shf, chf, shf, [](int64_t r) { return r % S; });
    const float t = median_us([&] { kernel<<<grid, 256>>>(x, k, y, yk, chd, shd); });
    printf("hf q+k %-9s %3d regs: %.1f us, %.3f x copy, worst %.2f / %.2f bf16 units\n", name, fa.numRegs, t,
           copy_qk / t, eq, ek);
  };
  hf("U1", rope_hf<1>, 1);
  hf("U2", rope_hf<2>, 2);
  hf("U4", rope_hf<4>, 4);
  hf("U8", rope_hf<8>, 8);
  return 0;
}
