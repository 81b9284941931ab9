// The fault guard: see guard.h for the contract (issue 13, item 1).
//
// Signal-safety of the handler: it reads one thread-local pointer (initial-exec
// TLS model: a %fs-relative load, no __tls_get_addr and so no lazy allocation
// inside the handler), compares addresses, writes into the guard frame and
// siglongjmps; on the chaining path it calls the saved handler or sigaction()
// and raise(), both async-signal-safe. No locks, no allocation, no stdio.
#include "guard.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstring>
#include <mutex>

namespace mpcache {

namespace {

// One guarded region on one thread; lives in RunGuarded's frame.
struct GuardFrame {
  sigjmp_buf env;
  uintptr_t lo;
  uintptr_t hi;
  GuardFrame* prev;
  // Written by the handler, read after siglongjmp lands in RunGuarded.
  volatile int signo;
  volatile uintptr_t address;
};

// The innermost guarded region of this thread, or null. initial-exec: the handler's read of it must not allocate
// (a dlopen'ed addon's default TLS model is global-dynamic, whose first access per thread may call malloc).
// One pointer fits glibc's static TLS surplus reserved for exactly this.
thread_local GuardFrame* tlsTop __attribute__((tls_model("initial-exec"))) = nullptr;

// The actions in place before ours; written once, before our handler is installed, so the handler reads them whole.
struct sigaction previousBus;
struct sigaction previousSegv;
std::once_flag installOnce;

// Not ours: do what would have happened without this handler.
//  * a previous SA_SIGINFO or plain handler (V8/Node's WebAssembly trap handler for SIGSEGV): call it. If it does
//    not handle the fault it restores its own predecessor and returns, and the fault re-executes;
//  * SIG_DFL (SIGBUS in Node) or SIG_IGN: restore SIG_DFL; return so that a kernel-generated fault re-executes
//    and takes the default action (terminate + core) at the faulting instruction, with its own address; a
//    signal sent by a process (si_code <= 0) is raised again and, being blocked in here, delivered on return.
void Chain(int signo, siginfo_t* info, void* uctx) {
  const struct sigaction& previous = signo == SIGBUS ? previousBus : previousSegv;
  if ((previous.sa_flags & SA_SIGINFO) != 0) {
    if (previous.sa_sigaction != nullptr) {
      previous.sa_sigaction(signo, info, uctx);
      return;
    }
  } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(signo);
    return;
  }
  if (previous.sa_handler == SIG_IGN && info->si_code <= 0) return;  // a sent signal that was ignored before
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(signo, &dfl, nullptr);
  if (info->si_code <= 0) raise(signo);
}

void OnFault(int signo, siginfo_t* info, void* uctx) {
  // Only a fault the kernel raised for an access (si_code > 0) carries a meaningful si_addr; kill(2) does not.
  if (info != nullptr && info->si_code > 0) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(info->si_addr);
    for (GuardFrame* frame = tlsTop; frame != nullptr; frame = frame->prev) {
      if (address >= frame->lo && address < frame->hi) {
        frame->signo = signo;
        frame->address = address;
        // Pop before jumping, so a fault while RunGuarded returns is never sent to a dead frame.
        tlsTop = frame->prev;
        // Safe: the frames between here and RunGuarded are the signal frame and a plain copy loop (no destructors,
        // no locks held). The signal stays blocked (the kernel blocked it for this handler); RunGuarded unblocks it.
        siglongjmp(frame->env, 1);
      }
    }
  }
  Chain(signo, info, uctx);
}

}  // namespace

void InstallFaultGuard() {
  std::call_once(installOnce, [] {
    // Read the previous actions first, then install: the handler never sees a half-written predecessor.
    sigaction(SIGBUS, nullptr, &previousBus);
    sigaction(SIGSEGV, nullptr, &previousSegv);
    struct sigaction ours;
    std::memset(&ours, 0, sizeof ours);
    ours.sa_sigaction = OnFault;
    // SA_ONSTACK: a thread that has an alternate signal stack (Node's main thread may) handles on it. Pool threads
    // have none and handle on their own stack, which is fine: these faults are never stack overflows.
    ours.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&ours.sa_mask);
    sigaction(SIGBUS, &ours, nullptr);
    sigaction(SIGSEGV, &ours, nullptr);
  });
  // Touch this thread's slot (harmless; initial-exec TLS needs no allocation anyway).
  std::atomic_signal_fence(std::memory_order_seq_cst);
  (void)tlsTop;
}

bool RunGuarded(const void* lo, size_t length, void (*body)(void*), void* ctx, GuardedFault* fault) {
  GuardFrame frame;
  frame.lo = reinterpret_cast<uintptr_t>(lo);
  frame.hi = frame.lo + length;
  frame.prev = tlsTop;
  frame.signo = 0;
  frame.address = 0;
  // savemask=0: no sigprocmask system call on the hot path (every copy job passes here). The mask is repaired on
  // the rare path instead: the kernel blocked the signal for the handler, and leaving the handler by siglongjmp does
  // not unblock it; a synchronous SIGBUS that arrives blocked kills the process, so unblock it before returning.
  if (sigsetjmp(frame.env, 0) != 0) {
    // Landed from OnFault, which already popped this frame.
    fault->signo = frame.signo;
    fault->address = frame.address;
    sigset_t delivered;
    sigemptyset(&delivered);
    sigaddset(&delivered, fault->signo);
    pthread_sigmask(SIG_UNBLOCK, &delivered, nullptr);
    return false;
  }
  tlsTop = &frame;
  // The handler runs on this thread: a signal fence orders the push before the copy and the pop after it.
  std::atomic_signal_fence(std::memory_order_seq_cst);
  body(ctx);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  tlsTop = frame.prev;
  return true;
}

const char* SignalName(int signo) {
  switch (signo) {
    case SIGBUS:
      return "SIGBUS";
    case SIGSEGV:
      return "SIGSEGV";
    default:
      return "signal";
  }
}

}  // namespace mpcache
