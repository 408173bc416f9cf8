// Inputs as the kernels read them: the helpers every primitive here shares.
#pragma once

#include <cstdint>
#include <vector>

#include "mlx/array.h"
#include "mlx/ops.h"
#include "qgemm.h"

namespace forkv {

// x's float32 elements in row order: its own buffer when row-contiguous, otherwise copied once
// into `buf` (a strided view such as a transposed or sliced activation).
inline const float* row_major(const mlx::core::array& x, std::vector<float>& buf) {
  const float* src = x.data<float>();
  if (x.flags().row_contiguous) return src;
  buf.resize(x.size());
  const auto& shape = x.shape();
  const auto& strides = x.strides();
  for (size_t i = 0; i < x.size(); ++i) {
    size_t rem = i;
    int64_t loc = 0;
    for (int d = int(shape.size()) - 1; d >= 0; --d) {
      loc += int64_t(rem % shape[d]) * strides[d];
      rem /= shape[d];
    }
    buf[i] = src[loc];
  }
  return buf.data();
}

// An evaluated, contiguous parameter as it is (no graph node: a decode step makes hundreds of
// these calls); anything else through a copy.
inline mlx::core::array as_is(const mlx::core::array& a, mlx::core::Stream s) {
  return a.is_available() && a.flags().row_contiguous ? a : mlx::core::contiguous(a, false, s);
}

// The function compiled for `isa`, from the three builds of one kernel body.
template <class F>
F by_isa(Isa isa, F avx512, F avx2, F portable) {
  return isa == Isa::avx512vnni ? avx512 : isa == Isa::avx2 ? avx2 : portable;
}

}  // namespace forkv
