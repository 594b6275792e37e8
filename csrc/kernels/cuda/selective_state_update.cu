// CUDA selective state update (core/selective_state_update_plan.h has the formulas and
// the work split). A block owns one (batch, head) and a slice of its head_dim rows; a row
// of the state (N elements) belongs to a group of `lanes` threads, each holding
// kStateUpdateLaneElems consecutive elements in each of `Chunks` chunks in registers: the
// row is read once, updated for every token, and written once. The sum over N is each
// thread's elements in order, then a butterfly over the group's lanes (fixed order:
// deterministic). B and C of the block's (batch, group) are the same for all its rows:
// with one token they are loaded once a block, into registers. A group walks its rows one
// a pass; with up to 2 chunks a lane it loads the next row's state before computing the
// current one (two rows' loads in flight a warp). With one chunk a lane (N <= 128) and
// float math the kernel asks for 8 blocks a multiprocessor (ptxas for sm_90a: 59
// registers, no spills; it took 80 and ran 6 blocks): the loads in flight are what a
// large batch needs (H200, B64 H80 P64 N128, bf16 x, float32 state: 193.8 -> 170.3 µs a
// step). The values of a (row, token) pair that do not depend on n (x, δ with its
// softplus, exp(A·δ) for a per-row A, then D, z and the store of out) were computed by
// every lane of the group, about as many instructions a row as its 4 state elements a
// lane take (ncu at B64: 0.82 warps issued a scheduler cycle, 30 % of DRAM bandwidth);
// where a group has several pairs and they fit its lanes (the plan's lane_scalars), lane q
// computes pair q's once and the others take them by shuffle (B64: 170 -> 143 µs a step).
// No shared memory, no workspace, no host synchronization: the launch can be captured in
// a CUDA graph.
#include <cstring>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/selective_state_update.h"
#include "kernels/selective_state_update_math.h"

namespace baracuda::kernels {

namespace {
using cuda::acc_t;
using cuda::to_acc;
using cuda::from_acc;

constexpr int E = kStateUpdateLaneElems;

// An operand of x's dtype T or float32, as Acc.
template <typename T>
__device__ __forceinline__ acc_t<T> small(const void* p, bool f32, int64_t off) {
  using Acc = acc_t<T>;
  return f32 ? static_cast<Acc>(static_cast<const float*>(p)[off])
             : static_cast<Acc>(to_acc(static_cast<const T*>(p)[off]));
}

// 4 consecutive state elements, one vector access (two for float64); the plan checked
// that the address is aligned to the vector (16 bytes at most).
template <typename S>
__device__ __forceinline__ void load4(const S* p, S (&v)[E]) {
  constexpr int bytes = static_cast<int>(sizeof(S)) * E;
  if constexpr (bytes == 16) {
    const uint4 r = *reinterpret_cast<const uint4*>(p);
    memcpy(v, &r, 16);
  } else if constexpr (bytes == 8) {
    const uint2 r = *reinterpret_cast<const uint2*>(p);
    memcpy(v, &r, 8);
  } else {
    static_assert(bytes == 32, "state elements of 2, 4 or 8 bytes");
    const uint4 r0 = reinterpret_cast<const uint4*>(p)[0];
    const uint4 r1 = reinterpret_cast<const uint4*>(p)[1];
    memcpy(v, &r0, 16);
    memcpy(v + 2, &r1, 16);
  }
}

template <typename S>
__device__ __forceinline__ void store4(S* p, const S (&v)[E]) {
  constexpr int bytes = static_cast<int>(sizeof(S)) * E;
  if constexpr (bytes == 16) {
    uint4 r;
    memcpy(&r, v, 16);
    *reinterpret_cast<uint4*>(p) = r;
  } else if constexpr (bytes == 8) {
    uint2 r;
    memcpy(&r, v, 8);
    *reinterpret_cast<uint2*>(p) = r;
  } else {
    uint4 r0, r1;
    memcpy(&r0, v, 16);
    memcpy(&r1, v + 2, 16);
    reinterpret_cast<uint4*>(p)[0] = r0;
    reinterpret_cast<uint4*>(p)[1] = r1;
  }
}

// T: x's dtype; S: the state's (T or float); Chunks: chunks a lane (a power of two up to
// kStateUpdateMaxChunks).
template <typename T, typename S, int Chunks>
__global__ __launch_bounds__(kStateUpdateThreads, Chunks == 1 && sizeof(acc_t<T>) == 4 ? 8 : 1)
    void state_update_kernel(const StateUpdateLaunch l) {
  using Acc = acc_t<T>;
  const int lanes = l.lanes;
  const int group = static_cast<int>(threadIdx.x) / lanes;
  const int lane = static_cast<int>(threadIdx.x) % lanes;
  // The shuffle mask of this thread's group within its warp.
  const unsigned mask = lanes == 32 ? 0xffffffffu
                                    : ((1u << lanes) - 1u) << ((threadIdx.x % 32) / lanes * lanes);
  const int64_t blk = blockIdx.x;
  const int64_t ptile = blk % l.ptiles;
  const int64_t h = blk / l.ptiles % l.nheads;
  const int64_t b = blk / l.ptiles / l.nheads;
  const int64_t g = h / l.heads_per_group;
  const int64_t N = l.dstate;
  const bool vec = l.layout == StateUpdateLayout::Vec;
  T* out = static_cast<T*>(l.out);
  const T* x = static_cast<const T*>(l.x);
  const T* z = static_cast<const T*>(l.z);
  const bool dt_f32 = l.dt_el == ElementKind::F32, A_f32 = l.A_el == ElementKind::F32,
             B_f32 = l.B_el == ElementKind::F32, C_f32 = l.C_el == ElementKind::F32,
             D_f32 = l.D_el == ElementKind::F32, bias_f32 = l.dt_bias_el == ElementKind::F32;

  int64_t i = b;
  if (l.has_indices)
    i = l.index_el == ElementKind::I32 ? static_cast<const int32_t*>(l.indices)[b * l.index_s]
                                       : static_cast<const int64_t*>(l.indices)[b * l.index_s];
  const int64_t p_begin = ptile * l.rows_per_pass * l.passes;
  if (i < 0 || i >= l.pool) {
    // A padding row (i < 0): out = 0, the pool untouched (mamba_ssm's rule). An index past
    // the pool cannot raise here: out = NaN, the pool untouched.
    const Acc fill = i < 0 ? Acc(0) : static_cast<Acc>(NAN);
    for (int pass = 0; pass < l.passes; ++pass) {
      const int64_t p = p_begin + pass * l.rows_per_pass + group;
      if (p >= l.headdim || lane != 0) continue;
      for (int64_t t = 0; t < l.tokens; ++t)
        out[b * l.out_s[0] + t * l.out_s[1] + h * l.out_s[2] + p * l.out_s[3]] = from_acc<T>(fill);
    }
    return;
  }

  // B and C of the current token, this lane's elements (one token: loaded once).
  Acc Bv[Chunks][E], Cv[Chunks][E];
  const auto load_bc = [&](int64_t t) {
    const int64_t bo = b * l.B_s[0] + t * l.B_s[1] + g * l.B_s[2];
    const int64_t co = b * l.C_s[0] + t * l.C_s[1] + g * l.C_s[2];
#pragma unroll
    for (int c = 0; c < Chunks; ++c) {
#pragma unroll
      for (int k = 0; k < E; ++k) {
        const int64_t n = (static_cast<int64_t>(c) * lanes + lane) * E + k;
        Bv[c][k] = n < N ? small<T>(l.B, B_f32, bo + n * l.B_s[3]) : Acc(0);
        Cv[c][k] = n < N ? small<T>(l.C, C_f32, co + n * l.C_s[3]) : Acc(0);
      }
    }
  };
  if (l.tokens == 1) load_bc(0);

  S* state = static_cast<S*>(l.state) + i * l.state_s[0] + h * l.state_s[1];
  // This thread's elements of state row p, read and converted.
  const auto load_row = [&](int64_t p, Acc (&s)[Chunks][E]) {
    const S* row = state + p * l.state_s[2];
#pragma unroll
    for (int c = 0; c < Chunks; ++c) {
      const int64_t n0 = (static_cast<int64_t>(c) * lanes + lane) * E;
      if (vec && n0 < N) {  // N % 4 == 0: the vector is whole
        S v[E];
        load4(row + n0, v);
#pragma unroll
        for (int k = 0; k < E; ++k) s[c][k] = static_cast<Acc>(to_acc(v[k]));
      } else {
#pragma unroll
        for (int k = 0; k < E; ++k)
          s[c][k] = n0 + k < N ? static_cast<Acc>(to_acc(row[(n0 + k) * l.state_s[3]])) : Acc(0);
      }
    }
  };
  const auto store_row = [&](int64_t p, const Acc (&s)[Chunks][E]) {
    S* row = state + p * l.state_s[2];
#pragma unroll
    for (int c = 0; c < Chunks; ++c) {
      const int64_t n0 = (static_cast<int64_t>(c) * lanes + lane) * E;
      if (vec && n0 < N) {
        S v[E];
#pragma unroll
        for (int k = 0; k < E; ++k) v[k] = from_acc<S>(s[c][k]);
        store4(row + n0, v);
      } else {
#pragma unroll
        for (int k = 0; k < E; ++k)
          if (n0 + k < N) row[(n0 + k) * l.state_s[3]] = from_acc<S>(s[c][k]);
      }
    }
  };
  // The rows of this thread's group, one a pass; with few chunks a lane, the next row's
  // state is loaded before this row is computed (its loads in flight meanwhile).
  constexpr bool kPrefetch = Chunks <= 2;
  const auto row_of = [&](int pass) { return p_begin + static_cast<int64_t>(pass) * l.rows_per_pass + group; };
  // The values of (row p, token t) that do not depend on n: δ, δ·x and, for a per-row A,
  // exp(A·δ).
  const auto x_of = [&](int64_t p, int64_t t) {
    return static_cast<Acc>(to_acc(x[b * l.x_s[0] + t * l.x_s[1] + h * l.x_s[2] + p * l.x_s[3]]));
  };
  struct RowToken {
    Acc delta, dtx, dA;
  };
  const auto row_token = [&](int64_t p, int64_t t) {
    RowToken r;
    const Acc bias =
        l.has_dt_bias ? small<T>(l.dt_bias, bias_f32, h * l.dt_bias_s[0] + p * l.dt_bias_s[1]) : Acc(0);
    r.delta = state_update_delta(
        small<T>(l.dt, dt_f32, b * l.dt_s[0] + t * l.dt_s[1] + h * l.dt_s[2] + p * l.dt_s[3]) + bias,
        l.dt_softplus);
    r.dtx = r.delta * x_of(p, t);
    r.dA = l.A_per_row && N > 0 ? math_exp(small<T>(l.A, A_f32, h * l.A_s[0] + p * l.A_s[1]) * r.delta) : Acc(0);
    return r;
  };
  // out of (row p, token t) from the sum y over n: + D·x, the gate, rounded once.
  const auto finish = [&](int64_t p, int64_t t, Acc y) {
    if (l.has_D) y += small<T>(l.D, D_f32, h * l.D_s[0] + p * l.D_s[1]) * x_of(p, t);
    if (l.has_z)
      y = state_update_gate(
          y, static_cast<Acc>(to_acc(z[b * l.z_s[0] + t * l.z_s[1] + h * l.z_s[2] + p * l.z_s[3]])));
    out[b * l.out_s[0] + t * l.out_s[1] + h * l.out_s[2] + p * l.out_s[3]] = from_acc<T>(y);
  };
  // lane_scalars: lane q of the group holds pair q = pass·tokens + t's RowToken (computed
  // once, in parallel), the others take it by shuffle, and lane q keeps that pair's sum
  // and writes its out after the passes; else every lane computes each pair's values and
  // lane 0 writes out.
  const bool by_lane = l.lane_scalars;
  RowToken mine{};
  Acc mine_y = 0;
  if (by_lane && lane < l.passes * l.tokens) {
    const int64_t p = row_of(lane / static_cast<int>(l.tokens));
    if (p < l.headdim) mine = row_token(p, lane % l.tokens);
  }
  Acc s[Chunks][E], next[Chunks][E];
  int64_t p = row_of(0);
  if (p < l.headdim) load_row(p, s);
  for (int pass = 0; pass < l.passes && p < l.headdim; ++pass) {
    // (p < headdim for the whole group: its shuffles stay within it; rows ascend with
    // the pass, so the loop ends at the first one past the head.)
    const int64_t pn = row_of(pass + 1);
    const bool more = pass + 1 < l.passes && pn < l.headdim;
    if constexpr (kPrefetch) {
      if (more) load_row(pn, next);
    }
    const int64_t ao = h * l.A_s[0] + p * l.A_s[1];
    for (int64_t t = 0; t < l.tokens; ++t) {
      if (l.tokens > 1) load_bc(t);
      const int q = by_lane ? pass * static_cast<int>(l.tokens) + static_cast<int>(t) : 0;
      RowToken r;
      if (by_lane) {
        r.delta = __shfl_sync(mask, mine.delta, q, lanes);
        r.dtx = __shfl_sync(mask, mine.dtx, q, lanes);
        r.dA = __shfl_sync(mask, mine.dA, q, lanes);
      } else {
        r = row_token(p, t);
      }
      Acc y = 0;
#pragma unroll
      for (int c = 0; c < Chunks; ++c) {
#pragma unroll
        for (int k = 0; k < E; ++k) {
          const int64_t n = (static_cast<int64_t>(c) * lanes + lane) * E + k;
          const Acc dA = l.A_per_row ? r.dA
                         : n < N     ? math_exp(small<T>(l.A, A_f32, ao + n * l.A_s[2]) * r.delta)
                                     : Acc(0);
          s[c][k] = s[c][k] * dA + Bv[c][k] * r.dtx;
          y += s[c][k] * Cv[c][k];
        }
      }
      for (int off = lanes / 2; off > 0; off /= 2) y += __shfl_xor_sync(mask, y, off);
      if (by_lane) {
        if (lane == q) mine_y = y;
      } else if (lane == 0) {
        finish(p, t, y);
      }
    }
    store_row(p, s);
    if (!more) break;
    if constexpr (kPrefetch) {
#pragma unroll
      for (int c = 0; c < Chunks; ++c)
#pragma unroll
        for (int k = 0; k < E; ++k) s[c][k] = next[c][k];
    } else {
      load_row(pn, s);
    }
    p = pn;
  }
  if (by_lane && lane < l.passes * l.tokens) {
    const int64_t pq = row_of(lane / static_cast<int>(l.tokens));
    if (pq < l.headdim) finish(pq, lane % l.tokens, mine_y);
  }
}

template <typename T, typename S>
void launch(const StateUpdateLaunch& l, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(l.grid)), block(kStateUpdateThreads);
  switch (l.chunks) {
    case 1: state_update_kernel<T, S, 1><<<grid, block, 0, stream>>>(l); break;
    case 2: state_update_kernel<T, S, 2><<<grid, block, 0, stream>>>(l); break;
    case 4: state_update_kernel<T, S, 4><<<grid, block, 0, stream>>>(l); break;
    case 8: state_update_kernel<T, S, 8><<<grid, block, 0, stream>>>(l); break;
    default:
      fail(PlanErrorKind::Internal, "selective_state_update",
           "chunks a lane must be 1, 2, 4 or 8, got " + std::to_string(l.chunks));
  }
  cuda::check_launch(l.tokens_op ? "selective_state_update_tokens" : "selective_state_update");
}
}  // namespace

void selective_state_update_cuda(const StateUpdateLaunch& l, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  cuda::dispatch_floating(l.x_el, [&](auto xt) {
    using T = decltype(xt);
    if (l.state_el == l.x_el)
      launch<T, T>(l, s);
    else
      launch<T, float>(l, s);  // the plan allows x's dtype or float32
  });
}

}  // namespace baracuda::kernels
