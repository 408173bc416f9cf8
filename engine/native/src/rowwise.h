// Row-wise kernels for the decode step: RMS norm and rotary embedding, one primitive each.
//
// On the CPU, mlx runs mx.fast.rms_norm and mx.fast.rope as their unfused fallbacks (6 and
// ~10 graph ops); at decode, where a row is 640 or 256 floats, each op costs more to dispatch
// than to compute, and Gemma 3 makes 108 norms and 36 ropes a token. These compute a row in
// one pass, in the same order whatever the row count, the thread or the neighbouring rows.
#pragma once

#include <optional>

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "qgemm.h"

namespace forkv {

// x * rsqrt(mean(x^2, -1) + eps) * (w + offset), float32; x [..., D], w [D].
mlx::core::array rms_norm(const mlx::core::array& x, const mlx::core::array& w, float eps,
                          float offset);

// Rotary embedding of x [..., L, D] (float32) at positions offset + l, as mx.fast.rope:
// `dims` leading features rotated (pairs i, i + dims/2; or 2i, 2i + 1 when traditional),
// frequencies base^(-2i/dims), positions times `scale`. `offsets`, when given, holds one
// start position per index of x's first axis (int32 [B]); otherwise `offset` is used.
mlx::core::array rope(const mlx::core::array& x, int dims, bool traditional, float base,
                      float scale, int offset, const std::optional<mlx::core::array>& offsets);

// The kernels the primitives run, on `count` contiguous rows of D floats (the fused decoder
// blocks call them: the same code, so the same bits). rope_rows: x [B, ..., L, D] in row
// order, row r at position (offsets ? offsets[r / (count / B)] : offset) + r % L.
void rms_norm_rows(const float* x, int64_t count, int D, const float* w, float eps,
                   float offset, float* y, Isa isa);
void rope_rows(const float* x, int64_t B, int64_t L, int64_t count, int D, int dims,
               bool traditional, float base, float scale, int offset, float* y,
               const int32_t* offsets = nullptr);

class RmsNorm : public mlx::core::Primitive {
 public:
  RmsNorm(mlx::core::Stream s, float eps, float offset, Isa isa)
      : mlx::core::Primitive(s), eps_(eps), offset_(offset), isa_(isa) {}
  void eval_cpu(const std::vector<mlx::core::array>& in, std::vector<mlx::core::array>& out) override;
  void eval_gpu(const std::vector<mlx::core::array>& in, std::vector<mlx::core::array>& out) override;
  const char* name() const override { return "ForkvRmsNorm"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<mlx::core::array>& in) override;

 private:
  float eps_, offset_;
  Isa isa_;
};

class Rope : public mlx::core::Primitive {
 public:
  Rope(mlx::core::Stream s, int dims, bool traditional, float base, float scale, int offset,
       Isa isa)
      : mlx::core::Primitive(s), dims_(dims), traditional_(traditional), base_(base),
        scale_(scale), offset_(offset), isa_(isa) {}
  void eval_cpu(const std::vector<mlx::core::array>& in, std::vector<mlx::core::array>& out) override;
  void eval_gpu(const std::vector<mlx::core::array>& in, std::vector<mlx::core::array>& out) override;
  const char* name() const override { return "ForkvRope"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<mlx::core::array>& in) override;

 private:
  int dims_;
  bool traditional_;
  float base_, scale_;
  int offset_;
  Isa isa_;
};

}  // namespace forkv
