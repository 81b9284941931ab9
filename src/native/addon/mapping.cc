#include "mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

#include "addon_data.h"
#include "common.h"
#include "cudart.h"
#include "guard.h"

namespace mpcache {

namespace {

std::string FormatNumber(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

const char* const kTripleFields[3] = {"mappingOffset", "bufferOffset", "length"};

// A copy or prefault asked of a mapping that is closing or closed: a promise rejected with ECLOSED.
Napi::Promise ClosedRejection(Napi::Env env, const char* fn, const std::string& name) {
  Napi::Promise::Deferred rejected = Napi::Promise::Deferred::New(env);
  rejected.Reject(MakeError(env, "ECLOSED", fn, "mapping " + name + " is closed").Value());
  return rejected.Promise();
}

bool IsTypedArrayOf(const Napi::Value& value, napi_typedarray_type type) {
  return value.IsTypedArray() && value.As<Napi::TypedArray>().TypedArrayType() == type;
}

// KV blocks are copied once and not read again by this thread: ranges of 4 KiB and more go with
// non-temporal (streaming) stores, which skip the read-for-ownership of every destination cache line and
// do not evict the caches (what glibc's memcpy does only above a multi-MiB threshold, so 32 KiB blocks
// never got it). Call StreamCopyFence() once after the last StreamCopy of a job.
constexpr size_t kStreamMinBytes = 4096;

void StreamCopy(uint8_t* dst, const uint8_t* src, size_t n) {
#if defined(__SSE2__)
  if (n >= kStreamMinBytes) {
    const size_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
    std::memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    const size_t body = n & ~static_cast<size_t>(63);
    for (size_t i = 0; i < body; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
    std::memcpy(dst + body, src + body, n - body);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

void StreamCopyFence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// --- the fault guard of copies of worker memory (guard.h; issue 13 item 1) --------------------------

// The EFAULT failure of a guarded copy or prefault that `fault` ended: names the call, the segment, the
// signal and the offset in the mapping of the missing page it hit (page-aligned; mappings start on a page); the server turns it into invalid_argument and releases the
// instance. Built on the copy thread (after the longjmp, outside the handler: allocation is fine here).
NativeFailure FaultFailure(const char* call, const std::string& name, const uint8_t* base, size_t size,
                           const GuardedFault& fault, FaultInfo* info) {
  Counters().guardedFaults.fetch_add(1);
  // The page that vanished, not the byte: which of a copy loop's loads faults first is the compiler's choice.
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t offset = (fault.address & ~(page - 1)) - reinterpret_cast<uintptr_t>(base);
  info->segment = name;
  info->signal = SignalName(fault.signo);
  info->offset = static_cast<double>(offset);
  return NativeFailure{"EFAULT", call,
                       std::string(call) + " on segment " + name + ": " + info->signal + " on the page at byte " +
                           std::to_string(offset) + " of the " + std::to_string(size) +
                           "-byte mapping: the segment shrank below its registered size"};
}

// What a guarded shm copy needs; RunGuarded passes it to CopyRangesBody by pointer.
struct ShmCopyJob {
  CopyDirection direction;
  uint8_t* buffer;
  const CopySegment* segment;
};

// The guarded region of a shm copy: a plain StreamCopy loop over validated ranges. Nothing here owns a
// resource or has a destructor, so a siglongjmp out of it (guard.cc) leaves nothing half-done but bytes.
void CopyRangesBody(void* ctx) {
  const ShmCopyJob& job = *static_cast<const ShmCopyJob*>(ctx);
  for (const CopyRange& r : job.segment->ranges) {
    if (r.length == 0) continue;
    if (job.direction == CopyDirection::kGather) {
      StreamCopy(job.buffer + r.bufferOffset, job.segment->base + r.mappingOffset, r.length);
    } else {
      StreamCopy(job.segment->base + r.mappingOffset, job.buffer + r.bufferOffset, r.length);
    }
  }
}

// Copies and checks every (mappingOffset, bufferOffset, length) triple before
// anything is queued: each value an integer in [0, 2^53-1], each range inside
// the mapping and inside the buffer (overflow-safe: off <= bound && len <= bound - off).
std::vector<CopyRange> ValidateRanges(Napi::Env env, const char* fn, const std::string& name,
                                      const Napi::Float64Array& ranges, size_t mappingSize,
                                      size_t bufferLength) {
  const size_t count = ranges.ElementLength();
  const std::string where = std::string(fn) + " on segment " + name;
  if (count % 3 != 0) {
    throw MakeError(env, "EINVAL_RANGE", fn,
                    where + ": ranges holds " + std::to_string(count) +
                        " numbers; expected (mappingOffset, bufferOffset, length) triples, a multiple of 3");
  }
  const double* raw = ranges.Data();
  std::vector<CopyRange> out;
  out.reserve(count / 3);
  for (size_t i = 0; i < count / 3; ++i) {
    size_t field[3];
    for (size_t k = 0; k < 3; ++k) {
      const double v = raw[i * 3 + k];
      if (!std::isfinite(v) || v != std::floor(v) || v < 0 || v > kMaxSafeInteger) {
        throw MakeError(env, "EINVAL_RANGE", fn,
                        where + ": range #" + std::to_string(i) + " has " + kTripleFields[k] + " = " +
                            FormatNumber(v) + "; expected an integer in [0, 2^53-1]");
      }
      field[k] = static_cast<size_t>(v);
    }
    const CopyRange r{field[0], field[1], field[2]};
    // The description is built only for an error: valid ranges are the hot path.
    const auto shown = [&]() {
      return "range #" + std::to_string(i) + " (mappingOffset " + std::to_string(r.mappingOffset) +
             ", bufferOffset " + std::to_string(r.bufferOffset) + ", length " + std::to_string(r.length) + ")";
    };
    if (r.mappingOffset > mappingSize || r.length > mappingSize - r.mappingOffset) {
      throw MakeError(env, "EINVAL_RANGE", fn,
                      where + ": " + shown() + " exceeds the mapping: mappingOffset + length must be <= " +
                          std::to_string(mappingSize) + " bytes (the mapping size)");
    }
    if (r.bufferOffset > bufferLength || r.length > bufferLength - r.bufferOffset) {
      throw MakeError(env, "EINVAL_RANGE", fn,
                      where + ": " + shown() + " exceeds the buffer: bufferOffset + length must be <= " +
                          std::to_string(bufferLength) + " bytes (the buffer's byteLength)");
    }
    out.push_back(r);
  }
  return out;
}

// The error a failed CUDA call turns into: code ECUDA, call, message naming the mapping.
NativeFailure CudaFailure(const std::string& what, const char* call, int err) {
  return NativeFailure{"ECUDA", call, what + ": " + CudaRuntime::Get().Describe(call, err)};
}

// What a CUDA failure on mapping `name` of device `ordinal` adds to its JS error (issue 13 item 4): the server
// names the mapping, the device and the error when it releases the instance.
FaultInfo CudaFaultInfo(const std::string& name, int ordinal, int err) {
  const CudaRuntime& rt = CudaRuntime::Get();
  FaultInfo info;
  info.segment = name;
  info.device = rt.UuidOf(ordinal);
  info.cudaError = err;
  info.cudaErrorName = rt.ErrorName(err);
  const char* text = rt.api().GetErrorString != nullptr ? rt.api().GetErrorString(err) : nullptr;
  info.cudaErrorString = text != nullptr ? text : "unknown error";
  return info;
}

// One gather or scatter job: the validated ranges of one or more mappings (copyBatch: every layer of a
// chunk in one job, so the JS thread hears back once per chunk, not once per layer), copied in order on
// one libuv pool thread. Holds each mapping object and the buffer strongly until it completes on the JS
// thread. shm: memcpy. CUDA: cudaMemcpyAsync of every range on the mapping's stream, then
// cudaStreamSynchronize (also after a failed enqueue), so the buffer is never touched by the device once
// the promise settles. The first failing segment stops the job.
class CopyWorker : public Napi::AsyncWorker {
 public:
  CopyWorker(Napi::Env env, CopyDirection direction, Napi::Uint8Array buffer, std::vector<CopySegment> segments,
             bool guarded)
      : Napi::AsyncWorker(env, direction == CopyDirection::kGather ? "mpcache.gather" : "mpcache.scatter"),
        deferred_(Napi::Promise::Deferred::New(env)),
        direction_(direction),
        guarded_(guarded),
        bufferRef_(Napi::Persistent(buffer.As<Napi::Object>())),
        buffer_(buffer.Data()),
        segments_(std::move(segments)) {}

  Napi::Promise Promise() const { return deferred_.Promise(); }

  void Execute() override {
    LowerPoolThreadPriority();
    for (const CopySegment& segment : segments_) {
      if (segment.backend == Backend::kShm) {
        if (!CopyShm(segment)) break;
      } else if (!CopyCuda(segment)) {
        break;
      }
    }
    StreamCopyFence();
  }

  // JS thread: settle this copy first, then let each mapping finish a pending close.
  void OnOK() override {
    Napi::Env env = Env();
    if (failure_.failed()) {
      deferred_.Reject(FailureError(env, failure_, fault_.segment.empty() ? nullptr : &fault_).Value());
    } else {
      deferred_.Resolve(env.Undefined());
    }
    Finished();
  }

  void OnError(const Napi::Error& error) override {
    deferred_.Reject(error.Value());
    Finished();
  }

 private:
  // Copies between the mapping and the buffer (StreamCopy; the fence in Execute orders them), under the fault
  // guard of the mapping's range: false (failure_ EFAULT) when the segment shrank under the copy. A fault on
  // the buffer's side (the server's own memory) is not guarded and crashes as before.
  bool CopyShm(const CopySegment& segment) {
    ShmCopyJob job{direction_, buffer_, &segment};
    if (!guarded_) {  // copyBatchUnguarded: the bench's reference for the guard's cost
      CopyRangesBody(&job);
      return true;
    }
    GuardedFault fault;
    if (RunGuarded(segment.base, segment.size, CopyRangesBody, &job, &fault)) return true;
    failure_ = FaultFailure(direction_ == CopyDirection::kGather ? "gather" : "scatter", segment.name, segment.base,
                            segment.size, fault, &fault_);
    return false;
  }

  // False (failure_ and fault_ set: the mapping, the device, the cudaError) when a CUDA call failed: a refused
  // enqueue, or an error of the copy reported by the synchronize (a device lost mid-copy, ECC, a sticky error).
  bool CopyCuda(const CopySegment& segment) {
    const CudaApi& api = CudaRuntime::Get().api();
    const std::string what =
        std::string(direction_ == CopyDirection::kGather ? "gather" : "scatter") + " on " + segment.name;
    int firstError = 0;
    if (const int err = api.SetDevice(segment.device); err != 0) {
      failure_ = CudaFailure(what, "cudaSetDevice", err);
      fault_ = CudaFaultInfo(segment.name, segment.device, err);
      return false;
    }
    for (const CopyRange& r : segment.ranges) {
      if (r.length == 0) continue;
      const int err = direction_ == CopyDirection::kGather
                          ? api.MemcpyAsync(buffer_ + r.bufferOffset, segment.base + r.mappingOffset, r.length,
                                            kCudaMemcpyDeviceToHost, segment.stream)
                          : api.MemcpyAsync(segment.base + r.mappingOffset, buffer_ + r.bufferOffset, r.length,
                                            kCudaMemcpyHostToDevice, segment.stream);
      if (err != 0) {
        failure_ = CudaFailure(what, "cudaMemcpyAsync", err);
        firstError = err;
        break;
      }
    }
    const int err = api.StreamSynchronize(segment.stream);
    if (err != 0 && !failure_.failed()) {
      failure_ = CudaFailure(what, "cudaStreamSynchronize", err);
      firstError = err;
    }
    if (failure_.failed()) fault_ = CudaFaultInfo(segment.name, segment.device, firstError);
    return !failure_.failed();
  }

  void Finished() {
    for (CopySegment& segment : segments_) segment.mapping->CopyFinished();
  }

  Napi::Promise::Deferred deferred_;
  CopyDirection direction_;
  bool guarded_;
  Napi::ObjectReference bufferRef_;
  uint8_t* buffer_;
  std::vector<CopySegment> segments_;
  NativeFailure failure_;
  FaultInfo fault_;
};

// prefault(offset, length, touch): populates the page tables of a range (MADV_POPULATE_WRITE, which leaves
// the contents alone; a read of each page where the kernel lacks it) so later copies into fresh memory do not
// pay the page faults. With touch, it then writes each page once with an atomic no-op (lock or 0): under a
// hypervisor that backs guest memory lazily (Firecracker here), populated pages still cost ~15 µs each on
// their first real write, i.e. ~4 s per GiB, which would otherwise land on the first STOREs. The atomic
// read-modify-write cannot lose a concurrent copy's bytes, so it is safe on memory already in use.
// Counted as a copy in flight, so close() waits for it.
class PrefaultWorker : public Napi::AsyncWorker {
 public:
  PrefaultWorker(Napi::Env env, Mapping* mapping, Napi::Object mappingObject, std::string name, uint8_t* mappingBase,
                 size_t mappingSize, uint8_t* base, size_t length, bool touch)
      : Napi::AsyncWorker(env, "mpcache.prefault"),
        deferred_(Napi::Promise::Deferred::New(env)),
        mapping_(mapping),
        mappingRef_(Napi::Persistent(mappingObject)),
        name_(std::move(name)),
        mappingBase_(mappingBase),
        mappingSize_(mappingSize),
        base_(base),
        length_(length),
        touch_(touch) {}

  Napi::Promise Promise() const { return deferred_.Promise(); }

  // madvise never raises a signal: on a shrunk segment MADV_POPULATE_WRITE fails (EFAULT) and the read loop
  // below then takes the real SIGBUS, under the guard, so a shrink is reported the same way on every path.
  void Execute() override {
    LowerPoolThreadPriority();
    page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
#ifdef MADV_POPULATE_WRITE
    populated_ = madvise(base_, length_, MADV_POPULATE_WRITE) == 0;
#endif
    if (!touch_ && populated_) return;
    GuardedFault fault;
    if (!RunGuarded(mappingBase_, mappingSize_, TouchBody, this, &fault)) {
      failure_ = FaultFailure("prefault", name_, mappingBase_, mappingSize_, fault, &fault_);
    }
  }

  void OnOK() override {
    if (failure_.failed()) {
      deferred_.Reject(FailureError(Env(), failure_, &fault_).Value());
    } else {
      deferred_.Resolve(Env().Undefined());
    }
    mapping_->CopyFinished();
  }

  void OnError(const Napi::Error& error) override {
    deferred_.Reject(error.Value());
    mapping_->CopyFinished();
  }

 private:
  // The guarded region: one access per page, atomic no-op writes (touch) or reads; plain loops, no destructors.
  static void TouchBody(void* ctx) {
    const PrefaultWorker& self = *static_cast<const PrefaultWorker*>(ctx);
    if (self.touch_) {
      for (size_t off = 0; off < self.length_; off += self.page_) {
        __atomic_fetch_or(self.base_ + off, uint8_t{0}, __ATOMIC_RELAXED);
      }
    } else {
      volatile uint8_t sink = 0;
      for (size_t off = 0; off < self.length_; off += self.page_) sink = sink + self.base_[off];
    }
  }

  Napi::Promise::Deferred deferred_;
  Mapping* mapping_;
  Napi::ObjectReference mappingRef_;
  std::string name_;
  uint8_t* mappingBase_;
  size_t mappingSize_;
  uint8_t* base_;
  size_t length_;
  bool touch_;
  size_t page_ = 4096;
  bool populated_ = false;
  NativeFailure failure_;
  FaultInfo fault_;
};

// --- CUDA: open, allocate, release (pool threads) ---------------------------

std::string HexBytes(const char* bytes, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char b = static_cast<unsigned char>(bytes[i]);
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

// "cuda:<device uuid>:<hex of the 64 handle bytes>": the mapping's name. The whole handle, because
// handles of one exporter may share long prefixes; the facade keys cuda_ipc segments the same way.
std::string CudaMappingName(const std::string& uuid, const CudaIpcMemHandle& handle) {
  return "cuda:" + uuid + ":" + HexBytes(handle.reserved, kCudaIpcHandleBytes);
}

// The failure for a missing backend: ENOCUDA, with the loader's reason.
NativeFailure NoCuda(const char* call) {
  return NativeFailure{"ENOCUDA", call,
                       "CUDA IPC backend not available on this host (" + CudaRuntime::Get().reason() + ")"};
}

// Loads the runtime and resolves `uuid` to an ordinal: ENOCUDA, or EINVAL for
// a malformed or unknown UUID.
NativeFailure ResolveDevice(const char* call, const std::string& uuid, int* ordinal) {
  CudaRuntime& rt = CudaRuntime::Get();
  rt.Load("");
  if (!rt.available()) return NoCuda(call);
  if (UuidHex(uuid).empty()) {
    return NativeFailure{"EINVAL", call,
                         std::string(call) + ": device_uuid \"" + uuid +
                             "\" is not a GPU UUID; expected \"GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx\" (devices: " +
                             rt.DeviceList() + ")"};
  }
  *ordinal = rt.OrdinalOf(uuid);
  if (*ordinal < 0) {
    return NativeFailure{"EINVAL", call,
                         std::string(call) + ": device_uuid " + uuid + " is not a CUDA device of this host (devices: " +
                             rt.DeviceList() + ")"};
  }
  return NativeFailure{};
}

// Closes what an open or allocation acquired (stream last). Returns the first failure.
NativeFailure ReleaseCudaResources(Backend backend, int device, uint8_t* base, void* stream, const std::string& name) {
  const CudaApi& api = CudaRuntime::Get().api();
  NativeFailure failure;
  if (const int err = api.SetDevice(device); err != 0) failure = CudaFailure("release of " + name, "cudaSetDevice", err);
  if (base != nullptr) {
    if (backend == Backend::kCudaIpc) {
      if (const int err = api.IpcCloseMemHandle(base); err != 0 && !failure.failed()) {
        failure = CudaFailure("release of " + name, "cudaIpcCloseMemHandle", err);
      }
    } else if (api.Free != nullptr) {
      if (const int err = api.Free(base); err != 0 && !failure.failed()) {
        failure = CudaFailure("release of " + name, "cudaFree", err);
      }
    }
  }
  if (stream != nullptr) {
    if (const int err = api.StreamDestroy(stream); err != 0 && !failure.failed()) {
      failure = CudaFailure("release of " + name, "cudaStreamDestroy", err);
    }
  }
  return failure;
}

// openCudaIpcMapping / cudaAllocate: the CUDA calls on the pool, the Mapping
// constructed on the JS thread; the promise settles with it or with the error.
class CudaOpenWorker : public Napi::AsyncWorker {
 public:
  CudaOpenWorker(Napi::Env env, Backend backend, std::string deviceUuid, size_t nbytes, const CudaIpcMemHandle& handle)
      : Napi::AsyncWorker(env, backend == Backend::kCudaIpc ? "mpcache.openCudaIpc" : "mpcache.cudaAllocate"),
        deferred_(Napi::Promise::Deferred::New(env)) {
    init_.backend = backend;
    init_.deviceUuid = std::move(deviceUuid);
    init_.size = nbytes;
    init_.handle = handle;
  }

  Napi::Promise Promise() const { return deferred_.Promise(); }

  void Execute() override {
    const bool ipc = init_.backend == Backend::kCudaIpc;
    const char* fn = ipc ? "openCudaIpcMapping" : "cudaAllocate";
    failure_ = ResolveDevice(fn, init_.deviceUuid, &init_.device);
    if (failure_.failed()) return;
    const CudaApi& api = CudaRuntime::Get().api();
    if (!ipc && (api.Malloc == nullptr || api.IpcGetMemHandle == nullptr || api.Free == nullptr)) {
      failure_ = NativeFailure{"ENOCUDA", fn,
                               "cudaAllocate: libcudart " + CudaRuntime::Get().library() +
                                   " lacks cudaMalloc, cudaFree or cudaIpcGetMemHandle"};
      return;
    }
    const std::string where = std::string(fn) + " on device " + init_.deviceUuid;
    if (ipc) init_.name = CudaMappingName(init_.deviceUuid, init_.handle);
    if (const int err = api.SetDevice(init_.device); err != 0) {
      failure_ = CudaFailure(where, "cudaSetDevice", err);
      fault_ = CudaFaultInfo(init_.name, init_.device, err);
      return;
    }
    void* base = nullptr;
    if (ipc) {
      if (const int err = api.IpcOpenMemHandle(&base, init_.handle, kCudaIpcMemLazyEnablePeerAccess); err != 0) {
        fault_ = CudaFaultInfo(init_.name, init_.device, err);
        failure_ = NativeFailure{
            "EINVAL_HANDLE", "cudaIpcOpenMemHandle",
            "openCudaIpcMapping: " + CudaRuntime::Get().Describe("cudaIpcOpenMemHandle", err) + " for " + init_.name +
                "; expected a handle from cudaIpcGetMemHandle of a live process on this host, on that device"};
        return;
      }
    } else {
      if (const int err = api.Malloc(&base, init_.size); err != 0) {
        failure_ = CudaFailure(where + " (" + std::to_string(init_.size) + " bytes)", "cudaMalloc", err);
        return;
      }
      if (const int err = api.IpcGetMemHandle(&init_.handle, base); err != 0) {
        failure_ = CudaFailure(where, "cudaIpcGetMemHandle", err);
        api.Free(base);
        return;
      }
      init_.name = CudaMappingName(init_.deviceUuid, init_.handle);
    }
    init_.base = static_cast<uint8_t*>(base);
    if (const int err = api.StreamCreateWithFlags(&init_.stream, kCudaStreamNonBlocking); err != 0) {
      failure_ = CudaFailure(where, "cudaStreamCreateWithFlags", err);
      fault_ = CudaFaultInfo(init_.name, init_.device, err);
      ReleaseCudaResources(init_.backend, init_.device, init_.base, nullptr, init_.name);
      init_.base = nullptr;
      init_.stream = nullptr;
      return;
    }
    Counters().openMappings.fetch_add(1);
    Counters().mappedBytes.fetch_add(static_cast<int64_t>(init_.size));
  }

  void OnOK() override {
    Napi::Env env = Env();
    if (failure_.failed()) {
      deferred_.Reject(FailureError(env, failure_, fault_.cudaError != 0 ? &fault_ : nullptr).Value());
      return;
    }
    try {
      Napi::Object mapping = AddonData::Of(env).mappingConstructor.New({Napi::External<MappingInit>::New(env, &init_)});
      deferred_.Resolve(mapping);
    } catch (const Napi::Error& error) {
      Undo();
      deferred_.Reject(error.Value());
    }
  }

  void OnError(const Napi::Error& error) override {
    Undo();
    deferred_.Reject(error.Value());
  }

 private:
  // The constructor did not take ownership: release here.
  void Undo() {
    if (init_.base == nullptr) return;
    ReleaseCudaResources(init_.backend, init_.device, init_.base, init_.stream, init_.name);
    init_.base = nullptr;
    Counters().openMappings.fetch_sub(1);
    Counters().mappedBytes.fetch_sub(static_cast<int64_t>(init_.size));
  }

  Napi::Promise::Deferred deferred_;
  MappingInit init_;
  NativeFailure failure_;
  FaultInfo fault_;  // a CUDA call's failure: device and cudaError (issue 13 item 4)
};

// The CUDA release of one mapping on the pool: cudaIpcCloseMemHandle (or
// cudaFree), then cudaStreamDestroy. Holds the mapping object until done.
class CudaReleaseWorker : public Napi::AsyncWorker {
 public:
  CudaReleaseWorker(Napi::Env env, Mapping* mapping, Napi::Object mappingObject, Backend backend, int device,
                    uint8_t* base, void* stream, std::string name)
      : Napi::AsyncWorker(env, "mpcache.cudaRelease"),
        mapping_(mapping),
        mappingRef_(Napi::Persistent(mappingObject)),
        backend_(backend),
        device_(device),
        base_(base),
        stream_(stream),
        name_(std::move(name)) {}

  void Execute() override { failure_ = ReleaseCudaResources(backend_, device_, base_, stream_, name_); }
  void OnOK() override { mapping_->ReleaseFinished(failure_); }
  void OnError(const Napi::Error& error) override {
    mapping_->ReleaseFinished(NativeFailure{"ECUDA", "release", error.Message()});
  }

 private:
  Mapping* mapping_;
  Napi::ObjectReference mappingRef_;
  Backend backend_;
  int device_;
  uint8_t* base_;
  void* stream_;
  std::string name_;
  NativeFailure failure_;
};

// cudaProbe(): loads the runtime (once) on the pool; resolves with what it found.
class CudaProbeWorker : public Napi::AsyncWorker {
 public:
  CudaProbeWorker(Napi::Env env, std::string overridePath)
      : Napi::AsyncWorker(env, "mpcache.cudaProbe"),
        deferred_(Napi::Promise::Deferred::New(env)),
        overridePath_(std::move(overridePath)) {}

  Napi::Promise Promise() const { return deferred_.Promise(); }
  void Execute() override { CudaRuntime::Get().Load(overridePath_); }

  void OnOK() override {
    Napi::Env env = Env();
    const CudaRuntime& rt = CudaRuntime::Get();
    Napi::Object out = Napi::Object::New(env);
    out.Set("available", Napi::Boolean::New(env, rt.available()));
    out.Set("reason", Napi::String::New(env, rt.available() ? "" : rt.reason()));
    out.Set("library", Napi::String::New(env, rt.library()));
    Napi::Array tried = Napi::Array::New(env, rt.tried().size());
    for (size_t i = 0; i < rt.tried().size(); ++i) tried.Set(static_cast<uint32_t>(i), rt.tried()[i]);
    out.Set("tried", tried);
    Napi::Array devices = Napi::Array::New(env, rt.devices().size());
    for (size_t i = 0; i < rt.devices().size(); ++i) {
      Napi::Object d = Napi::Object::New(env);
      d.Set("ordinal", Napi::Number::New(env, rt.devices()[i].ordinal));
      d.Set("uuid", Napi::String::New(env, rt.devices()[i].uuid));
      devices.Set(static_cast<uint32_t>(i), d);
    }
    out.Set("devices", devices);
    deferred_.Resolve(out);
  }

 private:
  Napi::Promise::Deferred deferred_;
  std::string overridePath_;
};

// cudaMemGetInfo(deviceUuid): { free, total } bytes of that device, on the pool.
class CudaMemInfoWorker : public Napi::AsyncWorker {
 public:
  CudaMemInfoWorker(Napi::Env env, std::string deviceUuid)
      : Napi::AsyncWorker(env, "mpcache.cudaMemGetInfo"),
        deferred_(Napi::Promise::Deferred::New(env)),
        deviceUuid_(std::move(deviceUuid)) {}

  Napi::Promise Promise() const { return deferred_.Promise(); }

  void Execute() override {
    int ordinal = -1;
    failure_ = ResolveDevice("cudaMemGetInfo", deviceUuid_, &ordinal);
    if (failure_.failed()) return;
    const CudaApi& api = CudaRuntime::Get().api();
    if (api.MemGetInfo == nullptr) {
      failure_ = NativeFailure{"ENOCUDA", "cudaMemGetInfo",
                               "cudaMemGetInfo: libcudart " + CudaRuntime::Get().library() + " lacks cudaMemGetInfo"};
      return;
    }
    if (const int err = api.SetDevice(ordinal); err != 0) {
      failure_ = CudaFailure("cudaMemGetInfo on device " + deviceUuid_, "cudaSetDevice", err);
      return;
    }
    if (const int err = api.MemGetInfo(&free_, &total_); err != 0) {
      failure_ = CudaFailure("cudaMemGetInfo on device " + deviceUuid_, "cudaMemGetInfo", err);
    }
  }

  void OnOK() override {
    Napi::Env env = Env();
    if (failure_.failed()) {
      deferred_.Reject(MakeError(env, failure_.code, failure_.call, failure_.message).Value());
      return;
    }
    Napi::Object out = Napi::Object::New(env);
    out.Set("free", Napi::Number::New(env, static_cast<double>(free_)));
    out.Set("total", Napi::Number::New(env, static_cast<double>(total_)));
    deferred_.Resolve(out);
  }

 private:
  Napi::Promise::Deferred deferred_;
  std::string deviceUuid_;
  NativeFailure failure_;
  size_t free_ = 0;
  size_t total_ = 0;
};

std::string DeviceUuidArg(const Napi::CallbackInfo& info, size_t index, const char* fn) {
  if (info.Length() <= index || !info[index].IsString()) {
    throw MakeError(info.Env(), "EINVAL", fn, std::string(fn) + ": the device UUID must be a string (\"GPU-…\")");
  }
  return info[index].As<Napi::String>().Utf8Value();
}

template <typename Worker>
Napi::Value QueueForPromise(Worker* worker) {
  Napi::Promise promise = worker->Promise();
  try {
    worker->Queue();
  } catch (...) {
    delete worker;
    throw;
  }
  return promise;
}

}  // namespace

Napi::Error FailureError(Napi::Env env, const NativeFailure& failure, const FaultInfo* fault) {
  Napi::Error error = MakeError(env, failure.code, failure.call, failure.message);
  if (fault != nullptr) {
    error.Set("segment", Napi::String::New(env, fault->segment));
    if (fault->cudaError != 0) {
      error.Set("device", Napi::String::New(env, fault->device));
      error.Set("cudaError", Napi::Number::New(env, fault->cudaError));
      error.Set("cudaErrorName", Napi::String::New(env, fault->cudaErrorName));
      error.Set("cudaErrorString", Napi::String::New(env, fault->cudaErrorString));
    } else {
      error.Set("signal", Napi::String::New(env, fault->signal));
      error.Set("offset", Napi::Number::New(env, fault->offset));
    }
  }
  return error;
}

Napi::Function Mapping::DefineClass(Napi::Env env) {
  return ObjectWrap<Mapping>::DefineClass(
      env, "Mapping",
      {
          InstanceMethod<&Mapping::Gather>("gather"),
          InstanceMethod<&Mapping::Scatter>("scatter"),
          InstanceMethod<&Mapping::Close>("close"),
          InstanceMethod<&Mapping::Prefault>("prefault"),
          InstanceMethod<&Mapping::AsArrayBuffer>("arrayBuffer"),
          InstanceMethod<&Mapping::IpcHandle>("ipcHandle"),
          InstanceAccessor<&Mapping::GetName>("name"),
          InstanceAccessor<&Mapping::GetSize>("size"),
          InstanceAccessor<&Mapping::GetClosed>("closed"),
          InstanceAccessor<&Mapping::GetKind>("kind"),
          InstanceAccessor<&Mapping::GetDevice>("device"),
          InstanceAccessor<&Mapping::GetIdentity>("identity"),
      });
}

namespace {

// The mapping core of every host-memory backend (cpu_shm by name, cpu_memfd by a passed descriptor): fstat,
// refuse a file shorter than nbytes (EINVAL_SIZE: touching pages past its end would raise SIGBUS), mmap nbytes
// shared read/write, construct the Mapping. The fstat's st_dev/st_ino stay on it as `identity`. The caller
// keeps `fd` (and closes it); the mapping holds the memory on its own.
Napi::Value MapHostFile(Napi::Env env, int fd, const std::string& name, uint64_t nbytes, const char* fn) {
  struct stat st;
  if (fstat(fd, &st) != 0) throw ErrnoError(env, "fstat", name, errno);
  const uint64_t segmentBytes = st.st_size < 0 ? 0 : static_cast<uint64_t>(st.st_size);
  if (segmentBytes < nbytes) {
    throw MakeError(env, "EINVAL_SIZE", fn,
                    std::string(fn) + ": segment " + name + " holds " + std::to_string(segmentBytes) +
                        " bytes, the descriptor claims " + std::to_string(nbytes));
  }
  void* base = mmap(nullptr, static_cast<size_t>(nbytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) throw ErrnoError(env, "mmap", name, errno);
  Counters().openMappings.fetch_add(1);
  Counters().mappedBytes.fetch_add(static_cast<int64_t>(nbytes));

  MappingInit segment;
  segment.name = name;
  segment.base = static_cast<uint8_t*>(base);
  segment.size = static_cast<size_t>(nbytes);
  segment.deviceUuid = "cpu";
  segment.identity = FileIdentity(st);
  try {
    return AddonData::Of(env).mappingConstructor.New({Napi::External<MappingInit>::New(env, &segment)});
  } catch (...) {
    // The constructor did not take ownership: undo the mapping.
    if (segment.base != nullptr) {
      munmap(segment.base, segment.size);
      Counters().openMappings.fetch_sub(1);
      Counters().mappedBytes.fetch_sub(static_cast<int64_t>(segment.size));
    }
    throw;
  }
}

}  // namespace

// openMapping(name, nbytes): shm_open O_RDWR, then the host mapping core (MapHostFile), then close the
// descriptor. The identity lets --unlink-reaped-segments unlink the name only while it still names that file.
Napi::Value Mapping::Open(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const std::string name = SegmentNameArg(info, 0, "openMapping");
  const uint64_t nbytes = ByteCountArg(info, 1, "openMapping", 1);
  const int fd = shm_open(ShmPath(name).c_str(), O_RDWR, 0);
  if (fd < 0) throw ErrnoError(env, "shm_open", name, errno);
  try {
    Napi::Value mapping = MapHostFile(env, fd, name, nbytes, "openMapping");
    close(fd);
    return mapping;
  } catch (...) {
    close(fd);
    throw;
  }
}

// openMappingFd(fd, name, nbytes): the host mapping core over a descriptor this process holds (a memfd a
// worker passed, cpu_memfd; or the worker's own). `name` labels the mapping in errors and fault reports. The
// descriptor stays open: the caller closes it (the mapping keeps the memory).
Napi::Value Mapping::OpenFd(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const double fd = info.Length() > 0 && info[0].IsNumber() ? info[0].As<Napi::Number>().DoubleValue() : -1;
  if (fd < 0 || fd != static_cast<double>(static_cast<int>(fd))) {
    throw MakeError(env, "EINVAL", "openMappingFd", "openMappingFd: the descriptor must be an integer >= 0");
  }
  if (info.Length() < 2 || !info[1].IsString()) {
    throw MakeError(env, "EINVAL", "openMappingFd", "openMappingFd: the name must be a string");
  }
  const uint64_t nbytes = ByteCountArg(info, 2, "openMappingFd", 1);
  return MapHostFile(env, static_cast<int>(fd), info[1].As<Napi::String>().Utf8Value(), nbytes, "openMappingFd");
}

// openCudaIpcMapping(handle, deviceUuid, nbytes) -> Promise<Mapping>: on the
// pool, loads libcudart (once), maps the UUID to an ordinal, cudaSetDevice,
// cudaIpcOpenMemHandle (lazy peer access), cudaStreamCreateWithFlags
// (non-blocking). Arguments are checked here (EINVAL, thrown); the rest
// rejects: ENOCUDA (no usable libcudart or no device), EINVAL (a malformed or
// unknown UUID), EINVAL_HANDLE (cudaIpcOpenMemHandle refused the handle),
// ECUDA (another CUDA call failed). The allocation's size cannot be checked
// through cudart: `nbytes` is the caller's word.
Napi::Value Mapping::OpenCudaIpc(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const char* fn = "openCudaIpcMapping";
  if (info.Length() < 1 || !IsTypedArrayOf(info[0], napi_uint8_array)) {
    throw MakeError(env, "EINVAL", fn, std::string(fn) + ": the IPC handle must be a Uint8Array of 64 bytes");
  }
  Napi::Uint8Array bytes = info[0].As<Napi::Uint8Array>();
  if (bytes.ByteLength() != kCudaIpcHandleBytes) {
    throw MakeError(env, "EINVAL", fn,
                    std::string(fn) + ": the IPC handle must be 64 bytes (a cudaIpcMemHandle_t), got " +
                        std::to_string(bytes.ByteLength()));
  }
  const std::string uuid = DeviceUuidArg(info, 1, fn);
  const uint64_t nbytes = ByteCountArg(info, 2, fn, 1);
  CudaIpcMemHandle handle;
  std::memcpy(handle.reserved, bytes.Data(), kCudaIpcHandleBytes);
  return QueueForPromise(new CudaOpenWorker(env, Backend::kCudaIpc, uuid, static_cast<size_t>(nbytes), handle));
}

// cudaAllocate(deviceUuid, nbytes) -> Promise<Mapping>: the worker side. On
// the pool: cudaSetDevice, cudaMalloc, cudaIpcGetMemHandle, a stream. Its
// `ipcHandle()` is what a cuda_ipc descriptor carries; close() frees it
// (cudaFree). The contents start uninitialised. Errors as for openCudaIpcMapping.
Napi::Value Mapping::CudaAllocate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const std::string uuid = DeviceUuidArg(info, 0, "cudaAllocate");
  const uint64_t nbytes = ByteCountArg(info, 1, "cudaAllocate", 1);
  return QueueForPromise(new CudaOpenWorker(env, Backend::kCudaAlloc, uuid, static_cast<size_t>(nbytes), CudaIpcMemHandle{}));
}

Napi::Value CudaProbe(const Napi::CallbackInfo& info) {
  std::string overridePath;
  if (info.Length() > 0 && info[0].IsString()) overridePath = info[0].As<Napi::String>().Utf8Value();
  return QueueForPromise(new CudaProbeWorker(info.Env(), overridePath));
}

Napi::Value CudaMemGetInfo(const Napi::CallbackInfo& info) {
  return QueueForPromise(new CudaMemInfoWorker(info.Env(), DeviceUuidArg(info, 0, "cudaMemGetInfo")));
}

Mapping::Mapping(const Napi::CallbackInfo& info) : Napi::ObjectWrap<Mapping>(info) {
  if (info.Length() != 1 || !info[0].IsExternal()) {
    throw MakeError(info.Env(), "EINVAL", "Mapping", "Mapping: use openMapping(name, nbytes) to map a segment");
  }
  MappingInit* init = info[0].As<Napi::External<MappingInit>>().Data();
  name_ = init->name;
  base_ = init->base;
  size_ = init->size;
  backend_ = init->backend;
  device_ = init->device;
  deviceUuid_ = init->deviceUuid;
  stream_ = init->stream;
  handle_ = init->handle;
  identity_ = init->identity;
  init->base = nullptr;  // ownership taken
  init->stream = nullptr;
  state_ = State::kOpen;
}

// GC safety net: a mapping dropped without close() is released here. A copy in
// flight holds a strong reference, so the GC cannot get here under one; at
// environment teardown (process exit) a copy may still run, and the mapping
// is then left to the exit rather than pulled from under it.
Mapping::~Mapping() {
  if (base_ == nullptr || inflight_ != 0 || releasing_) return;
  if (IsCuda()) {
    ReleaseCudaNow();
  } else {
    Unmap();
  }
}

int Mapping::Unmap() {
  if (base_ == nullptr) return 0;
  const int rc = munmap(base_, size_);
  const int err = rc == 0 ? 0 : errno;
  base_ = nullptr;
  Counters().openMappings.fetch_sub(1);
  Counters().mappedBytes.fetch_sub(static_cast<int64_t>(size_));
  return err;
}

void Mapping::ReleaseCudaNow() {
  ReleaseCudaResources(backend_, device_, base_, stream_, name_);
  base_ = nullptr;
  stream_ = nullptr;
  Counters().openMappings.fetch_sub(1);
  Counters().mappedBytes.fetch_sub(static_cast<int64_t>(size_));
}

void Mapping::StartRelease() {
  if (releasing_) return;
  releasing_ = true;
  if (!IsCuda()) {
    // JS views of this memory become empty (byteLength 0) instead of pointing at unmapped pages.
    if (!arrayBufferRef_.IsEmpty()) {
      Napi::ArrayBuffer view = arrayBufferRef_.Value();
      if (!view.IsDetached()) view.Detach();
      arrayBufferRef_.Reset();
    }
    const int err = Unmap();
    NativeFailure failure;
    if (err != 0) {
      Napi::Error e = ErrnoError(Env(), "munmap", name_, err);
      failure = NativeFailure{ErrnoName(err), "munmap", e.Message()};
    }
    FinishClose(failure);
    return;
  }
  Napi::Env env = Env();
  auto* worker = new CudaReleaseWorker(env, this, Value(), backend_, device_, base_, stream_, name_);
  try {
    worker->Queue();
  } catch (...) {
    delete worker;
    ReleaseCudaNow();
    FinishClose(NativeFailure{});
  }
}

void Mapping::ReleaseFinished(const NativeFailure& failure) {
  base_ = nullptr;
  stream_ = nullptr;
  Counters().openMappings.fetch_sub(1);
  Counters().mappedBytes.fetch_sub(static_cast<int64_t>(size_));
  FinishClose(failure);
}

void Mapping::FinishClose(const NativeFailure& failure) {
  closeFailure_ = failure;
  state_ = State::kClosed;
  std::vector<Napi::Promise::Deferred> waiters = std::move(closeWaiters_);
  closeWaiters_.clear();
  Napi::Env env = Env();
  for (const Napi::Promise::Deferred& waiter : waiters) {
    if (!closeFailure_.failed()) {
      waiter.Resolve(env.Undefined());
    } else {
      waiter.Reject(MakeError(env, closeFailure_.code, closeFailure_.call, closeFailure_.message).Value());
    }
  }
}

void Mapping::CopyFinished() {
  if (inflight_ > 0) --inflight_;
  if (inflight_ == 0 && state_ == State::kClosing) StartRelease();
}

// close(): stop taking copies, wait for those in flight, release (munmap; for
// CUDA: close the IPC mapping or free, then destroy the stream), resolve.
// Every call gets a promise settled after that one release.
Napi::Value Mapping::Close(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Promise::Deferred deferred = Napi::Promise::Deferred::New(env);
  if (state_ == State::kClosed) {
    if (!closeFailure_.failed()) {
      deferred.Resolve(env.Undefined());
    } else {
      deferred.Reject(MakeError(env, closeFailure_.code, closeFailure_.call, closeFailure_.message).Value());
    }
    return deferred.Promise();
  }
  state_ = State::kClosing;
  closeWaiters_.push_back(deferred);
  if (inflight_ == 0) StartRelease();
  return deferred.Promise();
}

Napi::Value Mapping::Gather(const Napi::CallbackInfo& info) { return Copy(info, CopyDirection::kGather); }

Napi::Value Mapping::Scatter(const Napi::CallbackInfo& info) { return Copy(info, CopyDirection::kScatter); }

Napi::Value Mapping::Copy(const Napi::CallbackInfo& info, CopyDirection direction) {
  Napi::Env env = info.Env();
  const char* fn = direction == CopyDirection::kGather ? "gather" : "scatter";
  if (info.Length() < 2 || !IsTypedArrayOf(info[0], napi_float64_array)) {
    throw MakeError(env, "EINVAL", fn,
                    std::string(fn) + ": ranges must be a Float64Array of (mappingOffset, bufferOffset, length) triples");
  }
  if (!IsTypedArrayOf(info[1], napi_uint8_array)) {
    throw MakeError(env, "EINVAL", fn, std::string(fn) + ": the buffer must be a Uint8Array");
  }
  Napi::Uint8Array buffer = info[1].As<Napi::Uint8Array>();
  std::vector<CopySegment> segments;
  // A detached buffer reports byteLength 0, so any non-empty range is refused.
  if (!PrepareCopy(env, fn, info[0].As<Napi::Float64Array>(), buffer.ByteLength(), &segments)) {
    return ClosedRejection(env, fn, name_);
  }
  return QueueCopy(env, direction, buffer, std::move(segments));
}

bool Mapping::PrepareCopy(Napi::Env env, const char* fn, const Napi::Float64Array& ranges, size_t bufferLength,
                          std::vector<CopySegment>* out) {
  if (state_ != State::kOpen) return false;
  std::vector<CopyRange> validated = ValidateRanges(env, fn, name_, ranges, size_, bufferLength);
  out->push_back(CopySegment{this, Napi::Persistent(Value()), base_, size_, std::move(validated), backend_, device_,
                             stream_, name_});
  return true;
}

Napi::Promise Mapping::QueueCopy(Napi::Env env, CopyDirection direction, Napi::Uint8Array buffer,
                                 std::vector<CopySegment> segments, bool guarded) {
  std::vector<Mapping*> mappings;
  mappings.reserve(segments.size());
  for (const CopySegment& segment : segments) mappings.push_back(segment.mapping);
  CopyWorker* worker = new CopyWorker(env, direction, buffer, std::move(segments), guarded);
  Napi::Promise promise = worker->Promise();
  try {
    worker->Queue();
  } catch (...) {
    delete worker;
    throw;
  }
  // Counted once per segment (a mapping may appear more than once); CopyFinished undoes each.
  for (Mapping* mapping : mappings) ++mapping->inflight_;
  return promise;
}

// copyBatch(direction, mappings, ranges, buffer): mappings[i] copies with ranges[i] (triples as for
// gather/scatter) to or from the one buffer, all in one job. Everything is checked before anything is
// queued: a bad argument or range throws; a closing or closed mapping rejects the whole batch (ECLOSED).
Napi::Value Mapping::CopyBatch(const Napi::CallbackInfo& info) { return CopyBatchWith(info, true); }

Napi::Value Mapping::CopyBatchUnguarded(const Napi::CallbackInfo& info) { return CopyBatchWith(info, false); }

Napi::Value Mapping::CopyBatchWith(const Napi::CallbackInfo& info, bool guarded) {
  Napi::Env env = info.Env();
  const std::string direction = info.Length() > 0 && info[0].IsString() ? info[0].As<Napi::String>().Utf8Value() : "";
  if (direction != "gather" && direction != "scatter") {
    throw MakeError(env, "EINVAL", "copyBatch", "copyBatch: direction must be \"gather\" or \"scatter\"");
  }
  const char* fn = direction == "gather" ? "gather" : "scatter";
  if (info.Length() < 4 || !info[1].IsArray() || !info[2].IsArray()) {
    throw MakeError(env, "EINVAL", fn, std::string(fn) + ": expected (direction, mappings[], ranges[], buffer)");
  }
  const Napi::Array mappings = info[1].As<Napi::Array>();
  const Napi::Array ranges = info[2].As<Napi::Array>();
  if (mappings.Length() != ranges.Length()) {
    throw MakeError(env, "EINVAL", fn,
                    std::string(fn) + ": " + std::to_string(mappings.Length()) + " mappings but " +
                        std::to_string(ranges.Length()) + " range lists; expected one range list per mapping");
  }
  if (!IsTypedArrayOf(info[3], napi_uint8_array)) {
    throw MakeError(env, "EINVAL", fn, std::string(fn) + ": the buffer must be a Uint8Array");
  }
  Napi::Uint8Array buffer = info[3].As<Napi::Uint8Array>();
  const Napi::Function constructor = AddonData::Of(env).mappingConstructor.Value();
  std::vector<CopySegment> segments;
  segments.reserve(mappings.Length());
  for (uint32_t i = 0; i < mappings.Length(); ++i) {
    const Napi::Value m = mappings.Get(i);
    const Napi::Value r = ranges.Get(i);
    if (!m.IsObject() || !m.As<Napi::Object>().InstanceOf(constructor)) {
      throw MakeError(env, "EINVAL", fn, std::string(fn) + ": mappings[" + std::to_string(i) + "] is not a Mapping");
    }
    if (!IsTypedArrayOf(r, napi_float64_array)) {
      throw MakeError(env, "EINVAL", fn,
                      std::string(fn) + ": ranges[" + std::to_string(i) +
                          "] must be a Float64Array of (mappingOffset, bufferOffset, length) triples");
    }
    Mapping* mapping = Mapping::Unwrap(m.As<Napi::Object>());
    if (!mapping->PrepareCopy(env, fn, r.As<Napi::Float64Array>(), buffer.ByteLength(), &segments)) {
      return ClosedRejection(env, fn, mapping->name_);
    }
  }
  return QueueCopy(env, direction == "gather" ? CopyDirection::kGather : CopyDirection::kScatter, buffer,
                   std::move(segments), guarded);
}

// prefault(offset, length, touch?): shm only; on CUDA memory (always resident) it resolves at once.
Napi::Value Mapping::Prefault(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const uint64_t offset = ByteCountArg(info, 0, "prefault", 0);
  const uint64_t length = ByteCountArg(info, 1, "prefault", 0);
  const bool touch = info.Length() > 2 && info[2].IsBoolean() && info[2].As<Napi::Boolean>().Value();
  if (offset > size_ || length > size_ - offset) {
    throw MakeError(env, "EINVAL_RANGE", "prefault",
                    "prefault on segment " + name_ + ": [" + std::to_string(offset) + ", +" + std::to_string(length) +
                        ") exceeds the mapping of " + std::to_string(size_) + " bytes");
  }
  if (state_ != State::kOpen) {
    return ClosedRejection(env, "prefault", name_);
  }
  if (IsCuda()) {
    Napi::Promise::Deferred done = Napi::Promise::Deferred::New(env);
    done.Resolve(env.Undefined());
    return done.Promise();
  }
  PrefaultWorker* worker = new PrefaultWorker(env, this, Value(), name_, base_, size_, base_ + offset,
                                              static_cast<size_t>(length), touch);
  Napi::Promise promise = worker->Promise();
  try {
    worker->Queue();
  } catch (...) {
    delete worker;
    throw;
  }
  ++inflight_;
  return promise;
}

// arrayBuffer(): one ArrayBuffer viewing the whole mapping (the same object on every call). The mapping's
// owner must not copy through it while closing; close() detaches it before munmap, so a late access
// sees an empty buffer, never unmapped memory. Device memory has no host view (EINVAL).
Napi::Value Mapping::AsArrayBuffer(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (state_ != State::kOpen) throw MakeError(env, "ECLOSED", "arrayBuffer", "mapping " + name_ + " is closed");
  if (IsCuda()) {
    throw MakeError(env, "EINVAL", "arrayBuffer",
                    "arrayBuffer: mapping " + name_ + " is CUDA device memory, which has no host view; use gather/scatter");
  }
  if (arrayBufferRef_.IsEmpty()) {
    Napi::ArrayBuffer view = Napi::ArrayBuffer::New(env, base_, size_, [](Napi::Env, void*) {});
    arrayBufferRef_ = Napi::Persistent(view);
  }
  return arrayBufferRef_.Value();
}

// ipcHandle(): the 64-byte cudaIpcMemHandle_t of a CUDA mapping (a copy); EINVAL for shm.
Napi::Value Mapping::IpcHandle(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!IsCuda()) {
    throw MakeError(env, "EINVAL", "ipcHandle", "ipcHandle: mapping " + name_ + " is shared memory, not CUDA memory");
  }
  Napi::Uint8Array out = Napi::Uint8Array::New(env, kCudaIpcHandleBytes);
  std::memcpy(out.Data(), handle_.reserved, kCudaIpcHandleBytes);
  return out;
}

Napi::Value Mapping::GetName(const Napi::CallbackInfo& info) { return Napi::String::New(info.Env(), name_); }

Napi::Value Mapping::GetSize(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(size_));
}

// True once close() was called: no new copy is accepted from then on.
Napi::Value Mapping::GetClosed(const Napi::CallbackInfo& info) {
  return Napi::Boolean::New(info.Env(), state_ != State::kOpen);
}

// "shm", "cuda_ipc" or "cuda_alloc".
Napi::Value Mapping::GetKind(const Napi::CallbackInfo& info) {
  const char* kind = backend_ == Backend::kShm ? "shm" : backend_ == Backend::kCudaIpc ? "cuda_ipc" : "cuda_alloc";
  return Napi::String::New(info.Env(), kind);
}

// shm: "<st_dev>:<st_ino>" of the segment when it was mapped; "" for CUDA memory.
Napi::Value Mapping::GetIdentity(const Napi::CallbackInfo& info) { return Napi::String::New(info.Env(), identity_); }

// The device's UUID as given ("cpu" for shm).
Napi::Value Mapping::GetDevice(const Napi::CallbackInfo& info) { return Napi::String::New(info.Env(), deviceUuid_); }

}  // namespace mpcache
