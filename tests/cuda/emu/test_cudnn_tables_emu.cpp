// The cuDNN path's own logic, which runs without cuDNN: the ragged (THD) tables made on the device
// from a layout (attn_cudnn_thd.cu) against the same tables written down from the layout's
// cu_seqlens, the lse conversions, the padding rows, and how the backend choice resolves and
// fails (this build has no cuDNN graphs: the emulator cannot run them; the device check does).
#include <gtest/gtest.h>

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
};

// Rows of documents, a zero-length document, tail padding, and more rows than one thread's slice.
const Case kCases[] = {
    {"one_doc_per_row", 8, {{0, 8}, {0, 8}}},
    {"docs_and_padding", 13, {{0, 5, 5, 9, 11}, {0, 13}, {0, 1, 2, 3}}},
    {"many_rows", 40, std::vector<std::vector<int64_t>>(300, std::vector<int64_t>{0, 7, 30})},
};

AttnDenseParams params_of(const Case& c, const DocLayout& l, const Tensor& ds, const Tensor& de) {
  AttnDenseParams p;
  p.dtype = DType::bf16, p.b = int64_t(c.cu.size()), p.s = p.sq = c.s, p.H = 4, p.Hkv = 2, p.Dqk = 24, p.Dv = 16;
  // q, k, v strided as views of wider tensors would be (the row stride more than H D).
  p.q_rstride = 5 * 24 * 2, p.q_hstride = 24, p.q_bstride = c.s * p.q_rstride + 7;
  p.k_rstride = 3 * 24, p.k_hstride = 24, p.k_bstride = c.s * p.k_rstride;
  p.v_rstride = 2 * 16 + 8, p.v_hstride = 16, p.v_bstride = c.s * p.v_rstride;
  p.doc_start = ds.data<int32_t>(), p.doc_end = de.data<int32_t>();
  p.ndocs = l.num_docs();
  return p;
}

TEST(CudnnTables, TheRaggedTablesPlaceEachDocumentAtItsFirstRowInEveryLayout) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const DocLayout l = layout_from_cu_seqlens(c.s, c.cu);
    const Tensor ds = l.doc_start.to(Device::cuda), de = l.doc_end.to(Device::cuda);
    const AttnDenseParams p = params_of(c, l, ds, de);
    const int64_t B = cuda::cudnn_batch_bound(p.ndocs);
    ASSERT_GE(B, p.ndocs);
    Tensor t = Tensor::empty({cuda::kThdLayouts * (B + 1) + B}, DType::i32, Device::cuda);
    cuda::cudnn_thd_tables(p, B, t.data<int32_t>());
    const std::vector<int32_t> got = t.to(Device::cpu).to_vector<int32_t>();

    // The documents in batch order straight from cu_seqlens (zero-length ones hold no token).
    const int64_t bs[cuda::kThdLayouts] = {p.q_bstride, p.k_bstride, p.v_bstride, c.s * 4 * 16, c.s * 4 * 24,
                                           c.s * 2 * 24, c.s * 2 * 16, c.s * 4};
    const int64_t rs[cuda::kThdLayouts] = {p.q_rstride, p.k_rstride, p.v_rstride, 4 * 16, 4 * 24, 2 * 24, 2 * 16, 4};
    std::vector<int64_t> row, start, len;
    for (size_t r = 0; r < c.cu.size(); ++r)
      for (size_t d = 0; d + 1 < c.cu[r].size(); ++d)
        if (c.cu[r][d + 1] > c.cu[r][d]) row.push_back(int64_t(r)), start.push_back(c.cu[r][d]), len.push_back(c.cu[r][d + 1] - c.cu[r][d]);
    ASSERT_EQ(int64_t(row.size()), p.ndocs);
    for (int L = 0; L < cuda::kThdLayouts; ++L) {
      const int64_t end = row.back() * bs[L] + (start.back() + len.back()) * rs[L];
      for (int64_t d = 0; d <= B; ++d) {
        const int64_t want = d < p.ndocs ? row[d] * bs[L] + start[d] * rs[L] : end;
        EXPECT_EQ(got[L * (B + 1) + d], want) << "layout " << L << " entry " << d;
      }
    }
    for (int64_t d = 0; d < B; ++d)
      EXPECT_EQ(got[cuda::kThdLayouts * (B + 1) + d], d < p.ndocs ? len[d] : 0) << "length " << d;
  }
}

TEST(CudnnTables, TheLseConversionsAreInversesWithInfinityOnPaddingRows) {
  const Case& c = kCases[1];
  const DocLayout l = layout_from_cu_seqlens(c.s, c.cu);
  const Tensor ds = l.doc_start.to(Device::cuda), de = l.doc_end.to(Device::cuda);
  AttnDenseParams p = params_of(c, l, ds, de);
  std::vector<float> stats(p.b * p.s * p.H);
  for (size_t i = 0; i < stats.size(); ++i) stats[i] = 0.25f * float(i) - 3.f;
  const Tensor st = Tensor::from_vector<float>({p.b * p.s, p.H}, stats).to(Device::cuda);
  Tensor lse = Tensor::empty({p.b, p.H, p.s}, DType::f32, Device::cuda);
  p.lse = lse.data<float>();
  cuda::cudnn_stats_to_lse(p, st.data<float>());
  const std::vector<float> got = lse.to(Device::cpu).to_vector<float>();
  for (int64_t r = 0; r < p.b; ++r)
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t t = 0; t < p.s; ++t) {
        const float want = l.is_padding(r, t) ? std::numeric_limits<float>::infinity() : stats[(r * p.s + t) * p.H + h];
        EXPECT_EQ(got[(r * p.H + h) * p.s + t], want) << r << " " << h << " " << t;
      }
  Tensor back = Tensor::zeros({p.b * p.s, p.H}, DType::f32, Device::cuda);
  cuda::cudnn_lse_to_stats(p, back.data<float>());
  const std::vector<float> round = back.to(Device::cpu).to_vector<float>();
  for (int64_t i = 0; i < p.b * p.s; ++i) {
    if (l.is_padding(i / p.s, i % p.s)) continue;  // no document: cuDNN reads no stats there
    for (int64_t h = 0; h < p.H; ++h) EXPECT_EQ(round[i * p.H + h], stats[i * p.H + h]);
  }
}

TEST(CudnnTables, OnlyPaddingRowsAreZeroed) {
  const Case& c = kCases[1];
  const DocLayout l = layout_from_cu_seqlens(c.s, c.cu);
  const Tensor ds = l.doc_start.to(Device::cuda), de = l.doc_end.to(Device::cuda);
  const AttnDenseParams p = params_of(c, l, ds, de);
  const int64_t w = 3 * 8;
  Tensor x = cuda_check::put({p.b, p.s, w}, std::vector<float>(p.b * p.s * w, 1.f));
  cuda::cudnn_zero_padding_rows(p, x.raw_data(), w);
  const std::vector<float> got = cuda_check::host(x);
  for (int64_t i = 0; i < p.b * p.s; ++i)
    for (int64_t e = 0; e < w; ++e) EXPECT_EQ(got[i * w + e], l.is_padding(i / p.s, i % p.s) ? 0.f : 1.f) << i;
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
  // The process's choice applies to calls that pass auto.
  set_attn_backend(AttnBackend::cudnn);
  EXPECT_THROW(run(Device::cuda, AttnBackend::auto_), Error);
  EXPECT_NO_THROW(run(Device::cuda, AttnBackend::hmla));
  set_attn_backend(AttnBackend::auto_);
}

}  // namespace
}  // namespace hmla
