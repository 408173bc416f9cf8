// Attention: the mlx primitive and its kernel, compiled once per ISA from one body.
#include "attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "halfkv.h"
#include "mlx/allocator.h"
#include "isa_attrs.h"
#include "mlx/backend/cpu/encoder.h"
#include "pool.h"
#include "qmatmul.h"
#include "strided.h"
#include "vmath.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define FORKV_ATT_X86 1
#else
#define FORKV_ATT_X86 0
#endif

namespace forkv {

namespace mx = mlx::core;

#pragma GCC diagnostic ignored "-Wpsabi"  // vf16 in functions built for narrower ISAs

namespace {

constexpr int kBlock = 256;  // keys per block, anchored at the row's own position
constexpr int kLanes = 16;   // partial sums per dot product and per softmax sum
constexpr int kGroup = 4;    // query heads that share one pass over a K or V row
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Query rows of one (batch, KV head) that share each block's K/V reads in a prefill or verify
// chunk (narrow K/V: widened into a thread's scratch of (kBlock + kRowGroup) x D x 2 floats).
// Each row alone streams all its keys from memory (at 32K keys of Gemma 3 ~2.5 ms a layer,
// float16 or float32 alike); a group of 16 reads them once.
constexpr int kRowGroup = 16;

// A [B, H, L or S, D] operand: element strides, D's being 1.
struct View {
  const float* p = nullptr;
  int64_t s0 = 0, s1 = 0, s2 = 0;
};

// Narrow K or V (float16, bfloat16 or q8_0 bytes; byte strides), read block by block.
struct HalfView {
  const uint8_t* p = nullptr;
  int64_t s0 = 0, s1 = 0, s2 = 0;
};

struct Args {
  int B = 0, Hq = 0, Hkv = 0, L = 0, S = 0, D = 0;
  View q, k, v;
  // Where K/V are narrow (`widen` set): read from kh, vh and widened one block at a time.
  HalfView kh, vh;
  WidenFn widen = nullptr;
  // Float16 K/V that the ISA's block reads where they lie (load_half), decode rows and chunks
  // alike: converting in registers per row cost less than one widened copy per block shared by
  // a chunk's rows (a 25-row verify ~15-30% less, a 256-row prefill chunk the same).
  bool half_direct = false;
  // Where set, K and V rows already widened for a range of keys in time order (a group of
  // query rows' union of one block): key j's rows are kt, vt + (j - t0) * D.
  const float* kt = nullptr;
  const float* vt = nullptr;
  int t0 = 0;
  int mask_kind = 0;
  const void* mask = nullptr;
  int64_t m0 = 0, m1 = 0, m2 = 0, m3 = 0;  // mask strides over b, query head, row, key
  bool causal = false;
  float scale = 1.0f;
  int rot = 0;  // key j (in time order) is row (j + rot) % S of k, v and the mask

  int group() const { return Hq / Hkv; }
  // K and V row r (storage order) of (b, h), narrow, widened into kw and vw.
  void widen_row(int b, int h, int64_t r, float* kw, float* vw) const {
    widen(kh.p + b * kh.s0 + h * kh.s1 + r * kh.s2, kw, D);
    widen(vh.p + b * vh.s0 + h * vh.s1 + r * vh.s2, vw, D);
  }
  int at(int j) const { return rot ? (j + rot) % S : j; }
  // Keys [0, visible(i)) are the ones query row i may see.
  int visible(int i) const { return causal ? std::max(0, std::min(S, S - L + i + 1)) : S; }
  // Row i's blocks end at its own position + 1 (the keys end with the L rows, in time order),
  // so in every layout of the same keys (a ring, a longer concatenation) a key falls into the
  // same block and lane: the sums run in one order, and a row's result is the same bits.
  int shift(int i) const { return ((S - L + i + 1) % kBlock + kBlock) % kBlock; }
  int blocks(int i) const {
    const int sh = shift(i), n = visible(i);
    return n <= sh ? (n > 0) : (sh > 0) + (n - sh + kBlock - 1) / kBlock;
  }
  int block_start(int i, int blk) const {
    const int sh = shift(i);
    return sh == 0 ? blk * kBlock : blk == 0 ? 0 : sh + (blk - 1) * kBlock;
  }
  // Where the mask removes key j for query head hq of row i.
  bool masked(int b, int hq, int i, int j) const {
    const int64_t at = b * m0 + hq * m1 + i * m2 + int64_t(this->at(j)) * m3;
    if (mask_kind == 1) return !static_cast<const bool*>(mask)[at];
    if (mask_kind == 2) return static_cast<const float*>(mask)[at] == kNegInf;
    return false;
  }
};

// A fixed tree over the lanes: the same order of additions for every call.
FORKV_INLINE float tree(float* acc) {
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) acc[i] += acc[i + w];
  return acc[0];
}

// Sixteen floats as one value; the compiler maps it onto the ISA of the function it is
// inlined into (one AVX-512 register, two AVX2 ones, four SSE ones).
typedef float vf16 __attribute__((vector_size(64)));

FORKV_INLINE vf16 vload(const float* p) {
  vf16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

#define FORKV_SHUF __builtin_shufflevector

// tree() of each of 16 vectors at once, by pairs: lane t of the result is tree(acc[t]), with
// every sum the same pair of the same partial sums as in tree(), so the same bits.
FORKV_INLINE vf16 trees(const vf16* acc) {
  vf16 x[8], y[4], z[2];
  for (int j = 0; j < 8; ++j)  // lanes i + (i + 8): two keys per vector
    x[j] = FORKV_SHUF(acc[2 * j], acc[2 * j + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20,
                      21, 22, 23) +
           FORKV_SHUF(acc[2 * j], acc[2 * j + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27,
                      28, 29, 30, 31);
  for (int j = 0; j < 4; ++j)  // then i + (i + 4): four keys per vector
    y[j] = FORKV_SHUF(x[2 * j], x[2 * j + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25,
                      26, 27) +
           FORKV_SHUF(x[2 * j], x[2 * j + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29,
                      30, 31);
  for (int j = 0; j < 2; ++j)  // then i + (i + 2): eight keys per vector
    z[j] = FORKV_SHUF(y[2 * j], y[2 * j + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25,
                      28, 29) +
           FORKV_SHUF(y[2 * j], y[2 * j + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27,
                      30, 31);
  return FORKV_SHUF(z[0], z[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         FORKV_SHUF(z[0], z[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

// Vectors of one register of narrower ISAs (AVX2's 8 floats, SSE's and NEON's 4): GCC keeps a
// vector wider than the ISA's registers in memory, so on AVX2 every vf16 operation was a load
// and a store.
typedef float vf8 __attribute__((vector_size(32)));
typedef float vf4 __attribute__((vector_size(16)));

template <typename V>
FORKV_INLINE V vload_as(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Float16 K/V rows read where they lie (Args::half_direct): a register's worth of halves
// widened by F16C as it is loaded, the very float32 values the scratch widening writes (the
// widening is exact), so every sum is the same. Each block's K and V were widened into a
// float32 copy first (128 KiB a block at 64 dims: read back from L2 by every pass; a chunk's
// rows shared one copy). bfloat16 and q8_0 K/V still are.
// The target functions reach the generic body through `flatten` on the ISA's block function.
template <typename V>
V load_half(const uint16_t* p);
#if FORKV_ATT_X86
#define T512H16 __attribute__((target("avx512f,avx512vl,avx512dq,fma,f16c")))
#define T256H16 __attribute__((target("avx2,fma,f16c")))
template <>
T512H16 inline vf16 load_half<vf16>(const uint16_t* p) {
  return vf16(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
}
template <>
T256H16 inline vf8 load_half<vf8>(const uint16_t* p) {
  return vf8(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
#else
#define T512H16
#define T256H16
#endif

// A K or V row's W floats from d on: float32 rows as they are, float16 ones widened.
template <typename V, typename E>
FORKV_INLINE V load_row(const E* p) {
  if constexpr (std::is_same_v<E, float>)
    return vload_as<V>(p);
  else
    return load_half<V>(p);
}

// The dot products of N query heads with 16 K rows: per head and K row kLanes partial sums
// over D, then tree(). A key's score is the same whichever 16 keys share the call, whichever
// KT of them and N heads share a pass over D, and whatever width V holds the lanes in (each
// lane's sum is its own, in order of d): V the ISA's register (vf16 on AVX-512, vf8 on AVX2),
// KT x N as many as its registers hold. Heads that share a pass read each K row once for all
// of them (AVX2: the K rows came from L2 once per head, a third of a verify's attention).
// trees() of 8 keys' lanes on 8-float vectors (AVX2), each key's 16 lanes already summed
// pairwise as tree()'s first step does (x[t] lane i = lane i + lane i + 8): lane t of the
// result is tree() of key t, every sum the same pair of partial sums, so the same bits. The
// vf16 trees() on AVX2 went through memory: a quarter of a verify chunk's attention.
FORKV_INLINE vf8 trees8(const vf8* x) {
  vf8 y[4], z[2];
  for (int j = 0; j < 4; ++j)  // i + (i + 4): two keys per vector
    y[j] = FORKV_SHUF(x[2 * j], x[2 * j + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
           FORKV_SHUF(x[2 * j], x[2 * j + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  for (int j = 0; j < 2; ++j)  // then i + (i + 2): four keys per vector
    z[j] = FORKV_SHUF(y[2 * j], y[2 * j + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
           FORKV_SHUF(y[2 * j], y[2 * j + 1], 2, 3, 6, 7, 10, 11, 14, 15);
  return FORKV_SHUF(z[0], z[1], 0, 2, 4, 6, 8, 10, 12, 14) +
         FORKV_SHUF(z[0], z[1], 1, 3, 5, 7, 9, 11, 13, 15);
}

// The dot products of N query heads with 16 K rows: per head and K row kLanes partial sums
// over D, then tree(). A key's score is the same whichever 16 keys share the call, whichever
// KT of them and N heads share a pass over D, and whatever width V holds the lanes in (each
// lane's sum is its own, in order of d): V the ISA's register (vf16 on AVX-512, vf8 on AVX2),
// KT x N as many as its registers hold. Heads that share a pass read each K row once for all
// of them (AVX2: the K rows came from L2 once per head, a third of a verify's attention).
// out[g * 16 + t] is head g's score of key t.
template <typename V, int KT, int N, typename E>
FORKV_INLINE void dots16(const float* const* q, const E* const* rows, int D, float* out) {
  constexpr int W = int(sizeof(V) / sizeof(float)), R = kLanes / W;
  vf16 acc[N][16];
  [[maybe_unused]] vf8 half[N][16];  // W == 8: lanes i + (i + 8), tree()'s first step
  for (int t0 = 0; t0 < 16; t0 += KT) {
    V a[N][KT][R];  // zeroed in registers (an `= {}` was a `rep stos` through the stack)
    for (int g = 0; g < N; ++g)
      for (int t = 0; t < KT; ++t)
        for (int r = 0; r < R; ++r) a[g][t][r] = V{};
    for (int d = 0; d < D; d += kLanes) {
      for (int t = 0; t < KT; ++t)
        for (int r = 0; r < R; ++r) {
          const V kv = load_row<V>(rows[t0 + t] + d + r * W);
          for (int g = 0; g < N; ++g) a[g][t][r] += vload_as<V>(q[g] + d + r * W) * kv;
        }
    }
    for (int g = 0; g < N; ++g)
      for (int t = 0; t < KT; ++t) {
        if constexpr (W == 8)
          half[g][t0 + t] = a[g][t][0] + a[g][t][1];
        else
          std::memcpy(&acc[g][t0 + t], a[g][t], sizeof acc[g][t0 + t]);
      }
  }
  for (int g = 0; g < N; ++g) {
    if constexpr (W == 8) {
      const vf8 lo = trees8(half[g]), hi = trees8(half[g] + 8);
      std::memcpy(out + g * 16, &lo, sizeof lo);
      std::memcpy(out + g * 16 + 8, &hi, sizeof hi);
    } else {
      const vf16 s = trees(acc[g]);
      std::memcpy(out + g * 16, &s, sizeof s);
    }
  }
}

// out_g = sum over keys [lo, hi), in order, of p_g[key] * V[key], for N heads; 16 V columns
// times U at a time held in registers of V (each column's additions are in key order
// whatever U and V are).
template <typename V, int N, int U, typename E>
FORKV_INLINE void weighted(const float* const* ps, const E* const* vrows, int lo, int hi,
                           int D, float* const* outs) {
  constexpr int W = int(sizeof(V) / sizeof(float)), R = kLanes * U / W;
  for (int d0 = 0; d0 < D; d0 += kLanes * U) {
    V acc[N][R];  // zeroed in registers, as dots16's
    for (int g = 0; g < N; ++g)
      for (int r = 0; r < R; ++r) acc[g][r] = V{};
    for (int jj = lo; jj < hi; ++jj) {
      const E* vr = vrows[jj] + d0;
      V vv[R];
      for (int r = 0; r < R; ++r) vv[r] = load_row<V>(vr + r * W);
      for (int g = 0; g < N; ++g) {
        const float p = ps[g][jj];
        for (int r = 0; r < R; ++r) acc[g][r] += p * vv[r];
      }
    }
    for (int g = 0; g < N; ++g) std::memcpy(outs[g] + d0, acc[g], sizeof acc[g]);
  }
}

// f(g0, count) for heads g0.. in steps of MaxN, count a compile-time 1..MaxN (MaxN <= 4).
template <int MaxN, typename F>
FORKV_INLINE void by_count(int G, F&& f) {
  using std::integral_constant;
  for (int g0 = 0; g0 < G; g0 += MaxN) {
    const int left = std::min(MaxN, G - g0);
    if (left == 1) {
      f(g0, integral_constant<int, 1>{});
    } else if constexpr (MaxN >= 2) {
      if (left == 2) {
        f(g0, integral_constant<int, 2>{});
      } else if constexpr (MaxN >= 3) {
        if (left == 3)
          f(g0, integral_constant<int, 3>{});
        else if constexpr (MaxN >= 4)
          f(g0, integral_constant<int, 4>{});
      }
    }
  }
}

// Keys per pass of dots16 for N heads within a budget of KT (key, head) accumulators: a
// power of two, so the passes tile its 16 keys.
constexpr int keys_per_pass(int KT, int N) {
  int k = 1;
  while (2 * k * N <= KT && 2 * k <= 16) k *= 2;
  return k;
}

template <typename F>
FORKV_INLINE void by_group(int G, F&& f) {  // f(g0, count), count a compile-time 1..kGroup
  by_count<kGroup>(G, f);
}

// max over x[lo, hi): running maxima in V's lanes, then across them (max is exact: any order
// gives the same value, up to the sign of a zero, which no later result sees).
template <typename V>
FORKV_INLINE float row_max(const float* x, int lo, int hi) {
  constexpr int W = int(sizeof(V) / sizeof(float));
  V mv;
  for (int t = 0; t < W; ++t) mv[t] = kNegInf;
  int jj = lo;
  for (; jj + W <= hi; jj += W) {
    const V v = vload_as<V>(x + jj);
    mv = mv < v ? v : mv;
  }
  float m = kNegInf;
  for (int t = 0; t < W; ++t) m = std::max(m, mv[t]);
  for (; jj < hi; ++jj) m = std::max(m, x[jj]);
  return m;
}

// lanes[(lane0 + j) % kLanes] += x[j] for j in [lo, hi), in order of j: each lane gets its
// keys in the same order as one at a time, so the same bits; 16 keys a step once aligned,
// held in R registers of V.
template <typename V>
FORKV_INLINE void lane_sums(const float* x, int lo, int hi, int lane0, float* lanes) {
  constexpr int W = int(sizeof(V) / sizeof(float)), R = kLanes / W;
  int jj = lo;
  for (; jj < hi && ((lane0 + jj) & (kLanes - 1)); ++jj)
    lanes[(lane0 + jj) & (kLanes - 1)] += x[jj];
  if (jj + 16 <= hi) {
    V acc[R];
    for (int r = 0; r < R; ++r) acc[r] = vload_as<V>(lanes + r * W);
    for (; jj + 16 <= hi; jj += 16)
      for (int r = 0; r < R; ++r) acc[r] += vload_as<V>(x + jj + r * W);
    std::memcpy(lanes, acc, sizeof acc);
  }
  for (; jj < hi; ++jj) lanes[(lane0 + jj) & (kLanes - 1)] += x[jj];
}

// The partial softmax of the G query heads of (b, h) at row i over the visible keys of the
// block from j0 (n of them): per head its max, its sum of exp(score - max) and the weighted
// sum of V rows (`part`, G x (2 + D)). Masked keys score -inf and weigh exactly 0, so leaving
// out those at the block's ends (and the keys past a causal row's end) changes no bit.
// V the ISA's vector, KT (key, head) accumulators per pass of the dot products
// (keys_per_pass), NQ heads at most per pass (each K row read once for them), U x 16 V
// columns per pass of the weighted sum (as its registers allow; the same bits whatever they
// are). E: the K/V rows' element, float or (half_direct) float16.
template <typename V, int KT, int U, int NQ, typename E = float>
FORKV_INLINE void block(const Args& a, int b, int h, int i, int j0, int n, float* part,
                        float* scores, float* wide) {
  const int G = a.group(), D = a.D, lane0 = j0 - a.shift(i);
  const E* krows[kBlock];
  const E* vrows[kBlock];
  int lo = 0, hi = n;
  if (a.mask_kind) {
    auto kept = [&](int jj) {
      for (int g = 0; g < G; ++g)
        if (!a.masked(b, h * G + g, i, j0 + jj)) return true;
      return false;
    };
    while (lo < hi && !kept(lo)) ++lo;
    while (hi > lo && !kept(hi - 1)) --hi;
  }
  for (int jj = lo; jj < hi; ++jj) {  // only keys in [lo, hi) are read
    const int64_t r = a.at(j0 + jj);
    if constexpr (!std::is_same_v<E, float>) {  // float16 rows read where they lie
      krows[jj] = reinterpret_cast<const E*>(a.kh.p + b * a.kh.s0 + h * a.kh.s1 + r * a.kh.s2);
      vrows[jj] = reinterpret_cast<const E*>(a.vh.p + b * a.vh.s0 + h * a.vh.s1 + r * a.vh.s2);
    } else if (a.kt) {  // widened once for a group of rows
      krows[jj] = a.kt + size_t(j0 + jj - a.t0) * D;
      vrows[jj] = a.vt + size_t(j0 + jj - a.t0) * D;
    } else if (a.widen) {  // narrow K/V: this block's rows widened once for all G heads
      float* kw = wide + size_t(jj) * D;
      float* vw = wide + size_t(kBlock + jj) * D;
      a.widen_row(b, h, r, kw, vw);
      krows[jj] = kw;
      vrows[jj] = vw;
    } else {
      krows[jj] = a.k.p + b * a.k.s0 + h * a.k.s1 + r * a.k.s2;
      vrows[jj] = a.v.p + b * a.v.s0 + h * a.v.s1 + r * a.v.s2;
    }
  }
  // each head's scores: NQ heads (at most) per pass over the block's K rows
  for (int g = 0; g < G; ++g) std::fill(scores + g * kBlock, scores + g * kBlock + n, kNegInf);
  // 16 keys' dot products from c, scaled and masked, into head g's scores
  auto put = [&](int g, int c, const float* dots) {
    constexpr int W = int(sizeof(V) / sizeof(float));
    const int hq = h * G + g;
    float* sg = scores + g * kBlock;
    float sv[16];
    for (int r = 0; r < 16; r += W) {
      const V x = vload_as<V>(dots + r) * a.scale;
      std::memcpy(sv + r, &x, sizeof x);
    }
    if (!a.mask_kind && c + 16 <= hi) {  // no mask: the scores as they are
      std::memcpy(sg + c, sv, sizeof sv);
      return;
    }
    if (a.mask_kind && c + 16 <= hi && !a.rot && a.m3 == 1) {  // 16 mask entries in a row
      const int64_t at = b * a.m0 + hq * a.m1 + i * a.m2 + int64_t(j0 + c);
      if (a.mask_kind == 1) {
        const bool* mk = static_cast<const bool*>(a.mask) + at;
        for (int t = 0; t < 16; ++t) sg[c + t] = mk[t] ? sv[t] : kNegInf;
      } else {
        const float* mf = static_cast<const float*>(a.mask) + at;
        for (int t = 0; t < 16; ++t) sg[c + t] = sv[t] + mf[t];
      }
      return;
    }
    for (int t = 0; t < 16 && c + t < hi; ++t) {
      float sc = sv[t];
      const int64_t at = b * a.m0 + hq * a.m1 + i * a.m2 + int64_t(a.at(j0 + c + t)) * a.m3;
      if (a.mask_kind == 1 && !static_cast<const bool*>(a.mask)[at]) sc = kNegInf;
      if (a.mask_kind == 2) sc += static_cast<const float*>(a.mask)[at];
      sg[c + t] = sc;
    }
  };
  by_count<NQ>(G, [&](int g0, auto count) {
    constexpr int N = decltype(count)::value;
    const float* qs[N];
    for (int t = 0; t < N; ++t)
      qs[t] = a.q.p + b * a.q.s0 + (h * G + g0 + t) * a.q.s1 + int64_t(i) * a.q.s2;
    for (int c = lo; c < hi; c += 16) {
      const E* rows[16];
      for (int t = 0; t < 16; ++t) rows[t] = krows[std::min(c + t, hi - 1)];
      alignas(64) float s[N * 16];
      dots16<V, keys_per_pass(KT, N), N>(qs, rows, D, s);
      for (int t = 0; t < N; ++t) put(g0 + t, c, s + t * 16);
    }
  });
  for (int g = 0; g < G; ++g) {
    float* sg = scores + g * kBlock;
    float* pg = part + g * (2 + D);
    const float m = row_max<V>(sg, lo, hi);
    float lanes[kLanes] = {};
    if (m == kNegInf) {
      std::fill(sg, sg + n, 0.0f);
    } else {
      for (int jj = lo; jj < hi; ++jj) sg[jj] = vexp(sg[jj] - m);
      lane_sums<V>(sg, lo, hi, lane0, lanes);
    }
    pg[0] = m;
    pg[1] = tree(lanes);
  }
  by_group(G, [&](int g0, auto count) {
    constexpr int N = decltype(count)::value;
    const float* ps[N];
    float* outs[N];
    for (int t = 0; t < N; ++t) {
      ps[t] = scores + (g0 + t) * kBlock;
      outs[t] = part + (g0 + t) * (2 + D) + 2;
    }
    if (D % (U * kLanes) == 0)
      weighted<V, N, U>(ps, vrows, lo, hi, D, outs);
    else
      weighted<V, N, 1>(ps, vrows, lo, hi, D, outs);
  });
}

// A row's blocks combined in order: out = sum_b exp(m_b - M) acc_b / sum_b exp(m_b - M) l_b.
// `first` is head g's part of the row's first block; blocks are `stride` floats apart.
FORKV_INLINE void combine(int D, int nb, const float* first, size_t stride, float* out) {
  float M = kNegInf;
  for (int i = 0; i < nb; ++i) M = std::max(M, first[i * stride]);
  std::fill(out, out + D, 0.0f);
  if (M == kNegInf) return;  // every key masked out
  float L = 0.0f;
  for (int i = 0; i < nb; ++i) {
    const float* pg = first + i * stride;
    if (pg[1] == 0.0f) continue;
    const float w = vexp(pg[0] - M);
    L += w * pg[1];
    for (int d = 0; d < D; ++d) out[d] += w * pg[2 + d];
  }
  const float inv = 1.0f / L;
  for (int d = 0; d < D; ++d) out[d] *= inv;
}

// One query row's scores in a block, per head (G x kBlock), then (half K/V) the block's K and V
// rows widened (2 x kBlock x D).
using Scratch = std::vector<float>;

// A vector ISA's block: float16 K/V read where they lie (half_direct), others as `block` reads
// them. Its callers carry `flatten`, which brings load_half's F16C into them.
template <typename V, int KT, int U, int NQ>
FORKV_INLINE void block_simd(const Args& a, int b, int h, int i, int j0, int n, float* part,
                             Scratch& s) {
  float* wide = s.data() + size_t(a.group()) * kBlock;
#if FORKV_ATT_X86
  if (a.half_direct)
    return block<V, KT, U, NQ, uint16_t>(a, b, h, i, j0, n, part, s.data(), wide);
#endif
  block<V, KT, U, NQ>(a, b, h, i, j0, n, part, s.data(), wide);
}

// AVX-512 too takes up to 4 heads a pass: with K read where it lies, each row is widened once
// for them (one head a pass widened it G times).
T512H16 __attribute__((flatten)) void block512(const Args& a, int b, int h, int i, int j0, int n,
                                               float* part, Scratch& s) {
  block_simd<vf16, 16, 4, 4>(a, b, h, i, j0, n, part, s);
}
T256H16 __attribute__((flatten)) void block256(const Args& a, int b, int h, int i, int j0, int n,
                                               float* part, Scratch& s) {
  block_simd<vf8, 4, 1, 4>(a, b, h, i, j0, n, part, s);
}
void block_portable(const Args& a, int b, int h, int i, int j0, int n, float* part, Scratch& s) {
  block<vf4, 4, 1, 1>(a, b, h, i, j0, n, part, s.data(), s.data() + size_t(a.group()) * kBlock);
}
T512F void combine512(int D, int nb, const float* first, size_t stride, float* out) {
  combine(D, nb, first, stride, out);
}
T256F void combine256(int D, int nb, const float* first, size_t stride, float* out) {
  combine(D, nb, first, stride, out);
}
void combine_portable(int D, int nb, const float* first, size_t stride, float* out) {
  combine(D, nb, first, stride, out);
}

using BlockFn = void (*)(const Args&, int, int, int, int, int, float*, Scratch&);
using CombineFn = void (*)(int, int, const float*, size_t, float*);

// Row (b, h, i)'s G heads, block blk, into `part`.
void run_block(const Args& a, BlockFn fn, int b, int h, int i, int blk, float* part,
               Scratch& s) {
  const int j0 = a.block_start(i, blk), n = std::min(a.visible(i), a.block_start(i, blk + 1)) - j0;
  s.resize(size_t(a.group()) * kBlock +
           (a.widen && !a.half_direct ? size_t(2) * kBlock * a.D : 0));
  fn(a, b, h, i, j0, n, part, s);
}

void combine_row(const Args& a, CombineFn fn, int b, int h, int i, const float* parts,
                 float* out) {
  const int G = a.group(), D = a.D;
  const size_t item = size_t(G) * (2 + D);
  for (int g = 0; g < G; ++g) {
    const int hq = h * G + g;
    fn(D, a.blocks(i), parts + g * (2 + D), item,
       out + ((size_t(b) * a.Hq + hq) * a.L + i) * D);
  }
}

void run_attention(const Args& a, float* out, Isa isa) {
  const int G = a.group();
  const size_t item = size_t(G) * (2 + a.D);
  const int rows = a.B * a.Hkv * a.L, max_blocks = (a.S + kBlock - 1) / kBlock + 1;
  auto* block_fn = by_isa(isa, &block512, &block256, &block_portable);
  auto* combine_fn = by_isa(isa, &combine512, &combine256, &combine_portable);
  Pool& p = pool();
  const int threads = std::max(1, std::min(current_threads(), p.num_threads()));
  std::atomic<int> next{0};
  // (b, h, i) in that order: a row index r.
  auto unpack = [&](int r, int& b, int& h, int& i) {
    i = r % a.L;
    h = (r / a.L) % a.Hkv;
    b = r / (a.L * a.Hkv);
  };
  if (a.L > 1 || rows >= 4 * threads) {  // chunks, many rows: groups of rows, block by block
    // R consecutive rows of one (b, h) per group (at most kRowGroup; enough groups for every
    // thread): their block `blk` covers nearly the same keys (each row's blocks end at its
    // own position), so a group reads them from memory once, narrow ones widened once, and
    // each row's arithmetic on them is what it would be alone.
    const int bh = a.B * a.Hkv, per = std::max(1, (threads + bh - 1) / bh);
    const int R = std::max(1, std::min(kRowGroup, (a.L + per - 1) / per));
    const int per_bh = (a.L + R - 1) / R, groups = bh * per_bh;
    // Group gi's block blk, for each of its rows that has one, into parts (row, blk).
    auto group_block = [&](int gi, int blk, float* parts, std::vector<float>& wide, Scratch& s) {
      const int b = gi / per_bh / a.Hkv, h = gi / per_bh % a.Hkv;
      const int i0 = gi % per_bh * R, i1 = std::min(a.L, i0 + R);
      Args ga = a;
      // narrow K/V of a chunk: the rows' union of this block, widened once, in time order
      if (a.widen && !a.half_direct) {
        int lo = a.S, hi = 0;
        for (int i = i0; i < i1; ++i) {
          if (blk >= a.blocks(i)) continue;
          const int j0 = a.block_start(i, blk);
          lo = std::min(lo, j0);
          hi = std::max(hi, std::min(a.visible(i), a.block_start(i, blk + 1)));
        }
        if (hi <= lo) return;
        const int n = hi - lo;
        wide.resize(size_t(2) * n * a.D + 1);
        for (int j = lo; j < hi; ++j)
          a.widen_row(b, h, a.at(j), wide.data() + size_t(j - lo) * a.D,
                      wide.data() + size_t(n + j - lo) * a.D);
        ga.widen = nullptr;
        ga.kt = wide.data();
        ga.vt = wide.data() + size_t(n) * a.D;
        ga.t0 = lo;
      }
      for (int i = i0; i < i1; ++i)
        if (blk < a.blocks(i))
          run_block(ga, block_fn, b, h, i, blk,
                    parts + (size_t(i - i0) * max_blocks + blk) * item, s);
    };
    auto combine_group = [&](int gi, const float* parts) {
      const int b = gi / per_bh / a.Hkv, h = gi / per_bh % a.Hkv;
      const int i0 = gi % per_bh * R, i1 = std::min(a.L, i0 + R);
      for (int i = i0; i < i1; ++i)
        combine_row(a, combine_fn, b, h, i, parts + size_t(i - i0) * max_blocks * item, out);
    };
    const size_t group_parts = size_t(R) * max_blocks * item;
    if (groups < 2 * threads) {
      // Few groups (a verify chunk of a few rows: 3 groups on 2 threads left one idle a third
      // of the time): the threads share (group, block) items, then each row is combined.
      thread_local std::vector<float> all;
      all.resize(groups * group_parts);
      float* ap = all.data();  // (the workers' own `all` is another thread_local)
      const int items = groups * max_blocks;
      p.run(std::min(threads, items), [&](int) {
        thread_local Scratch s;
        thread_local std::vector<float> wide;
        for (;;) {
          const int w = next.fetch_add(1);
          if (w >= items) break;
          group_block(w / max_blocks, w % max_blocks, ap + size_t(w / max_blocks) * group_parts,
                      wide, s);
        }
      });
      for (int gi = 0; gi < groups; ++gi) combine_group(gi, ap + gi * group_parts);
      return;
    }
    p.run(threads, [&](int) {
      thread_local Scratch s;
      thread_local std::vector<float> parts, wide;
      parts.resize(group_parts);
      for (;;) {
        const int gi = next.fetch_add(1);
        if (gi >= groups) break;
        const int i0 = gi % per_bh * R, i1 = std::min(a.L, i0 + R);
        int nb = 0;
        for (int i = i0; i < i1; ++i) nb = std::max(nb, a.blocks(i));
        for (int blk = 0; blk < nb; ++blk) group_block(gi, blk, parts.data(), wide, s);
        combine_group(gi, parts.data());
      }
    });
    return;
  }
  // Decode steps of a few rows: the threads share their blocks; the same arithmetic per block.
  thread_local std::vector<float> parts;
  parts.resize(size_t(rows) * max_blocks * item);
  float* pp = parts.data();
  const int items = rows * max_blocks;
  p.run(std::min(threads, items), [&](int) {
    thread_local Scratch s;
    for (;;) {
      const int w = next.fetch_add(1);
      if (w >= items) break;
      int b, h, i;
      unpack(w / max_blocks, b, h, i);
      if (w % max_blocks < a.blocks(i))
        run_block(a, block_fn, b, h, i, w % max_blocks, pp + size_t(w) * item, s);
    }
  });
  for (int r = 0; r < rows; ++r) {
    int b, h, i;
    unpack(r, b, h, i);
    combine_row(a, combine_fn, b, h, i, pp + size_t(r) * max_blocks * item, out);
  }
}

// A [B, H, L, D] float32 input as the kernel reads it: strided over B, H and L; copied into
// `buf` in row order when D itself is strided.
KvType kv_type(const mx::array& x) {
  return x.dtype() == mx::float16    ? KvType::float16
         : x.dtype() == mx::bfloat16 ? KvType::bfloat16
         : x.dtype() == mx::uint8    ? KvType::q8_0
                                     : KvType::float32;
}

// A [B, H, S, *] narrow K or V widened whole into `buf` as [B, H, S, D] float32 rows: for
// K/V whose last axis is strided (the per-block widening reads rows of contiguous bytes).
View widened(const mx::array& x, WidenFn widen, int64_t D, std::vector<float>& buf) {
  const auto& st = x.strides();
  const int64_t n0 = x.shape(0), n1 = x.shape(1), n2 = x.shape(2), W = x.shape(3);
  const int64_t item = int64_t(x.itemsize());
  const auto* src = x.data<uint8_t>();
  std::vector<uint8_t> gather;  // one row's bytes, where its last axis is strided
  buf.resize(size_t(n0 * n1 * n2 * D));
  float* dst = buf.data();
  for (int64_t i0 = 0; i0 < n0; ++i0)
    for (int64_t i1 = 0; i1 < n1; ++i1)
      for (int64_t i2 = 0; i2 < n2; ++i2, dst += D) {
        const uint8_t* row = src + (i0 * st[0] + i1 * st[1] + i2 * st[2]) * item;
        if (st[3] != 1 && W > 1) {
          gather.resize(size_t(W * item));
          for (int64_t w = 0; w < W; ++w)
            std::memcpy(gather.data() + w * item, row + w * st[3] * item, size_t(item));
          row = gather.data();
        }
        widen(row, dst, int(D));
      }
  View v;
  v.p = buf.data();
  v.s0 = n1 * n2 * D; v.s1 = n2 * D; v.s2 = D;
  return v;
}

View view_of(const mx::array& x, std::vector<float>& buf) {
  const auto& st = x.strides();
  View v;
  if (st[3] == 1 || x.shape(3) == 1) {
    v.p = x.data<float>();
    v.s0 = st[0]; v.s1 = st[1]; v.s2 = st[2];
    return v;
  }
  const int64_t n1 = x.shape(1), n2 = x.shape(2), n3 = x.shape(3);
  v.p = row_major(x, buf);
  v.s0 = n1 * n2 * n3; v.s1 = n2 * n3; v.s2 = n3;
  return v;
}

}  // namespace

void attention_eval(const std::vector<mx::array>& in, float* out, float scale, int kind,
                    bool causal, int rot, Isa isa) {
  thread_local std::vector<float> qbuf, kbuf, vbuf;
  Args a;
  a.B = in[0].shape(0); a.Hq = in[0].shape(1); a.Hkv = in[1].shape(1);
  a.L = in[0].shape(2); a.S = in[1].shape(2); a.D = in[0].shape(3);
  a.q = view_of(in[0], qbuf);
  const KvType kv = kv_type(in[1]);
  if (kv == KvType::float32) {
    a.k = view_of(in[1], kbuf);
    a.v = view_of(in[2], vbuf);
  } else if (in[1].strides()[3] != 1 || in[2].strides()[3] != 1) {
    a.k = widened(in[1], widen_fn(kv, isa), a.D, kbuf);
    a.v = widened(in[2], widen_fn(kv, isa), a.D, vbuf);
  } else {  // each block's rows widened where they are read (a group's once: run_attention)
    a.widen = widen_fn(kv, isa);
    a.half_direct = kv == KvType::float16 && isa != Isa::scalar;
    const auto& ks = in[1].strides();
    const auto& vs = in[2].strides();
    const int64_t item = int64_t(in[1].itemsize());
    a.kh = {in[1].data<uint8_t>(), ks[0] * item, ks[1] * item, ks[2] * item};
    a.vh = {in[2].data<uint8_t>(), vs[0] * item, vs[1] * item, vs[2] * item};
  }
  a.scale = scale;
  a.causal = causal;
  a.rot = a.S ? rot % a.S : 0;
  a.mask_kind = kind;
  if (kind) {
    const auto& st = in[3].strides();
    a.m0 = st[0]; a.m1 = st[1]; a.m2 = st[2]; a.m3 = st[3];
    a.mask = kind == 1 ? static_cast<const void*>(in[3].data<bool>())
                       : static_cast<const void*>(in[3].data<float>());
  }
  run_attention(a, out, isa);
}

void Attention::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& x : inputs) encoder.set_input_array(x);
  encoder.set_output_array(out);
  std::vector<mx::array> in;
  for (const auto& x : inputs) in.push_back(mx::array::unsafe_weak_copy(x));
  encoder.dispatch([in = std::move(in), out = mx::array::unsafe_weak_copy(out), scale = scale_,
                    kind = mask_kind_, causal = causal_, rot = rot_, isa = isa_]() mutable {
    attention_eval(in, out.data<float>(), scale, kind, causal, rot, isa);
  });
}

void Attention::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("forkv's attention runs on the CPU only.");
}

bool Attention::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const Attention&>(other);
  return scale_ == o.scale_ && mask_kind_ == o.mask_kind_ && causal_ == o.causal_ &&
         rot_ == o.rot_ && isa_ == o.isa_;
}

std::vector<mx::Shape> Attention::output_shapes(const std::vector<mx::array>& inputs) {
  return {inputs[0].shape()};
}

namespace {

mx::array make_attention(const std::string& fn, const mx::array& q, const mx::array& k,
                         const mx::array& v, float scale, const std::optional<mx::array>& mask,
                         bool causal, int rot) {
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument("forkv " + fn + ": " + why);
  };
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4)
    fail("q, k and v must be [B, heads, length, head_dim]");
  if (k.shape() != v.shape()) fail("k and v must have the same shape");
  const bool q8 = k.dtype() == mx::uint8;
  if (q8 && (q.shape(3) % kQ8Group != 0 || k.shape(3) != q8_row_bytes(q.shape(3))))
    fail("q8_0 k and v must hold head_dim / 32 groups of 34 bytes, head_dim a multiple of 32");
  if (q.shape(0) != k.shape(0) || (!q8 && q.shape(3) != k.shape(3)))
    fail("q and k must agree on batch size and head_dim");
  if (k.shape(1) == 0 || q.shape(1) % k.shape(1) != 0)
    fail("q's heads must be a multiple of k's");
  if (q.shape(2) > k.shape(2)) fail("q has more rows than k has keys");
  if (rot < 0 || (rot > 0 && rot >= k.shape(2))) fail("rot must be in [0, number of keys)");
  if (rot > 0 && causal) fail("rot (a ring's rotation) is for one query row, not causal");
  if (q.shape(3) % 16 != 0) fail("head_dim must be a multiple of 16");
  if (q.dtype() != mx::float32) fail("q must be float32");
  if (k.dtype() != v.dtype() || (k.dtype() != mx::float32 && k.dtype() != mx::float16 &&
                                 k.dtype() != mx::bfloat16 && k.dtype() != mx::uint8))
    fail("k and v must be both float32, both float16, both bfloat16 or both q8_0 (uint8)");
  auto s = mx::to_stream(mx::Device::cpu);
  const int B = q.shape(0), Hq = q.shape(1), L = q.shape(2), S = k.shape(2);
  std::vector<mx::array> inputs = {q, k, v};
  int kind = 0;
  if (mask) {
    auto m = *mask;
    if (m.dtype() == mx::bool_) {
      kind = 1;
    } else if (mx::issubdtype(m.dtype(), mx::floating)) {
      kind = 2;
      if (m.dtype() != mx::float32) m = mx::astype(m, mx::float32, s);
    } else {
      fail("the mask must be bool or floating point");
    }
    inputs.push_back(mx::broadcast_to(m, {B, Hq, L, S}, s));
  }
  return mx::array(q.shape(), mx::float32,
                   std::make_shared<Attention>(s, scale, kind, causal, rot, current_isa()),
                   std::move(inputs));
}

}  // namespace

void KvQuantize::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(inputs[0]);
  encoder.set_output_array(out);
  encoder.dispatch([x = mx::array::unsafe_weak_copy(inputs[0]),
                    out = mx::array::unsafe_weak_copy(out)]() mutable {
    thread_local std::vector<float> buf;
    const int D = x.shape(-1);
    quantize_q8_rows(row_major(x, buf), out.data<uint8_t>(), D ? int64_t(x.size()) / D : 0, D);
  });
}

void KvQuantize::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("forkv's quantize_kv runs on the CPU only.");
}

std::vector<mx::Shape> KvQuantize::output_shapes(const std::vector<mx::array>& inputs) {
  auto shape = inputs[0].shape();
  shape.back() = int(q8_row_bytes(shape.back()));
  return {shape};
}

mx::array quantize_kv(const mx::array& x) {
  if (x.ndim() < 1 || x.dtype() != mx::float32 || x.shape(-1) % kQ8Group != 0)
    throw std::invalid_argument("forkv quantize_kv: x must be float32 [..., D], D a multiple "
                                "of 32");
  auto shape = x.shape();
  shape.back() = int(q8_row_bytes(shape.back()));
  return mx::array(shape, mx::uint8,
                   std::make_shared<KvQuantize>(mx::to_stream(mx::Device::cpu)), {x});
}

mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale,
                    const std::optional<mx::array>& mask, bool causal, int rot) {
  return make_attention("attention", q, k, v, scale, mask, causal, rot);
}

mx::array decode_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                           float scale, const std::optional<mx::array>& mask) {
  if (q.ndim() == 4 && q.shape(2) != 1)
    throw std::invalid_argument(
        "forkv decode_attention: q must hold one token per sequence (length 1)");
  return make_attention("decode_attention", q, k, v, scale, mask, false, 0);
}

}  // namespace forkv
