// Letting go of descriptors without waiting on their close (see fdrelease.h).
#include "fdrelease.h"

#include <sched.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

namespace mpcache {

namespace {

void TakeOff(const std::shared_ptr<PassedCounts>& counts, const Doomed& d) {
  if (counts != nullptr && d.passed) counts->held.fetch_sub(1);
}

// The thread that closes what may block (one per process, never joined: a close stuck in a FUSE flush must not
// hold up a shutdown).
class Closer {
 public:
  static Closer& Get() {
    static Closer* closer = new Closer();  // never destroyed: its thread may outlive every listener
    return *closer;
  }

  void Queue(std::vector<Doomed> items, const std::shared_ptr<PassedCounts>& counts) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const Doomed& d : items) {
        if (counts != nullptr && d.passed) counts->closing.fetch_add(1);
        queue_.emplace_back(d, counts);
      }
      if (!started_) {
        try {
          std::thread([this] { Run(); }).detach();
          started_ = true;
        } catch (const std::system_error&) {
          // No thread now (EAGAIN): the items wait, counted, and the next Queue tries again.
        }
      }
    }
    ready_.notify_one();
  }

 private:
  void Run() {
    for (;;) {
      std::pair<Doomed, std::shared_ptr<PassedCounts>> next;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [this] { return !queue_.empty(); });
        next = std::move(queue_.front());
        queue_.pop_front();
      }
      close(next.first.fd);
      if (next.second != nullptr && next.first.passed) next.second->closing.fetch_sub(1);
      TakeOff(next.second, next.first);
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::pair<Doomed, std::shared_ptr<PassedCounts>>> queue_;
  bool started_ = false;
};

// The hand-off between the caller and the thread that will exit holding the last references.
struct Handoff {
  std::mutex mutex;
  std::condition_variable changed;
  int stage = 0;  // 1: the thread has its own table (err: unshare's errno, 0 on success); 2: it may exit
  int err = 0;
};

}  // namespace

void DropSockets(std::vector<Doomed> items, const std::shared_ptr<PassedCounts>& counts) {
  if (items.empty()) return;
  auto handoff = std::make_shared<Handoff>();
  try {
    std::thread([handoff] {
      const int err = unshare(CLONE_FILES) == 0 ? 0 : errno;
      {
        std::lock_guard<std::mutex> lock(handoff->mutex);
        handoff->stage = 1;
        handoff->err = err;
      }
      handoff->changed.notify_all();
      std::unique_lock<std::mutex> lock(handoff->mutex);
      handoff->changed.wait(lock, [&] { return handoff->stage == 2; });
      // Returning exits the thread: the kernel closes its private table with PF_EXITING set.
    }).detach();
  } catch (const std::system_error&) {
    return CloseOffThread(std::move(items), counts);  // no thread (EAGAIN): the closer takes them
  }
  {
    std::unique_lock<std::mutex> lock(handoff->mutex);
    handoff->changed.wait(lock, [&] { return handoff->stage >= 1; });
  }
  if (handoff->err != 0) {
    // The table is still shared: nothing holds a copy, so our close would be the last. Let the thread go and
    // hand the descriptors to the closer.
    {
      std::lock_guard<std::mutex> lock(handoff->mutex);
      handoff->stage = 2;
    }
    handoff->changed.notify_all();
    return CloseOffThread(std::move(items), counts);
  }
  for (const Doomed& d : items) {
    close(d.fd);  // the exiting thread's copy keeps the file: this drops a reference, never the last
    TakeOff(counts, d);
  }
  {
    std::lock_guard<std::mutex> lock(handoff->mutex);
    handoff->stage = 2;
  }
  handoff->changed.notify_all();
}

void CloseOffThread(std::vector<Doomed> items, const std::shared_ptr<PassedCounts>& counts) {
  if (items.empty()) return;
  Closer::Get().Queue(std::move(items), counts);
}

}  // namespace mpcache
