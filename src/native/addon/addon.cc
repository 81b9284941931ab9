// mpcache_native: the Node-API addon behind src/native/Native.ts (DESIGN §4).
// It owns every raw memory mapping of the server. Exports:
//   shmCreate(name, nbytes), shmUnlink(name), shmSize(name) -> bytes
//   shmUnlinkIf(name, identity) -> "unlinked" | "replaced" | "absent"
//   openMapping(name, nbytes) -> Mapping { gather, scatter, close, prefault, arrayBuffer, ipcHandle,
//                                          name, size, closed, kind, device, identity }
//   openMappingFd(fd, name, nbytes) -> Mapping                              (cpu_memfd: a passed descriptor)
//   memfdCreate, fdInfo, closeFd, sendFds, listenFds                         (descriptor passing, fdpass.h)
//   openCudaIpcMapping(ipcHandle, deviceUuid, nbytes) -> Promise<Mapping>   (cuda_ipc, see cudart.h)
//   cudaAllocate(deviceUuid, nbytes) -> Promise<Mapping>                     (worker side: cudaMalloc + IPC handle)
//   cudaProbe(libraryPath?) -> Promise<{ available, reason, library, tried, devices: [{ ordinal, uuid }] }>
//   cudaMemGetInfo(deviceUuid) -> Promise<{ free, total }>
//   copyBatch(direction, mappings[], ranges[], buffer) -> Promise<void>   (one copy job over many mappings)
//   copyBatchUnguarded(...) -> Promise<void>   (the same, shm copies outside the fault guard: bench only)
//   stats() -> { openMappings, mappedBytes }   (every backend)
//   guardedFaults() -> copies and prefaults ended by a guarded fault since the process started
//   raiseDescriptorLimit(), seedLibzmqRandom()                              (process limits, limits.h)
//   hmacProbe() -> { apis, reason }, hmacSha256(key, parts, api?) -> Promise<Buffer>, hmacInFlight()   (hmac.h)
//   scanAcceptedSockets(address) -> Promise<[fd, inode][]>, shutdownSocket(fd, inode)   (sockets.h)
// Loading it installs the process-wide fault guard of copies (guard.h).
// Names are POSIX shared-memory names without their leading slash. Errors are
// JS Errors with string `code` and `call` properties (see common.h).
#include <napi.h>

#include "addon_data.h"
#include "fdpass.h"
#include "guard.h"
#include "hmac.h"
#include "limits.h"
#include "mapping.h"
#include "shm.h"
#include "sockets.h"

namespace mpcache {

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  // Once per process: the SIGBUS/SIGSEGV guard of copies of worker memory (guard.h, issue 13 item 1).
  InstallFaultGuard();
  AddonData* data = new AddonData();
  data->mappingConstructor = Napi::Persistent(Mapping::DefineClass(env));
  env.SetInstanceData<AddonData>(data);

  exports.Set("shmCreate", Napi::Function::New<ShmCreate>(env, "shmCreate"));
  exports.Set("shmUnlink", Napi::Function::New<ShmUnlink>(env, "shmUnlink"));
  exports.Set("shmSize", Napi::Function::New<ShmSize>(env, "shmSize"));
  exports.Set("shmUnlinkIf", Napi::Function::New<ShmUnlinkIf>(env, "shmUnlinkIf"));
  exports.Set("openMapping", Napi::Function::New<Mapping::Open>(env, "openMapping"));
  exports.Set("openMappingFd", Napi::Function::New<Mapping::OpenFd>(env, "openMappingFd"));
  exports.Set("memfdCreate", Napi::Function::New<MemfdCreate>(env, "memfdCreate"));
  exports.Set("fdInfo", Napi::Function::New<FdInfo>(env, "fdInfo"));
  exports.Set("closeFd", Napi::Function::New<CloseFd>(env, "closeFd"));
  exports.Set("sendFds", Napi::Function::New<SendFds>(env, "sendFds"));
  exports.Set("listenFds", Napi::Function::New<ListenFds>(env, "listenFds"));
  exports.Set("openCudaIpcMapping", Napi::Function::New<Mapping::OpenCudaIpc>(env, "openCudaIpcMapping"));
  exports.Set("cudaAllocate", Napi::Function::New<Mapping::CudaAllocate>(env, "cudaAllocate"));
  exports.Set("copyBatch", Napi::Function::New<Mapping::CopyBatch>(env, "copyBatch"));
  // bench/transfer/transfer.ts only: the same job without the fault guard, to measure the guard's cost.
  exports.Set("copyBatchUnguarded", Napi::Function::New<Mapping::CopyBatchUnguarded>(env, "copyBatchUnguarded"));
  exports.Set("cudaProbe", Napi::Function::New<CudaProbe>(env, "cudaProbe"));
  exports.Set("cudaMemGetInfo", Napi::Function::New<CudaMemGetInfo>(env, "cudaMemGetInfo"));
  exports.Set("stats", Napi::Function::New<Stats>(env, "stats"));
  exports.Set("guardedFaults", Napi::Function::New<GuardedFaults>(env, "guardedFaults"));
  exports.Set("raiseDescriptorLimit", Napi::Function::New<RaiseDescriptorLimit>(env, "raiseDescriptorLimit"));
  exports.Set("seedLibzmqRandom", Napi::Function::New<SeedLibzmqRandom>(env, "seedLibzmqRandom"));
  exports.Set("hmacProbe", Napi::Function::New<HmacProbe>(env, "hmacProbe"));
  exports.Set("hmacSha256", Napi::Function::New<HmacSha256>(env, "hmacSha256"));
  exports.Set("hmacInFlight", Napi::Function::New<HmacInFlight>(env, "hmacInFlight"));
  exports.Set("scanAcceptedSockets", Napi::Function::New<ScanAcceptedSockets>(env, "scanAcceptedSockets"));
  exports.Set("shutdownSocket", Napi::Function::New<ShutdownSocket>(env, "shutdownSocket"));
  return exports;
}

}  // namespace mpcache

// NODE_API_MODULE pastes the name into an identifier: no qualified name here.
static Napi::Object InitMpcacheNative(Napi::Env env, Napi::Object exports) { return mpcache::Init(env, exports); }

NODE_API_MODULE(mpcache_native, InitMpcacheNative)
