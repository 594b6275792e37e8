// CPU lerp kernels: the AVX2 kernels of lerp_avx2.cpp for the rows layout of
// float32/float16/bfloat16 on processors with AVX2; otherwise one scalar strided loop for
// every op and layout (the plan's coalesced index
// space makes contiguous inputs a unit-stride inner loop). Outputs are dense over the
// index space, so their offset is the running linear index.
#include "kernels/lerp.h"
#include "kernels/lerp_math.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/loops.h"

namespace baracuda::kernels {

namespace {
using cpu::acc_t;

template <typename T, LerpOp Op>
void run(const LerpLaunch& l) {
  using Acc = acc_t<T>;
  constexpr int NI = kLerpInputs<Op>;
  constexpr int NO = kLerpOutputs<Op>;
  const T* in[NI];
  int64_t step[NI];  // inner stride of each input (0 or 1 on the common paths)
  const int last = l.dims.rank - 1;
  for (int k = 0; k < NI; ++k) {
    in[k] = static_cast<const T*>(l.in[k]);
    step[k] = l.dims.strides[k][last];
  }
  T* out[NO];
  for (int j = 0; j < NO; ++j) out[j] = static_cast<T*>(l.out[j]);
  const LerpScalars<Acc> s{static_cast<Acc>(l.weight), static_cast<Acc>(l.one_minus_w)};

  int64_t numel = 1;
  for (int d = 0; d < l.dims.rank; ++d) numel *= l.dims.sizes[d];
  at::parallel_for(0, numel, cpu::kGrain, [&](int64_t begin, int64_t end) {
    int64_t o = begin;  // linear index = offset in every output
    cpu::for_each_run<NI>(l.dims, begin, end, [&](const int64_t* off, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        Acc x[NI], y[NO];
        for (int k = 0; k < NI; ++k) x[k] = static_cast<Acc>(in[k][off[k] + i * step[k]]);
        lerp_element<Op>(x, s, y);
        for (int j = 0; j < NO; ++j) out[j][o + i] = T(y[j]);
      }
      o += n;
    });
  });
}

template <typename T>
void dispatch_op(const LerpLaunch& l) {
  switch (l.op) {
    case LerpOp::Forward: run<T, LerpOp::Forward>(l); break;
    case LerpOp::ForwardTensor: run<T, LerpOp::ForwardTensor>(l); break;
    case LerpOp::Backward: run<T, LerpOp::Backward>(l); break;
    case LerpOp::BackwardTensor: run<T, LerpOp::BackwardTensor>(l); break;
  }
}
}  // namespace

void lerp_cpu(const LerpLaunch& l) {
  if (cpu::cpu_has_avx2() && cpu::lerp_avx2(l)) return;
  cpu::dispatch_floating(l.element, [&](auto tag) { dispatch_op<decltype(tag)>(l); });
}

}  // namespace baracuda::kernels
