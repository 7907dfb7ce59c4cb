/* The interface between the engine and the CUDA plugin (libexo_cuda.so).
 *
 * The CUDA backend is built as a shared object and loaded at run time, so
 * one exo binary runs on machines with and without NVIDIA's driver and
 * libraries: only the plugin links cudart and cuBLAS. The plugin calls
 * back into the executable for what the engine already has (errors, logs,
 * the router, the weight layout helpers), which is why exo is linked with
 * -rdynamic. EXO_CUDA_PLUGIN_ABI changes whenever this struct, the backend
 * vtable or a type either passes changes. */
#ifndef EXO_ENGINE_CUDA_PLUGIN_H
#define EXO_ENGINE_CUDA_PLUGIN_H

#include "engine/backend.h"

#define EXO_CUDA_PLUGIN_ABI 9
#define EXO_CUDA_PLUGIN_SYMBOL "exo_cuda_plugin_entry"

typedef struct exo_cuda_plugin {
    int abi;
    size_t vtable_size; /* sizeof(exo_backend_ops) the plugin was built with */
    int (*device_count)(void);
    int (*memory)(int device, size_t *free_bytes, size_t *total_bytes, exo_err *err);
    exo_backend *(*create)(int device, exo_err *err);
    double (*copy_bandwidth)(int device); /* bytes/s read + written by a device copy; 0: unknown */
} exo_cuda_plugin;

#endif
