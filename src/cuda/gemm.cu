// Products on the GPU (GemmParams, row-major, batched with strides): f32 tensors through
// cuBLASLt with CUBLAS_COMPUTE_32F_FAST_16BF, i.e. the inputs rounded to bf16 and the products
// accumulated in f32 on the tensor cores ("bf16 in, f32 accumulate" on the model's f32
// activations and master weights, without a separate cast pass). cuBLASLt is column-major:
// row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so B goes first.
//
// In the SIMT emulator the library is not there: a host stand-in computes the same contract
// (each input rounded to bf16, products summed in f32 over k in order), so the emulated training
// step checks hmla's descriptors (shapes, transposes, leading dimensions, batch strides).
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda_kernels.h"
#include "hmla/core/allocator.h"
#include "runtime.h"

namespace hmla::cuda {

#ifdef HMLA_CUDA_EMULATE

namespace {
float rbf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }
}  // namespace

void gemm(const GemmParams& p) {
  ++counters().launches;  // one cuBLASLt product on a device
  emu::stream_launch(current_stream().get());  // on the current stream, as cublasLtMatmul's
  const float* A = static_cast<const float*>(p.a);
  const float* B = static_cast<const float*>(p.b);
  float* C = static_cast<float*>(p.c);
  for (int64_t z = 0; z < p.batch; ++z)
    for (int64_t i = 0; i < p.M; ++i)
      for (int64_t j = 0; j < p.N; ++j) {
        float acc = 0.f;
        for (int64_t k = 0; k < p.K; ++k) {
          const float a = p.ta == Trans::no ? A[z * p.a_batch + i * p.lda + k] : A[z * p.a_batch + k * p.lda + i];
          const float b = p.tb == Trans::no ? B[z * p.b_batch + k * p.ldb + j] : B[z * p.b_batch + j * p.ldb + k];
          acc += rbf16(a) * rbf16(b);
        }
        float& c = C[z * p.c_batch + i * p.ldc + j];
        c = p.alpha * acc + (p.beta != 0.f ? p.beta * c : 0.f);
      }
}

#else

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

template <class H, cublasStatus_t (*Destroy)(H)>
struct Handle {
  H h = nullptr;
  Handle() = default;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() {
    if (h) Destroy(h);
  }
};
using Desc = Handle<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using Layout = Handle<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using Pref = Handle<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

// A column-major rows x cols f32 layout with leading dimension ld, `batch` matrices apart by bs.
void make_layout(Layout& l, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t bs) {
  check(cublasLtMatrixLayoutCreate(&l.h, CUDA_R_32F, uint64_t(rows), uint64_t(cols), ld), "cublasLtMatrixLayoutCreate");
  if (batch == 1) return;
  const int32_t count = int32_t(batch);
  check(cublasLtMatrixLayoutSetAttribute(l.h, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
        "cublasLt batch count");
  check(cublasLtMatrixLayoutSetAttribute(l.h, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &bs, sizeof(bs)),
        "cublasLt batch stride");
}

// The largest power of two (<= 256) that divides the address: what the heuristic may assume.
uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 4 && a % al != 0) al /= 2;
  return al;
}

}  // namespace

void gemm(const GemmParams& p) {
  if (p.M == 0 || p.N == 0 || p.batch == 0) return;
  HMLA_CHECK(p.K > 0, ShapeError, "gemm on the GPU: K = 0");  // the entry points never ask for it
  Desc desc;
  check(cublasLtMatmulDescCreate(&desc.h, CUBLAS_COMPUTE_32F_FAST_16BF, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t opa = p.tb == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;  // the library's A is our B
  const cublasOperation_t opb = p.ta == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)), "cublasLt transa");
  check(cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)), "cublasLt transb");
  Layout la, lb, lc;
  make_layout(la, p.tb == Trans::no ? p.N : p.K, p.tb == Trans::no ? p.K : p.N, p.ldb, p.batch, p.b_batch);
  make_layout(lb, p.ta == Trans::no ? p.K : p.M, p.ta == Trans::no ? p.M : p.K, p.lda, p.batch, p.a_batch);
  make_layout(lc, p.N, p.M, p.ldc, p.batch, p.c_batch);
  Pref pref;
  check(cublasLtMatmulPreferenceCreate(&pref.h), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws_bytes = kWorkspaceBytes;
  check(cublasLtMatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                             sizeof(ws_bytes)),
        "cublasLt workspace");
  const uint32_t al_a = alignment(p.b), al_b = alignment(p.a), al_c = alignment(p.c);
  check(cublasLtMatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)),
        "cublasLt alignment");
  check(cublasLtMatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)),
        "cublasLt alignment");
  check(cublasLtMatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)),
        "cublasLt alignment");
  check(cublasLtMatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)),
        "cublasLt alignment");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  check(cublasLtMatmulAlgoGetHeuristic(blaslt().get(), desc.h, la.h, lb.h, lc.h, lc.h, pref.h, 1, &result, &found),
        "cublasLtMatmulAlgoGetHeuristic");
  HMLA_CHECK(found > 0, Error, "cuBLASLt has no algorithm for a [", p.M, ", ", p.K, "] x [", p.K, ", ", p.N,
             "] product (batch ", p.batch, ")");
  Allocator& mem = allocator(Device::cuda);
  void* ws = mem.allocate(kWorkspaceBytes);
  const cublasStatus_t st = cublasLtMatmul(blaslt().get(), desc.h, &p.alpha, p.b, la.h, p.a, lb.h, &p.beta, p.c, lc.h,
                                           p.c, lc.h, &result.algo, ws, kWorkspaceBytes, current_stream().get());
  mem.deallocate(ws, kWorkspaceBytes);  // the caching allocator reuses it only for work later on this stream
  check(st, "cublasLtMatmul");
  ++counters().launches;
}

#endif

}  // namespace hmla::cuda
