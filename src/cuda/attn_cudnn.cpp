// Dense attention through cuDNN's fused SDPA on sm_90 (docs/cuda.md, "Dense attention through
// cuDNN"), with cudnn-frontend's graph API. Each document of the packed rows (that holds a query
// row) is one cuDNN sequence: the batch is the documents (padded to a power of two with empty
// sequences), the sequence bound the longest document (also rounded up), and ragged offsets place
// each sequence at its document's first row in q, k, v, out and the gradients, so one causal mask
// per sequence is hmla's per-document causal mask (bottom-right aligned for a context-parallel
// slice of the query rows, whose documents may begin before the slice). Graphs are built once per
// shape and kept per thread and device; the tables they read are made on the device
// (attn_cudnn_thd.cu).
#include <cudnn.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include <cudnn_frontend.h>

#include "attn_cudnn.h"
#include "hmla/core/tensor.h"
#include "runtime.h"

namespace hmla::cuda {

namespace {

namespace fe = cudnn_frontend;
using TensorAttr = std::shared_ptr<fe::graph::Tensor_attributes>;

// The tensors' uids in the variant packs; kOff0 + L: layout L's ragged offsets.
constexpr int64_t kQ = 1, kK = 2, kV = 3, kO = 4, kStats = 5, kDO = 6, kDQ = 7, kDK = 8, kDV = 9, kSeqLenQ = 10,
                  kSeqLenKv = 11, kOff0 = 12;

constexpr int64_t kMinCudnnVersion = 90600;  // ragged (THD) stats, the sm_90 deterministic backward

void fe_check(fe::error_t e, const char* what) {
  HMLA_CHECK(e.is_good(), Error, "cuDNN attention (", what, "): ", e.get_message());
}
void cudnn_check(cudnnStatus_t st, const char* what) {
  HMLA_CHECK(st == CUDNN_STATUS_SUCCESS, Error, "cuDNN attention (", what, "): ", cudnnGetErrorString(st));
}

// What a graph depends on: the direction, whether the queries are a slice of the key rows, the
// padded batch B and sequence bound S, the heads and widths, the input strides (the outputs' are
// contiguous) and the scale.
struct GraphKey {
  bool bwd, slice;
  int64_t B, S, H, Hkv, Dqk, Dv, qh, qr, kh, kr, vh, vr;
  uint32_t scale_bits;
  auto operator<=>(const GraphKey&) const = default;
};

// A built graph, or (g null) why cuDNN refused the shape when it was built.
struct Graph {
  std::shared_ptr<fe::graph::Graph> g;
  int64_t workspace = 0;
  std::string refused;
};

// A [B, heads, S, width] tensor with the given head and row strides, placed per sequence by a
// ragged offset table.
TensorAttr seq_tensor(fe::graph::Graph& g, int64_t uid, const char* name, const GraphKey& k, int64_t heads,
                      int64_t width, int64_t hstride, int64_t rstride, const TensorAttr& offsets) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({k.B, heads, k.S, width})
                      .set_stride({k.S * rstride, hstride, rstride, 1})
                      .set_ragged_offset(offsets));
}

void set_seq_output(const TensorAttr& t, int64_t uid, const GraphKey& k, int64_t heads, int64_t width,
                    const TensorAttr& offsets) {
  t->set_output(true)
      .set_uid(uid)
      .set_dim({k.B, heads, k.S, width})
      .set_stride({k.S * heads * width, width, heads * width, 1})
      .set_ragged_offset(offsets);
}

TensorAttr int_table(fe::graph::Graph& g, int64_t uid, const char* name, int64_t n) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({n, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT32));
}

TensorAttr offsets(fe::graph::Graph& g, ThdLayout L, const GraphKey& k) {
  static const char* names[kThdLayouts] = {"off_q", "off_k", "off_v", "off_o", "off_dq", "off_dk", "off_dv", "off_stats"};
  return int_table(g, kOff0 + L, names[L], k.B + 1);
}

// The mask and sequence lengths both directions share: per-sequence causal (key <= query within a
// document), sequences of the given lengths. A document's queries are its last len_q of its len_kv
// key rows (all of them unless the queries are a slice of the rows, when a document may begin
// before the slice): the diagonal is bottom-right aligned then, top-left (the same) otherwise.
template <class Attrs>
Attrs& masked(Attrs& a, const TensorAttr& len_q, const TensorAttr& len_kv, float scale, bool slice) {
  return a.set_attn_scale(scale)
      .set_diagonal_alignment(slice ? fe::DiagonalAlignment_t::BOTTOM_RIGHT : fe::DiagonalAlignment_t::TOP_LEFT)
      .set_diagonal_band_right_bound(0)
      .set_padding_mask(true)
      .set_seq_len_q(len_q)
      .set_seq_len_kv(len_kv);
}

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

TensorAttr stats_tensor(fe::graph::Graph& g, const GraphKey& k, const TensorAttr& off) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name("stats")
                      .set_uid(kStats)
                      .set_dim({k.B, k.H, k.S, 1})
                      .set_stride({k.S * k.H, 1, k.H, 1})
                      .set_data_type(fe::DataType_t::FLOAT)
                      .set_ragged_offset(off));
}

std::shared_ptr<fe::graph::Graph> fwd_graph(const GraphKey& k) {
  auto g = new_graph();
  const TensorAttr len_q = int_table(*g, kSeqLenQ, "seq_len_q", k.B), len_kv = int_table(*g, kSeqLenKv, "seq_len_kv", k.B);
  const TensorAttr q = seq_tensor(*g, kQ, "q", k, k.H, k.Dqk, k.qh, k.qr, offsets(*g, kThdQ, k));
  const TensorAttr kk = seq_tensor(*g, kK, "k", k, k.Hkv, k.Dqk, k.kh, k.kr, offsets(*g, kThdK, k));
  const TensorAttr v = seq_tensor(*g, kV, "v", k, k.Hkv, k.Dv, k.vh, k.vr, offsets(*g, kThdV, k));
  float scale;
  std::memcpy(&scale, &k.scale_bits, sizeof scale);
  auto attrs = fe::graph::SDPA_attributes().set_name("hmla_sdpa").set_generate_stats(true);
  auto [o, stats] = g->sdpa(q, kk, v, masked(attrs, len_q, len_kv, scale, k.slice));
  set_seq_output(o, kO, k, k.H, k.Dv, offsets(*g, kThdO, k));
  stats->set_output(true)
      .set_uid(kStats)
      .set_dim({k.B, k.H, k.S, 1})
      .set_stride({k.S * k.H, 1, k.H, 1})
      .set_data_type(fe::DataType_t::FLOAT)
      .set_ragged_offset(offsets(*g, kThdStats, k));
  return g;
}

std::shared_ptr<fe::graph::Graph> bwd_graph(const GraphKey& k) {
  auto g = new_graph();
  const TensorAttr len_q = int_table(*g, kSeqLenQ, "seq_len_q", k.B), len_kv = int_table(*g, kSeqLenKv, "seq_len_kv", k.B);
  const TensorAttr off_o = offsets(*g, kThdO, k);  // O and dO share one layout
  const TensorAttr q = seq_tensor(*g, kQ, "q", k, k.H, k.Dqk, k.qh, k.qr, offsets(*g, kThdQ, k));
  const TensorAttr kk = seq_tensor(*g, kK, "k", k, k.Hkv, k.Dqk, k.kh, k.kr, offsets(*g, kThdK, k));
  const TensorAttr v = seq_tensor(*g, kV, "v", k, k.Hkv, k.Dv, k.vh, k.vr, offsets(*g, kThdV, k));
  const TensorAttr o = seq_tensor(*g, kO, "o", k, k.H, k.Dv, k.Dv, k.H * k.Dv, off_o);
  const TensorAttr dout = seq_tensor(*g, kDO, "dout", k, k.H, k.Dv, k.Dv, k.H * k.Dv, off_o);
  const TensorAttr stats = stats_tensor(*g, k, offsets(*g, kThdStats, k));
  float scale;
  std::memcpy(&scale, &k.scale_bits, sizeof scale);
  auto attrs = fe::graph::SDPA_backward_attributes().set_name("hmla_sdpa_bwd").set_deterministic_algorithm(true);
  auto [dq, dk, dv] = g->sdpa_backward(q, kk, v, o, dout, stats, masked(attrs, len_q, len_kv, scale, k.slice));
  set_seq_output(dq, kDQ, k, k.H, k.Dqk, offsets(*g, kThdDq, k));
  set_seq_output(dk, kDK, k, k.Hkv, k.Dqk, offsets(*g, kThdDk, k));
  set_seq_output(dv, kDV, k, k.Hkv, k.Dv, offsets(*g, kThdDv, k));
  return g;
}

// The thread's cuDNN handle and built graphs on the current device.
struct DeviceState {
  cudnnHandle_t handle = nullptr;
  std::map<GraphKey, Graph> graphs;
  ~DeviceState() {
    graphs.clear();
    if (handle) cudnnDestroy(handle);
  }
};

DeviceState& device_state() {
  thread_local std::map<int, std::unique_ptr<DeviceState>> states;
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  std::unique_ptr<DeviceState>& st = states[dev];
  if (!st) {
    st = std::make_unique<DeviceState>();
    cudnn_check(cudnnCreate(&st->handle), "cudnnCreate");
  }
  return *st;
}

GraphKey key_of(const AttnDenseParams& p, bool bwd) {
  GraphKey k{bwd, p.sq != p.s, cudnn_pow2_bound(p.ndocs), std::min(cudnn_pow2_bound(p.max_doc), p.s), p.H, p.Hkv,
             p.Dqk, p.Dv,
             p.q_hstride, p.q_rstride, p.k_hstride, p.k_rstride, p.v_hstride, p.v_rstride, 0};
  std::memcpy(&k.scale_bits, &p.scale, sizeof p.scale);
  return k;
}

// Builds k's graph once; a refusal (no engine takes the shape) is kept too, so that auto falls
// back to hmla's kernels without asking again.
const Graph& graph_for(DeviceState& st, const GraphKey& k) {
  auto it = st.graphs.find(k);
  if (it != st.graphs.end()) return it->second;
  Graph gr;
  gr.g = k.bwd ? bwd_graph(k) : fwd_graph(k);
  const auto step = [&gr](fe::error_t e, const char* what) {
    if (gr.refused.empty() && !e.is_good()) gr.refused = std::string(what) + ": " + e.get_message();
    return gr.refused.empty();
  };
  step(gr.g->validate(), "validate") && step(gr.g->build_operation_graph(st.handle), "operation graph") &&
      step(gr.g->create_execution_plans({fe::HeurMode_t::A}), "execution plans") &&
      step(gr.g->check_support(st.handle), "support") && step(gr.g->build_plans(st.handle), "build plans") &&
      step(gr.g->get_workspace_size(gr.workspace), "workspace size");
  if (!gr.refused.empty()) gr.g.reset();
  return st.graphs.emplace(k, std::move(gr)).first->second;
}

// The graph for p, or null when cuDNN refused it and p allows the fallback (an error if not).
const Graph* usable_graph(DeviceState& st, const AttnDenseParams& p, bool bwd) {
  const Graph& gr = graph_for(st, key_of(p, bwd));
  HMLA_CHECK(gr.g || p.backend != AttnBackend::cudnn, Error, "attention backend cudnn: cuDNN refused the ",
             bwd ? "backward" : "forward", " graph (", gr.refused, ")");
  return gr.g ? &gr : nullptr;
}

// The device's own verdict, once per device: sm_90 and a new enough cuDNN.
const char* device_declines() {
  thread_local std::map<int, const char*> verdicts;
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  auto it = verdicts.find(dev);
  if (it != verdicts.end()) return it->second;
  int major = 0;
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
  const char* why = nullptr;
  if (major != 9) why = "cuDNN's path is built for sm_90 (Hopper); this GPU is another generation";
  else if (int64_t(cudnnGetVersion()) < kMinCudnnVersion) why = "the cuDNN library loaded is older than 9.6";
  return verdicts[dev] = why;
}

// Every element offset the ragged tables hold fits in int32.
bool offsets_fit(const AttnDenseParams& p) {
  const int64_t lim = int64_t(1) << 31;
  return p.b * p.q_bstride < lim && p.b * p.k_bstride < lim && p.b * p.v_bstride < lim &&
         p.b * p.s * p.H * std::max(p.Dqk, p.Dv) < lim && p.b * p.s * p.Hkv * std::max(p.Dqk, p.Dv) < lim;
}

// What both directions run on: the tables (attn_cudnn.h), cuDNN's stats [b sq, H], and the
// variant pack entries of the tables, the stats, q, k and v.
struct Tables {
  Tensor t, stats;
  std::unordered_map<int64_t, void*> pack;
};

Tables make_tables(const AttnDenseParams& p, int64_t B) {
  Tables tb{Tensor::empty({kThdLayouts * (B + 1) + 2 * B}, DType::i32, Device::cuda),
            Tensor::empty({p.b * p.sq, p.H}, DType::f32, Device::cuda), {}};
  int32_t* t = tb.t.data<int32_t>();
  cudnn_thd_tables(p, B, t);
  for (int L = 0; L < kThdLayouts; ++L) tb.pack[kOff0 + L] = t + L * (B + 1);
  tb.pack[kSeqLenQ] = t + kThdLayouts * (B + 1);
  tb.pack[kSeqLenKv] = t + kThdLayouts * (B + 1) + B;
  tb.pack[kQ] = const_cast<void*>(p.q);
  tb.pack[kK] = const_cast<void*>(p.k);
  tb.pack[kV] = const_cast<void*>(p.v);
  tb.pack[kStats] = tb.stats.raw_data();
  return tb;
}

void execute(DeviceState& st, const Graph& gr, std::unordered_map<int64_t, void*>& pack) {
  Tensor ws;
  if (gr.workspace > 0) ws = Tensor::empty({(gr.workspace + 3) / 4}, DType::f32, Device::cuda);
  cudnn_check(cudnnSetStream(st.handle, current_stream().get()), "cudnnSetStream");
  fe_check(gr.g->execute(st.handle, pack, ws.defined() ? ws.raw_data() : nullptr), "execute");
  ++counters().launches;
  // ws and the tables return to the allocator's cache when the caller's Tensors go: the stream
  // orders their reuse after this graph's kernels.
}

}  // namespace

const char* cudnn_declines(const AttnDenseParams& p) {
  if (p.dtype != DType::bf16) return "it takes bf16 inputs";
  if (p.Dqk > 256 || p.Dv > 256 || p.Dqk % 8 || p.Dv % 8)
    return "it takes head widths that are multiples of 8 up to 256 (not the 576 / 512 latent form)";
  if (p.sink) return "it is not used with an attention sink (cuDNN's ragged backward with a sink needs 9.26)";
  if (p.ndocs <= 0) return "no document bounds were given";
  if (!offsets_fit(p)) return "its ragged offsets are 32-bit and these tensors are larger";
  return device_declines();
}

bool cudnn_attn_fwd(const AttnDenseParams& p) {
  DeviceState& st = device_state();
  const Graph* gr = usable_graph(st, p, false);
  if (!gr) return false;
  Tables tb = make_tables(p, cudnn_pow2_bound(p.ndocs));
  tb.pack[kO] = p.out;
  execute(st, *gr, tb.pack);
  cudnn_stats_to_lse(p, tb.stats.data<float>());
  cudnn_zero_uncovered_rows(p, p.out, true, p.H * p.Dv);
  return true;
}

bool cudnn_attn_bwd(const AttnDenseParams& p) {
  DeviceState& st = device_state();
  const Graph* gr = usable_graph(st, p, true);
  if (!gr) return false;
  Tables tb = make_tables(p, cudnn_pow2_bound(p.ndocs));
  cudnn_lse_to_stats(p, tb.stats.data<float>());
  tb.pack[kO] = const_cast<void*>(p.out);
  tb.pack[kDO] = const_cast<void*>(p.dout);
  tb.pack[kDQ] = p.dq;
  tb.pack[kDK] = p.dk;
  tb.pack[kDV] = p.dv;
  execute(st, *gr, tb.pack);
  cudnn_zero_uncovered_rows(p, p.dq, true, p.H * p.Dqk);
  cudnn_zero_uncovered_rows(p, p.dk, false, p.Hkv * p.Dqk);
  cudnn_zero_uncovered_rows(p, p.dv, false, p.Hkv * p.Dv);
  return true;
}

}  // namespace hmla::cuda
