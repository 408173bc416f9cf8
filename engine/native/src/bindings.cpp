#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "activation.h"
#include "attention.h"
#include "block.h"
#include "kvwrite.h"
#include "pool.h"
#include "rowwise.h"
#include "qgemm.h"
#include "qmatmul.h"

namespace nb = nanobind;
using namespace nb::literals;

NB_MODULE(_forkv_native, m) {
  m.doc() = "forkv's CPU kernels for mlx (engine/native)";
  m.def("quantized_matmul", &forkv::quantized_matmul, "x"_a, "w"_a, "scales"_a, "biases"_a.none(),
        "bits"_a, "group_size"_a);
  m.def("quantized_matmul_split", &forkv::quantized_matmul_split, "x"_a, "w"_a, "scales"_a,
        "biases"_a.none(), "bits"_a, "group_size"_a, "widths"_a);
  m.def("decode_attention", &forkv::decode_attention, "q"_a, "k"_a, "v"_a, "scale"_a,
        "mask"_a = nb::none());
  m.def("attention", &forkv::attention, "q"_a, "k"_a, "v"_a, "scale"_a, "mask"_a = nb::none(),
        "causal"_a = false, "rot"_a = 0);
  m.def("quantize_kv", &forkv::quantize_kv, "x"_a);
  m.def("kv_write", &forkv::kv_write, "buf"_a, "upd"_a, "pos"_a);
  m.def("attn_in", &forkv::attn_in, "x"_a, "norm"_a, "qk_norms"_a, "arrays"_a, "specs"_a,
        "eps"_a, "norm_offset"_a, "qk_eps"_a, "n_heads"_a, "n_kv_heads"_a, "head_dim"_a,
        "rope_dims"_a, "rope_traditional"_a, "rope_base"_a, "rope_scale"_a, "offset"_a,
        "kv_dtype"_a, "offsets"_a = nb::none());
  m.def("block_out", &forkv::block_out, "q"_a, "keys"_a, "values"_a, "mask"_a.none(),
        "causal"_a, "rot"_a, "scale"_a, "x"_a, "norms"_a, "arrays"_a, "specs"_a, "counts"_a,
        "eps"_a, "norm_offset"_a, "act"_a, "act_mul"_a);
  m.def("activation", &forkv::activation, "x"_a, "kind"_a, "mul"_a = nb::none());
  m.def("logsumexp", &forkv::logsumexp, "x"_a);
  m.def("sample", &forkv::sample, "scores"_a, "u"_a);
  m.def("draw", &forkv::draw, "logits"_a, "t"_a, "u"_a, "limit"_a = nb::none(),
        "bias_ids"_a = nb::none(), "bias_values"_a = nb::none());
  m.def("rms_norm", &forkv::rms_norm, "x"_a, "w"_a, "eps"_a, "offset"_a = 0.0f);
  m.def("rope", &forkv::rope, "x"_a, "dims"_a, "traditional"_a, "base"_a, "scale"_a,
        "offset"_a = 0, "offsets"_a = nb::none());
  m.def("repack", &forkv::repack, "w"_a, "K"_a, "bits"_a);
  m.def("row_bytes", &forkv::row_bytes, "K"_a, "bits"_a);
  m.def("pack_arrays", &forkv::pack_arrays, "arrays"_a, "huge"_a);
  m.def("isa", [] { return std::string(forkv::isa_name(forkv::current_isa())); });
  m.def("best_isa", [] { return std::string(forkv::isa_name(forkv::best_isa())); });
  m.def("set_isa", [](const std::string& name) {
    for (auto isa : {forkv::Isa::scalar, forkv::Isa::avx2, forkv::Isa::avx512vnni})
      if (name == forkv::isa_name(isa)) return forkv::set_isa(isa);
    throw std::invalid_argument("unknown ISA " + name + "; use scalar, avx2 or avx512vnni");
  });
  m.def("matvec_tiles", &forkv::matvec_tiles);
  m.def("set_matvec_tiles", &forkv::set_matvec_tiles, "on"_a);
  m.def("matvec_ahead", &forkv::matvec_ahead);
  m.def("set_matvec_ahead", &forkv::set_matvec_ahead, "on"_a);
  m.def("num_threads", &forkv::current_threads);
  m.def("set_num_threads", &forkv::set_threads, "n"_a);
}
