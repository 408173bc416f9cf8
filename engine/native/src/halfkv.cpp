// float16 / bfloat16 -> float32 for the attention kernel's K/V rows (halfkv.h).
#include "halfkv.h"

#include <cstring>

#include "isa_attrs.h"
#include "strided.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define FORKV_HALF_X86 1
#else
#define FORKV_HALF_X86 0
#endif

namespace forkv {

namespace {

// IEEE binary16 -> binary32 by integer moves only (no float multiply on a subnormal, so a
// denormals-are-zero mode cannot change it): the same bits as vcvtph2ps.
FORKV_INLINE float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, em = h & 0x7fffu;
  uint32_t bits;
  if (em >= 0x7c00u) {  // inf, nan
    bits = 0x7f800000u | ((em & 0x3ffu) << 13);
  } else if (em >= 0x400u) {  // normal: rebias the exponent by 127 - 15
    bits = (em + (112u << 10)) << 13;
  } else {  // zero or subnormal: em * 2^-24, a normal float32 (or zero), exact
    const float f = float(em) * 0x1p-24f;
    std::memcpy(&bits, &f, sizeof bits);
  }
  bits |= sign;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

FORKV_INLINE void bf16_rows(const uint16_t* src, float* dst, int n) {
  for (int i = 0; i < n; ++i) {  // vectorized for the wrapper's ISA
    const uint32_t bits = uint32_t(src[i]) << 16;
    std::memcpy(dst + i, &bits, sizeof bits);
  }
}

void f16_portable(const uint16_t* src, float* dst, int n) {
  for (int i = 0; i < n; ++i) dst[i] = half_to_float(src[i]);
}
void bf16_portable(const uint16_t* src, float* dst, int n) { bf16_rows(src, dst, n); }

#if FORKV_HALF_X86
T512F void f16_512(const uint16_t* src, float* dst, int n) {
  int i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(
                                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}
__attribute__((target("avx2,fma,f16c"))) void f16_256(const uint16_t* src, float* dst, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}
T512F void bf16_512(const uint16_t* src, float* dst, int n) { bf16_rows(src, dst, n); }
T256F void bf16_256(const uint16_t* src, float* dst, int n) { bf16_rows(src, dst, n); }
#endif

}  // namespace

WidenFn widen_fn(KvType type, Isa isa) {
#if FORKV_HALF_X86
  if (type == KvType::float16) return by_isa<WidenFn>(isa, &f16_512, &f16_256, &f16_portable);
  return by_isa<WidenFn>(isa, &bf16_512, &bf16_256, &bf16_portable);
#else
  (void)isa;
  return type == KvType::float16 ? &f16_portable : &bf16_portable;
#endif
}

}  // namespace forkv
