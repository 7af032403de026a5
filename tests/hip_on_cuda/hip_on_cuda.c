/*
 * hip_on_cuda.c -- the HIP runtime entry points streamrt's hip backend uses,
 * implemented on the CUDA runtime, built as libamdhip64.so.
 *
 * A test harness, not a product: it lets the real hip-python bindings (which
 * resolve libamdhip64.so lazily, symbol by symbol, from ROCM_PATH/lib) drive an
 * NVIDIA GPU, so the hip backend runs its GPU suite on the lent H200s.
 *
 * Rules kept here:
 *   - one exported function per HIP entry point; everything else is static
 *     (the library is built with -fvisibility=hidden);
 *   - every cudaError_t goes through hip_from_cuda(), an explicit table, and the
 *     result is always a member of HIP's hipError_t (hip-python turns the code
 *     into its IntEnum, which rejects unknown values);
 *   - HIP and CUDA agree on memcpy kinds, capture modes and statuses, memory
 *     types, stream/event/host-alloc flag bits; HIP-only flag bits are dropped;
 *   - modules are CUDA "libraries" (cudaLibraryLoadData, context independent),
 *     functions are cudaKernel_t, launched with cudaLaunchKernel.
 *
 * No CUDA header or library is needed to build it: the CUDA runtime ABI it
 * uses is declared in cuda_abi.h, and libcudart (CUDA 12 or 13) is opened at
 * the first HIP call, from the first of
 *   $HIP_ON_CUDA_CUDART (a path or a soname),
 *   libcudart.so.13, libcudart.so.12, libcudart.so (already loaded, or on the loader path),
 *   the path build.sh found at build time (HIP_ON_CUDA_CUDART_DEFAULT).
 * If none loads, every call fails with hipErrorSharedObjectInitFailed and
 * hipGetErrorString says what was tried.
 *
 * Handles: hipStream_t == cudaStream_t, hipEvent_t == cudaEvent_t,
 * hipGraph_t == cudaGraph_t, hipGraphExec_t == cudaGraphExec_t,
 * hipModule_t == cudaLibrary_t, hipFunction_t == cudaKernel_t.
 *
 * Stream memory operations exist only in the CUDA driver API: for
 * hipStreamWaitValue64 (and the attribute that says it works) libcuda.so.1 is
 * opened too, at the first such call.
 */
#include "cuda_abi.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HIP_API __attribute__((visibility("default")))

/* ------------------------------------------------------------------------ */
/* hipError_t: the values of HIP's enum (checked against hip-python 10.0).   */
/* ------------------------------------------------------------------------ */
typedef int hipError_t;
enum {
    hipSuccess = 0,
    hipErrorInvalidValue = 1,
    hipErrorOutOfMemory = 2,
    hipErrorNotInitialized = 3,
    hipErrorDeinitialized = 4,
    hipErrorProfilerDisabled = 5,
    hipErrorProfilerNotInitialized = 6,
    hipErrorProfilerAlreadyStarted = 7,
    hipErrorProfilerAlreadyStopped = 8,
    hipErrorInvalidConfiguration = 9,
    hipErrorInvalidPitchValue = 12,
    hipErrorInvalidSymbol = 13,
    hipErrorInvalidDevicePointer = 17,
    hipErrorInvalidMemcpyDirection = 21,
    hipErrorInsufficientDriver = 35,
    hipErrorMissingConfiguration = 52,
    hipErrorPriorLaunchFailure = 53,
    hipErrorInvalidDeviceFunction = 98,
    hipErrorNoDevice = 100,
    hipErrorInvalidDevice = 101,
    hipErrorInvalidImage = 200,
    hipErrorInvalidContext = 201,
    hipErrorContextAlreadyCurrent = 202,
    hipErrorMapFailed = 205,
    hipErrorUnmapFailed = 206,
    hipErrorArrayIsMapped = 207,
    hipErrorAlreadyMapped = 208,
    hipErrorNoBinaryForGpu = 209,
    hipErrorAlreadyAcquired = 210,
    hipErrorNotMapped = 211,
    hipErrorNotMappedAsArray = 212,
    hipErrorNotMappedAsPointer = 213,
    hipErrorECCNotCorrectable = 214,
    hipErrorUnsupportedLimit = 215,
    hipErrorContextAlreadyInUse = 216,
    hipErrorPeerAccessUnsupported = 217,
    hipErrorInvalidKernelFile = 218,
    hipErrorInvalidGraphicsContext = 219,
    hipErrorInvalidSource = 300,
    hipErrorFileNotFound = 301,
    hipErrorSharedObjectSymbolNotFound = 302,
    hipErrorSharedObjectInitFailed = 303,
    hipErrorOperatingSystem = 304,
    hipErrorInvalidHandle = 400,
    hipErrorIllegalState = 401,
    hipErrorNotFound = 500,
    hipErrorNotReady = 600,
    hipErrorIllegalAddress = 700,
    hipErrorLaunchOutOfResources = 701,
    hipErrorLaunchTimeOut = 702,
    hipErrorPeerAccessAlreadyEnabled = 704,
    hipErrorPeerAccessNotEnabled = 705,
    hipErrorSetOnActiveProcess = 708,
    hipErrorContextIsDestroyed = 709,
    hipErrorAssert = 710,
    hipErrorHostMemoryAlreadyRegistered = 712,
    hipErrorHostMemoryNotRegistered = 713,
    hipErrorLaunchFailure = 719,
    hipErrorCooperativeLaunchTooLarge = 720,
    hipErrorNotSupported = 801,
    hipErrorStreamCaptureUnsupported = 900,
    hipErrorStreamCaptureInvalidated = 901,
    hipErrorStreamCaptureMerge = 902,
    hipErrorStreamCaptureUnmatched = 903,
    hipErrorStreamCaptureUnjoined = 904,
    hipErrorStreamCaptureIsolation = 905,
    hipErrorStreamCaptureImplicit = 906,
    hipErrorCapturedEvent = 907,
    hipErrorStreamCaptureWrongThread = 908,
    hipErrorGraphExecUpdateFailure = 910,
    hipErrorInvalidChannelDescriptor = 911,
    hipErrorInvalidTexture = 912,
    hipErrorInvalidResourceType = 914,
    hipErrorInvalidResourceConfiguration = 915,
    hipErrorStreamDetached = 916,
    hipErrorUnknown = 999,
    hipErrorRuntimeMemory = 1052,
    hipErrorRuntimeOther = 1053,
    hipErrorInvalidClusterSize = 1054,
    hipErrorTbd = 1055,
};

/* cudaError_t -> hipError_t. CUDA codes are written as numbers (with their
 * names) so the table does not depend on which CUDA release's header still
 * declares a deprecated name. Codes that are not listed become hipErrorUnknown;
 * hipGetErrorString then names the CUDA error it came from. */
static const struct { int cuda; hipError_t hip; } kErrorTable[] = {
    {0, hipSuccess},                              /* cudaSuccess */
    {1, hipErrorInvalidValue},                    /* cudaErrorInvalidValue */
    {2, hipErrorOutOfMemory},                     /* cudaErrorMemoryAllocation */
    {3, hipErrorNotInitialized},                  /* cudaErrorInitializationError */
    {4, hipErrorDeinitialized},                   /* cudaErrorCudartUnloading */
    {5, hipErrorProfilerDisabled},                /* cudaErrorProfilerDisabled */
    {6, hipErrorProfilerNotInitialized},          /* cudaErrorProfilerNotInitialized */
    {7, hipErrorProfilerAlreadyStarted},          /* cudaErrorProfilerAlreadyStarted */
    {8, hipErrorProfilerAlreadyStopped},          /* cudaErrorProfilerAlreadyStopped */
    {9, hipErrorInvalidConfiguration},            /* cudaErrorInvalidConfiguration */
    {12, hipErrorInvalidPitchValue},              /* cudaErrorInvalidPitchValue */
    {13, hipErrorInvalidSymbol},                  /* cudaErrorInvalidSymbol */
    {16, hipErrorInvalidValue},                   /* cudaErrorInvalidHostPointer */
    {17, hipErrorInvalidDevicePointer},           /* cudaErrorInvalidDevicePointer */
    {18, hipErrorInvalidTexture},                 /* cudaErrorInvalidTexture */
    {20, hipErrorInvalidChannelDescriptor},       /* cudaErrorInvalidChannelDescriptor */
    {21, hipErrorInvalidMemcpyDirection},         /* cudaErrorInvalidMemcpyDirection */
    {31, hipErrorNotSupported},                   /* cudaErrorNotYetImplemented */
    {34, hipErrorInsufficientDriver},             /* cudaErrorStubLibrary */
    {35, hipErrorInsufficientDriver},             /* cudaErrorInsufficientDriver */
    {36, hipErrorInsufficientDriver},             /* cudaErrorCallRequiresNewerDriver */
    {46, hipErrorContextAlreadyInUse},            /* cudaErrorDevicesUnavailable */
    {52, hipErrorMissingConfiguration},           /* cudaErrorMissingConfiguration */
    {53, hipErrorPriorLaunchFailure},             /* cudaErrorPriorLaunchFailure */
    {98, hipErrorInvalidDeviceFunction},          /* cudaErrorInvalidDeviceFunction */
    {100, hipErrorNoDevice},                      /* cudaErrorNoDevice */
    {101, hipErrorInvalidDevice},                 /* cudaErrorInvalidDevice */
    {127, hipErrorNotInitialized},                /* cudaErrorStartupFailure */
    {200, hipErrorInvalidImage},                  /* cudaErrorInvalidKernelImage */
    {201, hipErrorInvalidContext},                /* cudaErrorDeviceUninitialized */
    {205, hipErrorMapFailed},                     /* cudaErrorMapBufferObjectFailed */
    {206, hipErrorUnmapFailed},                   /* cudaErrorUnmapBufferObjectFailed */
    {207, hipErrorArrayIsMapped},                 /* cudaErrorArrayIsMapped */
    {208, hipErrorAlreadyMapped},                 /* cudaErrorAlreadyMapped */
    {209, hipErrorNoBinaryForGpu},                /* cudaErrorNoKernelImageForDevice */
    {210, hipErrorAlreadyAcquired},               /* cudaErrorAlreadyAcquired */
    {211, hipErrorNotMapped},                     /* cudaErrorNotMapped */
    {212, hipErrorNotMappedAsArray},              /* cudaErrorNotMappedAsArray */
    {213, hipErrorNotMappedAsPointer},            /* cudaErrorNotMappedAsPointer */
    {214, hipErrorECCNotCorrectable},             /* cudaErrorECCUncorrectable */
    {215, hipErrorUnsupportedLimit},              /* cudaErrorUnsupportedLimit */
    {216, hipErrorContextAlreadyInUse},           /* cudaErrorDeviceAlreadyInUse */
    {217, hipErrorPeerAccessUnsupported},         /* cudaErrorPeerAccessUnsupported */
    {218, hipErrorInvalidKernelFile},             /* cudaErrorInvalidPtx */
    {219, hipErrorInvalidGraphicsContext},        /* cudaErrorInvalidGraphicsContext */
    {221, hipErrorInvalidKernelFile},             /* cudaErrorJitCompilerNotFound */
    {222, hipErrorInvalidKernelFile},             /* cudaErrorUnsupportedPtxVersion */
    {223, hipErrorInvalidKernelFile},             /* cudaErrorJitCompilationDisabled */
    {300, hipErrorInvalidSource},                 /* cudaErrorInvalidSource */
    {301, hipErrorFileNotFound},                  /* cudaErrorFileNotFound */
    {302, hipErrorSharedObjectSymbolNotFound},    /* cudaErrorSharedObjectSymbolNotFound */
    {303, hipErrorSharedObjectInitFailed},        /* cudaErrorSharedObjectInitFailed */
    {304, hipErrorOperatingSystem},               /* cudaErrorOperatingSystem */
    {400, hipErrorInvalidHandle},                 /* cudaErrorInvalidResourceHandle */
    {401, hipErrorIllegalState},                  /* cudaErrorIllegalState */
    {500, hipErrorNotFound},                      /* cudaErrorSymbolNotFound */
    {600, hipErrorNotReady},                      /* cudaErrorNotReady */
    {700, hipErrorIllegalAddress},                /* cudaErrorIllegalAddress */
    {701, hipErrorLaunchOutOfResources},          /* cudaErrorLaunchOutOfResources */
    {702, hipErrorLaunchTimeOut},                 /* cudaErrorLaunchTimeout */
    {704, hipErrorPeerAccessAlreadyEnabled},      /* cudaErrorPeerAccessAlreadyEnabled */
    {705, hipErrorPeerAccessNotEnabled},          /* cudaErrorPeerAccessNotEnabled */
    {708, hipErrorSetOnActiveProcess},            /* cudaErrorSetOnActiveProcess */
    {709, hipErrorContextIsDestroyed},            /* cudaErrorContextIsDestroyed */
    {710, hipErrorAssert},                        /* cudaErrorAssert */
    {712, hipErrorHostMemoryAlreadyRegistered},   /* cudaErrorHostMemoryAlreadyRegistered */
    {713, hipErrorHostMemoryNotRegistered},       /* cudaErrorHostMemoryNotRegistered */
    {714, hipErrorLaunchFailure},                 /* cudaErrorHardwareStackError */
    {715, hipErrorLaunchFailure},                 /* cudaErrorIllegalInstruction */
    {716, hipErrorIllegalAddress},                /* cudaErrorMisalignedAddress */
    {717, hipErrorIllegalAddress},                /* cudaErrorInvalidAddressSpace */
    {718, hipErrorLaunchFailure},                 /* cudaErrorInvalidPc */
    {719, hipErrorLaunchFailure},                 /* cudaErrorLaunchFailure */
    {720, hipErrorCooperativeLaunchTooLarge},     /* cudaErrorCooperativeLaunchTooLarge */
    {800, hipErrorNotSupported},                  /* cudaErrorNotPermitted */
    {801, hipErrorNotSupported},                  /* cudaErrorNotSupported */
    {802, hipErrorNotInitialized},                /* cudaErrorSystemNotReady */
    {803, hipErrorInsufficientDriver},            /* cudaErrorSystemDriverMismatch */
    {804, hipErrorNotSupported},                  /* cudaErrorCompatNotSupportedOnDevice */
    {900, hipErrorStreamCaptureUnsupported},      /* cudaErrorStreamCaptureUnsupported */
    {901, hipErrorStreamCaptureInvalidated},      /* cudaErrorStreamCaptureInvalidated */
    {902, hipErrorStreamCaptureMerge},            /* cudaErrorStreamCaptureMerge */
    {903, hipErrorStreamCaptureUnmatched},        /* cudaErrorStreamCaptureUnmatched */
    {904, hipErrorStreamCaptureUnjoined},         /* cudaErrorStreamCaptureUnjoined */
    {905, hipErrorStreamCaptureIsolation},        /* cudaErrorStreamCaptureIsolation */
    {906, hipErrorStreamCaptureImplicit},         /* cudaErrorStreamCaptureImplicit */
    {907, hipErrorCapturedEvent},                 /* cudaErrorCapturedEvent */
    {908, hipErrorStreamCaptureWrongThread},      /* cudaErrorStreamCaptureWrongThread */
    {910, hipErrorGraphExecUpdateFailure},        /* cudaErrorGraphExecUpdateFailure */
    {912, hipErrorInvalidClusterSize},            /* cudaErrorInvalidClusterSize (HIP 912 is a texture error) */
    {913, hipErrorInvalidDeviceFunction},         /* cudaErrorFunctionNotLoaded */
    {914, hipErrorInvalidResourceType},           /* cudaErrorInvalidResourceType */
    {915, hipErrorInvalidResourceConfiguration},  /* cudaErrorInvalidResourceConfiguration */
    {999, hipErrorUnknown},                       /* cudaErrorUnknown */
};

/* The last CUDA error this thread turned into a HIP error, for hipGetErrorString. */
static __thread int tls_last_cuda_error;
static __thread hipError_t tls_last_hip_error;

/* An error the forwarding layer itself decides (no CUDA call behind it). */
static hipError_t hip_local(hipError_t err) {
    tls_last_cuda_error = 0;
    tls_last_hip_error = err;
    return err;
}

static hipError_t hip_from_cuda(hoc_cudaError err) {
    int code = (int)err;
    if (code == 0) return hipSuccess;
    hipError_t mapped = hipErrorUnknown;
    for (size_t i = 0; i < sizeof kErrorTable / sizeof kErrorTable[0]; ++i) {
        if (kErrorTable[i].cuda == code) {
            mapped = kErrorTable[i].hip;
            break;
        }
    }
    tls_last_cuda_error = code;
    tls_last_hip_error = mapped;
    return mapped;
}

/* ------------------------------------------------------------------------ */
/* The CUDA runtime, opened at first use                                     */
/* ------------------------------------------------------------------------ */
#define CUDART_FUNCTIONS(X)                                                                      \
    X(const char*, cudaGetErrorName, (hoc_cudaError))                                            \
    X(const char*, cudaGetErrorString, (hoc_cudaError))                                          \
    X(hoc_cudaError, cudaGetLastError, (void))                                                   \
    X(hoc_cudaError, cudaPeekAtLastError, (void))                                                \
    X(hoc_cudaError, cudaRuntimeGetVersion, (int*))                                             \
    X(hoc_cudaError, cudaDriverGetVersion, (int*))                                               \
    X(hoc_cudaError, cudaGetDeviceCount, (int*))                                                 \
    X(hoc_cudaError, cudaSetDevice, (int))                                                       \
    X(hoc_cudaError, cudaGetDevice, (int*))                                                      \
    X(hoc_cudaError, cudaDeviceSynchronize, (void))                                              \
    X(hoc_cudaError, cudaMemGetInfo, (size_t*, size_t*))                                         \
    X(hoc_cudaError, cudaDeviceGetStreamPriorityRange, (int*, int*))                             \
    X(hoc_cudaError, cudaDeviceGetAttribute, (int*, int, int))                                   \
    X(hoc_cudaError, cudaGetDeviceProperties, (void*, int))                                      \
    X(hoc_cudaError, cudaStreamCreateWithPriority, (hoc_stream*, unsigned int, int))             \
    X(hoc_cudaError, cudaStreamDestroy, (hoc_stream))                                            \
    X(hoc_cudaError, cudaStreamSynchronize, (hoc_stream))                                        \
    X(hoc_cudaError, cudaStreamQuery, (hoc_stream))                                              \
    X(hoc_cudaError, cudaStreamWaitEvent, (hoc_stream, hoc_event, unsigned int))                 \
    X(hoc_cudaError, cudaEventCreateWithFlags, (hoc_event*, unsigned int))                       \
    X(hoc_cudaError, cudaEventDestroy, (hoc_event))                                              \
    X(hoc_cudaError, cudaEventRecord, (hoc_event, hoc_stream))                                   \
    X(hoc_cudaError, cudaEventQuery, (hoc_event))                                                \
    X(hoc_cudaError, cudaEventSynchronize, (hoc_event))                                          \
    X(hoc_cudaError, cudaEventElapsedTime, (float*, hoc_event, hoc_event))                       \
    X(hoc_cudaError, cudaMalloc, (void**, size_t))                                               \
    X(hoc_cudaError, cudaFree, (void*))                                                          \
    X(hoc_cudaError, cudaHostAlloc, (void**, size_t, unsigned int))                              \
    X(hoc_cudaError, cudaHostGetFlags, (unsigned int*, void*))                                   \
    X(hoc_cudaError, cudaFreeHost, (void*))                                                      \
    X(hoc_cudaError, cudaMallocAsync, (void**, size_t, hoc_stream))                              \
    X(hoc_cudaError, cudaFreeAsync, (void*, hoc_stream))                                         \
    X(hoc_cudaError, cudaPointerGetAttributes, (void*, const void*))                             \
    X(hoc_cudaError, cudaMemsetAsync, (void*, int, size_t, hoc_stream))                          \
    X(hoc_cudaError, cudaMemcpyAsync, (void*, const void*, size_t, int, hoc_stream))             \
    X(hoc_cudaError, cudaDeviceCanAccessPeer, (int*, int, int))                                  \
    X(hoc_cudaError, cudaDeviceEnablePeerAccess, (int, unsigned int))                            \
    X(hoc_cudaError, cudaMemcpyPeerAsync, (void*, int, const void*, int, size_t, hoc_stream))    \
    X(hoc_cudaError, cudaLaunchHostFunc, (hoc_stream, hoc_host_fn, void*))                       \
    X(hoc_cudaError, cudaStreamBeginCapture, (hoc_stream, int))                                  \
    X(hoc_cudaError, cudaStreamEndCapture, (hoc_stream, hoc_graph*))                             \
    X(hoc_cudaError, cudaStreamIsCapturing, (hoc_stream, int*))                                  \
    X(hoc_cudaError, cudaGraphInstantiate, (hoc_graph_exec*, hoc_graph, unsigned long long))     \
    X(hoc_cudaError, cudaGraphLaunch, (hoc_graph_exec, hoc_stream))                              \
    X(hoc_cudaError, cudaGraphExecDestroy, (hoc_graph_exec))                                     \
    X(hoc_cudaError, cudaGraphDestroy, (hoc_graph))                                              \
    X(hoc_cudaError, cudaUserObjectCreate, (hoc_user_object*, void*, hoc_host_fn, unsigned int, unsigned int)) \
    X(hoc_cudaError, cudaUserObjectRelease, (hoc_user_object, unsigned int))                     \
    X(hoc_cudaError, cudaGraphRetainUserObject, (hoc_graph, hoc_user_object, unsigned int, unsigned int)) \
    X(hoc_cudaError, cudaLibraryLoadData,                                                        \
      (hoc_library*, const void*, int*, void**, unsigned int, int*, void**, unsigned int))       \
    X(hoc_cudaError, cudaLibraryGetKernel, (hoc_kernel*, hoc_library, const char*))              \
    X(hoc_cudaError, cudaLibraryUnload, (hoc_library))                                           \
    X(hoc_cudaError, cudaLaunchKernel, (const void*, hoc_dim3, hoc_dim3, void**, size_t, hoc_stream))

#define DECLARE_POINTER(ret, name, args) ret(*name) args;
static struct {
    CUDART_FUNCTIONS(DECLARE_POINTER)
} rt;
#undef DECLARE_POINTER

#ifndef HIP_ON_CUDA_CUDART_DEFAULT
#define HIP_ON_CUDA_CUDART_DEFAULT ""
#endif

static pthread_once_t cudart_once = PTHREAD_ONCE_INIT;
static int cudart_state; /* 0 not tried, 1 loaded, -1 failed */
static char cudart_error[1024];

static void load_cudart(void) {
    const char* candidates[] = {
        getenv("HIP_ON_CUDA_CUDART"), "libcudart.so.13", "libcudart.so.12", "libcudart.so",
        HIP_ON_CUDA_CUDART_DEFAULT,
    };
    void* handle = NULL;
    size_t used = 0;
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0] && !handle; ++i) {
        if (!candidates[i] || !candidates[i][0]) continue;
        handle = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
        if (!handle && used < sizeof cudart_error) {
            const char* why = dlerror();
            int n = snprintf(cudart_error + used, sizeof cudart_error - used, "%s%s", used ? "; " : "",
                             why ? why : candidates[i]);
            if (n > 0) used += (size_t)n;
        }
    }
    if (!handle) {
        cudart_state = -1;
        return;
    }
#define BIND(ret, name, args)                                                                  \
    *(void**)(&rt.name) = dlsym(handle, #name);                                                \
    if (!rt.name) *(void**)(&rt.name) = dlsym(handle, #name "_v2");                            \
    if (!rt.name) {                                                                            \
        snprintf(cudart_error, sizeof cudart_error, "the CUDA runtime lacks %s (CUDA 12+ needed)", #name); \
        cudart_state = -1;                                                                     \
        return;                                                                                \
    }
    CUDART_FUNCTIONS(BIND)
#undef BIND
    __atomic_store_n(&cudart_state, 1, __ATOMIC_RELEASE);
}

static int cudart_ready(void) {
    if (__atomic_load_n(&cudart_state, __ATOMIC_ACQUIRE) == 1) return 1;
    pthread_once(&cudart_once, load_cudart);
    return cudart_state == 1;
}

/* The CUDA runtime could not be opened: hipGetErrorString names what was tried. */
static hipError_t cudart_unavailable(void) {
    tls_last_cuda_error = -1;
    tls_last_hip_error = hipErrorSharedObjectInitFailed;
    return hipErrorSharedObjectInitFailed;
}

#define CUDART_REQUIRED()                                   \
    do {                                                    \
        if (!cudart_ready()) return cudart_unavailable();   \
    } while (0)

/* ------------------------------------------------------------------------ */
/* Error names and strings (HIP's wording)                                   */
/* ------------------------------------------------------------------------ */
static const struct { hipError_t code; const char* name; const char* text; } kErrorText[] = {
    {hipSuccess, "hipSuccess", "no error"},
    {hipErrorInvalidValue, "hipErrorInvalidValue", "invalid argument"},
    {hipErrorOutOfMemory, "hipErrorOutOfMemory", "out of memory"},
    {hipErrorNotInitialized, "hipErrorNotInitialized", "initialization error"},
    {hipErrorDeinitialized, "hipErrorDeinitialized", "driver shutting down"},
    {hipErrorProfilerDisabled, "hipErrorProfilerDisabled", "profiler disabled while using external profiling tool"},
    {hipErrorProfilerNotInitialized, "hipErrorProfilerNotInitialized", "profiler is not initialized"},
    {hipErrorProfilerAlreadyStarted, "hipErrorProfilerAlreadyStarted", "profiler already started"},
    {hipErrorProfilerAlreadyStopped, "hipErrorProfilerAlreadyStopped", "profiler already stopped"},
    {hipErrorInvalidConfiguration, "hipErrorInvalidConfiguration", "invalid configuration argument"},
    {hipErrorInvalidPitchValue, "hipErrorInvalidPitchValue", "invalid pitch argument"},
    {hipErrorInvalidSymbol, "hipErrorInvalidSymbol", "invalid device symbol"},
    {hipErrorInvalidDevicePointer, "hipErrorInvalidDevicePointer", "invalid device pointer"},
    {hipErrorInvalidMemcpyDirection, "hipErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {hipErrorInsufficientDriver, "hipErrorInsufficientDriver", "driver version is insufficient for runtime version"},
    {hipErrorMissingConfiguration, "hipErrorMissingConfiguration", "__global__ function call is not configured"},
    {hipErrorPriorLaunchFailure, "hipErrorPriorLaunchFailure", "unspecified launch failure in prior launch"},
    {hipErrorInvalidDeviceFunction, "hipErrorInvalidDeviceFunction", "invalid device function"},
    {hipErrorNoDevice, "hipErrorNoDevice", "no ROCm-capable device is detected"},
    {hipErrorInvalidDevice, "hipErrorInvalidDevice", "invalid device ordinal"},
    {hipErrorInvalidImage, "hipErrorInvalidImage", "device kernel image is invalid"},
    {hipErrorInvalidContext, "hipErrorInvalidContext", "invalid device context"},
    {hipErrorContextAlreadyCurrent, "hipErrorContextAlreadyCurrent", "context is already current context"},
    {hipErrorMapFailed, "hipErrorMapFailed", "mapping of buffer object failed"},
    {hipErrorUnmapFailed, "hipErrorUnmapFailed", "unmapping of buffer object failed"},
    {hipErrorArrayIsMapped, "hipErrorArrayIsMapped", "array is mapped"},
    {hipErrorAlreadyMapped, "hipErrorAlreadyMapped", "resource already mapped"},
    {hipErrorNoBinaryForGpu, "hipErrorNoBinaryForGpu", "no kernel image is available for execution on the device"},
    {hipErrorAlreadyAcquired, "hipErrorAlreadyAcquired", "resource already acquired"},
    {hipErrorNotMapped, "hipErrorNotMapped", "resource not mapped"},
    {hipErrorNotMappedAsArray, "hipErrorNotMappedAsArray", "resource not mapped as array"},
    {hipErrorNotMappedAsPointer, "hipErrorNotMappedAsPointer", "resource not mapped as pointer"},
    {hipErrorECCNotCorrectable, "hipErrorECCNotCorrectable", "uncorrectable ECC error encountered"},
    {hipErrorUnsupportedLimit, "hipErrorUnsupportedLimit", "limit is not supported on this architecture"},
    {hipErrorContextAlreadyInUse, "hipErrorContextAlreadyInUse", "exclusive-thread device already in use by a different thread"},
    {hipErrorPeerAccessUnsupported, "hipErrorPeerAccessUnsupported", "peer access is not supported between these two devices"},
    {hipErrorInvalidKernelFile, "hipErrorInvalidKernelFile", "invalid kernel file"},
    {hipErrorInvalidGraphicsContext, "hipErrorInvalidGraphicsContext", "invalid OpenGL or DirectX context"},
    {hipErrorInvalidSource, "hipErrorInvalidSource", "device kernel image is invalid"},
    {hipErrorFileNotFound, "hipErrorFileNotFound", "file not found"},
    {hipErrorSharedObjectSymbolNotFound, "hipErrorSharedObjectSymbolNotFound", "shared object symbol not found"},
    {hipErrorSharedObjectInitFailed, "hipErrorSharedObjectInitFailed", "shared object initialization failed"},
    {hipErrorOperatingSystem, "hipErrorOperatingSystem", "OS call failed or operation not supported on this OS"},
    {hipErrorInvalidHandle, "hipErrorInvalidHandle", "invalid resource handle"},
    {hipErrorIllegalState, "hipErrorIllegalState", "the operation cannot be performed in the present state"},
    {hipErrorNotFound, "hipErrorNotFound", "named symbol not found"},
    {hipErrorNotReady, "hipErrorNotReady", "device not ready"},
    {hipErrorIllegalAddress, "hipErrorIllegalAddress", "an illegal memory access was encountered"},
    {hipErrorLaunchOutOfResources, "hipErrorLaunchOutOfResources", "too many resources requested for launch"},
    {hipErrorLaunchTimeOut, "hipErrorLaunchTimeOut", "the launch timed out and was terminated"},
    {hipErrorPeerAccessAlreadyEnabled, "hipErrorPeerAccessAlreadyEnabled", "peer access is already enabled"},
    {hipErrorPeerAccessNotEnabled, "hipErrorPeerAccessNotEnabled", "peer access has not been enabled"},
    {hipErrorSetOnActiveProcess, "hipErrorSetOnActiveProcess", "cannot set while device is active in this process"},
    {hipErrorContextIsDestroyed, "hipErrorContextIsDestroyed", "context is destroyed"},
    {hipErrorAssert, "hipErrorAssert", "device-side assert triggered"},
    {hipErrorHostMemoryAlreadyRegistered, "hipErrorHostMemoryAlreadyRegistered", "part or all of the requested memory range is already mapped"},
    {hipErrorHostMemoryNotRegistered, "hipErrorHostMemoryNotRegistered", "pointer does not correspond to a registered memory region"},
    {hipErrorLaunchFailure, "hipErrorLaunchFailure", "unspecified launch failure"},
    {hipErrorCooperativeLaunchTooLarge, "hipErrorCooperativeLaunchTooLarge", "too many blocks in cooperative launch"},
    {hipErrorNotSupported, "hipErrorNotSupported", "operation not supported"},
    {hipErrorStreamCaptureUnsupported, "hipErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"},
    {hipErrorStreamCaptureInvalidated, "hipErrorStreamCaptureInvalidated", "operation failed due to a previous error during capture"},
    {hipErrorStreamCaptureMerge, "hipErrorStreamCaptureMerge", "operation would result in a merge of separate capture sequences"},
    {hipErrorStreamCaptureUnmatched, "hipErrorStreamCaptureUnmatched", "capture was not ended in the same stream as it began"},
    {hipErrorStreamCaptureUnjoined, "hipErrorStreamCaptureUnjoined", "capturing stream has unjoined work"},
    {hipErrorStreamCaptureIsolation, "hipErrorStreamCaptureIsolation", "dependency created on uncaptured work in another stream"},
    {hipErrorStreamCaptureImplicit, "hipErrorStreamCaptureImplicit", "operation would make the legacy stream depend on a capturing blocking stream"},
    {hipErrorCapturedEvent, "hipErrorCapturedEvent", "operation not permitted on an event last recorded in a capturing stream"},
    {hipErrorStreamCaptureWrongThread, "hipErrorStreamCaptureWrongThread", "attempt to terminate a thread-local capture sequence from another thread"},
    {hipErrorGraphExecUpdateFailure, "hipErrorGraphExecUpdateFailure", "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update"},
    {hipErrorInvalidChannelDescriptor, "hipErrorInvalidChannelDescriptor", "invalid channel descriptor"},
    {hipErrorInvalidTexture, "hipErrorInvalidTexture", "invalid texture"},
    {hipErrorInvalidResourceType, "hipErrorInvalidResourceType", "invalid resource type"},
    {hipErrorInvalidResourceConfiguration, "hipErrorInvalidResourceConfiguration", "invalid resource configuration"},
    {hipErrorStreamDetached, "hipErrorStreamDetached", "stream is detached"},
    {hipErrorUnknown, "hipErrorUnknown", "unknown error"},
    {hipErrorRuntimeMemory, "hipErrorRuntimeMemory", "runtime memory call returned error"},
    {hipErrorRuntimeOther, "hipErrorRuntimeOther", "runtime call other than memory returned error"},
    {hipErrorInvalidClusterSize, "hipErrorInvalidClusterSize", "invalid cluster size"},
    {hipErrorTbd, "hipErrorTbd", "marker that more error codes are needed"},
};

static int error_index(hipError_t code) {
    for (size_t i = 0; i < sizeof kErrorText / sizeof kErrorText[0]; ++i)
        if (kErrorText[i].code == code) return (int)i;
    return -1;
}

HIP_API const char* hipGetErrorName(hipError_t code) {
    int i = error_index(code);
    return i < 0 ? "hipErrorUnknown" : kErrorText[i].name;
}

/* HIP's text; when this thread's last failing CUDA call produced ``code``, the
 * CUDA error it came from is appended (a diagnostic of the forwarding layer). */
HIP_API const char* hipGetErrorString(hipError_t code) {
    static __thread char buffer[2048];
    int i = error_index(code);
    const char* text = i < 0 ? "unknown error" : kErrorText[i].text;
    if (code != hipSuccess && tls_last_cuda_error == -1 && tls_last_hip_error == code) {
        snprintf(buffer, sizeof buffer, "%s [HIP-on-CUDA: cannot load the CUDA runtime: %s; set HIP_ON_CUDA_CUDART]",
                 text, cudart_error);
        return buffer;
    }
    if (code != hipSuccess && tls_last_cuda_error > 0 && tls_last_hip_error == code && cudart_ready()) {
        hoc_cudaError cuda = tls_last_cuda_error;
        snprintf(buffer, sizeof buffer, "%s [HIP-on-CUDA: %s: %s]", text, rt.cudaGetErrorName(cuda),
                 rt.cudaGetErrorString(cuda));
        return buffer;
    }
    return text;
}

HIP_API hipError_t hipGetLastError(void) { CUDART_REQUIRED(); return hip_from_cuda(rt.cudaGetLastError()); }
HIP_API hipError_t hipPeekAtLastError(void) {
    CUDART_REQUIRED();
    return hip_from_cuda(rt.cudaPeekAtLastError());
}

/* ------------------------------------------------------------------------ */
/* Initialization, versions, devices                                         */
/* ------------------------------------------------------------------------ */
HIP_API hipError_t hipInit(unsigned int flags) {
    CUDART_REQUIRED();
    if (flags != 0) return hip_local(hipErrorInvalidValue);
    int count = 0;
    return hip_from_cuda(rt.cudaGetDeviceCount(&count));
}

/* Both versions report CUDA's (what HIP on NVIDIA platforms does). */
HIP_API hipError_t hipRuntimeGetVersion(int* version) {
    CUDART_REQUIRED();
    if (!version) return hip_local(hipErrorInvalidValue);
    return hip_from_cuda(rt.cudaRuntimeGetVersion(version));
}

HIP_API hipError_t hipDriverGetVersion(int* version) {
    CUDART_REQUIRED();
    if (!version) return hip_local(hipErrorInvalidValue);
    return hip_from_cuda(rt.cudaDriverGetVersion(version));
}

HIP_API hipError_t hipGetDeviceCount(int* count) {
    CUDART_REQUIRED();
    if (!count) return hip_local(hipErrorInvalidValue);
    *count = 0;
    return hip_from_cuda(rt.cudaGetDeviceCount(count));
}

HIP_API hipError_t hipSetDevice(int device) {
    CUDART_REQUIRED();
    return hip_from_cuda(rt.cudaSetDevice(device));
}

HIP_API hipError_t hipGetDevice(int* device) {
    CUDART_REQUIRED();
    if (!device) return hip_local(hipErrorInvalidValue);
    return hip_from_cuda(rt.cudaGetDevice(device));
}

HIP_API hipError_t hipDeviceSynchronize(void) {
    CUDART_REQUIRED();
    return hip_from_cuda(rt.cudaDeviceSynchronize());
}

HIP_API hipError_t hipMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    CUDART_REQUIRED();
    if (!free_bytes || !total_bytes) return hip_local(hipErrorInvalidValue);
    return hip_from_cuda(rt.cudaMemGetInfo(free_bytes, total_bytes));
}

HIP_API hipError_t hipDeviceGetStreamPriorityRange(int* least, int* greatest) {
    CUDART_REQUIRED();
    return hip_from_cuda(rt.cudaDeviceGetStreamPriorityRange(least, greatest));
}

/* hipDeviceProp_tR0600, field for field as hip-python 10.0's cyhip.pxd declares
 * it (HIP 6.0+ layout); hipDeviceArch_t is HIP's 17 one-bit fields. */
typedef struct {
    unsigned hasGlobalInt32Atomics : 1;
    unsigned hasGlobalFloatAtomicExch : 1;
    unsigned hasSharedInt32Atomics : 1;
    unsigned hasSharedFloatAtomicExch : 1;
    unsigned hasFloatAtomicAdd : 1;
    unsigned hasGlobalInt64Atomics : 1;
    unsigned hasSharedInt64Atomics : 1;
    unsigned hasDoubles : 1;
    unsigned hasWarpVote : 1;
    unsigned hasWarpBallot : 1;
    unsigned hasWarpShuffle : 1;
    unsigned hasFunnelShift : 1;
    unsigned hasThreadFenceSystem : 1;
    unsigned hasSyncThreadsExt : 1;
    unsigned hasSurfaceFuncs : 1;
    unsigned has3dGrid : 1;
    unsigned hasDynamicParallelism : 1;
} hipDeviceArch_t;

typedef struct {
    char name[256];
    struct { char bytes[16]; } uuid;
    char luid[8];
    unsigned int luidDeviceNodeMask;
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int regsPerBlock;
    int warpSize;
    size_t memPitch;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int clockRate;
    size_t totalConstMem;
    int major;
    int minor;
    size_t textureAlignment;
    size_t texturePitchAlignment;
    int deviceOverlap;
    int multiProcessorCount;
    int kernelExecTimeoutEnabled;
    int integrated;
    int canMapHostMemory;
    int computeMode;
    int maxTexture1D;
    int maxTexture1DMipmap;
    int maxTexture1DLinear;
    int maxTexture2D[2];
    int maxTexture2DMipmap[2];
    int maxTexture2DLinear[3];
    int maxTexture2DGather[2];
    int maxTexture3D[3];
    int maxTexture3DAlt[3];
    int maxTextureCubemap;
    int maxTexture1DLayered[2];
    int maxTexture2DLayered[3];
    int maxTextureCubemapLayered[2];
    int maxSurface1D;
    int maxSurface2D[2];
    int maxSurface3D[3];
    int maxSurface1DLayered[2];
    int maxSurface2DLayered[3];
    int maxSurfaceCubemap;
    int maxSurfaceCubemapLayered[2];
    size_t surfaceAlignment;
    int concurrentKernels;
    int ECCEnabled;
    int pciBusID;
    int pciDeviceID;
    int pciDomainID;
    int tccDriver;
    int asyncEngineCount;
    int unifiedAddressing;
    int memoryClockRate;
    int memoryBusWidth;
    int l2CacheSize;
    int persistingL2CacheMaxSize;
    int maxThreadsPerMultiProcessor;
    int streamPrioritiesSupported;
    int globalL1CacheSupported;
    int localL1CacheSupported;
    size_t sharedMemPerMultiprocessor;
    int regsPerMultiprocessor;
    int managedMemory;
    int isMultiGpuBoard;
    int multiGpuBoardGroupID;
    int hostNativeAtomicSupported;
    int singleToDoublePrecisionPerfRatio;
    int pageableMemoryAccess;
    int concurrentManagedAccess;
    int computePreemptionSupported;
    int canUseHostPointerForRegisteredMem;
    int cooperativeLaunch;
    int cooperativeMultiDeviceLaunch;
    size_t sharedMemPerBlockOptin;
    int pageableMemoryAccessUsesHostPageTables;
    int directManagedMemAccessFromHost;
    int maxBlocksPerMultiProcessor;
    int accessPolicyMaxWindowSize;
    size_t reservedSharedMemPerBlock;
    int hostRegisterSupported;
    int sparseHipArraySupported;
    int hostRegisterReadOnlySupported;
    int timelineSemaphoreInteropSupported;
    int memoryPoolsSupported;
    int gpuDirectRDMASupported;
    unsigned int gpuDirectRDMAFlushWritesOptions;
    int gpuDirectRDMAWritesOrdering;
    unsigned int memoryPoolSupportedHandleTypes;
    int deferredMappingHipArraySupported;
    int ipcEventSupported;
    int clusterLaunch;
    int unifiedFunctionPointers;
    int reserved[63];
    int hipReserved[32];
    char gcnArchName[256];
    size_t maxSharedMemoryPerMultiProcessor;
    int clockInstructionRate;
    hipDeviceArch_t arch;
    unsigned int* hdpMemFlushCntl;
    unsigned int* hdpRegFlushCntl;
    int cooperativeMultiDeviceUnmatchedFunc;
    int cooperativeMultiDeviceUnmatchedGridDim;
    int cooperativeMultiDeviceUnmatchedBlockDim;
    int cooperativeMultiDeviceUnmatchedSharedMem;
    int isLargeBar;
    int asicRevision;
} hipDeviceProp_tR0600;

/* Exported so a test can compare this layout with hip-python's (c_sizeof). */
HIP_API size_t hipOnCudaDevicePropSize(void) { return sizeof(hipDeviceProp_tR0600); }
HIP_API size_t hipOnCudaGcnArchNameOffset(void) { return offsetof(hipDeviceProp_tR0600, gcnArchName); }

static int device_attribute(int attr, int device) {
    int value = 0;
    if (rt.cudaDeviceGetAttribute(&value, attr, device) != HOC_cudaSuccess) {
        (void)rt.cudaGetLastError();
        value = 0;
    }
    return value;
}

/* Fills the HIP struct: name, uuid and total memory from the leading fields of
 * cudaDeviceProp (the same in every layout), everything else from
 * cudaDeviceGetAttribute. gcnArchName is "sm_<major><minor>", which
 * hiprtc_on_nvrtc accepts as --offload-arch. HIP's texture/surface limits stay 0. */
HIP_API hipError_t hipGetDevicePropertiesR0600(hipDeviceProp_tR0600* prop, int device) {
    CUDART_REQUIRED();
    if (!prop) return hip_local(hipErrorInvalidValue);
    static __thread _Alignas(16) unsigned char cuda_prop[HOC_DEVICE_PROP_BUFFER];
    hoc_cudaError err = rt.cudaGetDeviceProperties(cuda_prop, device);
    if (err != HOC_cudaSuccess) return hip_from_cuda(err);
    memset(prop, 0, sizeof *prop);
    memcpy(prop->name, cuda_prop + HOC_DEVICE_PROP_NAME_OFFSET, sizeof prop->name);
    prop->name[sizeof prop->name - 1] = 0;
    memcpy(prop->uuid.bytes, cuda_prop + HOC_DEVICE_PROP_UUID_OFFSET, sizeof prop->uuid.bytes);
    memcpy(&prop->totalGlobalMem, cuda_prop + HOC_DEVICE_PROP_TOTAL_GLOBAL_MEM_OFFSET, sizeof prop->totalGlobalMem);
#define ATTR(name) device_attribute(HOC_cudaDevAttr##name, device)
    prop->sharedMemPerBlock = (size_t)ATTR(MaxSharedMemoryPerBlock);
    prop->regsPerBlock = ATTR(MaxRegistersPerBlock);
    prop->warpSize = ATTR(WarpSize);
    prop->memPitch = (size_t)ATTR(MaxPitch);
    prop->maxThreadsPerBlock = ATTR(MaxThreadsPerBlock);
    prop->maxThreadsDim[0] = ATTR(MaxBlockDimX);
    prop->maxThreadsDim[1] = ATTR(MaxBlockDimY);
    prop->maxThreadsDim[2] = ATTR(MaxBlockDimZ);
    prop->maxGridSize[0] = ATTR(MaxGridDimX);
    prop->maxGridSize[1] = ATTR(MaxGridDimY);
    prop->maxGridSize[2] = ATTR(MaxGridDimZ);
    prop->clockRate = ATTR(ClockRate);
    prop->totalConstMem = (size_t)ATTR(TotalConstantMemory);
    prop->major = ATTR(ComputeCapabilityMajor);
    prop->minor = ATTR(ComputeCapabilityMinor);
    prop->textureAlignment = (size_t)ATTR(TextureAlignment);
    prop->texturePitchAlignment = (size_t)ATTR(TexturePitchAlignment);
    prop->asyncEngineCount = ATTR(AsyncEngineCount);
    prop->deviceOverlap = prop->asyncEngineCount > 0;
    prop->multiProcessorCount = ATTR(MultiProcessorCount);
    prop->kernelExecTimeoutEnabled = ATTR(KernelExecTimeout);
    prop->integrated = ATTR(Integrated);
    prop->canMapHostMemory = ATTR(CanMapHostMemory);
    prop->computeMode = ATTR(ComputeMode);
    prop->surfaceAlignment = (size_t)ATTR(SurfaceAlignment);
    prop->concurrentKernels = ATTR(ConcurrentKernels);
    prop->ECCEnabled = ATTR(EccEnabled);
    prop->pciBusID = ATTR(PciBusId);
    prop->pciDeviceID = ATTR(PciDeviceId);
    prop->pciDomainID = ATTR(PciDomainId);
    prop->tccDriver = ATTR(TccDriver);
    prop->unifiedAddressing = ATTR(UnifiedAddressing);
    prop->memoryClockRate = ATTR(MemoryClockRate);
    prop->memoryBusWidth = ATTR(GlobalMemoryBusWidth);
    prop->l2CacheSize = ATTR(L2CacheSize);
    prop->persistingL2CacheMaxSize = ATTR(MaxPersistingL2CacheSize);
    prop->maxThreadsPerMultiProcessor = ATTR(MaxThreadsPerMultiProcessor);
    prop->streamPrioritiesSupported = ATTR(StreamPrioritiesSupported);
    prop->globalL1CacheSupported = ATTR(GlobalL1CacheSupported);
    prop->localL1CacheSupported = ATTR(LocalL1CacheSupported);
    prop->sharedMemPerMultiprocessor = (size_t)ATTR(MaxSharedMemoryPerMultiprocessor);
    prop->regsPerMultiprocessor = ATTR(MaxRegistersPerMultiprocessor);
    prop->managedMemory = ATTR(ManagedMemory);
    prop->isMultiGpuBoard = ATTR(IsMultiGpuBoard);
    prop->multiGpuBoardGroupID = ATTR(MultiGpuBoardGroupID);
    prop->hostNativeAtomicSupported = ATTR(HostNativeAtomicSupported);
    prop->singleToDoublePrecisionPerfRatio = ATTR(SingleToDoublePrecisionPerfRatio);
    prop->pageableMemoryAccess = ATTR(PageableMemoryAccess);
    prop->concurrentManagedAccess = ATTR(ConcurrentManagedAccess);
    prop->computePreemptionSupported = ATTR(ComputePreemptionSupported);
    prop->canUseHostPointerForRegisteredMem = ATTR(CanUseHostPointerForRegisteredMem);
    prop->cooperativeLaunch = ATTR(CooperativeLaunch);
    prop->sharedMemPerBlockOptin = (size_t)ATTR(MaxSharedMemoryPerBlockOptin);
    prop->pageableMemoryAccessUsesHostPageTables = ATTR(PageableMemoryAccessUsesHostPageTables);
    prop->directManagedMemAccessFromHost = ATTR(DirectManagedMemAccessFromHost);
    prop->maxBlocksPerMultiProcessor = ATTR(MaxBlocksPerMultiprocessor);
    prop->accessPolicyMaxWindowSize = ATTR(MaxAccessPolicyWindowSize);
    prop->reservedSharedMemPerBlock = (size_t)ATTR(ReservedSharedMemoryPerBlock);
    prop->hostRegisterSupported = ATTR(HostRegisterSupported);
    prop->sparseHipArraySupported = ATTR(SparseCudaArraySupported);
    prop->hostRegisterReadOnlySupported = ATTR(HostRegisterReadOnlySupported);
    prop->timelineSemaphoreInteropSupported = ATTR(TimelineSemaphoreInteropSupported);
    prop->memoryPoolsSupported = ATTR(MemoryPoolsSupported);
    prop->gpuDirectRDMASupported = ATTR(GPUDirectRDMASupported);
    prop->gpuDirectRDMAFlushWritesOptions = (unsigned int)ATTR(GPUDirectRDMAFlushWritesOptions);
    prop->gpuDirectRDMAWritesOrdering = ATTR(GPUDirectRDMAWritesOrdering);
    prop->memoryPoolSupportedHandleTypes = (unsigned int)ATTR(MemoryPoolSupportedHandleTypes);
    prop->deferredMappingHipArraySupported = ATTR(DeferredMappingCudaArraySupported);
    prop->ipcEventSupported = ATTR(IpcEventSupport);
    prop->clusterLaunch = ATTR(ClusterLaunch);
#undef ATTR
    snprintf(prop->gcnArchName, sizeof prop->gcnArchName, "sm_%d%d", prop->major, prop->minor);
    prop->maxSharedMemoryPerMultiProcessor = prop->sharedMemPerMultiprocessor;
    prop->clockInstructionRate = prop->clockRate;
    prop->arch.hasGlobalInt32Atomics = 1;
    prop->arch.hasGlobalFloatAtomicExch = 1;
    prop->arch.hasSharedInt32Atomics = 1;
    prop->arch.hasSharedFloatAtomicExch = 1;
    prop->arch.hasFloatAtomicAdd = 1;
    prop->arch.hasGlobalInt64Atomics = 1;
    prop->arch.hasSharedInt64Atomics = 1;
    prop->arch.hasDoubles = 1;
    prop->arch.hasWarpVote = 1;
    prop->arch.hasWarpBallot = 1;
    prop->arch.hasWarpShuffle = 1;
    prop->arch.hasFunnelShift = 1;
    prop->arch.hasThreadFenceSystem = 1;
    prop->arch.hasSyncThreadsExt = 1;
    prop->arch.hasSurfaceFuncs = 1;
    prop->arch.has3dGrid = 1;
    prop->arch.hasDynamicParallelism = 1;
    return hipSuccess;
}

/* ------------------------------------------------------------------------ */
/* Streams                                                                   */
/* ------------------------------------------------------------------------ */
typedef hoc_stream hipStream_t;
typedef hoc_event hipEvent_t;

HIP_API hipError_t hipStreamCreateWithPriority(hipStream_t* stream, unsigned int flags, int priority) {
    CUDART_REQUIRED();
    if (!stream) return hip_local(hipErrorInvalidValue);
    /* hipStreamDefault 0 / hipStreamNonBlocking 1 == cudaStreamDefault / cudaStreamNonBlocking */
    return hip_from_cuda(rt.cudaStreamCreateWithPriority(stream, flags & HOC_cudaStreamNonBlocking, priority));
}

HIP_API hipError_t hipStreamDestroy(hipStream_t stream) {
    CUDART_REQUIRED();
    return hip_from_cuda(rt.cudaStreamDestroy(stream));
}
HIP_API hipError_t hipStreamSynchronize(hipStream_t stream) {
    CUDART_REQUIRED();
    return hip_from_cuda(rt.cudaStreamSynchronize(stream));
}
HIP_API hipError_t hipStreamQuery(hipStream_t stream) {
    CUDART_REQUIRED();
    return hip_from_cuda(rt.cudaStreamQuery(stream));
}

HIP_API hipError_t hipStreamWaitEvent(hipStream_t stream, hipEvent_t event, unsigned int flags) {
    CUDART_REQUIRED();
    /* hipEventWaitDefault 0 / hipEventWaitExternal 1 == cudaEventWaitDefault / cudaEventWaitExternal */
    return hip_from_cuda(rt.cudaStreamWaitEvent(stream, event, flags));
}

/* ------------------------------------------------------------------------ */
/* Events                                                                    */
/* ------------------------------------------------------------------------ */
HIP_API hipError_t hipEventCreateWithFlags(hipEvent_t* event, unsigned int flags) {
    CUDART_REQUIRED();
    if (!event) return hip_local(hipErrorInvalidValue);
    /* hipEventBlockingSync 1, hipEventDisableTiming 2, hipEventInterprocess 4 agree with
     * CUDA; HIP-only release/fence bits (0x20000000 and up) have no CUDA meaning. */
    return hip_from_cuda(rt.cudaEventCreateWithFlags(event, flags & HOC_cudaEventFlagsMask));
}

HIP_API hipError_t hipEventDestroy(hipEvent_t event) {
    CUDART_REQUIRED();
    return hip_from_cuda(rt.cudaEventDestroy(event));
}
HIP_API hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream) {
    CUDART_REQUIRED();
    return hip_from_cuda(rt.cudaEventRecord(event, stream));
}
HIP_API hipError_t hipEventQuery(hipEvent_t event) {
    CUDART_REQUIRED();
    return hip_from_cuda(rt.cudaEventQuery(event));
}
HIP_API hipError_t hipEventSynchronize(hipEvent_t event) {
    CUDART_REQUIRED();
    return hip_from_cuda(rt.cudaEventSynchronize(event));
}
HIP_API hipError_t hipEventElapsedTime(float* ms, hipEvent_t start, hipEvent_t stop) {
    CUDART_REQUIRED();
    if (!ms) return hip_local(hipErrorInvalidValue);
    return hip_from_cuda(rt.cudaEventElapsedTime(ms, start, stop));
}

/* ------------------------------------------------------------------------ */
/* Memory                                                                    */
/* ------------------------------------------------------------------------ */
HIP_API hipError_t hipMalloc(void** ptr, size_t size) {
    CUDART_REQUIRED();
    if (!ptr) return hip_local(hipErrorInvalidValue);
    *ptr = NULL;
    if (size == 0) return hipSuccess; /* HIP: a zero-size allocation succeeds with NULL */
    return hip_from_cuda(rt.cudaMalloc(ptr, size));
}

/* Signal memory (hipExtMallocWithFlags(hipMallocSignalMemory)) is mapped pinned host memory here;
 * hipFree must know it from device memory, so its pointers are remembered. */
#define HOC_MAX_SIGNALS 4096
static void* hoc_signals[HOC_MAX_SIGNALS];
static pthread_mutex_t hoc_signals_lock = PTHREAD_MUTEX_INITIALIZER;

static int hoc_signal_remember(void* ptr) {
    int kept = 0;
    pthread_mutex_lock(&hoc_signals_lock);
    for (size_t i = 0; i < HOC_MAX_SIGNALS && !kept; ++i) {
        if (!hoc_signals[i]) {
            hoc_signals[i] = ptr;
            kept = 1;
        }
    }
    pthread_mutex_unlock(&hoc_signals_lock);
    return kept;
}

static int hoc_signal_forget(void* ptr) {
    int found = 0;
    pthread_mutex_lock(&hoc_signals_lock);
    for (size_t i = 0; i < HOC_MAX_SIGNALS && !found; ++i) {
        if (ptr && hoc_signals[i] == ptr) {
            hoc_signals[i] = NULL;
            found = 1;
        }
    }
    pthread_mutex_unlock(&hoc_signals_lock);
    return found;
}

HIP_API hipError_t hipFree(void* ptr) {
    CUDART_REQUIRED();
    if (hoc_signal_forget(ptr)) return hip_from_cuda(rt.cudaFreeHost(ptr));
    return hip_from_cuda(rt.cudaFree(ptr));
}

/* hipExtMallocWithFlags flag values (hip_runtime_api.h). */
#define HOC_DEVICE_MALLOC_DEFAULT 0x0
#define HOC_MALLOC_SIGNAL_MEMORY 0x2

/* Default: cudaMalloc. Signal memory: 8 bytes (HIP requires exactly that) of
 * portable, mapped pinned memory, zeroed. Fine-grained and uncached device
 * memory have no CUDA counterpart: hipErrorInvalidValue. */
HIP_API hipError_t hipExtMallocWithFlags(void** ptr, size_t size, unsigned int flags) {
    CUDART_REQUIRED();
    if (!ptr) return hip_local(hipErrorInvalidValue);
    *ptr = NULL;
    if (flags == HOC_DEVICE_MALLOC_DEFAULT) {
        if (size == 0) return hipSuccess;
        return hip_from_cuda(rt.cudaMalloc(ptr, size));
    }
    if (flags != HOC_MALLOC_SIGNAL_MEMORY || size != 8) return hip_local(hipErrorInvalidValue);
    hoc_cudaError err = rt.cudaHostAlloc(ptr, 8, 1u | 2u /* cudaHostAllocPortable | cudaHostAllocMapped */);
    if (err) return hip_from_cuda(err);
    memset(*ptr, 0, 8);
    if (!hoc_signal_remember(*ptr)) {
        rt.cudaFreeHost(*ptr);
        *ptr = NULL;
        return hip_local(hipErrorOutOfMemory);
    }
    return hipSuccess;
}

/* hipHostMallocPortable 1 / Mapped 2 / WriteCombined 4 == cudaHostAlloc's flags;
 * the AMD-only NUMA and coherence bits are dropped. */
HIP_API hipError_t hipHostMalloc(void** ptr, size_t size, unsigned int flags) {
    CUDART_REQUIRED();
    if (!ptr) return hip_local(hipErrorInvalidValue);
    *ptr = NULL;
    if (size == 0) return hipSuccess;
    return hip_from_cuda(rt.cudaHostAlloc(ptr, size, flags & HOC_cudaHostAllocFlagsMask));
}

HIP_API hipError_t hipHostAlloc(void** ptr, size_t size, unsigned int flags) {
    CUDART_REQUIRED();
    return hipHostMalloc(ptr, size, flags);
}

HIP_API hipError_t hipHostFree(void* ptr) { CUDART_REQUIRED(); return hip_from_cuda(rt.cudaFreeHost(ptr)); }

HIP_API hipError_t hipMallocAsync(void** ptr, size_t size, hipStream_t stream) {
    CUDART_REQUIRED();
    if (!ptr) return hip_local(hipErrorInvalidValue);
    return hip_from_cuda(rt.cudaMallocAsync(ptr, size, stream));
}

HIP_API hipError_t hipFreeAsync(void* ptr, hipStream_t stream) {
    CUDART_REQUIRED();
    return hip_from_cuda(rt.cudaFreeAsync(ptr, stream));
}

/* HIP's hipPointerAttribute_t (cyhip.pxd). hipMemoryType values agree with
 * cudaMemoryType: Unregistered 0, Host 1, Device 2, Managed 3. */
typedef struct {
    int type;
    int device;
    void* devicePointer;
    void* hostPointer;
    int isManaged;
    unsigned int allocationFlags;
} hipPointerAttribute_t;

HIP_API size_t hipOnCudaPointerAttributeSize(void) { return sizeof(hipPointerAttribute_t); }

HIP_API hipError_t hipPointerGetAttributes(hipPointerAttribute_t* attributes, const void* ptr) {
    CUDART_REQUIRED();
    if (!attributes) return hip_local(hipErrorInvalidValue);
    _Alignas(16) unsigned char buffer[HOC_POINTER_ATTRIBUTES_BUFFER];
    memset(buffer, 0, sizeof buffer);
    hoc_cudaError err = rt.cudaPointerGetAttributes(buffer, ptr);
    if (err != HOC_cudaSuccess) return hip_from_cuda(err);
    hoc_pointer_attributes c;
    memcpy(&c, buffer, sizeof c);
    memset(attributes, 0, sizeof *attributes);
    attributes->type = c.type;
    attributes->device = c.device;
    attributes->devicePointer = c.devicePointer;
    attributes->hostPointer = c.hostPointer;
    attributes->isManaged = c.type == HOC_cudaMemoryTypeManaged;
    if (c.type == HOC_cudaMemoryTypeHost) {
        unsigned int flags = 0;
        if (rt.cudaHostGetFlags(&flags, (void*)ptr) == HOC_cudaSuccess) attributes->allocationFlags = flags;
        else (void)rt.cudaGetLastError();
    }
    return hipSuccess;
}

HIP_API hipError_t hipMemsetAsync(void* dst, int value, size_t size, hipStream_t stream) {
    CUDART_REQUIRED();
    return hip_from_cuda(rt.cudaMemsetAsync(dst, value, size, stream));
}

HIP_API hipError_t hipMemcpyAsync(void* dst, const void* src, size_t size, int kind, hipStream_t stream) {
    CUDART_REQUIRED();
    /* hipMemcpyKind 0..4 == cudaMemcpyKind; hipMemcpyDeviceToDeviceNoCU (1024) is a D2D copy. */
    if (kind == 1024) kind = HOC_cudaMemcpyDeviceToDevice;
    if (kind < HOC_cudaMemcpyHostToHost || kind > HOC_cudaMemcpyDefault) return hip_local(hipErrorInvalidMemcpyDirection);
    return hip_from_cuda(rt.cudaMemcpyAsync(dst, src, size, kind, stream));
}

/* ------------------------------------------------------------------------ */
/* Several devices: peer access and peer copies                              */
/* ------------------------------------------------------------------------ */
HIP_API hipError_t hipDeviceCanAccessPeer(int* can_access_peer, int device, int peer_device) {
    CUDART_REQUIRED();
    if (!can_access_peer) return hip_local(hipErrorInvalidValue);
    *can_access_peer = 0;
    return hip_from_cuda(rt.cudaDeviceCanAccessPeer(can_access_peer, device, peer_device));
}

/* cudaErrorPeerAccessAlreadyEnabled (704) maps to hipErrorPeerAccessAlreadyEnabled, as HIP reports it. */
HIP_API hipError_t hipDeviceEnablePeerAccess(int peer_device, unsigned int flags) {
    CUDART_REQUIRED();
    /* flags are reserved (must be 0) in both APIs: passed through so CUDA rejects others as HIP does */
    return hip_from_cuda(rt.cudaDeviceEnablePeerAccess(peer_device, flags));
}

HIP_API hipError_t hipMemcpyPeerAsync(void* dst, int dst_device, const void* src, int src_device, size_t size,
                                      hipStream_t stream) {
    CUDART_REQUIRED();
    return hip_from_cuda(rt.cudaMemcpyPeerAsync(dst, dst_device, src, src_device, size, stream));
}

/* ------------------------------------------------------------------------ */
/* Host functions                                                            */
/* ------------------------------------------------------------------------ */
typedef hoc_host_fn hipHostFn_t;

HIP_API hipError_t hipLaunchHostFunc(hipStream_t stream, hipHostFn_t fn, void* user_data) {
    CUDART_REQUIRED();
    if (!fn) return hip_local(hipErrorInvalidValue);
    return hip_from_cuda(rt.cudaLaunchHostFunc(stream, fn, user_data));
}

/* ------------------------------------------------------------------------ */
/* Stream memory operations, through the CUDA driver API                     */
/* ------------------------------------------------------------------------ */
typedef int (*hoc_cu_wait_value64_fn)(hoc_stream, unsigned long long, uint64_t, unsigned int);
typedef int (*hoc_cu_device_get_fn)(int*, int);
typedef int (*hoc_cu_device_get_attribute_fn)(int*, int, int);
typedef int (*hoc_cu_get_proc_address_fn)(const char*, void**, int, uint64_t, int*);
/* cuStreamGetCaptureInfo as of CUDA 12.0 (the _v2 form): stream, status, id, graph, deps, count. */
typedef int (*hoc_cu_capture_info_fn)(hoc_stream, int*, unsigned long long*, hoc_graph*, const void**, size_t*);

static struct {
    hoc_cu_wait_value64_fn wait_value64;
    hoc_cu_capture_info_fn capture_info;
    hoc_cu_device_get_fn device_get;
    hoc_cu_device_get_attribute_fn device_get_attribute;
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

/* cuStreamWaitValue64 as of CUDA 12 (the "v2" memory operations, on by default). */
static void load_driver(void) {
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!handle) return;
    *(void**)(&drv.device_get) = dlsym(handle, "cuDeviceGet");
    *(void**)(&drv.device_get_attribute) = dlsym(handle, "cuDeviceGetAttribute");
    hoc_cu_get_proc_address_fn get_proc = NULL;
    *(void**)(&get_proc) = dlsym(handle, "cuGetProcAddress_v2");
    void* fn = NULL;
    int status = 0;
    if (get_proc && get_proc("cuStreamWaitValue64", &fn, 12000, 0, &status) != 0) fn = NULL;
    if (!fn) fn = dlsym(handle, "cuStreamWaitValue64_v2");
    *(void**)(&drv.wait_value64) = fn;
    fn = NULL;
    if (get_proc && get_proc("cuStreamGetCaptureInfo", &fn, 12000, 0, &status) != 0) fn = NULL;
    if (!fn) fn = dlsym(handle, "cuStreamGetCaptureInfo_v2");
    *(void**)(&drv.capture_info) = fn;
}

/* HIP's enum value (hipDeviceAttributeAmdSpecificBegin = 10000 = ClockInstructionRate, ...). */
#define HOC_ATTR_CAN_USE_STREAM_WAIT_VALUE 10013
#define HOC_CU_CAN_USE_64_BIT_STREAM_MEM_OPS 122 /* the memory operations of CUDA 12 (93 is the V1 API) */

/* Only the attribute streamrt asks for; any other is hipErrorInvalidValue. */
HIP_API hipError_t hipDeviceGetAttribute(int* value, int attr, int device) {
    CUDART_REQUIRED();
    if (!value || attr != HOC_ATTR_CAN_USE_STREAM_WAIT_VALUE) return hip_local(hipErrorInvalidValue);
    int count = 0;
    hoc_cudaError err = rt.cudaGetDeviceCount(&count); /* also initializes the driver */
    if (err) return hip_from_cuda(err);
    if (device < 0 || device >= count) return hip_local(hipErrorInvalidDevice);
    pthread_once(&drv_once, load_driver);
    int cu_device = 0, supported = 0;
    if (!drv.wait_value64 || !drv.device_get || !drv.device_get_attribute || drv.device_get(&cu_device, device) != 0 ||
        drv.device_get_attribute(&supported, HOC_CU_CAN_USE_64_BIT_STREAM_MEM_OPS, cu_device) != 0)
        supported = 0;
    *value = supported;
    return hipSuccess;
}

/* hipStreamWaitValue{Gte,Eq,And,Nor} = 0..3 = CU_STREAM_WAIT_VALUE_{GEQ,EQ,AND,NOR}. CUDA has no
 * mask: only the all-ones mask is accepted. The pointer is passed as is (unified addressing: a
 * mapped pinned pointer is its own device address). CUresult codes that can come back here
 * (1, 101, 201, 400, 801, ...) have the same numbers as the cudaError_t values they are mapped by. */
HIP_API hipError_t hipStreamWaitValue64(hipStream_t stream, void* ptr, uint64_t value, unsigned int flags, uint64_t mask) {
    CUDART_REQUIRED();
    if (!ptr || flags > 3 || mask != ~(uint64_t)0) return hip_local(hipErrorInvalidValue);
    pthread_once(&drv_once, load_driver);
    if (!drv.wait_value64) return hip_local(hipErrorNotSupported);
    return hip_from_cuda((hoc_cudaError)drv.wait_value64(stream, (unsigned long long)(uintptr_t)ptr, value, flags));
}

/* ------------------------------------------------------------------------ */
/* Capture and graphs                                                        */
/* ------------------------------------------------------------------------ */
typedef hoc_graph hipGraph_t;
typedef hoc_graph_exec hipGraphExec_t;
typedef struct hipGraphNode* hipGraphNode_t;

HIP_API hipError_t hipStreamBeginCapture(hipStream_t stream, int mode) {
    CUDART_REQUIRED();
    /* hipStreamCaptureMode Global 0 / ThreadLocal 1 / Relaxed 2 == cudaStreamCaptureMode */
    if (mode < 0 || mode > HOC_cudaStreamCaptureModeRelaxed) return hip_local(hipErrorInvalidValue);
    return hip_from_cuda(rt.cudaStreamBeginCapture(stream, mode));
}

HIP_API hipError_t hipStreamEndCapture(hipStream_t stream, hipGraph_t* graph) {
    CUDART_REQUIRED();
    if (!graph) return hip_local(hipErrorInvalidValue);
    *graph = NULL;
    return hip_from_cuda(rt.cudaStreamEndCapture(stream, graph));
}

HIP_API hipError_t hipStreamIsCapturing(hipStream_t stream, int* status) {
    CUDART_REQUIRED();
    if (!status) return hip_local(hipErrorInvalidValue);
    /* hipStreamCaptureStatus None 0 / Active 1 / Invalidated 2 == cudaStreamCaptureStatus */
    int s = HOC_cudaStreamCaptureStatusNone;
    hoc_cudaError err = rt.cudaStreamIsCapturing(stream, &s);
    *status = s;
    return hip_from_cuda(err);
}

/* HIP keeps CUDA 11's five-argument form; CUDA 12+ takes flags instead. The
 * error node and log are not available from CUDA 12+: NULL and empty. */
HIP_API hipError_t hipGraphInstantiate(hipGraphExec_t* exec, hipGraph_t graph, hipGraphNode_t* error_node,
                                       char* log_buffer, size_t buffer_size) {
    CUDART_REQUIRED();
    if (!exec) return hip_local(hipErrorInvalidValue);
    if (error_node) *error_node = NULL;
    if (log_buffer && buffer_size > 0) log_buffer[0] = 0;
    return hip_from_cuda(rt.cudaGraphInstantiate(exec, graph, 0));
}

HIP_API hipError_t hipGraphLaunch(hipGraphExec_t exec, hipStream_t stream) {
    CUDART_REQUIRED();
    return hip_from_cuda(rt.cudaGraphLaunch(exec, stream));
}
HIP_API hipError_t hipGraphExecDestroy(hipGraphExec_t exec) {
    CUDART_REQUIRED();
    return hip_from_cuda(rt.cudaGraphExecDestroy(exec));
}
HIP_API hipError_t hipGraphDestroy(hipGraph_t graph) {
    CUDART_REQUIRED();
    return hip_from_cuda(rt.cudaGraphDestroy(graph));
}

/* hipStreamGetCaptureInfo_v2 through the driver's cuStreamGetCaptureInfo (CUDA 12.0 form): the
 * runtime's own symbol changed signature in CUDA 13. Statuses and handles are CUDA's. The node
 * array is returned only when asked for (and is the driver's, valid until the next capture call). */
HIP_API hipError_t hipStreamGetCaptureInfo_v2(hipStream_t stream, int* status, unsigned long long* id, hipGraph_t* graph,
                                              const hipGraphNode_t** dependencies, size_t* count) {
    CUDART_REQUIRED();
    if (!status) return hip_local(hipErrorInvalidValue);
    int devices = 0;
    hoc_cudaError err = rt.cudaGetDeviceCount(&devices); /* initializes the driver */
    if (err) return hip_from_cuda(err);
    pthread_once(&drv_once, load_driver);
    if (!drv.capture_info) return hip_local(hipErrorNotSupported);
    return hip_from_cuda((hoc_cudaError)drv.capture_info(stream, status, id, graph, (const void**)dependencies, count));
}

/* ------------------------------------------------------------------------ */
/* User objects: HIP's flags and ownership rules are CUDA's                  */
/* ------------------------------------------------------------------------ */
typedef hoc_user_object hipUserObject_t;

HIP_API hipError_t hipUserObjectCreate(hipUserObject_t* object, void* ptr, hipHostFn_t destroy, unsigned int refcount,
                                       unsigned int flags) {
    CUDART_REQUIRED();
    if (!object || !destroy) return hip_local(hipErrorInvalidValue);
    *object = NULL;
    return hip_from_cuda(rt.cudaUserObjectCreate(object, ptr, destroy, refcount, flags));
}

HIP_API hipError_t hipUserObjectRelease(hipUserObject_t object, unsigned int count) {
    CUDART_REQUIRED();
    return hip_from_cuda(rt.cudaUserObjectRelease(object, count));
}

HIP_API hipError_t hipGraphRetainUserObject(hipGraph_t graph, hipUserObject_t object, unsigned int count,
                                            unsigned int flags) {
    CUDART_REQUIRED();
    return hip_from_cuda(rt.cudaGraphRetainUserObject(graph, object, count, flags));
}

/* ------------------------------------------------------------------------ */
/* Modules and kernels                                                       */
/* ------------------------------------------------------------------------ */
typedef hoc_library hipModule_t;
typedef hoc_kernel hipFunction_t;

/* ``image`` is what hiprtc_on_nvrtc's hiprtcGetCode returns: a CUBIN (or PTX). */
HIP_API hipError_t hipModuleLoadData(hipModule_t* module, const void* image) {
    CUDART_REQUIRED();
    if (!module || !image) return hip_local(hipErrorInvalidValue);
    *module = NULL;
    return hip_from_cuda(rt.cudaLibraryLoadData(module, image, NULL, NULL, 0, NULL, NULL, 0));
}

HIP_API hipError_t hipModuleGetFunction(hipFunction_t* function, hipModule_t module, const char* name) {
    CUDART_REQUIRED();
    if (!function || !name) return hip_local(hipErrorInvalidValue);
    *function = NULL;
    return hip_from_cuda(rt.cudaLibraryGetKernel(function, module, name));
}

HIP_API hipError_t hipModuleUnload(hipModule_t module) {
    CUDART_REQUIRED();
    return hip_from_cuda(rt.cudaLibraryUnload(module));
}

/* ``extra`` (HIP_LAUNCH_PARAM_BUFFER_POINTER packing) is not forwarded:
 * streamrt passes kernelParams only. */
HIP_API hipError_t hipModuleLaunchKernel(hipFunction_t function, unsigned int grid_x, unsigned int grid_y,
                                         unsigned int grid_z, unsigned int block_x, unsigned int block_y,
                                         unsigned int block_z, unsigned int shared_mem_bytes, hipStream_t stream,
                                         void** kernel_params, void** extra) {
    CUDART_REQUIRED();
    if (extra) return hip_local(hipErrorNotSupported);
    if (!function) return hip_local(hipErrorInvalidValue);
    hoc_dim3 grid = {grid_x, grid_y, grid_z};
    hoc_dim3 block = {block_x, block_y, block_z};
    return hip_from_cuda(rt.cudaLaunchKernel((const void*)function, grid, block, kernel_params,
                                          (size_t)shared_mem_bytes, stream));
}
