//go:build linux && cgo && !kvasir_novulkan

// The C side of engine/vulkan: a few coarse calls over the Vulkan API, whose
// entry points are loaded at run time from the system loader (dlopen of
// libvulkan.so.1), so kvasir links no Vulkan library.
#ifndef KVASIR_KV_H
#define KVASIR_KV_H

#include <stddef.h>
#include <stdint.h>

#define KV_ERRLEN 256

typedef struct kv_ctx kv_ctx;
typedef struct kv_wbuf kv_wbuf;

typedef struct {
	char name[256];
	int type; // VkPhysicalDeviceType
	uint32_t vendor, device, api;
	uint64_t local_bytes; // largest device-local heap
	uint64_t max_alloc;   // maxStorageBufferRange
	int subgroup_arith;   // Vulkan 1.1 subgroup arithmetic in compute shaders
} kv_devinfo;

// One dispatch of a command buffer.
typedef struct {
	int32_t pipeline;    // index into the pipelines given to kv_open
	int32_t barrier;     // 1: a compute->compute memory barrier before it
	kv_wbuf *weights;    // bound at set 1 (NULL: none)
	uint32_t push[8];    // push constants
	uint32_t gx, gy, gz; // workgroups
} kv_cmd;

int kv_load(char *err);
int kv_devices(kv_devinfo *out, int max, char *err);
kv_ctx *kv_open(int index, int npipe, const void **spv, const size_t *spvlen, char *err);
void kv_close(kv_ctx *c);
kv_wbuf *kv_weights(kv_ctx *c, uint64_t size, uint64_t block_hint, char *err);
// kv_release destroys a weight buffer of kv_weights; its memory range and
// descriptor set are reused by later kv_weights calls. The device must be
// idle (no submission using b in flight).
void kv_release(kv_ctx *c, kv_wbuf *b);
int kv_upload(kv_ctx *c, kv_wbuf *b, uint64_t off, const void *data, uint64_t size, char *err);
int kv_flush(kv_ctx *c, char *err);
float *kv_scratch(kv_ctx *c, uint64_t bytes, char *err);
int kv_run(kv_ctx *c, const kv_cmd *cmds, int n, uint64_t timeout_ns, char *err);
uint64_t kv_device_bytes(kv_ctx *c);
// kv_copy_bench runs iters copies of bytes between two device-local
// buffers, one after the other, in one submission, and waits for them (a
// memory bandwidth probe; the caller times it).
int kv_copy_bench(kv_ctx *c, uint64_t bytes, int iters, char *err);
// kv_blocks returns the number of device memory blocks weights are placed in.
int kv_blocks(kv_ctx *c);

#endif
