# The mpcache native addon (DESIGN §1, §4): Node-API only, C++17, -O3, C++
# exceptions on (NAPI_CPP_EXCEPTIONS). Built by scripts/build-native.mjs,
# which passes napi_include_dir (node-addon-api's napi.h) and a local
# --nodedir so that node-gyp never downloads Node's headers. No CUDA header
# or library is needed: libcudart is dlopen'ed at run time (cudart.h).
{
  "variables": {
    # Where napi.h lives; the build script passes the resolved path.
    "napi_include_dir%": "../../../node_modules/node-addon-api"
  },
  "targets": [
    {
      "target_name": "mpcache_native",
      "sources": ["addon.cc", "common.cc", "cudart.cc", "fdlisten.cc", "fdpass.cc", "fdrelease.cc", "guard.cc", "hmac.cc", "limits.cc", "mapping.cc", "shm.cc", "sockets.cc"],
      "include_dirs": ["<(napi_include_dir)"],
      "defines": ["NAPI_VERSION=8", "NAPI_CPP_EXCEPTIONS", "NODE_ADDON_API_DISABLE_DEPRECATED"],
      "cflags!": ["-fno-exceptions"],
      "cflags_cc!": ["-fno-exceptions", "-fno-rtti", "-std=gnu++17", "-std=gnu++20", "-std=c++20"],
      "cflags": ["-O3", "-Wall", "-Wextra"],
      "cflags_cc": ["-std=c++17", "-fexceptions"],
      "conditions": [
        ["OS=='linux'", { "libraries": ["-lrt", "-ldl"] }],
        ["OS=='mac'", {
          "xcode_settings": {
            "GCC_ENABLE_CPP_EXCEPTIONS": "YES",
            "CLANG_CXX_LANGUAGE_STANDARD": "c++17",
            "GCC_OPTIMIZATION_LEVEL": "3"
          }
        }]
      ]
    }
  ]
}
