// Mapping: one shared-memory segment mapped read/write into this process
// (DESIGN §4). Copies between the mapping and JS buffers run on the libuv
// thread pool; the mapping is never unmapped while one of them runs.
//
// Life cycle, all state touched on the JS thread only:
//
//   Open ──close()──▶ Closing ──(last copy in flight finished)──▶ Closed
//     └──────close() with no copy in flight──────────────────────▶ Closed
//
// * `inflight_` counts copies queued and not yet completed. It goes up when a
//   copy is queued (JS thread) and down in the worker's OnOK/OnError (JS
//   thread), so no lock is needed; the thread-pool side only reads the base
//   address and ranges captured at queue time.
// * munmap runs when the state is Closing and `inflight_` is 0, i.e. either in
//   close() itself or in the completion of the last copy, never while a copy
//   runs on the pool.
// * Each queued copy holds strong references to this object and to its JS
//   buffer until it completes, so neither the GC finalizer (which unmaps a
//   mapping never closed) nor the buffer's collection can happen under it.
#pragma once

#include <napi.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mpcache {

// One validated copy range, in bytes.
struct CopyRange {
  size_t mappingOffset;
  size_t bufferOffset;
  size_t length;
};

enum class CopyDirection { kGather, kScatter };

class Mapping : public Napi::ObjectWrap<Mapping> {
 public:
  // Defines the JS class (not exported to JS: instances come from openMapping).
  static Napi::Function DefineClass(Napi::Env env);
  // openMapping(name, nbytes): maps the segment, or throws (see mapping.cc).
  static Napi::Value Open(const Napi::CallbackInfo& info);

  explicit Mapping(const Napi::CallbackInfo& info);
  ~Mapping() override;

  // Called by a copy worker on the JS thread once its promise is settled.
  void CopyFinished();

 private:
  enum class State { kOpen, kClosing, kClosed };

  Napi::Value Gather(const Napi::CallbackInfo& info);
  Napi::Value Scatter(const Napi::CallbackInfo& info);
  Napi::Value Close(const Napi::CallbackInfo& info);
  Napi::Value Prefault(const Napi::CallbackInfo& info);
  Napi::Value AsArrayBuffer(const Napi::CallbackInfo& info);
  Napi::Value GetName(const Napi::CallbackInfo& info);
  Napi::Value GetSize(const Napi::CallbackInfo& info);
  Napi::Value GetClosed(const Napi::CallbackInfo& info);

  Napi::Value Copy(const Napi::CallbackInfo& info, CopyDirection direction);
  // Unmaps and updates the counters; returns 0 or the errno of munmap.
  int Unmap();
  // Closing with nothing in flight: unmap, become Closed, settle close() waiters.
  void FinishClose();

  std::string name_;
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
  State state_ = State::kClosed;
  uint32_t inflight_ = 0;
  int unmapError_ = 0;
  std::vector<Napi::Promise::Deferred> closeWaiters_;
  Napi::Reference<Napi::ArrayBuffer> arrayBufferRef_;
};

}  // namespace mpcache
