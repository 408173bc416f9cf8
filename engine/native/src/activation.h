// The kernels built on vmath.h's vectorized exp: the MLP's activations (gelu's tanh
// approximation and silu, optionally times a second operand: swiglu) and the sampler's
// logsumexp over a vocabulary row, one mlx primitive each.
//
// mlx's CPU backend evaluates tanh and exp one element at a time: Gemma 3's gelu over one
// 256 x 2048 prefill chunk takes 16 ms there, longer than the matmul that feeds it. These use
// vmath.h's vectorized exp, one pass over the elements, the same operations for every element.
#pragma once

#include <optional>

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "qgemm.h"

namespace forkv {

enum class Act : int { gelu_approx = 0, silu = 1 };

// act(x), or act(x) * mul when `mul` is given (same shape); float32.
mlx::core::array activation(const mlx::core::array& x, const std::string& kind,
                            const std::optional<mlx::core::array>& mul);

// The kernel activation() runs: y[i] = act(x[i]) (times m[i] where m is given), i < n.
void activation_rows(Act act, const float* x, const float* m, float* y, int64_t n, Isa isa);

// log(sum(exp(x))) over the last axis, keeping it (x [..., V] -> [..., 1]); float32. A row is
// reduced in one fixed order (max, then 16 lanes of exp sums and a fixed tree), so its value
// never depends on the other rows. mlx's takes ~5 ms over Gemma 3's 262,144 logits here.
mlx::core::array logsumexp(const mlx::core::array& x);

class LogSumExp : public mlx::core::Primitive {
 public:
  LogSumExp(mlx::core::Stream s, Isa isa) : mlx::core::Primitive(s), isa_(isa) {}
  void eval_cpu(const std::vector<mlx::core::array>& in, std::vector<mlx::core::array>& out) override;
  void eval_gpu(const std::vector<mlx::core::array>& in, std::vector<mlx::core::array>& out) override;
  const char* name() const override { return "ForkvLogSumExp"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<mlx::core::array>& in) override;

 private:
  Isa isa_;
};

// One draw per row of `scores` [..., V] (float32: log-weights, -inf for excluded tokens):
// the first token whose running sum of exp(score - max), in token order, passes u * total,
// with `u` [...] (float32, uniform in [0, 1), one per row) — inverse-CDF sampling, so a draw
// needs one random number rather than mlx's categorical's Gumbel noise for every token
// (~2.6 ms a row over Gemma 3's 262,144 logits here, ~0.3 ms this way). int32 [...].
mlx::core::array sample(const mlx::core::array& scores, const mlx::core::array& u);

class Sample : public mlx::core::Primitive {
 public:
  Sample(mlx::core::Stream s, Isa isa) : mlx::core::Primitive(s), isa_(isa) {}
  void eval_cpu(const std::vector<mlx::core::array>& in, std::vector<mlx::core::array>& out) override;
  void eval_gpu(const std::vector<mlx::core::array>& in, std::vector<mlx::core::array>& out) override;
  const char* name() const override { return "ForkvSample"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<mlx::core::array>& in) override;

 private:
  Isa isa_;
};

// The sampler's whole draw for each row of `logits` [R, V] (float32) in one call, rows spread
// over the pool. A row's ids from limit[r] (int32 [R]; default V) on are -inf, then its logit
// bias is added (bias_ids int32 [R, n], -1 after the row's last entry, bias_values float32
// [R, n]); then lp = logits - logsumexp(logits); with temperature t[r] == 0 the first token of
// highest lp (mlx's argmax of lp), else sample() of lp / t[r] with u[r]. Returns the tokens
// (int32 [R]) and their lp (float32 [R]): the bits of those ops run one by one, so a row draws
// the same token alone, in a batch or in a verify chunk. A row with no finite logsumexp gives
// token 0. One call instead of ~7 graph nodes a row, each a pass over a 262,144-wide row.
std::vector<mlx::core::array> draw(const mlx::core::array& logits, const mlx::core::array& t,
                                   const mlx::core::array& u,
                                   const std::optional<mlx::core::array>& limit,
                                   const std::optional<mlx::core::array>& bias_ids,
                                   const std::optional<mlx::core::array>& bias_values);

class Draw : public mlx::core::Primitive {
 public:
  Draw(mlx::core::Stream s, Isa isa) : mlx::core::Primitive(s), isa_(isa) {}
  void eval_cpu(const std::vector<mlx::core::array>& in, std::vector<mlx::core::array>& out) override;
  void eval_gpu(const std::vector<mlx::core::array>& in, std::vector<mlx::core::array>& out) override;
  const char* name() const override { return "ForkvDraw"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<mlx::core::array>& in) override;

 private:
  Isa isa_;
};

class Activation : public mlx::core::Primitive {
 public:
  Activation(mlx::core::Stream s, Act act, Isa isa)
      : mlx::core::Primitive(s), act_(act), isa_(isa) {}
  void eval_cpu(const std::vector<mlx::core::array>& in, std::vector<mlx::core::array>& out) override;
  void eval_gpu(const std::vector<mlx::core::array>& in, std::vector<mlx::core::array>& out) override;
  const char* name() const override { return "ForkvActivation"; }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<mlx::core::array>& in) override;

 private:
  Act act_;
  Isa isa_;
};

}  // namespace forkv
