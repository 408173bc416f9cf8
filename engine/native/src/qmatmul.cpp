// The mlx primitive: QuantizedMatmul on the CPU stream, evaluated by forkv's kernels.
#include "qmatmul.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/transforms.h"
#include "pool.h"
#include "qgemm.h"
#include "strided.h"

namespace forkv {

namespace mx = mlx::core;

namespace {
std::atomic<int> g_isa{-1};
std::atomic<int> g_threads{0};

struct Scratch {
  std::vector<int8_t> q;
  std::vector<float> dx, xsum;
  std::vector<int32_t> xshift;
};

}  // namespace

void run_qgemm(const float* x, int M, int K, const QuantW& w, const std::vector<int>& ends,
               const std::vector<float*>& ys, Isa isa) {
  thread_local Scratch scratch;
  Scratch& s = scratch;  // the caller's buffers: a thread_local named in a lambda is the worker's
  const int num_groups = K / w.group_size;
  const bool paired = isa == Isa::avx512vnni;
  s.q.resize(size_t(M) * K);
  s.dx.resize(size_t(M) * (K / kXBlock));
  s.xsum.resize(size_t(M) * num_groups);
  // symmetric groups on the paired tiles: no bias term (tile512's kShifted)
  const bool shifted = paired && !w.biases && (!w.kparams || w.group_size == 16);
  if (shifted) s.xshift.resize(size_t(M) * (K / kXBlock));
  Pool& p = pool();
  const int threads = std::max(1, std::min(current_threads(), p.num_threads()));
  // Activations: rows split across threads once there are enough of them.
  const int qthreads = M >= 16 ? threads : 1;
  p.run(qthreads, [&](int t) {
    const int m0 = int(int64_t(M) * t / qthreads), m1 = int(int64_t(M) * (t + 1) / qthreads);
    quantize_rows(x, K, m0, m1, K, w.group_size, paired, s.q.data(),
                  s.dx.data(), s.xsum.data(), shifted ? s.xshift.data() : nullptr,
                  1 << (w.bits - 1), isa);
  });
  QuantX qx;
  qx.M = M; qx.K = K; qx.group_size = w.group_size; qx.paired = paired;
  qx.q = s.q.data(); qx.dx = s.dx.data();
  qx.xsum = s.xsum.data();
  qx.xshift = shifted ? s.xshift.data() : nullptr;
  // Output rows in blocks handed out by a counter: a thread slowed by other work takes
  // fewer. Which thread computes a row never changes its value.
  constexpr int kBlock = 16;
  const int num_blocks = (w.N + kBlock - 1) / kBlock;
  std::atomic<int> next{0};
  const int step = std::max(1, num_blocks / (threads * 16));
  p.run(threads, [&](int) {
    for (;;) {
      const int b0 = next.fetch_add(step);
      if (b0 >= num_blocks) break;
      const int n0 = b0 * kBlock, n1 = std::min(w.N, (b0 + step) * kBlock);
      for (size_t seg = 0; seg + 1 < ends.size(); ++seg) {
        const int a = std::max(n0, ends[seg]), b = std::min(n1, ends[seg + 1]);
        if (a >= b) continue;
        // qgemm_rows writes y[m * ldy + n] for n in [a, b): shift the segment's base by its
        // first column (a column's value does not depend on the range it is computed in)
        const size_t width = size_t(ends[seg + 1] - ends[seg]);
        float* base = ys[seg] - ends[seg];
        qgemm_rows(qx, w, a, b, base, width, isa);
      }
    }
  });
}

QuantW quant_w(const mx::array& w, const mx::array& scales, const mx::array* biases, int N,
               int K, int bits, int group_size) {
  QuantW qw;
  qw.N = N; qw.K = K; qw.bits = bits; qw.group_size = group_size;
  qw.data = w.data<uint8_t>();
  qw.row_bytes = row_bytes(K, bits);
  if (scales.dtype() == mx::uint8)
    qw.kparams = scales.data<uint8_t>();
  else if (scales.dtype() == mx::float16)
    qw.scales16 = scales.data<uint16_t>();
  else
    qw.scales = scales.data<float>();
  qw.biases = biases ? biases->data<float>() : nullptr;
  return qw;
}

std::pair<std::vector<mx::array>, size_t> pack_arrays(const std::vector<mx::array>& arrays,
                                                      bool huge) {
  constexpr size_t kLine = 64, kHuge = size_t(2) << 20;
#if !defined(__linux__)
  huge = false;
#endif
  std::vector<mx::array> src;
  for (const auto& a : arrays) src.push_back(mx::contiguous(a));
  mx::eval(src);
  std::vector<size_t> at;
  size_t total = 0;
  for (const auto& a : src) {
    at.push_back(total);
    total += (a.nbytes() + kLine - 1) & ~(kLine - 1);
  }
  // The buffer in 8-byte words (mlx's shapes are int32), from its first line (or 2 MiB) on.
  const size_t slack = huge ? kHuge : kLine, words = (total + slack) / 8;
  if (words > size_t(std::numeric_limits<int32_t>::max()))
    throw std::invalid_argument("forkv pack_arrays: more than 16 GiB at once");
  auto data = mx::allocator::malloc(words * 8);
  auto* raw = static_cast<uint8_t*>(data.buffer().raw_ptr());
  const size_t base = ((reinterpret_cast<uintptr_t>(raw) + slack - 1) & ~uintptr_t(slack - 1)) -
                      reinterpret_cast<uintptr_t>(raw);  // (a multiple of 8: malloc's is)
  uint8_t* dst = raw + base;
  // Huge pages for the whole 2 MiB spans (the last partial one stays on 4 KiB pages: a huge
  // page there would hold up to 2 MiB nothing uses).
  const size_t span = huge ? total & ~(kHuge - 1) : 0;
  size_t on_huge = 0;
#if defined(__linux__)
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1 (older headers lack it; older kernels answer EINVAL)
#endif
  const bool advised = span && madvise(dst, span, MADV_HUGEPAGE) == 0;
#endif
  Pool& p = pool();
  p.run(p.num_threads(), [&](int t) {  // (the copy faults the pages in: huge ones if advised)
    for (size_t i = size_t(t); i < src.size(); i += size_t(p.num_threads()))
      std::memcpy(dst + at[i], src[i].data<uint8_t>(), src[i].nbytes());
  });
#if defined(__linux__)
  // Where a fault found no huge page free, collapse now; where it did, this returns at once.
  // (Before Linux 6.1 it fails: the count says 0 though faults may have had huge pages.)
  if (advised) on_huge = madvise(dst, span, MADV_COLLAPSE) == 0 ? span : 0;
#endif
  src.clear();
  mx::array buffer(std::move(data), {int(words)}, mx::uint64);
  std::vector<mx::array> out;
  for (size_t i = 0; i < arrays.size(); ++i) {
    const auto& a = arrays[i];
    const size_t first = (base + at[i]) / 8, n = a.nbytes();
    auto bytes = mx::view(mx::slice(buffer, {int(first)}, {int(first + (n + 7) / 8)}), mx::uint8);
    out.push_back(mx::reshape(mx::view(mx::slice(bytes, {0}, {int(n)}), a.dtype()), a.shape()));
  }
  mx::eval(out);
  return {std::move(out), on_huge};
}

Isa current_isa() {
  int v = g_isa.load();
  if (v < 0) {
    v = int(best_isa());
    g_isa.store(v);
  }
  return Isa(v);
}

void set_isa(Isa isa) {
  if (int(isa) > int(best_isa()))
    throw std::invalid_argument(std::string("this CPU cannot run ") + isa_name(isa));
  g_isa.store(int(isa));
}

int current_threads() {
  const int t = g_threads.load();
  return t > 0 ? t : pool().num_threads();
}

void set_threads(int n) { g_threads.store(std::max(0, n)); }

void QuantizedMatmul::eval_cpu(const std::vector<mx::array>& inputs,
                               std::vector<mx::array>& outputs) {
  auto& x = inputs[0];
  auto& w = inputs[1];
  auto& scales = inputs[2];
  const bool has_biases = inputs.size() > 3;
  auto& biases = inputs[has_biases ? 3 : 2];  // symmetric groups: scales stand in, unread
  for (auto& out : outputs) out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(x);
  encoder.set_input_array(w);
  encoder.set_input_array(scales);
  if (has_biases) encoder.set_input_array(biases);
  std::vector<mx::array> outs;
  for (auto& out : outputs) {
    encoder.set_output_array(out);
    outs.push_back(mx::array::unsafe_weak_copy(out));
  }
  const int K = K_, N = N_, bits = bits_, group_size = group_size_;
  const int M = int(x.size() / K);
  const Isa isa = isa_;
  std::vector<int> ends = ends_.empty() ? std::vector<int>{0, N} : ends_;
  encoder.dispatch([x = mx::array::unsafe_weak_copy(x), w = mx::array::unsafe_weak_copy(w),
                    scales = mx::array::unsafe_weak_copy(scales),
                    biases = mx::array::unsafe_weak_copy(biases), outs = std::move(outs),
                    ends = std::move(ends), K, N, M, bits, group_size, isa,
                    has_biases]() mutable {
    const QuantW qw = quant_w(w, scales, has_biases ? &biases : nullptr, N, K, bits,
                              group_size);
    if (M == 0) return;
    thread_local std::vector<float> gathered;
    const float* xp = row_major(x, gathered);
    std::vector<float*> ys;
    for (auto& out : outs) ys.push_back(out.data<float>());
    run_qgemm(xp, M, K, qw, ends, ys, isa);
  });
}

void QuantizedMatmul::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("forkv's quantized matmul runs on the CPU only.");
}

bool QuantizedMatmul::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const QuantizedMatmul&>(other);
  return bits_ == o.bits_ && group_size_ == o.group_size_ && N_ == o.N_ && K_ == o.K_ &&
         isa_ == o.isa_ && ends_ == o.ends_;
}

std::vector<mx::Shape> QuantizedMatmul::output_shapes(const std::vector<mx::array>& inputs) {
  auto shape = inputs[0].shape();
  if (ends_.empty()) {
    shape.back() = N_;
    return {shape};
  }
  std::vector<mx::Shape> shapes;
  for (size_t s = 0; s + 1 < ends_.size(); ++s) {
    shape.back() = ends_[s + 1] - ends_[s];
    shapes.push_back(shape);
  }
  return shapes;
}

namespace {

// The checked inputs of a call on float32 x, and N and K.
std::vector<mx::array> matmul_inputs(const std::string& fn, const mx::array& x,
                                     const mx::array& w, const mx::array& scales,
                                     const std::optional<mx::array>& biases, int bits,
                                     int group_size, int& N, int& K);

}  // namespace

mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const std::optional<mx::array>& biases, int bits, int group_size) {
  int N = 0, K = 0;
  auto inputs = matmul_inputs("quantized_matmul", x, w, scales, biases, bits, group_size, N, K);
  auto s = mx::to_stream(mx::Device::cpu);
  auto shape = x.shape();
  shape.back() = N;
  auto y = mx::array(shape, mx::float32,
                     std::make_shared<QuantizedMatmul>(s, bits, group_size, N, K, current_isa()),
                     std::move(inputs));
  return x.dtype() == mx::float32 ? y : mx::astype(y, x.dtype(), s);
}

std::vector<mx::array> quantized_matmul_split(const mx::array& x, const mx::array& w,
                                              const mx::array& scales,
                                              const std::optional<mx::array>& biases, int bits,
                                              int group_size, const std::vector<int>& widths) {
  int N = 0, K = 0;
  auto inputs =
      matmul_inputs("quantized_matmul_split", x, w, scales, biases, bits, group_size, N, K);
  std::vector<int> ends = {0};
  for (int width : widths) {
    if (width < 1)
      throw std::invalid_argument("forkv quantized_matmul_split: widths must be positive");
    ends.push_back(ends.back() + width);
  }
  if (ends.back() != N)
    throw std::invalid_argument("forkv quantized_matmul_split: widths must add up to " +
                                std::to_string(N) + " (the weight's rows)");
  auto s = mx::to_stream(mx::Device::cpu);
  auto prim = std::make_shared<QuantizedMatmul>(s, bits, group_size, N, K, current_isa(), ends);
  std::vector<mx::Shape> shapes;
  auto shape = x.shape();
  for (int width : widths) {
    shape.back() = width;
    shapes.push_back(shape);
  }
  auto ys = mx::array::make_arrays(std::move(shapes),
                                   std::vector<mx::Dtype>(widths.size(), mx::float32), prim,
                                   std::move(inputs));
  if (x.dtype() != mx::float32)
    for (auto& y : ys) y = mx::astype(y, x.dtype(), s);
  return ys;
}

namespace {

std::vector<mx::array> matmul_inputs(const std::string& fn, const mx::array& x,
                                     const mx::array& w, const mx::array& scales,
                                     const std::optional<mx::array>& biases, int bits,
                                     int group_size, int& N, int& K) {
  if (bits != 4 && bits != 5 && bits != 6 && bits != 8)
    throw std::invalid_argument("forkv " + fn + ": bits must be 4, 5, 6 or 8");
  if (group_size != 32 && group_size != 64 && group_size != 128 && group_size != 16)
    throw std::invalid_argument("forkv " + fn + ": group_size must be 16, 32, 64 or 128");
  if (group_size == 16 && bits == 8)
    throw std::invalid_argument("forkv " + fn + ": group_size 16 takes 4, 5 or 6 bits");
  if (scales.ndim() != 2 || (biases && biases->shape() != scales.shape()))
    throw std::invalid_argument("forkv " + fn + ": scales and biases must be [N, K/group]");
  const bool kparams = scales.dtype() == mx::uint8;
  if (kparams && (biases || !(group_size == 16 ? bits == 6 : group_size == 32 && bits <= 5) ||
                  scales.shape(1) % kparams_bytes(group_size) != 0))
    throw std::invalid_argument("forkv " + fn + ": uint8 scales are K-quant params: [N, K/256 * "
                                "20] for 4/5 bits in groups of 32, [N, K/256 * 18] for 6 bits "
                                "in groups of 16, without biases");
  N = scales.shape(0);
  K = k_of(scales.shape(1), group_size, kparams);
  if (K % 64 != 0) throw std::invalid_argument("forkv " + fn + ": K must be a multiple of 64");
  if (x.ndim() < 1 || x.shape().back() != K)
    throw std::invalid_argument("forkv " + fn + ": x's last axis must be " + std::to_string(K));
  if (w.ndim() != 2 || w.shape(0) != N || size_t(w.shape(1)) * w.itemsize() != row_bytes(K, bits))
    throw std::invalid_argument("forkv " + fn + ": w does not hold [N, K] at this bit width");
  if (bits != 4 && w.dtype() != mx::uint8)  // (mlx's 8-bit rows have the size, not the order)
    throw std::invalid_argument("forkv " + fn + ": " + std::to_string(bits) + "-bit weights "
                                "must be in the kernels' layout: lib.repack(w, K, bits)");
  if (biases ? scales.dtype() != mx::float32 || biases->dtype() != mx::float32
             : scales.dtype() != mx::float32 && scales.dtype() != mx::float16 && !kparams)
    throw std::invalid_argument("forkv " + fn + ": scales and biases must be float32 "
                                "(without biases, scales may be float16)");
  auto s = mx::to_stream(mx::Device::cpu);
  // x may be strided: eval_cpu gathers it.
  auto xf = x.dtype() == mx::float32 ? x : mx::astype(x, mx::float32, s);
  std::vector<mx::array> inputs = {xf, as_is(w, s), as_is(scales, s)};
  if (biases) inputs.push_back(as_is(*biases, s));
  return inputs;
}

}  // namespace

mx::array repack(const mx::array& w, int K, int bits) {
  if (bits != 5 && bits != 6 && bits != 8)
    throw std::invalid_argument("forkv repack: bits must be 5, 6 or 8");
  if (w.dtype() != mx::uint32 || w.ndim() != 2 || size_t(w.shape(1)) * 32 != size_t(K) * bits)
    throw std::invalid_argument("forkv repack: w must be mlx-packed uint32 [N, K * bits / 32]");
  if (K % 64 != 0) throw std::invalid_argument("forkv repack: K must be a multiple of 64");
  auto src = mx::contiguous(w);
  src.eval();
  const int N = w.shape(0);
  const size_t rb = row_bytes(K, bits);
  auto data = mx::allocator::malloc(size_t(N) * rb);
  auto* dst = static_cast<uint8_t*>(data.buffer().raw_ptr());
  const uint32_t* in = src.data<uint32_t>();
  const size_t words = size_t(w.shape(1));
  Pool& p = pool();
  p.run(p.num_threads(), [&](int t) {
    const int n0 = int(int64_t(N) * t / p.num_threads());
    const int n1 = int(int64_t(N) * (t + 1) / p.num_threads());
    repack_rows(in, words, n0, n1, K, bits, dst);
  });
  return mx::array(std::move(data), {N, int(rb)}, mx::uint8);
}

}  // namespace forkv
