// Shared helpers of the mpcache native addon (DESIGN §4): JS errors that carry
// a string `code`, segment-name and number validation, and the process-wide
// mapping counters behind `stats()`.
//
// Every error this addon throws or rejects with is a JS Error with
//   code    the errno name ("ENOENT", "EEXIST", "EACCES" ...) for a failed
//           system call, or one of the addon's own codes:
//             EINVAL        a bad argument (segment name, byte count, argument type)
//             EINVAL_SIZE   the segment is shorter than the byte count asked for
//             EINVAL_RANGE  a copy range outside the mapping or the buffer
//             ECLOSED       a copy on a mapping that is closing or closed
//             EFAULT        a copy or prefault ended by a guarded SIGBUS/SIGSEGV on the
//                           mapping (the segment shrank below its mapped size; guard.h);
//                           the error also carries `segment`, `signal` and `offset`
//   call    the native call or entry point that failed (shm_open, mmap, gather ...)
// and a message that names the call, the segment and, for system errors,
// strerror.
#pragma once

#include <napi.h>

#include <atomic>
#include <cstdint>
#include <string>

#include <sys/stat.h>

namespace mpcache {

// Largest integer a JS number holds exactly (Number.MAX_SAFE_INTEGER).
constexpr double kMaxSafeInteger = 9007199254740991.0;

// A JS Error with `code` and `call` properties set.
Napi::Error MakeError(Napi::Env env, const std::string& code, const std::string& call,
                      const std::string& message);

// The error for a failed system call `call` on segment `name` with errno `err`:
// message "<call> of shared-memory segment <name> failed: <strerror> (<ERRNO>)".
Napi::Error ErrnoError(Napi::Env env, const std::string& call, const std::string& name, int err);

// The symbolic name of an errno value ("ENOENT"); "ERRNO_<n>" for unknown ones.
std::string ErrnoName(int err);

// Reads argument `index` of `fn` as a segment name: a non-empty string without
// '/' or NUL, not "." or "..", as listed in /dev/shm. Throws EINVAL otherwise.
std::string SegmentNameArg(const Napi::CallbackInfo& info, size_t index, const char* fn);

// Reads argument `index` of `fn` as a byte count: an integer number in
// [min, Number.MAX_SAFE_INTEGER]. Throws EINVAL otherwise.
uint64_t ByteCountArg(const Napi::CallbackInfo& info, size_t index, const char* fn, uint64_t min);

// A file's identity, "<st_dev>:<st_ino>": what a segment's name pointed at when it was mapped.
std::string FileIdentity(const struct stat& st);

// "/<name>", the argument shm_open and shm_unlink take.
inline std::string ShmPath(const std::string& name) { return "/" + name; }

// Process-wide counters, updated at mmap and munmap (every thread, every env).
struct MappingCounters {
  std::atomic<int64_t> openMappings{0};
  std::atomic<int64_t> mappedBytes{0};
  // Copies and prefaults ended by a guarded SIGBUS/SIGSEGV (guard.h), since the process started.
  std::atomic<int64_t> guardedFaults{0};
};
MappingCounters& Counters();

// Bulk work on the libuv pool (copies, prefaults, HMACs) runs at a lower CPU
// priority than the JS thread (nice +10 on the pool thread that runs it), so a
// multi-GiB transfer never starves the event loop that answers PING (DESIGN §4).
// Raising one's own niceness needs no privilege; a failure just leaves the
// priority as it was. Once per thread.
void LowerPoolThreadPriority();

}  // namespace mpcache
