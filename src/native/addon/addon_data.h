// Per-environment state of the addon (one per main thread or worker thread
// that loads it), kept as Node-API instance data.
#pragma once

#include <napi.h>

namespace mpcache {

struct AddonData {
  // The Mapping class, used by openMapping to construct instances.
  Napi::FunctionReference mappingConstructor;

  static AddonData& Of(Napi::Env env) { return *env.GetInstanceData<AddonData>(); }
};

}  // namespace mpcache
