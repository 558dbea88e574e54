// The emulator's own checks, each shown catching the bug it is for (a test of the harness): small
// kernels written as CUDA (emulate.h is force-included), right and with a planted bug. A finding
// is recorded here (ScopedFindings) instead of aborting the process as it does in the other tests.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "check_util.h"
#include "hmla/core/allocator.h"
#include "hmla/core/cuda.h"
#include "hmla/core/tensor.h"
#include "hmla/ops/nn.h"
#include "mma.cuh"
#include "runtime.h"

namespace hmla {
namespace {

using emu::ScopedFindings;

// The schedule and poison tests count the replay's findings alone (HMLA_EMU_RACECHECK may be set).
struct EmulatorSchedules : ::testing::Test {
  emu::ScopedRacecheck off{false};
};
using EmulatorPoison = EmulatorSchedules;

constexpr int kN = 64;  // threads of the planted kernels' one block (two warps)

// ---- the planted kernels ----------------------------------------------------------------------

// out[t] = in[(t + 1) % n] through a shared tile: right only with the barrier between the
// tile's writes and the neighbour's read.
__global__ void rotate_via_shared(const float* in, float* out, bool with_barrier) {
  __shared__ float tile[kN];
  const int t = int(threadIdx.x);
  tile[t] = in[t];
  if (with_barrier) __syncthreads();
  out[t] = tile[(t + 1) % kN];
}

// out[0] = the sum of in[0..n): a tree reduction (fixed order), or every thread adding into one
// shared accumulator (the order is the schedule's: a race on a GPU, order-dependent bits here).
__global__ void block_sum(const float* in, float* out, bool racing) {
  __shared__ float part[kN];
  __shared__ float acc;
  const int t = int(threadIdx.x);
  if (racing) {
    if (t == 0) acc = 0.f;
    __syncthreads();
    acc += in[t];
    __syncthreads();
    if (t == 0) out[0] = acc;
    return;
  }
  part[t] = in[t];
  __syncthreads();
  for (int w = kN / 2; w > 0; w /= 2) {
    if (t < w) part[t] += part[t + w];
    __syncthreads();
  }
  if (t == 0) out[0] = part[0];
}

// out[i] = 2 in[i] for i < n, except (planted) the last element, which nobody writes.
__global__ void twice(const float* in, float* out, int n, bool skip_last) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n && !(skip_last && i == n - 1)) out[i] = 2.f * in[i];
}

// Block b writes out[b]; (planted) block b > 0 also reads out[b - 1]: blocks that talk through
// global memory without a grid-wide barrier, correct only in one block order.
__global__ void prefix_across_blocks(const float* in, float* out, bool chained) {
  if (threadIdx.x != 0) return;
  const int b = int(blockIdx.x);
  out[b] = in[b] + (chained && b > 0 ? out[b - 1] : 0.f);
}

// A shared histogram: every thread atomically counts into one of 4 bins (atomics are not races).
__global__ void histogram(const int* in, int* out) {
  __shared__ int bins[4];
  const int t = int(threadIdx.x);
  if (t < 4) bins[t] = 0;
  __syncthreads();
  atomicAdd(&bins[in[t] & 3], 1);
  __syncthreads();
  if (t < 4) out[t] = bins[t];
}

// Reads the block's dynamic shared memory without writing it (planted), or after writing it.
__global__ void read_dynamic_shared(float* out, bool write_first) {
  HMLA_DYNAMIC_SHARED(float, buf);
  const int t = int(threadIdx.x);
  if (write_first) buf[t] = float(t);
  __syncthreads();
  out[blockIdx.x * kN + t] = buf[t];
}

// Each thread copies 4 floats (16 bytes) of `in` into shared memory by cp.async and reads them
// back, after waiting for the copy (`wait`) or, the planted bug, before: then it reads the poison
// the tile held, as a GPU could read whatever was there. A barrier follows the wait, as in the kernels.
__global__ void copy_async_then_read(const float* in, float* out, bool wait) {
  HMLA_DYNAMIC_SHARED(float, buf);
  const int t = int(threadIdx.x);
  cuda::cp_async16(buf + 4 * t, in + 4 * t, true);
  cuda::cp_async_commit();
  if (wait) cuda::cp_async_wait<0>();
  __syncthreads();
  for (int i = 0; i < 4; ++i) out[4 * t + i] = buf[4 * t + i];
  cuda::cp_async_wait<0>();
}

// ---- device memory helpers --------------------------------------------------------------------

struct DeviceBuffer {  // a cudaMalloc block (the emulated one: poisoned, registered)
  void* p = nullptr;
  size_t bytes;
  explicit DeviceBuffer(size_t n) : bytes(n) { EXPECT_EQ(cudaMalloc(&p, n), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(p); }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

template <class T>
DeviceBuffer upload(const std::vector<T>& v) {
  DeviceBuffer d(v.size() * sizeof(T));
  cudaMemcpy(d.p, v.data(), d.bytes, cudaMemcpyHostToDevice);
  return d;
}

template <class T>
std::vector<T> download(const DeviceBuffer& d, size_t n) {
  std::vector<T> v(n);
  cudaMemcpy(v.data(), d.p, n * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

bool is_poison(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u == emu::kPoison;
}

// Values whose f32 sum depends on the order of the additions (mixed magnitudes).
std::vector<float> order_sensitive(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = (i % 3 == 0 ? 1e7f : 1.f) * (1.f + 0.013f * float(i)) * (i % 2 ? -1.f : 1.f);
  return v;
}

bool mentions(const std::vector<std::string>& found, const char* what) {
  for (const auto& f : found)
    if (f.find(what) != std::string::npos) return true;
  return false;
}

// ---- schedules --------------------------------------------------------------------------------

TEST_F(EmulatorSchedules, AMissingSyncthreadsIsFound) {
  std::vector<float> in(kN);
  for (int i = 0; i < kN; ++i) in[i] = float(i);
  const DeviceBuffer din = upload(in), dout(kN * sizeof(float));
  {
    ScopedFindings f;
    HMLA_LAUNCH(rotate_via_shared, dim3(1), dim3(kN), 0, nullptr, din.as<float>(), dout.as<float>(), true);
    EXPECT_TRUE(f.found.empty()) << f.found[0];
    const auto got = download<float>(dout, kN);
    for (int i = 0; i < kN; ++i) EXPECT_EQ(got[i], in[(i + 1) % kN]);
  }
  ScopedFindings f;
  HMLA_LAUNCH(rotate_via_shared, dim3(1), dim3(kN), 0, nullptr, din.as<float>(), dout.as<float>(), false);
  ASSERT_EQ(f.found.size(), 1u);
  EXPECT_TRUE(mentions(f.found, "kernel rotate_via_shared")) << f.found[0];
  EXPECT_TRUE(mentions(f.found, "under schedule reverse than under forward")) << f.found[0];
  // Under the first schedule (forward) each thread reads its neighbour's slot before the
  // neighbour ran: the poison, not a stale value.
  const auto got = download<float>(dout, kN);
  EXPECT_TRUE(is_poison(got[0]));
}

// What the emulator finds in block_sum on order-sensitive values: the tree reduction (must be
// nothing), then the racing accumulator, under the schedules and racecheck setting in force.
std::vector<std::string> block_sum_findings() {
  const std::vector<float> in = order_sensitive(kN);
  const DeviceBuffer din = upload(in), dout(sizeof(float));
  {
    ScopedFindings f;
    HMLA_LAUNCH(block_sum, dim3(1), dim3(kN), 0, nullptr, din.as<float>(), dout.as<float>(), false);
    EXPECT_TRUE(f.found.empty()) << f.found[0];
  }
  ScopedFindings f;
  HMLA_LAUNCH(block_sum, dim3(1), dim3(kN), 0, nullptr, din.as<float>(), dout.as<float>(), true);
  return f.found;
}

TEST_F(EmulatorSchedules, ARacingAccumulatorIsFoundAndATreeReductionIsNot) {
  const std::vector<std::string> found = block_sum_findings();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_TRUE(mentions(found, "kernel block_sum")) << found[0];
}

TEST_F(EmulatorSchedules, BlocksThatTalkThroughGlobalMemoryAreFound) {
  const int blocks = 8;
  std::vector<float> in(blocks, 1.f);
  const DeviceBuffer din = upload(in), dout(blocks * sizeof(float));
  {
    ScopedFindings f;
    HMLA_LAUNCH(prefix_across_blocks, dim3(blocks), dim3(32), 0, nullptr, din.as<float>(), dout.as<float>(), false);
    EXPECT_TRUE(f.found.empty()) << f.found[0];
  }
  ScopedFindings f;
  HMLA_LAUNCH(prefix_across_blocks, dim3(blocks), dim3(32), 0, nullptr, din.as<float>(), dout.as<float>(), true);
  ASSERT_EQ(f.found.size(), 1u);
  EXPECT_TRUE(mentions(f.found, "kernel prefix_across_blocks")) << f.found[0];
}

TEST_F(EmulatorSchedules, EveryScheduleRunsAndAListIsValidated) {
  // Each named order is a different permutation of a block's threads (and, but for
  // interleaved, of its blocks), and a bad list is a one-line error naming the item.
  const auto s = emu::parse_schedules("forward,reverse,interleaved,shuffled:7");
  ASSERT_EQ(s.size(), 4u);
  std::vector<std::vector<unsigned>> orders;
  for (const auto& sched : s) {
    std::vector<unsigned> o;
    std::minstd_rand rng(sched.seed);
    emu::order_fibers(o, kN, sched, rng);
    std::vector<unsigned> sorted = o;
    std::sort(sorted.begin(), sorted.end());
    for (unsigned i = 0; i < unsigned(kN); ++i) ASSERT_EQ(sorted[i], i) << sched.name;
    orders.push_back(o);
  }
  for (size_t i = 0; i < orders.size(); ++i)
    for (size_t j = i + 1; j < orders.size(); ++j) EXPECT_NE(orders[i], orders[j]) << s[i].name << " " << s[j].name;
  EXPECT_EQ(orders[2][1], 32u);  // interleaved: lane 0 of warp 1 second
  EXPECT_EXIT(emu::parse_schedules("forward,sideways"), ::testing::ExitedWithCode(2), "unknown schedule 'sideways'");
  EXPECT_EXIT(emu::parse_schedules("reverse:3"), ::testing::ExitedWithCode(2), "only shuffled takes a seed");
  EXPECT_EXIT(emu::parse_schedules("forward,"), ::testing::ExitedWithCode(2), "unknown schedule ''");
}

// ---- poison -----------------------------------------------------------------------------------

TEST_F(EmulatorPoison, AnOutputElementLeftUnwrittenReadsAsNaNAndFailsTheRule) {
  const int n = 100;
  std::vector<float> in(n);
  for (int i = 0; i < n; ++i) in[i] = float(i) - 50.f;
  const DeviceBuffer din = upload(in), dout(n * sizeof(float));
  HMLA_LAUNCH(twice, dim3(2), dim3(kN), 0, nullptr, din.as<float>(), dout.as<float>(), n, true);
  const auto got = download<float>(dout, n);
  EXPECT_TRUE(is_poison(got[n - 1]));
  EXPECT_TRUE(std::isnan(bf16_to_f32(bf16{uint16_t(emu::kPoison & 0xFFFF)})));  // a bf16 NaN too
  // The case tables' error measure (check_util.h) fails a row with an unwritten element.
  std::vector<double> ref(n);
  for (int i = 0; i < n; ++i) ref[i] = 2.0 * in[i];
  EXPECT_EQ(cuda_check::max_err(got, ref), INFINITY);
  HMLA_LAUNCH(twice, dim3(2), dim3(kN), 0, nullptr, din.as<float>(), dout.as<float>(), n, false);
  EXPECT_EQ(cuda_check::max_err(download<float>(dout, n), ref), 0.0);
}

TEST_F(EmulatorPoison, TheCachingAllocatorHandsOutPoisonNotTheLastTensor) {
  const void* where = nullptr;
  {
    const Tensor a = Tensor::from_vector<float>({256}, std::vector<float>(256, 3.f)).to(Device::cuda);
    where = a.raw_data();
  }  // back to the allocator's cache
  const Tensor b = Tensor::empty({256}, DType::f32, Device::cuda);
  ASSERT_EQ(b.raw_data(), where) << "the cache did not hand the block out again";
  for (float x : b.to(Device::cpu).to_vector<float>()) ASSERT_TRUE(is_poison(x));
}

TEST_F(EmulatorPoison, SharedMemoryStartsPoisonedInEveryBlock) {
  const int blocks = 3;
  const DeviceBuffer dout(blocks * kN * sizeof(float));
  HMLA_LAUNCH(read_dynamic_shared, dim3(blocks), dim3(kN), kN * sizeof(float), nullptr, dout.as<float>(), true);
  auto got = download<float>(dout, blocks * kN);
  for (int i = 0; i < blocks * kN; ++i) ASSERT_EQ(got[i], float(i % kN));
  // The next launch's blocks (and each block after the first) see poison, not what the last
  // block left there.
  HMLA_LAUNCH(read_dynamic_shared, dim3(blocks), dim3(kN), kN * sizeof(float), nullptr, dout.as<float>(), false);
  got = download<float>(dout, blocks * kN);
  for (float x : got) ASSERT_TRUE(is_poison(x));
  // Static __shared__ too: rotate_via_shared's tile, read before written, in a second launch.
  std::vector<float> in(kN, 1.f);
  const DeviceBuffer din = upload(in), dout2(kN * sizeof(float));
  const emu::ScopedSchedules forward_only("forward");
  HMLA_LAUNCH(rotate_via_shared, dim3(1), dim3(kN), 0, nullptr, din.as<float>(), dout2.as<float>(), true);
  HMLA_LAUNCH(rotate_via_shared, dim3(1), dim3(kN), 0, nullptr, din.as<float>(), dout2.as<float>(), false);
  EXPECT_TRUE(is_poison(download<float>(dout2, kN)[0]));
}

// cp.async lands at the wait (mma.cuh, emulate.h): a tile read before its thread waited for the
// copies reads poison, so a kernel that forgets the wait fails its table instead of reading the
// data the emulator happened to copy at once.
TEST_F(EmulatorPoison, AnAsyncCopyIsInSharedMemoryOnlyAfterItsWait) {
  std::vector<float> in(4 * kN);
  for (int i = 0; i < 4 * kN; ++i) in[i] = float(i);
  const DeviceBuffer din = upload(in), dout(4 * kN * sizeof(float));
  HMLA_LAUNCH(copy_async_then_read, dim3(1), dim3(kN), 4 * kN * sizeof(float), nullptr, din.as<float>(),
              dout.as<float>(), true);
  auto got = download<float>(dout, 4 * kN);
  for (int i = 0; i < 4 * kN; ++i) ASSERT_EQ(got[i], float(i));
  HMLA_LAUNCH(copy_async_then_read, dim3(1), dim3(kN), 4 * kN * sizeof(float), nullptr, din.as<float>(),
              dout.as<float>(), false);
  got = download<float>(dout, 4 * kN);
  for (float x : got) ASSERT_TRUE(is_poison(x));
}

// ---- hmla's counters of host cost (cuda_counters) ----------------------------------------------

TEST(CudaCounters, OnlyAReadBackWaitsForTheStream) {
  const Tensor h = Tensor::from_vector<float>({64}, std::vector<float>(64, 1.f));
  CudaCounters c0 = cuda_counters();
  const Tensor d = h.to(Device::cuda);  // an upload: stream work, no wait
  CudaCounters c = cuda_counters() - c0;
  EXPECT_EQ(c.syncs, 0);
  EXPECT_EQ(c.h2d_bytes, 64 * 4);
  c0 = cuda_counters();
  Tensor d2 = Tensor::empty({64}, DType::f32, Device::cuda);  // device to device
  allocator(Device::cuda).copy(d2.raw_data(), Device::cuda, d.raw_data(), Device::cuda, 64 * 4);
  c = cuda_counters() - c0;
  EXPECT_EQ(c.syncs, 0);
  EXPECT_EQ(c.d2d_bytes, 64 * 4);
  c0 = cuda_counters();
  const std::vector<float> back = d2.to(Device::cpu).to_vector<float>();  // the host reads: one wait
  c = cuda_counters() - c0;
  EXPECT_EQ(c.syncs, 1);
  EXPECT_EQ(c.d2h_bytes, 64 * 4);
  EXPECT_EQ(back, std::vector<float>(64, 1.f));
}

// An upload through the one entry for copies (Tensor::to goes there too), into a tensor of its size.
Tensor upload_floats(const std::vector<float>& h) {
  Tensor d = Tensor::empty({int64_t(h.size())}, DType::f32, Device::cuda);
  allocator(Device::cuda).copy(d.raw_data(), Device::cuda, h.data(), Device::cpu, h.size() * sizeof(float));
  return d;
}

TEST(CudaCounters, UploadsWaitForNothingInTheSteadyState) {
  const std::vector<float> h(64, 1.f);
  CudaCounters c0 = cuda_counters();
  for (int i = 0; i < 200; ++i) upload_floats(h);
  CudaCounters c = cuda_counters() - c0;
  EXPECT_EQ(c.syncs, 0);
  EXPECT_EQ(c.h2d_bytes, 200 * 64 * 4);
  // On a GPU that never catches up before the host waits, the pool's buffers are all in flight
  // after kStageBuffers uploads; each further one waits for the oldest (a counted sync), and a
  // read-back (which waits for the stream) frees them all again.
  const emu::ScopedPendingEvents slow;
  const int n = int(cuda::kStageBuffers);
  c0 = cuda_counters();
  for (int i = 0; i < n; ++i) upload_floats(h);
  EXPECT_EQ((cuda_counters() - c0).syncs, 0);
  for (int i = 0; i < 3; ++i) upload_floats(h);
  EXPECT_EQ((cuda_counters() - c0).syncs, 3);
  const Tensor d = upload_floats(h);
  EXPECT_EQ(d.to(Device::cpu).to_vector<float>(), h);
  c0 = cuda_counters();
  for (int i = 0; i < n; ++i) upload_floats(h);
  EXPECT_EQ((cuda_counters() - c0).syncs, 0);
}

// The staging copy: an upload's bytes are what the host held at the call, whatever the host
// writes next, also when the upload spans more staging buffers than the pool has and the GPU
// reads each buffer only when the host waits (pending events: a buffer written again before its
// copy ran would upload the later bytes).
TEST(CudaCounters, AnUploadsBytesArriveIntactWhateverTheHostWritesNext) {
  const emu::ScopedPendingEvents slow;
  const int64_t chunks = int64_t(cuda::kStageBuffers) + 3;
  const size_t n = size_t(chunks - 1) * cuda::kStageBytes / sizeof(float) + 100;  // a partial last chunk
  std::vector<float> h(n), first(n), second(n);
  for (size_t i = 0; i < n; ++i) first[i] = float(i % 1000), second[i] = -float(i % 777);
  h = first;
  const CudaCounters c0 = cuda_counters();
  const Tensor a = upload_floats(h);
  EXPECT_EQ((cuda_counters() - c0).syncs, chunks - int64_t(cuda::kStageBuffers));  // the pool ran out, exactly
  h = second;  // the host's next use of its buffer
  const Tensor b = upload_floats(h);
  std::fill(h.begin(), h.end(), 7.f);
  EXPECT_EQ(a.to(Device::cpu).to_vector<float>(), first);
  EXPECT_EQ(b.to(Device::cpu).to_vector<float>(), second);
}

// ---- streams (ScopedCudaStream) and the allocator across streams ------------------------------

struct TestStream {  // an emulated stream of the test's own
  cudaStream_t s = nullptr;
  TestStream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess); }
  ~TestStream() { cudaStreamDestroy(s); }
  uintptr_t id() const { return reinterpret_cast<uintptr_t>(s); }
};

// What the streams were given so far (launches, all work), as the emulator logged it.
struct StreamWork {
  std::map<const void*, emu::StreamState> at = emu::stream_log().streams;
  // Since this snapshot: work on s, and on every other stream.
  int64_t work_on(const void* s) const { return emu::stream_state(s).work - base(s).work; }
  int64_t launches_on(const void* s) const { return emu::stream_state(s).launches - base(s).launches; }
  int64_t waits_on(const void* s) const { return emu::stream_state(s).waits - base(s).waits; }
  int64_t work_elsewhere(const void* s) const {
    int64_t n = 0;
    for (const auto& [k, st] : emu::stream_log().streams)
      if (k != s) n += st.work - base(k).work;
    return n;
  }
  emu::StreamState base(const void* s) const {
    auto it = at.find(s);
    return it == at.end() ? emu::StreamState{} : it->second;
  }
};

// Upload, memset, a product, a strided copy kernel, an elementwise kernel, frees and a read-back.
std::vector<float> some_device_work() {
  std::vector<float> ha(8 * 4);
  for (size_t i = 0; i < ha.size(); ++i) ha[i] = float(i % 5);
  const Tensor a = Tensor::from_vector<float>({8, 4}, ha).to(Device::cuda);
  const Tensor w = Tensor::zeros({4, 6}, DType::f32, Device::cuda);
  const Tensor y = Tensor::empty({8, 6}, DType::f32, Device::cuda);
  matmul(a, Trans::no, w, Trans::no, y);
  const Tensor t = a.transpose(0, 1).clone(), u = Tensor::empty({4, 8}, DType::f32, Device::cuda);
  add(t, t, u);
  return u.to(Device::cpu).to_vector<float>();
}

TEST(CudaStreams, EverythingInAScopeGoesToItsStream) {
  const TestStream side, inner;
  const StreamWork w0;
  const CudaCounters c0 = cuda_counters();
  {
    const ScopedCudaStream on(side.id());
    some_device_work();
  }
  const CudaCounters c = cuda_counters() - c0;
  EXPECT_GT(c.launches, 0);
  EXPECT_EQ(w0.launches_on(side.s), c.launches);  // every kernel and product hmla counted
  EXPECT_EQ(w0.work_elsewhere(side.s), 0);        // and every copy, memset and event: none elsewhere
  EXPECT_GT(w0.work_on(side.s), c.launches);
  // Scopes nest, and closing one restores the one outside; with none open, hmla's own stream.
  const StreamWork w1;
  {
    const ScopedCudaStream on(side.id());
    {
      const ScopedCudaStream in(inner.id());
      some_device_work();
    }
    EXPECT_EQ(w1.work_on(side.s), 0);
    EXPECT_GT(w1.work_on(inner.s), 0);
    const int64_t on_inner = w1.work_on(inner.s);
    some_device_work();
    EXPECT_EQ(w1.work_on(inner.s), on_inner);
    EXPECT_GT(w1.work_on(side.s), 0);
  }
  const StreamWork w2;
  some_device_work();
  EXPECT_EQ(w2.work_on(side.s) + w2.work_on(inner.s), 0);
  EXPECT_GT(w2.work_elsewhere(side.s), 0);
}

// A block freed by work on stream A and handed to work on stream B: B waits (on the device) for
// A's work up to the free; reused on A itself, it needs no wait. Seen both in the calls the
// emulator logged and in the bytes: on the slow GPU, A's upload into the block has not run when B
// gets the block, and without the wait it would land over what B wrote.
TEST(CudaAllocator, ABlockFreedOnOneStreamIsWrittenByAnotherOnlyAfterItsWork) {
  const TestStream A, B;
  const int64_t n = 12345;  // a size no other test leaves in the cache
  const std::vector<float> ones(size_t(n), 1.f);
  void* where = nullptr;
  Tensor y;
  {
    const emu::ScopedPendingEvents slow;
    {
      const ScopedCudaStream on(A.id());
      where = upload_floats(ones).raw_data();  // freed on A, its upload still pending
      const StreamWork w;
      ASSERT_EQ(upload_floats(ones).raw_data(), where);  // the same stream takes it back: no wait
      EXPECT_EQ(w.waits_on(A.s), 0);
    }
    const StreamWork w;
    const ScopedCudaStream on(B.id());
    y = Tensor::zeros({n}, DType::f32, Device::cuda);
    ASSERT_EQ(y.raw_data(), where) << "the cache did not hand the block out again";
    EXPECT_EQ(w.waits_on(B.s), 1);
    EXPECT_EQ(w.work_on(A.s), 0);
  }  // every stream's work completes
  EXPECT_EQ(y.to(Device::cpu).to_vector<float>(), std::vector<float>(size_t(n), 0.f));
}

// ---- racecheck --------------------------------------------------------------------------------

TEST(EmulatorRacecheck, TwoWritesOfOneSharedByteBetweenBarriersAreFound) {
  const emu::ScopedSchedules forward_only("forward");  // racecheck alone, no schedule replay
  const emu::ScopedRacecheck on;
  const std::vector<std::string> found = block_sum_findings();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_TRUE(mentions(found, "racecheck: kernel block_sum, block (0, 0, 0): threads ")) << found[0];
  EXPECT_TRUE(mentions(found, "both write static shared byte")) << found[0];
}

TEST(EmulatorRacecheck, AtomicsAreNotRacesAndTheirCountsAreExact) {
  std::vector<int> in(kN);
  for (int i = 0; i < kN; ++i) in[i] = i * 7;
  const DeviceBuffer din = upload(in), dout(4 * sizeof(int));
  const emu::ScopedRacecheck on;
  ScopedFindings f;
  HMLA_LAUNCH(histogram, dim3(1), dim3(kN), 0, nullptr, din.as<int>(), dout.as<int>());
  EXPECT_TRUE(f.found.empty()) << f.found[0];
  const auto got = download<int>(dout, 4);
  for (int b = 0; b < 4; ++b) EXPECT_EQ(got[b], kN / 4);
}

}  // namespace
}  // namespace hmla
