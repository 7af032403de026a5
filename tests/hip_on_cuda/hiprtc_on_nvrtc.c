/*
 * hiprtc_on_nvrtc.c -- the hipRTC entry points streamrt's hip backend uses,
 * implemented on NVRTC, built as libhiprtc.so (test harness; see hip_on_cuda.c).
 *
 * NVRTC is opened at first use with dlopen, so this library builds without
 * nvrtc.h or libnvrtc present. It is searched, in order, at:
 *   $HIPRTC_ON_NVRTC_LIBRARY (a path or a soname),
 *   libnvrtc.so.13, libnvrtc.so.12, libnvrtc.so (already loaded, or on the loader path),
 *   the path build.sh found at build time (HIPRTC_ON_NVRTC_DEFAULT).
 *
 * A hiprtcProgram is an NVRTC program. Compile options are translated:
 *   --offload-arch=sm_XY / -offload-arch=sm_XY -> --gpu-architecture=sm_XY
 *   -O0 .. -O3 (hipRTC/clang levels)            -> dropped (NVRTC always optimizes)
 *   -ffast-math                                 -> --use_fast_math
 *   -fgpu-rdc                                   -> --relocatable-device-code=true
 * and -default-device plus -D__STREAMRT_HIP_ON_CUDA__=1 are added, so kernel
 * sources can tell that "HIP" is NVRTC underneath. Everything else is passed
 * through (NVRTC rejects what it does not know, with its log).
 * hiprtcGetCode returns the CUBIN when the program was compiled for a real
 * architecture (sm_XY), else the PTX; hipModuleLoadData accepts either.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HIPRTC_API __attribute__((visibility("default")))

typedef int hiprtcResult;
enum {
    HIPRTC_SUCCESS = 0,
    HIPRTC_ERROR_OUT_OF_MEMORY = 1,
    HIPRTC_ERROR_PROGRAM_CREATION_FAILURE = 2,
    HIPRTC_ERROR_INVALID_INPUT = 3,
    HIPRTC_ERROR_INVALID_PROGRAM = 4,
    HIPRTC_ERROR_INVALID_OPTION = 5,
    HIPRTC_ERROR_COMPILATION = 6,
    HIPRTC_ERROR_BUILTIN_OPERATION_FAILURE = 7,
    HIPRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION = 8,
    HIPRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION = 9,
    HIPRTC_ERROR_NAME_EXPRESSION_NOT_VALID = 10,
    HIPRTC_ERROR_INTERNAL_ERROR = 11,
    HIPRTC_ERROR_LINKING = 100,
};

typedef struct _nvrtcProgram* nvrtcProgram;
typedef int nvrtcResult;
typedef nvrtcProgram hiprtcProgram;

/* The NVRTC C API, declared here (stable since CUDA 11.1). */
static struct {
    int loaded; /* 1: ok, -1: failed */
    char error[1024];
    nvrtcResult (*Version)(int*, int*);
    nvrtcResult (*CreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                                 const char* const*);
    nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char* const*);
    nvrtcResult (*DestroyProgram)(nvrtcProgram*);
    nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t*);
    nvrtcResult (*GetProgramLog)(nvrtcProgram, char*);
    nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t*);
    nvrtcResult (*GetCUBIN)(nvrtcProgram, char*);
    nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t*);
    nvrtcResult (*GetPTX)(nvrtcProgram, char*);
} nvrtc;

static pthread_once_t nvrtc_once = PTHREAD_ONCE_INIT;

#ifndef HIPRTC_ON_NVRTC_DEFAULT
#define HIPRTC_ON_NVRTC_DEFAULT ""
#endif

static void load_nvrtc(void) {
    const char* candidates[] = {
        getenv("HIPRTC_ON_NVRTC_LIBRARY"), "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so",
        HIPRTC_ON_NVRTC_DEFAULT,
    };
    void* handle = NULL;
    size_t used = 0;
    nvrtc.error[0] = 0;
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0] && !handle; ++i) {
        if (!candidates[i] || !candidates[i][0]) continue;
        handle = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
        if (!handle && used < sizeof nvrtc.error) {
            const char* why = dlerror();
            int n = snprintf(nvrtc.error + used, sizeof nvrtc.error - used, "%s%s", used ? "; " : "",
                             why ? why : candidates[i]);
            if (n > 0) used += (size_t)n;
        }
    }
    if (!handle) {
        nvrtc.loaded = -1;
        return;
    }
#define BIND(field, symbol)                                                                  \
    do {                                                                                     \
        *(void**)(&nvrtc.field) = dlsym(handle, symbol);                                     \
        if (!nvrtc.field) {                                                                  \
            snprintf(nvrtc.error, sizeof nvrtc.error, "libnvrtc lacks %s", symbol);          \
            nvrtc.loaded = -1;                                                               \
            return;                                                                          \
        }                                                                                    \
    } while (0)
    BIND(Version, "nvrtcVersion");
    BIND(CreateProgram, "nvrtcCreateProgram");
    BIND(CompileProgram, "nvrtcCompileProgram");
    BIND(DestroyProgram, "nvrtcDestroyProgram");
    BIND(GetProgramLogSize, "nvrtcGetProgramLogSize");
    BIND(GetProgramLog, "nvrtcGetProgramLog");
    BIND(GetCUBINSize, "nvrtcGetCUBINSize");
    BIND(GetCUBIN, "nvrtcGetCUBIN");
    BIND(GetPTXSize, "nvrtcGetPTXSize");
    BIND(GetPTX, "nvrtcGetPTX");
#undef BIND
    nvrtc.loaded = 1;
}

/* 1 when NVRTC is usable; otherwise reports once on stderr why not. */
static int have_nvrtc(void) {
    pthread_once(&nvrtc_once, load_nvrtc);
    if (nvrtc.loaded == 1) return 1;
    static int reported;
    if (!reported) {
        reported = 1;
        fprintf(stderr, "hiprtc_on_nvrtc: cannot use NVRTC: %s (set HIPRTC_ON_NVRTC_LIBRARY)\n", nvrtc.error);
    }
    return 0;
}

/* nvrtcResult 0..11 have hipRTC's meaning and value; later NVRTC codes are internal errors. */
static hiprtcResult from_nvrtc(nvrtcResult r) {
    return (r >= 0 && r <= 11) ? (hiprtcResult)r : HIPRTC_ERROR_INTERNAL_ERROR;
}

HIPRTC_API const char* hiprtcGetErrorString(hiprtcResult result) {
    switch (result) {
        case HIPRTC_SUCCESS: return "HIPRTC_SUCCESS";
        case HIPRTC_ERROR_OUT_OF_MEMORY: return "HIPRTC_ERROR_OUT_OF_MEMORY";
        case HIPRTC_ERROR_PROGRAM_CREATION_FAILURE: return "HIPRTC_ERROR_PROGRAM_CREATION_FAILURE";
        case HIPRTC_ERROR_INVALID_INPUT: return "HIPRTC_ERROR_INVALID_INPUT";
        case HIPRTC_ERROR_INVALID_PROGRAM: return "HIPRTC_ERROR_INVALID_PROGRAM";
        case HIPRTC_ERROR_INVALID_OPTION: return "HIPRTC_ERROR_INVALID_OPTION";
        case HIPRTC_ERROR_COMPILATION: return "HIPRTC_ERROR_COMPILATION";
        case HIPRTC_ERROR_BUILTIN_OPERATION_FAILURE: return "HIPRTC_ERROR_BUILTIN_OPERATION_FAILURE";
        case HIPRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION:
            return "HIPRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION";
        case HIPRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION:
            return "HIPRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION";
        case HIPRTC_ERROR_NAME_EXPRESSION_NOT_VALID: return "HIPRTC_ERROR_NAME_EXPRESSION_NOT_VALID";
        case HIPRTC_ERROR_INTERNAL_ERROR: return "HIPRTC_ERROR_INTERNAL_ERROR";
        case HIPRTC_ERROR_LINKING: return "HIPRTC_ERROR_LINKING";
        default: return "Invalid HIPRTC error code";
    }
}

/* hipRTC's version is reported as NVRTC's. */
HIPRTC_API hiprtcResult hiprtcVersion(int* major, int* minor) {
    if (!major || !minor) return HIPRTC_ERROR_INVALID_INPUT;
    if (!have_nvrtc()) return HIPRTC_ERROR_INTERNAL_ERROR;
    return from_nvrtc(nvrtc.Version(major, minor));
}

HIPRTC_API hiprtcResult hiprtcCreateProgram(hiprtcProgram* prog, const char* src, const char* name, int num_headers,
                                            const char* const* headers, const char* const* include_names) {
    if (!prog || !src) return HIPRTC_ERROR_INVALID_INPUT;
    if (!have_nvrtc()) return HIPRTC_ERROR_PROGRAM_CREATION_FAILURE;
    return from_nvrtc(nvrtc.CreateProgram(prog, src, name, num_headers, headers, include_names));
}

HIPRTC_API hiprtcResult hiprtcDestroyProgram(hiprtcProgram* prog) {
    if (!prog) return HIPRTC_ERROR_INVALID_INPUT;
    if (!have_nvrtc()) return HIPRTC_ERROR_INVALID_PROGRAM;
    return from_nvrtc(nvrtc.DestroyProgram(prog));
}

static int starts_with(const char* s, const char* prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

/* Translated option strings live in ``storage`` (one allocation per option). */
static const char* translate_option(const char* option, char** storage) {
    *storage = NULL;
    const char* arch = NULL;
    if (starts_with(option, "--offload-arch=")) arch = option + strlen("--offload-arch=");
    else if (starts_with(option, "-offload-arch=")) arch = option + strlen("-offload-arch=");
    if (arch) {
        size_t n = strlen("--gpu-architecture=") + strlen(arch) + 1;
        *storage = malloc(n);
        if (!*storage) return NULL;
        snprintf(*storage, n, "--gpu-architecture=%s", arch);
        return *storage;
    }
    if (!strcmp(option, "-O0") || !strcmp(option, "-O1") || !strcmp(option, "-O2") || !strcmp(option, "-O3"))
        return "";  /* dropped */
    if (!strcmp(option, "-ffast-math")) return "--use_fast_math";
    if (!strcmp(option, "-fgpu-rdc")) return "--relocatable-device-code=true";
    return option;
}

HIPRTC_API hiprtcResult hiprtcCompileProgram(hiprtcProgram prog, int num_options, const char* const* options) {
    if (!prog || num_options < 0 || (num_options > 0 && !options)) return HIPRTC_ERROR_INVALID_INPUT;
    if (!have_nvrtc()) return HIPRTC_ERROR_INVALID_PROGRAM;
    static const char* const added[] = {"-default-device", "-D__STREAMRT_HIP_ON_CUDA__=1"};
    const int n_added = (int)(sizeof added / sizeof added[0]);
    const char** translated = calloc((size_t)num_options + (size_t)n_added, sizeof *translated);
    char** storage = calloc((size_t)num_options + 1, sizeof *storage);
    hiprtcResult result = HIPRTC_ERROR_OUT_OF_MEMORY;
    int count = 0;
    if (!translated || !storage) goto done;
    for (int i = 0; i < num_options; ++i) {
        if (!options[i]) {
            result = HIPRTC_ERROR_INVALID_INPUT;
            goto done;
        }
        const char* t = translate_option(options[i], &storage[i]);
        if (!t) goto done;
        if (t[0]) translated[count++] = t;
    }
    for (int i = 0; i < n_added; ++i) translated[count++] = added[i];
    result = from_nvrtc(nvrtc.CompileProgram(prog, count, translated));
done:
    if (storage)
        for (int i = 0; i < num_options; ++i) free(storage[i]);
    free(storage);
    free((void*)translated);
    return result;
}

HIPRTC_API hiprtcResult hiprtcGetProgramLogSize(hiprtcProgram prog, size_t* size) {
    if (!prog || !size) return HIPRTC_ERROR_INVALID_INPUT;
    if (!have_nvrtc()) return HIPRTC_ERROR_INVALID_PROGRAM;
    return from_nvrtc(nvrtc.GetProgramLogSize(prog, size));
}

HIPRTC_API hiprtcResult hiprtcGetProgramLog(hiprtcProgram prog, char* log) {
    if (!prog || !log) return HIPRTC_ERROR_INVALID_INPUT;
    if (!have_nvrtc()) return HIPRTC_ERROR_INVALID_PROGRAM;
    return from_nvrtc(nvrtc.GetProgramLog(prog, log));
}

/* CUBIN when there is one (compiled for sm_XY), else PTX. */
static int has_cubin(hiprtcProgram prog, size_t* size) {
    size_t n = 0;
    if (nvrtc.GetCUBINSize(prog, &n) != 0 || n == 0) return 0;
    *size = n;
    return 1;
}

HIPRTC_API hiprtcResult hiprtcGetCodeSize(hiprtcProgram prog, size_t* size) {
    if (!prog || !size) return HIPRTC_ERROR_INVALID_INPUT;
    if (!have_nvrtc()) return HIPRTC_ERROR_INVALID_PROGRAM;
    if (has_cubin(prog, size)) return HIPRTC_SUCCESS;
    return from_nvrtc(nvrtc.GetPTXSize(prog, size));
}

HIPRTC_API hiprtcResult hiprtcGetCode(hiprtcProgram prog, char* code) {
    if (!prog || !code) return HIPRTC_ERROR_INVALID_INPUT;
    if (!have_nvrtc()) return HIPRTC_ERROR_INVALID_PROGRAM;
    size_t n = 0;
    if (has_cubin(prog, &n)) return from_nvrtc(nvrtc.GetCUBIN(prog, code));
    return from_nvrtc(nvrtc.GetPTX(prog, code));
}
