// The op list and op identity: every backend entry, written once in its family's header
// (HMLA_<FAMILY>_OPS: X(return type, entry, params struct); HMLA_<FAMILY>_PARAMS: X(params
// struct)), gathered by the generated hmla/ops/op_families.h (cmake/op_families.cmake globs the
// family headers, so a new family edits no list). From the list come `enum class Op`, its names
// and families, the Backend's virtual entries and plans (backend.h, backend_base.cpp), each
// backend's kernel and plan declarations (cpu_kernels.h, cuda_kernels.h) and its overrides
// (src/cpu/backend.cpp, src/cuda/backend.cu). An X-macro rather than a constexpr table because
// most of what it generates are declarations (ggml's op enum does the same work with switches).
// Adding an op or a family: docs/ops.md.
#pragma once
#include <initializer_list>
#include <string>
#include <string_view>

#include "hmla/ops/op_families.h"  // generated: HMLA_OP_LIST, HMLA_PARAMS_LIST, HMLA_OP_FAMILIES

namespace hmla {

// One enumerator per backend entry, in the op list's order.
enum class Op : int {
#define HMLA_OP_ENUM(ret, name, P) name,
  HMLA_OP_LIST(HMLA_OP_ENUM)
#undef HMLA_OP_ENUM
};

#define HMLA_OP_REF(ret, name, P) Op::name,
inline constexpr Op kAllOps[] = {HMLA_OP_LIST(HMLA_OP_REF)};
inline constexpr int kOpCount = int(sizeof(kAllOps) / sizeof(kAllOps[0]));

// The entry's name ("attn_dense_fwd"), its params struct's ("AttnDenseParams") and its family's
// ("attn_dense": HMLA_ATTN_DENSE_OPS).
struct OpNames {
  const char* entry;
  const char* params;
};
inline constexpr OpNames kOpNames[] = {
#define HMLA_OP_NAMES(ret, name, P) {#name, #P},
    HMLA_OP_LIST(HMLA_OP_NAMES)
#undef HMLA_OP_NAMES
};
constexpr const char* op_name(Op op) { return kOpNames[int(op)].entry; }
constexpr const char* op_params_name(Op op) { return kOpNames[int(op)].params; }
constexpr const char* op_family(Op op) {
#define HMLA_OP_FAMILY(family, LIST)                  \
  for (Op member : std::initializer_list<Op>{LIST(HMLA_OP_REF)}) \
    if (member == op) return #family;
  HMLA_OP_FAMILIES(HMLA_OP_FAMILY)
#undef HMLA_OP_FAMILY
  return "?";
}
// The op of an entry name; false when there is none.
inline bool op_from_name(std::string_view name, Op& op) {
  for (Op o : kAllOps)
    if (name == op_name(o)) return op = o, true;
  return false;
}

// How a backend runs an op on given params: which implementation (its variant), or none and why.
// Each kernel family has one plan function per backend (cpu::plan, cuda::plan, overloaded on the
// params struct, in the family's kernel file); the backend's supports() is "the plan is not none"
// and the family's launcher runs the variant the same plan names, so what is claimed is what runs.
enum class Variant : unsigned char {
  none,    // not run on these params
  cpu,     // the CPU backend's f32 kernels
  simt,    // CUDA: hand-written kernels on the CUDA cores
  mma,     // CUDA: hand-written tensor-core kernels (mma.sync)
  cudnn,   // CUDA: cuDNN's fused attention
  cublas,  // CUDA: cuBLASLt products
};
constexpr const char* variant_name(Variant v) {
  switch (v) {
    case Variant::none: return "none";
    case Variant::cpu: return "cpu";
    case Variant::simt: return "simt";
    case Variant::mma: return "mma";
    case Variant::cudnn: return "cudnn";
    case Variant::cublas: return "cublas";
  }
  return "?";
}
struct Plan {
  Variant variant = Variant::none;
  std::string why;  // none only, optional: why not, a phrase ("attention backend cudnn: ...")
  explicit operator bool() const { return variant != Variant::none; }
};
// A plan of `v` when `ok`, else none.
inline Plan plan_if(bool ok, Variant v) { return ok ? Plan{v, {}} : Plan{}; }

}  // namespace hmla

// The kernel and plan declarations of one backend's namespace: `ret name(const Params& p);` per
// op and `Plan plan(Op, const Params&);` per params struct (cpu_kernels.h, cuda_kernels.h).
#define HMLA_DECLARE_KERNEL(ret, name, P) ret name(const P& p);
#define HMLA_DECLARE_PLAN(P) Plan plan(Op op, const P& p);
// A backend's overrides, each forwarding to the kernel (plan) of the same name in namespace ns:
// HMLA_OP_LIST(HMLA_CPU_ENTRY) with #define HMLA_CPU_ENTRY(r, n, P) HMLA_FORWARD(cpu, r, n, P).
#define HMLA_FORWARD(ns, ret, name, P) \
  ret name(const P& p) const override { return ns::name(p); }
#define HMLA_FORWARD_PLAN(ns, P) \
  Plan plan(Op op, const P& p) const override { return ns::plan(op, p); }
