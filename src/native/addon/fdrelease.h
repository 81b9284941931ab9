// Letting go of descriptors a peer chose, without ever waiting on their close (mpcache issue 24 item 2;
// docs/memfd.md "Closing what a peer sent").
//
// close(2) can block for as long as the file's owner wants. A TCP socket with unsent data and SO_LINGER
// {1, 3600} waits up to an hour in inet_release. Closing a Unix-domain socket whose receive queue still holds
// SCM_RIGHTS messages (a connection refused before it was read, a listening socket's unaccepted connections,
// a passed socketpair end) releases the queued files in the closing thread, with the same wait: measured on
// Linux 6.18, close() of an unread AF_UNIX connection carrying a socket that lingers 5 s took 5.1 s. The
// kernel never lingers a close done by a task that is exiting (net/ipv4/af_inet.c inet_release: "If the close
// is due to the process exiting, we never linger"), so:
//
//   DropSockets     a short-lived thread takes a private copy of the descriptor table (unshare(CLONE_FILES)),
//                   the caller then closes its own copies (never the last reference, and sockets have no
//                   ->flush, so these closes return at once) and lets the thread exit: the kernel drops the
//                   last references, and whatever they still hold, in exit context. Measured: a socket with a
//                   5 s linger, directly or queued inside a passed socketpair end, dropped in about 1 ms, and
//                   no thread left a second later.
//   CloseOffThread  anything else that is not a memfd (a regular file on FUSE or NFS can block in ->flush on
//                   every close; a serial tty waits in its release) is closed by a closer thread of its own,
//                   so it blocks neither the event loop nor the listener's poll loop.
//
// memfds (files that take seals: shmem, hugetlbfs) have no ->flush and a release that only frees pages: their
// close never blocks, so they are the only passed descriptors the JS thread ever closes.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace mpcache {

// Passed descriptors of one listener as they come and go (read by stats()).
struct PassedCounts {
  // Passed descriptors in this process's table: received by recvmsg and not yet closed (by JS, a drop or the
  // closer).
  std::atomic<int64_t> held{0};
  // Of those, queued for or being closed on the closer thread.
  std::atomic<int64_t> closing{0};
};

// One descriptor to let go of; `passed` ones count in PassedCounts::held until they are out of the table.
struct Doomed {
  int fd;
  bool passed;
};

// Closes sockets (connections, passed sockets, the listening socket) without waiting on any of them: returns
// once every descriptor is out of this process's table, each passed one taken off counts->held (counts may be
// null). Takes a thread start and a copy of the table (tens of microseconds), never a close's wait. Falls back
// to CloseOffThread when no thread can be started or unshare fails.
void DropSockets(std::vector<Doomed> items, const std::shared_ptr<PassedCounts>& counts);

// Queues descriptors to the closer thread (started on first use, one per process, never joined); each passed
// one is counted in counts->closing until closed and taken off counts->held then.
void CloseOffThread(std::vector<Doomed> items, const std::shared_ptr<PassedCounts>& counts);

}  // namespace mpcache
