"""The tables of `nsys export --type sqlite` (schema 3.25) that ppscope writes, as data.

Column names, types and NOT NULL flags follow Nsight Systems' own exports (schema 3.24/3.25); only the
tables the exporter fills are declared. This module knows nothing about spans: it is the DDL and the
enumeration rows that readers join against.
"""

from __future__ import annotations

__all__ = ["ENUM_ROWS", "EXPORT_SCHEMA_VERSION", "TABLES", "create_tables_sql"]

EXPORT_SCHEMA_VERSION = "3.25.0"
"""The `nsys export` schema whose table and column names the exporter follows."""

_I, _T, _R = "INTEGER", "TEXT", "REAL"
_NN = True

# table -> [(column, type, not_null)]; `id ... PRIMARY KEY` is marked by the column name `id` + "PK".
TABLES: dict[str, list[tuple[str, str, bool]]] = {
    "StringIds": [("id", _I + " PK", _NN), ("value", _T, _NN)],
    "ThreadNames": [("nameId", _I, _NN), ("priority", _I, False), ("globalTid", _I, False)],
    "PROCESSES": [("globalPid", _I, False), ("pid", _I, False), ("name", _T, False)],
    "META_DATA_EXPORT": [("name", _T, _NN), ("value", _T, False)],
    "TARGET_INFO_SESSION_START_TIME": [
        ("utcEpochNs", _I, False),
        ("utcTime", _T, False),
        ("localTime", _T, False),
        ("systemClockNs", _I, False),
    ],
    "ANALYSIS_DETAILS": [("globalVid", _I, _NN), ("duration", _I, _NN), ("startTime", _I, _NN), ("stopTime", _I, _NN)],
    "TARGET_INFO_GPU": [
        ("vmId", _I, _NN),
        ("id", _I, _NN),
        ("name", _T, False),
        ("busLocation", _T, False),
        ("isDiscrete", _I, False),
        ("l2CacheSize", _I, False),
        ("totalMemory", _I, False),
        ("memoryBandwidth", _I, False),
        ("clockRate", _I, False),
        ("smCount", _I, False),
        ("pwGpuId", _I, False),
        ("uuid", _T, False),
        ("luid", _I, False),
        ("chipName", _T, False),
        ("cuDevice", _I, False),
        ("ctxswDevPath", _T, False),
        ("ctrlDevPath", _T, False),
        ("revision", _I, False),
        ("nodeMask", _I, False),
        ("constantMemory", _I, False),
        ("maxIPC", _I, False),
        ("maxRegistersPerBlock", _I, False),
        ("maxShmemPerBlock", _I, False),
        ("maxShmemPerBlockOptin", _I, False),
        ("maxShmemPerSm", _I, False),
        ("maxRegistersPerSm", _I, False),
        ("threadsPerWarp", _I, False),
        ("asyncEngines", _I, False),
        ("maxWarpsPerSm", _I, False),
        ("maxBlocksPerSm", _I, False),
        ("maxThreadsPerBlock", _I, False),
        ("maxBlockDimX", _I, False),
        ("maxBlockDimY", _I, False),
        ("maxBlockDimZ", _I, False),
        ("maxGridDimX", _I, False),
        ("maxGridDimY", _I, False),
        ("maxGridDimZ", _I, False),
        ("computeMajor", _I, False),
        ("computeMinor", _I, False),
        ("smMajor", _I, False),
        ("smMinor", _I, False),
    ],
    "TARGET_INFO_CUDA_DEVICE": [
        ("gpuId", _I, False),
        ("cudaId", _I, _NN),
        ("pid", _I, _NN),
        ("uuid", _T, False),
        ("numMultiprocessors", _I, False),
    ],
    "NVTX_EVENTS": [
        ("start", _I, _NN),
        ("end", _I, False),
        ("eventType", _I, _NN),
        ("rangeId", _I, False),
        ("category", _I, False),
        ("color", _I, False),
        ("text", _T, False),
        ("globalTid", _I, False),
        ("endGlobalTid", _I, False),
        ("textId", _I, False),
        ("domainId", _I, False),
        ("uint64Value", _I, False),
        ("int64Value", _I, False),
        ("doubleValue", _R, False),
        ("uint32Value", _I, False),
        ("int32Value", _I, False),
        ("floatValue", _R, False),
        ("jsonTextId", _I, False),
        ("jsonText", _T, False),
        ("binaryData", _T, False),
    ],
    "CUPTI_ACTIVITY_KIND_RUNTIME": [
        ("start", _I, _NN),
        ("end", _I, _NN),
        ("eventClass", _I, _NN),
        ("globalTid", _I, False),
        ("correlationId", _I, False),
        ("nameId", _I, _NN),
        ("returnValue", _I, _NN),
        ("callchainId", _I, False),
    ],
    "CUPTI_ACTIVITY_KIND_KERNEL": [
        ("start", _I, _NN),
        ("end", _I, _NN),
        ("deviceId", _I, _NN),
        ("contextId", _I, _NN),
        ("greenContextId", _I, False),
        ("streamId", _I, _NN),
        ("correlationId", _I, False),
        ("globalPid", _I, False),
        ("demangledName", _I, _NN),
        ("shortName", _I, _NN),
        ("mangledName", _I, False),
        ("launchType", _I, False),
        ("cacheConfig", _I, False),
        ("registersPerThread", _I, _NN),
        ("gridX", _I, _NN),
        ("gridY", _I, _NN),
        ("gridZ", _I, _NN),
        ("blockX", _I, _NN),
        ("blockY", _I, _NN),
        ("blockZ", _I, _NN),
        ("staticSharedMemory", _I, _NN),
        ("dynamicSharedMemory", _I, _NN),
        ("localMemoryPerThread", _I, _NN),
        ("localMemoryTotal", _I, _NN),
        ("gridId", _I, _NN),
        ("sharedMemoryExecuted", _I, False),
        ("graphNodeId", _I, False),
        ("sharedMemoryLimitConfig", _I, False),
        ("qmdBulkReleaseDone", _I, False),
        ("qmdPreexitDone", _I, False),
        ("qmdLastCtaDone", _I, False),
        ("graphId", _I, False),
        ("clusterX", _I, False),
        ("clusterY", _I, False),
        ("clusterZ", _I, False),
        ("clusterSchedulingPolicy", _I, False),
        ("maxPotentialClusterSize", _I, False),
        ("maxActiveClusters", _I, False),
        ("sharedMemoryRequestedPercentage", _I, False),
        ("tensorSizeMinusOneElements", _T, _NN),
    ],
}

_ENUM_COLUMNS = [("id", _I + " PK", _NN), ("name", _T, False), ("label", _T, False)]

# Enumerations readers join (event types of NVTX rows, runtime event classes, kernel attributes).
ENUM_ROWS: dict[str, list[tuple[int, str, str]]] = {
    "ENUM_NSYS_EVENT_TYPE": [
        (i, n, n)
        for i, n in [
            (32, "NvtxEvents"),
            (33, "NvtxCategory"),
            (34, "NvtxMark"),
            (35, "NvtxPushRange"),
            (36, "NvtxPopRange"),
            (37, "NvtxStartRange"),
            (38, "NvtxEndRange"),
            (39, "NvtxThread"),
            (59, "NvtxPushPopRange"),
            (60, "NvtxStartEndRange"),
            (64, "NvtxtCategory"),
            (65, "NvtxtMark"),
            (70, "NvtxtPushPopRange"),
            (71, "NvtxtStartEndRange"),
            (75, "NvtxDomainCreate"),
            (76, "NvtxDomainDestroy"),
        ]
    ],
    "ENUM_NSYS_EVENT_CLASS": [
        (0, "TRACE_PROCESS_EVENT_CUDA_RUNTIME", "CUDA runtime"),
        (1, "TRACE_PROCESS_EVENT_CUDA_DRIVER", "CUDA driver"),
    ],
    "ENUM_CUDA_KERNEL_LAUNCH_TYPE": [
        (0, "CUDA_KERNEL_LAUNCH_TYPE_UNKNOWN", "Unknown"),
        (1, "CUDA_KERNEL_LAUNCH_TYPE_REGULAR", "Regular"),
        (2, "CUDA_KERNEL_LAUNCH_TYPE_COOPERATIVE_SINGLE_DEVICE", "Coop Single Device"),
        (3, "CUDA_KERNEL_LAUNCH_TYPE_COOPERATIVE_MULTI_DEVICE", "Coop Multi Device"),
    ],
    "ENUM_CUDA_FUNC_CACHE_CONFIG": [
        (0, "CU_FUNC_CACHE_PREFER_NONE", "None"),
        (1, "CU_FUNC_CACHE_PREFER_SHARED", "Shared"),
        (2, "CU_FUNC_CACHE_PREFER_L1", "L1"),
        (3, "CU_FUNC_CACHE_PREFER_EQUAL", "Equal"),
    ],
    "ENUM_CUDA_SHARED_MEM_LIMIT_CONFIG": [
        (0, "CUDA_SHARED_MEM_LIMIT_DEFAULT", "Default"),
        (1, "CUDA_SHARED_MEM_LIMIT_OPTIN", "Opt in"),
    ],
}


def _column_sql(name: str, typ: str, not_null: bool) -> str:
    if typ.endswith(" PK"):
        return f"{name} {typ[:-3]} NOT NULL PRIMARY KEY"
    return f"{name} {typ}" + (" NOT NULL" if not_null else "")


def create_tables_sql() -> str:
    """`CREATE TABLE` statements for every declared table and enumeration, in one script."""
    statements = []
    for table, columns in [*TABLES.items(), *((t, _ENUM_COLUMNS) for t in ENUM_ROWS)]:
        body = ",\n    ".join(_column_sql(*c) for c in columns)
        statements.append(f"CREATE TABLE {table} (\n    {body}\n);")
    return "\n".join(statements)
