// CUDA selective state update (core/selective_state_update_plan.h has the formulas and
// the work split). A block owns one (batch, head) and a slice of its head_dim rows; a row
// of the state (N elements) belongs to a group of `lanes` threads, each holding
// kStateUpdateLaneElems consecutive elements in each of `Chunks` chunks in registers: the
// row is read once, updated for every token, and written once. The sum over N is each
// thread's elements in order, then a butterfly over the group's lanes (fixed order:
// deterministic). B and C of the block's (batch, group) are the same for all its rows:
// with one token they are loaded once a block, into registers. A group walks its rows one
// a pass. Where the plan stages them (stage_bytes: Mamba-2's per-head A on the vector
// layout), the block first copies all its state rows into shared memory by cp.async, so
// that every row's loads are in flight at once; otherwise, with up to 2 chunks a lane, a
// group loads the next row's state before computing the current one (two rows' loads in
// flight a warp). Measured on an H200 at B64 H80 P64 N128 (bf16 x, float32 state;
// BENCHMARKS.md): the every-lane path 200 µs a step; a lane per (row, token) pair's
// values that do not depend on n (δ with its softplus, exp(A·δ), D, z, the store of out;
// the plan's lane_scalars, the others take them by shuffle) 143; the lanes and the
// per-row A compiled in (no divergence check per shuffle, no branch per element) 139;
// staged 120 (ncu: 72 registers, 7 blocks a multiprocessor, 45 % of DRAM bandwidth, 0.71
// warps issued a scheduler cycle against mamba_ssm's 0.86 at 30 registers, for about as
// many instructions); staged with one cp.async group a pass, and the decode step's
// options compiled out (Lean: 48 registers, 10 blocks a multiprocessor) 95 (89.5 from a
// CUDA graph, mamba_ssm 95.6). At batch 1 with one pass a block (1280 blocks, one wave),
// with B and C loaded as one vector a lane each (the plan's bc_vec), ncu counted 7.3 µs
// against mamba_ssm's 5.0 (caches flushed; 8.9 with scalar B and C loads) and 2.1 times
// its instructions; two passes a block (the plan's rule since) take it from 4.6 µs to 4.0
// from a CUDA graph, and every per-row operand loaded before the softplus to 3.6-3.7,
// against mamba_ssm's 3.0-3.1: what is left. The whole-tiles kernel (the plan's
// whole_tiles, below) is that lean kernel without a bounds test, its passes and d_state
// compiled in: 329 SASS instructions (static, NOPs left out) in the bf16 kernel of 2 passes
// against the lean kernel's 726, every global load issued before the first wait; from a
// CUDA graph on an H100, B1 3.10-3.30 µs against 3.76-3.95 (mamba_ssm 3.12-3.17), B8 9.9
// against 11.1 (mamba_ssm 12.8-12.9).
// No workspace, no host synchronization: the launch can be captured in a CUDA graph.
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
  // (one vector store each: assigned as a uint4, the float state's 16 bytes were stored
  // as four 4-byte stores)
  uint32_t r[bytes / 4];
  memcpy(r, v, bytes);
  if constexpr (bytes == 8) {
    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(r[0]), "r"(r[1]) : "memory");
  } else {
#pragma unroll
    for (int i = 0; i < bytes / 16; ++i)
      asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(reinterpret_cast<char*>(p) + 16 * i), "r"(r[4 * i]),
                   "r"(r[4 * i + 1]), "r"(r[4 * i + 2]), "r"(r[4 * i + 3])
                   : "memory");
  }
}

// E state elements (8, 16 or 32 bytes) from global to shared memory by cp.async: no
// register holds them while they are in flight.
template <typename S>
__device__ __forceinline__ void stage4(S* smem, const S* p) {
  constexpr int bytes = static_cast<int>(sizeof(S)) * E;
  const auto dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  if constexpr (bytes == 8) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(p) : "memory");
  } else {
#pragma unroll
    for (int i = 0; i < bytes / 16; ++i)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + 16 * i),
                   "l"(reinterpret_cast<const char*>(p) + 16 * i)
                   : "memory");
  }
}

// Waits until at most n of this thread's cp.async groups are still in flight (n clamped to
// 0..7: wait_group takes an immediate).
__device__ __forceinline__ void wait_pending(int n) {
  switch (n <= 0 ? 0 : n >= 7 ? 7 : n) {
    case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
  }
}

// Blocks a multiprocessor the kernel's registers are sized for: 7 for 1 chunk a lane with
// float arithmetic (at 72 registers), 10 for the lean staged kernel (48 registers, no
// spills for 16-bit or float32 x on sm_90a).
template <typename T, int Chunks, bool Lean>
constexpr int state_update_min_blocks() {
  if (Chunks != 1 || sizeof(acc_t<T>) != 4) return 1;
  return Lean ? kStateUpdateLeanBlocks : 7;
}

// T: x's dtype; S: the state's (T or float); Lanes: threads a row (the plan's lanes, 4 to
// 32); Chunks: chunks a lane (a power of two up to kStateUpdateMaxChunks; above 1 only
// with 32 lanes). Lanes is a template argument so that the shuffles' width and mask are
// constants: as a launch value, each shuffle paid a divergence check (MATCH, REDUX, VOTE)
// and the butterfly a loop. Staged (the plan's stage_bytes: vector layout, A per row, the
// block's rows fit in shared memory): the block's state rows are copied into shared memory
// at its start, all of them in flight at once, and each thread reads back only what it
// copied (no barrier; one cp.async group a pass, so that the first pass computes while the
// later ones land); otherwise rows are read from global memory, the next one while the
// current one is computed. Lean (the plan's `lean`, staged only): one token, no z, no
// batch indices and lane scalars (at any number of passes) compiled in, which frees
// registers for more blocks, and 32-bit offsets (the plan checks that they reach every
// element; on sm_90a 728 instructions in the bf16 kernel against 856 with 64-bit ones).
// The grid's divisors (a block's index is (batch, head, row tile), row tile innermost; a
// head's group is head / heads_per_group) as multiply-shifts: three 32-bit divisions were
// about 50 instructions of a lean block's few hundred.
struct StateUpdateGrid {
  cuda::FastDivmod ptiles, nheads, hpg;
};

template <typename T, typename S, int Lanes, int Chunks, bool Staged, bool Lean>
__global__ __launch_bounds__(kStateUpdateThreads, (state_update_min_blocks<T, Chunks, Lean>()))
    void state_update_kernel(const StateUpdateLaunch l, const StateUpdateGrid grid) {
  static_assert(!Lean || (Staged && Chunks == 1), "the lean kernel is a staged one of 1 chunk a lane");
  using Acc = acc_t<T>;
  // Offsets: 32-bit in the lean kernel (the plan checks that every operand's fit), 64-bit
  // otherwise (a 64-bit multiply-add is several instructions on the path to every load).
  using Idx = std::conditional_t<Lean, int32_t, int64_t>;
  constexpr int lanes = Lanes;
  const int group = static_cast<int>(threadIdx.x) / lanes;
  const int lane = static_cast<int>(threadIdx.x) % lanes;
  // The shuffle mask of this thread's group within its warp.
  const unsigned mask = lanes == 32 ? 0xffffffffu
                                    : ((1u << lanes) - 1u) << ((threadIdx.x % 32) / lanes * lanes);
  // (32-bit: the plan keeps the grid below 2^31 blocks; 64-bit divisions are subroutine
  // calls on the path to every load)
  uint32_t rest = blockIdx.x;
  const Idx ptile = cuda::peel_coord<uint32_t>(rest, grid.ptiles, static_cast<uint32_t>(l.ptiles));
  const uint32_t h32 = cuda::peel_coord<uint32_t>(rest, grid.nheads, static_cast<uint32_t>(l.nheads));
  const Idx b = rest, h = h32;
  const Idx g = grid.hpg.div(h32);
  const Idx N = Idx(l.dstate);
  const bool vec = Staged || l.layout == StateUpdateLayout::Vec;
  const bool row_a = Staged || l.A_per_row;
  const Idx tokens = Lean ? 1 : Idx(l.tokens);
  const bool has_z = !Lean && l.has_z, by_lane = Lean || l.lane_scalars;
  T* out = static_cast<T*>(l.out);
  const T* x = static_cast<const T*>(l.x);
  const T* z = static_cast<const T*>(l.z);
  const bool dt_f32 = l.dt_el == ElementKind::F32, A_f32 = l.A_el == ElementKind::F32,
             B_f32 = l.B_el == ElementKind::F32, C_f32 = l.C_el == ElementKind::F32,
             D_f32 = l.D_el == ElementKind::F32, bias_f32 = l.dt_bias_el == ElementKind::F32;

  Idx i = b;
  if (!Lean && l.has_indices)
    i = l.index_el == ElementKind::I32 ? static_cast<const int32_t*>(l.indices)[b * Idx(l.index_s)]
                                       : static_cast<Idx>(static_cast<const int64_t*>(l.indices)[b * Idx(l.index_s)]);
  const Idx p_begin = ptile * l.rows_per_pass * l.passes;
  const auto row_of = [&](int pass) { return p_begin + static_cast<Idx>(pass) * l.rows_per_pass + group; };
  if (!Lean && (i < 0 || i >= l.pool)) {  // (no indices in the lean kernel: i = b < pool)
    // A padding row (i < 0): out = 0, the pool untouched (mamba_ssm's rule). An index past
    // the pool cannot raise here: out = NaN, the pool untouched.
    const Acc fill = i < 0 ? Acc(0) : static_cast<Acc>(NAN);
    for (int pass = 0; pass < l.passes; ++pass) {
      const Idx p = row_of(pass);
      if (p >= Idx(l.headdim) || lane != 0) continue;
      for (Idx t = 0; t < tokens; ++t)
        out[b * Idx(l.out_s[0]) + t * Idx(l.out_s[1]) + h * Idx(l.out_s[2]) + p * Idx(l.out_s[3])] = from_acc<T>(fill);
    }
    return;
  }

  // Several tokens (the plan's bc_bytes): B and C of every token, converted to Acc, in
  // shared memory after the staged rows ([tokens][B, C][N]), copied once by the block;
  // every (pass, token) pair reads its values from there. (Read from global memory for
  // each pair, converting and indexing each element, B64 T4 at the 2.7B shape was
  // instruction-bound: 470 µs, against 385 for 4 single steps.)
  extern __shared__ __align__(16) unsigned char state_update_smem[];
  Acc* const sbc = reinterpret_cast<Acc*>(state_update_smem + l.stage_bytes);
  const bool bc_staged = !Lean && l.bc_bytes > 0;
  if (bc_staged) {
    const uint32_t n32 = static_cast<uint32_t>(N), count = static_cast<uint32_t>(tokens) * 2u * n32;
    for (uint32_t e = threadIdx.x; e < count; e += kStateUpdateThreads) {
      const uint32_t tc = e / n32, n = e - tc * n32, t = tc / 2u;
      sbc[e] = tc % 2u == 0u ? small<T>(l.B, B_f32, b * Idx(l.B_s[0]) + t * Idx(l.B_s[1]) + g * Idx(l.B_s[2]) + n * Idx(l.B_s[3]))
                             : small<T>(l.C, C_f32, b * Idx(l.C_s[0]) + t * Idx(l.C_s[1]) + g * Idx(l.C_s[2]) + n * Idx(l.C_s[3]));
    }
    __syncthreads();
  }
  // B and C of the current token, this lane's elements (one token: loaded once).
  Acc Bv[Chunks][E], Cv[Chunks][E];
  const auto load_bc = [&](Idx t) {
    if (bc_staged) {
      const Acc* bt = sbc + t * 2 * N;
#pragma unroll
      for (int c = 0; c < Chunks; ++c) {
#pragma unroll
        for (int k = 0; k < E; ++k) {
          const Idx n = (static_cast<Idx>(c) * lanes + lane) * E + k;
          Bv[c][k] = n < N ? bt[n] : Acc(0);
          Cv[c][k] = n < N ? bt[N + n] : Acc(0);
        }
      }
      return;
    }
    const Idx bo = b * Idx(l.B_s[0]) + t * Idx(l.B_s[1]) + g * Idx(l.B_s[2]);
    const Idx co = b * Idx(l.C_s[0]) + t * Idx(l.C_s[1]) + g * Idx(l.C_s[2]);
    if constexpr (Lean && sizeof(T) <= 4) {
      if (l.bc_vec) {  // B and C of x's dtype, a lane's elements one aligned vector each
        const Idx n0 = static_cast<Idx>(lane) * E;
        T bv[E], cv[E];
        if (n0 < N) {
          load4(static_cast<const T*>(l.B) + bo + n0, bv);
          load4(static_cast<const T*>(l.C) + co + n0, cv);
        }
#pragma unroll
        for (int k = 0; k < E; ++k) {
          Bv[0][k] = n0 < N ? static_cast<Acc>(to_acc(bv[k])) : Acc(0);
          Cv[0][k] = n0 < N ? static_cast<Acc>(to_acc(cv[k])) : Acc(0);
        }
        return;
      }
    }
#pragma unroll
    for (int c = 0; c < Chunks; ++c) {
#pragma unroll
      for (int k = 0; k < E; ++k) {
        const Idx n = (static_cast<Idx>(c) * lanes + lane) * E + k;
        Bv[c][k] = n < N ? small<T>(l.B, B_f32, bo + n * Idx(l.B_s[3])) : Acc(0);
        Cv[c][k] = n < N ? small<T>(l.C, C_f32, co + n * Idx(l.C_s[3])) : Acc(0);
      }
    }
  };
  if (tokens == 1) load_bc(0);

  S* state = static_cast<S*>(l.state) + i * Idx(l.state_s[0]) + h * Idx(l.state_s[1]);
  S* const stage = reinterpret_cast<S*>(state_update_smem);  // [passes][rows_per_pass][N]
  int staged_passes = 0;  // cp.async groups this thread committed, one a pass
  if constexpr (Staged) {
    for (int pass = 0; pass < l.passes; ++pass) {
      const Idx p = row_of(pass);
      if (p >= Idx(l.headdim)) break;
#pragma unroll
      for (int c = 0; c < Chunks; ++c) {
        const Idx n0 = (static_cast<Idx>(c) * lanes + lane) * E;
        if (n0 < N) stage4(stage + (pass * l.rows_per_pass + group) * N + n0, state + p * Idx(l.state_s[2]) + n0);
      }
      asm volatile("cp.async.commit_group;" ::: "memory");
      ++staged_passes;
    }
  }
  // This thread's elements of state row p (of pass `pass`), read and converted.
  const auto load_row = [&](Idx p, int pass, Acc (&s)[Chunks][E]) {
    if constexpr (Staged) wait_pending(staged_passes - pass - 1);  // this pass's copies landed
    const S* row = Staged ? stage + (pass * l.rows_per_pass + group) * N : state + p * Idx(l.state_s[2]);
#pragma unroll
    for (int c = 0; c < Chunks; ++c) {
      const Idx n0 = (static_cast<Idx>(c) * lanes + lane) * E;
      if (vec) {  // N % 4 == 0: a vector is whole or past N
        S v[E];
        if (n0 < N) load4(row + n0, v);
#pragma unroll
        for (int k = 0; k < E; ++k) s[c][k] = n0 < N ? static_cast<Acc>(to_acc(v[k])) : Acc(0);
      } else {
#pragma unroll
        for (int k = 0; k < E; ++k)
          s[c][k] = n0 + k < N ? static_cast<Acc>(to_acc(row[(n0 + k) * Idx(l.state_s[3])])) : Acc(0);
      }
    }
  };
  const auto store_row = [&](Idx p, const Acc (&s)[Chunks][E]) {
    S* row = state + p * Idx(l.state_s[2]);
#pragma unroll
    for (int c = 0; c < Chunks; ++c) {
      const Idx n0 = (static_cast<Idx>(c) * lanes + lane) * E;
      if (vec) {
        S v[E];
#pragma unroll
        for (int k = 0; k < E; ++k) v[k] = from_acc<S>(s[c][k]);
        if (n0 < N) store4(row + n0, v);
      } else {
#pragma unroll
        for (int k = 0; k < E; ++k)
          if (n0 + k < N) row[(n0 + k) * Idx(l.state_s[3])] = from_acc<S>(s[c][k]);
      }
    }
  };
  // The rows of this thread's group, one a pass; unstaged with few chunks a lane, the next
  // row's state is loaded before this row is computed (its loads in flight meanwhile).
  constexpr bool kPrefetch = !Staged && Chunks <= 2;
  // The values of (row p, token t) that do not depend on n: δ, δ·x, for a per-row A
  // exp(A·δ), and what out adds after the sum (D·x, z), all loaded before the row's state
  // is computed (loaded by the lane that writes out after the butterfly, they were a
  // second round trip to memory on the path of every block).
  struct RowToken {
    Acc delta, dtx, dA, Dx, z;
  };
  // (Every operand is loaded before any is used: with the loads written between the
  // softplus and the exp, as the formulas read, ptxas issued x's, A's and D's only after
  // the softplus's branch, a second round trip to memory on the path of every block.)
  const auto row_token = [&](Idx p, Idx t) {
    const Acc bias =
        l.has_dt_bias ? small<T>(l.dt_bias, bias_f32, h * Idx(l.dt_bias_s[0]) + p * Idx(l.dt_bias_s[1])) : Acc(0);
    const Acc dt = small<T>(l.dt, dt_f32, b * Idx(l.dt_s[0]) + t * Idx(l.dt_s[1]) + h * Idx(l.dt_s[2]) + p * Idx(l.dt_s[3]));
    const Acc xv = static_cast<Acc>(to_acc(x[b * Idx(l.x_s[0]) + t * Idx(l.x_s[1]) + h * Idx(l.x_s[2]) + p * Idx(l.x_s[3])]));
    const Acc a = row_a && N > 0 ? small<T>(l.A, A_f32, h * Idx(l.A_s[0]) + p * Idx(l.A_s[1])) : Acc(0);
    const Acc d = l.has_D ? small<T>(l.D, D_f32, h * Idx(l.D_s[0]) + p * Idx(l.D_s[1])) : Acc(0);
    const Acc zv =
        has_z ? static_cast<Acc>(to_acc(z[b * Idx(l.z_s[0]) + t * Idx(l.z_s[1]) + h * Idx(l.z_s[2]) + p * Idx(l.z_s[3])])) : Acc(0);
    RowToken r;
    r.delta = state_update_delta(dt + bias, l.dt_softplus);
    r.dtx = r.delta * xv;
    r.dA = row_a && N > 0 ? math_exp(a * r.delta) : Acc(0);
    r.Dx = l.has_D ? d * xv : Acc(0);  // (without D, 0 even where x is Inf or NaN, as before)
    r.z = zv;
    return r;
  };
  // out of (row p, token t) from the sum y over n: + D·x, the gate, rounded once.
  const auto finish = [&](Idx p, Idx t, Acc y, const RowToken& r) {
    y += r.Dx;
    if (has_z) y = state_update_gate(y, r.z);
    out[b * Idx(l.out_s[0]) + t * Idx(l.out_s[1]) + h * Idx(l.out_s[2]) + p * Idx(l.out_s[3])] = from_acc<T>(y);
  };
  // lane_scalars: lane q of the group holds pair q = pass·tokens + t's RowToken (computed
  // once, in parallel), the others take it by shuffle, and lane q keeps that pair's sum
  // and writes its out after the passes; else every lane computes each pair's values and
  // lane 0 writes out.
  RowToken mine{};
  Acc mine_y = 0;
  if (by_lane && lane < l.passes * tokens) {
    const Idx p = row_of(lane / static_cast<int>(tokens));
    if (p < Idx(l.headdim)) mine = row_token(p, lane % tokens);
  }
  Acc s[Chunks][E], next[Chunks][E];
  Idx p = row_of(0);
  if (p < Idx(l.headdim)) load_row(p, 0, s);
  for (int pass = 0; pass < l.passes && p < Idx(l.headdim); ++pass) {
    // (p < headdim for the whole group: its shuffles stay within it; rows ascend with
    // the pass, so the loop ends at the first one past the head.)
    const Idx pn = row_of(pass + 1);
    const bool more = pass + 1 < l.passes && pn < Idx(l.headdim);
    if constexpr (kPrefetch) {
      if (more) load_row(pn, pass + 1, next);
    }
    const Idx ao = h * Idx(l.A_s[0]) + p * Idx(l.A_s[1]);
    for (Idx t = 0; t < tokens; ++t) {
      if (tokens > 1) load_bc(t);
      const int q = by_lane ? pass * static_cast<int>(tokens) + static_cast<int>(t) : 0;
      RowToken r;
      if (by_lane) {
        r.delta = __shfl_sync(mask, mine.delta, q, lanes);
        r.dtx = __shfl_sync(mask, mine.dtx, q, lanes);
        r.dA = __shfl_sync(mask, mine.dA, q, lanes);
      } else {
        r = row_token(p, t);
      }
      Acc y = 0;
      // (the A test outside the element loop: inside it, each element paid a branch)
      if (row_a) {
#pragma unroll
        for (int c = 0; c < Chunks; ++c)
#pragma unroll
          for (int k = 0; k < E; ++k) {
            s[c][k] = s[c][k] * r.dA + Bv[c][k] * r.dtx;
            y += s[c][k] * Cv[c][k];
          }
      } else {
#pragma unroll
        for (int c = 0; c < Chunks; ++c)
#pragma unroll
          for (int k = 0; k < E; ++k) {
            const Idx n = (static_cast<Idx>(c) * lanes + lane) * E + k;
            const Acc dA = n < N ? math_exp(small<T>(l.A, A_f32, ao + n * Idx(l.A_s[2])) * r.delta) : Acc(0);
            s[c][k] = s[c][k] * dA + Bv[c][k] * r.dtx;
            y += s[c][k] * Cv[c][k];
          }
      }
#pragma unroll
      for (int off = lanes / 2; off > 0; off /= 2) y += __shfl_xor_sync(mask, y, off);
      if (by_lane) {
        if (lane == q) mine_y = y;
      } else if (lane == 0) {
        finish(p, t, y, r);
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
      load_row(pn, pass + 1, s);
    }
    p = pn;
  }
  if (by_lane && lane < l.passes * tokens) {
    const Idx pq = row_of(lane / static_cast<int>(tokens));
    if (pq < Idx(l.headdim)) finish(pq, lane % tokens, mine_y, mine);
  }
}

// The lean kernel on whole tiles (the plan's whole_tiles: d_state = Lanes · 4, head_dim a
// multiple of the block's rows, B and C vectors of x's dtype T): no bounds test anywhere,
// Passes and d_state compiled in, and every global load issued at the block's start in
// this order: the state rows' cp.async (one group a pass), B and C (raw, converted after),
// then lane q's row values for pass q (dt, dt_bias, x, A, D). The arithmetic and its order
// are the lean kernel's: the same bits.
template <typename T, typename S, int Lanes, int Passes>
__global__ __launch_bounds__(kStateUpdateThreads, kStateUpdateLeanBlocks)
    void state_update_whole_kernel(const StateUpdateLaunch l, const StateUpdateGrid grid) {
  static_assert(sizeof(acc_t<T>) == 4 && Passes <= Lanes, "16-bit or float32 x; a lane a pass");
  using Acc = float;
  constexpr int kRows = kStateUpdateThreads / Lanes;  // rows a pass
  constexpr int N = Lanes * E;
  const int group = static_cast<int>(threadIdx.x) / Lanes;
  const int lane = static_cast<int>(threadIdx.x) % Lanes;
  const unsigned mask = Lanes == 32 ? 0xffffffffu : ((1u << Lanes) - 1u) << ((threadIdx.x % 32) / Lanes * Lanes);
  uint32_t rest = blockIdx.x;
  const int32_t ptile = static_cast<int32_t>(cuda::peel_coord<uint32_t>(rest, grid.ptiles, static_cast<uint32_t>(l.ptiles)));
  const uint32_t h32 = cuda::peel_coord<uint32_t>(rest, grid.nheads, static_cast<uint32_t>(l.nheads));
  const int32_t b = static_cast<int32_t>(rest), h = static_cast<int32_t>(h32);
  const int32_t g = static_cast<int32_t>(grid.hpg.div(h32));
  const int32_t p0 = ptile * (kRows * Passes) + group;  // this group's row of pass 0
  const int32_t n0 = lane * E;

  extern __shared__ __align__(16) unsigned char state_update_smem[];
  S* const stage = reinterpret_cast<S*>(state_update_smem);  // [Passes][kRows][N]
  S* const state = static_cast<S*>(l.state) + b * int32_t(l.state_s[0]) + h * int32_t(l.state_s[1]);
  const int32_t srow = int32_t(l.state_s[2]);
#pragma unroll
  for (int k = 0; k < Passes; ++k) {
    stage4(stage + (k * kRows + group) * N + n0, state + (p0 + k * kRows) * srow + n0);
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  T braw[E], craw[E];
  load4(static_cast<const T*>(l.B) + b * int32_t(l.B_s[0]) + g * int32_t(l.B_s[2]) + n0, braw);
  load4(static_cast<const T*>(l.C) + b * int32_t(l.C_s[0]) + g * int32_t(l.C_s[2]) + n0, craw);
  // lane q < Passes: the values of pass q's row (StateUpdateLaunch::lane_scalars)
  Acc dt = 0, bias = 0, xv = 0, a = 0, d = 0;
  const int32_t pq = p0 + lane * kRows;
  if (lane < Passes) {
    const bool dt_f32 = l.dt_el == ElementKind::F32, A_f32 = l.A_el == ElementKind::F32,
               D_f32 = l.D_el == ElementKind::F32, bias_f32 = l.dt_bias_el == ElementKind::F32;
    dt = small<T>(l.dt, dt_f32, b * int32_t(l.dt_s[0]) + h * int32_t(l.dt_s[2]) + pq * int32_t(l.dt_s[3]));
    if (l.has_dt_bias)
      bias = small<T>(l.dt_bias, bias_f32, h * int32_t(l.dt_bias_s[0]) + pq * int32_t(l.dt_bias_s[1]));
    xv = static_cast<Acc>(to_acc(static_cast<const T*>(l.x)[b * int32_t(l.x_s[0]) + h * int32_t(l.x_s[2]) +
                                                              pq * int32_t(l.x_s[3])]));
    a = small<T>(l.A, A_f32, h * int32_t(l.A_s[0]) + pq * int32_t(l.A_s[1]));
    if (l.has_D) d = small<T>(l.D, D_f32, h * int32_t(l.D_s[0]) + pq * int32_t(l.D_s[1]));
  }
  const Acc my_delta = state_update_delta(dt + bias, l.dt_softplus);
  const Acc my_dtx = my_delta * xv, my_dA = math_exp(a * my_delta);
  const Acc my_Dx = l.has_D ? d * xv : Acc(0);
  Acc Bv[E], Cv[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    Bv[e] = static_cast<Acc>(to_acc(braw[e]));
    Cv[e] = static_cast<Acc>(to_acc(craw[e]));
  }
  Acc my_y = 0;
#pragma unroll
  for (int k = 0; k < Passes; ++k) {
    wait_pending(Passes - 1 - k);  // pass k's copies landed (a constant once unrolled)
    const Acc dtx = __shfl_sync(mask, my_dtx, k, Lanes);
    const Acc dA = __shfl_sync(mask, my_dA, k, Lanes);
    S v[E];
    load4(stage + (k * kRows + group) * N + n0, v);
    Acc y = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const Acc s = static_cast<Acc>(to_acc(v[e])) * dA + Bv[e] * dtx;
      y += s * Cv[e];
      v[e] = from_acc<S>(s);
    }
    store4(state + (p0 + k * kRows) * srow + n0, v);
#pragma unroll
    for (int off = Lanes / 2; off > 0; off /= 2) y += __shfl_xor_sync(mask, y, off);
    if (lane == k) my_y = y;
  }
  if (lane < Passes)
    static_cast<T*>(l.out)[b * int32_t(l.out_s[0]) + h * int32_t(l.out_s[2]) + pq * int32_t(l.out_s[3])] =
        from_acc<T>(my_y + my_Dx);
}

// The launch's grid divisors (StateUpdateGrid), for both kernels.
StateUpdateGrid grid_divisors(const StateUpdateLaunch& l) {
  return {cuda::FastDivmod(static_cast<uint32_t>(l.ptiles)), cuda::FastDivmod(static_cast<uint32_t>(l.nheads)),
          cuda::FastDivmod(static_cast<uint32_t>(l.heads_per_group))};
}

// One (lanes, chunks) key's kernels: unstaged, staged, or the lean staged one.
template <typename T, typename S, int Lanes, int Chunks>
void launch_key(const StateUpdateLaunch& l, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(l.grid)), block(kStateUpdateThreads);
  const StateUpdateGrid div = grid_divisors(l);
  if (l.stage_bytes == 0) {
    state_update_kernel<T, S, Lanes, Chunks, false, false><<<grid, block, l.bc_bytes, stream>>>(l, div);
  } else if constexpr (Chunks == 1) {
    if (l.lean)
      state_update_kernel<T, S, Lanes, 1, true, true><<<grid, block, l.stage_bytes + l.bc_bytes, stream>>>(l, div);
    else
      state_update_kernel<T, S, Lanes, 1, true, false><<<grid, block, l.stage_bytes + l.bc_bytes, stream>>>(l, div);
  } else {
    state_update_kernel<T, S, Lanes, Chunks, true, false><<<grid, block, l.stage_bytes + l.bc_bytes, stream>>>(l, div);
  }
}

// The whole-tiles kernel of (Lanes, passes) (the launch checked lanes 16 or 32 and passes
// 1, 2, 4 or 8).
template <typename T, typename S, int Lanes>
void launch_whole(const StateUpdateLaunch& l, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(l.grid)), block(kStateUpdateThreads);
  const StateUpdateGrid div = grid_divisors(l);
  switch (l.passes) {
    case 1: state_update_whole_kernel<T, S, Lanes, 1><<<grid, block, l.stage_bytes, stream>>>(l, div); break;
    case 2: state_update_whole_kernel<T, S, Lanes, 2><<<grid, block, l.stage_bytes, stream>>>(l, div); break;
    case 4: state_update_whole_kernel<T, S, Lanes, 4><<<grid, block, l.stage_bytes, stream>>>(l, div); break;
    default: state_update_whole_kernel<T, S, Lanes, 8><<<grid, block, l.stage_bytes, stream>>>(l, div); break;
  }
}

template <typename T, typename S>
void launch(const StateUpdateLaunch& l, cudaStream_t stream) {
  const char* op = l.tokens_op ? "selective_state_update_tokens" : "selective_state_update";
  if (l.stage_bytes > 0 &&
      (l.layout != StateUpdateLayout::Vec || !l.A_per_row || l.stage_bytes > kStateUpdateMaxStage ||
       l.stage_bytes < static_cast<int64_t>(l.rows_per_pass) * l.passes * l.dstate * static_cast<int64_t>(sizeof(S))))
    fail(PlanErrorKind::Internal, op,
         "a staged launch needs the vector layout, a per-row A and shared memory for the block's rows");
  if (l.bc_bytes > 0 &&
      (l.tokens < 2 || l.lean || l.stage_bytes % 16 != 0 || l.stage_bytes + l.bc_bytes > kStateUpdateMaxStage ||
       l.bc_bytes < l.tokens * 2 * l.dstate * static_cast<int64_t>(sizeof(acc_t<T>))))
    fail(PlanErrorKind::Internal, op,
         "staged B and C need several tokens, room for them after the state rows and no lean kernel");
  if (l.lean && (l.stage_bytes == 0 || l.chunks != 1 || l.tokens != 1 || l.passes > l.lanes || l.has_z ||
                 l.has_indices))
    fail(PlanErrorKind::Internal, op,
         "a lean launch needs a staged one of 1 chunk a lane, one token, at most one pass a lane and no z or "
         "batch indices");
  if (l.whole_tiles) {
    if (!l.lean || !l.bc_vec || (l.lanes != 16 && l.lanes != 32) || l.dstate != int64_t{l.lanes} * E ||
        (l.passes != 1 && l.passes != 2 && l.passes != 4 && l.passes != 8) ||
        l.headdim % (int64_t{l.rows_per_pass} * l.passes) != 0 ||
        l.stage_bytes < int64_t{l.rows_per_pass} * l.passes * l.dstate * static_cast<int64_t>(sizeof(S)))
      fail(PlanErrorKind::Internal, op,
           "a whole-tiles launch needs a lean one with vector B and C, d_state = lanes · 4 with 16 or 32 lanes, "
           "1, 2, 4 or 8 passes and head_dim a multiple of the block's rows");
    if constexpr (sizeof(acc_t<T>) == 4) {
      if (l.lanes == 16)
        launch_whole<T, S, 16>(l, stream);
      else
        launch_whole<T, S, 32>(l, stream);
      cuda::check_launch(op);
      return;
    } else {
      fail(PlanErrorKind::Internal, op, "a whole-tiles launch needs 16-bit or float32 x");
    }
  }
  switch (l.lanes * 16 + l.chunks) {
    case 4 * 16 + 1: launch_key<T, S, 4, 1>(l, stream); break;
    case 8 * 16 + 1: launch_key<T, S, 8, 1>(l, stream); break;
    case 16 * 16 + 1: launch_key<T, S, 16, 1>(l, stream); break;
    case 32 * 16 + 1: launch_key<T, S, 32, 1>(l, stream); break;
    case 32 * 16 + 2: launch_key<T, S, 32, 2>(l, stream); break;
    case 32 * 16 + 4: launch_key<T, S, 32, 4>(l, stream); break;
    case 32 * 16 + 8: launch_key<T, S, 32, 8>(l, stream); break;
    default:
      fail(PlanErrorKind::Internal, op,
           "lanes a row and chunks a lane must be 4, 8, 16 or 32 with 1 chunk, or 32 with 2, 4 or 8; got " +
               std::to_string(l.lanes) + " and " + std::to_string(l.chunks));
  }
  cuda::check_launch(op);
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
