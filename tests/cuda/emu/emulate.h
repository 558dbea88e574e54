// A SIMT emulator that runs hmla's CUDA kernels, unchanged, on the CPU: the CUDA runtime calls the
// backend makes (memory, copies, streams, events), the bf16 types and intrinsics, and the
// execution model. A launch runs its blocks one after another; a block's threads are fibers that
// meet at real barriers: __syncthreads is a block barrier, warp shuffles, ballots and mma.sync are
// warp-collective (every lane deposits its operands into a double-buffered slot, one warp barrier,
// each lane reads what it needs). __shared__ variables are statics (one block runs at a time) in
// one linker section, so that each block can find and poison them. It checks indexing, fragment
// layouts, masking and the algebra of a kernel against the CPU references; it says nothing about
// speed.
//
// It also looks for what a GPU would get wrong and a single fixed order would hide
// (docs/testing.md, "The emulator as a sanitizer"):
// - schedules: every launch runs under each schedule of HMLA_EMU_SCHEDULES (default
//   forward,reverse,shuffled: the order of the blocks, and of the runnable fibers in each round),
//   from the same device memory, and must leave the same bytes in every allocation; a kernel whose
//   result depends on thread or block order (a missing barrier, a racing accumulator, blocks that
//   talk through global memory) is reported with its name and the first differing byte.
// - poison (initcheck): memory from cudaMalloc, every block the caching allocator keeps or hands out,
//   and every block's shared memory (dynamic and static) start as kPoison words (a quiet NaN as f32
//   and in each bf16 half, payloads no arithmetic produces), so a read of what nobody wrote shows.
// - racecheck (HMLA_EMU_RACECHECK=1, or emu::Racecheck in a test): a shared-memory byte that two
//   threads change within one barrier interval (between two __syncthreads), atomics excepted.
// A finding goes to emu::report: by default printed, then abort (a test of the harness installs
// a recorder).
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
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>


#include "sanitize.h"
#include "hmla/core/tensor.h"  // hmla::bf16 conversions (round to nearest even, as __float2bfloat16_rn)

// ---- language --------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __shared__ static __attribute__((section("hmla_emu_shared")))
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

// One block at a time; its threads are fibers on the calling OS thread, switched at
// barriers, in the schedule's order each round. A fiber runs until it reaches a barrier or ends; a
// barrier releases its waiters when every live thread of its scope (block or warp) has arrived;
// threads that have ended count as arrived. No runnable fiber while some wait is a divergent
// barrier: reported, then abort.
// One cp.async copy in flight: `valid` of its n bytes from src, the rest zero-filled.
struct AsyncCopy {
  void* dst;
  const void* src;
  unsigned n, valid;
};

// A switch between fibers saves the callee-saved registers on the running stack, stores its stack
// pointer at *from, loads `to` and pops the same registers there: a call that returns on the other
// stack. Nothing else: ucontext's switches make a signal-mask system call each, and glibc's
// longjmp walks the thread's cleanup handlers; either cost more than most emulated threads' work.
#if !defined(__x86_64__)
#error "the SIMT emulator's fiber switch (hmla_emu_switch) is x86-64 assembly"
#endif
extern "C" void hmla_emu_switch(void** from, void* to);
asm(R"(
  .pushsection .text.hmla_emu_switch,"axG",@progbits,hmla_emu_switch,comdat
  .weak hmla_emu_switch
  .type hmla_emu_switch,@function
hmla_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size hmla_emu_switch, .-hmla_emu_switch
  .popsection
)");

// A fiber's stack, kept across launches (a training step launches hundreds of kernels), with the
// one fiber that lives on it: thread after thread, it runs a kernel's body to the end, then waits
// for the next thread given this stack (fiber_main). `sp` is where it was switched out.
struct FiberStack {
  std::unique_ptr<char[]> mem;
  void* sp = nullptr;
};

struct Fiber {
  FiberStack* stack = nullptr;  // from stack_pool()
  dim3 thread;
  bool done = false;
  unsigned collectives = 0;  // warp collectives this thread has made (the deposit buffer's parity)
  const void* waiting = nullptr;  // the scope whose barrier it waits at
  // cp.async: the copies issued since the last commit, and the committed groups not yet waited
  // for, oldest first. A copy lands in shared memory only when its thread waits for its group
  // (cp_async_wait), so a read before that sees the poison a GPU's race could show.
  std::vector<AsyncCopy> cp_open;
  std::vector<std::vector<AsyncCopy>> cp_groups;
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
  const char* kernel = "";
  dim3 block, grid, block_dim;
  std::vector<Fiber> fibers;
  std::vector<Scope> warp_scopes;
  Scope block_scope;
  std::vector<Warp> warps;
  std::vector<unsigned char> smem;
  void* main = nullptr;  // the scheduler's stack pointer while a fiber runs
  unsigned cur = 0;
  const std::function<void()>* body = nullptr;
  bool racecheck = false;
  bool count = false;  // this run's work goes to the launch's counts (the first schedule's run only)
  Shadow shadow;
};
inline Launch* g_launch = nullptr;

// The work counter: per launch, the tensor-core FLOPs its mma.sync instructions issued (2 m n k
// per warp-wide m16n8k16, counted once per warp) and the bytes its threads read from global memory
// through mma.cuh's tile loaders (load_tile, load_tile_async). Counted under the first schedule only,
// so a launch's figures do not depend on how many schedules replay it. A ScopedWorkLog collects
// every launch made during its lifetime, in order; it says what a kernel does, not how fast.
struct LaunchWork {
  std::string kernel;
  uint64_t mma_flops = 0, load_bytes = 0;
};
inline std::vector<LaunchWork>*& work_log() {
  static std::vector<LaunchWork>* log = nullptr;
  return log;
}
inline LaunchWork& work_now() {  // the current launch's counts (a scratch slot outside a log)
  static LaunchWork scratch;
  return work_log() && !work_log()->empty() ? work_log()->back() : scratch;
}
struct ScopedWorkLog {
  std::vector<LaunchWork> launches;
  std::vector<LaunchWork>* saved;
  ScopedWorkLog() : saved(work_log()) { work_log() = &launches; }
  ~ScopedWorkLog() { work_log() = saved; }
  ScopedWorkLog(const ScopedWorkLog&) = delete;
  ScopedWorkLog& operator=(const ScopedWorkLog&) = delete;
  uint64_t mma_flops() const {
    uint64_t n = 0;
    for (const LaunchWork& w : launches) n += w.mma_flops;
    return n;
  }
  uint64_t load_bytes() const {
    uint64_t n = 0;
    for (const LaunchWork& w : launches) n += w.load_bytes;
    return n;
  }
};
inline void count_load_bytes(uint64_t n) {
  if (g_launch && g_launch->count) work_now().load_bytes += n;
}

inline Fiber& self() { return g_launch->fibers[g_launch->cur]; }
inline unsigned char* dynamic_shared() { return g_launch->smem.data(); }
inline int lane() { return int(self().thread.x % 32); }
inline Warp& warp() { return g_launch->warps[self().thread.x / 32]; }

inline void thread_stops() {
  Launch& L = *g_launch;
  if (L.racecheck) L.shadow.thread_stops(int(L.cur), L.kernel, L.block.x, L.block.y, L.block.z);
}
inline void note_atomic(const void* p, size_t n) {
  if (g_launch && g_launch->racecheck) g_launch->shadow.mark_atomic(p, n);
}

inline void release_if_complete(Scope& s) {
  if (s.arrived == 0 || s.arrived < s.alive) return;
  s.arrived = 0;
  for (unsigned f : s.members)
    if (g_launch->fibers[f].waiting == &s) g_launch->fibers[f].waiting = nullptr;
  if (&s == &g_launch->block_scope && g_launch->racecheck) g_launch->shadow.new_interval();
}

inline void wait_at(Scope& s) {
  thread_stops();
  ++s.arrived;
  Fiber& f = self();
  if (s.arrived >= s.alive) {  // the last to arrive releases everyone and runs on
    release_if_complete(s);
    if (g_launch->racecheck) g_launch->shadow.thread_runs();
    return;
  }
  f.waiting = &s;
  hmla_emu_switch(&f.stack->sp, g_launch->main);
}

inline void block_barrier() { wait_at(g_launch->block_scope); }
inline int next_collective() { return int(self().collectives++ & 1u); }
inline void warp_barrier() { wait_at(g_launch->warp_scopes[self().thread.x / 32]); }

// A fiber's life: thread after thread of whichever launch is current when it is switched to.
[[noreturn]] inline void fiber_main() {
  for (;;) {
    Launch& L = *g_launch;
    (*L.body)();
    thread_stops();
    Fiber& f = self();
    f.done = true;
    Scope& w = L.warp_scopes[f.thread.x / 32];
    --w.alive;
    --L.block_scope.alive;
    release_if_complete(w);
    release_if_complete(L.block_scope);
    hmla_emu_switch(&f.stack->sp, L.main);
  }
}

// Launches do not nest (a kernel cannot launch one), so one pool of stacks serves every launch.
#define HMLA_EMU_ASSERT_NOT_NESTED(outer)                                              \
  do {                                                                                 \
    if (outer) {                                                                       \
      std::fprintf(stderr, "emulator: a launch from inside a kernel is not emulated\n"); \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

// Fiber stacks, kept across launches (allocating and zeroing 256 KiB per thread each time would
// dominate the emulated run). Stacks a whole number of pages apart would start in the same cache
// sets, and a round over a block's threads would then miss on every switch: each stack starts a
// different number of cache lines (17 i, modulo 64 KiB) above its base. A new stack holds the
// frame hmla_emu_switch pops: six zero registers, then fiber_main as the return address, above it
// a null one (fiber_main never returns) that leaves rsp + 8 16-byte aligned at its entry, as a call.
constexpr size_t kStackBytes = 256 << 10, kColourBytes = 64 << 10;
inline FiberStack* stack_pool(unsigned i) {
  static std::vector<std::unique_ptr<FiberStack>> pool;
  while (pool.size() <= i) {
    auto s = std::make_unique<FiberStack>();
    s->mem.reset(new char[kStackBytes + kColourBytes]);
    const size_t colour = (17 * 64 * pool.size()) % kColourBytes;
    const uintptr_t top = (reinterpret_cast<uintptr_t>(s->mem.get()) + kStackBytes + colour) & ~uintptr_t(15);
    void** frame = reinterpret_cast<void**>(top) - 8;
    std::fill(frame, frame + 8, nullptr);
    frame[6] = reinterpret_cast<void*>(&fiber_main);
    s->sp = frame;
    pool.push_back(std::move(s));
  }
  return pool[i].get();
}

// One block, its shared memory poisoned, its fibers run round after round in the schedule's order.
inline void run_block(Launch& L, dim3 b, size_t smem, const Schedule& sched) {
  const unsigned n = unsigned(L.fibers.size());
  L.block = b;
  L.smem.resize(smem + 16);
  poison(L.smem.data(), L.smem.size());
  const Region stat = static_shared();
  if (stat.n) poison(stat.p, stat.n);
  if (L.racecheck) L.shadow.begin_block(L.kernel, {L.smem.data(), L.smem.size()}, stat);
  L.block_scope = {n, 0, {}};
  L.warp_scopes.assign(L.warps.size(), Scope{});
  for (unsigned t = 0; t < n; ++t) {
    Fiber& f = L.fibers[t];
    f.thread = dim3(t);
    f.done = false;
    f.collectives = 0;
    f.waiting = nullptr;
    f.cp_open.clear();
    f.cp_groups.clear();
    L.block_scope.members.push_back(t);
    Scope& w = L.warp_scopes[t / 32];
    ++w.alive;
    w.members.push_back(t);
  }
  std::vector<unsigned> order;
  std::minstd_rand rng(sched.seed + b.x + 7919u * b.y + 104729u * b.z);
  for (unsigned live = n; live > 0;) {
    bool ran = false;
    order_fibers(order, n, sched, rng);
    for (unsigned t : order) {
      Fiber& f = L.fibers[t];
      if (f.done || f.waiting) continue;
      L.cur = t;
      if (L.racecheck) L.shadow.thread_runs();
      hmla_emu_switch(&L.main, f.stack->sp);
      ran = true;
    }
    live = 0;
    for (const Fiber& f : L.fibers) live += !f.done;
    if (live > 0 && !ran) {
      std::fprintf(stderr, "emulator: kernel %s, block (%u, %u, %u): every live thread waits at a barrier the others "
                   "never reach (divergent __syncthreads or warp collective)\n", L.kernel, b.x, b.y, b.z);
      std::abort();
    }
  }
  if (L.racecheck) L.shadow.end_block(L.kernel, stat);
}

// The whole grid under one schedule: blocks in its order.
inline void run_grid(const char* kernel, dim3 grid, dim3 block, size_t smem, const std::function<void()>& body,
                     const Schedule& sched, bool count) {
  const unsigned n = block.x * block.y * block.z;
  Launch L;
  L.kernel = kernel;
  L.count = count;
  if (count && work_log()) work_log()->push_back({kernel, 0, 0});
  L.grid = grid;
  L.block_dim = block;
  L.body = &body;
  L.racecheck = racecheck_enabled();
  L.fibers.resize(n);
  Launch* outer = g_launch;
  HMLA_EMU_ASSERT_NOT_NESTED(outer);
  for (unsigned t = 0; t < n; ++t) L.fibers[t].stack = stack_pool(t);
  L.warps.resize((n + 31) / 32);
  std::vector<dim3> blocks;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) blocks.emplace_back(bx, by, bz);
  if (sched.order == Order::reverse) std::reverse(blocks.begin(), blocks.end());
  if (sched.order == Order::shuffled) std::shuffle(blocks.begin(), blocks.end(), std::minstd_rand(sched.seed));
  g_launch = &L;
  for (const dim3& b : blocks) run_block(L, b, smem, sched);
  g_launch = outer;
}

inline uint64_t& launches() {  // launches so far in this process (named in findings)
  static uint64_t n = 0;
  return n;
}

// A launch: the grid under the first schedule, then again from the same device memory under each
// other one; every schedule must leave the same bytes.
inline void launch(const char* kernel, dim3 grid, dim3 block, size_t smem, const std::function<void()>& body) {
  const std::vector<Schedule>& S = schedules();
  const uint64_t id = ++launches();
  if (S.size() == 1) return run_grid(kernel, grid, block, smem, body, S[0], true);
  const Image before = save_device();
  run_grid(kernel, grid, block, smem, body, S[0], true);
  const Image first = save_device();
  for (size_t i = 1; i < S.size(); ++i) {
    restore_device(before);
    run_grid(kernel, grid, block, smem, body, S[i], false);
    const std::string diff = device_difference(first);
    if (diff.empty()) continue;
    report("kernel " + std::string(kernel) + " (launch " + std::to_string(id) + ") leaves different bytes under schedule " +
           S[i].name + " than under " + S[0].name + ": " + diff);
    restore_device(first);  // what the first schedule made, so that a recorded finding reads one result
    return;
  }
}

}  // namespace hmla::emu

#define threadIdx (::hmla::emu::self().thread)
#define blockIdx (::hmla::emu::g_launch->block)
#define blockDim (::hmla::emu::g_launch->block_dim)
#define gridDim (::hmla::emu::g_launch->grid)
#define HMLA_LAUNCH(kernel, grid, block, smem, stream, ...) \
  (::hmla::emu::stream_launch(stream), ::hmla::emu::launch(#kernel, grid, block, smem, [&] { kernel(__VA_ARGS__); }))

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
  ::hmla::emu::note_atomic(p, sizeof(T));
  return std::atomic_ref<T>(*p).fetch_add(T(v));
}
template <class T>
T atomicMin(T* p, T v) {
  ::hmla::emu::note_atomic(p, sizeof(T));
  std::atomic_ref<T> a(*p);
  T cur = a.load();
  while (v < cur && !a.compare_exchange_weak(cur, v)) {
  }
  return cur;
}
template <class T>
T atomicMax(T* p, T v) {
  ::hmla::emu::note_atomic(p, sizeof(T));
  std::atomic_ref<T> a(*p);
  T cur = a.load();
  while (v > cur && !a.compare_exchange_weak(cur, v)) {
  }
  return cur;
}
template <class T>
T atomicCAS(T* p, T expected, T desired) {
  ::hmla::emu::note_atomic(p, sizeof(T));
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
  if (l == 0 && g_launch->count) work_now().mma_flops += 2 * 16 * 8 * 16;
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
// ---- cp.async (mma.cuh's cp_async16, cp_async_commit, cp_async_wait) -----------------------------
inline void cp_async(void* dst, const void* src, unsigned n, unsigned valid) {
  self().cp_open.push_back({dst, src, n, valid});
}
inline void cp_async_commit() {
  Fiber& f = self();
  f.cp_groups.push_back(std::move(f.cp_open));
  f.cp_open.clear();
}
// Every group but the newest `pending` lands, oldest first (the thread's own copies only, as
// cp.async.wait_group: the block sees them after a barrier).
inline void cp_async_wait(int pending) {
  Fiber& f = self();
  while (int(f.cp_groups.size()) > pending) {
    for (const AsyncCopy& c : f.cp_groups.front()) {
      std::memcpy(c.dst, c.src, c.valid);
      std::memset(static_cast<unsigned char*>(c.dst) + c.valid, 0, c.n - c.valid);
    }
    f.cp_groups.erase(f.cp_groups.begin());
  }
}
// ---- ldmatrix (the sparse backward, issue 30) ---------------------------------------------------
// ldmatrix.m8n8.x4.trans.b16, warp-collective: every lane deposits its row address, then reads
// its four registers from the rows the PTX layout names (mma.cuh, ldsm_x4_trans).
inline void ldsm_x4_trans(uint32_t r[4], const __nv_bfloat16* row) {
  Warp& w = warp();
  const int l = lane(), gen = next_collective();
  const uint64_t a = uint64_t(reinterpret_cast<uintptr_t>(row));
  w.u32[gen][l][0] = uint32_t(a), w.u32[gen][l][1] = uint32_t(a >> 32);
  warp_barrier();
  auto at = [&](int src, int col) {  // element col of the row lane src named
    const uint64_t p = uint64_t(w.u32[gen][src][0]) | (uint64_t(w.u32[gen][src][1]) << 32);
    return uint32_t(reinterpret_cast<const __nv_bfloat16*>(uintptr_t(p))[col].x);
  };
  const int g = l / 4, c = l % 4;
  for (int m = 0; m < 4; ++m) r[m] = at(m * 8 + 2 * c, g) | (at(m * 8 + 2 * c + 1, g) << 16);
}
// ---- end ldmatrix ----------------------------------------------------------------------------
// The m16n8k8 product (mma.cuh's mma_bf16_1688): A in two registers, B in one; counted as 2 x 16 x 8 x 8.
inline void mma_bf16_1688(float c[4], const uint32_t a[2], uint32_t b) {
  Warp& w = warp();
  const int l = lane(), gen = next_collective();
  if (l == 0 && g_launch->count) work_now().mma_flops += 2 * 16 * 8 * 8;
  auto& dep = w.u32[gen];
  dep[l][0] = a[0];
  dep[l][1] = a[1];
  dep[l][2] = b;
  warp_barrier();
  auto A = [&](int r, int k) { return half_of(dep[(r % 8) * 4 + k / 2][r >= 8 ? 1 : 0], k % 2); };
  auto B = [&](int k, int n) { return half_of(dep[n * 4 + k / 2][2], k % 2); };
  const int g = l / 4, cc = l % 4;
  for (int e = 0; e < 4; ++e) {
    const int r = g + (e >= 2 ? 8 : 0), n = 2 * cc + (e & 1);
    float acc = c[e];
    for (int k = 0; k < 8; ++k) acc += A(r, k) * B(k, n);
    c[e] = acc;
  }
}
}  // namespace hmla::emu

// ---- streams and events ----------------------------------------------------------------------
// Work runs when it is issued, so a stream orders nothing the emulator could get wrong; what it
// keeps per stream is what a test observes: the work each stream was given (which stream hmla's
// launches, copies, memsets and event records went to), the cudaStreamWaitEvent calls it made, and
// which of its work counts as complete. By default every event is complete when recorded. Under
// ScopedPendingEvents the emulated GPU is as slow as it may be: work completes only when the host
// waits for it (a stream or event synchronisation, or a stream that waits on its event), so
// cudaEventQuery answers "not ready" until then, and a copy from pinned host memory
// (cudaMallocHost) reads its source only then, or when the next work on its stream runs: a host
// that rewrites a pinned buffer before the copy from it completed uploads the new bytes, as a GPU
// may. (A copy from pageable memory reads its source at once: the driver stages it.)
namespace hmla::emu {
struct Deferred {
  uint64_t seq;
  void* dst;
  const void* src;
  size_t n;
};
struct StreamState {
  uint64_t issued = 0, completed = 0;  // work sequence numbers: the last issued, the last complete
  int64_t launches = 0, work = 0, waits = 0;
  std::vector<Deferred> deferred;  // pinned-source copies not yet run, in issue order
};
struct StreamLog {
  std::map<const void*, StreamState> streams;  // by cudaStream_t (nullptr: the legacy stream)
  std::map<const unsigned char*, size_t> pinned;  // cudaMallocHost blocks
  bool pending = false;
};
inline StreamLog& stream_log() {
  static auto* l = new StreamLog;  // never destroyed (static destructors may still free blocks)
  return *l;
}
inline StreamState& stream_state(const void* s) { return stream_log().streams[s]; }
// The deferred copies up to `seq` on stream s run, in order.
inline void run_deferred(StreamState& st, uint64_t seq) {
  size_t i = 0;
  for (; i < st.deferred.size() && st.deferred[i].seq <= seq; ++i)
    std::memcpy(st.deferred[i].dst, st.deferred[i].src, st.deferred[i].n);
  st.deferred.erase(st.deferred.begin(), st.deferred.begin() + long(i));
}
// Work up to `seq` on stream s is complete (the host waited for it).
inline void complete(const void* s, uint64_t seq) {
  StreamState& st = stream_state(s);
  st.completed = std::max(st.completed, seq);
  run_deferred(st, seq);
}
// New work on stream s (after everything issued before it there): its sequence number.
inline uint64_t stream_work(const void* s) {
  StreamState& st = stream_state(s);
  ++st.work;
  run_deferred(st, st.issued);  // the stream reached this work: what it follows has run
  const uint64_t seq = ++st.issued;
  if (!stream_log().pending) st.completed = seq;
  return seq;
}
inline void stream_launch(const void* s) {
  stream_work(s);
  ++stream_state(s).launches;
}
inline bool is_pinned(const void* p) {
  auto& m = stream_log().pinned;
  auto it = m.upper_bound(static_cast<const unsigned char*>(p));
  return it != m.begin() && static_cast<const unsigned char*>(p) < std::prev(it)->first + std::prev(it)->second;
}
struct ScopedPendingEvents {  // the slow GPU above, for the object's lifetime
  bool saved;
  ScopedPendingEvents() : saved(stream_log().pending) { stream_log().pending = true; }
  ~ScopedPendingEvents() {
    for (auto& [s, st] : stream_log().streams) complete(s, st.issued);
    stream_log().pending = saved;
  }
};
struct Event {
  std::chrono::steady_clock::time_point t;
  const void* stream = nullptr;
  uint64_t seq = 0;  // the stream's work the event follows
};
}  // namespace hmla::emu

// ---- the runtime -----------------------------------------------------------------------------
enum cudaError_t { cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorNotReady = 600 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
using cudaStream_t = void*;
struct cudaDeviceProp {
  char name[256];
};
constexpr unsigned cudaStreamNonBlocking = 1;
inline const char* cudaGetErrorString(cudaError_t) { return "emulated CUDA error"; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaMalloc(void** p, size_t n) {  // poisoned, and registered for the schedule replay
  const size_t bytes = (n + 255) / 256 * 256;
  *p = std::aligned_alloc(256, bytes);
  if (!*p) return cudaErrorMemoryAllocation;
  ::hmla::emu::poison(*p, bytes);
  ::hmla::emu::allocations()[static_cast<unsigned char*>(*p)] = {bytes, true};
  return cudaSuccess;
}
inline cudaError_t cudaFree(void* p) {
  ::hmla::emu::allocations().erase(static_cast<unsigned char*>(p));
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaMallocHost(void** p, size_t n) {  // pinned host memory (not device memory)
  *p = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  if (!*p) return cudaErrorMemoryAllocation;
  ::hmla::emu::stream_log().pinned[static_cast<unsigned char*>(*p)] = n;
  return cudaSuccess;
}
inline cudaError_t cudaFreeHost(void* p) {
  ::hmla::emu::stream_log().pinned.erase(static_cast<unsigned char*>(p));
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind k, cudaStream_t st) {
  const uint64_t seq = ::hmla::emu::stream_work(st);
  if (k == cudaMemcpyHostToDevice && ::hmla::emu::stream_log().pending && ::hmla::emu::is_pinned(s))
    ::hmla::emu::stream_state(st).deferred.push_back({seq, d, s, n});
  else
    std::memcpy(d, s, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t st) {
  ::hmla::emu::stream_work(st);
  std::memset(p, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind k) { return cudaMemcpyAsync(d, s, n, k, nullptr); }
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {  // a handle of its own
  *s = new char;
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  ::hmla::emu::StreamState& st = ::hmla::emu::stream_state(s);
  ::hmla::emu::complete(s, st.issued);
  ::hmla::emu::stream_log().streams.erase(s);  // a later stream may get the address
  delete static_cast<char*>(s);
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  ::hmla::emu::complete(s, ::hmla::emu::stream_state(s).issued);
  return cudaSuccess;
}
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
using cudaEvent_t = ::hmla::emu::Event*;
constexpr unsigned cudaEventDisableTiming = 2;
inline cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new ::hmla::emu::Event();
  return cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  ::hmla::emu::StreamState& st = ::hmla::emu::stream_state(s);
  ++st.work;
  e->t = std::chrono::steady_clock::now();
  e->stream = s;
  e->seq = st.issued;
  return cudaSuccess;
}
inline cudaError_t cudaEventQuery(cudaEvent_t e) {
  return e->seq <= ::hmla::emu::stream_state(e->stream).completed ? cudaSuccess : cudaErrorNotReady;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  ::hmla::emu::complete(e->stream, e->seq);
  return cudaSuccess;
}
// The stream's later work follows the event's: it completes first (the emulated GPU's order).
inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  ::hmla::emu::complete(e->stream, e->seq);
  ::hmla::emu::stream_work(s);
  ++::hmla::emu::stream_state(s).waits;
  return cudaSuccess;
}
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  *ms = std::chrono::duration<float, std::milli>(b->t - a->t).count();
  return cudaSuccess;
}
enum cublasStatus_t { CUBLAS_STATUS_SUCCESS = 0 };
using cublasLtHandle_t = void*;
inline cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  *h = nullptr;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
