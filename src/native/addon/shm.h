// Segment-level exports of the addon (see shm.cc).
#pragma once

#include <napi.h>

namespace mpcache {

Napi::Value ShmCreate(const Napi::CallbackInfo& info);
Napi::Value ShmUnlink(const Napi::CallbackInfo& info);
Napi::Value ShmSize(const Napi::CallbackInfo& info);
Napi::Value ShmUnlinkIf(const Napi::CallbackInfo& info);
Napi::Value Stats(const Napi::CallbackInfo& info);
Napi::Value GuardedFaults(const Napi::CallbackInfo& info);

}  // namespace mpcache
