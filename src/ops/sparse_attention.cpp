// Entry points of sparse latent MQA attention: the index table's contract is checked here
// (entries in [-1, skv), no duplicate in a row; on the GPU by a device-side check), then the
// backend's kernel runs: f32 on the CPU; bf16 on CUDA (the backward with H a multiple of 16).
#include "hmla/ops/sparse_attention.h"

#include <cmath>
#include <vector>

#include "hmla/core/error.h"

namespace hmla {

namespace cpu {
void attn_sparse_fwd_cpu(const AttnSparseInputs& in, AttnSparseSaved& sv);
void attn_sparse_bwd_cpu(const AttnSparseInputs& in, const AttnSparseSaved& sv, const Tensor& dout,
                         AttnSparseGrads& gr);
}  // namespace cpu
namespace cuda {
void attn_sparse_check_table(const Tensor& idx, int64_t skv);
}  // namespace cuda

namespace {

void check(const AttnSparseInputs& in) {
  HMLA_CHECK(in.q.defined() && in.q.dim() == 4 && in.q.stride(3) == 1 && in.q.size(2) >= 1, ShapeError,
             "sparse attention: q must be [b, s, H >= 1, Dqk] with its last dim contiguous");
  const Device dev = in.q.device();
  const DType dt = dev == Device::cpu ? DType::f32 : DType::bf16;
  HMLA_CHECK(in.q.dtype() == dt, ShapeError, "sparse attention: q must be ", dtype_name(dt), " on ",
             device_name(dev), ", got ", dtype_name(in.q.dtype()));
  const int64_t b = in.q.size(0), s = in.q.size(1), Dqk = in.q.size(3);
  HMLA_CHECK(in.kv.defined() && in.kv.dim() == 3 && in.kv.size(0) == b && in.kv.size(1) >= s &&
                 in.kv.size(2) == Dqk && in.kv.is_contiguous() && in.kv.dtype() == dt && in.kv.device() == dev,
             ShapeError, "sparse attention: kv must be a contiguous ", dtype_name(dt), " [b, skv >= ", s, ", ", Dqk,
             "] tensor on q's device, got ", in.kv.defined() ? shape_str(in.kv.shape()) : "undefined");
  HMLA_CHECK(in.idx.defined() && in.idx.device() == dev, ShapeError, "sparse attention: idx must be on q's device");
  if (dev == Device::cuda)
    HMLA_CHECK(Dqk % 16 == 0 && in.Dv % 16 == 0, ShapeError, "sparse attention on CUDA: Dqk = ", Dqk,
               " and Dv = ", in.Dv, " must be multiples of 16");
  const int64_t skv = in.kv.size(1);
  HMLA_CHECK(in.Dv >= 1 && in.Dv <= Dqk, ShapeError, "sparse attention: Dv = ", in.Dv, " must be in [1, Dqk = ",
             Dqk, "]");
  HMLA_CHECK(in.idx.defined() && in.idx.dtype() == DType::i32 && in.idx.dim() == 3 && in.idx.size(0) == b &&
                 in.idx.size(1) == s && in.idx.is_contiguous() && in.idx.size(2) >= 1,
             ShapeError, "sparse attention: idx must be a contiguous i32 [b, s, K + W] table");
  HMLA_CHECK(in.K >= 0 && in.K <= in.idx.size(2), ShapeError, "sparse attention: K = ", in.K,
             " must be in [0, K + W = ", in.idx.size(2), "]");
  HMLA_CHECK(std::isfinite(in.scale) && in.scale > 0.f, ShapeError, "sparse attention: scale must be positive");
  if (in.sink.defined())
    HMLA_CHECK(in.sink.shape() == Shape({in.q.size(2)}) && in.sink.dtype() == DType::f32 && in.sink.device() == dev,
               ShapeError, "sparse attention: sink must be f32 [H] on q's device");
  if (dev == Device::cuda) {
#ifdef HMLA_HAVE_CUDA
    cuda::attn_sparse_check_table(in.idx, skv);
    return;
#else
    throw ShapeError("sparse attention: CUDA tensors need a CUDA build of hmla");
#endif
  }
  // -1 or a position of the row; no key twice (stamps: O(s * (K + W)) in all).
  const int64_t KW = in.idx.size(2);
  const int32_t* idx = in.idx.data<int32_t>();
  std::vector<int64_t> stamp(skv, -1);
  for (int64_t row = 0; row < b * s; ++row)
    for (int64_t i = 0; i < KW; ++i) {
      const int32_t j = idx[row * KW + i];
      if (j == -1) continue;
      HMLA_CHECK(j >= 0 && j < skv, ShapeError, "sparse attention: idx[", row / s, ", ", row % s, ", ", i, "] = ", j,
                 " is neither -1 nor a key position in [0, ", skv, ")");
      HMLA_CHECK(stamp[j] != row, ShapeError, "sparse attention: row ", row % s, " of batch ", row / s,
                 " lists key ", j, " twice; duplicates are not allowed");
      stamp[j] = row;
    }
}

}  // namespace

AttnSparseSaved attn_sparse_fwd(const AttnSparseInputs& in) {
  check(in);
  const int64_t b = in.q.size(0), s = in.q.size(1), H = in.q.size(2);
  const Device dev = in.q.device();
  AttnSparseSaved sv{Tensor::empty({b, s, H, in.Dv}, in.q.dtype(), dev), Tensor::empty({b, H, s}, DType::f32, dev),
                     in.K > 0 ? Tensor::empty({b, H, s}, DType::f32, dev) : Tensor()};
#ifdef HMLA_HAVE_CUDA
  if (dev == Device::cuda) {
    cuda::attn_sparse_fwd(in, sv);
    return sv;
  }
#endif
  cpu::attn_sparse_fwd_cpu(in, sv);
  return sv;
}

AttnSparseGrads attn_sparse_bwd(const AttnSparseInputs& in, const AttnSparseSaved& sv, const Tensor& dout) {
  check(in);
  const int64_t b = in.q.size(0), s = in.q.size(1), H = in.q.size(2);
  const Device dev = in.q.device();
  HMLA_CHECK(dout.defined() && dout.shape() == Shape({b, s, H, in.Dv}) && dout.is_contiguous() &&
                 dout.dtype() == in.q.dtype() && dout.device() == dev,
             ShapeError, "sparse attention: dout must be a contiguous ", dtype_name(in.q.dtype()), " ",
             shape_str({b, s, H, in.Dv}), " on q's device");
  HMLA_CHECK(sv.out.defined() && sv.out.shape() == Shape({b, s, H, in.Dv}) && sv.out.dtype() == in.q.dtype() &&
                 sv.out.device() == dev && sv.out.is_contiguous() && sv.lse.defined() &&
                 sv.lse.shape() == Shape({b, H, s}) && sv.lse.dtype() == DType::f32 && sv.lse.device() == dev &&
                 sv.lse.is_contiguous(),
             ShapeError, "sparse attention: the saved out/lse do not match the inputs (the forward's outputs)");
  AttnSparseGrads g{Tensor::empty({b, s, H, in.q.size(3)}, in.q.dtype(), dev), Tensor::empty(in.kv.shape(), in.q.dtype(), dev),
                    in.sink.defined() ? Tensor::empty({H}, DType::f32, dev) : Tensor()};
#ifdef HMLA_HAVE_CUDA
  if (dev == Device::cuda) {
    HMLA_CHECK(H % 16 == 0, ShapeError, "sparse attention backward on CUDA: H = ", H, " must be a multiple of 16");
    cuda::attn_sparse_bwd(in, sv, dout, g);
    return g;
  }
#endif
  cpu::attn_sparse_bwd_cpu(in, sv, dout, g);
  return g;
}

}  // namespace hmla
