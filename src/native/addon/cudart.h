// The CUDA runtime, loaded at run time (DESIGN §4: "libcudart loaded at run
// time with dlopen; CPU machines never need CUDA"). Nothing here includes a
// CUDA header or links against CUDA: the handful of entry points the addon
// uses are declared below with their C ABI and resolved with dlsym.
//
// Which library: the path in MPCACHE_CUDART when set (and only that one: a
// test double, or a specific install), else the first of libcudart.so,
// libcudart.so.13, libcudart.so.12, libcudart.so.11.0 that dlopen finds.
// The choice is made once per process, on the first call of Load(); later
// calls return the same result, whatever the environment says then.
//
// "Available" means: the library loaded, every required symbol resolved,
// and cudaGetDeviceCount reported at least one device. Devices are
// enumerated once, with their UUIDs (cudaGetDeviceProperties[_v2], field
// `uuid` at byte 256 of cudaDeviceProp, stable since CUDA 10).
//
// Thread safety: Load() may run on any thread (it is called from the libuv
// pool); the result is immutable afterwards. The current device is
// per-thread in CUDA, so every operation on a pool thread calls
// cudaSetDevice first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace mpcache {

constexpr size_t kCudaIpcHandleBytes = 64;

// cudaIpcMemHandle_t: 64 opaque bytes, passed by value.
struct CudaIpcMemHandle {
  char reserved[kCudaIpcHandleBytes];
};

// cudaMemcpyKind values.
constexpr int kCudaMemcpyHostToDevice = 1;
constexpr int kCudaMemcpyDeviceToHost = 2;
// cudaIpcMemLazyEnablePeerAccess, cudaStreamNonBlocking.
constexpr unsigned kCudaIpcMemLazyEnablePeerAccess = 1;
constexpr unsigned kCudaStreamNonBlocking = 1;

// The C entry points, as cudart exports them (cudaError_t is an int-sized enum).
struct CudaApi {
  int (*GetDeviceCount)(int*) = nullptr;
  int (*GetDeviceProperties)(void*, int) = nullptr;  // cudaGetDeviceProperties_v2, else cudaGetDeviceProperties
  int (*SetDevice)(int) = nullptr;
  int (*IpcOpenMemHandle)(void**, CudaIpcMemHandle, unsigned) = nullptr;
  int (*IpcCloseMemHandle)(void*) = nullptr;
  int (*StreamCreateWithFlags)(void**, unsigned) = nullptr;
  int (*StreamDestroy)(void*) = nullptr;
  int (*MemcpyAsync)(void*, const void*, size_t, int, void*) = nullptr;
  int (*StreamSynchronize)(void*) = nullptr;
  const char* (*GetErrorString)(int) = nullptr;
  // Optional (every cudart since 6.5 has it): the enum's name, "cudaErrorLaunchFailure".
  const char* (*GetErrorName)(int) = nullptr;
  // Worker side (exporting memory); optional: absent ones fail only the calls that need them.
  int (*Malloc)(void**, size_t) = nullptr;
  int (*Free)(void*) = nullptr;
  int (*IpcGetMemHandle)(CudaIpcMemHandle*, void*) = nullptr;
  int (*MemGetInfo)(size_t*, size_t*) = nullptr;
};

struct CudaDevice {
  int ordinal;
  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L prints it.
  std::string uuid;
  // The 32 lowercase hex digits of the UUID, for matching.
  std::string hex;
};

class CudaRuntime {
 public:
  // The process-wide runtime. The first Load() decides; `overridePath` (when
  // non-empty) wins over MPCACHE_CUDART from the environment.
  static CudaRuntime& Get();
  void Load(const std::string& overridePath);

  bool available() const { return available_; }
  // Why not available: "libcudart not found: tried …", "… lacks symbol …",
  // "cudaGetDeviceCount failed: … (cudaError 35)", "no CUDA device".
  const std::string& reason() const { return reason_; }
  // The library that loaded (the name or path given to dlopen); empty when none.
  const std::string& library() const { return library_; }
  const std::vector<std::string>& tried() const { return tried_; }
  const std::vector<CudaDevice>& devices() const { return devices_; }
  const CudaApi& api() const { return api_; }

  // The ordinal of the device whose UUID is `uuid` ("GPU-…", "MIG-…", or the
  // bare UUID with or without dashes, any case); -1 when none.
  int OrdinalOf(const std::string& uuid) const;
  // The UUID of device `ordinal` ("GPU-…"); "device <n>" when it is not listed.
  std::string UuidOf(int ordinal) const;
  // The listed UUIDs, comma-separated, for error messages.
  std::string DeviceList() const;

  // "<call> failed: <cudaGetErrorString> (<cudaGetErrorName>, cudaError <n>)"; without cudaGetErrorName
  // "<call> failed: <cudaGetErrorString> (cudaError <n>)".
  std::string Describe(const char* call, int err) const;
  // The enum's name ("cudaErrorLaunchFailure", from cudaGetErrorName); "cudaError <n>" when unknown.
  std::string ErrorName(int err) const;

 private:
  CudaRuntime() = default;

  std::mutex mutex_;
  bool loaded_ = false;
  bool available_ = false;
  void* handle_ = nullptr;
  std::string reason_;
  std::string library_;
  std::vector<std::string> tried_;
  std::vector<CudaDevice> devices_;
  CudaApi api_;
};

// The canonical hex of a UUID string (strips "GPU-"/"MIG-" and dashes,
// lowercases); empty when it is not 32 hex digits.
std::string UuidHex(const std::string& uuid);

}  // namespace mpcache
