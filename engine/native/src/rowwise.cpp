// RMS norm and rotary embedding: the mlx primitives and their row kernels.
#include "rowwise.h"

#include <algorithm>
#include <cmath>
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


// Where row r of x [..., D] starts, for any strides of the leading axes (D's stride is 1).
struct Rows {
  const float* base = nullptr;
  std::vector<int64_t> shape, strides;  // the leading axes
  int64_t count = 1;
  int D = 0;

  const float* row(int64_t r) const {
    int64_t off = 0;
    for (int d = int(shape.size()) - 1; d >= 0; --d) {
      off += (r % shape[d]) * strides[d];
      r /= shape[d];
    }
    return base + off;
  }
};

// x's rows as the kernels read them; copied into `buf` in row order when D is strided.
Rows rows_of(const mx::array& x, std::vector<float>& buf) {
  Rows rows;
  const int nd = int(x.ndim());
  rows.D = x.shape(nd - 1);
  for (int d = 0; d < nd - 1; ++d) {
    rows.shape.push_back(x.shape(d));
    rows.strides.push_back(x.strides()[d]);
    rows.count *= x.shape(d);
  }
  rows.base = x.data<float>();
  const int64_t ds = x.strides()[nd - 1];
  if (ds != 1 && rows.D > 1) {
    rows.base = row_major(x, buf);
    int64_t stride = rows.D;
    for (int d = int(rows.shape.size()) - 1; d >= 0; --d) {
      rows.strides[d] = stride;
      stride *= rows.shape[d];
    }
  }
  return rows;
}

// Rows split over the pool once there are enough of them to pay for waking it.
template <class F>
void for_rows(int64_t count, F&& fn) {
  Pool& p = pool();
  const int threads = count >= 256 ? std::max(1, std::min(current_threads(), p.num_threads())) : 1;
  p.run(threads, [&](int t) {
    fn(count * t / threads, count * (t + 1) / threads);
  });
}

FORKV_INLINE void norm_rows(const Rows& x, const float* w, float eps, float offset, int64_t r0,
                            int64_t r1, float* out) {
  const int D = x.D;
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x.row(r);
    float* yr = out + size_t(r) * D;
    float acc[16] = {};
    int d = 0;
    for (; d + 16 <= D; d += 16)
      for (int i = 0; i < 16; ++i) acc[i] += xr[d + i] * xr[d + i];
    for (int i = 0; d < D; ++d, ++i) acc[i] += xr[d] * xr[d];
    for (int s = 8; s >= 1; s /= 2)
      for (int i = 0; i < s; ++i) acc[i] += acc[i + s];
    const float n = 1.0f / std::sqrt(acc[0] / float(D) + eps);
    for (d = 0; d < D; ++d) yr[d] = (xr[d] * n) * (w[d] + offset);
  }
}

T512F void norm512(const Rows& x, const float* w, float eps, float off, int64_t r0, int64_t r1,
                   float* out) {
  norm_rows(x, w, eps, off, r0, r1, out);
}
T256F void norm256(const Rows& x, const float* w, float eps, float off, int64_t r0, int64_t r1,
                   float* out) {
  norm_rows(x, w, eps, off, r0, r1, out);
}
void norm_portable(const Rows& x, const float* w, float eps, float off, int64_t r0, int64_t r1,
                   float* out) {
  norm_rows(x, w, eps, off, r0, r1, out);
}

void norm_impl(const Rows& rows, const float* w, float eps, float offset, float* y, Isa isa) {
  auto* fn = by_isa(isa, &norm512, &norm256, &norm_portable);
  for_rows(rows.count, [&](int64_t r0, int64_t r1) { fn(rows, w, eps, offset, r0, r1, y); });
}

// `count` rows of D floats one after another.
Rows contiguous_rows(const float* x, int64_t count, int D) {
  Rows rows;
  rows.base = x;
  rows.shape = {count};
  rows.strides = {D};
  rows.count = count;
  rows.D = D;
  return rows;
}

// Rows of x [B, ..., L, D] (x's rows r in row order, `per_b` of them under one index of the
// first axis) at positions (offsets ? offsets[b] : offset) + l, into y (row order).
void rope_impl(const Rows& rows, int64_t B, int64_t L, const int32_t* offsets, int offset,
               int dims, bool traditional, float base, float scale, float* y) {
  thread_local std::vector<float> table;
  const int D = rows.D, half = dims / 2;
  const int64_t per_b = rows.count / B;  // rows under one index of the first axis
  // cos and sin per (first-axis index, position), shared by every head. The angle is
  // formed and reduced to [-pi, pi] in double: at position 31,000 a float32 angle is off
  // by ~1e-3 rad (mlx's own rope by up to 9e-4 against float64).
  std::vector<double> inv(half);
  for (int i = 0; i < half; ++i) inv[i] = std::pow(double(base), -double(i) / double(half));
  table.resize(size_t(B * L) * 2 * half);
  constexpr double two_pi = 6.283185307179586476925286766559;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t l = 0; l < L; ++l) {
      const double pos = double((offsets ? offsets[b] : offset) + l) * double(scale);
      float* t = table.data() + size_t(b * L + l) * 2 * half;
      for (int i = 0; i < half; ++i) {
        const float theta = float(std::remainder(pos * inv[i], two_pi));
        t[i] = std::cos(theta);
        t[half + i] = std::sin(theta);
      }
    }
  const float* tab = table.data();  // the calling thread's: workers have their own
  for_rows(rows.count, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = rows.row(r);
      float* yr = y + size_t(r) * D;
      const float* t = tab + size_t((r / per_b) * L + r % L) * 2 * half;
      for (int i = 0; i < half; ++i) {
        const int a = traditional ? 2 * i : i, b2 = traditional ? 2 * i + 1 : i + half;
        const float x1 = xr[a], x2 = xr[b2], c = t[i], s = t[half + i];
        yr[a] = x1 * c - x2 * s;
        yr[b2] = x1 * s + x2 * c;
      }
      for (int d = 2 * half; d < D; ++d) yr[d] = xr[d];
    }
  });
}

}  // namespace

void rms_norm_rows(const float* x, int64_t count, int D, const float* w, float eps,
                   float offset, float* y, Isa isa) {
  norm_impl(contiguous_rows(x, count, D), w, eps, offset, y, isa);
}

void rope_rows(const float* x, int64_t B, int64_t L, int64_t count, int D, int dims,
               bool traditional, float base, float scale, int offset, float* y,
               const int32_t* offsets) {
  rope_impl(contiguous_rows(x, count, D), B, L, offsets, offset, dims, traditional, base,
            scale, y);
}

// ---------------------------------------------------------------- RMS norm

void RmsNorm::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(inputs[0]);
  encoder.set_input_array(inputs[1]);
  encoder.set_output_array(out);
  encoder.dispatch([x = mx::array::unsafe_weak_copy(inputs[0]),
                    w = mx::array::unsafe_weak_copy(inputs[1]),
                    out = mx::array::unsafe_weak_copy(out), eps = eps_, offset = offset_,
                    isa = isa_]() mutable {
    thread_local std::vector<float> buf;
    norm_impl(rows_of(x, buf), w.data<float>(), eps, offset, out.data<float>(), isa);
  });
}

void RmsNorm::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("forkv's rms_norm runs on the CPU only.");
}

bool RmsNorm::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const RmsNorm&>(other);
  return eps_ == o.eps_ && offset_ == o.offset_ && isa_ == o.isa_;
}

std::vector<mx::Shape> RmsNorm::output_shapes(const std::vector<mx::array>& inputs) {
  return {inputs[0].shape()};
}

mx::array rms_norm(const mx::array& x, const mx::array& w, float eps, float offset) {
  if (x.ndim() < 1 || w.ndim() != 1 || w.shape(0) != x.shape(-1))
    throw std::invalid_argument("forkv rms_norm: w must be [D] for x [..., D]");
  if (x.dtype() != mx::float32 || w.dtype() != mx::float32)
    throw std::invalid_argument("forkv rms_norm: x and w must be float32");
  auto s = mx::to_stream(mx::Device::cpu);
  return mx::array(x.shape(), mx::float32,
                   std::make_shared<RmsNorm>(s, eps, offset, current_isa()), {x, as_is(w, s)});
}

// ---------------------------------------------------------------- rotary embedding

void Rope::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& a : inputs) encoder.set_input_array(a);
  encoder.set_output_array(out);
  std::vector<mx::array> in;
  for (const auto& a : inputs) in.push_back(mx::array::unsafe_weak_copy(a));
  encoder.dispatch([in = std::move(in), out = mx::array::unsafe_weak_copy(out), dims = dims_,
                    traditional = traditional_, base = base_, scale = scale_,
                    offset = offset_]() mutable {
    thread_local std::vector<float> buf;
    const auto& x = in[0];
    const Rows rows = rows_of(x, buf);
    const int nd = int(x.ndim());
    const int64_t L = x.shape(nd - 2);
    const int64_t B = nd >= 3 ? x.shape(0) : 1;
    const int32_t* offsets = in.size() > 1 ? in[1].data<int32_t>() : nullptr;
    rope_impl(rows, B, L, offsets, offset, dims, traditional, base, scale, out.data<float>());
  });
}

void Rope::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("forkv's rope runs on the CPU only.");
}

bool Rope::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const Rope&>(other);
  return dims_ == o.dims_ && traditional_ == o.traditional_ && base_ == o.base_ &&
         scale_ == o.scale_ && offset_ == o.offset_ && isa_ == o.isa_;
}

std::vector<mx::Shape> Rope::output_shapes(const std::vector<mx::array>& inputs) {
  return {inputs[0].shape()};
}

mx::array rope(const mx::array& x, int dims, bool traditional, float base, float scale,
               int offset, const std::optional<mx::array>& offsets) {
  if (x.ndim() < 2) throw std::invalid_argument("forkv rope: x must be [..., L, D]");
  if (x.dtype() != mx::float32) throw std::invalid_argument("forkv rope: x must be float32");
  if (dims < 2 || dims % 2 || dims > x.shape(-1))
    throw std::invalid_argument("forkv rope: dims must be even and at most D");
  auto s = mx::to_stream(mx::Device::cpu);
  std::vector<mx::array> inputs = {x};
  if (offsets) {
    auto o = mx::astype(mx::flatten(*offsets, s), mx::int32, s);
    const int B = x.ndim() >= 3 ? x.shape(0) : 1;
    if (o.size() != 1 && int(o.size()) != B)
      throw std::invalid_argument("forkv rope: offsets must hold one position per sequence");
    inputs.push_back(mx::broadcast_to(o, {B}, s));
    inputs.back() = mx::contiguous(inputs.back(), false, s);
  }
  return mx::array(x.shape(), mx::float32,
                   std::make_shared<Rope>(s, dims, traditional, base, scale, offset,
                                          current_isa()),
                   std::move(inputs));
}

}  // namespace forkv
