#include "kvwrite.h"

#include <cstring>
#include <stdexcept>

#include "mlx/backend/cpu/encoder.h"

namespace mx = mlx::core;

namespace forkv {

namespace {

// Row (b, h, l) of a [B, H, S, W] array whose last axis is contiguous.
char* row_at(const mx::array& a, int b, int h, int64_t l) {
  return static_cast<char*>(const_cast<void*>(a.data<void>())) +
         (b * a.strides(0) + h * a.strides(1) + l * a.strides(2)) * int64_t(a.itemsize());
}

}  // namespace

void KvWrite::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const auto& buf = inputs[0];
  const auto& upd = inputs[1];
  auto& out = outputs[0];
  if (buf.strides(3) != 1 || upd.strides(3) != 1)
    throw std::invalid_argument("forkv kv_write: the last axis must be contiguous");
  out.copy_shared_buffer(buf);
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(buf);
  encoder.set_input_array(upd);
  encoder.set_output_array(out);
  encoder.dispatch([out = mx::array::unsafe_weak_copy(out),
                    upd = mx::array::unsafe_weak_copy(upd), pos = pos_]() mutable {
    const size_t row = size_t(upd.shape(3)) * upd.itemsize();
    for (int b = 0; b < upd.shape(0); ++b)
      for (int h = 0; h < upd.shape(1); ++h)
        for (int l = 0; l < upd.shape(2); ++l)
          std::memcpy(row_at(out, b, h, int64_t(pos) + l), row_at(upd, b, h, l), row);
  });
}

void KvWrite::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("forkv's kv_write runs on the CPU only.");
}

mx::array kv_write(const mx::array& buf, const mx::array& upd, int pos) {
  if (buf.ndim() != 4 || upd.ndim() != 4 || buf.dtype() != upd.dtype() ||
      buf.shape(0) != upd.shape(0) || buf.shape(1) != upd.shape(1) ||
      buf.shape(3) != upd.shape(3) || pos < 0 || pos + upd.shape(2) > buf.shape(2))
    throw std::invalid_argument(
        "forkv kv_write: buf [B, H, S, W] and upd [B, H, n, W] of one dtype, with "
        "0 <= pos and pos + n <= S");
  return mx::array(buf.shape(), buf.dtype(),
                   std::make_shared<KvWrite>(mx::to_stream(mx::Device::cpu), pos),
                   {buf, upd});
}

}  // namespace forkv
