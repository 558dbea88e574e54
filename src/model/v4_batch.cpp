// A DeepSeek-V4 micro-batch's host-derived tables (model_internal.h's DeviceBatch), in the batch's
// one upload: what the V4 layers would otherwise make on the host per layer and upload per call
// (each compress rate's entries and their metadata, the hash layers' experts, the MTP depths' ids
// and targets). The host has everything they derive from (the ids, the layout, tid2eid), so a step
// on a device uploads only its batch and reads back only its statistics (DESIGN.md section 4).
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "hmla/model/config.h"
#include "model_internal.h"

namespace hmla {

namespace {

// u_k: the token `ahead` rows on inside t's document, else pad (t's document has none: a row whose
// targets are not counted reads no other document either).
std::vector<int32_t> ids_ahead(const int32_t* ids, const DocLayout& layout, int64_t pad, int64_t ahead) {
  const int64_t b = layout.b, s = layout.s;
  const int32_t* de = layout.doc_end.data<int32_t>();
  std::vector<int32_t> u(size_t(b * s), int32_t(pad));
  for (int64_t r = 0; r < b; ++r)
    for (int64_t t = 0; t + ahead < s; ++t)
      if (!layout.is_padding(r, t) && t + ahead < de[r * s + t]) u[size_t(r * s + t)] = ids[r * s + t + ahead];
  return u;
}

// The rows of shard sh of a [b, S] table.
template <class T>
std::vector<T> shard_rows(const std::vector<T>& v, int64_t b, const RowShard& sh) {
  std::vector<T> out;
  for (int64_t r = 0; r < b; ++r)
    out.insert(out.end(), v.begin() + r * sh.s + sh.row0, v.begin() + r * sh.s + sh.row0 + sh.rows);
  return out;
}

}  // namespace

V4BatchEntries v4_entry_tables(const DocLayout& layout, int64_t rate) {
  V4BatchEntries t;
  t.entries = compressed_entries(layout, rate);
  const int64_t b = layout.b, n = t.entries.n;
  const int32_t* first = t.entries.first.data<int32_t>();
  const int32_t* st = layout.doc_start.data<int32_t>();
  std::vector<int32_t> last(size_t(b * n)), doc(size_t(b * n)), rope(size_t(b * n));
  for (int64_t r = 0; r < b; ++r)
    for (int64_t i = 0; i < n; ++i) {
      const int32_t f = first[r * n + i];
      last[size_t(r * n + i)] = f < 0 ? -1 : int32_t(f + rate - 1);
      doc[size_t(r * n + i)] = f < 0 ? -1 : st[r * layout.s + f];
      rope[size_t(r * n + i)] = std::max<int32_t>(f, 0);
    }
  t.first = t.entries.first;
  t.last = Tensor::from_vector<int32_t>({b, n}, last);
  t.doc = Tensor::from_vector<int32_t>({b, n}, doc);
  t.rope_row = Tensor::from_vector<int32_t>({b * n}, rope);
  return t;
}

V4BatchWords::V4BatchWords(const Model& m, const Batch& batch, const RowShard& sh, BatchWords& w) {
  const ModelConfig& c = m.cfg;
  const DocLayout& layout = batch.layout;
  const int64_t b = layout.b, S = layout.s, N = b * sh.rows;
  const int32_t* ids = batch.input_ids.data<int32_t>();
  std::set<int64_t> rates;
  for (int64_t L = 0; L < int64_t(c.v4.layer_types.size() + c.v4.mtp_types.size()); ++L)
    if (c.v4.compress_rate(L) > 0) rates.insert(c.v4.compress_rate(L));
  for (int64_t rate : rates) {
    const V4BatchEntries t = v4_entry_tables(layout, rate);
    const int64_t n = t.entries.n;
    entries_.push_back({rate, t.entries});
    first_.push_back({rate, w.add(t.first.data<int32_t>(), b * n), {b, n}});
    last_.push_back({rate, w.add(t.last.data<int32_t>(), b * n), {b, n}});
    doc_.push_back({rate, w.add(t.doc.data<int32_t>(), b * n), {b, n}});
    rope_.push_back({rate, w.add(t.rope_row.data<int32_t>(), b * n), {b * n}});
  }
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
    if (!c.v4.hash_layer(L)) continue;
    const Tensor& table = m.ints.at(layer_prefix(L) + "ffn.gate.tid2eid");  // on the host
    const int64_t k = table.size(1);
    std::vector<int32_t> ex;
    for (int64_t r = 0; r < b; ++r)
      for (int64_t t = sh.row0; t < sh.row0 + sh.rows; ++t) {
        const int32_t* row = table.data<int32_t>() + int64_t(ids[r * S + t]) * k;
        ex.insert(ex.end(), row, row + k);
      }
    hash_.push_back({L, w.add(ex.data(), N * k), {N, k}});
  }
  const int64_t depths = c.v4.mtp_params ? c.form.num_nextn_predict_layers : 0;
  for (int64_t k = 0; k < depths; ++k) {
    const std::vector<int32_t> u = shard_rows(ids_ahead(ids, layout, c.pad_token_id, k + 1), b, sh);
    std::vector<int32_t> target;
    std::vector<float> keep;
    lm_targets_ahead(ids, layout, c.pad_token_id, k + 2, target, keep);
    mtp_count_.push_back(std::count_if(keep.begin(), keep.end(), [](float v) { return v > 0.f; }));
    mtp_ids_.push_back({k, w.add(u.data(), N), {b, sh.rows}});
    mtp_target_.push_back({k, w.add(shard_rows(target, b, sh).data(), N), {N}});
    mtp_keep_.push_back({k, w.add(shard_rows(keep, b, sh).data(), N), {N}, DType::f32});
  }
}

void V4BatchWords::views(const BatchWords& w, DeviceBatch& d) const {
  auto view = [&w](const Piece& p) { return w.view(p.at, p.shape, p.dt); };
  for (size_t i = 0; i < entries_.size(); ++i) {
    V4BatchEntries& e = d.v4_entries[entries_[i].first];
    e.entries = entries_[i].second;
    e.first = view(first_[i]), e.last = view(last_[i]), e.doc = view(doc_[i]), e.rope_row = view(rope_[i]);
    e.entries.device_first = e.first;
  }
  for (const Piece& p : hash_) d.hash_experts[p.key] = view(p);
  for (size_t k = 0; k < mtp_ids_.size(); ++k) {
    d.mtp_ids.push_back(view(mtp_ids_[k]));
    d.mtp_target.push_back(view(mtp_target_[k]));
    d.mtp_keep.push_back(view(mtp_keep_[k]));
  }
  d.mtp_count = mtp_count_;
}

}  // namespace hmla
