#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "qgemm.h"

namespace forkv {

// y = x @ dequantize(w).T, with x's dtype; w, scales, biases from `repack` or mlx's packing.
// Without biases the groups are symmetric (bias -2^(bits-1) scale) and scales may be float16.
mlx::core::array quantized_matmul(const mlx::core::array& x, const mlx::core::array& w,
                                  const mlx::core::array& scales,
                                  const std::optional<mlx::core::array>& biases, int bits,
                                  int group_size);

// The same product in one call for several column ranges of w (its rows in order: `widths`
// add up to N), each range its own contiguous output; every value is the bits of
// `quantized_matmul` (a column's value does not depend on the other columns of the call).
std::vector<mlx::core::array> quantized_matmul_split(
    const mlx::core::array& x, const mlx::core::array& w, const mlx::core::array& scales,
    const std::optional<mlx::core::array>& biases, int bits, int group_size,
    const std::vector<int>& widths);

// The kernel both calls run: x [M, K] (row-major float32) times w's rows, the columns
// [ends[s], ends[s+1]) into ys[s] (row stride ends[s+1] - ends[s]).
void run_qgemm(const float* x, int M, int K, const QuantW& w, const std::vector<int>& ends,
               const std::vector<float*>& ys, Isa isa);

// Evaluated kernel arrays (as `matmul_inputs` checks them) as the kernels read them.
QuantW quant_w(const mlx::core::array& w, const mlx::core::array& scales,
               const mlx::core::array* biases, int N, int K, int bits, int group_size);

// mlx-packed 5/6/8-bit weights [N, K*bits/32] as the kernels read them [N, row_bytes].
mlx::core::array repack(const mlx::core::array& w, int K, int bits);

// Copies of evaluated arrays (weights) in one new buffer, each starting on a 64-byte
// boundary, so the kernels' whole-line loads never straddle two cache lines; with `huge`, the
// buffer's pages are advised MADV_HUGEPAGE before the copy faults them in (so they come as
// 2 MiB pages, small arrays included: a decode step streams every weight once and on 4 KiB
// pages its matmuls wait on TLB misses) and collapsed after it (MADV_COLLAPSE, Linux 6.1+,
// where a fault found no huge page free). Returns the copies (views of the buffer, same
// shapes, dtypes and values) and the bytes on huge pages: 0 where the kernel or its settings
// do not allow them (THP "never", older Linux, not Linux).
std::pair<std::vector<mlx::core::array>, size_t> pack_arrays(
    const std::vector<mlx::core::array>& arrays, bool huge);

Isa current_isa();
void set_isa(Isa isa);  // tests and benchmarks: a lower ISA than the best
int current_threads();
void set_threads(int n);  // 0: the pool's size

class QuantizedMatmul : public mlx::core::Primitive {
 public:
  // `ends`: the column ranges of a split call's outputs ({0, ..., N}); empty: one output
  QuantizedMatmul(mlx::core::Stream stream, int bits, int group_size, int N, int K, Isa isa,
                  std::vector<int> ends = {})
      : mlx::core::Primitive(stream), bits_(bits), group_size_(group_size), N_(N), K_(K),
        isa_(isa), ends_(std::move(ends)) {}
  void eval_cpu(const std::vector<mlx::core::array>& inputs,
                std::vector<mlx::core::array>& outputs) override;
  void eval_gpu(const std::vector<mlx::core::array>& inputs,
                std::vector<mlx::core::array>& outputs) override;
  const char* name() const override { return "ForkvQuantizedMatmul"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<mlx::core::array>& inputs) override;

 private:
  int bits_, group_size_, N_, K_;
  Isa isa_;
  std::vector<int> ends_;
};

}  // namespace forkv
