// Closes the AVX2 section opened by vec_avx2_begin.h.
#if BARACUDA_CPU_AVX2
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
