// `hmla attention`: one dense attention forward and backward on tensors from a safetensors
// file, written to another; the tool behind the PyTorch twin test, and a way for users to check
// hmla's core against their own implementation.
#include "commands.h"

#include <cmath>
#include <iostream>

#include "hmla/io/paths.h"
#include "hmla/core/index_values.h"
#include "hmla/io/safetensors.h"
#include "hmla/ops/attention.h"
#include "inputs.h"
#include "validators.h"

namespace hmla::app {

namespace {

// What the command reads, by name. The layout is cu_seqlens (one row) or end_rows, never both;
// with --v-from-k the value is k's first N channels, so a v tensor would be silently ignored.
std::vector<InputSpec> attention_inputs(int64_t v_from_k, bool has_cu, bool has_end_rows) {
  using P = InputSpec::Presence;
  const std::vector<DType> index{DType::i32, DType::i64};
  const char* both = "give cu_seqlens or end_rows, not both";
  return {{"q", {"b", "s", "H", "Dqk"}, {DType::f32}},
          {"k", {"b", "s", "Hkv", "Dqk"}, {DType::f32}},
          {"v", {"b", "s", "Hkv", "Dv"}, {DType::f32}, v_from_k > 0 ? P::forbidden : P::required,
           v_from_k > 0 ? "--v-from-k takes the value from k" : "or pass --v-from-k N"},
          {"grad_output", {"b", "s", "H", "Dv"}, {DType::f32}},
          {"sink", {"H"}, {DType::f32}, P::optional},
          {"cu_seqlens", {"documents + 1"}, index, has_end_rows ? P::forbidden : P::optional, both},
          {"end_rows", {"b", "s"}, index, has_cu ? P::forbidden : P::optional, both}};
}

DocLayout read_layout(const io::TensorMap& m, int64_t b, int64_t s, const std::string& file) {
  if (auto it = m.find("cu_seqlens"); it != m.end()) {
    HMLA_CHECK(b == 1, IoError, file, ": cu_seqlens describes one row, but b = ", b,
               "; use end_rows [b, s] for several rows");
    return layout_from_cu_seqlens(s, {index_values(it->second, "cu_seqlens")});
  }
  if (auto it = m.find("end_rows"); it != m.end()) return layout_from_end_rows(b, s, index_values(it->second, "end_rows"));
  return layout_causal(b, s);
}

}  // namespace

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
    io::check_output_file(o->out, "--out");  // before the work, not only when writing
    io::TensorMap m = io::load_safetensors(o->inputs);
    const DimSizes d =
        check_inputs(m, attention_inputs(o->v_from_k, m.count("cu_seqlens"), m.count("end_rows")), o->inputs);
    AttnDenseInputs in;
    in.q = m.at("q");
    in.k = m.at("k");
    if (o->v_from_k > 0) {
      HMLA_CHECK(o->v_from_k <= d.at("Dqk"), ConfigError, "--v-from-k ", o->v_from_k, ": it must be in [1, ",
                 d.at("Dqk"), "], the key width Dqk of k in ", o->inputs);
      HMLA_CHECK(d.at("Dv") == o->v_from_k, IoError, o->inputs, ": grad_output is ", d.at("Dv"),
                 " wide (Dv), but --v-from-k ", o->v_from_k, " makes the value and the output ", o->v_from_k, " wide");
      in.v = in.k.slice(3, 0, o->v_from_k);
    } else {
      in.v = m.at("v");
    }
    if (m.count("sink")) in.sink = m.at("sink");
    DocLayout layout = read_layout(m, d.at("b"), d.at("s"), o->inputs);
    in.layout = &layout;
    in.scale = o->scale > 0 ? static_cast<float>(o->scale) : 1.f / std::sqrt(static_cast<float>(d.at("Dqk")));
    HMLA_CHECK(std::isfinite(in.scale) && in.scale > 0.f, ConfigError, "--scale ", o->scale,
               ": it must be a positive number that f32 represents (it under- or overflows)");
    const Tensor& dout = m.at("grad_output");
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
