// Cached K/V stored at half width (float16 or bfloat16), widened to float32 as the attention
// kernel reads it. Both conversions are exact (every half value is a float32 value), so the
// kernel's arithmetic on the widened rows is the float32 path's on those values: a row's result
// does not depend on which ISA or which path (per block or the whole array at once) widened it.
#pragma once

#include <cstdint>

#include "qgemm.h"

namespace forkv {

enum class KvType : int { float32 = 0, float16 = 1, bfloat16 = 2 };

// dst[0, n) = src[0, n) widened to float32.
using WidenFn = void (*)(const uint16_t* src, float* dst, int n);

// The widening for `type` (float16 or bfloat16) compiled for `isa`: F16C / AVX-512's
// vcvtph2ps for float16 where the ISA has it, a shift for bfloat16, scalar bit moves otherwise.
WidenFn widen_fn(KvType type, Isa isa);

}  // namespace forkv
