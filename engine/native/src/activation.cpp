// The activation primitive and its kernel, compiled once per ISA from one body.
#include "activation.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "isa_attrs.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "pool.h"
#include "qmatmul.h"
#include "strided.h"
#include "vmath.h"

namespace forkv {

namespace mx = mlx::core;

namespace {

FORKV_INLINE void act_range(Act act, const float* x, const float* m, float* y, int64_t i0,
                            int64_t i1) {
  if (act == Act::gelu_approx) {
    if (m) {
      for (int64_t i = i0; i < i1; ++i) y[i] = vgelu_approx(x[i]) * m[i];
    } else {
      for (int64_t i = i0; i < i1; ++i) y[i] = vgelu_approx(x[i]);
    }
  } else if (m) {
    for (int64_t i = i0; i < i1; ++i) y[i] = vsilu(x[i]) * m[i];
  } else {
    for (int64_t i = i0; i < i1; ++i) y[i] = vsilu(x[i]);
  }
}

T512F void act512(Act a, const float* x, const float* m, float* y, int64_t i0, int64_t i1) {
  act_range(a, x, m, y, i0, i1);
}
T256F void act256(Act a, const float* x, const float* m, float* y, int64_t i0, int64_t i1) {
  act_range(a, x, m, y, i0, i1);
}
void act_portable(Act a, const float* x, const float* m, float* y, int64_t i0, int64_t i1) {
  act_range(a, x, m, y, i0, i1);
}

FORKV_INLINE float row_max(const float* x, int64_t V) {
  float mx16[16];
  for (int i = 0; i < 16; ++i) mx16[i] = -std::numeric_limits<float>::infinity();
  int64_t j = 0;
  for (; j + 16 <= V; j += 16)
    for (int i = 0; i < 16; ++i) mx16[i] = x[j + i] > mx16[i] ? x[j + i] : mx16[i];
  for (int i = 0; j < V; ++j, ++i) mx16[i] = x[j] > mx16[i] ? x[j] : mx16[i];
  float m = mx16[0];
  for (int i = 1; i < 16; ++i) m = mx16[i] > m ? mx16[i] : m;
  return m;
}

// sum of exp(x[j] - m) over [j0, j1): 16 lanes, then a fixed tree.
FORKV_INLINE float exp_sum(const float* x, int64_t j0, int64_t j1, float m) {
  float acc[16] = {};
  int64_t j = j0;
  for (; j + 16 <= j1; j += 16)
    for (int i = 0; i < 16; ++i) acc[i] += vexp(x[j + i] - m);
  for (int i = 0; j < j1; ++j, ++i) acc[i] += vexp(x[j] - m);
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) acc[i] += acc[i + w];
  return acc[0];
}

// log(sum(exp(x))) over a row: its max, then 16 lanes of exp sums and a fixed tree.
FORKV_INLINE float lse_row(const float* x, int64_t V) {
  const float m = row_max(x, V);
  if (!std::isfinite(m)) return m;  // all -inf (-inf), any +inf (+inf), NaN
  return m + std::log(exp_sum(x, 0, V, m));
}

T512F float lse512(const float* x, int64_t V) { return lse_row(x, V); }
T256F float lse256(const float* x, int64_t V) { return lse_row(x, V); }
float lse_portable(const float* x, int64_t V) { return lse_row(x, V); }

constexpr int64_t kSampleBlock = 1024;  // the scan's coarse step

// The row's draw (see sample() in activation.h): block sums first, then the scan walks the
// blocks and, inside the one where the running sum passes u * total, the tokens one by one.
// Float rounding can leave that walk short of the target: the block's last token with any
// weight is taken then. A row with no finite score (all excluded, or NaN) gives token 0.
FORKV_INLINE int32_t sample_row(const float* x, int64_t V, float u, float* blocks) {
  const float m = row_max(x, V);
  if (!std::isfinite(m)) return 0;
  const int64_t nb = (V + kSampleBlock - 1) / kSampleBlock;
  float total = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    blocks[b] = exp_sum(x, b * kSampleBlock, std::min(V, (b + 1) * kSampleBlock), m);
    total += blocks[b];
  }
  const float target = u * total;
  float run = 0.0f;
  int64_t b = 0;
  for (; b < nb - 1 && (blocks[b] == 0.0f || run + blocks[b] <= target); ++b) run += blocks[b];
  while (b > 0 && blocks[b] == 0.0f) run -= blocks[--b];  // (rounding ran past the weights)
  int64_t last = -1;
  for (int64_t j = b * kSampleBlock, j1 = std::min(V, (b + 1) * kSampleBlock); j < j1; ++j) {
    const float w = vexp(x[j] - m);
    if (w == 0.0f) continue;
    last = j;
    run += w;
    if (run > target) return int32_t(j);
  }
  return int32_t(last < 0 ? 0 : last);
}

T512F int32_t sample512(const float* x, int64_t V, float u, float* b) {
  return sample_row(x, V, u, b);
}
T256F int32_t sample256(const float* x, int64_t V, float u, float* b) {
  return sample_row(x, V, u, b);
}
int32_t sample_portable(const float* x, int64_t V, float u, float* b) {
  return sample_row(x, V, u, b);
}

// One row of draw(): lse as lse_row computes it; greedy, the first j whose x[j] - lse equals
// the rounded max (subtraction rounds monotonically, so that is the max of lp and mlx's argmax
// of lp); sampled, lp / t into `scores`, then sample_row.
FORKV_INLINE void draw_row(const float* x, int64_t V, float t, float u, float* scores,
                           float* blocks, int32_t* token, float* picked) {
  const float m = row_max(x, V);
  const float lse = std::isfinite(m) ? m + std::log(exp_sum(x, 0, V, m)) : m;
  int32_t tok = 0;
  if (std::isfinite(lse)) {
    if (t == 0.0f) {
      const float best = m - lse;
      for (int64_t j = 0; j < V; ++j)
        if (x[j] - lse == best) {
          tok = int32_t(j);
          break;
        }
    } else {
      for (int64_t j = 0; j < V; ++j) scores[j] = (x[j] - lse) / t;
      tok = sample_row(scores, V, u, blocks);
    }
  }
  *token = tok;
  *picked = x[tok] - lse;
}

T512F void draw512(const float* x, int64_t V, float t, float u, float* s, float* b, int32_t* k,
                   float* p) {
  draw_row(x, V, t, u, s, b, k, p);
}
T256F void draw256(const float* x, int64_t V, float t, float u, float* s, float* b, int32_t* k,
                   float* p) {
  draw_row(x, V, t, u, s, b, k, p);
}
void draw_portable(const float* x, int64_t V, float t, float u, float* s, float* b, int32_t* k,
                   float* p) {
  draw_row(x, V, t, u, s, b, k, p);
}

}  // namespace

void Draw::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (auto& out : outputs) {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    encoder.set_output_array(out);
  }
  std::vector<mx::array> in;
  for (const auto& a : inputs) {
    encoder.set_input_array(a);
    in.push_back(mx::array::unsafe_weak_copy(a));
  }
  encoder.dispatch([in = std::move(in), tok = mx::array::unsafe_weak_copy(outputs[0]),
                    lp = mx::array::unsafe_weak_copy(outputs[1]), isa = isa_]() mutable {
    thread_local std::vector<float> buf, tbuf, ubuf, vbuf;
    const float* xp = row_major(in[0], buf);
    const float* tp = row_major(in[1], tbuf);
    const float* up = row_major(in[2], ubuf);
    const int32_t* lim = in[3].data<int32_t>();  // (made row-contiguous by draw())
    const int32_t* bid = in[4].data<int32_t>();
    const float* bval = row_major(in[5], vbuf);
    const int64_t V = in[0].shape(-1), rows = int64_t(tok.size()), nb = in[4].shape(-1);
    auto* fn = by_isa(isa, &draw512, &draw256, &draw_portable);
    int32_t* ty = tok.data<int32_t>();
    float* ly = lp.data<float>();
    // A row is a few hundred microseconds of work: one thread per row while rows remain.
    Pool& p = pool();
    const int threads = int(std::min<int64_t>(rows, std::max(1, std::min(current_threads(),
                                                                         p.num_threads()))));
    std::atomic<int64_t> next{0};
    p.run(std::max(1, threads), [&](int) {
      thread_local std::vector<float> scores, blocks, row;
      scores.resize(size_t(V));
      blocks.resize(size_t((V + kSampleBlock - 1) / kSampleBlock) + 1);
      for (int64_t r; (r = next.fetch_add(1)) < rows;) {
        const float* x = xp + r * V;
        const int32_t* rb = bid + r * nb;
        const bool biased = nb > 0 && rb[0] >= 0;
        if (lim[r] < V || biased) {  // the sampler's mask, then its logit bias, on a copy
          row.resize(size_t(V));
          const int64_t keep = std::max<int64_t>(0, std::min<int64_t>(lim[r], V));
          std::copy(x, x + keep, row.data());
          std::fill(row.data() + keep, row.data() + V, -std::numeric_limits<float>::infinity());
          for (int64_t b = 0; b < nb && rb[b] >= 0; ++b)
            if (rb[b] < V) row[size_t(rb[b])] += bval[r * nb + b];
          x = row.data();
        }
        fn(x, V, tp[r], up[r], scores.data(), blocks.data(), ty + r, ly + r);
      }
    });
  });
}

void Draw::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("forkv's draw runs on the CPU only.");
}

bool Draw::is_equivalent(const mx::Primitive& other) const {
  return isa_ == static_cast<const Draw&>(other).isa_;
}

std::vector<mx::Shape> Draw::output_shapes(const std::vector<mx::array>& inputs) {
  auto shape = inputs[0].shape();
  shape.pop_back();
  return {shape, shape};
}

std::vector<mx::array> draw(const mx::array& logits, const mx::array& t, const mx::array& u,
                           const std::optional<mx::array>& limit,
                           const std::optional<mx::array>& bias_ids,
                           const std::optional<mx::array>& bias_values) {
  if (logits.ndim() != 2 || logits.shape(1) < 1)
    throw std::invalid_argument("forkv draw: logits must be [rows, vocab] with a vocab");
  if (logits.dtype() != mx::float32 || t.dtype() != mx::float32 || u.dtype() != mx::float32)
    throw std::invalid_argument("forkv draw: logits, t and u must be float32");
  const int R = logits.shape(0), V = logits.shape(1);
  const mx::Shape rows{R};
  if (t.shape() != rows || u.shape() != rows)
    throw std::invalid_argument("forkv draw: t and u must hold one number per row of logits");
  const auto s = mx::to_stream(mx::Device::cpu);
  mx::array lim = limit ? *limit : mx::full(rows, V, mx::int32, s);
  if (lim.dtype() != mx::int32 || lim.shape() != rows)
    throw std::invalid_argument("forkv draw: limit must be int32, one per row");
  if (bias_ids.has_value() != bias_values.has_value())
    throw std::invalid_argument("forkv draw: bias_ids and bias_values come together");
  mx::array ids = bias_ids ? *bias_ids : mx::zeros({R, 0}, mx::int32, s);
  mx::array vals = bias_values ? *bias_values : mx::zeros({R, 0}, mx::float32, s);
  if (ids.ndim() != 2 || ids.shape(0) != R || ids.dtype() != mx::int32 ||
      vals.shape() != ids.shape() || vals.dtype() != mx::float32)
    throw std::invalid_argument("forkv draw: bias_ids (int32) and bias_values (float32) must "
                                "be [rows, n], ids -1 after a row's last entry");
  return mx::array::make_arrays(
      {rows, rows}, {mx::int32, mx::float32},
      std::make_shared<Draw>(s, current_isa()),
      {logits, t, u, mx::contiguous(lim, false, s), mx::contiguous(ids, false, s), vals});
}

void Sample::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(inputs[0]);
  encoder.set_input_array(inputs[1]);
  encoder.set_output_array(out);
  encoder.dispatch([x = mx::array::unsafe_weak_copy(inputs[0]),
                    u = mx::array::unsafe_weak_copy(inputs[1]),
                    out = mx::array::unsafe_weak_copy(out), isa = isa_]() mutable {
    thread_local std::vector<float> buf, ubuf, blocks;
    const float* xp = row_major(x, buf);
    const float* up = row_major(u, ubuf);
    const int64_t V = x.shape(-1), rows = int64_t(out.size());
    blocks.resize(size_t((V + kSampleBlock - 1) / kSampleBlock) + 1);
    auto* fn = by_isa(isa, &sample512, &sample256, &sample_portable);
    int32_t* y = out.data<int32_t>();
    for (int64_t r = 0; r < rows; ++r) y[r] = fn(xp + r * V, V, up[r], blocks.data());
  });
}

void Sample::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("forkv's sample runs on the CPU only.");
}

bool Sample::is_equivalent(const mx::Primitive& other) const {
  return isa_ == static_cast<const Sample&>(other).isa_;
}

std::vector<mx::Shape> Sample::output_shapes(const std::vector<mx::array>& inputs) {
  auto shape = inputs[0].shape();
  shape.pop_back();
  return {shape};
}

mx::array sample(const mx::array& scores, const mx::array& u) {
  if (scores.ndim() < 1 || scores.shape(-1) < 1)
    throw std::invalid_argument("forkv sample: scores must have a non-empty last axis");
  if (scores.dtype() != mx::float32 || u.dtype() != mx::float32)
    throw std::invalid_argument("forkv sample: scores and u must be float32");
  auto shape = scores.shape();
  shape.pop_back();
  if (u.shape() != shape)
    throw std::invalid_argument("forkv sample: u must hold one number per row of scores");
  return mx::array(shape, mx::int32,
                   std::make_shared<Sample>(mx::to_stream(mx::Device::cpu), current_isa()),
                   {scores, u});
}

void LogSumExp::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(inputs[0]);
  encoder.set_output_array(out);
  encoder.dispatch([x = mx::array::unsafe_weak_copy(inputs[0]),
                    out = mx::array::unsafe_weak_copy(out), isa = isa_]() mutable {
    thread_local std::vector<float> buf;
    const float* xp = row_major(x, buf);
    const int64_t V = x.shape(-1), rows = V ? int64_t(x.size()) / V : int64_t(out.size());
    auto* fn = by_isa(isa, &lse512, &lse256, &lse_portable);
    float* y = out.data<float>();
    for (int64_t r = 0; r < rows; ++r) y[r] = fn(xp + r * V, V);
  });
}

void LogSumExp::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("forkv's logsumexp runs on the CPU only.");
}

bool LogSumExp::is_equivalent(const mx::Primitive& other) const {
  return isa_ == static_cast<const LogSumExp&>(other).isa_;
}

std::vector<mx::Shape> LogSumExp::output_shapes(const std::vector<mx::array>& inputs) {
  auto shape = inputs[0].shape();
  shape.back() = 1;
  return {shape};
}

mx::array logsumexp(const mx::array& x) {
  if (x.ndim() < 1) throw std::invalid_argument("forkv logsumexp: x must have a last axis");
  if (x.dtype() != mx::float32) throw std::invalid_argument("forkv logsumexp: x must be float32");
  auto shape = x.shape();
  shape.back() = 1;
  return mx::array(shape, mx::float32,
                   std::make_shared<LogSumExp>(mx::to_stream(mx::Device::cpu), current_isa()),
                   {x});
}

void Activation::eval_cpu(const std::vector<mx::array>& inputs,
                          std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& a : inputs) encoder.set_input_array(a);
  encoder.set_output_array(out);
  std::vector<mx::array> in;
  for (const auto& a : inputs) in.push_back(mx::array::unsafe_weak_copy(a));
  encoder.dispatch([in = std::move(in), out = mx::array::unsafe_weak_copy(out), act = act_,
                    isa = isa_]() mutable {
    thread_local std::vector<float> xbuf, mbuf;
    const float* x = row_major(in[0], xbuf);
    const float* m = in.size() > 1 ? row_major(in[1], mbuf) : nullptr;
    activation_rows(act, x, m, out.data<float>(), int64_t(out.size()), isa);
  });
}

void activation_rows(Act act, const float* x, const float* m, float* y, int64_t n, Isa isa) {
  auto* fn = by_isa(isa, &act512, &act256, &act_portable);
  // Split in 64-element-aligned pieces once there is enough work to wake the pool; an
  // element's value does not depend on the piece it falls in.
  Pool& p = pool();
  const int threads =
      n >= (1 << 15) ? std::max(1, std::min(current_threads(), p.num_threads())) : 1;
  p.run(threads, [&](int t) {
    const int64_t i0 = (n * t / threads) & ~int64_t(63);
    const int64_t i1 = t + 1 == threads ? n : (n * (t + 1) / threads) & ~int64_t(63);
    fn(act, x, m, y, i0, i1);
  });
}

void Activation::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("forkv's activation runs on the CPU only.");
}

bool Activation::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const Activation&>(other);
  return act_ == o.act_ && isa_ == o.isa_;
}

std::vector<mx::Shape> Activation::output_shapes(const std::vector<mx::array>& inputs) {
  return {inputs[0].shape()};
}

mx::array activation(const mx::array& x, const std::string& kind,
                     const std::optional<mx::array>& mul) {
  Act act;
  if (kind == "gelu_approx") {
    act = Act::gelu_approx;
  } else if (kind == "silu") {
    act = Act::silu;
  } else {
    throw std::invalid_argument("forkv activation: unknown kind '" + kind +
                                "'; use gelu_approx or silu");
  }
  if (x.dtype() != mx::float32) throw std::invalid_argument("forkv activation: x must be float32");
  auto s = mx::to_stream(mx::Device::cpu);
  std::vector<mx::array> inputs = {x};
  if (mul) {
    if (mul->shape() != x.shape() || mul->dtype() != mx::float32)
      throw std::invalid_argument("forkv activation: mul must be float32 with x's shape");
    inputs.push_back(*mul);
  }
  return mx::array(x.shape(), mx::float32, std::make_shared<Activation>(s, act, current_isa()),
                   std::move(inputs));
}

}  // namespace forkv
