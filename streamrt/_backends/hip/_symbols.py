"""Every HIP and hiprtc entry point the hip backend calls, and the C symbols behind them.

The backend binds each hip-python function of :data:`_HIP_CALLS` /
:data:`_HIPRTC_CALLS` once, by name, as ``self._<name>``, and calls HIP only
through those. :data:`REQUIRED_HIP_SYMBOLS` and :data:`REQUIRED_HIPRTC_SYMBOLS`
are what a HIP library (such as the HIP-on-CUDA test harness) must export.
"""

from __future__ import annotations

__all__ = ["REQUIRED_HIPRTC_SYMBOLS", "REQUIRED_HIP_SYMBOLS"]

# hip-python function name -> the C symbol it resolves in libamdhip64.so.
_HIP_CALLS: dict[str, str] = {
    "hipGetDeviceCount": "hipGetDeviceCount",
    "hipSetDevice": "hipSetDevice",
    "hipGetDevice": "hipGetDevice",
    "hipGetDeviceProperties": "hipGetDevicePropertiesR0600",
    "hipDeviceSynchronize": "hipDeviceSynchronize",
    "hipMemGetInfo": "hipMemGetInfo",
    "hipDeviceGetStreamPriorityRange": "hipDeviceGetStreamPriorityRange",
    "hipStreamCreateWithPriority": "hipStreamCreateWithPriority",
    "hipStreamDestroy": "hipStreamDestroy",
    "hipStreamSynchronize": "hipStreamSynchronize",
    "hipStreamQuery": "hipStreamQuery",
    "hipStreamWaitEvent": "hipStreamWaitEvent",
    "hipEventCreateWithFlags": "hipEventCreateWithFlags",
    "hipEventDestroy": "hipEventDestroy",
    "hipEventRecord": "hipEventRecord",
    "hipEventQuery": "hipEventQuery",
    "hipEventSynchronize": "hipEventSynchronize",
    "hipEventElapsedTime": "hipEventElapsedTime",
    "hipMalloc": "hipMalloc",
    "hipFree": "hipFree",
    "hipHostMalloc": "hipHostMalloc",
    "hipHostFree": "hipHostFree",
    "hipMallocAsync": "hipMallocAsync",
    "hipFreeAsync": "hipFreeAsync",
    "hipPointerGetAttributes": "hipPointerGetAttributes",
    "hipGetLastError": "hipGetLastError",
    "hipMemsetAsync": "hipMemsetAsync",
    "hipMemcpyAsync": "hipMemcpyAsync",
    "hipDeviceCanAccessPeer": "hipDeviceCanAccessPeer",
    "hipDeviceEnablePeerAccess": "hipDeviceEnablePeerAccess",
    "hipMemcpyPeerAsync": "hipMemcpyPeerAsync",
    "hipLaunchHostFunc": "hipLaunchHostFunc",
    "hipDeviceGetAttribute": "hipDeviceGetAttribute",
    "hipExtMallocWithFlags": "hipExtMallocWithFlags",
    "hipStreamWaitValue64": "hipStreamWaitValue64",
    "hipStreamBeginCapture": "hipStreamBeginCapture",
    "hipStreamEndCapture": "hipStreamEndCapture",
    "hipStreamIsCapturing": "hipStreamIsCapturing",
    "hipGraphInstantiate": "hipGraphInstantiate",
    "hipGraphLaunch": "hipGraphLaunch",
    "hipGraphExecDestroy": "hipGraphExecDestroy",
    "hipGraphDestroy": "hipGraphDestroy",
    "hipModuleLoadData": "hipModuleLoadData",
    "hipModuleGetFunction": "hipModuleGetFunction",
    "hipModuleUnload": "hipModuleUnload",
    "hipModuleLaunchKernel": "hipModuleLaunchKernel",
    "hipGetErrorName": "hipGetErrorName",
    "hipGetErrorString": "hipGetErrorString",
}

# hip-python hiprtc function name -> the C symbol it resolves in libhiprtc.so.
_HIPRTC_CALLS: dict[str, str] = {
    "hiprtcVersion": "hiprtcVersion",
    "hiprtcCreateProgram": "hiprtcCreateProgram",
    "hiprtcCompileProgram": "hiprtcCompileProgram",
    "hiprtcGetProgramLogSize": "hiprtcGetProgramLogSize",
    "hiprtcGetProgramLog": "hiprtcGetProgramLog",
    "hiprtcGetCodeSize": "hiprtcGetCodeSize",
    "hiprtcGetCode": "hiprtcGetCode",
    "hiprtcDestroyProgram": "hiprtcDestroyProgram",
    "hiprtcGetErrorString": "hiprtcGetErrorString",
}

REQUIRED_HIP_SYMBOLS: tuple[str, ...] = tuple(sorted(set(_HIP_CALLS.values())))
REQUIRED_HIPRTC_SYMBOLS: tuple[str, ...] = tuple(sorted(set(_HIPRTC_CALLS.values())))

