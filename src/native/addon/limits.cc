// Process limits (see limits.h).
//
// raiseDescriptorLimit: the server budgets its descriptors (issue 24 item 11): every listener gets a cap that
// leaves headroom for the others and for mappings. The budget is taken from the soft RLIMIT_NOFILE after raising
// it to the hard limit (what a process may do without privilege). An infinite hard limit is capped at
// /proc/sys/fs/nr_open, the most the kernel lets setrlimit ask for.
//
// seedLibzmqRandom: libzmq 4.3's ROUTER starts its counter of generated routing ids at generate_random(), which is
// rand() twice — and libzmq never calls srand(), so every run of every server starts at the same id (006b8b4567).
// A peer that claims the id the ROUTER will generate next makes libzmq abort (router.cpp identify_peer →
// add_out_pipe's zmq_assert). Seeding rand() from getrandom(2) before the ROUTER is created makes the ids it
// generates unpredictable (32 bits: the low 31 bits of the first rand() and one bit of the second). libzmq is
// linked dynamically against the same libc as this addon (zeromq's prebuilt addon.node imports rand/srand from
// glibc), so this srand is the one its rand() reads.
#include "limits.h"

#include <sys/random.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common.h"

namespace mpcache {

namespace {

rlim_t NrOpen() {
  FILE* f = std::fopen("/proc/sys/fs/nr_open", "r");
  if (f == nullptr) return 1048576;
  unsigned long long v = 0;
  const int n = std::fscanf(f, "%llu", &v);
  std::fclose(f);
  return n == 1 && v > 0 ? static_cast<rlim_t>(v) : 1048576;
}

}  // namespace

Napi::Value RaiseDescriptorLimit(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) throw MakeError(env, ErrnoName(errno), "getrlimit", std::string("getrlimit(RLIMIT_NOFILE) failed: ") + std::strerror(errno));
  const rlim_t before = lim.rlim_cur;
  const rlim_t target = lim.rlim_max == RLIM_INFINITY ? NrOpen() : lim.rlim_max;
  if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur < target) {
    rlimit raised{target, lim.rlim_max};
    // A refusal (a sandbox that forbids it) keeps the soft limit: the budget is then taken from it.
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) lim.rlim_cur = target;
  }
  const auto asNumber = [&](rlim_t v) { return Napi::Number::New(env, v == RLIM_INFINITY ? kMaxSafeInteger : static_cast<double>(v)); };
  Napi::Object out = Napi::Object::New(env);
  out.Set("soft", asNumber(lim.rlim_cur));
  out.Set("hard", asNumber(lim.rlim_max));
  out.Set("before", asNumber(before));
  return out;
}

Napi::Value SeedLibzmqRandom(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint32_t seed = 0;
  ssize_t n;
  do {
    n = getrandom(&seed, sizeof seed, 0);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof seed)) throw MakeError(env, ErrnoName(errno), "getrandom", std::string("getrandom failed: ") + std::strerror(errno));
  std::srand(seed);
  return Napi::Number::New(env, seed);
}

}  // namespace mpcache
