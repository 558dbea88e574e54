// The compressor pooling's entry points (hmla/ops/compress.h): the entry list from a layout, the
// tensors validated once, then the backend of their device.
#include "hmla/ops/compress.h"

#include <algorithm>
#include <vector>

#include "entry_point.h"
#include "hmla/core/error.h"

namespace hmla {

namespace {

using detail::desc;

void need(const Tensor& t, const Shape& shape, const char* op, const char* name) {
  HMLA_CHECK(t.defined() && t.dtype() == DType::f32 && t.is_contiguous() && t.shape() == shape, ShapeError, op, ": ",
             name, " must be a contiguous f32 ", shape_str(shape), " tensor, got ", desc(t));
}

// The params of both passes, every tensor checked against kv's [b, s, C].
CompressParams params(const Tensor& kv, const Tensor& gate, const Tensor& ape, const CompressedEntries& e,
                      const DocLayout& layout, bool overlap, const char* op) {
  HMLA_CHECK(kv.defined() && kv.dim() == 3, ShapeError, op, ": kv must be [b, s, C], got ", desc(kv));
  const int64_t b = kv.size(0), s = kv.size(1), C = kv.size(2), W = overlap ? C / 2 : C;
  HMLA_CHECK(W >= 1 && (!overlap || C % 2 == 0), ShapeError, op, ": kv has ", C, " channels",
             overlap ? "; the two series need an even count" : "");
  HMLA_CHECK(layout.b == b && layout.s == s, ShapeError, op, ": the layout is [", layout.b, ", ", layout.s,
             "], kv ", desc(kv));
  need(kv, {b, s, C}, op, "kv");
  need(gate, {b, s, C}, op, "gate");
  HMLA_CHECK(ape.defined() && ape.dim() == 2 && ape.size(1) == C && ape.size(0) >= 1, ShapeError, op,
             ": ape must be [m, ", C, "], got ", desc(ape));
  need(ape, ape.shape(), op, "ape");
  const int64_t m = ape.size(0);
  HMLA_CHECK(e.first.defined() && e.first.dtype() == DType::i32 && e.first.is_contiguous() &&
                 e.first.shape() == Shape({b, e.n}),
             ShapeError, op, ": the entries must be [b = ", b, ", n = ", e.n, "] i32, got ", desc(e.first));
  CompressParams p;
  p.b = b, p.s = s, p.W = W, p.m = m, p.n = e.n, p.overlap = overlap;
  p.kv = kv.data<float>(), p.gate = gate.data<float>(), p.ape = ape.data<float>();
  return p;
}

}  // namespace

CompressedEntries compressed_entries(const DocLayout& layout, int64_t m) {
  HMLA_CHECK(m >= 1, ShapeError, "compressed_entries: the rate m = ", m, " must be at least 1");
  const int64_t b = layout.b, s = layout.s;
  const int32_t* st = layout.doc_start.data<int32_t>();
  const int32_t* en = layout.doc_end.data<int32_t>();
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(b));
  for (int64_t r = 0; r < b; ++r)
    for (int64_t t = 0; t < s;) {
      const int64_t a = st[r * s + t], z = en[r * s + t];
      if (a > t) {  // padding: no document here
        ++t;
        continue;
      }
      for (int64_t f = a; f + m <= z; f += m) rows[size_t(r)].push_back(int32_t(f));
      t = std::max<int64_t>(z, t + 1);
    }
  CompressedEntries e;
  for (const auto& row : rows) e.n = std::max<int64_t>(e.n, int64_t(row.size()));
  std::vector<int32_t> first(size_t(b * e.n), -1);
  for (int64_t r = 0; r < b; ++r) std::copy(rows[size_t(r)].begin(), rows[size_t(r)].end(), first.begin() + r * e.n);
  e.first = Tensor::from_vector<int32_t>({b, e.n}, first);
  return e;
}

void compress_fwd(const Tensor& kv, const Tensor& gate, const Tensor& ape, const CompressedEntries& e,
                  const DocLayout& layout, bool overlap, const Tensor& out) {
  const char* op = "compress";
  CompressParams p = params(kv, gate, ape, e, layout, overlap, op);
  need(out, {p.b, p.n, p.W}, op, "out");
  p.out = out.data<float>();
  const Tensor first = e.first_on(kv.device()), starts = layout.doc_start_on(kv.device());  // alive for the call
  p.first = first.data<int32_t>(), p.doc_start = starts.data<int32_t>();
  detail::run(op, Op::compress_fwd, p, {&kv, &gate, &ape, &out});
}

void compress_bwd(const Tensor& dout, const Tensor& kv, const Tensor& gate, const Tensor& ape, const CompressedEntries& e,
                  const DocLayout& layout, bool overlap, const Tensor& dkv, const Tensor& dgate, const Tensor& dape) {
  const char* op = "compress backward";
  CompressParams p = params(kv, gate, ape, e, layout, overlap, op);
  need(dout, {p.b, p.n, p.W}, op, "dout");
  need(dkv, kv.shape(), op, "dkv");
  need(dgate, kv.shape(), op, "dgate");
  need(dape, ape.shape(), op, "dape");
  p.dout = dout.data<float>(), p.dkv = dkv.data<float>(), p.dgate = dgate.data<float>(), p.dape = dape.data<float>();
  const Tensor first = e.first_on(kv.device()), starts = layout.doc_start_on(kv.device());
  p.first = first.data<int32_t>(), p.doc_start = starts.data<int32_t>();
  detail::run(op, Op::compress_bwd, p, {&dout, &kv, &gate, &ape, &dkv, &dgate, &dape});
}

}  // namespace hmla
