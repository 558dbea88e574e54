// Checked size arithmetic (__builtin_*_overflow) and the memory budget (HMLA_MEMORY_BUDGET or
// physical memory from sysconf).
#include "hmla/core/size_check.h"


#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "hmla/core/error.h"

namespace hmla {

namespace {

std::string join_factors(const std::vector<SizeFactor>& factors) {
  std::ostringstream names, values;
  for (size_t i = 0; i < factors.size(); ++i) {
    if (factors[i].name.empty()) continue;  // a unit factor that says nothing
    const std::string& n = factors[i].name;
    const bool compound = n.find(' ') != std::string::npos && factors.size() > 1;
    const char* sep = names.tellp() > 0 ? " x " : "";
    names << sep << (compound ? "(" + n + ")" : n);
    values << sep << factors[i].value;
  }
  return names.str() + " = " + values.str();
}

}  // namespace

int64_t checked_add(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  HMLA_CHECK(!__builtin_add_overflow(a, b, &r), ConfigError, what, ": ", a, " + ", b, " overflows int64");
  return r;
}

int64_t checked_product(const std::vector<SizeFactor>& factors, const std::string& what) {
  int64_t r = 1;
  for (const SizeFactor& f : factors) {
    HMLA_CHECK(f.value >= 0, ConfigError, what, ": ", f.name, " = ", f.value, " is negative");
    HMLA_CHECK(!__builtin_mul_overflow(r, f.value, &r), ConfigError, what, ": ", join_factors(factors),
               " overflows int64");
  }
  return r;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 6) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

int64_t memory_budget(Device dev) {
  if (const char* env = std::getenv("HMLA_MEMORY_BUDGET"); env && *env) {
    const std::string v = env;
    if (v == "unlimited") return -1;
    char* end = nullptr;
    errno = 0;
    const double x = std::strtod(v.c_str(), &end);
    std::string suffix(end);
    if (!suffix.empty() && (suffix.back() == 'B' || suffix.back() == 'b')) suffix.pop_back();
    if (!suffix.empty() && (suffix.back() == 'i')) suffix.pop_back();
    const std::string units = "KMGT";
    double scale = 1;
    bool ok = end != v.c_str() && errno == 0 && x >= 0 && suffix.size() <= 1;
    if (ok && suffix.size() == 1) {
      const size_t u = units.find(char(std::toupper(static_cast<unsigned char>(suffix[0]))));
      ok = u != std::string::npos;
      for (size_t i = 0; ok && i <= u; ++i) scale *= 1024;
    }
    HMLA_CHECK(ok && x * scale < 9.2e18, ConfigError, "HMLA_MEMORY_BUDGET = '", v,
               "': use a byte count with an optional K, M, G or T suffix (e.g. 64G), or 'unlimited'");
    return static_cast<int64_t>(x * scale);
  }
  if (dev != Device::cpu) return allocator(dev).capacity();
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return -1;  // unknown: no limit rather than a wrong one
  int64_t bytes = 0;
  if (__builtin_mul_overflow(int64_t(pages), int64_t(page), &bytes)) return -1;
  return bytes;
}

std::string memory_budget_source(Device dev) {
  const char* env = std::getenv("HMLA_MEMORY_BUDGET");
  if (env && *env) return "HMLA_MEMORY_BUDGET";
  return dev == Device::cuda ? "the GPU's memory (HMLA_MEMORY_BUDGET overrides)"
                             : "physical memory (HMLA_MEMORY_BUDGET overrides)";
}

void MemoryPlan::add(const std::string& what, const std::vector<SizeFactor>& factors, int64_t elem_bytes) {
  std::vector<SizeFactor> all = factors;
  all.push_back({"bytes per value", elem_bytes});
  const int64_t bytes = checked_product(all, what);
  add_bytes(what, bytes, join_factors(factors) + " values of " + std::to_string(elem_bytes) + " bytes");
}

void MemoryPlan::add_bytes(const std::string& what, int64_t bytes, const std::string& detail) {
  items_.push_back({what + " (" + detail + ")", bytes});
  total_ = checked_add(total_, bytes, "the memory of " + what);
}

void MemoryPlan::check(const std::string& context, Device dev) const {
  const int64_t budget = memory_budget(dev);
  if (budget < 0 || total_ <= budget) return;
  const Item* big = &items_.front();
  for (const Item& it : items_)
    if (it.bytes > big->bytes) big = &it;
  throw ConfigError(context + " needs at least " + format_bytes(double(total_)) + ", more than the " +
                    format_bytes(double(budget)) + " of " + memory_budget_source(dev) + "; the largest part: " +
                    format_bytes(double(big->bytes)) + " for " + big->what);
}

}  // namespace hmla
