// Quantized matmul kernels for the CPU: y[m, n] = sum_k x[m, k] * (scale[n, g] * q[n, k] + bias[n, g]).
//
// Weights are affine groups (mlx's format: q unsigned in [0, 2^bits), one float scale and bias
// per group of `group_size` along k). Activations are quantized once per call to int8 in
// blocks of kXBlock (one float scale per block), so each block's dot product is exact int32
// arithmetic; the bias term uses the float sums of x per group. Every output element is
// computed by the same sequence of operations whatever M, the tile it falls in or the thread
// that runs it: a row's result never depends on how many rows share the call.
#pragma once

#include <cstddef>
#include <cstdint>

namespace forkv {

enum class Isa : int { scalar = 0, avx2 = 1, avx512vnni = 2 };

// Activation elements under one int8 scale: 8, so every int32 lane of the dot products (4
// evens, 4 odds or 4 consecutive elements) lies in one block (32 gave +2.5% perplexity on
// Gemma 3 against its float path; llama.cpp's Q8 blocks are 32).
constexpr int kXBlock = 8;

// Activations of one call, quantized: K padded to a multiple of 64 ("chunks").
struct QuantX {
  int M = 0, K = 0, group_size = 32;
  // Each chunk of 64 as [even elements | odd elements]; (AVX-512) chunks in pairs: [evens c |
  // evens c+1 | odds c | odds c+1], a lone last chunk as one: one 64-byte load of two chunks'
  // nibbles splits into the evens and the odds of the same 8-element blocks (see tile512)
  bool paired = false;
  const int8_t* q = nullptr;        // [M, K]
  const float* dx = nullptr;        // [M, K/kXBlock]: block scales
  const float* xsum = nullptr;      // [M, K/group_size]: float sums of x per group
  // [M, K/kXBlock], paired calls with symmetric weights (no biases; Q6_K's params): each
  // block's -2^(bits-1) * sum of its int8 values, where the AVX-512 tiles' int32 sums start
  const int32_t* xshift = nullptr;
};

// Weights, as the kernels read them.
//  bits 8: one byte per element, chunks in pairs as QuantX::paired's activations: per 128
//  elements [evens c | evens c+1 | odds c | odds c+1] (32 bytes each), a lone last chunk
//  [evens | odds] (repack_rows makes it from mlx's packing; uint8 [N, K]).
//  bits 4: 32 bytes per chunk of 64, byte b = elem 2b | elem 2b+1 << 4 (mlx's packing).
//  bits 5, 6: per chunk the 4-bit bytes as above, then (bits - 4) planes of 64 bits: bit i of
//  plane p is bit 4 + p of the element at register position i (evens first, then odds).
struct QuantW {
  int N = 0, K = 0, bits = 4, group_size = 32;
  const uint8_t* data = nullptr;
  size_t row_bytes = 0;
  // [N, K/group_size] each. Affine groups: float32 scales and biases. Symmetric groups (a
  // GGUF's Q8_0, Q4_0, Q5_0, Q6_K): no biases, each bias being -2^(bits-1) times its scale
  // (exact), and the scales float32 or, where they are f16 values, float16 (fewer bytes).
  const float* scales = nullptr;
  const uint16_t* scales16 = nullptr;  // instead of `scales`
  const float* biases = nullptr;
  // Instead of scales and biases: a GGUF K-quant's own super-block params (see kparams_bytes).
  const uint8_t* kparams = nullptr;
};

// A K-quant's params, per row K/256 super-blocks of kparams_bytes(group_size) bytes, as the
// GGUF file holds them: groups of 32 (Q4_K, Q5_K): float16 d and dmin, then 8 uint8 sc and 8
// uint8 m, a group's scale d * sc and bias -(dmin * m); groups of 16 (Q6_K): float16 d, then
// 16 int8 sc, scale d * sc, symmetric. Every product is exact in float32 (11 + 8 significant
// bits at most), so the kernels widen them to the very float32 scales and biases a converter
// stores, at ~1/3 of their bytes (Q4_K: 4.6 bits a weight instead of 6).
constexpr int kSuperBlock = 256;
inline int kparams_bytes(int group_size) { return group_size == 16 ? 18 : 20; }

// K of a call from its scales' columns: groups, or K-quant params (uint8) super-blocks.
inline int k_of(int scale_cols, int group_size, bool kparams) {
  return kparams ? scale_cols / kparams_bytes(group_size) * kSuperBlock : scale_cols * group_size;
}

// Scales and biases of weight rows from n0 on, float32, row stride K/group_size.
struct RowParams {
  const float* scales;
  const float* biases;  // null: symmetric groups, each bias `shift` times its scale (exact)
  float shift;          // -2^(bits-1)
  int n0;
};

// RowParams::shift of w: a power of two, so every bias `shift` times a scale is exact.
inline float param_shift(const QuantW& w) { return -float(1 << (w.bits - 1)); }

// Rows [n0, n1)'s params: float32 scales as they are, float16 ones widened into `buf`, K-quant
// params widened into `buf` (scales, then biases: 2 * (n1 - n0) * K/group_size floats).
RowParams row_params(const QuantW& w, int n0, int n1, float* buf);

Isa best_isa();
const char* isa_name(Isa isa);
size_t row_bytes(int K, int bits);

// How a one-row call (decode's matvec) reads its weight rows on AVX-512: four at a time in the
// multi-row calls' tiles, with their prefetch (true), or one after another in memory order
// (false). The same bits either way (every output sees the same operations in the same
// order); which is faster depends on the CPU's prefetchers, so Python times both once
// (native/__init__.py) and sets it.
void set_matvec_tiles(bool on);
bool matvec_tiles();
// Whether one-row calls that read rows in order fetch their next bytes early (qgemm.cpp
// kStreamAhead): the same bits either way; Python times it with the above.
void set_matvec_ahead(bool on);
bool matvec_ahead();

// Quantize rows [m0, m1) of x (float32, row stride ldx) into the buffers of `qx`.
// `xshift` (or null): each block's -shift_mul * sum of its int8 values.
void quantize_rows(const float* x, size_t ldx, int m0, int m1, int K, int group_size,
                   bool paired, int8_t* q, float* dx, float* xsum,
                   int32_t* xshift, int shift_mul, Isa isa);

// y[m, n] for m in [0, M), n in [n0, n1); y has row stride ldy.
void qgemm_rows(const QuantX& x, const QuantW& w, int n0, int n1, float* y, size_t ldy,
                Isa isa);

// Repack mlx-packed 5/6/8-bit rows (uint32 words, `words_per_row`) into the kernels' layout.
void repack_rows(const uint32_t* src, size_t words_per_row, int n0, int n1, int K, int bits,
                 uint8_t* dst);

}  // namespace forkv
