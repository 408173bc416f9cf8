// A decoder layer's two halves around its K/V cache, one mlx primitive each: what the rest of
// engine/native computes for a llama or Gemma 3 layer in ~25 graph nodes (norms, the q/k/v
// and gate/up matmuls, reshapes and transposes, ropes, casts, attention, residual adds).
//
// AttnIn: the input norm, the q/k/v projections, the q/k norms (Gemma 3) and the ropes,
// giving q [B, Hq, L, hd] float32 and k, v [B, Hkv, L, hd] in the cache's dtype, for mlx-lm's
// cache to store. BlockOut: attention over the cache's keys, o_proj, the residual, the MLP
// (its norms, gate/up, activation, down) and the second residual. Each step calls the very
// kernel function the separate primitive runs, on the same values in the same order, so
// every output is the bits of the separate calls (tests/test_native_blocks.py); what is saved
// is ~20 graph nodes a layer and the Python that builds them.
#pragma once

#include <string>
#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "qgemm.h"

namespace forkv {

// One quantized linear of a block: indices into the primitive's inputs (biases -1 for
// symmetric groups) and the widths its one call splits into (q, k, v or gate, up).
struct BlockLinear {
  int w = -1, scales = -1, biases = -1;
  int bits = 4, group_size = 32, N = 0, K = 0;
  std::vector<int> ends;  // {0, ..., N}
};

struct BlockShape {
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float eps = 0.0f, norm_offset = 0.0f;  // the layer's RMS norms: weight + offset
  // AttnIn
  bool qk_norm = false;
  float qk_eps = 0.0f;
  int rope_dims = 0;
  bool rope_traditional = false;
  float rope_base = 0.0f, rope_scale = 1.0f;
  int offset = 0;
  bool row_offsets = false;  // an int32 [B] input after the q/k norms: each row's position
  mlx::core::Dtype kv_dtype = mlx::core::float32;
  // The last axis of the K and V attn_in stores: head_dim, or a q8_0 row's bytes (uint8).
  int kv_width() const;
  // BlockOut
  int mask_kind = 0;  // 0 none, 1 bool, 2 float
  bool causal = false, sandwich = false;  // sandwich: Gemma's post-attention/-MLP norms
  int rot = 0;
  float scale = 1.0f;
  int act = 0;             // Act
  bool act_mul = false;    // act(gate) * up in the activation call (swiglu) or after it
  int num_o = 1, num_gate_up = 1;  // linears: o's, then gate/up's, then down's
};

// `specs`: one per linear, [w, scales, biases or -1, bits, group_size, width...], indices
// into `arrays`. `offsets` (a batch cache's, one per row) replace `offset` as the ropes'
// positions, as the rope primitive takes them.
std::vector<mlx::core::array> attn_in(
    const mlx::core::array& x, const mlx::core::array& norm,
    const std::vector<mlx::core::array>& qk_norms, const std::vector<mlx::core::array>& arrays,
    const std::vector<std::vector<int>>& specs, float eps, float norm_offset, float qk_eps,
    int n_heads, int n_kv_heads, int head_dim, int rope_dims, bool rope_traditional,
    float rope_base, float rope_scale, int offset, const std::string& kv_dtype,
    const std::optional<mlx::core::array>& offsets);

// `norms`: [pre-MLP] or, sandwiched, [post-attention, pre-MLP, post-MLP]; `counts`: how many
// of the linears are o_proj's and gate/up's (down's the rest).
mlx::core::array block_out(
    const mlx::core::array& q, const mlx::core::array& keys, const mlx::core::array& values,
    const std::optional<mlx::core::array>& mask, bool causal, int rot, float scale,
    const mlx::core::array& x, const std::vector<mlx::core::array>& norms,
    const std::vector<mlx::core::array>& arrays, const std::vector<std::vector<int>>& specs,
    const std::vector<int>& counts, float eps, float norm_offset, const std::string& act,
    bool act_mul);

class DecoderBlock : public mlx::core::Primitive {
 public:
  DecoderBlock(mlx::core::Stream s, bool out_half, BlockShape shape,
               std::vector<BlockLinear> lins, Isa isa)
      : mlx::core::Primitive(s), out_half_(out_half), shape_(std::move(shape)),
        lins_(std::move(lins)), isa_(isa) {}
  void eval_cpu(const std::vector<mlx::core::array>& in, std::vector<mlx::core::array>& out) override;
  void eval_gpu(const std::vector<mlx::core::array>& in, std::vector<mlx::core::array>& out) override;
  const char* name() const override { return out_half_ ? "ForkvBlockOut" : "ForkvAttnIn"; }
  bool is_equivalent(const mlx::core::Primitive&) const override { return false; }
  std::vector<mlx::core::Shape> output_shapes(const std::vector<mlx::core::array>& in) override;

 private:
  bool out_half_;  // BlockOut, else AttnIn
  BlockShape shape_;
  std::vector<BlockLinear> lins_;
  Isa isa_;
};

}  // namespace forkv
