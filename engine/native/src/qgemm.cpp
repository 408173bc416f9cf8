// Quantized matmul kernels: AVX-512 VNNI, AVX2 and portable C++, chosen at run time.
// Each ISA's functions carry a target attribute, so the library builds for any x86-64 (or
// other) CPU and only calls what the CPU it runs on supports.
#include "qgemm.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define FORKV_X86 1
#endif

namespace forkv {

namespace {

// Register position -> element within a chunk of 64: evens first, then odds.
inline int element_at(int pos) { return pos < 32 ? 2 * pos : 2 * (pos - 32) + 1; }

// Byte of element k (0..63) of chunk c in an 8-bit kernel row (qgemm.h): chunks in pairs,
// [evens c | evens c+1 | odds c | odds c+1] (32 bytes each), a lone last chunk [evens | odds].
inline size_t byte8_at(int c, int k, int num_chunks) {
  const size_t half = size_t(k & 1), i = size_t(k >> 1);
  if (c / 2 * 2 + 1 < num_chunks) return 128 * size_t(c / 2) + 64 * half + 32 * (c & 1) + i;
  return 64 * size_t(c) + 32 * half + i;
}

// Value of element k (0..63) of chunk c of a kernel-layout row, for the portable path.
inline int weight_at(const uint8_t* row, int bits, int c, int k, int num_chunks) {
  if (bits == 8) return row[byte8_at(c, k, num_chunks)];
  const size_t chunk = 32 + 8 * (bits - 4);
  const uint8_t* p = row + chunk * c;
  int v = (p[k >> 1] >> ((k & 1) * 4)) & 15;
  if (bits > 4) {
    const int pos = (k & 1) ? 32 + (k >> 1) : (k >> 1);
    for (int plane = 0; plane < bits - 4; ++plane) {
      uint64_t mask;
      std::memcpy(&mask, p + 32 + 8 * plane, 8);
      v |= int((mask >> pos) & 1) << (4 + plane);
    }
  }
  return v;
}

// IEEE half to float (exact: every f16 value is a float).
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    const float f = float(man) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

}  // namespace

// Rows [n0, n1) of K-quant params (qgemm.h) widened: scales into buf, biases after them.
static RowParams kparams_rows(const QuantW& w, int n0, int n1, float* buf, float shift) {
  const int groups = w.K / w.group_size, supers = w.K / kSuperBlock;
  const int per = kSuperBlock / w.group_size, bb = kparams_bytes(w.group_size);
  const bool affine = w.group_size != 16;
  float* scales = buf;
  float* biases = buf + size_t(n1 - n0) * groups;
  for (int n = n0; n < n1; ++n) {
    const uint8_t* row = w.kparams + size_t(n) * supers * bb;
    float* sr = scales + size_t(n - n0) * groups;
    float* br = biases + size_t(n - n0) * groups;
    for (int b = 0; b < supers; ++b) {
      const uint8_t* p = row + size_t(b) * bb;
      uint16_t h;
      std::memcpy(&h, p, 2);
      const float d = f16_to_f32(h);
      if (affine) {
        std::memcpy(&h, p + 2, 2);
        const float dmin = f16_to_f32(h);
        for (int g = 0; g < per; ++g) {
          sr[b * per + g] = d * float(p[4 + g]);
          br[b * per + g] = -(dmin * float(p[4 + per + g]));
        }
      } else {
        for (int g = 0; g < per; ++g) sr[b * per + g] = d * float(int8_t(p[2 + g]));
      }
    }
  }
  return {scales, affine ? biases : nullptr, shift, n0};
}

RowParams row_params(const QuantW& w, int n0, int n1, float* buf) {
  const float shift = param_shift(w);
  if (w.kparams) return kparams_rows(w, n0, n1, buf, shift);
  if (!w.scales16) return {w.scales, w.biases, shift, 0};
  const size_t num_groups = size_t(w.K / w.group_size), count = size_t(n1 - n0) * num_groups;
  const uint16_t* src = w.scales16 + size_t(n0) * num_groups;
  for (size_t i = 0; i < count; ++i) buf[i] = f16_to_f32(src[i]);
  return {buf, nullptr, shift, n0};
}

size_t row_bytes(int K, int bits) {
  return bits == 8 ? size_t(K) : size_t(K / 64) * (32 + 8 * (bits - 4));
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512vnni: return "avx512vnni";
    case Isa::avx2: return "avx2";
    default: return "scalar";
  }
}

Isa best_isa() {
#if FORKV_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vnni"))
    return Isa::avx512vnni;
  // F16C: the attention kernel's float16 K/V (every AVX2 CPU has it)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    return Isa::avx2;
#endif
  return Isa::scalar;
}

// ---------------------------------------------------------------- activations

void quantize_rows(const float* x, size_t ldx, int m0, int m1, int K, int group_size,
                   bool paired, int8_t* q, float* dx, float* xsum,
                   int32_t* xshift, int shift_mul, Isa /*isa*/) {
  const int num_blocks = K / kXBlock, num_chunks = K / 64, num_groups = K / group_size;
  for (int m = m0; m < m1; ++m) {
    const float* xr = x + size_t(m) * ldx;
    int8_t* qr = q + size_t(m) * K;
    float* dr = dx + size_t(m) * num_blocks;
    for (int b = 0; b < num_blocks; ++b) {
      float amax = 0.f;
      for (int i = 0; i < kXBlock; ++i) amax = std::max(amax, std::fabs(xr[kXBlock * b + i]));
      const float d = amax / 127.f;
      const float inv = d > 0.f ? 127.f / amax : 0.f;
      dr[b] = d;
      // Where the block's elements sit in the register layout the weights use (a block lies
      // in one chunk): evens then odds; or, paired, a pair's evens then its odds.
      const int c = kXBlock * b / 64, e0 = kXBlock * b % 64;
      const float* xb = xr + kXBlock * b;
      int8_t* even = qr + 64 * c;
      int8_t* odd = even + 32;
      if (paired && c / 2 * 2 + 1 < num_chunks) {
        even = qr + 128 * (c / 2) + 32 * (c & 1);
        odd = even + 64;
      }
      int32_t sum = 0;
      for (int i = 0; i < kXBlock; i += 2) {
        even[(e0 + i) >> 1] = int8_t(std::nearbyint(xb[i] * inv));
        odd[(e0 + i) >> 1] = int8_t(std::nearbyint(xb[i + 1] * inv));
        sum += int32_t(even[(e0 + i) >> 1]) + int32_t(odd[(e0 + i) >> 1]);
      }
      if (xshift) xshift[size_t(m) * num_blocks + b] = -shift_mul * sum;
    }
    float* gr = xsum + size_t(m) * num_groups;
    for (int g = 0; g < num_groups; ++g) {
      float s = 0.f;
      for (int i = 0; i < group_size; ++i) s += xr[g * group_size + i];
      gr[g] = s;
    }
  }
}

std::atomic<bool> g_matvec_tiles{true};
// How far ahead in its weights a one-row call (decode) fetches: the rows stream from memory
// once, and the hardware prefetcher alone left AVX-512's one-row matvecs well below the rate
// the memory gives. Lines kStreamAhead bytes on are fetched into L1, and kStreamFar bytes on
// into L2, so that more of the stream is in flight: a ~1B Q4_K_M llama's layers, one process
// alternating settings on a Zen 4, read their weights at 24.4 GB/s with neither, ~25.5 with
// the L1 fetch alone (1 or 2 KiB ahead alike) and 27.8-28.0 with both (L2 fetch 8-12 KiB on;
// 4 and 32 KiB gave less). On an Intel Xeon an L1 fetch alone had made a decode step slower,
// so it is timed with the other ways (set_matvec_ahead). AVX2's stream_rows256 fetches 4 KiB
// ahead. Changes no bits.
constexpr size_t kStreamAhead = 2048, kStreamFar = 10240;

std::atomic<bool> g_stream_ahead{true};

void set_matvec_tiles(bool on) { g_matvec_tiles.store(on); }
bool matvec_tiles() { return g_matvec_tiles.load(); }
void set_matvec_ahead(bool on) { g_stream_ahead.store(on); }
bool matvec_ahead() { return g_stream_ahead.load(); }

// ---------------------------------------------------------------- portable

namespace {

void qgemm_scalar(const QuantX& x, const QuantW& w, int n0, int n1, float* y, size_t ldy) {
  const int num_chunks = w.K / 64, num_groups = w.K / w.group_size;
  thread_local std::vector<float> buf;
  buf.resize(2 * size_t(num_groups));
  for (int n = n0; n < n1; ++n) {
    const uint8_t* row = w.data + size_t(n) * w.row_bytes;
    const RowParams p = row_params(w, n, n + 1, buf.data());
    const float* sc = p.scales + size_t(n - p.n0) * num_groups;
    const float* bi = p.biases ? p.biases + size_t(n - p.n0) * num_groups : nullptr;
    for (int m = 0; m < x.M; ++m) {
      const int8_t* qr = x.q + size_t(m) * w.K;
      const float* dr = x.dx + size_t(m) * (w.K / kXBlock);
      float acc = 0.f;
      for (int c = 0; c < num_chunks; ++c) {
        const int span = kXBlock;  // elements under one (weight, activation) scale pair
        for (int part = 0; part < 64 / span; ++part) {
          const int b = (64 * c + span * part) / kXBlock;  // its activation block
          int32_t dot = 0;
          for (int pos = 0; pos < 64; ++pos) {
            const int e = element_at(pos);
            if (e / span != part) continue;
            dot += int32_t(qr[64 * c + pos]) * weight_at(row, w.bits, c, e, num_chunks);
          }
          acc += float(dot) * (sc[(64 * c + span * part) / w.group_size] * dr[b]);
        }
      }
      const float* xs = x.xsum + size_t(m) * num_groups;
      float bias = 0.f;
      for (int g = 0; g < num_groups; ++g) bias += (bi ? bi[g] : sc[g] * p.shift) * xs[g];
      y[size_t(m) * ldy + n] = acc + bias;
    }
  }
}

}  // namespace

// ---------------------------------------------------------------- AVX-512 VNNI

#if FORKV_X86
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")))
#define T256 __attribute__((target("avx2,fma")))

namespace {

// kparams_rows, 8 groups at a time: the same products (exact), the same negation, F16C's
// widening of d and dmin (exact, as f16_to_f32).
#define T256H __attribute__((target("avx2,fma,f16c")))
T256H RowParams kparams_rows256(const QuantW& w, int n0, int n1, float* buf) {
  const int groups = w.K / w.group_size, supers = w.K / kSuperBlock;
  const int bb = kparams_bytes(w.group_size);
  const bool affine = w.group_size != 16;
  float* scales = buf;
  float* biases = buf + size_t(n1 - n0) * groups;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int n = n0; n < n1; ++n) {
    const uint8_t* row = w.kparams + size_t(n) * supers * bb;
    float* sr = scales + size_t(n - n0) * groups;
    float* br = biases + size_t(n - n0) * groups;
    for (int b = 0; b < supers; ++b) {
      const uint8_t* p = row + size_t(b) * bb;
      uint16_t h;
      std::memcpy(&h, p, 2);
      const __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
      if (affine) {  // 8 groups: sc at p + 4, m at p + 12
        std::memcpy(&h, p + 2, 2);
        const __m256 dmin = _mm256_set1_ps(_cvtsh_ss(h));
        const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 4))));
        const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 12))));
        _mm256_storeu_ps(sr + 8 * b, _mm256_mul_ps(d, sc));
        _mm256_storeu_ps(br + 8 * b, _mm256_xor_ps(_mm256_mul_ps(dmin, m), sign));
      } else {  // 16 groups of int8 sc at p + 2
        const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2));
        _mm256_storeu_ps(sr + 16 * b,
                         _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
        _mm256_storeu_ps(sr + 16 * b + 8, _mm256_mul_ps(
            d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
      }
    }
  }
  return {scales, affine ? biases : nullptr, param_shift(w), n0};
}

// row_params with F16C: the same values, widened 8 at a time (row_params' own loop converts
// one float16 scale at a time, ~20 of them a row of Gemma 3's Q5_0 and Q8_0 tensors).
T256H RowParams row_params256(const QuantW& w, int n0, int n1, float* buf) {
  if (w.kparams) return kparams_rows256(w, n0, n1, buf);
  if (!w.scales16) return row_params(w, n0, n1, buf);
  const size_t num_groups = size_t(w.K / w.group_size), count = size_t(n1 - n0) * num_groups;
  const uint16_t* src = w.scales16 + size_t(n0) * num_groups;
  size_t i = 0;
  for (; i + 8 <= count; i += 8)
    _mm256_storeu_ps(buf + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < count; ++i) buf[i] = _cvtsh_ss(src[i]);
  return {buf, nullptr, param_shift(w), n0};
}

// Chunks c = 2p and 2p + 1 of a row (QuantX::paired): `lo` the evens of both (bytes 0-31
// chunk 2p's, 32-63 chunk 2p+1's), `hi` their odds. An 8-bit row holds them so (qgemm.h).
// (`whole`: 4-bit rows that start on a cache line read a pair in one load; others in two
// halves, since a 64-byte load across two lines, every other row of SmolLM2's 288-byte rows,
// costs more than the insert.)
template <int BITS>
T512 inline void load_pair512(const uint8_t* row, int p, __m512i& lo, __m512i& hi,
                              bool whole = false) {
  if constexpr (BITS == 8) {
    lo = _mm512_loadu_si512(row + 128 * size_t(p));
    hi = _mm512_loadu_si512(row + 128 * size_t(p) + 64);
    return;
  }
  constexpr size_t chunk = 32 + 8 * (BITS - 4);
  const uint8_t* a = row + chunk * size_t(2 * p);
  const uint8_t* b = a + chunk;
  __m512i v;
  if (BITS == 4 && whole) {
    v = _mm512_loadu_si512(a);
  } else {
    v = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
  }
  const __m512i low = _mm512_set1_epi8(0x0F);
  lo = _mm512_and_si512(v, low);
  hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
  for (int plane = 0; plane < BITS - 4; ++plane) {
    // plane bits: a chunk's evens are bits 0-31, its odds 32-63
    uint64_t pa, pb;
    std::memcpy(&pa, a + 32 + 8 * plane, 8);
    std::memcpy(&pb, b + 32 + 8 * plane, 8);
    const __mmask64 klo = (pa & 0xFFFFFFFFull) | (pb << 32);
    const __mmask64 khi = (pa >> 32) | (pb & 0xFFFFFFFF00000000ull);
    const __m512i bit = _mm512_set1_epi8(char(0x10 << plane));
    lo = _mm512_mask_add_epi8(lo, klo, lo, bit);  // adds to a clear bit: an or
    hi = _mm512_mask_add_epi8(hi, khi, hi, bit);
  }
}

// A lone last chunk c in lanes 0-7 (evens in `lo`, odds in `hi`), lanes 8-15 zero.
template <int BITS>
T512 inline void load_last512(const uint8_t* row, int c, __m512i& lo, __m512i& hi) {
  if constexpr (BITS == 8) {
    const uint8_t* a = row + 64 * size_t(c);
    lo = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
    hi = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32)));
    return;
  }
  constexpr size_t chunk = 32 + 8 * (BITS - 4);
  const uint8_t* a = row + chunk * size_t(c);
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256i l = _mm256_and_si256(v, low), h = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
  for (int plane = 0; plane < BITS - 4; ++plane) {
    uint64_t pa;
    std::memcpy(&pa, a + 32 + 8 * plane, 8);
    const __m256i bit = _mm256_set1_epi8(char(0x10 << plane));
    l = _mm256_mask_add_epi8(l, __mmask32(pa & 0xFFFFFFFFull), l, bit);
    h = _mm256_mask_add_epi8(h, __mmask32(pa >> 32), h, bit);
  }
  lo = _mm512_zextsi256_si512(l);
  hi = _mm512_zextsi256_si512(h);
}

// Pair p's lines of a row streamed from memory, `ahead` bytes on into L1 and, where `far` is
// not 0, `far` bytes on into L2 (the tiles' next-block prefetch and kStreamAhead's fetch).
template <int BITS>
T512 inline void fetch_pair512(const uint8_t* row, int p, size_t ahead, size_t far) {
  constexpr size_t kPair = 2 * (BITS == 8 ? 64 : 32 + 8 * (BITS - 4));
  const char* at = reinterpret_cast<const char*>(row) + kPair * size_t(p);
  _mm_prefetch(at + ahead, _MM_HINT_T0);
  if constexpr (BITS > 4) _mm_prefetch(at + ahead + 64, _MM_HINT_T0);
  if (far) {
    _mm_prefetch(at + far, _MM_HINT_T1);
    if constexpr (BITS > 4) _mm_prefetch(at + far + 64, _MM_HINT_T1);
  }
}

// How far a one-row call streaming a row with `left` bytes of weights from its start on fetches
// ahead (kStreamAhead, kStreamFar; 0: not at all): never past the weights' end.
struct StreamAhead {
  size_t ahead = 0, far = 0;
};
inline StreamAhead stream_ahead(bool on, size_t left, size_t row_bytes) {
  if (!on || left <= kStreamAhead + row_bytes) return {};
  return {kStreamAhead, left > kStreamFar + row_bytes ? kStreamFar : 0};
}

// Which of a row's scales the lanes of 128 (or 64) elements take: lane l (elements 8l..8l+7)
// lies in group 8l / G from the first element's, G a power of two from 16 to 128
// (matmul_inputs checks). Worked out once a call: divisions per row or pair slowed small rows.
struct PairScales {
  int shift;             // log2 G
  __m512i index;         // lane l: 8l >> shift
  // a K-quant super-block's second pair (its scales' elements 128 on): lane l, 8l + 128 >> shift
  __m512i second;
  __mmask16 pair, last;  // the scales a pair loads; a lone last chunk's (no loads past the row)
  T512 explicit PairScales(int g)
      : shift(__builtin_ctz(unsigned(g))),
        index(_mm512_srlv_epi32(_mm512_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88,
                                                  96, 104, 112, 120),
                                _mm512_set1_epi32(shift))),
        second(_mm512_add_epi32(index, _mm512_set1_epi32(128 >> shift))),
        pair(mask(128 >> shift)), last(mask(std::max(1, 64 >> shift))) {}
  static __mmask16 mask(int n) { return __mmask16((1u << n) - 1); }
  // lanes `k` (all for a pair, 0-7 for a lone chunk) of the elements from e0
  T512 __m512 at(const float* sc, int e0, __mmask16 k) const {
    return _mm512_maskz_permutexvar_ps(
        k, index, _mm512_maskz_loadu_ps(k == 0xFFFF ? pair : last, sc + (e0 >> shift)));
  }
};

// One pair's contribution to a (row, weight row) accumulator: the two dot products of the
// evens and odds add in int32, then one conversion and one FMA with the lane scales (weight
// scale times activation block scale). tile512 and kq_row512 both use it: their bits agree.
// `init`: what the int32 sums start from (zero; symmetric groups: -2^(bits-1) times the
// block's activation sum, QuantX::xshift).
T512 inline __m512 pair_fma512(__m512 acc, __m512i lo, __m512i hi, __m512i xlo, __m512i xhi,
                               __m512 sv, __m512 dv, __m512i init = _mm512_setzero_si512()) {
  const __m512i dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(init, lo, xlo), hi, xhi);
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sv, dv), acc);
}

// sum_g bias[g] * xs[g] of an affine row (symmetric groups have no bias term: tile512).
T512 inline float bias_dot512(const float* bi, const float* xs, int num_groups) {
  __m512 acc = _mm512_setzero_ps();
  int g = 0;
  for (; g + 16 <= num_groups; g += 16)
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(bi + g), _mm512_loadu_ps(xs + g), acc);
  if (g < num_groups) {
    const __mmask16 k = __mmask16((1u << (num_groups - g)) - 1);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, bi + g), _mm512_maskz_loadu_ps(k, xs + g),
                          acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// 16 horizontal sums at once, each in _mm512_reduce_add_ps's order (GCC's and clang's: the
// halves, then the quarters, then lanes 0+2 and 1+3 of the quarter, then those two), so each
// sum adds the same pairs and has its bits: lane 4q + r of the result is the sum of v[4r + q].
T512 inline __m512 reduce16(const __m512 v[16]) {
  __m512 s[8], u[4];
  for (int p = 0; p < 8; ++p)  // [a's 8 half sums | b's]
    s[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0xEE));
  for (int p = 0; p < 4; ++p)  // quarter q: v[4p + q]'s 4 quarter sums
    u[p] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * p], s[2 * p + 1], 0x88),
                         _mm512_shuffle_f32x4(s[2 * p], s[2 * p + 1], 0xDD));
  __m512 w[2];
  for (int p = 0; p < 2; ++p) {  // quarter q: [0+2, 1+3] of v[8p + q], then of v[8p + 4 + q]
    const __m512d a = _mm512_castps_pd(u[2 * p]), b = _mm512_castps_pd(u[2 * p + 1]);
    w[p] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  return _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));
}

// K-quant params (qgemm.h) read in the tiles as they go, no float32 copy of them made: one
// super-block's scales (lanes 0-7 for groups of 32, 0-15 for groups of 16), d * sc, exact.
#define T512H __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))
T512H inline __m512 kp_scales512(const uint8_t* p, int group_size) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const __m512 d = _mm512_set1_ps(_cvtsh_ss(h));
  if (group_size == 16)
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2)))));
  return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 4)))));
}

// Biases of groups [g, g + 16) of a K-quant row in groups of 32 (Q4_K, Q5_K; lanes past `k`
// zero, as masked loads give): -(dmin * m). (Q6_K's groups of 16 are symmetric: no bias term.)
template <bool FULL>
T512H inline __m512 kp_bias512(const uint8_t* row, int g, int num_groups, __mmask16 k) {
  const uint8_t* p0 = row + size_t(g / 8) * 20;
  const bool two = FULL || g + 8 < num_groups;
  uint16_t h[2] = {0, 0};
  std::memcpy(&h[0], p0 + 2, 2);
  if (two) std::memcpy(&h[1], p0 + 22, 2);
  const __m128i lo = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p0 + 12));
  const __m128i hi = two ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p0 + 32))
                         : _mm_setzero_si128();
  const __m512 m = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi64(lo, hi)));
  // dmin of the first super-block in lanes 0-7, of the second in 8-15 (F16C, exact)
  const __m512 dmin = _mm512_cvtph_ps(_mm256_set_m128i(_mm_set1_epi16(short(h[1])),
                                                       _mm_set1_epi16(short(h[0]))));
  const __m512 b = _mm512_xor_ps(_mm512_mul_ps(dmin, m), _mm512_set1_ps(-0.0f));
  return FULL ? b : _mm512_maskz_mov_ps(k, b);
}

// bias_dot512's operations on a K-quant row's biases (kp_bias512).
T512H inline float kp_bias_dot512(const uint8_t* kp, const float* xs, int num_groups) {
  __m512 bacc = _mm512_setzero_ps();
  int g = 0;
  for (; g + 16 <= num_groups; g += 16)
    bacc = _mm512_fmadd_ps(kp_bias512<true>(kp, g, num_groups, __mmask16(0xFFFF)),
                           _mm512_loadu_ps(xs + g), bacc);
  if (g < num_groups) {
    const __mmask16 k = __mmask16((1u << (num_groups - g)) - 1);
    bacc = _mm512_fmadd_ps(kp_bias512<false>(kp, g, num_groups, k),
                           _mm512_maskz_loadu_ps(k, xs + g), bacc);
  }
  return _mm512_reduce_add_ps(bacc);
}

// A tile of MR activation rows x NR weight rows (params from row n0 on, row stride K/group);
// every (m, n) keeps its own accumulator and sees the same operations in the same order
// whatever MR and NR are. `ahead` > 0: also prefetch the weight rows that many bytes on (the
// next block's): a tile reads its NR rows a line each in turn, a pattern too short and
// scattered for the hardware prefetcher, so without it a multi-row call waited on memory most
// of its time (63% of Gemma 3's 8-bit head's samples; 4 rows took 3.3x one row's time, 2.4x
// with the prefetch). Prefetching changes no bits.
// Its weight params: float32 (or widened float16) scales and biases, or (KP) a row's K-quant
// params read as the chunks go.
// Symmetric groups (SYM): the int32 sums start at -2^(bits-1) times each block's activation
// sum (QuantX::xshift), so they are sums of x * (q - 2^(bits-1)) and no bias term is left (a
// third of an 8-bit head's tile went to it at K = 640).
template <int BITS, int MR, int NR, bool SYM, bool KP = false>
T512H void tile512(const QuantX& x, const QuantW& w, const PairScales& ps, const float* scales,
                   const float* biases, int m0, int n0, float* y, size_t ldy,
                   size_t ahead = 0, size_t far = 0) {
  const int num_chunks = w.K / 64, num_groups = w.K / w.group_size;
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  const uint8_t* rows[NR];
  const float* sc[NR];
  const uint8_t* kp[NR];
  __m512 ks[NR];
  const size_t kp_row = size_t(w.K / kSuperBlock) * kparams_bytes(w.group_size);
  for (int j = 0; j < NR; ++j) {
    rows[j] = w.data + size_t(n0 + j) * w.row_bytes;
    sc[j] = KP ? nullptr : scales + size_t(j) * num_groups;
    kp[j] = KP ? w.kparams + size_t(n0 + j) * kp_row : nullptr;
  }
  // Chunks in pairs (QuantX::paired): the evens of both chunks in one register and their
  // odds in another, so lane l of both covers the same 8-element activation block (16p + l)
  // and their two dot products add in int32 before one conversion: per 128 weights one
  // load (8 bits: two), three ops of unpacking (8 bits: none), two dpbusd, one conversion,
  // one fma (a chunk at a time took twice the instructions, and a one-row call was bound by
  // them; 8-bit rows were read a chunk at a time until kernel version 6).
  const int num_blocks = w.K / kXBlock, num_pairs = num_chunks / 2;
  // K-quant lanes: a super-block's scales (kp_scales512) spread over its first or second pair
  const __m512i kidx[2] = {ps.index, ps.second};
  bool whole = true;  // every row of the tile on a cache line
  for (int j = 0; j < NR; ++j) whole &= (reinterpret_cast<uintptr_t>(rows[j]) & 63) == 0;
  for (int p = 0; p < num_pairs; ++p) {
    __m512i lo[NR], hi[NR];
    __m512 sv[NR];
    if (ahead)
      for (int j = 0; j < NR; ++j) fetch_pair512<BITS>(rows[j], p, ahead, far);
    for (int j = 0; j < NR; ++j) {
      load_pair512<BITS>(rows[j], p, lo[j], hi[j], whole);
      if constexpr (KP) {  // a super-block is 2 pairs
        if (p % 2 == 0)
          ks[j] = kp_scales512(kp[j] + size_t(p / 2) * kparams_bytes(w.group_size),
                               w.group_size);
        sv[j] = _mm512_permutexvar_ps(kidx[p % 2], ks[j]);
      } else {
        sv[j] = ps.at(sc[j], 128 * p, __mmask16(0xFFFF));
      }
    }
    for (int i = 0; i < MR; ++i) {
      const size_t m = size_t(m0 + i);
      const int8_t* xq = x.q + m * w.K + 128 * p;
      const __m512i xlo = _mm512_loadu_si512(xq), xhi = _mm512_loadu_si512(xq + 64);
      const __m512 dv = _mm512_loadu_ps(x.dx + m * num_blocks + 16 * p);
      const __m512i init = SYM ? _mm512_loadu_si512(x.xshift + m * num_blocks + 16 * p)
                                    : _mm512_setzero_si512();
      for (int j = 0; j < NR; ++j)
        acc[i][j] = pair_fma512(acc[i][j], lo[j], hi[j], xlo, xhi, sv[j], dv, init);
    }
  }
  if (num_chunks % 2) {  // a lone last chunk (never a K-quant's: 256 | K): lanes 0-7
    const int c = num_chunks - 1;
    __m512i lo[NR], hi[NR];
    __m512 sv[NR];
    for (int j = 0; j < NR; ++j) {
      load_last512<BITS>(rows[j], c, lo[j], hi[j]);
      sv[j] = ps.at(sc[j], 64 * c, __mmask16(0x00FF));
    }
    for (int i = 0; i < MR; ++i) {
      const size_t m = size_t(m0 + i);
      const int8_t* xq = x.q + m * w.K + 64 * c;
      const __m512i xlo = _mm512_zextsi256_si512(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq)));
      const __m512i xhi = _mm512_zextsi256_si512(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32)));
      const __m512 dv = _mm512_maskz_loadu_ps(__mmask16(0x00FF), x.dx + m * num_blocks + 8 * c);
      const __m512i init =
          SYM ? _mm512_maskz_loadu_epi32(__mmask16(0x00FF), x.xshift + m * num_blocks + 8 * c)
              : _mm512_setzero_si512();
      for (int j = 0; j < NR; ++j)
        acc[i][j] = pair_fma512(acc[i][j], lo[j], hi[j], xlo, xhi, sv[j], dv, init);
    }
  }
  if constexpr (MR * NR < 4) {
    for (int i = 0; i < MR; ++i) {
      const float* xs = x.xsum + size_t(m0 + i) * num_groups;
      for (int j = 0; j < NR; ++j) {
        float sum = _mm512_reduce_add_ps(acc[i][j]);
        if constexpr (KP && !SYM)
          sum += kp_bias_dot512(kp[j], xs, num_groups);
        else if constexpr (!SYM)
          sum += bias_dot512(biases + size_t(j) * num_groups, xs, num_groups);
        y[size_t(m0 + i) * ldy + n0 + j] = sum;
      }
    }
  } else {
    // The tile's sums in one pass (reduce16: lane 4i + j holds (i, j)): the ops of the
    // branch above, lane for lane, without a horizontal reduction per output.
    __m512 v[16];
    for (int p = 0; p < 16; ++p) v[p] = _mm512_setzero_ps();
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) v[4 * j + i] = acc[i][j];
    const __m512 sums = reduce16(v);
    alignas(64) float out[16];
    if constexpr (SYM) {
      _mm512_store_ps(out, sums);
    } else {
      for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NR; ++j) v[4 * j + i] = _mm512_setzero_ps();
      int g = 0;
      for (; g + 16 <= num_groups; g += 16)
        for (int j = 0; j < NR; ++j) {
          const __m512 b = KP ? kp_bias512<true>(kp[j], g, num_groups, 0xFFFF)
                              : _mm512_loadu_ps(biases + size_t(j) * num_groups + g);
          for (int i = 0; i < MR; ++i)
            v[4 * j + i] = _mm512_fmadd_ps(
                b, _mm512_loadu_ps(x.xsum + size_t(m0 + i) * num_groups + g), v[4 * j + i]);
        }
      if (g < num_groups) {
        const __mmask16 k = __mmask16((1u << (num_groups - g)) - 1);
        for (int j = 0; j < NR; ++j) {
          const __m512 b = KP ? kp_bias512<false>(kp[j], g, num_groups, k)
                              : _mm512_maskz_loadu_ps(k, biases + size_t(j) * num_groups + g);
          for (int i = 0; i < MR; ++i)
            v[4 * j + i] = _mm512_fmadd_ps(
                b, _mm512_maskz_loadu_ps(k, x.xsum + size_t(m0 + i) * num_groups + g),
                v[4 * j + i]);
        }
      }
      _mm512_store_ps(out, _mm512_add_ps(sums, reduce16(v)));
    }
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) y[size_t(m0 + i) * ldy + n0 + j] = out[4 * i + j];
  }
}

// One K-quant weight row against MR (< 4) activation rows: tile512<BITS, MR, 1, SYM, true>'s
// operations, lane for lane (the same bits), with the group size a constant and a
// super-block's two pairs unrolled: the general tile spent half of a decode matvec's
// instructions on runtime group-size branches and index arithmetic.
template <int BITS, int GS, int MR>
T512H void kq_row512(const QuantX& x, const QuantW& w, const PairScales& ps, int n, float* y,
                     size_t ldy, bool fetch) {
  constexpr int kBB = GS == 16 ? 18 : 20;
  constexpr bool kSym = GS == 16;  // (groups of 16: Q6_K, symmetric)
  const int supers = w.K / kSuperBlock, num_blocks = w.K / kXBlock, num_groups = w.K / GS;
  const uint8_t* row = w.data + size_t(n) * w.row_bytes;
  const uint8_t* kp = w.kparams + size_t(n) * supers * kBB;
  const __m512i i0 = ps.index, i1 = ps.second;  // tile512's lanes (the same bits)
  __m512 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  const bool whole = (reinterpret_cast<uintptr_t>(row) & 63) == 0;
  const StreamAhead fa = stream_ahead(fetch, size_t(w.N - n) * w.row_bytes, w.row_bytes);
  for (int b = 0; b < supers; ++b) {
    const __m512 ks = kp_scales512(kp + size_t(b) * kBB, GS);
    for (int h = 0; h < 2; ++h) {
      const int p = 2 * b + h;
      if (fa.ahead) fetch_pair512<BITS>(row, p, fa.ahead, fa.far);
      __m512i lo, hi;
      load_pair512<BITS>(row, p, lo, hi, whole);
      const __m512 sv = _mm512_permutexvar_ps(h ? i1 : i0, ks);
      for (int i = 0; i < MR; ++i) {
        const int8_t* xq = x.q + size_t(i) * w.K + 128 * size_t(p);
        const size_t at = size_t(i) * num_blocks + 16 * p;
        const __m512i init = kSym ? _mm512_loadu_si512(x.xshift + at) : _mm512_setzero_si512();
        acc[i] = pair_fma512(acc[i], lo, hi, _mm512_loadu_si512(xq), _mm512_loadu_si512(xq + 64),
                             sv, _mm512_loadu_ps(x.dx + at), init);
      }
    }
  }
  for (int i = 0; i < MR; ++i) {
    float sum = _mm512_reduce_add_ps(acc[i]);
    if constexpr (!kSym)  // (symmetric: centred sums, as tile512's)
      sum += kp_bias_dot512(kp, x.xsum + size_t(i) * num_groups, num_groups);
    y[size_t(i) * ldy + n] = sum;
  }
}

template <int BITS, int GS>
T512 void kq_rows512(const QuantX& x, const QuantW& w, int n0, int n1, float* y, size_t ldy) {
  const PairScales ps(GS);
  const bool fetch = g_stream_ahead.load(std::memory_order_relaxed);  // (once a call)
  for (int n = n0; n < n1; ++n) {
    switch (x.M) {
      case 1: kq_row512<BITS, GS, 1>(x, w, ps, n, y, ldy, fetch); break;
      case 2: kq_row512<BITS, GS, 2>(x, w, ps, n, y, ldy, fetch); break;
      default: kq_row512<BITS, GS, 3>(x, w, ps, n, y, ldy, fetch); break;
    }
  }
}

// Weight rows in blocks that stay in L1 while every activation row passes over them.
constexpr int kRowBlock = 16;

template <int BITS, int MR, bool SYM, bool KP = false>
T512 void rows512(const QuantX& x, const QuantW& w, const RowParams& p, int m0, int n0, int n1,
                  float* y, size_t ldy) {
  const size_t num_groups = size_t(w.K / w.group_size);
  const float* scales = p.scales;
  const float* biases = p.biases;
  const PairScales ps(w.group_size);  // (once a call: its divisions cost small rows)
  const int first = p.n0;
  auto at = [&](const float* a, int n) {  // (K-quant params: the tiles read w.kparams)
    return SYM || KP ? nullptr : a + size_t(n - first) * num_groups;
  };
  auto scales_at = [&](int n) { return KP ? nullptr : scales + size_t(n - first) * num_groups; };
  int n = n0;
  // The first pass over these rows fetches them: prefetch the next block's as it goes (later
  // passes, for more activation rows, find them in L1). One activation row takes these tiles
  // too where `matvec_tiles()` (set_matvec_tiles: the faster read on this CPU).
  if (MR > 1 || g_matvec_tiles.load(std::memory_order_relaxed))
    for (; n + 4 <= n1; n += 4)
      tile512<BITS, MR, 4, SYM, KP>(x, w, ps, scales_at(n), at(biases, n), m0, n, y, ldy,
                                    m0 == 0 && n + 4 + kRowBlock <= w.N ? kRowBlock * w.row_bytes
                                                                        : 0);
  // (one activation row's first pass streams the rows: fetch ahead, kStreamAhead)
  const bool stream = MR == 1 && m0 == 0 && g_stream_ahead.load(std::memory_order_relaxed);
  for (; n < n1; ++n) {
    const StreamAhead fa = stream_ahead(stream, size_t(w.N - n) * w.row_bytes, w.row_bytes);
    tile512<BITS, MR, 1, SYM, KP>(x, w, ps, scales_at(n), at(biases, n), m0, n, y, ldy,
                                  fa.ahead, fa.far);
  }
}

// row_params with F16C: the same values, widened 16 at a time.
T512 RowParams row_params512(const QuantW& w, int n0, int n1, float* buf) {
  if (!w.scales16) return row_params(w, n0, n1, buf);
  const size_t num_groups = size_t(w.K / w.group_size), count = size_t(n1 - n0) * num_groups;
  const uint16_t* src = w.scales16 + size_t(n0) * num_groups;
  for (size_t i = 0; i < count; i += 16) {
    const __mmask16 k = count - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (count - i)) - 1);
    _mm512_mask_storeu_ps(buf + i, k, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, src + i)));
  }
  return {buf, nullptr, param_shift(w), n0};
}

template <int BITS>
T512 void qgemm512(const QuantX& x, const QuantW& w, int n0, int n1, float* y, size_t ldy) {
  constexpr int NB = kRowBlock;
  thread_local std::vector<float> buf;
  buf.resize(2 * size_t(NB) * (w.K / w.group_size));  // (K-quant params: biases too)
  for (int nb = n0; nb < n1; nb += NB) {
    const int ne = std::min(n1, nb + NB);
    int m = 0;
    if constexpr (BITS != 8) {
      // K-quant params: a call of a few rows (decode, a short verify) reads them as its tiles
      // go; more rows pass over each block of weight rows more times, so they are widened
      // once per block (kparams_rows256: the same float32 values, the same bits)
      if (w.kparams && x.M < 4) {  // (groups of 16: symmetric)
        if (!g_matvec_tiles.load(std::memory_order_relaxed)) {  // rows in memory order
          if (w.group_size == 16)
            kq_rows512<BITS, 16>(x, w, nb, ne, y, ldy);
          else
            kq_rows512<BITS, 32>(x, w, nb, ne, y, ldy);
          continue;
        }
        const RowParams p{nullptr, nullptr, -float(1 << (BITS - 1)), nb};
        if (w.group_size == 16) {
          for (; m + 4 <= x.M; m += 4) rows512<BITS, 4, true, true>(x, w, p, m, nb, ne, y, ldy);
          for (; m < x.M; ++m) rows512<BITS, 1, true, true>(x, w, p, m, nb, ne, y, ldy);
        } else {
          for (; m + 4 <= x.M; m += 4) rows512<BITS, 4, false, true>(x, w, p, m, nb, ne, y, ldy);
          for (; m < x.M; ++m) rows512<BITS, 1, false, true>(x, w, p, m, nb, ne, y, ldy);
        }
        continue;
      }
    }
    const RowParams p = w.kparams ? kparams_rows256(w, nb, ne, buf.data())
                                  : row_params512(w, nb, ne, buf.data());
    if (p.biases) {
      for (; m + 4 <= x.M; m += 4) rows512<BITS, 4, false>(x, w, p, m, nb, ne, y, ldy);
      for (; m < x.M; ++m) rows512<BITS, 1, false>(x, w, p, m, nb, ne, y, ldy);
    } else {
      for (; m + 4 <= x.M; m += 4) rows512<BITS, 4, true>(x, w, p, m, nb, ne, y, ldy);
      for (; m < x.M; ++m) rows512<BITS, 1, true>(x, w, p, m, nb, ne, y, ldy);
    }
  }
}

// ---------------------------------------------------------------- AVX2

// A row's bytes per chunk of 64 weights.
template <int BITS>
constexpr size_t kChunkBytes = BITS == 8 ? 64 : 32 + 8 * (BITS - 4);

// Chunk c's evens (`a`) and odds (`b`): lane j of both covers elements 8j..8j+7. 8-bit
// rows: the chunk's evens at byte `at8` of the row, its odds 64 bytes on in a pair, 32 alone
// (byte8_at).
template <int BITS>
T256 inline void load_chunk256(const uint8_t* row, int c, size_t at8, size_t odd8, __m256i& a,
                               __m256i& b) {
  if constexpr (BITS == 8) {
    a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + at8));
    b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + at8 + odd8));
  } else {
    constexpr size_t chunk = kChunkBytes<BITS>;
    const uint8_t* p = row + chunk * c;
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i low = _mm256_set1_epi8(0x0F);
    a = _mm256_and_si256(v, low);
    b = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    for (int plane = 0; plane < BITS - 4; ++plane) {
      // the plane's 64 bits in every 8 bytes (a load, no shuffle port), then each half's 32
      // bits -> 32 bytes that are 0xFF where the bit is set (evens bytes 0-3, odds 4-7)
      const __m256i m = _mm256_broadcastq_epi64(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 32 + 8 * plane)));
      const __m256i bit = _mm256_set1_epi8(char(0x10 << plane));
      const __m256i sel = _mm256_set1_epi64x(0x8040201008040201LL);
      for (int h = 0; h < 2; ++h) {
        const __m256i shuf = h == 0 ? _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1,
                                                       1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                                                       3, 3, 3, 3)
                                    : _mm256_setr_epi8(4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5,
                                                       5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7,
                                                       7, 7, 7, 7);
        const __m256i bytes =
            _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(m, shuf), sel), sel);
        __m256i& dst = h == 0 ? a : b;
        dst = _mm256_or_si256(dst, _mm256_and_si256(bytes, bit));
      }
    }
  }
}

T256 inline float hsum_ps_256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// hsum_ps_256 of four registers at once, each sum in its order (lane j + lane j + 4, then
// + the sum two on, then + its neighbour), so the same bits in a third of the operations:
// a tile's horizontal sums were 16% of a 25-row verify's head. a's sum in lane 0, b's in 4,
// c's in 2, d's in 6.
T256 inline __m256 hsum4_ps_256(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 ab =
      _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  const __m256 cd =
      _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20), _mm256_permute2f128_ps(c, d, 0x31));
  const __m256 t = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm256_add_ps(t, _mm256_movehdup_ps(t));
}

// out[i] = hsum_ps_256(v[i]) for i < R, four at a time.
template <int R>
T256 inline void hsums256(const __m256* v, float* out) {
  int i = 0;
  for (; i + 2 <= R; i += 4) {  // (2 or 3 left: padded)
    const __m256 z = _mm256_setzero_ps();
    alignas(32) float l[8];
    _mm256_store_ps(l, hsum4_ps_256(v[i], v[i + 1], i + 2 < R ? v[i + 2] : z,
                                    i + 3 < R ? v[i + 3] : z));
    out[i] = l[0];
    out[i + 1] = l[4];
    if (i + 2 < R) out[i + 2] = l[2];
    if (i + 3 < R) out[i + 3] = l[6];
  }
  if (i < R) out[i] = hsum_ps_256(v[i]);
}

// Row n's scale per int32 lane of chunk c: lane j covers elements 64c + 8j..+7.
T256 inline __m256 lane_scale256(const float* sc, int group_size, int c) {
  if (group_size == 16)  // lane j: elements of group j / 2
    return _mm256_setr_ps(sc[4 * c], sc[4 * c], sc[4 * c + 1], sc[4 * c + 1], sc[4 * c + 2],
                          sc[4 * c + 2], sc[4 * c + 3], sc[4 * c + 3]);
  if (group_size == 32)
    return _mm256_blend_ps(_mm256_set1_ps(sc[2 * c]), _mm256_set1_ps(sc[2 * c + 1]), 0xF0);
  return _mm256_set1_ps(sc[(64 * c) / group_size]);
}

// One weight row's per-call constants: each chunk's scale per int32 lane (`sv`, 8 floats a
// chunk), its chunks unpacked (`unpacked`: evens, odds, 32 bytes each; 8 bits: the signed
// weights' magnitudes and signs, evens then odds, 128 bytes a chunk) and, 8 bits, where each
// chunk's evens and odds lie in the row. With 4 activation rows or more the first two are
// made once a row for all of them; with fewer (streamed), per chunk (null), and `ahead` is
// the weight byte ~4 KiB further on, fetched early.
struct Row256 {
  const uint8_t* row;
  const float* sc;  // its group scales
  int group_size;
  const float* sv;
  const uint8_t* unpacked;
  const size_t* at8;
  const size_t* odd8;
  const uint8_t* ahead;
};

// A tile's activation rows interleaved by chunk: row i's chunk c at q + (c * MR + i) * 64 and
// its 8 block scales at dx + (c * MR + i) * 8. Row-major, a tile of 4-7 rows kept 5 row
// pointers and their scale pointers live across the chunk loop, and GCC spilled them: a
// reload from the stack per row and chunk.
struct Tile256 {
  const int8_t* q;
  const float* dx;
};

// Rows m0..m0+MR-1 of x interleaved into qbuf and dbuf (the same bytes and scales).
inline Tile256 interleave256(const QuantX& x, int m0, int MR, std::vector<int8_t>& qbuf,
                             std::vector<float>& dbuf) {
  const int num_chunks = x.K / 64, num_blocks = x.K / kXBlock;
  qbuf.resize(size_t(x.K) * MR);
  dbuf.resize(size_t(num_blocks) * MR);
  for (int c = 0; c < num_chunks; ++c)
    for (int i = 0; i < MR; ++i) {
      std::memcpy(qbuf.data() + (size_t(c) * MR + i) * 64,
                  x.q + size_t(m0 + i) * x.K + 64 * size_t(c), 64);
      std::memcpy(dbuf.data() + (size_t(c) * MR + i) * 8,
                  x.dx + size_t(m0 + i) * num_blocks + 8 * size_t(c), 8 * sizeof(float));
    }
  return Tile256{qbuf.data(), dbuf.data()};
}

// An 8-bit chunk's signed weights (q - 128) and their magnitudes, evens and odds.
T256 inline void signed8_256(__m256i wa, __m256i wb, __m256i& ua, __m256i& sa, __m256i& ub,
                             __m256i& sb) {
  const __m256i flip = _mm256_set1_epi8(char(0x80));
  sa = _mm256_xor_si256(wa, flip);
  sb = _mm256_xor_si256(wb, flip);
  ua = _mm256_sign_epi8(sa, sa);
  ub = _mm256_sign_epi8(sb, sb);
}

// Activation rows m0..m0+MR-1 against one weight row: each chunk's weights unpacked once for
// all MR rows. Every output sees the same operations in the same order whatever MR is, so a
// row's result does not depend on the rows beside it. CENTRED: symmetric 8-bit groups, whose
// signed sums need no bias term (as AVX-512's tiles). STREAM: the chunk read from the row
// (decode, 1-3 rows: the weights stream from memory once, so their next bytes are fetched
// early; the hardware prefetcher alone left a decode's matvecs ~30% below the memory's rate).
// `tile`: the MR rows' activations interleaved by chunk (Tile256), read at fixed offsets from
// one pointer; else rows m0.. of x.
template <int BITS, int MR, bool CENTRED, bool STREAM>
T256 inline void row_tile256(const QuantX& x, const Row256& r, int m0, __m256* acc,
                             const Tile256* tile = nullptr) {
  const int num_chunks = x.K / 64, num_blocks = x.K / kXBlock;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int i = 0; i < MR; ++i) acc[i] = _mm256_setzero_ps();
  const int8_t* q0 = tile ? tile->q : x.q + size_t(m0) * x.K;
  const float* d0 = tile ? tile->dx : x.dx + size_t(m0) * num_blocks;
  // row i's chunk c: interleaved, 64 bytes and 8 scales at (c * MR + i); else row-major
  const size_t q_row = tile ? 64 : size_t(x.K), q_chunk = tile ? 64 * MR : 64;
  const size_t d_row = tile ? 8 : size_t(num_blocks), d_chunk = tile ? 8 * MR : 8;
  for (int c = 0; c < num_chunks; ++c) {
    __m256i wa, wb;
    __m256i sa, sb, ua, ub;  // 8 bits: the signed weights (q - 128) and their magnitudes
    if constexpr (STREAM) {
      _mm_prefetch(reinterpret_cast<const char*>(r.ahead) + (kChunkBytes<BITS> * size_t(c)),
                   _MM_HINT_T0);
      load_chunk256<BITS>(r.row, c, BITS == 8 ? r.at8[c] : 0, BITS == 8 ? r.odd8[c] : 0, wa, wb);
      if constexpr (BITS == 8) signed8_256(wa, wb, ua, sa, ub, sb);
    } else if constexpr (BITS == 8) {
      const __m256i* u = reinterpret_cast<const __m256i*>(r.unpacked + 128 * size_t(c));
      ua = _mm256_loadu_si256(u);
      sa = _mm256_loadu_si256(u + 1);
      ub = _mm256_loadu_si256(u + 2);
      sb = _mm256_loadu_si256(u + 3);
    } else {
      wa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.unpacked + 64 * size_t(c)));
      wb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.unpacked + 64 * size_t(c) + 32));
    }
    const __m256 sv = STREAM ? lane_scale256(r.sc, r.group_size, c)
                             : _mm256_loadu_ps(r.sv + 8 * size_t(c));
    for (int i = 0; i < MR; ++i) {
      const int8_t* qr = q0 + size_t(i) * q_row + q_chunk * size_t(c);
      const __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qr));
      const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qr + 32));
      // Lane j of both registers covers elements 8j..8j+7 (evens, odds): activation block
      // 8c + j, so they add in int32.
      __m256i dot;
      if constexpr (BITS == 8) {
        // u8 x s8 pairs can overflow maddubs: dot the signed weights (q - 128); symmetric
        // groups keep that centred sum, affine ones add 128 * sum(x) per lane, so each int32
        // lane holds its 8 elements' sum of q * x.
        const __m256i da = _mm256_madd_epi16(_mm256_maddubs_epi16(ua, _mm256_sign_epi8(xa, sa)),
                                             ones);
        const __m256i db = _mm256_madd_epi16(_mm256_maddubs_epi16(ub, _mm256_sign_epi8(xb, sb)),
                                             ones);
        dot = _mm256_add_epi32(da, db);
        if constexpr (!CENTRED) {
          const __m256i one8 = _mm256_set1_epi8(1);
          const __m256i xs8 = _mm256_add_epi32(
              _mm256_madd_epi16(_mm256_maddubs_epi16(one8, xa), ones),
              _mm256_madd_epi16(_mm256_maddubs_epi16(one8, xb), ones));
          dot = _mm256_add_epi32(dot, _mm256_slli_epi32(xs8, 7));
        }
      } else {
        // 4-6 bits: each int16 pair sum is at most 2 * 63 * 128 = 16,128, so two of them add
        // in int16 without saturating, and one madd gives the same int32 sums as two madds
        // and an add (integer sums: the same bits, one operation fewer a row and chunk)
        dot = _mm256_madd_epi16(
            _mm256_add_epi16(_mm256_maddubs_epi16(wa, xa), _mm256_maddubs_epi16(wb, xb)), ones);
      }
      const __m256 dv = _mm256_loadu_ps(d0 + size_t(i) * d_row + d_chunk * size_t(c));
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(sv, dv), acc[i]);
    }
  }
}

// The tile's sums into y, each plus its row's bias term (`bias`, rows m0.. of one weight row;
// none where CENTRED).
template <int MR, bool CENTRED>
T256 inline void store_tile256(const float* bias, int m0, int n, const __m256* acc, float* y,
                               size_t ldy) {
  float sums[MR];
  hsums256<MR>(acc, sums);
  for (int i = 0; i < MR; ++i)
    y[size_t(m0 + i) * ldy + n] = CENTRED ? sums[i] : sums[i] + bias[m0 + i];
}

// The bias terms of one weight row (its biases `bi`, or its scales `sc` times `shift`) for
// activation rows m0..m0+MR-1: lane l of a register a chain of FMAs over groups l, l + 8, ...
// below the last whole 8, the lanes added as hsum_ps_256 adds them, then the last groups one
// FMA each, in order. (The tail was `bias += b * x`, which GCC compiled to an FMA in some
// instantiations and to a multiply and an add in others: now an FMA everywhere, as
// block_bias256 computes it for many rows, the same bits.)
template <int MR>
T256 inline void row_bias256(const QuantX& x, const float* sc, const float* bi, float shift,
                             int m0, float* out) {
  const int G = x.K / x.group_size, whole = G - G % 8;
  __m256 bacc[MR];
  for (int i = 0; i < MR; ++i) {
    const float* xs = x.xsum + size_t(m0 + i) * G;
    bacc[i] = _mm256_setzero_ps();
    for (int g = 0; g < whole; g += 8)
      bacc[i] = _mm256_fmadd_ps(
          bi ? _mm256_loadu_ps(bi + g)
             : _mm256_mul_ps(_mm256_loadu_ps(sc + g), _mm256_set1_ps(shift)),
          _mm256_loadu_ps(xs + g), bacc[i]);
  }
  hsums256<MR>(bacc, out);
  for (int i = 0; i < MR; ++i) {
    const float* xs = x.xsum + size_t(m0 + i) * G;
    __m128 acc = _mm_set_ss(out[i]);
    for (int g = whole; g < G; ++g)
      acc = _mm_fmadd_ss(_mm_set_ss(bi ? bi[g] : sc[g] * shift), _mm_set_ss(xs[g]), acc);
    out[i] = _mm_cvtss_f32(acc);
  }
}

// row_bias256 for weight rows [b, b1) (at most 16; params p) and all x.M activation rows, 8
// weight rows a register (the params transposed): the same operations in the same order, so
// the same bits; out[(n - b) * x.M + i]. A tile's rows took it one weight row at a time, its
// horizontal sums and scalar tail ~16% of a 9-row Q4_1 matmul at K = 576.
T256 inline void block_bias256(const QuantX& x, const RowParams& p, int b, int b1, float* out) {
  const int G = x.K / x.group_size, whole = G - G % 8;
  thread_local std::vector<float> tb;  // bias(n, g) at tb[g * 8 + n - n8]
  for (int n8 = b; n8 < b1; n8 += 8) {
    const int rows = std::min(8, b1 - n8);
    tb.assign(size_t(G) * 8, 0.0f);  // lanes past `rows` stay zero (their sums unread)
    for (int r = 0; r < rows; ++r) {
      const size_t at = size_t(n8 + r - p.n0) * G;
      for (int g = 0; g < G; ++g)
        tb[size_t(g) * 8 + r] = p.biases ? p.biases[at + g] : p.scales[at + g] * p.shift;
    }
    const float* t = tb.data();
    for (int i = 0; i < x.M; ++i) {
      const float* xs = x.xsum + size_t(i) * G;
      __m256 l[8];
      for (int j = 0; j < 8; ++j) l[j] = _mm256_setzero_ps();
      for (int g = 0; g < whole; g += 8)
        for (int j = 0; j < 8; ++j)
          l[j] = _mm256_fmadd_ps(_mm256_loadu_ps(t + size_t(g + j) * 8), _mm256_set1_ps(xs[g + j]),
                                 l[j]);
      __m256 sum = _mm256_add_ps(
          _mm256_add_ps(_mm256_add_ps(l[0], l[4]), _mm256_add_ps(l[2], l[6])),
          _mm256_add_ps(_mm256_add_ps(l[1], l[5]), _mm256_add_ps(l[3], l[7])));
      for (int g = whole; g < G; ++g)
        sum = _mm256_fmadd_ps(_mm256_loadu_ps(t + size_t(g) * 8), _mm256_set1_ps(xs[g]), sum);
      alignas(32) float v[8];
      _mm256_store_ps(v, sum);
      for (int r = 0; r < rows; ++r) out[size_t(n8 + r - b) * x.M + i] = v[r];
    }
  }
}

// Rows made into params in one call.
constexpr int kParamRows256 = 16;

// One tile of MR rows against a weight row unpacked for all tiles, into y.
template <int BITS, int MR, bool CENTRED>
T256 inline void tile256(const QuantX& x, const Row256& r, const float* bias, int m0, int n,
                         float* y, size_t ldy, const Tile256& tile) {
  __m256 acc[MR];
  row_tile256<BITS, MR, CENTRED, false>(x, r, m0, acc, &tile);
  store_tile256<MR, CENTRED>(bias, m0, n, acc, y, ldy);
}

// Walks weight rows n0..n1, making the params of 16 rows in one call, and calls
// f(n, scales, biases or null, shift, bias terms or null, row bytes) for each row. BLOCK: the
// bias terms of every activation row made 16 weight rows at a time (block_bias256; x.M at
// row n's pointer), else null (the caller makes them, row_bias256: a decode step's 1-3 rows
// are too few to pay for the transposed params).
template <bool BLOCK, class F>
T256 inline void for_rows256(const QuantX& x, const QuantW& w, int n0, int n1, F&& f) {
  const int num_groups = w.K / w.group_size;
  thread_local std::vector<float> buf, bias;
  buf.resize(2 * size_t(kParamRows256) * num_groups);
  if (BLOCK) bias.resize(size_t(kParamRows256) * x.M);
  for (int b = n0; b < n1; b += kParamRows256) {
    const int b1 = std::min(n1, b + kParamRows256);
    const RowParams p = row_params256(w, b, b1, buf.data());
    if (BLOCK) block_bias256(x, p, b, b1, bias.data());
    for (int n = b; n < b1; ++n) {
      const float* sc = p.scales + size_t(n - p.n0) * num_groups;
      const float* bi = p.biases ? p.biases + size_t(n - p.n0) * num_groups : nullptr;
      f(n, sc, bi, p.shift, BLOCK ? bias.data() + size_t(n - b) * x.M : nullptr,
        w.data + size_t(n) * w.row_bytes);
    }
  }
}

// Rows of 1-3 activations (decode): each weight row streamed once, its chunks unpacked as
// they are read, the params of 16 rows made in one call.
template <int BITS, int MR, bool CENTRED>
T256 void stream_rows256(const QuantX& x, const QuantW& w, int n0, int n1, float* y,
                         size_t ldy, const size_t* at8, const size_t* odd8) {
  constexpr size_t kAhead = 4096;
  const uint8_t* end = w.data + size_t(w.N) * w.row_bytes;
  for_rows256<false>(x, w, n0, n1,
                     [&](int n, const float* sc, const float* bi, float shift, const float*,
                         const uint8_t* row) __attribute__((target("avx2,fma"))) {
                       const uint8_t* ahead =
                           size_t(end - row) > kAhead + w.row_bytes ? row + kAhead : row;
                       const Row256 r{row, sc, w.group_size, nullptr, nullptr, at8, odd8, ahead};
                       __m256 acc[MR];
                       row_tile256<BITS, MR, CENTRED, true>(x, r, 0, acc);
                       float bias[MR];
                       if (!CENTRED) row_bias256<MR>(x, sc, bi, shift, 0, bias);
                       store_tile256<MR, CENTRED>(bias, 0, n, acc, y, ldy);
                     });
}

template <int BITS, bool CENTRED>
T256 void rows256(const QuantX& x, const QuantW& w, int n0, int n1, float* y, size_t ldy) {
  const int num_chunks = w.K / 64;
  thread_local std::vector<float> sv;
  thread_local std::vector<size_t> at8, odd8;
  thread_local std::vector<uint8_t> unpacked;
  if (BITS == 8) {
    at8.resize(size_t(num_chunks));
    odd8.resize(size_t(num_chunks));
    for (int c = 0; c < num_chunks; ++c) {
      at8[c] = byte8_at(c, 0, num_chunks);
      odd8[c] = byte8_at(c, 1, num_chunks) - at8[c];
    }
  }
  switch (x.M) {
    case 1: return stream_rows256<BITS, 1, CENTRED>(x, w, n0, n1, y, ldy, at8.data(), odd8.data());
    case 2: return stream_rows256<BITS, 2, CENTRED>(x, w, n0, n1, y, ldy, at8.data(), odd8.data());
    case 3: return stream_rows256<BITS, 3, CENTRED>(x, w, n0, n1, y, ldy, at8.data(), odd8.data());
  }
  // 4 rows or more: each weight row unpacked, and its lane scales made, once for all tiles
  // of 4 rows; the last tile takes the 0-3 rows left over (no single-row tiles), and the
  // params of 16 rows are made in one call
  constexpr size_t kUnpacked = BITS == 8 ? 128 : 64;  // bytes a chunk
  sv.resize(8 * size_t(num_chunks));
  unpacked.resize(kUnpacked * size_t(num_chunks));
  const int last = x.M - x.M % 4 - 4;  // the last tile's first row
  const uint8_t* end = w.data + size_t(w.N) * w.row_bytes;
  // each tile's rows interleaved once for all weight rows (this thread's copy: ~K x M bytes)
  thread_local std::vector<std::vector<int8_t>> tq;
  thread_local std::vector<std::vector<float>> td;
  std::vector<Tile256> tiles;
  const int num_tiles = last / 4 + 1;
  tq.resize(size_t(num_tiles));
  td.resize(size_t(num_tiles));
  for (int t = 0; t < num_tiles; ++t) {
    const int m0 = 4 * t, rows = t + 1 < num_tiles ? 4 : x.M - last;
    tiles.push_back(interleave256(x, m0, rows, tq[t], td[t]));
  }
  for_rows256<!CENTRED>(x, w, n0, n1, [&](int n, const float* sc, const float*, float,
                                           const float* bias, const uint8_t* row)
                                           __attribute__((target("avx2,fma"))) {
    // the row after next fetched early (the loads of a row's first bytes stalled)
    const uint8_t* next = size_t(end - row) > 3 * w.row_bytes ? row + 2 * w.row_bytes : row;
    for (int c = 0; c < num_chunks; ++c) {
      _mm_prefetch(reinterpret_cast<const char*>(next) + 64 * size_t(c), _MM_HINT_T0);
      _mm256_storeu_ps(sv.data() + 8 * size_t(c), lane_scale256(sc, w.group_size, c));
      __m256i wa, wb;
      load_chunk256<BITS>(row, c, BITS == 8 ? at8[c] : 0, BITS == 8 ? odd8[c] : 0, wa, wb);
      __m256i* dst = reinterpret_cast<__m256i*>(unpacked.data() + kUnpacked * size_t(c));
      if constexpr (BITS == 8) {
        __m256i ua, sa, ub, sb;
        signed8_256(wa, wb, ua, sa, ub, sb);
        _mm256_storeu_si256(dst, ua);
        _mm256_storeu_si256(dst + 1, sa);
        _mm256_storeu_si256(dst + 2, ub);
        _mm256_storeu_si256(dst + 3, sb);
      } else {
        _mm256_storeu_si256(dst, wa);
        _mm256_storeu_si256(dst + 1, wb);
      }
    }
    const Row256 r{row, sc, w.group_size, sv.data(), unpacked.data(), at8.data(), odd8.data(),
                   row};
    for (int m = 0; m < last; m += 4)
      tile256<BITS, 4, CENTRED>(x, r, bias, m, n, y, ldy, tiles[m / 4]);
    const Tile256& lt = tiles.back();
    switch (x.M - last) {
      case 4: tile256<BITS, 4, CENTRED>(x, r, bias, last, n, y, ldy, lt); break;
      case 5: tile256<BITS, 5, CENTRED>(x, r, bias, last, n, y, ldy, lt); break;
      case 6: tile256<BITS, 6, CENTRED>(x, r, bias, last, n, y, ldy, lt); break;
      case 7: tile256<BITS, 7, CENTRED>(x, r, bias, last, n, y, ldy, lt); break;
    }
  });
}

template <int BITS>
T256 void qgemm256(const QuantX& x, const QuantW& w, int n0, int n1, float* y, size_t ldy) {
  // symmetric 8-bit groups (no biases: float scales or float16 ones) sum centred
  if (BITS == 8 && !w.biases && !w.kparams) return rows256<BITS, true>(x, w, n0, n1, y, ldy);
  rows256<BITS, false>(x, w, n0, n1, y, ldy);
}

}  // namespace
#endif  // FORKV_X86

void qgemm_rows(const QuantX& x, const QuantW& w, int n0, int n1, float* y, size_t ldy,
                Isa isa) {
#if FORKV_X86
  if (isa == Isa::avx512vnni) {
    switch (w.bits) {
      case 4: return qgemm512<4>(x, w, n0, n1, y, ldy);
      case 5: return qgemm512<5>(x, w, n0, n1, y, ldy);
      case 6: return qgemm512<6>(x, w, n0, n1, y, ldy);
      case 8: return qgemm512<8>(x, w, n0, n1, y, ldy);
    }
  } else if (isa == Isa::avx2) {
    switch (w.bits) {
      case 4: return qgemm256<4>(x, w, n0, n1, y, ldy);
      case 5: return qgemm256<5>(x, w, n0, n1, y, ldy);
      case 6: return qgemm256<6>(x, w, n0, n1, y, ldy);
      case 8: return qgemm256<8>(x, w, n0, n1, y, ldy);
    }
  }
#endif
  qgemm_scalar(x, w, n0, n1, y, ldy);
}

void repack_rows(const uint32_t* src, size_t words_per_row, int n0, int n1, int K, int bits,
                 uint8_t* dst) {
  const size_t out_row = row_bytes(K, bits), chunk = 32 + 8 * size_t(bits - 4);
  for (int n = n0; n < n1; ++n) {
    const uint8_t* in = reinterpret_cast<const uint8_t*>(src + size_t(n) * words_per_row);
    uint8_t* out = dst + size_t(n) * out_row;
    if (bits == 8) {  // mlx's bytes are the values in order
      for (int k = 0; k < K; ++k) out[byte8_at(k / 64, k % 64, K / 64)] = in[k];
      continue;
    }
    std::memset(out, 0, out_row);
    for (int k = 0; k < K; ++k) {
      // mlx packs values as a little-endian bit stream: value k at bit k * bits.
      const size_t bit = size_t(k) * bits;
      uint32_t word = 0;
      std::memcpy(&word, in + bit / 8, std::min<size_t>(4, words_per_row * 4 - bit / 8));
      const int v = int((word >> (bit % 8)) & ((1u << bits) - 1));
      const int c = k / 64, e = k % 64;
      uint8_t* p = out + chunk * c;
      p[e >> 1] |= uint8_t((v & 15) << ((e & 1) * 4));
      const int pos = (e & 1) ? 32 + (e >> 1) : (e >> 1);
      for (int plane = 0; plane < bits - 4; ++plane)
        if ((v >> (4 + plane)) & 1) p[32 + 8 * plane + pos / 8] |= uint8_t(1u << (pos % 8));
    }
  }
}

}  // namespace forkv
