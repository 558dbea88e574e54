// One micro-batch on the model's device (model_internal.h's DeviceBatch): the token ids checked
// against the vocabulary, the LM targets and weights (t -> t + 1 inside a document, not onto pad)
// and the indexer's loss-row weights, this rank's rows under CP, uploaded as one buffer.
#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "hmla/dist/cp.h"
#include "hmla/model/losses.h"
#include "hmla/model/model.h"
#include "model_internal.h"

namespace hmla {

void lm_targets_ahead(const int32_t* ids, const DocLayout& layout, int64_t pad, int64_t ahead,
                      std::vector<int32_t>& target, std::vector<float>& keep) {
  const int64_t b = layout.b, s = layout.s;
  const int32_t* de = layout.doc_end.data<int32_t>();
  target.assign(b * s, 0);
  keep.assign(b * s, 0.f);
  for (int64_t r = 0; r < b; ++r)
    for (int64_t t = 0; t + ahead < s; ++t) {
      const int64_t n = r * s + t;
      if (layout.is_padding(r, t) || t + ahead >= de[n] || ids[n + ahead] == pad) continue;
      target[n] = ids[n + ahead];
      keep[n] = 1.f;
    }
}

namespace {

// Targets and weights of the LM loss: row n predicts ids[n + 1] when both are in one document.
// Over the whole batch; shard_targets keeps a context-parallel rank's rows.
void lm_targets(const Batch& batch, int64_t pad, std::vector<int32_t>& target, std::vector<float>& keep) {
  lm_targets_ahead(batch.input_ids.data<int32_t>(), batch.layout, pad, 1, target, keep);
}

// The LM loss's targets and weights (already divided by the step's target count) of this rank's
// rows.
void shard_targets(const Batch& batch, int64_t pad, int64_t global_targets, const Comm& cp, std::vector<int32_t>& target,
                   std::vector<float>& keep) {
  lm_targets(batch, pad, target, keep);
  int64_t count = 0;
  for (float k : keep) count += k > 0.f;
  const int64_t denom = global_targets > 0 ? global_targets : std::max<int64_t>(count, 1);
  for (float& k : keep) k /= float(denom);
  const int64_t b = batch.input_ids.size(0);
  const RowShard sh = row_shard(cp, batch.input_ids.size(1));
  std::vector<int32_t> t;
  std::vector<float> k;
  for (int64_t r = 0; r < b; ++r)
    for (int64_t i = sh.row0; i < sh.row0 + sh.rows; ++i) {
      t.push_back(target[r * sh.s + i]);
      k.push_back(keep[r * sh.s + i]);
    }
  target.swap(t);
  keep.swap(k);
}

// Token ids are checked where they enter the model, on the host, so that a device's embedding
// never reads a row outside the table and no kernel's ids are copied back to be checked.
void check_token_ids(const Batch& batch, int64_t V) {
  const int32_t* id = batch.input_ids.data<int32_t>();
  for (int64_t n = 0; n < batch.input_ids.numel(); ++n)
    HMLA_CHECK(id[n] >= 0 && id[n] < V, ShapeError, "token id ", id[n], " at position ", n,
               " is outside the vocabulary [0, ", V, ")");
}

}  // namespace

int64_t BatchWords::add(const void* src, int64_t n) {
  const int64_t at = int64_t(host_.size());
  host_.resize(size_t(at + n));
  if (n > 0) std::memcpy(host_.data() + at, src, size_t(n) * 4);
  return at;
}

void BatchWords::upload(Device dev) { all_ = Tensor::from_vector<int32_t>({int64_t(host_.size())}, host_).on(dev); }

Tensor BatchWords::view(int64_t at, const Shape& shape, DType dt) const {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  const Tensor t = all_.slice(0, at, at + n);
  return (dt == DType::i32 ? t : t.bitcast(dt)).view(shape);
}

DeviceBatch device_batch(const Model& m, const Batch& batch, const Comm& cp, int64_t lm_targets, int64_t valid_rows) {
  const ModelConfig& c = m.cfg;
  check_token_ids(batch, c.vocab_size);
  const int64_t b = batch.input_ids.size(0), S = batch.input_ids.size(1);
  const RowShard sh = row_shard(cp, S);
  const int64_t N = b * sh.rows, BS = b * S;
  std::vector<int32_t> target;
  std::vector<float> keep;
  shard_targets(batch, c.pad_token_id, lm_targets, cp, target, keep);
  const Tensor ids = take_rows(batch.input_ids.view({b, S, 1}), sh);
  const Tensor rw = take_rows(loss_row_weights(batch.layout, &batch.input_ids, c.pad_token_id, valid_rows).view({b, S, 1}), sh);
  // Words: ids, target, keep, row_weight (N each), doc_start, doc_end (b * S each), then a V4 model's.
  BatchWords w;
  const int64_t at_ids = w.add(ids.data<int32_t>(), N), at_target = w.add(target.data(), N),
                at_keep = w.add(keep.data(), N), at_rw = w.add(rw.data<float>(), N),
                at_start = w.add(batch.layout.doc_start.data<int32_t>(), BS),
                at_end = w.add(batch.layout.doc_end.data<int32_t>(), BS);
  std::optional<V4BatchWords> v4;
  if (c.is_v4()) v4.emplace(m, batch, sh, w);
  w.upload(m.device());
  DeviceBatch d;
  d.ids = w.view(at_ids, {b, sh.rows});
  d.target = w.view(at_target, {N});
  d.keep = w.view(at_keep, {N}, DType::f32);
  d.row_weight = w.view(at_rw, {b, sh.rows}, DType::f32);
  d.layout = batch.layout;
  d.layout.device_start = w.view(at_start, {b, S});
  d.layout.device_end = w.view(at_end, {b, S});
  if (v4) v4->views(w, d);
  return d;
}

int64_t count_lm_targets(const Batch& batch, int64_t pad, int64_t ahead) {
  std::vector<int32_t> target;
  std::vector<float> keep;
  lm_targets_ahead(batch.input_ids.data<int32_t>(), batch.layout, pad, ahead, target, keep);
  int64_t n = 0;
  for (float k : keep) n += k > 0.f;
  return n;
}

}  // namespace hmla
