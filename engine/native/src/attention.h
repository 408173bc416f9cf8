// Attention for one new token per sequence (decode) on the CPU.
//
// mlx's CPU backend runs scaled_dot_product_attention as separate matmul, softmax and matmul
// ops over every query head, which at 4K context costs ~10x the time of reading K and V once.
// This kernel reads each K and V row once for all the query heads that share it (GQA) and
// splits S into fixed blocks of 256 whose partial softmax sums are combined in block order,
// so a sequence's result never depends on the thread count or the other sequences in the batch.
#pragma once

#include <optional>

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "qgemm.h"

namespace forkv {

// q [B, Hq, 1, D]; k, v [B, Hkv, S, D] with Hq a multiple of Hkv and D a multiple of 16;
// float32. mask, broadcastable to [B, Hq, 1, S]: bool (keep where true) or float (added to
// the scores). Returns [B, Hq, 1, D] float32.
mlx::core::array decode_attention(const mlx::core::array& q, const mlx::core::array& k,
                                  const mlx::core::array& v, float scale,
                                  const std::optional<mlx::core::array>& mask);

class DecodeAttention : public mlx::core::Primitive {
 public:
  DecodeAttention(mlx::core::Stream stream, float scale, int mask_kind, Isa isa)
      : mlx::core::Primitive(stream), scale_(scale), mask_kind_(mask_kind), isa_(isa) {}
  void eval_cpu(const std::vector<mlx::core::array>& inputs,
                std::vector<mlx::core::array>& outputs) override;
  void eval_gpu(const std::vector<mlx::core::array>& inputs,
                std::vector<mlx::core::array>& outputs) override;
  const char* name() const override { return "ForkvDecodeAttention"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<mlx::core::array>& inputs) override;

 private:
  float scale_;
  int mask_kind_;  // 0 none, 1 bool, 2 float
  Isa isa_;
};

}  // namespace forkv
