// CUDA gather forward: out[p] = src[offset(p) + index[p]·src.stride(dim)], 0 (and an
// error record) where index[p] is out of range: the index-space walker (gather.cuh) or,
// along a non-innermost dim of a large src, the column-slab kernel (gather_slab.cuh).
// Also the family's CUDA entry point.
#include "kernels/cuda/gather_slab.cuh"

namespace baracuda::kernels {

namespace cuda {
void launch_gather_backward(const GatherLaunch& l, cudaStream_t stream);

namespace {
template <typename Idx>
void launch_forward(const GatherLaunch& l, cudaStream_t stream) {
  const GatherWalkParams<Idx> p = make_walk_params<Idx>(l);
  dispatch_floating(l.element, [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(l.index_element, [&](auto index_tag) {
      launch_walk<T, decltype(index_tag), Idx, WalkMode::Forward>(l, p, stream);
    });
  });
  check_launch("gather");
}
}  // namespace
}  // namespace cuda

void gather_cuda(const GatherLaunch& l, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (l.backward) {
    cuda::launch_gather_backward(l, s);
  } else if (l.numel > 0 && is_slab(l.layout)) {
    if (l.index64)
      cuda::launch_slab_forward<int64_t>(l, s);
    else
      cuda::launch_slab_forward<uint32_t>(l, s);
  } else if (l.numel > 0) {
    if (l.index64)
      cuda::launch_forward<int64_t>(l, s);
    else
      cuda::launch_forward<uint32_t>(l, s);
  }
}

}  // namespace baracuda::kernels
