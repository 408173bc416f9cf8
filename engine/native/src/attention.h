// Attention on the CPU: decode (one query row per sequence) and prefill (many), one kernel.
//
// mlx's CPU backend runs scaled_dot_product_attention as separate matmul, softmax and matmul
// ops over every query head and every key, with exp evaluated one element at a time; in a
// 4K-token Gemma 3 prefill that is ~5 s of ~15. This kernel reads each K and V row once for
// all the query heads that share it (GQA), uses a vectorized exp, and skips keys that a causal
// or window mask removes. Each query row is computed on its own, its keys split into blocks of
// 256 that end at the row's own position, whose partial softmax sums are combined in block
// order. So a row's result depends neither on the thread count, nor on the other sequences or
// rows in the call, nor on how the keys are laid out (a sliding window's ring or a longer
// concatenation): a prefill row gives the same bits as a decode step over the same keys.
#pragma once

#include <optional>

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "qgemm.h"

namespace forkv {

// q [B, Hq, L, D]; k, v [B, Hkv, S, D] with Hq a multiple of Hkv, D a multiple of 16 and
// L <= S; q float32, k and v float32, float16 or bfloat16 (both the same: half-width cached
// K/V, widened exactly as they are read), or both q8_0 rows (uint8 [B, Hkv, S, D / 32 * 34],
// D a multiple of 32: halfkv.h). mask, broadcastable to [B, Hq, L, S]: bool (keep
// where true) or float (added to the scores). causal: query row i sees keys j <= S - L + i (mlx's "causal").
// rot: key j in time order is row (j + rot) % S of k, v and the mask (a wrapped ring cache,
// newest key last in time order). Returns [B, Hq, L, D] float32; a row that sees no key is
// zeros.
mlx::core::array attention(const mlx::core::array& q, const mlx::core::array& k,
                           const mlx::core::array& v, float scale,
                           const std::optional<mlx::core::array>& mask, bool causal,
                           int rot = 0);

// attention() for one query row per sequence (L == 1).
mlx::core::array decode_attention(const mlx::core::array& q, const mlx::core::array& k,
                                  const mlx::core::array& v, float scale,
                                  const std::optional<mlx::core::array>& mask);

// The kernel attention() runs, on evaluated inputs {q, k, v[, mask as [B, Hq, L, S]]} (mask
// kind 0 none, 1 bool, 2 float32), into out [B, Hq, L, D].
void attention_eval(const std::vector<mlx::core::array>& in, float* out, float scale,
                    int mask_kind, bool causal, int rot, Isa isa);

// x [..., D] float32 (D a multiple of 32) -> uint8 [..., D / 32 * 34]: the q8_0 rows a q8_0
// K/V cache stores (halfkv.h's quantize_q8_rows, as attn_in stores them).
mlx::core::array quantize_kv(const mlx::core::array& x);

class KvQuantize : public mlx::core::Primitive {
 public:
  explicit KvQuantize(mlx::core::Stream stream) : mlx::core::Primitive(stream) {}
  void eval_cpu(const std::vector<mlx::core::array>& inputs,
                std::vector<mlx::core::array>& outputs) override;
  void eval_gpu(const std::vector<mlx::core::array>& inputs,
                std::vector<mlx::core::array>& outputs) override;
  const char* name() const override { return "ForkvKvQuantize"; }
  bool is_equivalent(const mlx::core::Primitive&) const override { return true; }
  std::vector<mlx::core::Shape> output_shapes(const std::vector<mlx::core::array>& inputs) override;
};

class Attention : public mlx::core::Primitive {
 public:
  Attention(mlx::core::Stream stream, float scale, int mask_kind, bool causal, int rot, Isa isa)
      : mlx::core::Primitive(stream), scale_(scale), mask_kind_(mask_kind), causal_(causal),
        rot_(rot), isa_(isa) {}
  void eval_cpu(const std::vector<mlx::core::array>& inputs,
                std::vector<mlx::core::array>& outputs) override;
  void eval_gpu(const std::vector<mlx::core::array>& inputs,
                std::vector<mlx::core::array>& outputs) override;
  const char* name() const override { return "ForkvAttention"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<mlx::core::array>& inputs) override;

 private:
  float scale_;
  int mask_kind_;  // 0 none, 1 bool, 2 float
  bool causal_;
  int rot_;
  Isa isa_;
};

}  // namespace forkv
