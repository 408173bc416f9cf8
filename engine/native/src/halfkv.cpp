// float16 / bfloat16 / q8_0 <-> float32 for the attention kernel's K/V rows (halfkv.h).
#include "halfkv.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "mlx/types/half_types.h"

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

FORKV_INLINE void bf16_rows(const uint8_t* bytes, float* dst, int n) {
  const auto* src = reinterpret_cast<const uint16_t*>(bytes);
  for (int i = 0; i < n; ++i) {  // vectorized for the wrapper's ISA
    const uint32_t bits = uint32_t(src[i]) << 16;
    std::memcpy(dst + i, &bits, sizeof bits);
  }
}

// Each value one float multiply (correctly rounded at any vector width): the same bits on
// every ISA the wrappers vectorize it for.
FORKV_INLINE void q8_rows(const uint8_t* src, float* dst, int n) {
  for (int g = 0; g < n; g += kQ8Group, src += kQ8GroupBytes) {
    uint16_t h;
    std::memcpy(&h, src, sizeof h);
    const float d = half_to_float(h);
    const auto* q = reinterpret_cast<const int8_t*>(src + 2);
    for (int i = 0; i < kQ8Group; ++i) dst[g + i] = d * float(q[i]);
  }
}

void f16_portable(const uint8_t* bytes, float* dst, int n) {
  const auto* src = reinterpret_cast<const uint16_t*>(bytes);
  for (int i = 0; i < n; ++i) dst[i] = half_to_float(src[i]);
}
void bf16_portable(const uint8_t* src, float* dst, int n) { bf16_rows(src, dst, n); }
void q8_portable(const uint8_t* src, float* dst, int n) { q8_rows(src, dst, n); }

#if FORKV_HALF_X86
T512F void f16_512(const uint8_t* bytes, float* dst, int n) {
  const auto* src = reinterpret_cast<const uint16_t*>(bytes);
  int i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(
                                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}
__attribute__((target("avx2,fma,f16c"))) void f16_256(const uint8_t* bytes, float* dst,
                                                       int n) {
  const auto* src = reinterpret_cast<const uint16_t*>(bytes);
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}
T512F void bf16_512(const uint8_t* src, float* dst, int n) { bf16_rows(src, dst, n); }
T256F void bf16_256(const uint8_t* src, float* dst, int n) { bf16_rows(src, dst, n); }
T512F void q8_512(const uint8_t* src, float* dst, int n) { q8_rows(src, dst, n); }
T256F void q8_256(const uint8_t* src, float* dst, int n) { q8_rows(src, dst, n); }
#endif

}  // namespace

WidenFn widen_fn(KvType type, Isa isa) {
#if FORKV_HALF_X86
  if (type == KvType::float16) return by_isa<WidenFn>(isa, &f16_512, &f16_256, &f16_portable);
  if (type == KvType::q8_0) return by_isa<WidenFn>(isa, &q8_512, &q8_256, &q8_portable);
  return by_isa<WidenFn>(isa, &bf16_512, &bf16_256, &bf16_portable);
#else
  (void)isa;
  return type == KvType::float16 ? &f16_portable
         : type == KvType::q8_0  ? &q8_portable
                                 : &bf16_portable;
#endif
}

void quantize_q8_rows(const float* src, uint8_t* dst, int64_t rows, int D) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int g = 0; g < D; g += kQ8Group, src += kQ8Group, dst += kQ8GroupBytes) {
      float amax = 0.0f;
      for (int i = 0; i < kQ8Group; ++i) amax = std::max(amax, std::fabs(src[i]));
      // The scale as stored (float16, round to nearest even), then every q against it.
      const float d = float(mlx::core::float16_t(std::min(amax / 127.0f, 65504.0f)));
      const mlx::core::float16_t h(d);
      std::memcpy(dst, &h, 2);
      auto* q = reinterpret_cast<int8_t*>(dst + 2);
      for (int i = 0; i < kQ8Group; ++i) {
        const float v = d > 0.0f ? std::nearbyint(src[i] / d) : 0.0f;
        q[i] = int8_t(std::max(-127.0f, std::min(127.0f, v)));
      }
    }
  }
}

}  // namespace forkv
