// `hmla attention`: one dense attention forward and backward on tensors from a safetensors
// file, written to another; the tool behind the PyTorch twin test, and a way for users to check
// hmla's core against their own implementation.
#include "commands.h"

#include <cmath>
#include <iostream>

#include "hmla/io/safetensors.h"
#include "hmla/ops/attention.h"
#include "validators.h"

namespace hmla::app {

namespace {

const Tensor& need(const io::TensorMap& m, const std::string& name, const std::string& file) {
  auto it = m.find(name);
  HMLA_CHECK(it != m.end(), IoError, file, ": tensor '", name, "' is missing");
  return it->second;
}

DocLayout read_layout(const io::TensorMap& m, int64_t b, int64_t s, const std::string& file) {
  if (auto it = m.find("cu_seqlens"); it != m.end()) {
    HMLA_CHECK(it->second.dim() == 1, IoError, file, ": cu_seqlens must be 1-D (b = 1)");
    HMLA_CHECK(b == 1, IoError, file, ": cu_seqlens describes one row, but b = ", b,
               "; use end_rows [b, s] for several rows");
    return layout_from_cu_seqlens(s, {index_values(it->second, "cu_seqlens")});
  }
  if (auto it = m.find("end_rows"); it != m.end()) {
    HMLA_CHECK(it->second.shape() == Shape({b, s}), IoError, file, ": end_rows must be [b, s] = ",
               shape_str({b, s}), ", got ", shape_str(it->second.shape()));
    return layout_from_end_rows(b, s, index_values(it->second, "end_rows"));
  }
  return layout_causal(b, s);
}

}  // namespace

std::vector<int64_t> index_values(const Tensor& t, const std::string& what) {
  if (t.dtype() == DType::i64) return t.to_vector<int64_t>();
  HMLA_CHECK(t.dtype() == DType::i32, IoError, what, " must be i32 or i64, got ", dtype_name(t.dtype()));
  std::vector<int64_t> v;
  for (int32_t x : t.to_vector<int32_t>()) v.push_back(x);
  return v;
}

void add_attention_command(CLI::App& app) {
  struct Opts {
    std::string inputs, out;
    double scale = 0;      // 0: not given, 1/sqrt(Dqk)
    int64_t v_from_k = 0;  // 0: not given, v is read from the file
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "attention",
      "Dense per-document causal attention forward + backward on tensors from a file.\n"
      "Inputs: q [b,s,H,Dqk], k [b,s,Hkv,Dqk], v [b,s,Hkv,Dv] (or --v-from-k), grad_output\n"
      "[b,s,H,Dv], optional sink [H], and the layout: cu_seqlens (b = 1) or end_rows [b,s]\n"
      "(one causal document per row when neither is given). All f32.\n"
      "Output: output, lse [b,H,s], grad.q, grad.k, grad.v (without --v-from-k), grad.sink.");
  cmd->add_option("--inputs", o->inputs, "safetensors file with the inputs")->required()->check(CLI::ExistingFile);
  cmd->add_option("--out", o->out, "safetensors file to write")->required()->check(NonEmpty());
  cmd->add_option("--scale", o->scale, "softmax scale (default 1/sqrt(Dqk))")->check(Real(0, true));
  cmd->add_option("--v-from-k", o->v_from_k,
                  "the value is the first N channels of k (latent MQA), 1 <= N <= Dqk; grad.k then "
                  "includes the value's gradient")
      ->check(Int(1));
  cmd->callback([o] {
    io::TensorMap m = io::load_safetensors(o->inputs);
    AttnDenseInputs in;
    in.q = need(m, "q", o->inputs);
    in.k = need(m, "k", o->inputs);
    HMLA_CHECK(in.q.dim() == 4 && in.k.dim() == 4, ShapeError, "q and k must be 4-D");
    if (o->v_from_k > 0) {
      HMLA_CHECK(o->v_from_k <= in.k.size(3), ShapeError, "--v-from-k ", o->v_from_k,
                 " exceeds the key width ", in.k.size(3));
      in.v = in.k.slice(3, 0, o->v_from_k);
    } else {
      in.v = need(m, "v", o->inputs);
    }
    if (m.count("sink")) in.sink = m.at("sink");
    DocLayout layout = read_layout(m, in.q.size(0), in.q.size(1), o->inputs);
    in.layout = &layout;
    in.scale = o->scale > 0 ? static_cast<float>(o->scale)
                            : 1.f / std::sqrt(static_cast<float>(in.q.size(3)));
    const Tensor& dout = need(m, "grad_output", o->inputs);
    AttnDenseSaved saved = attn_dense_fwd(in);
    AttnDenseGrads g = attn_dense_bwd(in, saved, dout);
    io::TensorMap out{{"output", saved.out}, {"lse", saved.lse}, {"grad.q", g.dq}};
    if (o->v_from_k > 0) {  // fold the value's gradient into the key's
      float* dk = g.dk.data<float>();
      const float* dv = g.dv.data<float>();
      const int64_t rows = g.dk.numel() / g.dk.size(3), wk = g.dk.size(3), wv = g.dv.size(3);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < wv; ++c) dk[r * wk + c] += dv[r * wv + c];
    } else {
      out["grad.v"] = g.dv;
    }
    out["grad.k"] = g.dk;
    if (in.sink.defined()) out["grad.sink"] = g.dsink;
    io::save_safetensors(o->out, out);
  });
}

}  // namespace hmla::app
