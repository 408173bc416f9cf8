// A decoder layer's halves around its cache (block.h): the primitives and their plans.
#include "block.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "activation.h"
#include "attention.h"
#include "halfkv.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/types/half_types.h"
#include "qmatmul.h"
#include "rowwise.h"
#include "strided.h"

namespace forkv {

namespace mx = mlx::core;

namespace {

using Buf = std::vector<float>;

// The linears lins[i0, i1) on x [M, K], each as its own kernel call (the calls the separate
// layers make), their output ranges in order into dst (each [M, width]).
void linears(const std::vector<mx::array>& in, const std::vector<BlockLinear>& lins, int i0,
             int i1, const float* x, int M, const std::vector<float*>& dst, Isa isa) {
  size_t next = 0;
  for (int i = i0; i < i1; ++i) {
    const BlockLinear& l = lins[i];
    const QuantW qw = quant_w(in[l.w], in[l.scales], l.biases >= 0 ? &in[l.biases] : nullptr,
                              l.N, l.K, l.bits, l.group_size);
    std::vector<float*> ys(dst.begin() + next, dst.begin() + next + (l.ends.size() - 1));
    next += l.ends.size() - 1;
    run_qgemm(x, M, l.K, qw, l.ends, ys, isa);
  }
}

// [B, L, H, d] -> [B, H, L, d] (the model's reshape and transpose; a copy only when L > 1).
const float* heads_first(const float* x, int B, int L, int H, int d, Buf& buf) {
  if (L == 1) return x;
  buf.resize(size_t(B) * L * H * d);
  for (int b = 0; b < B; ++b)
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h)
        std::copy_n(x + ((size_t(b) * L + l) * H + h) * d, d,
                    buf.data() + ((size_t(b) * H + h) * L + l) * d);
  return buf.data();
}

// [B, H, L, d] -> [B, L, H * d].
const float* heads_last(const float* x, int B, int L, int H, int d, Buf& buf) {
  if (L == 1) return x;
  buf.resize(size_t(B) * L * H * d);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int l = 0; l < L; ++l)
        std::copy_n(x + ((size_t(b) * H + h) * L + l) * d, d,
                    buf.data() + ((size_t(b) * L + l) * H + h) * d);
  return buf.data();
}

// float32 -> the output's dtype, as mlx's astype converts (round to nearest even).
void store(const float* src, mx::array& out) {
  const size_t n = out.size();
  if (out.dtype() == mx::float16) {
    auto* y = out.data<mx::float16_t>();
    for (size_t i = 0; i < n; ++i) y[i] = static_cast<mx::float16_t>(src[i]);
  } else if (out.dtype() == mx::bfloat16) {
    auto* y = out.data<mx::bfloat16_t>();
    for (size_t i = 0; i < n; ++i) y[i] = static_cast<mx::bfloat16_t>(src[i]);
  } else if (out.dtype() == mx::uint8) {  // q8_0 rows (halfkv.h)
    const int W = out.shape(-1), D = W / kQ8GroupBytes * kQ8Group;
    quantize_q8_rows(src, out.data<uint8_t>(), W ? int64_t(n) / W : 0, D);
  } else {
    std::copy_n(src, n, out.data<float>());
  }
}

void eval_attn_in(const std::vector<mx::array>& in, std::vector<mx::array>& out,
                  const BlockShape& sh, const std::vector<BlockLinear>& lins, Isa isa) {
  thread_local Buf xbuf, xn, qkv[3], t, nq, r;
  const mx::array& x = in[0];
  const int Dm = x.shape(-1), M = int(x.size() / Dm), B = x.shape(0), L = M / B;
  const int hd = sh.head_dim, heads[3] = {sh.n_heads, sh.n_kv_heads, sh.n_kv_heads};
  xn.resize(size_t(M) * Dm);
  rms_norm_rows(row_major(x, xbuf), M, Dm, in[1].data<float>(), sh.eps, sh.norm_offset,
                xn.data(), isa);
  std::vector<float*> dst;
  for (int i = 0; i < 3; ++i) {
    qkv[i].resize(size_t(M) * heads[i] * hd);
    dst.push_back(qkv[i].data());
  }
  linears(in, lins, 0, int(lins.size()), xn.data(), M, dst, isa);
  std::vector<int32_t> pos;  // each row's position (a broadcast or strided [B] read as is)
  if (sh.row_offsets) {
    const mx::array& o = in[sh.qk_norm ? 4 : 2];
    for (int b = 0; b < B; ++b) pos.push_back(o.data<int32_t>()[b * o.strides()[0]]);
  }
  for (int i = 0; i < 3; ++i) {
    const int64_t rows = int64_t(B) * heads[i] * L;
    const float* v = heads_first(qkv[i].data(), B, L, heads[i], hd, t);
    if (i < 2) {  // q and k: their norm (Gemma 3), then the rope
      if (sh.qk_norm) {
        nq.resize(size_t(rows) * hd);
        rms_norm_rows(v, rows, hd, in[2 + i].data<float>(), sh.qk_eps, sh.norm_offset,
                      nq.data(), isa);
        v = nq.data();
      }
      float* y = i == 0 ? out[0].data<float>() : (r.resize(size_t(rows) * hd), r.data());
      rope_rows(v, B, L, rows, hd, sh.rope_dims, sh.rope_traditional, sh.rope_base,
                sh.rope_scale, sh.offset, y, sh.row_offsets ? pos.data() : nullptr);
      v = y;
    }
    if (i > 0) store(v, out[i]);
  }
}

void eval_block_out(const std::vector<mx::array>& in, mx::array& out, const BlockShape& sh,
                    const std::vector<BlockLinear>& lins, Isa isa) {
  thread_local Buf att, t, o, h, hn, gate, up, a, d, xbuf;
  const mx::array& q = in[0];
  const int B = q.shape(0), H = q.shape(1), L = q.shape(2), hd = q.shape(3);
  const int M = B * L, ix = 3 + (sh.mask_kind ? 1 : 0), in0 = ix + 1;
  const int Dm = in[ix].shape(-1);
  std::vector<mx::array> att_in(in.begin(), in.begin() + ix);
  att.resize(q.size());
  attention_eval(att_in, att.data(), sh.scale, sh.mask_kind, sh.causal, sh.rot, isa);
  const float* ao = heads_last(att.data(), B, L, H, hd, t);
  o.resize(size_t(M) * Dm);
  const int gu = sh.num_o + sh.num_gate_up;
  linears(in, lins, 0, sh.num_o, ao, M, {o.data()}, isa);
  const float* x = row_major(in[ix], xbuf);
  const size_t n = size_t(M) * Dm;
  h.resize(n);
  hn.resize(n);
  const float* r = o.data();
  if (sh.sandwich) {  // Gemma: the attention's output normed before the residual
    rms_norm_rows(o.data(), M, Dm, in[in0].data<float>(), sh.eps, sh.norm_offset, hn.data(),
                  isa);
    r = hn.data();
  }
  for (size_t i = 0; i < n; ++i) h[i] = x[i] + r[i];
  const int pre = sh.sandwich ? in0 + 1 : in0;
  rms_norm_rows(h.data(), M, Dm, in[pre].data<float>(), sh.eps, sh.norm_offset, hn.data(),
                isa);
  const int F = lins[sh.num_o].ends.size() > 2 ? lins[sh.num_o].ends[1] : lins[sh.num_o].N;
  gate.resize(size_t(M) * F);
  up.resize(size_t(M) * F);
  a.resize(size_t(M) * F);
  linears(in, lins, sh.num_o, gu, hn.data(), M, {gate.data(), up.data()}, isa);
  const int64_t nf = int64_t(M) * F;
  if (sh.act_mul) {
    activation_rows(Act(sh.act), gate.data(), up.data(), a.data(), nf, isa);
  } else {  // act(gate), then the model's own multiply
    activation_rows(Act(sh.act), gate.data(), nullptr, a.data(), nf, isa);
    for (int64_t i = 0; i < nf; ++i) a[i] = a[i] * up[i];
  }
  d.resize(n);
  linears(in, lins, gu, int(lins.size()), a.data(), M, {d.data()}, isa);
  r = d.data();
  if (sh.sandwich) {
    rms_norm_rows(d.data(), M, Dm, in[in0 + 2].data<float>(), sh.eps, sh.norm_offset,
                  hn.data(), isa);
    r = hn.data();
  }
  float* y = out.data<float>();
  for (size_t i = 0; i < n; ++i) y[i] = h[i] + r[i];
}

// The plan of `specs` over the arrays from input `base` on; each a checked kernel linear.
std::vector<BlockLinear> plan_linears(const std::vector<mx::array>& arrays,
                                      const std::vector<std::vector<int>>& specs, int base) {
  std::vector<BlockLinear> lins;
  for (const auto& sp : specs) {
    if (sp.size() < 6) throw std::invalid_argument("forkv block: a linear's spec is short");
    BlockLinear l;
    l.w = base + sp[0]; l.scales = base + sp[1]; l.biases = sp[2] < 0 ? -1 : base + sp[2];
    l.bits = sp[3]; l.group_size = sp[4];
    const auto& s = arrays.at(sp[1]);
    l.N = s.shape(0);
    l.K = k_of(s.shape(1), l.group_size, s.dtype() == mx::uint8);
    l.ends = {0};
    for (size_t i = 5; i < sp.size(); ++i) l.ends.push_back(l.ends.back() + sp[i]);
    if (l.ends.back() != l.N) throw std::invalid_argument("forkv block: widths != rows");
    lins.push_back(std::move(l));
  }
  return lins;
}

std::vector<mx::array> kernel_inputs(std::vector<mx::array> head,
                                     const std::vector<mx::array>& arrays, mx::Stream s) {
  for (const auto& a : arrays) head.push_back(as_is(a, s));
  return head;
}

}  // namespace

void DecoderBlock::eval_cpu(const std::vector<mx::array>& inputs,
                            std::vector<mx::array>& outputs) {
  for (auto& o : outputs) o.set_data(mx::allocator::malloc(o.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  std::vector<mx::array> in, outs;
  for (const auto& a : inputs) {
    encoder.set_input_array(a);
    in.push_back(mx::array::unsafe_weak_copy(a));
  }
  for (auto& o : outputs) {
    encoder.set_output_array(o);
    outs.push_back(mx::array::unsafe_weak_copy(o));
  }
  encoder.dispatch([in = std::move(in), outs = std::move(outs), sh = shape_, lins = lins_,
                    half = out_half_, isa = isa_]() mutable {
    if (half)
      eval_block_out(in, outs[0], sh, lins, isa);
    else
      eval_attn_in(in, outs, sh, lins, isa);
  });
}

void DecoderBlock::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("forkv's decoder blocks run on the CPU only.");
}

int BlockShape::kv_width() const {
  return kv_dtype == mx::uint8 ? int(q8_row_bytes(head_dim)) : head_dim;
}

std::vector<mx::Shape> DecoderBlock::output_shapes(const std::vector<mx::array>& in) {
  if (out_half_) return {in[3 + (shape_.mask_kind ? 1 : 0)].shape()};
  const int B = in[0].shape(0), L = in[0].shape(1), hd = shape_.head_dim;
  return {{B, shape_.n_heads, L, hd}, {B, shape_.n_kv_heads, L, shape_.kv_width()},
          {B, shape_.n_kv_heads, L, shape_.kv_width()}};
}

std::vector<mx::array> attn_in(const mx::array& x, const mx::array& norm,
                               const std::vector<mx::array>& qk_norms,
                               const std::vector<mx::array>& arrays,
                               const std::vector<std::vector<int>>& specs, float eps,
                               float norm_offset, float qk_eps, int n_heads, int n_kv_heads,
                               int head_dim, int rope_dims, bool rope_traditional,
                               float rope_base, float rope_scale, int offset,
                               const std::string& kv_dtype,
                               const std::optional<mx::array>& offsets) {
  if (x.ndim() != 3 || x.dtype() != mx::float32)
    throw std::invalid_argument("forkv attn_in: x must be float32 [B, L, D]");
  if (!qk_norms.empty() && qk_norms.size() != 2)
    throw std::invalid_argument("forkv attn_in: qk_norms holds q's and k's norm, or none");
  auto s = mx::to_stream(mx::Device::cpu);
  BlockShape sh;
  sh.n_heads = n_heads; sh.n_kv_heads = n_kv_heads; sh.head_dim = head_dim;
  sh.eps = eps; sh.norm_offset = norm_offset; sh.qk_norm = !qk_norms.empty();
  sh.qk_eps = qk_eps; sh.rope_dims = rope_dims; sh.rope_traditional = rope_traditional;
  sh.rope_base = rope_base; sh.rope_scale = rope_scale; sh.offset = offset;
  sh.kv_dtype = kv_dtype == "float16"    ? mx::float16
                : kv_dtype == "bfloat16" ? mx::bfloat16
                : kv_dtype == "q8_0"     ? mx::uint8
                                         : mx::float32;
  if (sh.kv_dtype == mx::uint8 && head_dim % kQ8Group != 0)
    throw std::invalid_argument("forkv attn_in: q8_0 K/V need head_dim a multiple of 32");
  std::vector<mx::array> head = {x, as_is(norm, s)};
  for (const auto& n : qk_norms) head.push_back(as_is(n, s));
  const int B = x.shape(0), L = x.shape(1);
  if (offsets) {  // as rope() takes them
    auto o = mx::astype(mx::flatten(*offsets, s), mx::int32, s);
    if (o.size() != 1 && int(o.size()) != B)
      throw std::invalid_argument("forkv attn_in: offsets must hold one position per row");
    head.push_back(mx::broadcast_to(o, {B}, s));
    sh.row_offsets = true;
  }
  const int base = int(head.size());
  auto lins = plan_linears(arrays, specs, base);
  int total = 0;
  for (const auto& l : lins) {
    total += l.N;
    if (l.K != x.shape(2)) throw std::invalid_argument("forkv attn_in: a linear's K != D");
  }
  if (total != (n_heads + 2 * n_kv_heads) * head_dim)
    throw std::invalid_argument("forkv attn_in: the linears' widths are not q, k and v's");
  auto prim = std::make_shared<DecoderBlock>(s, false, sh, std::move(lins), current_isa());
  return mx::array::make_arrays(
      {{B, n_heads, L, head_dim}, {B, n_kv_heads, L, sh.kv_width()},
       {B, n_kv_heads, L, sh.kv_width()}},
      {mx::float32, sh.kv_dtype, sh.kv_dtype}, prim, kernel_inputs(head, arrays, s));
}

mx::array block_out(const mx::array& q, const mx::array& keys, const mx::array& values,
                    const std::optional<mx::array>& mask, bool causal, int rot, float scale,
                    const mx::array& x, const std::vector<mx::array>& norms,
                    const std::vector<mx::array>& arrays,
                    const std::vector<std::vector<int>>& specs, const std::vector<int>& counts,
                    float eps, float norm_offset, const std::string& act, bool act_mul) {
  if (x.ndim() != 3 || x.dtype() != mx::float32 || q.dtype() != mx::float32)
    throw std::invalid_argument("forkv block_out: x must be float32 [B, L, D], q float32");
  if (norms.size() != 1 && norms.size() != 3)
    throw std::invalid_argument("forkv block_out: norms holds 1 or 3 weights");
  if (counts.size() != 2 || int(specs.size()) <= counts[0] + counts[1])
    throw std::invalid_argument("forkv block_out: counts are o's and gate/up's linears");
  if (act != "gelu_approx" && act != "silu")
    throw std::invalid_argument("forkv block_out: act is gelu_approx or silu");
  auto s = mx::to_stream(mx::Device::cpu);
  BlockShape sh;
  sh.eps = eps; sh.norm_offset = norm_offset; sh.causal = causal; sh.rot = rot;
  sh.scale = scale; sh.sandwich = norms.size() == 3;
  sh.act = int(act == "gelu_approx" ? Act::gelu_approx : Act::silu);
  sh.act_mul = act_mul; sh.num_o = counts[0]; sh.num_gate_up = counts[1];
  std::vector<mx::array> head = {q, keys, values};
  if (mask) {  // as attention() takes it
    auto m = *mask;
    sh.mask_kind = m.dtype() == mx::bool_ ? 1 : 2;
    if (m.dtype() != mx::bool_ && m.dtype() != mx::float32) m = mx::astype(m, mx::float32, s);
    head.push_back(mx::broadcast_to(m, {q.shape(0), q.shape(1), q.shape(2), keys.shape(2)}, s));
  }
  head.push_back(x);
  for (const auto& n : norms) head.push_back(as_is(n, s));
  const int base = int(head.size());
  auto lins = plan_linears(arrays, specs, base);
  return mx::array(x.shape(), mx::float32,
                   std::make_shared<DecoderBlock>(s, true, sh, std::move(lins), current_isa()),
                   kernel_inputs(head, arrays, s));
}

}  // namespace forkv
