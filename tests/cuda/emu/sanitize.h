// The SIMT emulator's checks of what a GPU would get wrong (emulate.h's header comment lists
// them; docs/testing.md explains what each covers): findings, poison, the device memory registry
// the schedule replay compares, the schedules, and racecheck's shadow of shared memory.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

// The bounds of the static __shared__ variables (emulate.h puts them in this section); the
// linker defines them when the section exists. Weak, so that a program without one still links.
extern "C" {
extern unsigned char __start_hmla_emu_shared[] __attribute__((weak));
extern unsigned char __stop_hmla_emu_shared[] __attribute__((weak));
}

namespace hmla::emu {

// ---- findings --------------------------------------------------------------------------------
// By default a finding is printed and the process aborts (the test fails with the message); a
// test of the emulator itself installs a recorder (ScopedFindings).
inline std::function<void(const std::string&)>& finding_handler() {
  static std::function<void(const std::string&)> h = [](const std::string& m) {
    std::fprintf(stderr, "emulator: %s\n", m.c_str());
    std::fflush(stderr);
    std::abort();
  };
  return h;
}
inline void report(const std::string& m) { finding_handler()(m); }

struct ScopedFindings {  // records findings instead of aborting, for its lifetime
  std::vector<std::string> found;
  std::function<void(const std::string&)> saved;
  ScopedFindings() : saved(finding_handler()) {
    finding_handler() = [this](const std::string& m) { found.push_back(m); };
  }
  ~ScopedFindings() { finding_handler() = saved; }
};

[[noreturn]] inline void bad_setting(const std::string& m) {
  std::fprintf(stderr, "emulator: error: %s\n", m.c_str());
  std::exit(2);
}

// ---- poison ----------------------------------------------------------------------------------
// A quiet NaN as an f32 word and in each bf16 half, with a payload (0x41) that arithmetic never
// makes (x86 and CUDA produce 0x7FC00000/0xFFC00000 and bf16 0x7FC0/0xFFC0); as an int32 it is
// -4063295, an index out of every range.
constexpr uint32_t kPoison = 0xFFC1FFC1u;
inline void poison(void* p, size_t n) {
  auto* b = static_cast<unsigned char*>(p);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) std::memcpy(b + i, &kPoison, 4);
  for (; i < n; ++i) b[i] = (i & 1) ? 0xFF : 0xC1;  // the little-endian bytes of kPoison
}

struct Region {
  unsigned char* p;
  size_t n;
};
inline Region static_shared() {
  if (!__start_hmla_emu_shared) return {nullptr, 0};
  return {__start_hmla_emu_shared, size_t(__stop_hmla_emu_shared - __start_hmla_emu_shared)};
}

// ---- device memory ---------------------------------------------------------------------------
// Every cudaMalloc block (address -> bytes, and whether it holds a tensor: the caching allocator
// says when it keeps a freed block and hands it out again). The live ones are what a launch may
// write, so what the schedule replay saves, restores and compares.
struct Block {
  size_t bytes = 0;
  bool live = true;
};
inline std::map<unsigned char*, Block>& allocations() {
  // Never destroyed: the CUDA allocator's cache is freed by a static destructor that may run after.
  static auto* m = new std::map<unsigned char*, Block>;
  return *m;
}
// The caching allocator keeps (live = false) or hands out again (true) block p: poisoned either
// way, so that a kernel reading a freed tensor or a new tensor's unwritten bytes reads NaN.
inline void set_live(void* p, bool live) {
  auto it = allocations().find(static_cast<unsigned char*>(p));
  if (it == allocations().end()) return;
  it->second.live = live;
  poison(p, it->second.bytes);
}

using Image = std::vector<std::vector<unsigned char>>;  // the live blocks' bytes, in address order
inline Image save_device() {
  Image im;
  for (auto& [p, b] : allocations())
    if (b.live) im.emplace_back(p, p + b.bytes);
  return im;
}
inline void restore_device(const Image& im) {
  size_t i = 0;
  for (auto& [p, b] : allocations())
    if (b.live) std::memcpy(p, im[i++].data(), b.bytes);
}
// The first byte where device memory differs from `im`: "block A (n bytes) + offset: words".
inline std::string device_difference(const Image& im) {
  size_t i = 0;
  for (auto& [p, b] : allocations()) {
    if (!b.live) continue;
    const std::vector<unsigned char>& ref = im[i++];
    const size_t n = b.bytes;
    if (std::memcmp(p, ref.data(), n) == 0) continue;
    size_t off = 0, count = 0;
    while (p[off] == ref[off]) ++off;
    for (size_t j = off; j < n; ++j) count += p[j] != ref[j];
    const size_t w = off & ~size_t(3);
    uint32_t x = 0, y = 0;
    std::memcpy(&x, ref.data() + w, std::min<size_t>(4, n - w));
    std::memcpy(&y, p + w, std::min<size_t>(4, n - w));
    char buf[200];
    std::snprintf(buf, sizeof buf, "block %p (%zu bytes) + %zu: word 0x%08x vs 0x%08x (%zu bytes differ)",
                  static_cast<void*>(p), n, off, x, y, count);
    return buf;
  }
  return {};
}

// ---- schedules -------------------------------------------------------------------------------
// The order of a launch's blocks and, in each round, of the block's runnable fibers. forward and
// reverse put every pair of threads (and of blocks) in both orders; interleaved runs lane 0 of
// every warp, then lane 1, ...; shuffled draws both orders from a seed.
enum class Order { forward, reverse, interleaved, shuffled };
struct Schedule {
  Order order = Order::forward;
  unsigned seed = 1;
  std::string name = "forward";
};

inline std::vector<Schedule> parse_schedules(const std::string& text) {
  std::vector<Schedule> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    const std::string kind = item.substr(0, item.find(':'));
    Schedule s{Order::forward, 1, item};
    if (kind == "forward") s.order = Order::forward;
    else if (kind == "reverse") s.order = Order::reverse;
    else if (kind == "interleaved") s.order = Order::interleaved;
    else if (kind == "shuffled") s.order = Order::shuffled;
    else bad_setting("HMLA_EMU_SCHEDULES: unknown schedule '" + item + "' (forward, reverse, interleaved, shuffled[:seed])");
    if (item.size() > kind.size()) {
      const std::string seed = item.substr(kind.size() + 1);
      char* end = nullptr;
      const unsigned long v = std::strtoul(seed.c_str(), &end, 10);
      if (s.order != Order::shuffled || seed.empty() || *end || v == 0 || v > 0xFFFFFFFFul)
        bad_setting("HMLA_EMU_SCHEDULES: '" + item + "': only shuffled takes a seed, a positive integer");
      s.seed = unsigned(v);
    }
    out.push_back(s);
    at = comma + 1;
  }
  return out;
}

// The schedules every launch runs under: HMLA_EMU_SCHEDULES, default forward,reverse,shuffled.
inline std::vector<Schedule>& schedules() {
  static std::vector<Schedule> v = [] {
    const char* e = std::getenv("HMLA_EMU_SCHEDULES");
    return parse_schedules(e && *e ? e : "forward,reverse,shuffled");
  }();
  return v;
}

struct ScopedSchedules {  // a test's own list, for its lifetime
  std::vector<Schedule> saved;
  explicit ScopedSchedules(const std::string& text) : saved(schedules()) { schedules() = parse_schedules(text); }
  ~ScopedSchedules() { schedules() = saved; }
};

// The fibers' order for one round: n threads in warps of 32.
inline void order_fibers(std::vector<unsigned>& order, unsigned n, const Schedule& s, std::minstd_rand& rng) {
  order.resize(n);
  switch (s.order) {
    case Order::forward:
    case Order::shuffled:
      for (unsigned t = 0; t < n; ++t) order[t] = t;
      if (s.order == Order::shuffled) std::shuffle(order.begin(), order.end(), rng);
      break;
    case Order::reverse:
      for (unsigned t = 0; t < n; ++t) order[t] = n - 1 - t;
      break;
    case Order::interleaved: {
      unsigned i = 0;
      for (unsigned l = 0; l < 32; ++l)
        for (unsigned t = l; t < n; t += 32) order[i++] = t;
      break;
    }
  }
}

// ---- racecheck -------------------------------------------------------------------------------
// A shadow of the block's shared memory: for each watched byte, the thread that changed it in this barrier interval (or -1), and whether an atomic did.
// A thread's writes are found by comparing the shared bytes when it stops (at a barrier, or its
// end) with a copy taken when it started running: a write that leaves a byte's value unchanged is
// not seen (it cannot change what another thread reads).
inline bool& racecheck_enabled() {
  static bool on = [] {
    const char* e = std::getenv("HMLA_EMU_RACECHECK");
    return e && *e && std::strcmp(e, "0") != 0;
  }();
  return on;
}
struct ScopedRacecheck {
  bool saved;
  explicit ScopedRacecheck(bool on = true) : saved(racecheck_enabled()) { racecheck_enabled() = on; }
  ~ScopedRacecheck() { racecheck_enabled() = saved; }
};

// The shared bytes watched: the dynamic buffer, and the 64-byte chunks of the static section
// that the kernel has used in its earlier blocks (all of it in its first block: the section holds
// every kernel's variables, and comparing all of them at every fiber switch is what makes
// racecheck slow). A variable that only a later block first touches is watched from then on.
struct Shadow {
  static constexpr size_t kChunk = 64;
  struct Watched {
    unsigned char* p;
    size_t n, at;  // at: its offset in the shadow arrays
    bool dynamic;
  };
  std::vector<Watched> watch;
  std::vector<unsigned char> copy;  // the watched bytes when the running thread started
  std::vector<int> owner;           // per byte: the thread that changed it this interval, or -1
  std::vector<unsigned char> atomic;
  bool reported = false;

  static std::map<std::string, std::vector<bool>>& static_use() {  // kernel -> chunks it used
    static std::map<std::string, std::vector<bool>> m;
    return m;
  }
  void begin_block(const char* kernel, Region dyn, Region stat) {
    watch.clear();
    size_t at = 0;
    auto add = [&](unsigned char* p, size_t n, bool d) {
      watch.push_back({p, n, at, d});
      at += n;
    };
    if (dyn.n) add(dyn.p, dyn.n, true);
    const auto used = static_use().find(kernel);
    for (size_t c = 0; c * kChunk < stat.n;) {
      if (used != static_use().end() && !used->second[c]) {
        ++c;
        continue;
      }
      size_t e = c + 1;
      while (e * kChunk < stat.n && (used == static_use().end() || used->second[e])) ++e;
      add(stat.p + c * kChunk, std::min(e * kChunk, stat.n) - c * kChunk, false);
      c = e;
    }
    owner.assign(at, -1);
    atomic.assign(at, 0);
    copy.resize(at);
  }
  void end_block(const char* kernel, Region stat) {  // learn the static chunks this block used
    std::vector<bool>& used = static_use()[kernel];
    used.resize((stat.n + kChunk - 1) / kChunk, false);
    for (size_t c = 0; c < used.size(); ++c) {
      const size_t lo = c * kChunk, hi = std::min(lo + kChunk, stat.n);
      for (size_t i = lo; i < hi && !used[c]; ++i) used[c] = stat.p[i] != ((i & 1) ? 0xFF : 0xC1);
    }
  }
  void new_interval() {
    std::fill(owner.begin(), owner.end(), -1);
    std::fill(atomic.begin(), atomic.end(), 0);
  }
  void thread_runs() {
    for (const Watched& w : watch) std::memcpy(copy.data() + w.at, w.p, w.n);
  }
  void mark_atomic(const void* p, size_t n) {
    auto* b = static_cast<const unsigned char*>(p);
    for (const Watched& w : watch)
      if (b >= w.p && b + n <= w.p + w.n) std::fill_n(atomic.begin() + w.at + (b - w.p), n, 1);
  }
  // The running thread `t` stops: account its changes; a byte another thread changed in this
  // interval is a write-write race (reported once per launch).
  void thread_stops(int t, const char* kernel, unsigned bx, unsigned by, unsigned bz) {
    for (const Watched& w : watch) {
      if (std::memcmp(w.p, copy.data() + w.at, w.n) == 0) continue;
      for (size_t i = 0; i < w.n; ++i) {
        if (w.p[i] == copy[w.at + i] || atomic[w.at + i]) continue;
        int& o = owner[w.at + i];
        if (o >= 0 && o != t && !reported) {
          reported = true;
          const Region stat = static_shared();
          const size_t off = w.dynamic ? i : size_t(w.p - stat.p) + i;
          char buf[240];
          std::snprintf(buf, sizeof buf,
                        "racecheck: kernel %s, block (%u, %u, %u): threads %d and %d both write %s shared byte %zu "
                        "between two barriers",
                        kernel, bx, by, bz, o, t, w.dynamic ? "dynamic" : "static", off);
          report(buf);
        }
        o = t;
      }
    }
  }
};

}  // namespace hmla::emu
