// hmla._C: the torch bindings of hmla's op entry points (include/hmla/ops), for hmla.torch.
// Tensors cross zero-copy both ways: a torch tensor is wrapped as an hmla view (Tensor::wrap, the
// torch handle keeping its memory alive), and an output hmla allocated is handed to torch with
// from_blob (a deleter keeping hmla's storage alive). The entry points validate shapes, dtypes,
// devices and layouts; their errors reach Python as ValueError (bad input) or RuntimeError.
#include <torch/extension.h>

#include <memory>
#include <string>
#include <vector>

#include "hmla/core/allocator.h"
#include "hmla/core/error.h"
#include "hmla/core/layout.h"
#include "hmla/ops/attention.h"
#include "hmla/ops/indexer.h"
#include "hmla/ops/sparse_attention.h"

namespace {

using hmla::DType;
using hmla::Shape;

DType hmla_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::f32;
    case at::kBFloat16: return DType::bf16;
    case at::kInt: return DType::i32;
    case at::kLong: return DType::i64;
    default: throw hmla::ShapeError(std::string("hmla.torch: dtype ") + c10::toString(t.scalar_type()) +
                                    " is not one of float32, bfloat16, int32, int64");
  }
}

at::ScalarType scalar_of(DType d) {
  switch (d) {
    case DType::f32: return at::kFloat;
    case DType::bf16: return at::kBFloat16;
    case DType::i32: return at::kInt;
    default: return at::kLong;
  }
}

hmla::Device hmla_device(const at::Tensor& t) {
  if (t.is_cuda()) return hmla::Device::cuda;
  HMLA_CHECK(t.device().is_cpu(), hmla::ShapeError, "hmla.torch: tensors must be on the CPU or a CUDA device, got ",
             t.device().str());
  return hmla::Device::cpu;
}

// A zero-copy hmla view of t (undefined for an undefined tensor).
hmla::Tensor view(const at::Tensor& t) {
  if (!t.defined()) return {};
  const Shape shape(t.sizes().begin(), t.sizes().end()), strides(t.strides().begin(), t.strides().end());
  return hmla::Tensor::wrap(t.data_ptr(), shape, strides, hmla_dtype(t), hmla_device(t), std::make_shared<at::Tensor>(t));
}

// A zero-copy torch tensor of an hmla tensor (hmla's storage lives as long as torch's view); `like`
// is an input on the same device (which CUDA device, for torch).
at::Tensor to_torch(const hmla::Tensor& t, const at::Tensor& like) {
  if (!t.defined()) return {};
  auto* keep = new hmla::Tensor(t);
  const auto opts = at::TensorOptions()
                        .dtype(scalar_of(t.dtype()))
                        .device(t.device() == hmla::Device::cuda ? like.device() : at::Device(at::kCPU));
  return torch::from_blob(t.raw_data(), t.shape(), t.strides(), [keep](void*) { delete keep; }, opts);
}

std::vector<int64_t> host_ints(const at::Tensor& t) {
  const at::Tensor h = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(h.data_ptr<int64_t>(), h.data_ptr<int64_t>() + h.numel());
}

// The document layout of hmla attention (DESIGN.md section 3), on the host: cu_seqlens [n + 1]
// (b = 1), end_rows [b, s], or one causal document per row.
hmla::DocLayout layout_of(int64_t b, int64_t s, const c10::optional<at::Tensor>& cu_seqlens,
                          const c10::optional<at::Tensor>& end_rows) {
  HMLA_CHECK(!(cu_seqlens && end_rows), hmla::LayoutError, "hmla.torch: give cu_seqlens or end_rows, not both");
  if (cu_seqlens) {
    HMLA_CHECK(b == 1 && cu_seqlens->dim() == 1, hmla::LayoutError,
               "hmla.torch: cu_seqlens is one [n + 1] vector for b = 1, got b = ", b, " and shape ",
               hmla::shape_str(Shape(cu_seqlens->sizes().begin(), cu_seqlens->sizes().end())));
    return hmla::layout_from_cu_seqlens(s, {host_ints(*cu_seqlens)});
  }
  if (end_rows) {
    HMLA_CHECK(end_rows->dim() == 2 && end_rows->size(0) == b && end_rows->size(1) == s, hmla::LayoutError,
               "hmla.torch: end_rows must be [b, s] = [", b, ", ", s, "]");
    return hmla::layout_from_end_rows(b, s, host_ints(*end_rows));
  }
  return hmla::layout_causal(b, s);
}

hmla::Tensor opt_view(const c10::optional<at::Tensor>& t) { return t ? view(*t) : hmla::Tensor(); }

// ---- attention -------------------------------------------------------------------------------

hmla::AttnDenseInputs dense_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                                   const hmla::DocLayout& layout, const c10::optional<at::Tensor>& sink) {
  hmla::AttnDenseInputs in;
  in.q = view(q), in.k = view(k), in.v = view(v);
  in.layout = &layout;
  in.sink = opt_view(sink);
  in.scale = float(scale);
  return in;
}

std::vector<at::Tensor> attention_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                                      const c10::optional<at::Tensor>& cu_seqlens,
                                      const c10::optional<at::Tensor>& end_rows, const c10::optional<at::Tensor>& sink) {
  const hmla::DocLayout layout = layout_of(q.size(0), k.size(1), cu_seqlens, end_rows);
  const hmla::AttnDenseSaved sv = hmla::attn_dense_fwd(dense_inputs(q, k, v, scale, layout, sink));
  return {to_torch(sv.out, q), to_torch(sv.lse, q)};
}

std::vector<at::Tensor> attention_bwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                                      const c10::optional<at::Tensor>& cu_seqlens,
                                      const c10::optional<at::Tensor>& end_rows, const c10::optional<at::Tensor>& sink,
                                      const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dout) {
  const hmla::DocLayout layout = layout_of(q.size(0), k.size(1), cu_seqlens, end_rows);
  const hmla::AttnDenseGrads g =
      hmla::attn_dense_bwd(dense_inputs(q, k, v, scale, layout, sink), {view(out), view(lse)}, view(dout));
  return {to_torch(g.dq, q), to_torch(g.dk, q), to_torch(g.dv, q), to_torch(g.dsink, q)};
}

// ---- the indexer -------------------------------------------------------------------------------

hmla::IndexerScores scores(const at::Tensor& qI, const at::Tensor& kI, const at::Tensor& w,
                           const hmla::DocLayout& layout) {
  return {view(qI), view(kI), view(w), &layout, 0};
}

at::Tensor indexer_topk(const at::Tensor& qI, const at::Tensor& kI, const at::Tensor& w, int64_t topk, int64_t window,
                        const c10::optional<at::Tensor>& cu_seqlens, const c10::optional<at::Tensor>& end_rows) {
  const hmla::DocLayout layout = layout_of(qI.size(0), kI.size(1), cu_seqlens, end_rows);
  return to_torch(hmla::indexer_topk(scores(qI, kI, w, layout), topk, window), qI);
}

// The loss-row weights: mask[t] / valid_rows over the rows with a non-empty A(t) (DESIGN.md
// section 6's empty-row rule), on the inputs' device.
at::Tensor row_weights(const hmla::DocLayout& layout, const c10::optional<at::Tensor>& row_mask, const at::Device& dev) {
  const int32_t* ds = layout.doc_start.data<int32_t>();
  at::Tensor mask = row_mask ? row_mask->to(at::kCPU).to(at::kBool).contiguous() : at::Tensor();
  HMLA_CHECK(!row_mask || (mask.dim() == 2 && mask.size(0) == layout.b && mask.size(1) == layout.s),
             hmla::ShapeError, "hmla.torch: row_mask must be [b, s] = [", layout.b, ", ", layout.s, "]");
  std::vector<float> rw(size_t(layout.b * layout.s), 0.f);
  int64_t valid = 0;
  for (int64_t i = 0; i < layout.b * layout.s; ++i)
    if (ds[i] <= i % layout.s && (!row_mask || mask.data_ptr<bool>()[i])) rw[size_t(i)] = 1.f, ++valid;
  for (float& x : rw) x /= float(std::max<int64_t>(valid, 1));
  return torch::from_blob(rw.data(), {layout.b, layout.s}, at::kFloat).clone().to(dev);
}

// Returns (loss, dqI, dkI, dw): the loss as a 0-dim f32 tensor, the gradients of the loss.
std::vector<at::Tensor> indexer_kl(const at::Tensor& qI, const at::Tensor& kI, const at::Tensor& w, const at::Tensor& q,
                                   const at::Tensor& k, double scale, const c10::optional<at::Tensor>& cu_seqlens,
                                   const c10::optional<at::Tensor>& end_rows,
                                   const c10::optional<at::Tensor>& topk_indices, int64_t window,
                                   const c10::optional<at::Tensor>& row_mask, double coeff) {
  const hmla::DocLayout layout = layout_of(qI.size(0), kI.size(1), cu_seqlens, end_rows);
  const at::Tensor rw = row_weights(layout, row_mask, qI.device());
  hmla::IndexerKlInputs in;
  in.sc = scores(qI, kI, w, layout);
  in.q = view(q), in.k = view(k);
  in.scale = float(scale);
  in.row_weight = view(rw);
  in.coeff = float(coeff);
  if (topk_indices) {
    in.topk = view(*topk_indices);
    HMLA_CHECK(topk_indices->dim() == 3 && window >= 0 && window < topk_indices->size(2), hmla::ShapeError,
               "hmla.torch: topk_indices must be [b, s, K + window] with K >= 1, got window = ", window);
    in.K = topk_indices->size(2) - window;
  }
  const hmla::IndexerKlResult r = topk_indices ? hmla::indexer_kl_sparse(in) : hmla::indexer_kl_dense(in);
  return {torch::tensor(float(r.loss), at::TensorOptions().dtype(at::kFloat)).to(qI.device()), to_torch(r.dqI, qI),
          to_torch(r.dkI, qI), to_torch(r.dw, qI)};
}

// ---- sparse latent MQA ---------------------------------------------------------------------------

hmla::AttnSparseInputs sparse_inputs(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& idx, double scale,
                                     int64_t dv, const c10::optional<at::Tensor>& sink) {
  hmla::AttnSparseInputs in;
  in.q = view(q), in.kv = view(kv), in.idx = view(idx);
  in.Dv = dv;
  in.K = idx.dim() == 3 ? idx.size(2) : 0;  // every listed key is a candidate
  in.sink = opt_view(sink);
  in.scale = float(scale);
  return in;
}

std::vector<at::Tensor> sparse_mla_fwd(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& idx, double scale,
                                       int64_t dv, const c10::optional<at::Tensor>& sink) {
  const hmla::AttnSparseSaved sv = hmla::attn_sparse_fwd(sparse_inputs(q, kv, idx, scale, dv, sink));
  return {to_torch(sv.out, q), to_torch(sv.lse, q), to_torch(sv.lse_c, q)};
}

std::vector<at::Tensor> sparse_mla_bwd(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& idx, double scale,
                                       int64_t dv, const c10::optional<at::Tensor>& sink, const at::Tensor& out,
                                       const at::Tensor& lse, const at::Tensor& lse_c, const at::Tensor& dout) {
  const hmla::AttnSparseGrads g = hmla::attn_sparse_bwd(sparse_inputs(q, kv, idx, scale, dv, sink),
                                                        {view(out), view(lse), view(lse_c)}, view(dout));
  return {to_torch(g.dq, q), to_torch(g.dkv, q), to_torch(g.dsink, q)};
}

// ---- memory -----------------------------------------------------------------------------------

py::dict memory_stats(bool reset_peak) {
  py::dict d;
  for (hmla::Device dev : {hmla::Device::cpu, hmla::Device::cuda}) {
    if (dev == hmla::Device::cuda && !torch::cuda::is_available()) continue;
    hmla::Allocator* a = nullptr;
    try {
      a = &hmla::allocator(dev);
    } catch (const hmla::Error&) {
      continue;  // a build without CUDA
    }
    py::dict s;
    s["live_bytes"] = a->live_bytes();
    s["peak_bytes"] = a->peak_bytes();
    d[hmla::device_name(dev)] = s;
    if (reset_peak) a->reset_peak();
  }
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "hmla's op entry points for hmla.torch (zero-copy on torch tensors)";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const hmla::ShapeError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const hmla::LayoutError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const hmla::ConfigError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const hmla::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
  m.def("attention_fwd", &attention_fwd);
  m.def("attention_bwd", &attention_bwd);
  m.def("indexer_topk", &indexer_topk);
  m.def("indexer_kl", &indexer_kl);
  m.def("sparse_mla_fwd", &sparse_mla_fwd);
  m.def("sparse_mla_bwd", &sparse_mla_bwd);
  m.def("memory_stats", &memory_stats, py::arg("reset_peak") = false);
}
