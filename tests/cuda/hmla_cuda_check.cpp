// hmla_cuda_check: the CUDA backend's device check without any library beyond the CUDA toolkit
// (scripts/device-check builds and runs it on a GPU machine).
//   hmla_cuda_check --check        every case against the CPU references (the dense attention
//                                  through hmla's kernels and, in a build with it, through cuDNN
//                                  where cuDNN takes the case); exit 1 on a failure
//   hmla_cuda_check --bench [--reps N]   JSON lines: attention through each backend (192/128:
//                                        s = 8192, H = 16, 1 and 8 documents; s = 32768, H = 16;
//                                        s = 8192, H = 128), indexer scores + top-k (s = 8192,
//                                        32768), sparse MLA forward (s = 8192, H = 128, K = 2048)
// Without a device it says so and exits 0 with --allow-no-device (the rehearsal), 2 otherwise.
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>

#include "attn_cuda_check.h"
#include "indexer_cuda_check.h"
#include "sparse_cuda_check.h"

int main(int argc, char** argv) {
  using namespace hmla::cuda_check;
  using hmla::AttnBackend, hmla::attn_cudnn_built, hmla::Device;
  bool check = false, run_bench = false, allow_no_device = false;
  int reps = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--check") check = true;
    else if (a == "--bench") run_bench = true;
    else if (a == "--allow-no-device") allow_no_device = true;
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else {
      std::cerr << "usage: hmla_cuda_check [--check] [--bench [--reps N]] [--allow-no-device]\n";
      return 2;
    }
  }
  if (!device_available()) {
    std::cout << "{\"check\":\"cuda-attention\",\"device\":null}" << std::endl;
    return allow_no_device ? 0 : 2;
  }
  try {
    bool ok = true;
    if (check) {
      for (const Case& c : cases())  // the hand-written kernels, then cuDNN where it takes the case
        for (AttnBackend be : {AttnBackend::hmla, AttnBackend::cudnn}) {
          if (be == AttnBackend::cudnn && !attn_cudnn_built()) continue;
          CaseResult r = check_case(c, 42, Device::cuda, 1.f, be);
          std::cout << r.json() << std::endl;
          ok &= r.ok;
        }
      for (const hmla::op_cases::IndexerSelectCase& c : indexer_select_cases()) {
        const IndexerCheck r = check_select(c.s, c.K, c.W, c.q_row0, 1);
        std::cout << r.json() << std::endl;
        ok &= r.ok;
      }
      for (const hmla::op_cases::IndexerTopkCase& c : indexer_topk_cases()) {
        const IndexerCheck r = check_topk(c.s, c.HI, c.DI, c.K, c.W, 5);
        std::cout << r.json() << std::endl;
        ok &= r.ok;
      }
      for (const SparseCase& c : sparse_cases()) {
        const SparseResult r = check_sparse(c, 3);
        std::cout << r.json() << std::endl;
        ok &= r.ok;
      }
      const bool dup = sparse_rejects_duplicates();
      std::cout << "{\"check\":\"cuda-sparse-table\",\"ok\":" << (dup ? "true" : "false") << "}" << std::endl;
      ok &= dup;
    }
    if (run_bench) {
      // hmla's kernels and cuDNN side by side on each shape (tests/cuda/torch_attention_bench.py
      // times torch's SDPA and flex attention on the same ones).
      const BenchShape shapes[] = {{8192, 16, 192, 128, 1}, {8192, 16, 192, 128, 8}, {32768, 16, 192, 128, 1},
                                   {8192, 128, 192, 128, 1}};
      for (BenchShape sh : shapes)
        for (AttnBackend be : {AttnBackend::hmla, AttnBackend::cudnn}) {
          if (be == AttnBackend::cudnn && !attn_cudnn_built()) continue;
          sh.backend = be;
          std::cout << bench(sh, reps).json() << std::endl;
        }
      for (int64_t s : {8192, 32768}) std::cout << bench_indexer(s, 64, 128, 2048, reps).json() << std::endl;
      std::cout << bench_sparse(8192, 128, 2048, reps).json() << std::endl;
    }
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "hmla_cuda_check: error: " << e.what() << std::endl;
    return 1;
  }
}
