// Process groups (hmla/dist/comm.h): MPI when the build has it and the process runs under
// mpirun, else one rank whose collectives are the identity; device buffers go through NCCL.
#include "hmla/dist/comm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <vector>

#include "hmla/core/error.h"

#ifdef HMLA_HAVE_MPI
#include <mpi.h>
#endif
#ifdef HMLA_HAVE_NCCL
#include "nccl.h"
#endif

namespace hmla {

namespace {
// Launched by an MPI launcher (Open MPI, MPICH/PMI, Slurm's PMI)?
bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
}
constexpr int64_t kChunk = int64_t(1) << 30;  // MPI counts are int
}  // namespace

#ifdef HMLA_HAVE_MPI
struct Comm::Handle {
  MPI_Comm comm = MPI_COMM_NULL;
  bool owned = false;
#ifdef HMLA_HAVE_NCCL
  std::shared_ptr<nccl::Group> nccl;  // created by the first device collective
#endif
  ~Handle() {
    int fin = 0;
    MPI_Finalized(&fin);
#ifdef HMLA_HAVE_NCCL
    nccl.reset();
#endif
    if (owned && !fin) MPI_Comm_free(&comm);
  }
};
#else
struct Comm::Handle {};
#endif

namespace {
// A device buffer's bytes staged on the host (and back): the device path without NCCL.
[[maybe_unused]] std::vector<char> to_host(const void* p, int64_t nbytes) {
  std::vector<char> h(nbytes);
  device_copy(h.data(), Device::cpu, p, Device::cuda, nbytes);
  return h;
}
[[maybe_unused]] void to_device(void* p, const std::vector<char>& h) { device_copy(p, Device::cuda, h.data(), Device::cpu, h.size()); }
}  // namespace

bool Comm::nccl_built() {
#ifdef HMLA_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

Comm& Comm::world() {
  static Comm c = [] {
    Comm w;
#ifdef HMLA_HAVE_MPI
    if (!launched_by_mpi()) return w;
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      MPI_Init(nullptr, nullptr);
      std::atexit([] {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) MPI_Finalize();
      });
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &w.rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &w.size_);
    w.mpi_ = std::make_shared<Handle>();
    w.mpi_->comm = MPI_COMM_WORLD;
#endif
    return w;
  }();
  return c;
}

Comm& Comm::self() {
  static Comm c;
  return c;
}

Comm Comm::split(int color, int key) const {
  Comm c;
#ifdef HMLA_HAVE_MPI
  if (mpi_) {
    c.mpi_ = std::make_shared<Handle>();
    MPI_Comm_split(mpi_->comm, color, key, &c.mpi_->comm);
    c.mpi_->owned = true;
    MPI_Comm_rank(c.mpi_->comm, &c.rank_);
    MPI_Comm_size(c.mpi_->comm, &c.size_);
  }
#endif
  (void)color, (void)key;
  return c;
}

#ifdef HMLA_HAVE_NCCL
// The group's NCCL communicator, made by its first device collective (every rank makes it then).
nccl::Group& nccl_group(Comm::Handle& h, int rank, int size) {
  if (!h.nccl) h.nccl = nccl::create(&h.comm, rank, size);
  return *h.nccl;
}
#endif

void Comm::allgather(const void* send, void* recv, int64_t nbytes, Device dev) {
  if (size_ == 1) {
    if (recv != send) {
      if (dev == Device::cpu) std::memcpy(recv, send, nbytes);
      else device_copy(recv, dev, send, dev, nbytes);
    }
    return;
  }
  bytes_sent_ += (size_ - 1) * nbytes;
#ifdef HMLA_HAVE_MPI
  if (dev == Device::cuda) {
#ifdef HMLA_HAVE_NCCL
    nccl::allgather(nccl_group(*mpi_, rank_, size_), send, recv, nbytes);
#else
    std::vector<char> s = to_host(send, nbytes), r(nbytes * size_);
    allgather(s.data(), r.data(), nbytes);
    bytes_sent_ -= (size_ - 1) * nbytes;  // counted once
    to_device(recv, r);
#endif
    return;
  }
  HMLA_CHECK(nbytes < kChunk, ShapeError, "allgather of ", nbytes, " bytes per rank exceeds MPI's int count");
  MPI_Allgather(send, int(nbytes), MPI_BYTE, recv, int(nbytes), MPI_BYTE, mpi_->comm);
#endif
}

void Comm::reduce_scatter_sum(const float* send, float* recv, int64_t n, Device dev) {
  if (size_ == 1) {
    if (recv != send) {
      if (dev == Device::cpu) std::memcpy(recv, send, n * sizeof(float));
      else device_copy(recv, dev, send, dev, n * sizeof(float));
    }
    return;
  }
  bytes_sent_ += (size_ - 1) * n * int64_t(sizeof(float));
#ifdef HMLA_HAVE_MPI
  if (dev == Device::cuda) {
#ifdef HMLA_HAVE_NCCL
    nccl::reduce_scatter_sum(nccl_group(*mpi_, rank_, size_), send, recv, n);
#else
    std::vector<char> s = to_host(send, n * size_ * int64_t(sizeof(float))), r(n * sizeof(float));
    reduce_scatter_sum(reinterpret_cast<const float*>(s.data()), reinterpret_cast<float*>(r.data()), n);
    bytes_sent_ -= (size_ - 1) * n * int64_t(sizeof(float));
    to_device(recv, r);
#endif
    return;
  }
  HMLA_CHECK(n < kChunk, ShapeError, "reduce-scatter of ", n, " values per rank exceeds MPI's int count");
  MPI_Reduce_scatter_block(send, recv, int(n), MPI_FLOAT, MPI_SUM, mpi_->comm);
#endif
}

void Comm::alltoall(const void* send, void* recv, int64_t nbytes, Device dev) {
  alltoallv(send, std::vector<int64_t>(size_t(size_), nbytes), recv, std::vector<int64_t>(size_t(size_), nbytes), dev);
}

void Comm::alltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                     const std::vector<int64_t>& recv_bytes, Device dev) {
  HMLA_CHECK(int64_t(send_bytes.size()) == size_ && int64_t(recv_bytes.size()) == size_, ShapeError,
             "alltoallv: ", send_bytes.size(), " send and ", recv_bytes.size(), " receive counts for ", size_, " ranks");
  int64_t total_send = 0, total_recv = 0;
  for (int r = 0; r < size_; ++r) {
    HMLA_CHECK(send_bytes[size_t(r)] >= 0 && recv_bytes[size_t(r)] >= 0, ShapeError, "alltoallv: a negative count");
    total_send += send_bytes[size_t(r)], total_recv += recv_bytes[size_t(r)];
    if (r != rank_) bytes_sent_ += send_bytes[size_t(r)];
  }
  if (size_ == 1) {
    HMLA_CHECK(send_bytes[0] == recv_bytes[0], ShapeError, "alltoallv: one rank sends ", send_bytes[0],
               " bytes to itself and receives ", recv_bytes[0]);
    if (recv != send && send_bytes[0] > 0) {
      if (dev == Device::cpu) std::memcpy(recv, send, size_t(send_bytes[0]));
      else device_copy(recv, dev, send, dev, send_bytes[0]);
    }
    return;
  }
#ifdef HMLA_HAVE_MPI
  if (dev == Device::cuda) {
#ifdef HMLA_HAVE_NCCL
    nccl::alltoallv(nccl_group(*mpi_, rank_, size_), send, send_bytes.data(), recv, recv_bytes.data());
#else
    std::vector<char> s = to_host(send, total_send), r(static_cast<size_t>(total_recv));
    alltoallv(s.data(), send_bytes, r.data(), recv_bytes);
    for (int q = 0; q < size_; ++q)
      if (q != rank_) bytes_sent_ -= send_bytes[size_t(q)];  // counted once
    to_device(recv, r);
#endif
    return;
  }
  // MPI's counts and displacements are int: bytes as MPI_BYTE, each total under 2^31.
  HMLA_CHECK(total_send < kChunk && total_recv < kChunk, ShapeError, "alltoallv of ", total_send, " bytes sent and ",
             total_recv, " received exceeds MPI's int count");
  const size_t R = static_cast<size_t>(size_);
  std::vector<int> sc(R), sd(R), rc(R), rd(R);
  for (int r = 0, so = 0, ro = 0; r < size_; ++r) {
    sc[size_t(r)] = int(send_bytes[size_t(r)]), sd[size_t(r)] = so, so += sc[size_t(r)];
    rc[size_t(r)] = int(recv_bytes[size_t(r)]), rd[size_t(r)] = ro, ro += rc[size_t(r)];
  }
  MPI_Alltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE, mpi_->comm);
#else
  (void)total_send, (void)total_recv;
#endif
}

#ifdef HMLA_HAVE_MPI
// A SUM all-reduce in place: NCCL for device buffers (staged through the host without it), MPI in
// int-sized chunks for host buffers.
template <class T>
void allreduce_sum_in(Comm::Handle& h, int rank, int size, T* x, int64_t n, Device dev, MPI_Datatype type) {
  if (dev == Device::cuda) {
#ifdef HMLA_HAVE_NCCL
    nccl::allreduce_sum(nccl_group(h, rank, size), x, n);
#else
    std::vector<char> staged = to_host(x, n * int64_t(sizeof(T)));
    allreduce_sum_in(h, rank, size, reinterpret_cast<T*>(staged.data()), n, Device::cpu, type);
    to_device(x, staged);
#endif
    return;
  }
  for (int64_t off = 0; off < n; off += kChunk) {
    const int count = int(std::min<int64_t>(n - off, kChunk));
    MPI_Allreduce(MPI_IN_PLACE, x + off, count, type, MPI_SUM, h.comm);
  }
}
#endif

void Comm::allreduce_sum(float* x, int64_t n, Device dev) {
  if (!mpi_ || size_ == 1) return;
#ifdef HMLA_HAVE_MPI
  allreduce_sum_in(*mpi_, rank_, size_, x, n, dev, MPI_FLOAT);
#endif
}

#ifdef HMLA_HAVE_MPI
#define HMLA_ALLREDUCE(NAME, T, MPI_T, OP)                                     \
  void Comm::NAME(T* x, int64_t n) {                                          \
    if (!mpi_ || size_ == 1) return;                                          \
    for (int64_t off = 0; off < n; off += kChunk) {                           \
      const int count = int(std::min<int64_t>(n - off, kChunk));              \
      MPI_Allreduce(MPI_IN_PLACE, x + off, count, MPI_T, OP, mpi_->comm);     \
    }                                                                         \
  }
HMLA_ALLREDUCE(allreduce_sum, int64_t, MPI_INT64_T, MPI_SUM)
HMLA_ALLREDUCE(allreduce_max, double, MPI_DOUBLE, MPI_MAX)
#undef HMLA_ALLREDUCE

void Comm::allreduce_sum(double* x, int64_t n, Device dev) {
  if (!mpi_ || size_ == 1) return;
  allreduce_sum_in(*mpi_, rank_, size_, x, n, dev, MPI_DOUBLE);
}

void Comm::barrier() {
  if (mpi_) MPI_Barrier(mpi_->comm);
}

void Comm::abort(const std::string& msg, int code) {
  std::cerr << msg << std::endl;
  if (mpi_ && size_ > 1) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}
#else
void Comm::allreduce_sum(double*, int64_t, Device) {}
void Comm::allreduce_sum(int64_t*, int64_t) {}
void Comm::allreduce_max(double*, int64_t) {}
void Comm::barrier() {}
void Comm::abort(const std::string& msg, int code) {
  std::cerr << msg << std::endl;
  std::exit(code);
}
#endif

}  // namespace hmla
