/*
 * A fake libcudart for tests: the handful of CUDA runtime entry points the
 * mpcache addon dlopen's (src/native/addon/cudart.h), implemented over host
 * memory with the same C ABI, so the cuda_ipc backend can be tested on a
 * machine without a GPU. Selected with MPCACHE_CUDART=<path of this .so>.
 *
 * Built by the tests (test/support/FakeCudart.ts):
 *   cc -shared -fPIC -O2 -o <tmp>/libfakecudart.so fakecudart.c -lpthread -lrt
 *
 * Model:
 *   devices      FAKECUDART_DEVICES of them (default 2; 0: cudaGetDeviceCount
 *                fails with cudaErrorNoDevice), UUID of device i:
 *                GPU-facec0da-0000-4000-8000-00000000000<i>.
 *   allocation   cudaMalloc creates a POSIX shm segment
 *                "/fakecuda-<state inode>-<pid>-<slot>" and maps it; the
 *                "device pointer" is that host address.
 *   IPC handle   64 bytes: "FAKECUDA", u32 device, u32 slot, u64 size, the
 *                segment name (NUL-terminated, from byte 24). Any process
 *                opens it with cudaIpcOpenMemHandle (shm_open + mmap);
 *                cudaIpcCloseMemHandle unmaps.
 *   freeing      an allocation is live while its owner has not freed it and
 *                is alive, or while any process holds it open; the segment
 *                is unlinked ("the driver frees it") once it is not.
 *                cudaMemGetInfo: free = total - live bytes on the device.
 *   streams      a thread each; cudaMemcpyAsync queues, the thread copies
 *                (after copy_delay_ms of the state, initially
 *                FAKECUDART_COPY_DELAY_MS, default 0; tests rewrite it),
 *                cudaStreamSynchronize waits for the queue to drain. A caller
 *                that resolves before synchronising sees stale bytes.
 *   current dev  per thread (cudaSetDevice), as in CUDA.
 *
 * Counters, shared by every process that loads this same file: a state file
 * (FAKECUDART_STATE, default "<path of this .so>.state"), mapped shared;
 * layout in struct fake_state below (little-endian int64s; the tests read it).
 * Failures on demand (mpcache issue 13 item 4: a handle the driver refuses,
 * a device lost mid-copy, a sticky error), armed in the state file's header
 * (fail_point, fail_error, fail_mode, fail_skip; the tests write them at any
 * time, test/support/FakeCudart.ts setFakeFailure) or at load time from
 * FAKECUDART_FAIL="<point>:<cudaError>[:<mode>[:<skip>]]", e.g.
 * "sync:719:sticky". Only the importing side is hit: the points are
 *   ipc_open   cudaIpcOpenMemHandle returns the error (nothing is mapped);
 *   memcpy     cudaMemcpyAsync to or from an IPC-imported region returns the
 *              error (nothing queued);
 *   sync       such a copy is queued but "the device is lost" under it: the
 *              stream skips it (its bytes are never copied) and the next
 *              cudaStreamSynchronize of that stream returns the error;
 * so an exporter's own copies to its allocations never fail. `fail_skip`
 * matching calls pass first (a failure in the middle of a batch). Modes:
 *   once    (0) one failure, then the point disarms itself;
 *   always  (1) every matching call fails until the point is cleared;
 *   sticky  (2) one failure, after which every later call of the process
 *               that hit it (set device, copies, synchronize, IPC open and
 *               close, streams, malloc, free, mem info) returns the same
 *               error, as a CUDA context does after cudaErrorLaunchFailure,
 *               an ECC error or a lost device; the process must exit to
 *               recover. The process's IPC mappings then stay mapped (their
 *               close fails), like a real broken context's.
 * `failures` counts the failures injected (all processes; sticky repeats are
 * not counted). cudaGetErrorName/cudaGetErrorString know the codes used.
 *
 * `violations` counts misuse the real driver would punish: closing an IPC
 * mapping with copies queued on it, closing one twice or one never opened,
 * copying through an unknown device pointer, destroying an unknown stream,
 * and destroying a stream before the mapping it copied to or from is closed
 * (mpcache's release order is: copies done, IPC close or free, then stream).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef struct {
  char reserved[64];
} cudaIpcMemHandle_t;

enum {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorDevicesUnavailable = 46,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorDeviceUninitialized = 201,
  cudaErrorMapBufferObjectFailed = 205,
  cudaErrorECCUncorrectable = 214,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchFailure = 719,
  cudaErrorUnknown = 999
};

/* Failure points and modes (see the header comment). */
enum { FAIL_NONE = 0, FAIL_IPC_OPEN = 1, FAIL_MEMCPY = 2, FAIL_SYNC = 3 };
enum { FAIL_ONCE = 0, FAIL_ALWAYS = 1, FAIL_STICKY = 2 };

#define FAKE_MAX_SLOTS 1024
#define FAKE_MAGIC 0x5452414455434b46LL /* "FKCUDART" */

/* One device allocation, shared by all processes: 8 int64s. */
struct fake_slot {
  int64_t owner_pid; /* 0: unused */
  int64_t device;
  int64_t size;
  int64_t freed;       /* the owner called cudaFree */
  int64_t import_refs; /* IPC opens not yet closed, all processes */
  int64_t opens;       /* cudaIpcOpenMemHandle calls that succeeded */
  int64_t closes;      /* cudaIpcCloseMemHandle calls that succeeded */
  int64_t unlinked;    /* the segment is gone */
};

/* The state file: a 16-int64 header, then the slots. */
struct fake_state {
  int64_t magic;
  int64_t ipc_opens;
  int64_t ipc_closes;
  int64_t mallocs;
  int64_t frees;
  int64_t streams_created;
  int64_t streams_destroyed;
  int64_t memcpys;
  int64_t syncs;
  int64_t violations;
  int64_t next_slot;
  int64_t peer_opens;    /* opens whose handle's device is not the caller's current device */
  int64_t copy_delay_ms; /* each queued copy sleeps this long first; tests may write it at any time */
  int64_t fail_point;    /* FAIL_*: where the next injected failure hits; 0: none */
  int64_t fail_error;    /* the cudaError_t it returns */
  int64_t fail_mode;     /* FAIL_ONCE, FAIL_ALWAYS, FAIL_STICKY */
  int64_t fail_skip;     /* matching calls that pass before the first failure */
  int64_t failures;      /* failures injected so far, all processes */
  int64_t reserved[6];
  struct fake_slot slots[FAKE_MAX_SLOTS];
};

static struct fake_state* st;
/* The error every call of this process returns once a sticky failure hit it; 0: healthy. */
static int sticky_error;
static int64_t state_ino;
static int device_count = 2;
static int64_t total_bytes = 16LL << 30;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static __thread int current_device;

/* Process-local: regions this process mapped (allocations and imports) and its streams. */
struct region {
  uint8_t* base;
  size_t size;
  int slot;
  int imported;
  int64_t pending; /* copies queued on any stream that touch it */
  void* last_stream; /* the stream of the last copy that touched it */
  struct region* next;
};
static struct region* regions;
static pthread_mutex_t regions_mu = PTHREAD_MUTEX_INITIALIZER;

struct op {
  void* dst;
  const void* src;
  size_t n;
  struct region* region;
  int fail; /* FAIL_SYNC: the device is lost under this copy; its error, reported by the next synchronize */
  struct op* next;
};
struct stream {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct op* head;
  struct op* tail;
  int64_t pending;
  int error; /* the first failed copy's error since the last synchronize */
  int stop;
  struct stream* next;
};
static struct stream* streams;
static pthread_mutex_t streams_mu = PTHREAD_MUTEX_INITIALIZER;

#define ADD(field, v) __atomic_add_fetch(&(field), (v), __ATOMIC_SEQ_CST)
#define LOAD(field) __atomic_load_n(&(field), __ATOMIC_SEQ_CST)

/* FAKECUDART_FAIL="<point>:<cudaError>[:<mode>[:<skip>]]": arms the state's failure at load time. */
static void arm_from_env(const char* spec) {
  char point[16] = {0};
  char mode[16] = {0};
  long long error = 0;
  long long skip = 0;
  if (sscanf(spec, "%15[a-z_]:%lld:%15[a-z]:%lld", point, &error, mode, &skip) < 2) return;
  int64_t p = strcmp(point, "ipc_open") == 0 ? FAIL_IPC_OPEN
              : strcmp(point, "memcpy") == 0 ? FAIL_MEMCPY
              : strcmp(point, "sync") == 0   ? FAIL_SYNC
                                             : FAIL_NONE;
  int64_t m = strcmp(mode, "always") == 0 ? FAIL_ALWAYS : strcmp(mode, "sticky") == 0 ? FAIL_STICKY : FAIL_ONCE;
  __atomic_store_n(&st->fail_error, (int64_t)error, __ATOMIC_SEQ_CST);
  __atomic_store_n(&st->fail_mode, m, __ATOMIC_SEQ_CST);
  __atomic_store_n(&st->fail_skip, (int64_t)skip, __ATOMIC_SEQ_CST);
  __atomic_store_n(&st->fail_point, p, __ATOMIC_SEQ_CST);
}

static void init(void) {
  const char* devices = getenv("FAKECUDART_DEVICES");
  if (devices != NULL && devices[0] != '\0') device_count = atoi(devices);
  const char* total = getenv("FAKECUDART_TOTAL_BYTES");
  if (total != NULL && total[0] != '\0') total_bytes = atoll(total);
  const char* delay = getenv("FAKECUDART_COPY_DELAY_MS");
  const char* fail = getenv("FAKECUDART_FAIL");

  char path[4096];
  const char* env = getenv("FAKECUDART_STATE");
  if (env != NULL && env[0] != '\0') {
    snprintf(path, sizeof path, "%s", env);
  } else {
    Dl_info info;
    if (dladdr((void*)&init, &info) == 0 || info.dli_fname == NULL) {
      path[0] = '\0';
    } else {
      snprintf(path, sizeof path, "%s.state", info.dli_fname);
    }
  }
  if (path[0] != '\0') {
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd >= 0) {
      struct stat s;
      if (fstat(fd, &s) == 0 && (s.st_size >= (off_t)sizeof(struct fake_state) ||
                                 ftruncate(fd, sizeof(struct fake_state)) == 0)) {
        void* p = mmap(NULL, sizeof(struct fake_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) {
          st = p;
          state_ino = (int64_t)s.st_ino;
        }
      }
      close(fd);
    }
  }
  if (st == NULL) {
    void* p = mmap(NULL, sizeof(struct fake_state), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    st = p == MAP_FAILED ? NULL : p;
    state_ino = getpid();
  }
  if (st != NULL) {
    int64_t zero = 0;
    __atomic_compare_exchange_n(&st->magic, &zero, FAKE_MAGIC, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    if (delay != NULL && delay[0] != '\0') __atomic_store_n(&st->copy_delay_ms, (int64_t)atol(delay), __ATOMIC_SEQ_CST);
    if (fail != NULL && fail[0] != '\0') arm_from_env(fail);
  }
}

static int ready(void) {
  pthread_once(&once, init);
  return st != NULL;
}

/* The sticky error of this process, or 0. */
static int sticky(void) { return __atomic_load_n(&sticky_error, __ATOMIC_SEQ_CST); }

/* Whether a call at `point` fails now, and with which error (0: it does not). Consumes a skip, disarms a
 * once/sticky point (whichever process gets there first), and makes a sticky failure this process's. */
static int trip(int64_t point) {
  if (LOAD(st->fail_point) != point) return 0;
  for (;;) {
    int64_t skip = LOAD(st->fail_skip);
    if (skip <= 0) break;
    if (__atomic_compare_exchange_n(&st->fail_skip, &skip, skip - 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return 0;
  }
  const int64_t mode = LOAD(st->fail_mode);
  const int err = (int)LOAD(st->fail_error);
  if (mode != FAIL_ALWAYS) {
    int64_t expected = point;
    if (!__atomic_compare_exchange_n(&st->fail_point, &expected, FAIL_NONE, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return 0;
  }
  if (mode == FAIL_STICKY) __atomic_store_n(&sticky_error, err, __ATOMIC_SEQ_CST);
  ADD(st->failures, 1);
  return err;
}

static void segment_name(char* out, size_t n, int64_t pid, int slot) {
  snprintf(out, n, "/fakecuda-%lld-%lld-%d", (long long)state_ino, (long long)pid, slot);
}

static int pid_alive(int64_t pid) {
  if (pid <= 0) return 0;
  if (kill((pid_t)pid, 0) != 0 && errno != EPERM) return 0;
  /* A killed child that its parent has not reaped yet is a zombie: dead. */
  char path[64];
  snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
  FILE* f = fopen(path, "r");
  if (f == NULL) return 1;
  char buf[512];
  size_t len = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[len] = '\0';
  const char* paren = strrchr(buf, ')');
  if (paren != NULL && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X')) return 0;
  return 1;
}

static int slot_live(struct fake_slot* s) {
  if (LOAD(s->owner_pid) == 0 || LOAD(s->unlinked)) return 0;
  if (LOAD(s->import_refs) > 0) return 1;
  return !LOAD(s->freed) && pid_alive(LOAD(s->owner_pid));
}

/* The "driver" frees an allocation nobody holds any more: unlink its segment, once. */
static void collect(int slot) {
  struct fake_slot* s = &st->slots[slot];
  if (LOAD(s->owner_pid) == 0 || slot_live(s)) return;
  int64_t zero = 0;
  if (__atomic_compare_exchange_n(&s->unlinked, &zero, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    char name[96];
    segment_name(name, sizeof name, LOAD(s->owner_pid), slot);
    shm_unlink(name);
  }
}

static struct region* find_region(const void* p, size_t n, int exact_base) {
  const uint8_t* q = p;
  for (struct region* r = regions; r != NULL; r = r->next) {
    if (exact_base ? q == r->base : (q >= r->base && n <= r->size && (size_t)(q - r->base) <= r->size - n)) return r;
  }
  return NULL;
}

/* Called with regions_mu held; returns with it held. A release with copies
 * still queued on the region is a violation; the fake then waits for them
 * (instead of crashing the process under the copy) before unmapping. */
static void unmap_region(struct region* target) {
  if (LOAD(target->pending) > 0) {
    ADD(st->violations, 1);
    while (LOAD(target->pending) > 0) {
      pthread_mutex_unlock(&regions_mu);
      struct timespec ts = {0, 1000000L};
      nanosleep(&ts, NULL);
      pthread_mutex_lock(&regions_mu);
    }
  }
  munmap(target->base, target->size);
  for (struct region** r = &regions; *r != NULL; r = &(*r)->next) {
    if (*r == target) {
      *r = target->next;
      free(target);
      return;
    }
  }
}

/* ---- devices ------------------------------------------------------------ */

EXPORT int cudaGetDeviceCount(int* count) {
  ready();
  if (count == NULL) return cudaErrorInvalidValue;
  *count = device_count > 0 ? device_count : 0;
  return device_count > 0 ? cudaSuccess : cudaErrorNoDevice;
}

static int get_properties(void* prop, int device) {
  ready();
  if (prop == NULL) return cudaErrorInvalidValue;
  if (device < 0 || device >= device_count) return cudaErrorInvalidDevice;
  char* p = prop;
  memset(p, 0, 256 + 16);
  snprintf(p, 256, "Fake CUDA Device %d", device);
  static const unsigned char uuid[16] = {0xfa, 0xce, 0xc0, 0xda, 0x00, 0x00, 0x40, 0x00,
                                         0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  memcpy(p + 256, uuid, 16);
  p[256 + 15] = (char)device;
  return cudaSuccess;
}

EXPORT int cudaGetDeviceProperties_v2(void* prop, int device) { return get_properties(prop, device); }
EXPORT int cudaGetDeviceProperties(void* prop, int device) { return get_properties(prop, device); }

EXPORT int cudaSetDevice(int device) {
  ready();
  if (sticky()) return sticky();
  if (device < 0 || device >= device_count) return cudaErrorInvalidDevice;
  current_device = device;
  return cudaSuccess;
}

EXPORT int cudaGetDevice(int* device) {
  if (device == NULL) return cudaErrorInvalidValue;
  *device = current_device;
  return cudaSuccess;
}

/* The strings and names of CUDA 12's runtime for these codes. */
EXPORT const char* cudaGetErrorString(int err) {
  switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorDevicesUnavailable: return "CUDA-capable device(s) is/are busy or unavailable";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorDeviceUninitialized: return "invalid device context";
    case cudaErrorMapBufferObjectFailed: return "mapping of buffer object failed";
    case cudaErrorECCUncorrectable: return "uncorrectable ECC error encountered";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorUnknown: return "unknown error";
    default: return "unrecognized error code";
  }
}

EXPORT const char* cudaGetErrorName(int err) {
  switch (err) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorDevicesUnavailable: return "cudaErrorDevicesUnavailable";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorDeviceUninitialized: return "cudaErrorDeviceUninitialized";
    case cudaErrorMapBufferObjectFailed: return "cudaErrorMapBufferObjectFailed";
    case cudaErrorECCUncorrectable: return "cudaErrorECCUncorrectable";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorUnknown: return "cudaErrorUnknown";
    default: return "cudaErrorUnknown";
  }
}

EXPORT int cudaRuntimeGetVersion(int* version) {
  if (version == NULL) return cudaErrorInvalidValue;
  *version = 13000;
  return cudaSuccess;
}

EXPORT int cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  if (!ready()) return cudaErrorInvalidValue;
  if (sticky()) return sticky();
  int64_t used = 0;
  int64_t n = LOAD(st->next_slot);
  for (int i = 0; i < n && i < FAKE_MAX_SLOTS; i++) {
    struct fake_slot* s = &st->slots[i];
    collect(i);
    if (LOAD(s->device) == current_device && slot_live(s)) used += LOAD(s->size);
  }
  if (free_bytes != NULL) *free_bytes = (size_t)(total_bytes - used);
  if (total != NULL) *total = (size_t)total_bytes;
  return cudaSuccess;
}

/* ---- memory ------------------------------------------------------------- */

EXPORT int cudaMalloc(void** ptr, size_t size) {
  if (!ready() || ptr == NULL || size == 0) return cudaErrorInvalidValue;
  if (sticky()) return sticky();
  size_t free_bytes = 0;
  cudaMemGetInfo(&free_bytes, NULL);
  if (size > free_bytes) return cudaErrorMemoryAllocation;
  int64_t slot = ADD(st->next_slot, 1) - 1;
  if (slot >= FAKE_MAX_SLOTS) return cudaErrorMemoryAllocation;
  char name[96];
  segment_name(name, sizeof name, getpid(), (int)slot);
  int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return cudaErrorMemoryAllocation;
  if (ftruncate(fd, (off_t)size) != 0) {
    close(fd);
    shm_unlink(name);
    return cudaErrorMemoryAllocation;
  }
  void* p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name);
    return cudaErrorMemoryAllocation;
  }
  struct fake_slot* s = &st->slots[slot];
  __atomic_store_n(&s->device, current_device, __ATOMIC_SEQ_CST);
  __atomic_store_n(&s->size, (int64_t)size, __ATOMIC_SEQ_CST);
  __atomic_store_n(&s->owner_pid, (int64_t)getpid(), __ATOMIC_SEQ_CST);
  struct region* r = calloc(1, sizeof *r);
  r->base = p;
  r->size = size;
  r->slot = (int)slot;
  pthread_mutex_lock(&regions_mu);
  r->next = regions;
  regions = r;
  pthread_mutex_unlock(&regions_mu);
  ADD(st->mallocs, 1);
  *ptr = p;
  return cudaSuccess;
}

EXPORT int cudaFree(void* ptr) {
  if (ptr == NULL) return cudaSuccess;
  if (!ready()) return cudaErrorInvalidValue;
  if (sticky()) return sticky();
  pthread_mutex_lock(&regions_mu);
  struct region* r = find_region(ptr, 0, 1);
  if (r == NULL || r->imported) {
    pthread_mutex_unlock(&regions_mu);
    ADD(st->violations, 1);
    return cudaErrorInvalidDevicePointer;
  }
  int slot = r->slot;
  unmap_region(r);
  pthread_mutex_unlock(&regions_mu);
  __atomic_store_n(&st->slots[slot].freed, 1, __ATOMIC_SEQ_CST);
  ADD(st->frees, 1);
  collect(slot);
  return cudaSuccess;
}

EXPORT int cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* ptr) {
  if (!ready() || handle == NULL) return cudaErrorInvalidValue;
  pthread_mutex_lock(&regions_mu);
  struct region* r = find_region(ptr, 0, 1);
  int ok = r != NULL && !r->imported;
  int slot = ok ? r->slot : -1;
  size_t size = ok ? r->size : 0;
  pthread_mutex_unlock(&regions_mu);
  if (!ok) return cudaErrorInvalidValue;
  memset(handle, 0, sizeof *handle);
  memcpy(handle->reserved, "FAKECUDA", 8);
  uint32_t device = (uint32_t)LOAD(st->slots[slot].device);
  uint32_t slot32 = (uint32_t)slot;
  uint64_t size64 = size;
  memcpy(handle->reserved + 8, &device, 4);
  memcpy(handle->reserved + 12, &slot32, 4);
  memcpy(handle->reserved + 16, &size64, 8);
  segment_name(handle->reserved + 24, 40, getpid(), slot);
  return cudaSuccess;
}

EXPORT int cudaIpcOpenMemHandle(void** ptr, cudaIpcMemHandle_t handle, unsigned int flags) {
  (void)flags;
  if (!ready() || ptr == NULL) return cudaErrorInvalidValue;
  if (sticky()) return sticky();
  if (memcmp(handle.reserved, "FAKECUDA", 8) != 0) return cudaErrorInvalidValue;
  {
    const int injected = trip(FAIL_IPC_OPEN);
    if (injected != 0) return injected;
  }
  uint32_t device, slot;
  uint64_t size;
  memcpy(&device, handle.reserved + 8, 4);
  memcpy(&slot, handle.reserved + 12, 4);
  memcpy(&size, handle.reserved + 16, 8);
  if ((int)device >= device_count) return cudaErrorInvalidDevice;
  if (slot >= FAKE_MAX_SLOTS || handle.reserved[63] != '\0') return cudaErrorInvalidValue;
  struct fake_slot* s = &st->slots[slot];
  if (!slot_live(s)) return cudaErrorInvalidResourceHandle;
  int fd = shm_open(handle.reserved + 24, O_RDWR, 0);
  if (fd < 0) return cudaErrorMapBufferObjectFailed;
  struct stat sb;
  if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size < size) {
    close(fd);
    return cudaErrorMapBufferObjectFailed;
  }
  void* p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return cudaErrorMapBufferObjectFailed;
  struct region* r = calloc(1, sizeof *r);
  r->base = p;
  r->size = size;
  r->slot = (int)slot;
  r->imported = 1;
  pthread_mutex_lock(&regions_mu);
  r->next = regions;
  regions = r;
  pthread_mutex_unlock(&regions_mu);
  ADD(s->import_refs, 1);
  ADD(s->opens, 1);
  ADD(st->ipc_opens, 1);
  if ((int)device != current_device) ADD(st->peer_opens, 1);
  *ptr = p;
  return cudaSuccess;
}

EXPORT int cudaIpcCloseMemHandle(void* ptr) {
  if (!ready()) return cudaErrorInvalidValue;
  if (sticky()) return sticky();
  pthread_mutex_lock(&regions_mu);
  struct region* r = find_region(ptr, 0, 1);
  if (r == NULL || !r->imported) {
    pthread_mutex_unlock(&regions_mu);
    ADD(st->violations, 1); /* closed twice, or never opened */
    return cudaErrorInvalidValue;
  }
  int slot = r->slot;
  unmap_region(r); /* copies still queued on it: a violation */
  pthread_mutex_unlock(&regions_mu);
  struct fake_slot* s = &st->slots[slot];
  ADD(s->import_refs, -1);
  ADD(s->closes, 1);
  ADD(st->ipc_closes, 1);
  collect(slot);
  return cudaSuccess;
}

/* ---- streams ------------------------------------------------------------ */

static void* stream_main(void* arg) {
  struct stream* s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (s->head == NULL && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
    if (s->head == NULL && s->stop) break;
    struct op* o = s->head;
    s->head = o->next;
    if (s->head == NULL) s->tail = NULL;
    pthread_mutex_unlock(&s->mu);
    int64_t delay = LOAD(st->copy_delay_ms);
    if (delay > 0) {
      struct timespec ts = {(time_t)(delay / 1000), (long)(delay % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
    if (o->fail == 0) memcpy(o->dst, o->src, o->n);
    if (o->region != NULL) ADD(o->region->pending, -1);
    const int failed = o->fail;
    free(o);
    pthread_mutex_lock(&s->mu);
    if (failed != 0 && s->error == 0) s->error = failed;
    s->pending--;
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

static int known_stream(struct stream* target) {
  pthread_mutex_lock(&streams_mu);
  int found = 0;
  for (struct stream* s = streams; s != NULL; s = s->next) found |= s == target;
  pthread_mutex_unlock(&streams_mu);
  return found;
}

EXPORT int cudaStreamCreateWithFlags(void** out, unsigned int flags) {
  (void)flags;
  if (!ready() || out == NULL) return cudaErrorInvalidValue;
  if (sticky()) return sticky();
  struct stream* s = calloc(1, sizeof *s);
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
    free(s);
    return cudaErrorMemoryAllocation;
  }
  pthread_mutex_lock(&streams_mu);
  s->next = streams;
  streams = s;
  pthread_mutex_unlock(&streams_mu);
  ADD(st->streams_created, 1);
  *out = s;
  return cudaSuccess;
}

EXPORT int cudaStreamCreate(void** out) { return cudaStreamCreateWithFlags(out, 0); }

EXPORT int cudaStreamSynchronize(void* handle) {
  if (!ready()) return cudaErrorInvalidValue;
  if (handle == NULL) return cudaSuccess;
  struct stream* s = handle;
  if (!known_stream(s)) {
    ADD(st->violations, 1);
    return cudaErrorInvalidResourceHandle;
  }
  pthread_mutex_lock(&s->mu);
  while (s->pending > 0) pthread_cond_wait(&s->cv, &s->mu);
  const int error = s->error;
  s->error = 0;
  pthread_mutex_unlock(&s->mu);
  ADD(st->syncs, 1);
  if (sticky()) return sticky();
  return error;
}

EXPORT int cudaStreamDestroy(void* handle) {
  if (!ready()) return cudaErrorInvalidValue;
  if (sticky()) return sticky();
  struct stream* s = handle;
  pthread_mutex_lock(&streams_mu);
  struct stream** link = &streams;
  while (*link != NULL && *link != s) link = &(*link)->next;
  if (*link == NULL) {
    pthread_mutex_unlock(&streams_mu);
    ADD(st->violations, 1);
    return cudaErrorInvalidResourceHandle;
  }
  *link = s->next;
  pthread_mutex_unlock(&streams_mu);
  /* A mapping this stream served is still open: the stream went first. */
  pthread_mutex_lock(&regions_mu);
  for (struct region* r = regions; r != NULL; r = r->next) {
    if (r->last_stream == s) {
      ADD(st->violations, 1);
      r->last_stream = NULL;
    }
  }
  pthread_mutex_unlock(&regions_mu);
  /* As in CUDA: queued work completes, then the stream's resources go. */
  pthread_mutex_lock(&s->mu);
  s->stop = 1;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
  ADD(st->streams_destroyed, 1);
  return cudaSuccess;
}

/* kind: 0 host->host, 1 host->device, 2 device->host, 3 device->device, 4 default. */
EXPORT int cudaMemcpyAsync(void* dst, const void* src, size_t n, int kind, void* handle) {
  if (!ready()) return cudaErrorInvalidValue;
  if (sticky()) return sticky();
  if (n == 0) return cudaSuccess;
  pthread_mutex_lock(&regions_mu);
  struct region* rd = find_region(dst, n, 0);
  struct region* rs = find_region(src, n, 0);
  int ok = kind == 1 ? rd != NULL : kind == 2 ? rs != NULL : kind == 3 ? (rd != NULL && rs != NULL) : 1;
  struct region* r = rd != NULL ? rd : rs;
  const int imported = (rd != NULL && rd->imported) || (rs != NULL && rs->imported);
  if (ok && r != NULL && handle != NULL) {
    ADD(r->pending, 1);
    r->last_stream = handle;
  }
  pthread_mutex_unlock(&regions_mu);
  if (!ok) {
    ADD(st->violations, 1);
    return cudaErrorInvalidValue;
  }
  /* Injected failures hit only copies through IPC-imported memory (the server's side). */
  if (imported) {
    const int injected = trip(FAIL_MEMCPY);
    if (injected != 0) {
      if (r != NULL && handle != NULL) ADD(r->pending, -1);
      return injected;
    }
  }
  const int lost = imported && handle != NULL ? trip(FAIL_SYNC) : 0;
  ADD(st->memcpys, 1);
  if (handle == NULL) {
    memcpy(dst, src, n);
    return cudaSuccess;
  }
  struct stream* s = handle;
  if (!known_stream(s)) {
    if (r != NULL) ADD(r->pending, -1);
    ADD(st->violations, 1);
    return cudaErrorInvalidResourceHandle;
  }
  struct op* o = calloc(1, sizeof *o);
  o->dst = dst;
  o->src = src;
  o->n = n;
  o->region = r;
  o->fail = lost;
  pthread_mutex_lock(&s->mu);
  if (s->tail != NULL) {
    s->tail->next = o;
  } else {
    s->head = o;
  }
  s->tail = o;
  s->pending++;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return cudaSuccess;
}
