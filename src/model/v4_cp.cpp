// Context parallelism for the DeepSeek-V4 attention (v4_internal.h; DESIGN.md section 8;
// docs/deepseek_v4.md "Context parallelism"). Rank r of R owns rows [row0, row0 + rows) of every
// batch row. Window keys are all-gathered like the MLA layer's latent (v4_attention.cpp); this file
// is the compressors' part. An entry's window is cut from its document's start in global positions
// (the row split never moves a window), so a window may straddle two ranks' rows: the rank that
// holds the window's last row owns the entry and pools it from a frame of its rows plus the `halo`
// rows before them (HCA: m - 1; CSA: 2m - 1, the previous window's a-series too). Owned entries are
// normed and roped where they are pooled and all-gathered (width W: the narrowest form of a key);
// their gradients are reduce-scattered back to the owners, and a frame's halo rows' gradients go back
// to the ranks that hold those rows. Every element of kv and gate feeds one slot of one entry (CSA's
// two series read different channels), so the returned halo gradients add to exact zeros: the
// compressors' input gradients equal one rank's bit for bit. Host loops (V4 runs on the CPU).
#include <algorithm>
#include <cstring>

#include "hmla/dist/cp.h"
#include "v4_internal.h"

namespace hmla {

namespace {

// Rows [r0, r0 + n) of batch row bb of a contiguous [b, s, W] tensor (f32 or i32: 4-byte words).
uint32_t* rows_at(const Tensor& t, int64_t bb, int64_t r0) {
  HMLA_CHECK(t.device() == Device::cpu && t.is_contiguous() && t.dim() == 3, ShapeError,
             "V4 context parallelism: host [b, s, W] tensors only, got ", shape_str(t.shape()));
  return static_cast<uint32_t*>(t.raw_data()) + (bb * t.size(1) + r0) * t.size(2);
}

void copy_rows(const Tensor& dst, int64_t bb, int64_t d0, const Tensor& src, int64_t sb, int64_t s0, int64_t n) {
  std::memcpy(rows_at(dst, bb, d0), rows_at(src, sb, s0), size_t(n * src.size(2)) * 4);
}

}  // namespace

EntryOwners entry_owners(const CompressedEntries& e, int64_t m, const RowShard& sh, int R) {
  const int64_t b = e.first.size(0), n = e.n;
  EntryOwners o;
  o.b = b;
  o.lo.assign(size_t(R * b), 0), o.n.assign(size_t(R * b), 0);
  const int32_t* first = e.first.data<int32_t>();
  for (int64_t bb = 0; bb < b; ++bb) {
    int64_t i = 0;
    for (int r = 0; r < R; ++r) {  // a row's entries rise by position: each rank's are a range
      const int64_t end = (r + 1) * sh.rows;
      o.lo[size_t(r * b + bb)] = i;
      while (i < n && first[bb * n + i] >= 0 && first[bb * n + i] + m - 1 < end) ++i;
      o.n[size_t(r * b + bb)] = i - o.lo[size_t(r * b + bb)];
      o.P = std::max(o.P, o.n[size_t(r * b + bb)]);
    }
  }
  return o;
}

Tensor cp_frame(Comm& cp, const RowShard& sh, const Tensor& local, int64_t halo) {
  const int64_t b = local.size(0), rows = sh.rows, C = local.size(2), T = std::min(rows, halo);
  const int64_t f0 = std::max<int64_t>(0, sh.row0 - halo), nf = sh.row0 + rows - f0;
  if (T == 0) return local;
  // Every rank's last T rows; the frame's rows before row0 are among them (T = rows: a rank's
  // whole shard, when the halo reaches past its neighbour).
  const Tensor tails = cp_all_gather_rows(cp, local.slice(1, rows - T, rows).clone());
  Tensor frame = Tensor::empty({b, nf, C}, local.dtype());
  for (int64_t bb = 0; bb < b; ++bb) {
    for (int64_t u = f0; u < sh.row0; ++u) {
      const int64_t q = u / rows, j = u - ((q + 1) * rows - T);
      copy_rows(frame, bb, u - f0, tails, bb, q * T + j, 1);
    }
    copy_rows(frame, bb, sh.row0 - f0, local, bb, 0, rows);
  }
  return frame;
}

Tensor cp_frame_grad(Comm& cp, const RowShard& sh, const Tensor& dframe, int64_t halo) {
  const int64_t b = dframe.size(0), nf = dframe.size(1), C = dframe.size(2), rows = sh.rows, R = cp.size();
  const int64_t f0 = sh.row0 + rows - nf;
  Tensor out = dframe.slice(1, nf - rows, nf).clone();
  if (halo == 0) return out;
  Tensor mine = Tensor::zeros({b, halo, C}, DType::f32);  // rows [row0 - halo, row0); before 0: zeros
  for (int64_t bb = 0; bb < b; ++bb)
    if (sh.row0 > f0) copy_rows(mine, bb, f0 - (sh.row0 - halo), dframe, bb, 0, sh.row0 - f0);
  const Tensor all = cp_all_gather_rows(cp, mine);
  for (int64_t r = 0; r < R; ++r) {  // later ranks' halos that reach into this rank's rows, in rank order
    const int64_t h0 = r * rows - halo, lo = std::max(h0, sh.row0), hi = std::min(r * rows, sh.row0 + rows);
    for (int64_t bb = 0; bb < b && lo < hi; ++bb) {
      float* dst = reinterpret_cast<float*>(rows_at(out, bb, lo - sh.row0));
      const float* src = reinterpret_cast<const float*>(rows_at(all, bb, r * halo + lo - h0));
      for (int64_t i = 0; i < (hi - lo) * C; ++i) dst[i] += src[i];
    }
  }
  return out;
}

DocLayout frame_layout(const DocLayout& layout, int64_t f0, int64_t nf) {
  DocLayout f;
  f.b = layout.b, f.s = nf;
  f.doc_start = Tensor::empty({layout.b, nf}, DType::i32);
  f.doc_end = Tensor::empty({layout.b, nf}, DType::i32);
  const int32_t *ds = layout.doc_start.data<int32_t>(), *de = layout.doc_end.data<int32_t>();
  for (int64_t bb = 0; bb < layout.b; ++bb)
    for (int64_t t = 0; t < nf; ++t) {
      const int64_t g = bb * layout.s + f0 + t;  // padding stays padding: ds > t keeps ds - f0 > t - f0
      f.doc_start.data<int32_t>()[bb * nf + t] = int32_t(std::max<int64_t>(ds[g], f0) - f0);
      f.doc_end.data<int32_t>()[bb * nf + t] = int32_t(std::min<int64_t>(de[g], f0 + nf) - f0);
    }
  return f;
}

CompressedEntries own_entries(const CompressedEntries& e, const EntryOwners& o, int rank, int64_t shift) {
  const int64_t b = o.b, P = o.P;
  std::vector<int32_t> first(size_t(b * P), -1);
  for (int64_t bb = 0; bb < b; ++bb) {
    const size_t k = size_t(rank * b + bb);
    for (int64_t i = 0; i < o.n[k]; ++i) first[size_t(bb * P + i)] = int32_t(e.first.data<int32_t>()[bb * e.n + o.lo[k] + i] - shift);
  }
  CompressedEntries own;
  own.first = Tensor::from_vector<int32_t>({b, P}, first), own.n = P;
  return own;
}

Tensor cp_gather_entries(Comm& cp, const EntryOwners& o, const Tensor& own, int64_t n) {
  const Tensor all = cp_all_gather_rows(cp, own);  // [b, R P, W]
  Tensor ent = Tensor::zeros({o.b, n, own.size(2)}, DType::f32);  // padding entries: 0, as one rank's
  for (int64_t r = 0; r < cp.size(); ++r)
    for (int64_t bb = 0; bb < o.b; ++bb) {
      const size_t k = size_t(r * o.b + bb);
      if (o.n[k] > 0) copy_rows(ent, bb, o.lo[k], all, bb, r * o.P, o.n[k]);
    }
  return ent;
}

Tensor cp_scatter_entry_grads(Comm& cp, const EntryOwners& o, const Tensor& dent) {
  Tensor wire = Tensor::zeros({o.b, cp.size() * o.P, dent.size(2)}, DType::f32);
  for (int64_t r = 0; r < cp.size(); ++r)
    for (int64_t bb = 0; bb < o.b; ++bb) {
      const size_t k = size_t(r * o.b + bb);
      if (o.n[k] > 0) copy_rows(wire, bb, r * o.P, dent, bb, o.lo[k], o.n[k]);
    }
  return cp_reduce_scatter_rows(cp, wire);
}

}  // namespace hmla
