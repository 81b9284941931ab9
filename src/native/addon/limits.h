// Process limits and process-wide state the server sets once at start (issue 24 items 1 and 11).
//   raiseDescriptorLimit() -> { soft, hard, before }   RLIMIT_NOFILE's soft limit raised to the hard one
//   seedLibzmqRandom() -> seed                         srand(3) from the kernel's CSPRNG (getrandom)
#pragma once

#include <napi.h>

namespace mpcache {

Napi::Value RaiseDescriptorLimit(const Napi::CallbackInfo& info);
Napi::Value SeedLibzmqRandom(const Napi::CallbackInfo& info);

}  // namespace mpcache
