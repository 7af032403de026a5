/*
 * cuda_abi.h -- the part of the CUDA runtime ABI (CUDA 12.0 and later) that
 * hip_on_cuda.c uses, declared here so the forwarding library builds with
 * nothing but a C compiler: libcudart is opened with dlopen at run time.
 *
 * Every number below is CUDA's; cuda_abi_check.c compares them (and the struct
 * offsets) with the real cuda_runtime_api.h wherever one is installed.
 */
#ifndef HIP_ON_CUDA_CUDA_ABI_H
#define HIP_ON_CUDA_CUDA_ABI_H

#include <stddef.h>

/* Opaque handles: the same struct tags CUDA uses, so the types are identical. */
typedef int hoc_cudaError;
typedef struct CUstream_st* hoc_stream;
typedef struct CUevent_st* hoc_event;
typedef struct CUgraph_st* hoc_graph;
typedef struct CUgraphExec_st* hoc_graph_exec;
typedef struct CUlib_st* hoc_library;
typedef struct CUkern_st* hoc_kernel;
typedef struct CUuserObject_st* hoc_user_object;
typedef void (*hoc_host_fn)(void* user_data);
typedef struct { unsigned int x, y, z; } hoc_dim3; /* dim3 */

/* cudaError_t values the forwarding layer names itself. */
#define HOC_cudaSuccess 0
#define HOC_cudaErrorNotReady 600

/* cudaMemcpyKind, cudaStreamCaptureMode, cudaStreamCaptureStatus, cudaMemoryType. */
#define HOC_cudaMemcpyHostToHost 0
#define HOC_cudaMemcpyDeviceToDevice 3
#define HOC_cudaMemcpyDefault 4
#define HOC_cudaStreamCaptureModeRelaxed 2
#define HOC_cudaStreamCaptureStatusNone 0
#define HOC_cudaStreamCaptureStatusActive 1
#define HOC_cudaStreamCaptureStatusInvalidated 2

/* cudaUserObjectFlags, cudaUserObjectRetainFlags. */
#define HOC_cudaUserObjectNoDestructorSync 1
#define HOC_cudaGraphUserObjectMove 1
#define HOC_cudaMemoryTypeHost 1
#define HOC_cudaMemoryTypeManaged 3

/* Flags. */
#define HOC_cudaStreamNonBlocking 0x01u
#define HOC_cudaEventFlagsMask 0x07u /* BlockingSync 1 | DisableTiming 2 | Interprocess 4 */
#define HOC_cudaHostAllocFlagsMask 0x07u /* Portable 1 | Mapped 2 | WriteCombined 4 */

/* cudaDeviceAttr values. */
#define HOC_cudaDevAttrMaxThreadsPerBlock 1
#define HOC_cudaDevAttrMaxBlockDimX 2
#define HOC_cudaDevAttrMaxBlockDimY 3
#define HOC_cudaDevAttrMaxBlockDimZ 4
#define HOC_cudaDevAttrMaxGridDimX 5
#define HOC_cudaDevAttrMaxGridDimY 6
#define HOC_cudaDevAttrMaxGridDimZ 7
#define HOC_cudaDevAttrMaxSharedMemoryPerBlock 8
#define HOC_cudaDevAttrTotalConstantMemory 9
#define HOC_cudaDevAttrWarpSize 10
#define HOC_cudaDevAttrMaxPitch 11
#define HOC_cudaDevAttrMaxRegistersPerBlock 12
#define HOC_cudaDevAttrClockRate 13
#define HOC_cudaDevAttrTextureAlignment 14
#define HOC_cudaDevAttrMultiProcessorCount 16
#define HOC_cudaDevAttrKernelExecTimeout 17
#define HOC_cudaDevAttrIntegrated 18
#define HOC_cudaDevAttrCanMapHostMemory 19
#define HOC_cudaDevAttrComputeMode 20
#define HOC_cudaDevAttrSurfaceAlignment 30
#define HOC_cudaDevAttrConcurrentKernels 31
#define HOC_cudaDevAttrEccEnabled 32
#define HOC_cudaDevAttrPciBusId 33
#define HOC_cudaDevAttrPciDeviceId 34
#define HOC_cudaDevAttrTccDriver 35
#define HOC_cudaDevAttrMemoryClockRate 36
#define HOC_cudaDevAttrGlobalMemoryBusWidth 37
#define HOC_cudaDevAttrL2CacheSize 38
#define HOC_cudaDevAttrMaxThreadsPerMultiProcessor 39
#define HOC_cudaDevAttrAsyncEngineCount 40
#define HOC_cudaDevAttrUnifiedAddressing 41
#define HOC_cudaDevAttrPciDomainId 50
#define HOC_cudaDevAttrTexturePitchAlignment 51
#define HOC_cudaDevAttrComputeCapabilityMajor 75
#define HOC_cudaDevAttrComputeCapabilityMinor 76
#define HOC_cudaDevAttrStreamPrioritiesSupported 78
#define HOC_cudaDevAttrGlobalL1CacheSupported 79
#define HOC_cudaDevAttrLocalL1CacheSupported 80
#define HOC_cudaDevAttrMaxSharedMemoryPerMultiprocessor 81
#define HOC_cudaDevAttrMaxRegistersPerMultiprocessor 82
#define HOC_cudaDevAttrManagedMemory 83
#define HOC_cudaDevAttrIsMultiGpuBoard 84
#define HOC_cudaDevAttrMultiGpuBoardGroupID 85
#define HOC_cudaDevAttrHostNativeAtomicSupported 86
#define HOC_cudaDevAttrSingleToDoublePrecisionPerfRatio 87
#define HOC_cudaDevAttrPageableMemoryAccess 88
#define HOC_cudaDevAttrConcurrentManagedAccess 89
#define HOC_cudaDevAttrComputePreemptionSupported 90
#define HOC_cudaDevAttrCanUseHostPointerForRegisteredMem 91
#define HOC_cudaDevAttrCooperativeLaunch 95
#define HOC_cudaDevAttrMaxSharedMemoryPerBlockOptin 97
#define HOC_cudaDevAttrHostRegisterSupported 99
#define HOC_cudaDevAttrPageableMemoryAccessUsesHostPageTables 100
#define HOC_cudaDevAttrDirectManagedMemAccessFromHost 101
#define HOC_cudaDevAttrMaxBlocksPerMultiprocessor 106
#define HOC_cudaDevAttrMaxPersistingL2CacheSize 108
#define HOC_cudaDevAttrMaxAccessPolicyWindowSize 109
#define HOC_cudaDevAttrReservedSharedMemoryPerBlock 111
#define HOC_cudaDevAttrSparseCudaArraySupported 112
#define HOC_cudaDevAttrHostRegisterReadOnlySupported 113
#define HOC_cudaDevAttrTimelineSemaphoreInteropSupported 114
#define HOC_cudaDevAttrMemoryPoolsSupported 115
#define HOC_cudaDevAttrGPUDirectRDMASupported 116
#define HOC_cudaDevAttrGPUDirectRDMAFlushWritesOptions 117
#define HOC_cudaDevAttrGPUDirectRDMAWritesOrdering 118
#define HOC_cudaDevAttrMemoryPoolSupportedHandleTypes 119
#define HOC_cudaDevAttrClusterLaunch 120
#define HOC_cudaDevAttrDeferredMappingCudaArraySupported 121
#define HOC_cudaDevAttrIpcEventSupport 125

/* The leading fields of cudaPointerAttributes (CUDA 11+; CUDA 13 appends
 * reserved words, so callers pass a larger buffer). */
typedef struct {
    int type; /* cudaMemoryType */
    int device;
    void* devicePointer;
    void* hostPointer;
} hoc_pointer_attributes;
#define HOC_POINTER_ATTRIBUTES_BUFFER 256

/* cudaDeviceProp: only two leading fields are read, at offsets that every
 * layout since CUDA 11 shares (cudaGetDeviceProperties of CUDA 12 and 13
 * differ after maxGridSize). The buffer is larger than any layout. */
#define HOC_DEVICE_PROP_NAME_OFFSET 0
#define HOC_DEVICE_PROP_NAME_SIZE 256
#define HOC_DEVICE_PROP_UUID_OFFSET 256
#define HOC_DEVICE_PROP_TOTAL_GLOBAL_MEM_OFFSET 288
#define HOC_DEVICE_PROP_BUFFER 8192

#endif
