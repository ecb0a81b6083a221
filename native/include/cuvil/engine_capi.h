/* C interface of a Cuvil engine, for other C extensions.
 *
 * `Engine.capsule()` returns a PyCapsule named CUVIL_ENGINE_CAPSULE whose pointer is a
 * `const cuvil_engine_api_v1 *`. The capsule keeps the engine (and its JIT code and constants)
 * alive; hold a reference to it for as long as you call `run`.
 *
 *   const cuvil_engine_api_v1 *api = PyCapsule_GetPointer(cap, CUVIL_ENGINE_CAPSULE);
 *   if (api->abi_version != CUVIL_ENGINE_ABI_VERSION) ... refuse ...
 *   char err[256];
 *   if (api->run(api->engine, inputs, outputs, symbols, err, sizeof err) != 0) ... report err ...
 *
 * `run` is thread-safe (many threads may call one engine at once), never touches Python objects,
 * and should be called with the GIL released. Buffers are contiguous CPU memory; `nbytes` must
 * equal the size the program expects for that input or output.
 */
#ifndef CUVIL_ENGINE_CAPI_H
#define CUVIL_ENGINE_CAPI_H

#include <stddef.h>
#include <stdint.h>

#define CUVIL_ENGINE_CAPSULE "cuvil.engine"
#define CUVIL_ENGINE_ABI_VERSION 1u

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cuvil_buffer {
    void *data;
    uint64_t nbytes;
} cuvil_buffer;

typedef struct cuvil_engine_api_v1 {
    uint32_t abi_version; /* CUVIL_ENGINE_ABI_VERSION */
    uint32_t num_inputs;
    uint32_t num_outputs;
    uint32_t num_symbols;
    void *engine; /* opaque; pass back to run */
    /* One call. Returns 0 on success; otherwise -1 and a NUL-terminated message in err. */
    int (*run)(void *engine, const cuvil_buffer *inputs, const cuvil_buffer *outputs,
               const int64_t *symbols, char *err, size_t err_size);
} cuvil_engine_api_v1;

#ifdef __cplusplus
}
#endif

#endif /* CUVIL_ENGINE_CAPI_H */
