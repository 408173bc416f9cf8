// Decode attention: the mlx primitive and its kernel, compiled once per ISA from one body.
#include "attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "isa_attrs.h"
#include "mlx/backend/cpu/encoder.h"
#include "pool.h"
#include "qmatmul.h"
#include "strided.h"

namespace forkv {

namespace mx = mlx::core;

namespace {

constexpr int kBlock = 256;  // S rows per work item: fixed, so the sums' order is too
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A [B, H, S, D] operand: element strides, D's being 1.
struct View {
  const float* p = nullptr;
  int64_t s0 = 0, s1 = 0, s2 = 0;
};

struct Args {
  int B = 0, Hq = 0, Hkv = 0, S = 0, D = 0;
  View q, k, v;
  int mask_kind = 0;
  const void* mask = nullptr;
  int64_t m0 = 0, m1 = 0, m3 = 0;  // mask strides over b, query head, s
  float scale = 1.0f;
};


// Sixteen independent lanes, then a fixed tree: the compiler vectorizes it for the ISA of the
// function it is inlined into, and the order of the additions is the same for every call.
FORKV_INLINE float dot(const float* a, const float* b, int D) {
  float acc[16] = {};
  for (int d = 0; d < D; d += 16)
    for (int i = 0; i < 16; ++i) acc[i] += a[d + i] * b[d + i];
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) acc[i] += acc[i + w];
  return acc[0];
}

// The partial softmax of the G query heads of (b, h) over S rows [j0, j0 + n): per head its
// max, its sum of exp(score - max) and the weighted sum of V rows (`part`, G x (2 + D)).
FORKV_INLINE void block(const Args& a, int b, int h, int j0, int n, float* part,
                        float* scores) {
  const int G = a.Hq / a.Hkv, D = a.D;
  const float* kb = a.k.p + b * a.k.s0 + h * a.k.s1;
  const float* vb = a.v.p + b * a.v.s0 + h * a.v.s1;
  for (int jj = 0; jj < n; ++jj) {  // each K row once for all G heads
    const float* kr = kb + (j0 + jj) * a.k.s2;
    for (int g = 0; g < G; ++g) {
      const int hq = h * G + g;
      float s = dot(a.q.p + b * a.q.s0 + hq * a.q.s1, kr, D) * a.scale;
      const int64_t mi = b * a.m0 + hq * a.m1 + (j0 + jj) * a.m3;
      if (a.mask_kind == 1 && !static_cast<const bool*>(a.mask)[mi]) s = kNegInf;
      if (a.mask_kind == 2) s += static_cast<const float*>(a.mask)[mi];
      scores[g * kBlock + jj] = s;
    }
  }
  for (int g = 0; g < G; ++g) {
    float* sg = scores + g * kBlock;
    float* pg = part + g * (2 + D);
    float m = kNegInf;
    for (int jj = 0; jj < n; ++jj) m = std::max(m, sg[jj]);
    float l = 0.0f;
    for (int jj = 0; jj < n; ++jj) {
      const float p = m == kNegInf ? 0.0f : std::exp(sg[jj] - m);
      sg[jj] = p;
      l += p;
    }
    pg[0] = m;
    pg[1] = l;
    std::fill(pg + 2, pg + 2 + D, 0.0f);
  }
  for (int jj = 0; jj < n; ++jj) {  // each V row once for all G heads
    const float* vr = vb + (j0 + jj) * a.v.s2;
    for (int g = 0; g < G; ++g) {
      const float p = scores[g * kBlock + jj];
      float* acc = part + g * (2 + D) + 2;
      for (int d = 0; d < D; ++d) acc[d] += p * vr[d];
    }
  }
}

// Blocks combined in order: out = sum_b exp(m_b - M) acc_b / sum_b exp(m_b - M) l_b.
FORKV_INLINE void combine(const Args& a, int b, int hq, int num_blocks, const float* parts,
                          float* out) {
  const int G = a.Hq / a.Hkv, D = a.D, h = hq / G, g = hq % G;
  const size_t item = size_t(G) * (2 + D);
  const float* first = parts + size_t(b * a.Hkv + h) * num_blocks * item + g * (2 + D);
  float M = kNegInf;
  for (int i = 0; i < num_blocks; ++i) M = std::max(M, first[i * item]);
  std::fill(out, out + D, 0.0f);
  if (M == kNegInf) return;  // every position masked out
  float L = 0.0f;
  for (int i = 0; i < num_blocks; ++i) {
    const float* pg = first + i * item;
    if (pg[1] == 0.0f) continue;
    const float w = std::exp(pg[0] - M);
    L += w * pg[1];
    for (int d = 0; d < D; ++d) out[d] += w * pg[2 + d];
  }
  const float inv = 1.0f / L;
  for (int d = 0; d < D; ++d) out[d] *= inv;
}


T512F void block512(const Args& a, int b, int h, int j0, int n, float* part, float* sc) {
  block(a, b, h, j0, n, part, sc);
}
T256F void block256(const Args& a, int b, int h, int j0, int n, float* part, float* sc) {
  block(a, b, h, j0, n, part, sc);
}
void block_portable(const Args& a, int b, int h, int j0, int n, float* part, float* sc) {
  block(a, b, h, j0, n, part, sc);
}
T512F void combine512(const Args& a, int b, int hq, int nb, const float* parts, float* out) {
  combine(a, b, hq, nb, parts, out);
}
T256F void combine256(const Args& a, int b, int hq, int nb, const float* parts, float* out) {
  combine(a, b, hq, nb, parts, out);
}
void combine_portable(const Args& a, int b, int hq, int nb, const float* parts, float* out) {
  combine(a, b, hq, nb, parts, out);
}

void run_attention(const Args& a, float* out, Isa isa) {
  const int G = a.Hq / a.Hkv;
  const int num_blocks = std::max(1, (a.S + kBlock - 1) / kBlock);
  const size_t item = size_t(G) * (2 + a.D);
  thread_local std::vector<float> parts;
  parts.resize(size_t(a.B) * a.Hkv * num_blocks * item);
  auto* block_fn = by_isa(isa, &block512, &block256, &block_portable);
  auto* combine_fn = by_isa(isa, &combine512, &combine256, &combine_portable);
  const int items = a.B * a.Hkv * num_blocks;
  std::atomic<int> next{0};
  float* pp = parts.data();
  Pool& p = pool();
  const int threads = std::max(1, std::min({current_threads(), p.num_threads(), items}));
  p.run(threads, [&](int) {
    thread_local std::vector<float> scores;
    scores.resize(size_t(G) * kBlock);
    for (;;) {
      const int i = next.fetch_add(1);
      if (i >= items) break;
      const int blk = i % num_blocks, bh = i / num_blocks;
      const int j0 = blk * kBlock, n = std::min(a.S, j0 + kBlock) - j0;
      block_fn(a, bh / a.Hkv, bh % a.Hkv, j0, n, pp + size_t(i) * item, scores.data());
    }
  });
  for (int b = 0; b < a.B; ++b)
    for (int hq = 0; hq < a.Hq; ++hq)
      combine_fn(a, b, hq, num_blocks, pp, out + (size_t(b) * a.Hq + hq) * a.D);
}

// A [B, H, S, D] float32 input as the kernel reads it: strided over B, H and S; copied into
// `buf` in row order when D itself is strided.
View view_of(const mx::array& x, std::vector<float>& buf) {
  const auto& st = x.strides();
  View v;
  if (st[3] == 1 || x.shape(3) == 1) {
    v.p = x.data<float>();
    v.s0 = st[0]; v.s1 = st[1]; v.s2 = st[2];
    return v;
  }
  const int64_t n1 = x.shape(1), n2 = x.shape(2), n3 = x.shape(3);
  v.p = row_major(x, buf);
  v.s0 = n1 * n2 * n3; v.s1 = n2 * n3; v.s2 = n3;
  return v;
}

}  // namespace

void DecodeAttention::eval_cpu(const std::vector<mx::array>& inputs,
                               std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& x : inputs) encoder.set_input_array(x);
  encoder.set_output_array(out);
  std::vector<mx::array> in;
  for (const auto& x : inputs) in.push_back(mx::array::unsafe_weak_copy(x));
  encoder.dispatch([in = std::move(in), out = mx::array::unsafe_weak_copy(out),
                    scale = scale_, kind = mask_kind_, isa = isa_]() mutable {
    thread_local std::vector<float> qbuf, kbuf, vbuf;
    Args a;
    a.B = in[0].shape(0); a.Hq = in[0].shape(1); a.Hkv = in[1].shape(1);
    a.S = in[1].shape(2); a.D = in[0].shape(3);
    a.q = view_of(in[0], qbuf);
    a.k = view_of(in[1], kbuf);
    a.v = view_of(in[2], vbuf);
    a.scale = scale;
    a.mask_kind = kind;
    if (kind) {
      const auto& st = in[3].strides();
      a.m0 = st[0]; a.m1 = st[1]; a.m3 = st[3];
      a.mask = kind == 1 ? static_cast<const void*>(in[3].data<bool>())
                         : static_cast<const void*>(in[3].data<float>());
    }
    if (a.S == 0) {
      std::fill(out.data<float>(), out.data<float>() + out.size(), 0.0f);
      return;
    }
    run_attention(a, out.data<float>(), isa);
  });
}

void DecodeAttention::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("forkv's decode attention runs on the CPU only.");
}

bool DecodeAttention::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const DecodeAttention&>(other);
  return scale_ == o.scale_ && mask_kind_ == o.mask_kind_ && isa_ == o.isa_;
}

std::vector<mx::Shape> DecodeAttention::output_shapes(const std::vector<mx::array>& inputs) {
  return {inputs[0].shape()};
}

mx::array decode_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                           float scale, const std::optional<mx::array>& mask) {
  auto fail = [](const std::string& why) {
    throw std::invalid_argument("forkv decode_attention: " + why);
  };
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4)
    fail("q, k and v must be [B, heads, length, head_dim]");
  if (q.shape(2) != 1) fail("q must hold one token per sequence (length 1)");
  if (k.shape() != v.shape()) fail("k and v must have the same shape");
  if (q.shape(0) != k.shape(0) || q.shape(3) != k.shape(3))
    fail("q and k must agree on batch size and head_dim");
  if (k.shape(1) == 0 || q.shape(1) % k.shape(1) != 0)
    fail("q's heads must be a multiple of k's");
  if (q.shape(3) % 16 != 0) fail("head_dim must be a multiple of 16");
  if (q.dtype() != mx::float32 || k.dtype() != mx::float32 || v.dtype() != mx::float32)
    fail("q, k and v must be float32");
  auto s = mx::to_stream(mx::Device::cpu);
  const int B = q.shape(0), Hq = q.shape(1), S = k.shape(2);
  std::vector<mx::array> inputs = {q, k, v};
  int kind = 0;
  if (mask) {
    auto m = *mask;
    if (m.dtype() == mx::bool_) {
      kind = 1;
    } else if (mx::issubdtype(m.dtype(), mx::floating)) {
      kind = 2;
      if (m.dtype() != mx::float32) m = mx::astype(m, mx::float32, s);
    } else {
      fail("the mask must be bool or floating point");
    }
    inputs.push_back(mx::broadcast_to(m, {B, Hq, 1, S}, s));
  }
  return mx::array(q.shape(), mx::float32,
                   std::make_shared<DecodeAttention>(s, scale, kind, current_isa()),
                   std::move(inputs));
}

}  // namespace forkv
