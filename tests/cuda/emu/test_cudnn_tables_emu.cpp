// The cuDNN path's own logic, which runs without cuDNN: the ragged (THD) tables made on the device
// from a layout (attn_cudnn_thd.cu), whole rows and context-parallel slices, against the same
// tables written down from the layout's cu_seqlens, the lse conversions, the rows no sequence
// covers, and how the backend choice resolves and fails (this build has no cuDNN graphs: the emulator cannot run them; the device check does).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attn_cudnn.h"
#include "check_util.h"
#include "hmla/core/error.h"
#include "hmla/core/layout.h"
#include "hmla/ops/attention.h"

namespace hmla {
namespace {

struct Case {
  const char* name;
  int64_t s;
  std::vector<std::vector<int64_t>> cu;  // per row: cu_seqlens (layout_from_cu_seqlens)
  int64_t r0 = 0, sq = -1;               // the query rows [r0, r0 + sq) (context parallelism); -1: all
};

// Rows of documents, a zero-length document, tail padding, more rows than one thread's slice, and
// query-row slices that begin inside a document, end inside one, and hold padding.
const Case kCases[] = {
    {"one_doc_per_row", 8, {{0, 8}, {0, 8}}},
    {"docs_and_padding", 13, {{0, 5, 5, 9, 11}, {0, 13}, {0, 1, 2, 3}}},
    {"many_rows", 40, std::vector<std::vector<int64_t>>(300, std::vector<int64_t>{0, 7, 30})},
    {"slice_mid_docs", 13, {{0, 5, 5, 9, 11}, {0, 13}, {0, 1, 2, 3}}, 3, 7},
    {"slice_tail", 13, {{0, 5, 9, 11}, {0, 13}}, 8, 5},
};

struct Params {
  AttnDenseParams p;
  Tensor ds, de;  // the layout's tables on the device, which p points into
};

Params params_of(const Case& c, const DocLayout& l) {
  Params r{{}, l.doc_start.to(Device::cuda), l.doc_end.to(Device::cuda)};
  AttnDenseParams& p = r.p;
  p.dtype = DType::bf16, p.b = int64_t(c.cu.size()), p.s = c.s, p.H = 4, p.Hkv = 2, p.Dqk = 24, p.Dv = 16;
  p.q_row0 = c.r0, p.sq = c.sq < 0 ? c.s : c.sq;
  // q, k, v strided as views of wider tensors would be (the row stride more than H D).
  p.q_rstride = 5 * 24 * 2, p.q_hstride = 24, p.q_bstride = p.sq * p.q_rstride + 7;
  p.k_rstride = 3 * 24, p.k_hstride = 24, p.k_bstride = c.s * p.k_rstride;
  p.v_rstride = 2 * 16 + 8, p.v_hstride = 16, p.v_bstride = c.s * p.v_rstride;
  p.doc_start = r.ds.data<int32_t>(), p.doc_end = r.de.data<int32_t>();
  p.ndocs = l.num_docs();
  return r;
}

TEST(CudnnTables, TheRaggedTablesPlaceEachDocumentAtItsFirstRowInEveryLayout) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const DocLayout l = layout_from_cu_seqlens(c.s, c.cu);
    const Params pr = params_of(c, l);
    const AttnDenseParams& p = pr.p;
    const int64_t B = cuda::cudnn_pow2_bound(p.ndocs), r1 = p.q_row0 + p.sq;
    ASSERT_GE(B, p.ndocs);
    Tensor t = Tensor::empty({cuda::kThdLayouts * (B + 1) + 2 * B}, DType::i32, Device::cuda);
    cuda::cudnn_thd_tables(p, B, t.data<int32_t>());
    const std::vector<int32_t> got = t.to(Device::cpu).to_vector<int32_t>();

    // The documents holding a query row of the slice, in batch order, straight from cu_seqlens
    // (zero-length ones hold no token): their rows in the slice, and their keys up to its end.
    const int64_t bs[cuda::kThdLayouts] = {p.q_bstride, p.k_bstride, p.v_bstride, p.sq * 4 * 16, p.sq * 4 * 24,
                                           c.s * 2 * 24, c.s * 2 * 16, p.sq * 4};
    const int64_t rs[cuda::kThdLayouts] = {p.q_rstride, p.k_rstride, p.v_rstride, 4 * 16, 4 * 24, 2 * 24, 2 * 16, 4};
    const auto query_side = [](int L) {
      return L == cuda::kThdQ || L == cuda::kThdO || L == cuda::kThdDq || L == cuda::kThdStats;
    };
    std::vector<int64_t> row, start, qstart, lq, lkv;
    for (size_t r = 0; r < c.cu.size(); ++r)
      for (size_t d = 0; d + 1 < c.cu[r].size(); ++d) {
        const int64_t a = c.cu[r][d], e = c.cu[r][d + 1], qa = std::max(a, p.q_row0), qe = std::min(e, r1);
        if (qe <= qa) continue;  // empty, or no query row in the slice
        row.push_back(int64_t(r)), start.push_back(a), qstart.push_back(qa - p.q_row0);
        lq.push_back(qe - qa), lkv.push_back(qe - a);
      }
    ASSERT_LE(int64_t(row.size()), B);
    ASSERT_FALSE(row.empty());
    const int64_t n = int64_t(row.size());
    for (int L = 0; L < cuda::kThdLayouts; ++L) {
      const bool qs = query_side(L);
      const int64_t end = row.back() * bs[L] + ((qs ? qstart.back() + lq.back() : start.back() + lkv.back())) * rs[L];
      for (int64_t d = 0; d <= B; ++d) {
        const int64_t want = d < n ? row[d] * bs[L] + (qs ? qstart[d] : start[d]) * rs[L] : end;
        EXPECT_EQ(got[L * (B + 1) + d], want) << "layout " << L << " entry " << d;
      }
    }
    const int32_t* len = got.data() + cuda::kThdLayouts * (B + 1);
    for (int64_t d = 0; d < B; ++d) {
      EXPECT_EQ(len[d], d < n ? lq[d] : 0) << "query length " << d;
      EXPECT_EQ(len[B + d], d < n ? lkv[d] : 0) << "key length " << d;
    }
  }
}

TEST(CudnnTables, TheLseConversionsAreInversesWithInfinityOnPaddingRows) {
  for (const Case* cp : {&kCases[1], &kCases[3]}) {
    const Case& c = *cp;
    SCOPED_TRACE(c.name);
    const DocLayout l = layout_from_cu_seqlens(c.s, c.cu);
    Params pr = params_of(c, l);
    AttnDenseParams& p = pr.p;
    std::vector<float> stats(p.b * p.sq * p.H);
    for (size_t i = 0; i < stats.size(); ++i) stats[i] = 0.25f * float(i) - 3.f;
    const Tensor st = Tensor::from_vector<float>({p.b * p.sq, p.H}, stats).to(Device::cuda);
    Tensor lse = Tensor::empty({p.b, p.H, p.sq}, DType::f32, Device::cuda);
    p.lse = lse.data<float>();
    cuda::cudnn_stats_to_lse(p, st.data<float>());
    const std::vector<float> got = lse.to(Device::cpu).to_vector<float>();
    for (int64_t r = 0; r < p.b; ++r)
      for (int64_t h = 0; h < p.H; ++h)
        for (int64_t t = 0; t < p.sq; ++t) {
          const float want = l.is_padding(r, p.q_row0 + t) ? std::numeric_limits<float>::infinity()
                                                           : stats[(r * p.sq + t) * p.H + h];
          EXPECT_EQ(got[(r * p.H + h) * p.sq + t], want) << r << " " << h << " " << t;
        }
    Tensor back = Tensor::zeros({p.b * p.sq, p.H}, DType::f32, Device::cuda);
    cuda::cudnn_lse_to_stats(p, back.data<float>());
    const std::vector<float> round = back.to(Device::cpu).to_vector<float>();
    for (int64_t i = 0; i < p.b * p.sq; ++i) {
      if (l.is_padding(i / p.sq, p.q_row0 + i % p.sq)) continue;  // no document: cuDNN reads no stats there
      for (int64_t h = 0; h < p.H; ++h) EXPECT_EQ(round[i * p.H + h], stats[i * p.H + h]);
    }
  }
}

// Query side: padding rows. Key side: keys no query of the slice sees (padding, past the slice,
// or in a document that ended before it), straight from cu_seqlens.
TEST(CudnnTables, OnlyRowsNoSequenceCoversAreZeroed) {
  for (const Case* cp : {&kCases[1], &kCases[3], &kCases[4]}) {
    const Case& c = *cp;
    SCOPED_TRACE(c.name);
    const DocLayout l = layout_from_cu_seqlens(c.s, c.cu);
    const Params pr = params_of(c, l);
    const AttnDenseParams& p = pr.p;
    const int64_t w = 3 * 8, r1 = p.q_row0 + p.sq;
    for (bool query_side : {true, false}) {
      const int64_t rows = query_side ? p.sq : p.s;
      Tensor x = cuda_check::put({p.b, rows, w}, std::vector<float>(p.b * rows * w, 1.f));
      cuda::cudnn_zero_uncovered_rows(p, x.raw_data(), query_side, w);
      const std::vector<float> got = cuda_check::host(x);
      for (int64_t r = 0; r < p.b; ++r)
        for (int64_t i = 0; i < rows; ++i) {
          bool seen = false;
          const int64_t t = query_side ? p.q_row0 + i : i;
          for (size_t d = 0; d + 1 < c.cu[r].size(); ++d) {
            const int64_t a = c.cu[r][d], e = c.cu[r][d + 1];
            if (t >= a && t < e) seen = query_side || (t < r1 && e > p.q_row0);
          }
          for (int64_t k = 0; k < w; ++k)
            EXPECT_EQ(got[(r * rows + i) * w + k], seen ? 1.f : 0.f) << (query_side ? "query " : "key ") << r << " " << i;
        }
    }
  }
}

TEST(AttentionBackend, NamesParseAndUnknownOnesAreOneLineErrors) {
  for (AttnBackend b : {AttnBackend::auto_, AttnBackend::cudnn, AttnBackend::hmla})
    EXPECT_EQ(parse_attn_backend(attn_backend_name(b), "test"), b);
  try {
    parse_attn_backend("flash", "prog.yaml: attention_backend");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "prog.yaml: attention_backend: attention backend 'flash' (known: auto, cudnn, hmla)");
  }
}

// Without cuDNN graphs (this build), auto and hmla run the hand-written kernels and cudnn is an
// error that says why; on the CPU, cudnn is an error whatever the build.
TEST(AttentionBackend, CudnnIsRefusedWhereItCannotRunAndAutoFallsBack) {
  const DocLayout l = layout_causal(1, 16);
  const auto run = [&](Device dev, AttnBackend b) {
    AttnDenseInputs in;
    in.q = cuda_check::put({1, 16, 2, 16}, std::vector<float>(16 * 2 * 16, 1.f), dev);
    in.k = in.q, in.v = in.q, in.layout = &l, in.scale = 0.25f, in.backend = b;
    return cuda_check::host(attn_dense_fwd(in).out);
  };
  EXPECT_EQ(run(Device::cuda, AttnBackend::auto_), run(Device::cuda, AttnBackend::hmla));
  EXPECT_EQ(run(Device::cuda, AttnBackend::auto_)[0], 1.f);  // a mean of ones
  try {
    run(Device::cuda, AttnBackend::cudnn);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention backend cudnn: this build has no cuDNN path"), std::string::npos) << e.what();
  }
  EXPECT_THROW(run(Device::cpu, AttnBackend::cudnn), ShapeError);
  EXPECT_NO_THROW(run(Device::cpu, AttnBackend::hmla));
}

}  // namespace
}  // namespace hmla
