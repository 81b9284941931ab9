// Mapping: one region of memory the server copies to and from (DESIGN §4),
// behind one API whatever the backend:
//
//   shm         a POSIX shared-memory segment mapped read/write (openMapping);
//   cuda_ipc    another process's CUDA allocation opened with
//               cudaIpcOpenMemHandle (openCudaIpcMapping), with a stream of
//               its own;
//   cuda_alloc  this process's own cudaMalloc allocation, exportable through
//               its IPC handle (cudaAllocate; the worker side).
//
// Copies between the mapping and JS buffers run on the libuv thread pool
// (memcpy for shm; cudaMemcpyAsync on the mapping's stream, then
// cudaStreamSynchronize, for CUDA); the mapping is never released while one
// of them runs.
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
// * The release runs when the state is Closing and `inflight_` is 0, i.e.
//   either in close() itself or in the completion of the last copy, never
//   while a copy runs on the pool, and exactly once (`releasing_`). For shm it
//   is munmap, on the JS thread. For CUDA it runs on the pool (a
//   CudaReleaseWorker): cudaIpcCloseMemHandle (cuda_ipc) or cudaFree
//   (cuda_alloc), then cudaStreamDestroy; the state becomes Closed when it
//   completes.
// * Each queued copy holds strong references to this object and to its JS
//   buffer until it completes, so neither the GC finalizer (which releases a
//   mapping never closed) nor the buffer's collection can happen under it.
#pragma once

#include <napi.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cudart.h"

namespace mpcache {

// One validated copy range, in bytes.
struct CopyRange {
  size_t mappingOffset;
  size_t bufferOffset;
  size_t length;
};

enum class CopyDirection { kGather, kScatter };

enum class Backend { kShm, kCudaIpc, kCudaAlloc };

class Mapping;

// One mapping's part of a copy: its validated ranges, and what the copy thread needs of it.
// Holds the mapping object strongly until the copy completes on the JS thread.
struct CopySegment {
  Mapping* mapping;
  Napi::ObjectReference mappingRef;
  uint8_t* base;
  size_t size;  // bytes mapped: the guarded range is [base, base + size) (guard.h)
  std::vector<CopyRange> ranges;
  Backend backend;
  int device;
  void* stream;
  std::string name;
};

// What a constructor of a Mapping takes over (through a Napi::External).
struct MappingInit {
  std::string name;
  uint8_t* base = nullptr;  // host address (shm) or device pointer (CUDA)
  size_t size = 0;
  Backend backend = Backend::kShm;
  int device = -1;          // CUDA ordinal
  std::string deviceUuid;   // "cpu" for shm
  void* stream = nullptr;   // cudaStream_t
  CudaIpcMemHandle handle{};
  // shm: the segment's st_dev/st_ino at map time (fstat before close), "<dev>:<ino>"; "" for CUDA.
  std::string identity;
};

// An error to hand back to JS: code, call, message (see common.h).
struct NativeFailure {
  std::string code;
  std::string call;
  std::string message;
  bool failed() const { return !code.empty(); }
};

// What a guarded fault (code EFAULT, guard.h) adds: the segment, "SIGBUS"/"SIGSEGV", the byte offset in the mapping.
// What a CUDA call failing on a worker's memory (code ECUDA or EINVAL_HANDLE; issue 13 item 4) adds instead: the
// mapping, the device's UUID, the cudaError_t and its name ("cudaErrorLaunchFailure").
struct FaultInfo {
  std::string segment;
  std::string signal;
  double offset = -1;
  std::string device;
  int cudaError = 0;
  std::string cudaErrorName;
  std::string cudaErrorString;  // cudaGetErrorString's words
};

// The JS Error of a failure: code, call, message; with `fault`, also its `segment` and either `signal` and
// `offset` (a guarded fault) or `device`, `cudaError`, `cudaErrorName` and `cudaErrorString` (a CUDA failure).
Napi::Error FailureError(Napi::Env env, const NativeFailure& failure, const FaultInfo* fault = nullptr);

class Mapping : public Napi::ObjectWrap<Mapping> {
 public:
  // Defines the JS class (not exported to JS: instances come from openMapping).
  static Napi::Function DefineClass(Napi::Env env);
  // openMapping(name, nbytes): maps the segment, or throws (see mapping.cc).
  static Napi::Value Open(const Napi::CallbackInfo& info);
  // openMappingFd(fd, name, nbytes): maps a descriptor this process holds (cpu_memfd), or throws (see mapping.cc).
  static Napi::Value OpenFd(const Napi::CallbackInfo& info);
  // openCudaIpcMapping(handle, deviceUuid, nbytes) -> Promise<Mapping> (see mapping.cc).
  static Napi::Value OpenCudaIpc(const Napi::CallbackInfo& info);
  // cudaAllocate(deviceUuid, nbytes) -> Promise<Mapping> (see mapping.cc).
  static Napi::Value CudaAllocate(const Napi::CallbackInfo& info);
  // copyBatch(direction, mappings[], ranges[], buffer) -> Promise<void>: one copy job over many mappings.
  static Napi::Value CopyBatch(const Napi::CallbackInfo& info);
  // copyBatchUnguarded(...): the same job with the shm copies outside the fault guard. For bench/transfer/transfer.ts
  // only (it measures what the guard costs on this very code); a shrunk segment crashes the process here.
  static Napi::Value CopyBatchUnguarded(const Napi::CallbackInfo& info);

  explicit Mapping(const Napi::CallbackInfo& info);
  ~Mapping() override;

  // Called by a copy worker on the JS thread once its promise is settled.
  void CopyFinished();
  // Called by the CUDA release worker on the JS thread when it is done.
  void ReleaseFinished(const NativeFailure& failure);

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
  Napi::Value GetKind(const Napi::CallbackInfo& info);
  Napi::Value GetDevice(const Napi::CallbackInfo& info);
  Napi::Value GetIdentity(const Napi::CallbackInfo& info);
  Napi::Value IpcHandle(const Napi::CallbackInfo& info);

  Napi::Value Copy(const Napi::CallbackInfo& info, CopyDirection direction);
  // Validates `ranges` against this mapping and `bufferLength` into a segment (throws EINVAL_RANGE);
  // false when the mapping is closing or closed.
  bool PrepareCopy(Napi::Env env, const char* fn, const Napi::Float64Array& ranges, size_t bufferLength,
                   std::vector<CopySegment>* out);
  // Queues one copy job over `segments` (each already counted by PrepareCopy's caller below).
  static Napi::Promise QueueCopy(Napi::Env env, CopyDirection direction, Napi::Uint8Array buffer,
                                 std::vector<CopySegment> segments, bool guarded = true);
  static Napi::Value CopyBatchWith(const Napi::CallbackInfo& info, bool guarded);
  // Unmaps and updates the counters; returns 0 or the errno of munmap.
  int Unmap();
  // CUDA, synchronously (the GC finalizer only): close or free, destroy the stream.
  void ReleaseCudaNow();
  // Closing with nothing in flight: start the one release (munmap now, or the CUDA release worker).
  void StartRelease();
  // The release is done: become Closed, settle close() waiters.
  void FinishClose(const NativeFailure& failure);
  bool IsCuda() const { return backend_ != Backend::kShm; }

  std::string name_;
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
  Backend backend_ = Backend::kShm;
  int device_ = -1;
  std::string deviceUuid_ = "cpu";
  void* stream_ = nullptr;
  CudaIpcMemHandle handle_{};
  std::string identity_;
  State state_ = State::kClosed;
  bool releasing_ = false;
  uint32_t inflight_ = 0;
  NativeFailure closeFailure_;
  std::vector<Napi::Promise::Deferred> closeWaiters_;
  Napi::Reference<Napi::ArrayBuffer> arrayBufferRef_;
};

// cudaProbe(libraryPath?) -> Promise<{ available, reason, library, tried, devices }>.
Napi::Value CudaProbe(const Napi::CallbackInfo& info);
// cudaMemGetInfo(deviceUuid) -> Promise<{ free, total }>.
Napi::Value CudaMemGetInfo(const Napi::CallbackInfo& info);

}  // namespace mpcache
