// Cached K/V stored narrower than float32 and widened to float32 as the attention kernel reads
// it: float16 or bfloat16 (half width), or q8_0 (8-bit with a float16 scale per 32 values, as
// llama.cpp's Q8_0). Widening is exact (every half value is a float32 value; a q8_0 value is
// one correctly rounded product d * q), so the kernel's arithmetic on the widened rows is the
// float32 path's on those values: a row's result does not depend on which ISA or which path
// (per block or the whole array at once) widened it.
#pragma once

#include <cstdint>

#include "qgemm.h"

namespace forkv {

enum class KvType : int { float32 = 0, float16 = 1, bfloat16 = 2, q8_0 = 3 };

// q8_0: a row of D values (D a multiple of 32) is D / 32 groups of 34 bytes, each the group's
// scale d as float16 bits (little endian) and then 32 int8 q; value i of the group is d * q[i].
constexpr int kQ8Group = 32;
constexpr int kQ8GroupBytes = 34;
constexpr int64_t q8_row_bytes(int64_t D) { return D / kQ8Group * kQ8GroupBytes; }

// dst[0, n) = the row at src widened to float32: n half values, or n values from n / 32 q8_0
// groups.
using WidenFn = void (*)(const uint8_t* src, float* dst, int n);

// The widening for `type` (float16, bfloat16 or q8_0) compiled for `isa`: F16C / AVX-512's
// vcvtph2ps for float16 where the ISA has it, a shift for bfloat16, scalar bit moves otherwise.
WidenFn widen_fn(KvType type, Isa isa);

// `rows` rows of D float32 values (D a multiple of 32) -> q8_0 rows of q8_row_bytes(D) bytes.
// Per group: d = max |x| / 127 rounded to float16 (capped at 65504), q = x / d rounded to
// nearest even and clamped to [-127, 127] (all q 0 where d is 0). One scalar build for every
// ISA, so a row quantizes to the same bytes wherever and in whatever call it is stored.
void quantize_q8_rows(const float* src, uint8_t* dst, int64_t rows, int D);

}  // namespace forkv
