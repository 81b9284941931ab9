#include "mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

#include "addon_data.h"
#include "common.h"

namespace mpcache {

namespace {

// What openMapping hands to the constructor through a Napi::External.
struct MappedSegment {
  std::string name;
  uint8_t* base;
  size_t size;
};

std::string FormatNumber(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

const char* const kTripleFields[3] = {"mappingOffset", "bufferOffset", "length"};

// Bulk copies run at a lower CPU priority than the JS thread (nice +10 on the
// libuv pool thread that runs them), so a multi-GiB transfer never starves
// the event loop that answers PING (DESIGN §4). Raising one's own niceness
// needs no privilege; a failure just leaves the priority as it was.
void LowerCopyThreadPriority() {
  static thread_local bool lowered = false;
  if (lowered) return;
  lowered = true;
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
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

// One gather or scatter: validated ranges copied on the libuv pool. Holds the
// mapping object and the buffer strongly until it completes on the JS thread.
class CopyWorker : public Napi::AsyncWorker {
 public:
  CopyWorker(Napi::Env env, CopyDirection direction, Mapping* mapping, Napi::Object mappingObject, uint8_t* base,
             Napi::Uint8Array buffer, std::vector<CopyRange> ranges)
      : Napi::AsyncWorker(env, direction == CopyDirection::kGather ? "mpcache.gather" : "mpcache.scatter"),
        deferred_(Napi::Promise::Deferred::New(env)),
        direction_(direction),
        mapping_(mapping),
        mappingRef_(Napi::Persistent(mappingObject)),
        bufferRef_(Napi::Persistent(buffer.As<Napi::Object>())),
        base_(base),
        buffer_(buffer.Data()),
        ranges_(std::move(ranges)) {}

  Napi::Promise Promise() const { return deferred_.Promise(); }

  // Thread pool: plain memcpy between two live mappings of this process.
  void Execute() override {
    LowerCopyThreadPriority();
    for (const CopyRange& r : ranges_) {
      if (r.length == 0) continue;
      if (direction_ == CopyDirection::kGather) {
        std::memcpy(buffer_ + r.bufferOffset, base_ + r.mappingOffset, r.length);
      } else {
        std::memcpy(base_ + r.mappingOffset, buffer_ + r.bufferOffset, r.length);
      }
    }
  }

  // JS thread: settle this copy first, then let the mapping finish a pending close.
  void OnOK() override {
    deferred_.Resolve(Env().Undefined());
    mapping_->CopyFinished();
  }

  void OnError(const Napi::Error& error) override {
    deferred_.Reject(error.Value());
    mapping_->CopyFinished();
  }

 private:
  Napi::Promise::Deferred deferred_;
  CopyDirection direction_;
  Mapping* mapping_;
  Napi::ObjectReference mappingRef_;
  Napi::ObjectReference bufferRef_;
  uint8_t* base_;
  uint8_t* buffer_;
  std::vector<CopyRange> ranges_;
};

// prefault(offset, length): populates the page tables of a range (MADV_POPULATE_WRITE, which leaves the
// contents alone; a read of each page where the kernel lacks it) so later copies into fresh memory do not
// pay the page faults. Counted as a copy in flight, so close() waits for it.
class PrefaultWorker : public Napi::AsyncWorker {
 public:
  PrefaultWorker(Napi::Env env, Mapping* mapping, Napi::Object mappingObject, uint8_t* base, size_t length)
      : Napi::AsyncWorker(env, "mpcache.prefault"),
        deferred_(Napi::Promise::Deferred::New(env)),
        mapping_(mapping),
        mappingRef_(Napi::Persistent(mappingObject)),
        base_(base),
        length_(length) {}

  Napi::Promise Promise() const { return deferred_.Promise(); }

  void Execute() override {
    LowerCopyThreadPriority();
#ifdef MADV_POPULATE_WRITE
    if (madvise(base_, length_, MADV_POPULATE_WRITE) == 0) return;
#endif
    const long page = sysconf(_SC_PAGESIZE);
    volatile uint8_t sink = 0;
    for (size_t off = 0; off < length_; off += static_cast<size_t>(page)) sink = sink + base_[off];
  }

  void OnOK() override {
    deferred_.Resolve(Env().Undefined());
    mapping_->CopyFinished();
  }

  void OnError(const Napi::Error& error) override {
    deferred_.Reject(error.Value());
    mapping_->CopyFinished();
  }

 private:
  Napi::Promise::Deferred deferred_;
  Mapping* mapping_;
  Napi::ObjectReference mappingRef_;
  uint8_t* base_;
  size_t length_;
};

}  // namespace

Napi::Function Mapping::DefineClass(Napi::Env env) {
  return ObjectWrap<Mapping>::DefineClass(
      env, "Mapping",
      {
          InstanceMethod<&Mapping::Gather>("gather"),
          InstanceMethod<&Mapping::Scatter>("scatter"),
          InstanceMethod<&Mapping::Close>("close"),
          InstanceMethod<&Mapping::Prefault>("prefault"),
          InstanceMethod<&Mapping::AsArrayBuffer>("arrayBuffer"),
          InstanceAccessor<&Mapping::GetName>("name"),
          InstanceAccessor<&Mapping::GetSize>("size"),
          InstanceAccessor<&Mapping::GetClosed>("closed"),
      });
}

// openMapping(name, nbytes): shm_open O_RDWR, fstat, refuse a segment shorter
// than nbytes (EINVAL_SIZE: touching pages past its end would raise SIGBUS),
// mmap nbytes shared read/write, close the descriptor.
Napi::Value Mapping::Open(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const std::string name = SegmentNameArg(info, 0, "openMapping");
  const uint64_t nbytes = ByteCountArg(info, 1, "openMapping", 1);
  const int fd = shm_open(ShmPath(name).c_str(), O_RDWR, 0);
  if (fd < 0) throw ErrnoError(env, "shm_open", name, errno);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    throw ErrnoError(env, "fstat", name, err);
  }
  const uint64_t segmentBytes = st.st_size < 0 ? 0 : static_cast<uint64_t>(st.st_size);
  if (segmentBytes < nbytes) {
    close(fd);
    throw MakeError(env, "EINVAL_SIZE", "openMapping",
                    "openMapping: segment " + name + " holds " + std::to_string(segmentBytes) +
                        " bytes, the descriptor claims " + std::to_string(nbytes));
  }
  void* base = mmap(nullptr, static_cast<size_t>(nbytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (base == MAP_FAILED) throw ErrnoError(env, "mmap", name, err);
  Counters().openMappings.fetch_add(1);
  Counters().mappedBytes.fetch_add(static_cast<int64_t>(nbytes));

  MappedSegment segment{name, static_cast<uint8_t*>(base), static_cast<size_t>(nbytes)};
  try {
    return AddonData::Of(env).mappingConstructor.New({Napi::External<MappedSegment>::New(env, &segment)});
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

Mapping::Mapping(const Napi::CallbackInfo& info) : Napi::ObjectWrap<Mapping>(info) {
  if (info.Length() != 1 || !info[0].IsExternal()) {
    throw MakeError(info.Env(), "EINVAL", "Mapping", "Mapping: use openMapping(name, nbytes) to map a segment");
  }
  MappedSegment* segment = info[0].As<Napi::External<MappedSegment>>().Data();
  name_ = segment->name;
  base_ = segment->base;
  size_ = segment->size;
  segment->base = nullptr;  // ownership taken
  state_ = State::kOpen;
}

// GC safety net: a mapping dropped without close() is unmapped here. A copy in
// flight holds a strong reference, so the GC cannot get here under one; at
// environment teardown (process exit) a copy may still run, and the mapping
// is then left to the exit rather than pulled from under it.
Mapping::~Mapping() {
  if (base_ != nullptr && inflight_ == 0) Unmap();
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

void Mapping::FinishClose() {
  // JS views of this memory become empty (byteLength 0) instead of pointing at unmapped pages.
  if (!arrayBufferRef_.IsEmpty()) {
    Napi::ArrayBuffer view = arrayBufferRef_.Value();
    if (!view.IsDetached()) view.Detach();
    arrayBufferRef_.Reset();
  }
  unmapError_ = Unmap();
  state_ = State::kClosed;
  std::vector<Napi::Promise::Deferred> waiters = std::move(closeWaiters_);
  closeWaiters_.clear();
  Napi::Env env = Env();
  for (const Napi::Promise::Deferred& waiter : waiters) {
    if (unmapError_ == 0) {
      waiter.Resolve(env.Undefined());
    } else {
      waiter.Reject(ErrnoError(env, "munmap", name_, unmapError_).Value());
    }
  }
}

void Mapping::CopyFinished() {
  if (inflight_ > 0) --inflight_;
  if (inflight_ == 0 && state_ == State::kClosing) FinishClose();
}

// close(): stop taking copies, wait for those in flight, munmap, resolve.
// Every call gets a promise settled after that one munmap.
Napi::Value Mapping::Close(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Promise::Deferred deferred = Napi::Promise::Deferred::New(env);
  if (state_ == State::kClosed) {
    if (unmapError_ == 0) {
      deferred.Resolve(env.Undefined());
    } else {
      deferred.Reject(ErrnoError(env, "munmap", name_, unmapError_).Value());
    }
    return deferred.Promise();
  }
  state_ = State::kClosing;
  closeWaiters_.push_back(deferred);
  if (inflight_ == 0) FinishClose();
  return deferred.Promise();
}

Napi::Value Mapping::Gather(const Napi::CallbackInfo& info) { return Copy(info, CopyDirection::kGather); }

Napi::Value Mapping::Scatter(const Napi::CallbackInfo& info) { return Copy(info, CopyDirection::kScatter); }

Napi::Value Mapping::Copy(const Napi::CallbackInfo& info, CopyDirection direction) {
  Napi::Env env = info.Env();
  const char* fn = direction == CopyDirection::kGather ? "gather" : "scatter";
  if (info.Length() < 2 || !info[0].IsTypedArray() ||
      info[0].As<Napi::TypedArray>().TypedArrayType() != napi_float64_array) {
    throw MakeError(env, "EINVAL", fn,
                    std::string(fn) + ": ranges must be a Float64Array of (mappingOffset, bufferOffset, length) triples");
  }
  if (!info[1].IsTypedArray() || info[1].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array) {
    throw MakeError(env, "EINVAL", fn, std::string(fn) + ": the buffer must be a Uint8Array");
  }
  if (state_ != State::kOpen) {
    Napi::Promise::Deferred rejected = Napi::Promise::Deferred::New(env);
    rejected.Reject(MakeError(env, "ECLOSED", fn, "mapping " + name_ + " is closed").Value());
    return rejected.Promise();
  }
  Napi::Uint8Array buffer = info[1].As<Napi::Uint8Array>();
  // A detached buffer reports byteLength 0, so any non-empty range is refused below.
  std::vector<CopyRange> ranges =
      ValidateRanges(env, fn, name_, info[0].As<Napi::Float64Array>(), size_, buffer.ByteLength());

  CopyWorker* worker = new CopyWorker(env, direction, this, Value(), base_, buffer, std::move(ranges));
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

Napi::Value Mapping::Prefault(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const uint64_t offset = ByteCountArg(info, 0, "prefault", 0);
  const uint64_t length = ByteCountArg(info, 1, "prefault", 0);
  if (offset > size_ || length > size_ - offset) {
    throw MakeError(env, "EINVAL_RANGE", "prefault",
                    "prefault on segment " + name_ + ": [" + std::to_string(offset) + ", +" + std::to_string(length) +
                        ") exceeds the mapping of " + std::to_string(size_) + " bytes");
  }
  if (state_ != State::kOpen) {
    Napi::Promise::Deferred rejected = Napi::Promise::Deferred::New(env);
    rejected.Reject(MakeError(env, "ECLOSED", "prefault", "mapping " + name_ + " is closed").Value());
    return rejected.Promise();
  }
  PrefaultWorker* worker = new PrefaultWorker(env, this, Value(), base_ + offset, static_cast<size_t>(length));
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
// sees an empty buffer, never unmapped memory.
Napi::Value Mapping::AsArrayBuffer(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (state_ != State::kOpen) throw MakeError(env, "ECLOSED", "arrayBuffer", "mapping " + name_ + " is closed");
  if (arrayBufferRef_.IsEmpty()) {
    Napi::ArrayBuffer view = Napi::ArrayBuffer::New(env, base_, size_, [](Napi::Env, void*) {});
    arrayBufferRef_ = Napi::Persistent(view);
  }
  return arrayBufferRef_.Value();
}

Napi::Value Mapping::GetName(const Napi::CallbackInfo& info) { return Napi::String::New(info.Env(), name_); }

Napi::Value Mapping::GetSize(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(size_));
}

// True once close() was called: no new copy is accepted from then on.
Napi::Value Mapping::GetClosed(const Napi::CallbackInfo& info) {
  return Napi::Boolean::New(info.Env(), state_ != State::kOpen);
}

}  // namespace mpcache
