// A SIMT emulator that runs hmla's CUDA kernels, unchanged, on the CPU: the CUDA runtime calls the
// backend makes (memory, copies, streams, events), the bf16 types and intrinsics, and the
// execution model. A launch runs its blocks one after another; a block's threads are fibers that
// meet at real barriers: __syncthreads is a block barrier, warp shuffles, ballots and mma.sync are
// warp-collective (every lane deposits its operands into a double-buffered slot, one warp barrier,
// each lane reads what it needs). __shared__ variables are statics, which is right because only one
// block runs at a time. It checks indexing, fragment layouts, masking and the algebra of a
// kernel against the CPU references; it says nothing about speed, and it can hide races that
// depend on real warp scheduling (compute-sanitizer's racecheck on a GPU is for those).
//
// Force-included (-include) into every CUDA source and check file of the emulated build, with
// HMLA_CUDA_EMULATE defined.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include <csetjmp>
#include <ucontext.h>

#include "hmla/core/tensor.h"  // hmla::bf16 conversions (round to nearest even, as __float2bfloat16_rn)

// ---- language --------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __shared__ static
#define __restrict__
#define HMLA_DYNAMIC_SHARED(type, name) type* name = reinterpret_cast<type*>(::hmla::emu::dynamic_shared())

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

namespace hmla::emu {

// One block at a time; its threads are fibers (ucontext) on the calling OS thread, switched at
// barriers, in a shuffled order each round. A fiber runs until it reaches a barrier or ends; a
// barrier releases its waiters when every live thread of its scope (block or warp) has arrived;
// threads that have ended count as arrived. No runnable fiber while some wait is a divergent
// barrier: reported, then abort.
struct Fiber {
  ucontext_t uc;   // for the first entry
  jmp_buf jb;      // every later switch: _setjmp/_longjmp, no signal-mask system call
  char* stack = nullptr;  // from stack_pool()
  dim3 thread;
  bool done = false, started = false;
  unsigned collectives = 0;  // warp collectives this thread has made (the deposit buffer's parity)
  const void* waiting = nullptr;  // the scope whose barrier it waits at
};

struct Scope {  // a barrier's bookkeeping: the block's, or one warp's
  unsigned alive = 0, arrived = 0;
  std::vector<unsigned> members;
};

// Per-lane deposits of warp collectives (shuffles, ballots, mma operands), double-buffered: a
// collective writes buffer `gen & 1`, meets the others at one warp barrier and reads; a lane can
// write the other buffer while slower lanes still read this one, and cannot come back to this one
// before they have all reached the next barrier.
struct Warp {
  uint32_t u32[2][32][8];
  float f32[2][32][4];
};

struct Launch {
  dim3 block, grid, block_dim;
  std::vector<Fiber> fibers;
  std::vector<Scope> warp_scopes;
  Scope block_scope;
  std::vector<Warp> warps;
  std::vector<unsigned char> smem;
  jmp_buf main;
  unsigned cur = 0;
  const std::function<void()>* body = nullptr;
};
inline Launch* g_launch = nullptr;

inline Fiber& self() { return g_launch->fibers[g_launch->cur]; }
inline unsigned char* dynamic_shared() { return g_launch->smem.data(); }
inline int lane() { return int(self().thread.x % 32); }
inline Warp& warp() { return g_launch->warps[self().thread.x / 32]; }

inline void release_if_complete(Scope& s) {
  if (s.arrived == 0 || s.arrived < s.alive) return;
  s.arrived = 0;
  for (unsigned f : s.members)
    if (g_launch->fibers[f].waiting == &s) g_launch->fibers[f].waiting = nullptr;
}

inline void wait_at(Scope& s) {
  ++s.arrived;
  Fiber& f = self();
  if (s.arrived >= s.alive) {  // the last to arrive releases everyone and runs on
    release_if_complete(s);
    return;
  }
  f.waiting = &s;
  if (_setjmp(f.jb) == 0) _longjmp(g_launch->main, 1);
}

inline void block_barrier() { wait_at(g_launch->block_scope); }
inline int next_collective() { return int(self().collectives++ & 1u); }
inline void warp_barrier() { wait_at(g_launch->warp_scopes[self().thread.x / 32]); }

inline void fiber_entry() {
  Launch& L = *g_launch;
  (*L.body)();
  Fiber& f = self();
  f.done = true;
  Scope& w = L.warp_scopes[f.thread.x / 32];
  --w.alive;
  --L.block_scope.alive;
  release_if_complete(w);
  release_if_complete(L.block_scope);
  _longjmp(L.main, 1);
}

// Launches do not nest (a kernel cannot launch one), so one pool of stacks serves every launch.
#define HMLA_EMU_ASSERT_NOT_NESTED(outer)                                              \
  do {                                                                                 \
    if (outer) {                                                                       \
      std::fprintf(stderr, "emulator: a launch from inside a kernel is not emulated\n"); \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

// Fiber stacks, kept across launches (a training step launches hundreds of kernels; allocating
// and zeroing 256 KiB per thread each time would dominate the emulated run).
constexpr size_t kStackBytes = 256 << 10;
inline char* stack_pool(unsigned i) {
  static std::vector<std::unique_ptr<char[]>> pool;
  while (pool.size() <= i) pool.emplace_back(new char[kStackBytes]);
  return pool[i].get();
}

// Runs body() as grid x block threads, blocks in order.
inline void launch(dim3 grid, dim3 block, size_t smem, const std::function<void()>& body) {
  const unsigned n = block.x * block.y * block.z;
  Launch L;
  L.grid = grid;
  L.block_dim = block;
  L.body = &body;
  L.fibers.resize(n);
  Launch* outer = g_launch;
  HMLA_EMU_ASSERT_NOT_NESTED(outer);
  for (unsigned t = 0; t < n; ++t) L.fibers[t].stack = stack_pool(t);
  L.warps.resize((n + 31) / 32);
  g_launch = &L;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        L.block = dim3(bx, by, bz);
        L.smem.assign(smem + 16, 0xCD);  // poison: reading what nothing wrote shows
        L.block_scope = {n, 0, {}};
        L.warp_scopes.assign(L.warps.size(), Scope{});
        for (unsigned t = 0; t < n; ++t) {
          Fiber& f = L.fibers[t];
          f.thread = dim3(t);
          f.done = f.started = false;
          f.collectives = 0;
          f.waiting = nullptr;
          getcontext(&f.uc);
          f.uc.uc_stack.ss_sp = f.stack;
          f.uc.uc_stack.ss_size = kStackBytes;
          f.uc.uc_link = nullptr;
          makecontext(&f.uc, fiber_entry, 0);
          L.block_scope.members.push_back(t);
          Scope& w = L.warp_scopes[t / 32];
          ++w.alive;
          w.members.push_back(t);
        }
        // Each round runs the runnable threads in a fresh pseudo-random order (seeded by the block),
        // so that a read racing a write without a barrier between them sees different orders
        // across blocks and rounds instead of one convenient order.
        std::vector<unsigned> order(n);
        std::iota(order.begin(), order.end(), 0u);
        std::minstd_rand rng(1u + bx + 7919u * by + 104729u * bz);
        for (unsigned live = n; live > 0;) {
          bool ran = false;
          std::shuffle(order.begin(), order.end(), rng);
          for (unsigned t : order) {
            Fiber& f = L.fibers[t];
            if (f.done || f.waiting) continue;
            L.cur = t;
            if (_setjmp(L.main) == 0) {
              if (f.started) _longjmp(f.jb, 1);
              f.started = true;
              setcontext(&f.uc);
            }
            ran = true;
          }
          live = 0;
          for (const Fiber& f : L.fibers) live += !f.done;
          if (live > 0 && !ran) {
            std::fprintf(stderr, "emulator: block (%u, %u, %u): every live thread waits at a barrier the others "
                         "never reach (divergent __syncthreads or warp collective)\n", bx, by, bz);
            std::abort();
          }
        }
      }
  g_launch = outer;
}

}  // namespace hmla::emu

#define threadIdx (::hmla::emu::self().thread)
#define blockIdx (::hmla::emu::g_launch->block)
#define blockDim (::hmla::emu::g_launch->block_dim)
#define gridDim (::hmla::emu::g_launch->grid)
#define HMLA_LAUNCH(kernel, grid, block, smem, stream, ...) \
  ((void)(stream), ::hmla::emu::launch(grid, block, smem, [&] { kernel(__VA_ARGS__); }))

inline void __syncthreads() { ::hmla::emu::block_barrier(); }

inline float __shfl_xor_sync(unsigned, float v, int mask) {
  auto& w = ::hmla::emu::warp();
  const int l = ::hmla::emu::lane(), g = ::hmla::emu::next_collective();
  w.f32[g][l][0] = v;
  ::hmla::emu::warp_barrier();
  return w.f32[g][l ^ mask][0];
}
inline unsigned __ballot_sync(unsigned, bool p) {
  auto& w = ::hmla::emu::warp();
  const int l = ::hmla::emu::lane(), g = ::hmla::emu::next_collective();
  w.u32[g][l][0] = p ? 1u : 0u;
  ::hmla::emu::warp_barrier();
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= w.u32[g][i][0] << i;
  return r;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
template <class T, class U>
T atomicAdd(T* p, U v) {
  return std::atomic_ref<T>(*p).fetch_add(T(v));
}
template <class T>
T atomicMin(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T cur = a.load();
  while (v < cur && !a.compare_exchange_weak(cur, v)) {
  }
  return cur;
}
template <class T>
T atomicMax(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T cur = a.load();
  while (v > cur && !a.compare_exchange_weak(cur, v)) {
  }
  return cur;
}
template <class T>
T atomicCAS(T* p, T expected, T desired) {
  std::atomic_ref<T>(*p).compare_exchange_strong(expected, desired);
  return expected;
}
using std::max;
using std::min;

// ---- bf16 ------------------------------------------------------------------------------------
struct __nv_bfloat16 {
  uint16_t x;
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
inline __nv_bfloat16 __float2bfloat16(float f) { return {::hmla::f32_to_bf16(f).bits}; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return ::hmla::bf16_to_f32(::hmla::bf16{b.x}); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16(a), __float2bfloat16(b)}; }

// mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32, warp-collective: operands located by the PTX
// fragment layout (as mma.cuh documents it), products summed in f32 over k in order.
namespace hmla::emu {
inline float half_of(uint32_t reg, int hi) { return __bfloat162float(__nv_bfloat16{uint16_t(hi ? reg >> 16 : reg & 0xffffu)}); }
inline void mma_bf16_16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  Warp& w = warp();
  const int l = lane(), gen = next_collective();
  auto& dep = w.u32[gen];
  for (int i = 0; i < 4; ++i) dep[l][i] = a[i];
  dep[l][4] = b[0];
  dep[l][5] = b[1];
  warp_barrier();
  auto A = [&](int r, int k) {  // lane (r % 8) * 4 + (k % 8) / 2, register (r >= 8) + 2 (k >= 8)
    return half_of(dep[(r % 8) * 4 + (k % 8) / 2][(r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k % 2);
  };
  auto B = [&](int k, int n) {  // lane n * 4 + (k % 8) / 2, register 4 + (k >= 8)
    return half_of(dep[n * 4 + (k % 8) / 2][4 + (k >= 8 ? 1 : 0)], k % 2);
  };
  const int g = l / 4, cc = l % 4;
  for (int e = 0; e < 4; ++e) {
    const int r = g + (e >= 2 ? 8 : 0), n = 2 * cc + (e & 1);
    float acc = c[e];
    for (int k = 0; k < 16; ++k) acc += A(r, k) * B(k, n);
    c[e] = acc;
  }
}
}  // namespace hmla::emu

// ---- the runtime -----------------------------------------------------------------------------
enum cudaError_t { cudaSuccess = 0, cudaErrorMemoryAllocation = 2 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
using cudaStream_t = void*;
struct cudaDeviceProp {
  char name[256];
};
constexpr unsigned cudaStreamNonBlocking = 1;
inline const char* cudaGetErrorString(cudaError_t) { return "emulated CUDA error"; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaMalloc(void** p, size_t n) {
  *p = std::aligned_alloc(256, (n + 255) / 256 * 256);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t) {
  std::memcpy(d, s, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) {
  std::memset(p, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind k) { return cudaMemcpyAsync(d, s, n, k, nullptr); }
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  static int dummy;
  *s = &dummy;
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }
inline cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {  // the emulated device: no limit of its own
  *free = *total = size_t(1) << 40;
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  std::strcpy(p->name, "hmla SIMT emulator (CPU)");
  return cudaSuccess;
}
template <class F>
cudaError_t cudaFuncSetAttribute(F, cudaFuncAttribute, int) {
  return cudaSuccess;
}
using cudaEvent_t = std::chrono::steady_clock::time_point*;
inline cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new std::chrono::steady_clock::time_point();
  return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  *e = std::chrono::steady_clock::now();
  return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  *ms = std::chrono::duration<float, std::milli>(*b - *a).count();
  return cudaSuccess;
}
enum cublasStatus_t { CUBLAS_STATUS_SUCCESS = 0 };
using cublasLtHandle_t = void*;
inline cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  *h = nullptr;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
