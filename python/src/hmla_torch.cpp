// hmla._C: the torch bindings of hmla's op entry points (include/hmla/ops), for hmla.torch.
// Tensors cross zero-copy both ways: a torch tensor is wrapped as an hmla view (Tensor::wrap, the
// torch handle keeping its memory alive), and an output hmla allocated is handed to torch with
// from_blob (a deleter keeping hmla's storage alive). On CUDA each call runs on torch's current
// stream, which hmla.torch passes in as an integer (so this file needs no CUDA header from torch:
// the CPU-only libtorch builds it too), so hmla's work is ordered like any torch op. The entry
// points validate shapes, dtypes, devices and layouts; their errors reach Python as ValueError
// (bad input) or RuntimeError.
#include <torch/extension.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hmla/core/allocator.h"
#include "hmla/core/cuda.h"
#include "hmla/core/error.h"
#include "hmla/core/layout.h"
#include "hmla/ops/attention.h"
#include "hmla/ops/index_table.h"
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
    case DType::f64: return at::kDouble;  // an accumulator (indexer_kl's loss), never an input
    default: return at::kLong;
  }
}

hmla::Device hmla_device(const at::Tensor& t) {
  if (t.is_cuda()) return hmla::Device::cuda;
  HMLA_CHECK(t.device().is_cpu(), hmla::ShapeError, "hmla.torch: tensors must be on the CPU or a CUDA device, got ",
             t.device().str());
  return hmla::Device::cpu;
}

// A zero-copy hmla view of t as it is (undefined for an undefined tensor).
hmla::Tensor wrap(const at::Tensor& t) {
  if (!t.defined()) return {};
  const Shape shape(t.sizes().begin(), t.sizes().end()), strides(t.strides().begin(), t.strides().end());
  return hmla::Tensor::wrap(t.data_ptr(), shape, strides, hmla_dtype(t), hmla_device(t), std::make_shared<at::Tensor>(t));
}

// The two kinds of tensor argument, each made what its kernel takes with the smallest copy (none
// when it already is): `strided` for the operands read through strides (q, k, v; the indexer KL's
// q and k): hmla::kernel_strides_ok (expanded rows or heads, strides of 2^31 and more are copied);
// `dense` for every other tensor, which the kernels read as contiguous (a sink [::2] or expand(H),
// tables, the indexer's inputs, saved outputs and output gradients).
hmla::Tensor strided(const at::Tensor& t) {
  if (!t.defined()) return {};
  hmla::Tensor v = wrap(t);
  return hmla::kernel_strides_ok(v) ? v : wrap(t.contiguous());
}

hmla::Tensor dense(const at::Tensor& t) { return t.defined() ? wrap(t.contiguous()) : hmla::Tensor(); }

// One call's stream: torch's current stream of the inputs' CUDA device (cudaStream_t as an
// integer), or none for CPU tensors. While the object lives, hmla's work on this thread goes to it:
// each entry point makes it first, so that every hmla object of the call is freed inside it.
class CallStream {
 public:
  explicit CallStream(const c10::optional<int64_t>& stream) : stream_(stream) {
    if (stream_) scope_.emplace(uintptr_t(*stream_));
  }
  // A zero-copy torch tensor of an hmla tensor the call made (hmla's storage lives as long as
  // torch's view); `like` is an input on the same device (which CUDA device, for torch).
  //
  // The deleter frees hmla's storage under this call's stream, whatever thread torch runs it on
  // (autograd's, the one dropping the last reference): that is the stream the caching allocator
  // records as the block's freeing stream (src/cuda/device.cu). It is the tensor's allocation
  // stream in torch's terms, and torch's rule is that a tensor used on another stream is kept
  // alive for that use by the user (record_stream; torch's own caching allocator also frees a block
  // for reuse on its allocation stream only). hmla's allocator cannot see a record_stream on a
  // from_blob tensor, so an output used on a side stream must be kept alive (or that stream
  // synchronised) until that use is done, as for any tensor torch did not allocate. The stream must
  // outlive the tensor: torch's streams (pool streams) are never destroyed.
  at::Tensor out(const hmla::Tensor& t, const at::Tensor& like) const {
    if (!t.defined()) return {};
    auto* keep = new hmla::Tensor(t);
    const auto opts = at::TensorOptions()
                          .dtype(scalar_of(t.dtype()))
                          .device(t.device() == hmla::Device::cuda ? like.device() : at::Device(at::kCPU));
    auto release = [keep, stream = stream_](void*) {
      if (!stream) return delete keep;
      const hmla::ScopedCudaStream on{uintptr_t(*stream)};
      delete keep;
    };
    return torch::from_blob(t.raw_data(), t.shape(), t.strides(), release, opts);
  }

 private:
  c10::optional<int64_t> stream_;
  std::optional<hmla::ScopedCudaStream> scope_;
};

std::vector<int64_t> host_ints(const at::Tensor& t) {
  const at::Tensor h = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(h.data_ptr<int64_t>(), h.data_ptr<int64_t>() + h.numel());
}

// A layout tensor is integer data: int32 (or, for cu_seqlens, int64) as documented; a float, bool
// or grad-requiring tensor is refused rather than truncated.
void check_layout_dtype(const at::Tensor& t, const char* name, bool int64_ok) {
  const bool ok = t.scalar_type() == at::kInt || (int64_ok && t.scalar_type() == at::kLong);
  HMLA_CHECK(ok, hmla::LayoutError, "hmla.torch: ", name, " must be an ", int64_ok ? "int32 or int64" : "int32",
             " tensor, got ", c10::toString(t.scalar_type()));
}

// The document layout of hmla attention (DESIGN.md section 3), on the host: cu_seqlens [n + 1]
// (b = 1; equal entries are zero-length documents), end_rows [b, s], or one causal document per row.
hmla::DocLayout layout_of(int64_t b, int64_t s, const c10::optional<at::Tensor>& cu_seqlens,
                          const c10::optional<at::Tensor>& end_rows) {
  HMLA_CHECK(!(cu_seqlens && end_rows), hmla::LayoutError, "hmla.torch: give cu_seqlens or end_rows, not both");
  if (cu_seqlens) {
    check_layout_dtype(*cu_seqlens, "cu_seqlens", true);
    HMLA_CHECK(b == 1 && cu_seqlens->dim() == 1, hmla::LayoutError,
               "hmla.torch: cu_seqlens is one [n + 1] vector for b = 1, got b = ", b, " and shape ",
               hmla::shape_str(Shape(cu_seqlens->sizes().begin(), cu_seqlens->sizes().end())));
    return hmla::layout_from_cu_seqlens(s, {host_ints(*cu_seqlens)});
  }
  if (end_rows) {
    check_layout_dtype(*end_rows, "end_rows", false);
    HMLA_CHECK(end_rows->dim() == 2 && end_rows->size(0) == b && end_rows->size(1) == s, hmla::LayoutError,
               "hmla.torch: end_rows must be [b, s] = [", b, ", ", s, "]");
    return hmla::layout_from_end_rows(b, s, host_ints(*end_rows));
  }
  return hmla::layout_causal(b, s);
}

// The API's shapes agree where it says they do: every per-token tensor has the same [b, s] as the
// first (a q shorter than k is no prefix query: the kernels' row slices are internal).
void check_rows(const char* op, const std::vector<std::pair<const char*, const at::Tensor*>>& ts) {
  const at::Tensor& first = *ts.front().second;
  for (const auto& [name, t] : ts) {
    HMLA_CHECK(t->dim() >= 2, hmla::ShapeError, "hmla.torch: ", op, ": ", name, " must be [b, s, ...], got ", t->dim(),
               " dimensions");
    HMLA_CHECK(t->size(0) == first.size(0) && t->size(1) == first.size(1), hmla::ShapeError, "hmla.torch: ", op, ": ",
               name, " has [b, s] = [", t->size(0), ", ", t->size(1), "] but ", ts.front().first, " has [",
               first.size(0), ", ", first.size(1), "]");
  }
}

hmla::Tensor opt_dense(const c10::optional<at::Tensor>& t) { return t ? dense(*t) : hmla::Tensor(); }

// ---- attention -------------------------------------------------------------------------------

hmla::AttnDenseInputs dense_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                                   const hmla::DocLayout& layout, const c10::optional<at::Tensor>& sink,
                                   const std::string& backend) {
  check_rows("attention", {{"q", &q}, {"k", &k}, {"v", &v}});
  hmla::AttnDenseInputs in;
  in.q = strided(q), in.k = strided(k), in.v = strided(v);
  in.layout = &layout;
  in.sink = opt_dense(sink);
  in.scale = float(scale);
  in.backend = hmla::parse_attn_backend(backend, "hmla.torch.attention: backend");
  return in;
}

std::vector<at::Tensor> attention_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                                      const c10::optional<at::Tensor>& cu_seqlens,
                                      const c10::optional<at::Tensor>& end_rows, const c10::optional<at::Tensor>& sink,
                                      const std::string& backend, const c10::optional<int64_t>& stream) {
  const CallStream cs(stream);
  const hmla::DocLayout layout = layout_of(q.size(0), k.size(1), cu_seqlens, end_rows);
  const hmla::AttnDenseSaved sv = hmla::attn_dense_fwd(dense_inputs(q, k, v, scale, layout, sink, backend));
  return {cs.out(sv.out, q), cs.out(sv.lse, q)};
}

std::vector<at::Tensor> attention_bwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                                      const c10::optional<at::Tensor>& cu_seqlens,
                                      const c10::optional<at::Tensor>& end_rows, const c10::optional<at::Tensor>& sink,
                                      const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dout,
                                      const std::string& backend, const c10::optional<int64_t>& stream) {
  const CallStream cs(stream);
  const hmla::DocLayout layout = layout_of(q.size(0), k.size(1), cu_seqlens, end_rows);
  const hmla::AttnDenseGrads g = hmla::attn_dense_bwd(dense_inputs(q, k, v, scale, layout, sink, backend),
                                                      {dense(out), dense(lse)}, dense(dout));
  return {cs.out(g.dq, q), cs.out(g.dk, q), cs.out(g.dv, q), cs.out(g.dsink, q)};
}

// ---- the indexer -------------------------------------------------------------------------------

hmla::IndexerScores scores(const at::Tensor& qI, const at::Tensor& kI, const at::Tensor& w,
                           const hmla::DocLayout& layout) {
  check_rows("indexer", {{"q_idx", &qI}, {"k_idx", &kI}, {"weights", &w}});
  return {dense(qI), dense(kI), dense(w), &layout, 0};
}

at::Tensor indexer_topk(const at::Tensor& qI, const at::Tensor& kI, const at::Tensor& w, int64_t topk, int64_t window,
                        const c10::optional<at::Tensor>& cu_seqlens, const c10::optional<at::Tensor>& end_rows,
                        const c10::optional<int64_t>& stream) {
  const CallStream cs(stream);
  const hmla::DocLayout layout = layout_of(qI.size(0), kI.size(1), cu_seqlens, end_rows);
  return cs.out(hmla::indexer_topk(scores(qI, kI, w, layout), topk, window), qI);
}

// The loss-row weights: mask[t] / valid_rows over the rows with a non-empty A(t) (DESIGN.md
// section 6's empty-row rule), on the inputs' device.
at::Tensor row_weights(const hmla::DocLayout& layout, const c10::optional<at::Tensor>& row_mask, const at::Device& dev) {
  HMLA_CHECK(!row_mask || row_mask->scalar_type() == at::kBool, hmla::ShapeError,
             "hmla.torch: row_mask must be a bool tensor, got ", row_mask ? c10::toString(row_mask->scalar_type()) : "");
  const int32_t* ds = layout.doc_start.data<int32_t>();
  at::Tensor mask = row_mask ? row_mask->to(at::kCPU).contiguous() : at::Tensor();
  HMLA_CHECK(!row_mask || (mask.dim() == 2 && mask.size(0) == layout.b && mask.size(1) == layout.s),
             hmla::ShapeError, "hmla.torch: row_mask must be [b, s] = [", layout.b, ", ", layout.s, "]");
  std::vector<float> rw(size_t(layout.b * layout.s), 0.f);
  int64_t valid = 0;
  for (int64_t i = 0; i < layout.b * layout.s; ++i)
    if (ds[i] <= i % layout.s && (!row_mask || mask.data_ptr<bool>()[i])) rw[size_t(i)] = 1.f, ++valid;
  for (float& x : rw) x /= float(std::max<int64_t>(valid, 1));
  return torch::from_blob(rw.data(), {layout.b, layout.s}, at::kFloat).clone().to(dev);
}

// The table every op runs, under DESIGN.md section 4's contract (hmla::check_index_table): idx
// itself, or with invalid="skip" a copy whose entries outside A(t) are -1; errors name the entry.
at::Tensor index_table(const at::Tensor& idx, int64_t s, const c10::optional<at::Tensor>& cu_seqlens,
                       const c10::optional<at::Tensor>& end_rows, bool skip, const c10::optional<int64_t>& stream) {
  const CallStream cs(stream);
  HMLA_CHECK(idx.dim() == 3 && idx.size(1) == s, hmla::ShapeError, "hmla.torch: the index table must be [b, s = ", s,
             ", N], got ", hmla::shape_str(Shape(idx.sizes().begin(), idx.sizes().end())));
  const hmla::DocLayout layout = layout_of(idx.size(0), s, cu_seqlens, end_rows);
  const at::Tensor c = idx.contiguous();  // one copy at most: what the check reads and the ops run
  const hmla::Tensor t = wrap(c);
  const hmla::Tensor checked =
      hmla::check_index_table(t, layout, 0, skip ? hmla::InvalidIndex::skip : hmla::InvalidIndex::error, "hmla.torch");
  return checked.same_data(t) ? c : cs.out(checked, idx);
}

// Returns (loss, dqI, dkI, dw): the loss as a 0-dim f32 tensor, the gradients of the loss.
std::vector<at::Tensor> indexer_kl(const at::Tensor& qI, const at::Tensor& kI, const at::Tensor& w, const at::Tensor& q,
                                   const at::Tensor& k, double scale, const c10::optional<at::Tensor>& cu_seqlens,
                                   const c10::optional<at::Tensor>& end_rows,
                                   const c10::optional<at::Tensor>& topk_indices, int64_t window,
                                   const c10::optional<at::Tensor>& row_mask, double coeff,
                                   const c10::optional<int64_t>& stream) {
  const CallStream cs(stream);
  check_rows("indexer_kl", {{"q_idx", &qI}, {"q", &q}, {"k", &k}});
  const hmla::DocLayout layout = layout_of(qI.size(0), kI.size(1), cu_seqlens, end_rows);
  const at::Tensor rw = row_weights(layout, row_mask, qI.device());
  hmla::IndexerKlInputs in;
  in.sc = scores(qI, kI, w, layout);
  in.q = strided(q), in.k = strided(k);
  in.scale = float(scale);
  in.row_weight = dense(rw);
  in.coeff = float(coeff);
  HMLA_CHECK(topk_indices || window == 0, hmla::ShapeError,
             "hmla.torch: indexer_kl: window = ", window, " without topk_indices (the dense KL has no window)");
  if (topk_indices) {
    in.topk = dense(*topk_indices);
    HMLA_CHECK(topk_indices->dim() == 3 && window >= 0 && window < topk_indices->size(2), hmla::ShapeError,
               "hmla.torch: topk_indices must be [b, s, K + window] with K >= 1, got window = ", window);
    in.K = topk_indices->size(2) - window;
  }
  // The KL sum stays on the tensors' device (an f64 accumulator the kernel adds into): the loss is
  // a torch op on it, ordered on the call's stream, so the call never waits for the device. The
  // same bits as float(double(coeff) * kl_sum), the host's product.
  in.kl_acc = hmla::Tensor::zeros({1}, hmla::DType::f64, hmla_device(qI));
  const hmla::IndexerKlResult r = topk_indices ? hmla::indexer_kl_sparse(in) : hmla::indexer_kl_dense(in);
  const at::Tensor loss = (cs.out(in.kl_acc, qI) * double(in.coeff)).to(at::kFloat).reshape({});
  return {loss, cs.out(r.dqI, qI), cs.out(r.dkI, qI), cs.out(r.dw, qI)};
}

// ---- sparse latent MQA ---------------------------------------------------------------------------

hmla::AttnSparseInputs sparse_inputs(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& idx, double scale,
                                     int64_t dv, const c10::optional<at::Tensor>& sink) {
  check_rows("sparse_mla", {{"q", &q}, {"kv", &kv}, {"indices", &idx}});
  hmla::AttnSparseInputs in;
  in.q = strided(q), in.kv = dense(kv), in.idx = dense(idx);
  in.Dv = dv;
  in.K = idx.dim() == 3 ? idx.size(2) : 0;  // every listed key is a candidate
  in.sink = opt_dense(sink);
  in.scale = float(scale);
  return in;
}

std::vector<at::Tensor> sparse_mla_fwd(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& idx, double scale,
                                       int64_t dv, const c10::optional<at::Tensor>& sink,
                                       const c10::optional<int64_t>& stream) {
  const CallStream cs(stream);
  const hmla::AttnSparseSaved sv = hmla::attn_sparse_fwd(sparse_inputs(q, kv, idx, scale, dv, sink));
  return {cs.out(sv.out, q), cs.out(sv.lse, q), cs.out(sv.lse_c, q)};
}

std::vector<at::Tensor> sparse_mla_bwd(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& idx, double scale,
                                       int64_t dv, const c10::optional<at::Tensor>& sink, const at::Tensor& out,
                                       const at::Tensor& lse, const at::Tensor& lse_c, const at::Tensor& dout,
                                       const c10::optional<int64_t>& stream) {
  const CallStream cs(stream);
  const hmla::AttnSparseGrads g = hmla::attn_sparse_bwd(sparse_inputs(q, kv, idx, scale, dv, sink),
                                                        {dense(out), dense(lse), dense(lse_c)}, dense(dout));
  return {cs.out(g.dq, q), cs.out(g.dkv, q), cs.out(g.dsink, q)};
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
  m.def("index_table", &index_table);
  m.def("memory_stats", &memory_stats, py::arg("reset_peak") = false);
}
