// Products on the GPU (GemmParams, row-major, batched with strides), each operand f32 or bf16,
// through cuBLASLt. The contract: each input rounded to bf16 (RNE; a bf16 input is already), the
// products accumulated in f32 on the tensor cores, then alpha acc + beta c rounded once to c's
// dtype. f32 x f32 -> f32 runs as CUBLAS_COMPUTE_32F_FAST_16BF (the library rounds the inputs
// inside, no cast pass); any other mix first converts its f32 input(s) to a bf16 scratch (the
// library pairs FAST_16BF with f32 A, B and C only) and runs bf16 x bf16 with CUBLAS_COMPUTE_32F,
// C/D in c's dtype. cuBLASLt is column-major: row-major C = op(A) op(B) is column-major
// C^T = op(B)^T op(A)^T, so B goes first.
//
// In the SIMT emulator the library is not there: a host stand-in computes the same contract
// (each input read in its dtype and rounded to bf16, products summed in f32 over k in order, c
// stored in its dtype), so the emulated training step checks hmla's descriptors (shapes,
// transposes, leading dimensions, batch strides, dtypes).
#include <cuda_bf16.h>

#include <cstdint>
#include <optional>

#include "cuda_kernels.h"
#include "hmla/core/allocator.h"
#include "runtime.h"
#include "strided.cuh"

namespace hmla::cuda {

#ifdef HMLA_CUDA_EMULATE

namespace {

float rbf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// Element e of an input as the tensor cores read it: f32 rounded to bf16, bf16 widened (exact).
float input(const void* p, DType t, int64_t e) {
  return t == DType::bf16 ? bf16_to_f32(static_cast<const bf16*>(p)[e]) : rbf16(static_cast<const float*>(p)[e]);
}

float load(const void* p, DType t, int64_t e) {
  return t == DType::bf16 ? bf16_to_f32(static_cast<const bf16*>(p)[e]) : static_cast<const float*>(p)[e];
}

void store(void* p, DType t, int64_t e, float v) {
  if (t == DType::bf16) static_cast<bf16*>(p)[e] = f32_to_bf16(v);
  else static_cast<float*>(p)[e] = v;
}

}  // namespace

void gemm(const GemmParams& p) {
  ++counters().launches;  // one cuBLASLt product on a device
  emu::stream_launch(current_stream().get());  // on the current stream, as cublasLtMatmul's
  for (int64_t z = 0; z < p.batch; ++z)
    for (int64_t i = 0; i < p.M; ++i)
      for (int64_t j = 0; j < p.N; ++j) {
        float acc = 0.f;
        for (int64_t k = 0; k < p.K; ++k) {
          const int64_t ea = z * p.a_batch + (p.ta == Trans::no ? i * p.lda + k : k * p.lda + i);
          const int64_t eb = z * p.b_batch + (p.tb == Trans::no ? k * p.ldb + j : j * p.ldb + k);
          acc += input(p.a, p.a_dtype, ea) * input(p.b, p.b_dtype, eb);
        }
        const int64_t ec = z * p.c_batch + i * p.ldc + j;
        store(p.c, p.c_dtype, ec, p.alpha * acc + (p.beta != 0.f ? p.beta * load(p.c, p.c_dtype, ec) : 0.f));
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

cudaDataType_t cuda_type(DType t) { return t == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }

// A column-major rows x cols layout of `type` with leading dimension ld, `batch` matrices apart by bs.
void make_layout(Layout& l, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t bs) {
  check(cublasLtMatrixLayoutCreate(&l.h, type, uint64_t(rows), uint64_t(cols), ld), "cublasLtMatrixLayoutCreate");
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
  while (al > 2 && a % al != 0) al /= 2;  // a bf16 view may start at any even byte
  return al;
}

// An input as the library reads it: [batch][rows, cols] (row-major) at ld and bs, of `type`.
struct Input {
  const void* p;
  int64_t ld, bs;
  cudaDataType_t type;
};

// A bf16 copy of an f32 input, contiguous, in a caching-allocator scratch, converted on the
// stream (rounded to nearest even, as FAST_16BF rounds); a bf16 input as it is.
class Bf16Input {
 public:
  Bf16Input(const void* p, DType t, int64_t batch, int64_t rows, int64_t cols, int64_t ld, int64_t bs)
      : in_{p, ld, bs, CUDA_R_16BF} {
    if (t == DType::bf16) return;
    copy_.emplace(batch * rows * cols);
    const int64_t shape[3] = {batch, rows, cols}, dst[3] = {rows * cols, cols, 1}, src[3] = {bs, ld, 1};
    strided_map(copy_->get(), static_cast<const float*>(p), strided4(shape, dst, src, 3));
    in_ = {copy_->get(), cols, rows * cols, CUDA_R_16BF};
  }
  const Input& get() const { return in_; }

 private:
  Input in_;
  std::optional<Scratch<__nv_bfloat16>> copy_;
};

}  // namespace

void gemm(const GemmParams& p) {
  if (p.M == 0 || p.N == 0 || p.batch == 0) return;
  HMLA_CHECK(p.K > 0, ShapeError, "gemm on the GPU: K = 0");  // the entry points never ask for it
  const bool fast = p.a_dtype == DType::f32 && p.b_dtype == DType::f32 && p.c_dtype == DType::f32;
  const int64_t a_rows = p.ta == Trans::no ? p.M : p.K, a_cols = p.ta == Trans::no ? p.K : p.M;
  const int64_t b_rows = p.tb == Trans::no ? p.K : p.N, b_cols = p.tb == Trans::no ? p.N : p.K;
  std::optional<Bf16Input> a16, b16;
  Input A{p.a, p.lda, p.a_batch, CUDA_R_32F}, B{p.b, p.ldb, p.b_batch, CUDA_R_32F};
  if (!fast) {
    A = a16.emplace(p.a, p.a_dtype, p.batch, a_rows, a_cols, p.lda, p.a_batch).get();
    B = b16.emplace(p.b, p.b_dtype, p.batch, b_rows, b_cols, p.ldb, p.b_batch).get();
  }
  Desc desc;
  check(cublasLtMatmulDescCreate(&desc.h, fast ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F, CUDA_R_32F),
        "cublasLtMatmulDescCreate");
  const cublasOperation_t opa = p.tb == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;  // the library's A is our B
  const cublasOperation_t opb = p.ta == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)), "cublasLt transa");
  check(cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)), "cublasLt transb");
  Layout la, lb, lc;
  make_layout(la, B.type, b_cols, b_rows, B.ld, p.batch, B.bs);  // column-major: our rows are its columns
  make_layout(lb, A.type, a_cols, a_rows, A.ld, p.batch, A.bs);
  make_layout(lc, cuda_type(p.c_dtype), p.N, p.M, p.ldc, p.batch, p.c_batch);
  Pref pref;
  check(cublasLtMatmulPreferenceCreate(&pref.h), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws_bytes = kWorkspaceBytes;
  check(cublasLtMatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                             sizeof(ws_bytes)),
        "cublasLt workspace");
  const uint32_t al_a = alignment(B.p), al_b = alignment(A.p), al_c = alignment(p.c);
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
  const cublasStatus_t st = cublasLtMatmul(blaslt().get(), desc.h, &p.alpha, B.p, la.h, A.p, lb.h, &p.beta, p.c, lc.h,
                                           p.c, lc.h, &result.algo, ws, kWorkspaceBytes, current_stream().get());
  mem.deallocate(ws, kWorkspaceBytes);  // the caching allocator reuses it only for work later on this stream
  check(st, "cublasLtMatmul");
  ++counters().launches;
}

#endif

// The plan (cuda_kernels.h): any mix of f32 and bf16 operands, through cuBLASLt.
Plan plan(Op, const GemmParams& p) {
  return plan_if(f32_or_bf16(p.a_dtype) && f32_or_bf16(p.b_dtype) && f32_or_bf16(p.c_dtype), Variant::cublas);
}

}  // namespace hmla::cuda
