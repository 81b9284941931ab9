// The fault guard (mpcache issue 13, item 1; DESIGN §4, §8): copies from or to
// another process's memory must not kill the server when that memory vanishes
// under them. A worker can `ftruncate` its registered shared-memory segment
// after REGISTER; every page of our MAP_SHARED mapping past the new end then
// raises SIGBUS on access (SIGSEGV when the range was unmapped). Unguarded,
// that signal's default action ends the whole server and every other worker's
// context with it.
//
// How it works:
//   * One process-wide SIGBUS + SIGSEGV handler, installed once (InstallFaultGuard,
//     from the addon's Init on the JS thread) with SA_SIGINFO | SA_ONSTACK. The
//     actions in place before it (Node/V8 install a SIGSEGV handler for
//     WebAssembly trap handling) are saved and chained to.
//   * A guarded region (RunGuarded) pushes a frame onto a thread-local chain:
//     a sigjmp_buf and the address range [lo, hi) of the mapping it copies.
//     The handler longjmps to the innermost frame of the faulting thread whose
//     range holds si_addr; any other fault (another thread, another address,
//     no guarded copy running) goes to the previous handler exactly as if this
//     one were not installed, so real bugs still crash (no blanket handler).
//   * The body of a guarded region is a plain copy loop (memcpy, SSE stream
//     stores, atomic touches): no locks, no allocation, no C++ object with a
//     destructor lives in the frames the longjmp discards, which is what makes
//     leaving them with siglongjmp sound.
//
// Each pool thread has its own chain, so concurrent faults on several copy
// threads are independent; frames nest on one thread. Cost on the hot path:
// a sigsetjmp without the signal mask (no system call) and two TLS stores
// per guarded region (one per mapping per copy job).
#pragma once

#include <setjmp.h>

#include <cstddef>
#include <cstdint>

namespace mpcache {

// What a guarded region saw when it faulted.
struct GuardedFault {
  int signo = 0;          // SIGBUS or SIGSEGV
  uintptr_t address = 0;  // si_addr: the faulting address, inside [lo, hi)
};

// Installs the handler once per process (idempotent, thread-safe). Also
// touches this thread's guard slot so its TLS is allocated outside a handler.
void InstallFaultGuard();

// Runs body(ctx) with faults inside [lo, lo + length) caught: true when the
// body completed, false (with *fault filled) when a SIGBUS or SIGSEGV at an
// address in that range ended it. `body` must be a plain copy loop with no
// objects needing destruction (see above). Works without InstallFaultGuard
// too, but then a fault is not caught.
bool RunGuarded(const void* lo, size_t length, void (*body)(void*), void* ctx, GuardedFault* fault);

// "SIGBUS", "SIGSEGV" or "signal <n>".
const char* SignalName(int signo);

}  // namespace mpcache
