// Expert parallelism's exchange (hmla/dist/ep.h), on one rank (the default suite) and under
// `mpirun -np 4` (mpi.ep_exchange): every rank's rows are a function of (sender, expert, row,
// column), so each rank knows what every other sends and checks, exactly, that its experts receive
// every sender's rows expert-major in rank order, that the inverse brings each rank's rows back in
// its own order, and the bytes on the wire. A reorder that kept the wire's sender-major order, or a
// return that skipped the inverse reorder, fails with R > 1 (the counts below are uneven, some zero);
// on one rank the exchange is the identity.
#include <gtest/gtest.h>

#include <vector>

#include "hmla/core/error.h"
#include "hmla/dist/ep.h"

namespace hmla {
namespace {

constexpr int64_t kE = 8, kW = 3;
// Where the rows live: the CPU here; the emulated CUDA device in test_ep_emu (tests/cuda/emu), where
// Comm's device path stages them through the host (that build has no NCCL: the collective itself is
// MPI's) and the reorders are device copies.
#ifdef HMLA_TEST_EP_ON_CUDA
constexpr Device kDev = Device::cuda;
#else
constexpr Device kDev = Device::cpu;
#endif

int64_t rows_of(int q, int64_t e) { return (q * 7 + e * 3) % 5; }  // some zero, all uneven
float value(int q, int64_t e, int64_t i, int64_t c) { return float(q * 10000 + e * 1000 + i * 10 + c); }

// What rank q sends: its rows per expert, in expert order.
Tensor sender_rows(int q) {
  std::vector<float> v;
  for (int64_t e = 0; e < kE; ++e)
    for (int64_t i = 0; i < rows_of(q, e); ++i)
      for (int64_t c = 0; c < kW; ++c) v.push_back(value(q, e, i, c));
  return Tensor::from_vector<float>({int64_t(v.size()) / kW, kW}, v);
}

TEST(EpExchange, RowsReachTheirExpertsInRankOrderAndComeBack) {
  Comm& ep = Comm::world();
  const int R = ep.size(), me = ep.rank();
  std::vector<int64_t> counts;
  for (int64_t e = 0; e < kE; ++e) counts.push_back(rows_of(me, e));
  const int64_t before = ep.bytes_sent();
  const EpPlan p = ep_plan(ep, counts);
  const int64_t El = kE / R;
  EXPECT_EQ(ep.bytes_sent() - before, (R - 1) * El * int64_t(sizeof(int64_t)));  // the counts
  for (int q = 0; q < R; ++q)
    for (int64_t j = 0; j < El; ++j) EXPECT_EQ(p.received[size_t(q * El + j)], rows_of(q, me * El + j));
  const Tensor mine = sender_rows(me).to(kDev);
  int64_t remote = 0;  // rows this rank sends to the others
  for (int64_t e = 0; e < kE; ++e)
    if (e / El != me) remote += rows_of(me, e);
  const int64_t mid = ep.bytes_sent();
  const Tensor got = ep_dispatch(ep, p, mine);
  EXPECT_EQ(ep.bytes_sent() - mid, remote * kW * int64_t(sizeof(float)));
  std::vector<float> want;  // expert-major: this rank's experts, each every sender's rows in rank order
  for (int64_t j = 0; j < El; ++j)
    for (int q = 0; q < R; ++q)
      for (int64_t i = 0; i < rows_of(q, me * El + j); ++i)
        for (int64_t c = 0; c < kW; ++c) want.push_back(value(q, me * El + j, i, c));
  ASSERT_EQ(got.numel(), int64_t(want.size()));
  EXPECT_EQ(got.device(), kDev);
  EXPECT_EQ(got.to_vector<float>(), want);
  const Tensor back = ep_return(ep, p, got);
  EXPECT_EQ(back.to_vector<float>(), mine.to_vector<float>());
}

TEST(EpExchange, RefusesBadCountsAndRows) {
  Comm& ep = Comm::world();
  EXPECT_THROW(ep_plan(ep, std::vector<int64_t>(kE, -1)), ShapeError);
  if (ep.size() > 1) {
    EXPECT_THROW(ep_plan(ep, std::vector<int64_t>(size_t(ep.size() + 1), 0)), ConfigError);
  }
  const EpPlan p = ep_plan(ep, std::vector<int64_t>(kE, 1));  // every rank: one row per expert
  EXPECT_THROW(ep_dispatch(ep, p, Tensor::zeros({kE + 1, kW}, DType::f32, kDev)), ShapeError);
  ep.barrier();
}

}  // namespace
}  // namespace hmla
