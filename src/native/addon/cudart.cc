#include "cudart.h"

#include <dlfcn.h>

#include <cctype>
#include <cstdlib>
#include <cstring>

namespace mpcache {

namespace {

// Names tried when MPCACHE_CUDART is not set, in order.
const char* const kLibraryNames[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"};

// Offset of `cudaUUID_t uuid` in cudaDeviceProp (after `char name[256]`), and a
// buffer far larger than any cudaDeviceProp so far (about 1 KiB in CUDA 12/13).
constexpr size_t kPropUuidOffset = 256;
constexpr size_t kPropBufferBytes = 16384;

std::string FormatUuid(const unsigned char* b) {
  static const char* digits = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += digits[b[i] >> 4];
    out += digits[b[i] & 15];
  }
  return out;
}

template <typename Fn>
bool Resolve(void* handle, const char* name, Fn*& out) {
  out = reinterpret_cast<Fn*>(dlsym(handle, name));
  return out != nullptr;
}

}  // namespace

std::string UuidHex(const std::string& uuid) {
  std::string s = uuid;
  if (s.size() > 4 && (s.compare(0, 4, "GPU-") == 0 || s.compare(0, 4, "MIG-") == 0 || s.compare(0, 4, "gpu-") == 0 ||
                       s.compare(0, 4, "mig-") == 0)) {
    s = s.substr(4);
  }
  std::string hex;
  for (char c : s) {
    if (c == '-') continue;
    if (!std::isxdigit(static_cast<unsigned char>(c))) return "";
    hex += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return hex.size() == 32 ? hex : "";
}

CudaRuntime& CudaRuntime::Get() {
  // Never destroyed: cudart may still be called from pool threads at exit.
  static CudaRuntime* runtime = new CudaRuntime();
  return *runtime;
}

void CudaRuntime::Load(const std::string& overridePath) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (loaded_) return;
  loaded_ = true;

  std::vector<std::string> candidates;
  std::string fromEnv;
  if (!overridePath.empty()) {
    candidates.push_back(overridePath);
  } else if (const char* env = std::getenv("MPCACHE_CUDART"); env != nullptr && env[0] != '\0') {
    candidates.push_back(env);
  } else {
    for (const char* name : kLibraryNames) candidates.push_back(name);
  }
  std::string lastDlError;
  for (const std::string& name : candidates) {
    tried_.push_back(name);
    dlerror();
    handle_ = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ != nullptr) {
      library_ = name;
      break;
    }
    const char* why = dlerror();
    lastDlError = why != nullptr ? why : "";
  }
  if (handle_ == nullptr) {
    std::string list;
    for (size_t i = 0; i < tried_.size(); ++i) list += (i == 0 ? "" : ", ") + tried_[i];
    reason_ = "libcudart not found: tried " + list;
    // A path given explicitly that exists but does not load deserves dlopen's own words.
    if (candidates.size() == 1 && !lastDlError.empty() && lastDlError.find("No such file") == std::string::npos) {
      reason_ += " (" + lastDlError + ")";
    }
    return;
  }

  const char* missing = nullptr;
  if (!Resolve(handle_, "cudaGetDeviceCount", api_.GetDeviceCount)) missing = "cudaGetDeviceCount";
  if (!Resolve(handle_, "cudaGetDeviceProperties_v2", api_.GetDeviceProperties) &&
      !Resolve(handle_, "cudaGetDeviceProperties", api_.GetDeviceProperties)) {
    missing = "cudaGetDeviceProperties";
  }
  if (!Resolve(handle_, "cudaSetDevice", api_.SetDevice)) missing = "cudaSetDevice";
  if (!Resolve(handle_, "cudaIpcOpenMemHandle", api_.IpcOpenMemHandle)) missing = "cudaIpcOpenMemHandle";
  if (!Resolve(handle_, "cudaIpcCloseMemHandle", api_.IpcCloseMemHandle)) missing = "cudaIpcCloseMemHandle";
  if (!Resolve(handle_, "cudaStreamCreateWithFlags", api_.StreamCreateWithFlags)) missing = "cudaStreamCreateWithFlags";
  if (!Resolve(handle_, "cudaStreamDestroy", api_.StreamDestroy)) missing = "cudaStreamDestroy";
  if (!Resolve(handle_, "cudaMemcpyAsync", api_.MemcpyAsync)) missing = "cudaMemcpyAsync";
  if (!Resolve(handle_, "cudaStreamSynchronize", api_.StreamSynchronize)) missing = "cudaStreamSynchronize";
  if (!Resolve(handle_, "cudaGetErrorString", api_.GetErrorString)) missing = "cudaGetErrorString";
  Resolve(handle_, "cudaGetErrorName", api_.GetErrorName);
  Resolve(handle_, "cudaMalloc", api_.Malloc);
  Resolve(handle_, "cudaFree", api_.Free);
  Resolve(handle_, "cudaIpcGetMemHandle", api_.IpcGetMemHandle);
  Resolve(handle_, "cudaMemGetInfo", api_.MemGetInfo);
  if (missing != nullptr) {
    reason_ = library_ + " lacks symbol " + missing;
    return;
  }

  int count = 0;
  const int err = api_.GetDeviceCount(&count);
  if (err != 0) {
    reason_ = library_ + " loaded, but " + Describe("cudaGetDeviceCount", err);
    return;
  }
  if (count <= 0) {
    reason_ = library_ + " loaded, but it reports no CUDA device";
    return;
  }
  std::vector<unsigned char> prop(kPropBufferBytes);
  for (int i = 0; i < count; ++i) {
    std::memset(prop.data(), 0, prop.size());
    const int perr = api_.GetDeviceProperties(prop.data(), i);
    if (perr != 0) {
      reason_ = library_ + " loaded, but " + Describe("cudaGetDeviceProperties", perr) + " for device " +
                std::to_string(i);
      devices_.clear();
      return;
    }
    CudaDevice device{i, FormatUuid(prop.data() + kPropUuidOffset), ""};
    device.hex = UuidHex(device.uuid);
    devices_.push_back(device);
  }
  available_ = true;
}

int CudaRuntime::OrdinalOf(const std::string& uuid) const {
  const std::string hex = UuidHex(uuid);
  if (hex.empty()) return -1;
  for (const CudaDevice& d : devices_) {
    if (d.hex == hex) return d.ordinal;
  }
  return -1;
}

std::string CudaRuntime::UuidOf(int ordinal) const {
  for (const CudaDevice& d : devices_) {
    if (d.ordinal == ordinal) return d.uuid;
  }
  return "device " + std::to_string(ordinal);
}

std::string CudaRuntime::DeviceList() const {
  std::string out;
  for (size_t i = 0; i < devices_.size(); ++i) out += (i == 0 ? "" : ", ") + devices_[i].uuid;
  return out.empty() ? "none" : out;
}

std::string CudaRuntime::Describe(const char* call, int err) const {
  const char* text = api_.GetErrorString != nullptr ? api_.GetErrorString(err) : nullptr;
  const char* name = api_.GetErrorName != nullptr ? api_.GetErrorName(err) : nullptr;
  return std::string(call) + " failed: " + (text != nullptr ? text : "unknown error") + " (" +
         (name != nullptr ? std::string(name) + ", " : std::string()) + "cudaError " + std::to_string(err) + ")";
}

std::string CudaRuntime::ErrorName(int err) const {
  const char* name = api_.GetErrorName != nullptr ? api_.GetErrorName(err) : nullptr;
  return name != nullptr ? std::string(name) : "cudaError " + std::to_string(err);
}

}  // namespace mpcache
