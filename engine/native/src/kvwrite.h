// A K/V cache's update written into the cache's own buffer, where mlx would copy the buffer.
//
// mlx arrays are values: `keys[..., a:b, :] = k` writes in place only while no other array
// shares the buffer, and copies all of it otherwise. A decoding row whose prompt's cache the
// live pool keeps (other arrays over the same buffer, reading its first n tokens) copied its
// whole K/V at its first decode step: at 32K tokens of Gemma 3 270M, ~104 MiB more for as
// long as the row decodes. kv_write writes the update at `pos` of the buffer regardless; the
// caller (native/kvcache.py) uses it only where every other holder of the buffer reads
// positions before `pos` or find there the bytes it writes (native/kvcache.py checks), so
// nobody sees a change.
#pragma once

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace forkv {

// buf [B, H, S, W] (any dtype, its last axis contiguous), upd [B, H, n, W] of buf's dtype,
// 0 <= pos and pos + n <= S. Returns an array over buf's own buffer with upd's rows written
// at positions [pos, pos + n) of axis 2 (buf's other positions unchanged, nothing copied).
mlx::core::array kv_write(const mlx::core::array& buf, const mlx::core::array& upd, int pos);

class KvWrite : public mlx::core::Primitive {
 public:
  KvWrite(mlx::core::Stream stream, int pos) : mlx::core::Primitive(stream), pos_(pos) {}
  void eval_cpu(const std::vector<mlx::core::array>& inputs,
                std::vector<mlx::core::array>& outputs) override;
  void eval_gpu(const std::vector<mlx::core::array>& inputs,
                std::vector<mlx::core::array>& outputs) override;
  const char* name() const override { return "ForkvKvWrite"; }
  // Never merged with another write (each is a side effect on its buffer).
  bool is_equivalent(const mlx::core::Primitive&) const override { return false; }
  std::vector<mlx::core::Shape> output_shapes(
      const std::vector<mlx::core::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  int pos_;
};

}  // namespace forkv
