// Target attributes for the float kernels compiled once per ISA from one inlined body: the
// compiler vectorizes the body for the ISA of the wrapper it is inlined into.
#pragma once

#define FORKV_INLINE inline __attribute__((always_inline))
#if defined(__x86_64__) || defined(_M_X64)
#define T512F __attribute__((target("avx512f,avx512vl,avx512dq,fma")))
#define T256F __attribute__((target("avx2,fma")))
#else
#define T512F
#define T256F
#endif
