// HMAC-SHA256 on the libuv pool through the host Node's OpenSSL (see hmac.h).
//
// Why dlsym and not linking: the official Node binaries export OpenSSL's symbols for addons, but a Node
// built against another TLS library, or a future one that stops exporting them, must still load this addon
// (every other export works without OpenSSL). Each API is accepted only when every symbol it needs
// resolves and its output matches RFC 4231 test case 2 (fed in three parts, one of them empty), so a
// same-named symbol of another library with other semantics is never used.
//
// The OpenSSL 3 structures used here are its stable public ABI: OSSL_PARAM (openssl/core.h) is built only
// through OSSL_PARAM_construct_*; every other type is an opaque pointer.
#include "hmac.h"

#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"

namespace mpcache {

namespace {

constexpr size_t kTagBytes = 32;

// openssl/core.h's struct ossl_param_st, field for field.
struct OsslParam {
  const char* key;
  unsigned int dataType;
  void* data;
  size_t dataSize;
  size_t returnSize;
};

// OpenSSL 3's EVP_MAC API, with the HMAC implementation fetched once and kept for the process.
struct EvpMacApi {
  void* (*fetch)(void* libctx, const char* algorithm, const char* properties) = nullptr;
  void* (*ctxNew)(void* mac) = nullptr;
  void (*ctxFree)(void* ctx) = nullptr;
  int (*init)(void* ctx, const unsigned char* key, size_t keylen, const OsslParam* params) = nullptr;
  int (*update)(void* ctx, const unsigned char* data, size_t datalen) = nullptr;
  int (*final)(void* ctx, unsigned char* out, size_t* outl, size_t outsize) = nullptr;
  OsslParam (*utf8Param)(const char* key, char* buf, size_t bsize) = nullptr;
  OsslParam (*endParam)() = nullptr;
  void* hmac = nullptr;  // EVP_MAC* "HMAC"
};

// The HMAC_* API (OpenSSL 1.1, deprecated but present in 3).
struct LegacyHmacApi {
  void* (*ctxNew)() = nullptr;
  void (*ctxFree)(void* ctx) = nullptr;
  int (*initEx)(void* ctx, const void* key, int len, const void* md, void* engine) = nullptr;
  int (*update)(void* ctx, const unsigned char* data, size_t len) = nullptr;
  int (*final)(void* ctx, unsigned char* md, unsigned int* len) = nullptr;
  const void* (*sha256)() = nullptr;
};

enum class Api { kEvpMac, kLegacy };

// MAC jobs queued or running and not yet settled on the JS thread (hmacInFlight).
std::atomic<int64_t> inFlight{0};

const char* ApiName(Api api) { return api == Api::kEvpMac ? "evp_mac" : "hmac"; }

// One part of the message: a pointer into memory some JS object owns, and its length.
struct Part {
  const uint8_t* data;
  size_t length;
};

template <typename F>
bool Resolve(F* out, const char* name, std::string* missing) {
  void* symbol = dlsym(RTLD_DEFAULT, name);
  if (symbol == nullptr) {
    if (!missing->empty()) *missing += ", ";
    *missing += name;
    return false;
  }
  *out = reinterpret_cast<F>(symbol);
  return true;
}

// Computes the MAC with `api` into `out`; false (and `why`) when OpenSSL fails. Any thread.
bool Compute(Api api, const EvpMacApi& evp, const LegacyHmacApi& legacy, const std::vector<uint8_t>& key,
             const std::vector<Part>& parts, uint8_t* out, std::string* why) {
  static const uint8_t kNoKey = 0;  // an empty key still needs a non-null pointer
  const uint8_t* keyBytes = key.empty() ? &kNoKey : key.data();
  if (api == Api::kEvpMac) {
    void* ctx = evp.ctxNew(evp.hmac);
    if (ctx == nullptr) {
      *why = "EVP_MAC_CTX_new failed";
      return false;
    }
    char digest[] = "SHA256";
    const OsslParam params[2] = {evp.utf8Param("digest", digest, 0), evp.endParam()};
    bool ok = evp.init(ctx, keyBytes, key.size(), params) == 1;
    if (!ok) *why = "EVP_MAC_init(HMAC, SHA256) failed";
    for (size_t i = 0; ok && i < parts.size(); ++i) {
      if (parts[i].length == 0) continue;
      ok = evp.update(ctx, parts[i].data, parts[i].length) == 1;
      if (!ok) *why = "EVP_MAC_update failed";
    }
    size_t written = 0;
    if (ok) {
      ok = evp.final(ctx, out, &written, kTagBytes) == 1 && written == kTagBytes;
      if (!ok) *why = "EVP_MAC_final failed";
    }
    evp.ctxFree(ctx);
    return ok;
  }
  void* ctx = legacy.ctxNew();
  if (ctx == nullptr) {
    *why = "HMAC_CTX_new failed";
    return false;
  }
  bool ok = legacy.initEx(ctx, keyBytes, static_cast<int>(key.size()), legacy.sha256(), nullptr) == 1;
  if (!ok) *why = "HMAC_Init_ex(SHA256) failed";
  for (size_t i = 0; ok && i < parts.size(); ++i) {
    if (parts[i].length == 0) continue;
    ok = legacy.update(ctx, parts[i].data, parts[i].length) == 1;
    if (!ok) *why = "HMAC_Update failed";
  }
  unsigned int written = 0;
  if (ok) {
    ok = legacy.final(ctx, out, &written) == 1 && written == kTagBytes;
    if (!ok) *why = "HMAC_Final failed";
  }
  legacy.ctxFree(ctx);
  return ok;
}

// What resolved, once per process.
struct Backends {
  EvpMacApi evp;
  LegacyHmacApi legacy;
  std::vector<Api> apis;  // preferred first
  std::string reason;
};

// RFC 4231 §4.3, test case 2: key "Jefe", data "what do ya want for nothing?".
bool SelfTest(Api api, const EvpMacApi& evp, const LegacyHmacApi& legacy, std::string* why) {
  static const uint8_t kExpected[kTagBytes] = {0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24,
                                               0x26, 0x08, 0x95, 0x75, 0xc7, 0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27,
                                               0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43};
  const std::vector<uint8_t> key = {'J', 'e', 'f', 'e'};
  const char* data = "what do ya want for nothing?";
  const std::vector<Part> parts = {{reinterpret_cast<const uint8_t*>(data), 9},
                                   {reinterpret_cast<const uint8_t*>(data) + 9, 0},
                                   {reinterpret_cast<const uint8_t*>(data) + 9, std::strlen(data) - 9}};
  uint8_t out[kTagBytes];
  if (!Compute(api, evp, legacy, key, parts, out, why)) return false;
  if (std::memcmp(out, kExpected, kTagBytes) != 0) {
    *why = "its output differs from RFC 4231 test case 2";
    return false;
  }
  return true;
}

const Backends& GetBackends() {
  static const Backends backends = [] {
    Backends b;
    std::string reasons;
    const auto note = [&](const std::string& line) { reasons += (reasons.empty() ? "" : "; ") + line; };

    std::string missing;
    bool evpOk = Resolve(&b.evp.fetch, "EVP_MAC_fetch", &missing);
    evpOk = Resolve(&b.evp.ctxNew, "EVP_MAC_CTX_new", &missing) && evpOk;
    evpOk = Resolve(&b.evp.ctxFree, "EVP_MAC_CTX_free", &missing) && evpOk;
    evpOk = Resolve(&b.evp.init, "EVP_MAC_init", &missing) && evpOk;
    evpOk = Resolve(&b.evp.update, "EVP_MAC_update", &missing) && evpOk;
    evpOk = Resolve(&b.evp.final, "EVP_MAC_final", &missing) && evpOk;
    evpOk = Resolve(&b.evp.utf8Param, "OSSL_PARAM_construct_utf8_string", &missing) && evpOk;
    evpOk = Resolve(&b.evp.endParam, "OSSL_PARAM_construct_end", &missing) && evpOk;
    if (!evpOk) {
      note("EVP_MAC: this process does not export " + missing);
    } else if ((b.evp.hmac = b.evp.fetch(nullptr, "HMAC", nullptr)) == nullptr) {
      note("EVP_MAC: EVP_MAC_fetch(HMAC) found no implementation");
    } else if (std::string why; !SelfTest(Api::kEvpMac, b.evp, b.legacy, &why)) {
      note("EVP_MAC: " + why);
    } else {
      b.apis.push_back(Api::kEvpMac);
    }

    missing.clear();
    bool legacyOk = Resolve(&b.legacy.ctxNew, "HMAC_CTX_new", &missing);
    legacyOk = Resolve(&b.legacy.ctxFree, "HMAC_CTX_free", &missing) && legacyOk;
    legacyOk = Resolve(&b.legacy.initEx, "HMAC_Init_ex", &missing) && legacyOk;
    legacyOk = Resolve(&b.legacy.update, "HMAC_Update", &missing) && legacyOk;
    legacyOk = Resolve(&b.legacy.final, "HMAC_Final", &missing) && legacyOk;
    legacyOk = Resolve(&b.legacy.sha256, "EVP_sha256", &missing) && legacyOk;
    if (!legacyOk) {
      note("HMAC: this process does not export " + missing);
    } else if (std::string why; !SelfTest(Api::kLegacy, b.evp, b.legacy, &why)) {
      note("HMAC: " + why);
    } else {
      b.apis.push_back(Api::kLegacy);
    }
    b.reason = reasons;
    return b;
  }();
  return backends;
}

// One MAC job. The key is copied (and wiped at the end); the parts are read in place, each held by a
// reference so that no part's memory is collected before the job settles on the JS thread.
class HmacWorker : public Napi::AsyncWorker {
 public:
  HmacWorker(Napi::Env env, Api api, std::vector<uint8_t> key, std::vector<Part> parts,
             std::vector<Napi::ObjectReference> holds)
      : Napi::AsyncWorker(env, "mpcache.hmacSha256"),
        deferred_(Napi::Promise::Deferred::New(env)),
        api_(api),
        key_(std::move(key)),
        parts_(std::move(parts)),
        holds_(std::move(holds)) {
    inFlight++;
  }

  ~HmacWorker() override {
    explicit_bzero(key_.data(), key_.size());
    if (!settled_) inFlight--;
  }

  Napi::Promise Promise() const { return deferred_.Promise(); }

  void Execute() override {
    LowerPoolThreadPriority();
    const Backends& b = GetBackends();
    std::string why;
    if (!Compute(api_, b.evp, b.legacy, key_, parts_, tag_.data(), &why)) SetError(why);
  }

  // The count drops before the promise settles, so whoever awaits it sees the job gone.
  void OnOK() override {
    Settled();
    deferred_.Resolve(Napi::Buffer<uint8_t>::Copy(Env(), tag_.data(), tag_.size()));
  }

  void OnError(const Napi::Error& error) override {
    Settled();
    Napi::Env env = Env();
    deferred_.Reject(MakeError(env, "ECRYPTO", "hmacSha256",
                               std::string("HMAC-SHA256 (") + ApiName(api_) + ") failed: " + error.Message())
                         .Value());
  }

 private:
  void Settled() {
    if (!settled_) inFlight--;
    settled_ = true;
  }

  Napi::Promise::Deferred deferred_;
  bool settled_ = false;
  Api api_;
  std::vector<uint8_t> key_;
  std::vector<Part> parts_;
  std::vector<Napi::ObjectReference> holds_;
  std::array<uint8_t, kTagBytes> tag_{};
};

bool IsBytes(const Napi::Value& value) {
  return value.IsTypedArray() && value.As<Napi::TypedArray>().TypedArrayType() == napi_uint8_array;
}

}  // namespace

Napi::Value HmacProbe(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const Backends& b = GetBackends();
  Napi::Array apis = Napi::Array::New(env, b.apis.size());
  for (size_t i = 0; i < b.apis.size(); ++i) apis.Set(static_cast<uint32_t>(i), Napi::String::New(env, ApiName(b.apis[i])));
  Napi::Object out = Napi::Object::New(env);
  out.Set("apis", apis);
  out.Set("reason", Napi::String::New(env, b.reason));
  return out;
}

Napi::Value HmacInFlight(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(inFlight.load()));
}

Napi::Value HmacSha256(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const char* fn = "hmacSha256";
  if (info.Length() < 2 || !IsBytes(info[0]) || !info[1].IsArray()) {
    throw MakeError(env, "EINVAL", fn, "hmacSha256: expected (key: Uint8Array, parts: Uint8Array[], api?)");
  }
  const Backends& b = GetBackends();
  if (b.apis.empty()) {
    throw MakeError(env, "ENOSYS", fn, "hmacSha256: no OpenSSL HMAC in this process: " + b.reason);
  }
  Api api = b.apis.front();
  if (info.Length() > 2 && !info[2].IsUndefined()) {
    const std::string asked = info[2].IsString() ? info[2].As<Napi::String>().Utf8Value() : "";
    if (asked != "evp_mac" && asked != "hmac") {
      throw MakeError(env, "EINVAL", fn, "hmacSha256: api must be \"evp_mac\" or \"hmac\", got \"" + asked + "\"");
    }
    api = asked == "evp_mac" ? Api::kEvpMac : Api::kLegacy;
    bool found = false;
    for (Api a : b.apis) found = found || a == api;
    if (!found) throw MakeError(env, "ENOSYS", fn, "hmacSha256: " + asked + " is not available: " + b.reason);
  }
  Napi::Uint8Array keyArray = info[0].As<Napi::Uint8Array>();
  std::vector<uint8_t> key(keyArray.Data(), keyArray.Data() + keyArray.ByteLength());
  Napi::Array array = info[1].As<Napi::Array>();
  std::vector<Part> parts;
  std::vector<Napi::ObjectReference> holds;
  parts.reserve(array.Length());
  holds.reserve(array.Length());
  for (uint32_t i = 0; i < array.Length(); ++i) {
    Napi::Value v = array.Get(i);
    if (!IsBytes(v)) {
      explicit_bzero(key.data(), key.size());
      throw MakeError(env, "EINVAL", fn, "hmacSha256: part " + std::to_string(i) + " is not a Uint8Array");
    }
    Napi::Uint8Array part = v.As<Napi::Uint8Array>();
    parts.push_back(Part{part.Data(), part.ByteLength()});
    holds.push_back(Napi::Persistent(part.As<Napi::Object>()));
  }
  auto* worker = new HmacWorker(env, api, std::move(key), std::move(parts), std::move(holds));
  Napi::Promise promise = worker->Promise();
  worker->Queue();
  return promise;
}

}  // namespace mpcache
