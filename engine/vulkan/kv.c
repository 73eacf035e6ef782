//go:build linux && cgo && !kvasir_novulkan

// See kv.h. Every Vulkan function is called through a pointer loaded with
// vkGetInstanceProcAddr / vkGetDeviceProcAddr (VK_NO_PROTOTYPES).
#if defined(__has_include)
#if __has_include(<vulkan/vulkan.h>)
#define KV_HAVE_VULKAN_H 1
#endif
#endif

#ifndef KV_HAVE_VULKAN_H
// Built where the Vulkan headers (Debian libvulkan-dev) are missing: the
// backend reports that it is not built in, and workers compute on the CPU.
// Nothing else of the build needs Vulkan.
#include <stdio.h>
#include "kv.h"

static int kv_missing(char *err) {
	snprintf(err, KV_ERRLEN, "vulkan backend not built in: the Vulkan headers were missing at build time (install libvulkan-dev and rebuild)");
	return -1;
}
int kv_load(char *err) { return kv_missing(err); }
int kv_devices(kv_devinfo *out, int max, char *err) { (void)out; (void)max; return kv_missing(err); }
kv_ctx *kv_open(int index, int npipe, const void **spv, const size_t *spvlen, char *err) {
	(void)index; (void)npipe; (void)spv; (void)spvlen; kv_missing(err); return NULL;
}
void kv_close(kv_ctx *c) { (void)c; }
kv_wbuf *kv_weights(kv_ctx *c, uint64_t size, uint64_t block_hint, char *err) {
	(void)c; (void)size; (void)block_hint; kv_missing(err); return NULL;
}
int kv_upload(kv_ctx *c, kv_wbuf *b, uint64_t off, const void *data, uint64_t size, char *err) {
	(void)c; (void)b; (void)off; (void)data; (void)size; return kv_missing(err);
}
int kv_flush(kv_ctx *c, char *err) { (void)c; return kv_missing(err); }
float *kv_scratch(kv_ctx *c, uint64_t bytes, char *err) { (void)c; (void)bytes; kv_missing(err); return NULL; }
int kv_run(kv_ctx *c, const kv_cmd *cmds, int n, uint64_t timeout_ns, char *err) {
	(void)c; (void)cmds; (void)n; (void)timeout_ns; return kv_missing(err);
}
uint64_t kv_device_bytes(kv_ctx *c) { (void)c; return 0; }
void kv_release(kv_ctx *c, kv_wbuf *b) { (void)c; (void)b; }
int kv_blocks(kv_ctx *c) { (void)c; return 0; }
int kv_copy_bench(kv_ctx *c, uint64_t bytes, int iters, char *err) {
	(void)c; (void)bytes; (void)iters; return kv_missing(err);
}

#else

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include "kv.h"

static void *lib;
static PFN_vkGetInstanceProcAddr getInstanceProcAddr;
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;

#define INSTANCE_FUNCS(X) \
	X(vkDestroyInstance) X(vkEnumeratePhysicalDevices) X(vkGetPhysicalDeviceProperties) \
	X(vkGetPhysicalDeviceMemoryProperties) X(vkGetPhysicalDeviceQueueFamilyProperties) \
	X(vkCreateDevice) X(vkGetDeviceProcAddr)

#define DEVICE_FUNCS(X) \
	X(vkDestroyDevice) X(vkGetDeviceQueue) X(vkCreateBuffer) X(vkDestroyBuffer) \
	X(vkGetBufferMemoryRequirements) X(vkAllocateMemory) X(vkFreeMemory) X(vkBindBufferMemory) \
	X(vkMapMemory) X(vkUnmapMemory) X(vkCreateShaderModule) X(vkDestroyShaderModule) \
	X(vkCreateDescriptorSetLayout) X(vkDestroyDescriptorSetLayout) X(vkCreatePipelineLayout) \
	X(vkDestroyPipelineLayout) X(vkCreateComputePipelines) X(vkDestroyPipeline) \
	X(vkCreateDescriptorPool) X(vkDestroyDescriptorPool) X(vkAllocateDescriptorSets) \
	X(vkUpdateDescriptorSets) X(vkCreateCommandPool) X(vkDestroyCommandPool) \
	X(vkAllocateCommandBuffers) X(vkBeginCommandBuffer) X(vkEndCommandBuffer) \
	X(vkResetCommandBuffer) X(vkCmdBindPipeline) X(vkCmdBindDescriptorSets) \
	X(vkCmdPushConstants) X(vkCmdDispatch) X(vkCmdPipelineBarrier) X(vkCmdCopyBuffer) \
	X(vkCreateFence) X(vkDestroyFence) X(vkResetFences) X(vkWaitForFences) \
	X(vkQueueSubmit) X(vkDeviceWaitIdle)

#define DECL(f) PFN_##f f;

typedef struct {
	INSTANCE_FUNCS(DECL)
	PFN_vkGetPhysicalDeviceProperties2 vkGetPhysicalDeviceProperties2; // Vulkan 1.1; checked in kv_open
} ifuncs;

typedef struct {
	DEVICE_FUNCS(DECL)
} dfuncs;

#define MAX_PIPES 32
#define MAX_POOLS 4096
#define POOL_SETS 256
#define STAGING_BYTES (64u << 20)

typedef struct {
	VkBuffer buf;
	VkDeviceMemory mem;
	void *map;
	uint64_t size;
} hbuf; // a buffer with its own memory

typedef struct mblock {
	VkDeviceMemory mem;
	uint64_t size, used;
	struct mblock *next;
} mblock;

struct kv_wbuf {
	VkBuffer buf;
	VkDescriptorSet set;
	uint64_t size;
	mblock *m;          // the memory block it is bound in
	uint64_t off, span; // its range there: [off, off+span)
};

// A released range of a memory block, free for the next kv_weights.
typedef struct frange {
	mblock *m;
	uint64_t off, size;
	struct frange *next;
} frange;

typedef struct wlist {
	kv_wbuf *b;
	struct wlist *next;
} wlist;

struct kv_ctx {
	ifuncs fi;
	dfuncs f;
	VkInstance inst;
	VkPhysicalDevice phys;
	VkPhysicalDeviceMemoryProperties memp;
	VkDevice dev;
	VkQueue queue;
	uint32_t qfam;
	VkDescriptorSetLayout dsl[2];
	VkPipelineLayout layout;
	VkPipeline pipes[MAX_PIPES];
	int npipe;
	VkDescriptorPool pools[MAX_POOLS];
	int npool, pool_left;
	VkDescriptorSet scratch_set;
	hbuf scratch, staging;
	uint64_t staging_used;
	VkCommandPool cpool;
	VkCommandBuffer cmd, up_cmd;
	int up_open;
	VkFence fence;
	mblock *blocks;
	wlist *wbufs;
	frange *free;             // released ranges, sorted by (block, offset), adjacent ones merged
	VkDescriptorSet *spare;   // descriptor sets of released buffers, for reuse
	int nspare, capspare;
	uint64_t dev_bytes;
};

static const char *vkres(VkResult r) {
	switch (r) {
	case VK_SUCCESS: return "VK_SUCCESS";
	case VK_TIMEOUT: return "VK_TIMEOUT";
	case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
	case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
	case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
	case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
	case VK_ERROR_MEMORY_MAP_FAILED: return "VK_ERROR_MEMORY_MAP_FAILED";
	case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
	case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
	case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
	case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
	case VK_ERROR_OUT_OF_POOL_MEMORY: return "VK_ERROR_OUT_OF_POOL_MEMORY";
	case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
	case VK_ERROR_FORMAT_NOT_SUPPORTED: return "VK_ERROR_FORMAT_NOT_SUPPORTED";
	case VK_ERROR_FRAGMENTED_POOL: return "VK_ERROR_FRAGMENTED_POOL";
	case VK_ERROR_UNKNOWN: return "VK_ERROR_UNKNOWN";
	default: return "VkResult";
	}
}

// fail writes "what: VK_..." to err and returns r (negative VkResults are errors).
static int fail(char *err, const char *what, VkResult r) {
	snprintf(err, KV_ERRLEN, "%s: %s (%d)", what, vkres(r), (int)r);
	return r == VK_SUCCESS ? -1 : (int)r;
}

int kv_load(char *err) {
	pthread_mutex_lock(&load_mu);
	if (lib == NULL) {
		const char *path = getenv("KVASIR_VULKAN_LIBRARY");
		const char *names[] = {"libvulkan.so.1", "libvulkan.so"};
		if (path != NULL && path[0] != 0) {
			lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
		} else {
			for (int i = 0; i < 2 && lib == NULL; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
		}
		if (lib == NULL) {
			const char *e = dlerror();
			snprintf(err, KV_ERRLEN, "no Vulkan loader: %s", e ? e : "libvulkan.so.1 not found");
			pthread_mutex_unlock(&load_mu);
			return -1;
		}
		getInstanceProcAddr = (PFN_vkGetInstanceProcAddr)dlsym(lib, "vkGetInstanceProcAddr");
		if (getInstanceProcAddr == NULL) {
			snprintf(err, KV_ERRLEN, "no Vulkan loader: vkGetInstanceProcAddr missing in the library");
			dlclose(lib);
			lib = NULL;
			pthread_mutex_unlock(&load_mu);
			return -1;
		}
	}
	pthread_mutex_unlock(&load_mu);
	return 0;
}

static int make_instance(VkInstance *inst, ifuncs *fi, char *err) {
	if (kv_load(err) != 0) return -1;
	PFN_vkCreateInstance create = (PFN_vkCreateInstance)getInstanceProcAddr(NULL, "vkCreateInstance");
	if (create == NULL) {
		snprintf(err, KV_ERRLEN, "no Vulkan loader: vkCreateInstance missing");
		return -1;
	}
	VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .pApplicationName = "kvasir",
		.pEngineName = "kvasir", .apiVersion = VK_API_VERSION_1_1};
	VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
	VkResult r = create(&ci, NULL, inst);
	if (r != VK_SUCCESS) return fail(err, "vkCreateInstance", r);
#define LOADI(f) fi->f = (PFN_##f)getInstanceProcAddr(*inst, #f); \
	if (fi->f == NULL) { snprintf(err, KV_ERRLEN, "Vulkan loader lacks %s", #f); return -1; }
	INSTANCE_FUNCS(LOADI)
	fi->vkGetPhysicalDeviceProperties2 = (PFN_vkGetPhysicalDeviceProperties2)getInstanceProcAddr(*inst, "vkGetPhysicalDeviceProperties2");
	return 0;
}

static uint64_t local_heap(VkPhysicalDeviceMemoryProperties *mp) {
	uint64_t best = 0;
	for (uint32_t i = 0; i < mp->memoryHeapCount; i++) {
		if ((mp->memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) && mp->memoryHeaps[i].size > best) {
			best = mp->memoryHeaps[i].size;
		}
	}
	return best;
}

int kv_devices(kv_devinfo *out, int max, char *err) {
	VkInstance inst;
	ifuncs fi;
	memset(&fi, 0, sizeof fi);
	int rc = make_instance(&inst, &fi, err);
	if (rc != 0) {
		if (fi.vkDestroyInstance) fi.vkDestroyInstance(inst, NULL);
		return rc < 0 ? rc : -1;
	}
	uint32_t n = 0;
	VkResult r = fi.vkEnumeratePhysicalDevices(inst, &n, NULL);
	if (r != VK_SUCCESS) {
		fi.vkDestroyInstance(inst, NULL);
		return fail(err, "vkEnumeratePhysicalDevices", r);
	}
	VkPhysicalDevice devs[64];
	if (n > 64) n = 64;
	r = fi.vkEnumeratePhysicalDevices(inst, &n, devs);
	if (r != VK_SUCCESS && r != VK_INCOMPLETE) {
		fi.vkDestroyInstance(inst, NULL);
		return fail(err, "vkEnumeratePhysicalDevices", r);
	}
	int cnt = 0;
	for (uint32_t i = 0; i < n && cnt < max; i++, cnt++) {
		VkPhysicalDeviceProperties p;
		VkPhysicalDeviceMemoryProperties mp;
		fi.vkGetPhysicalDeviceProperties(devs[i], &p);
		fi.vkGetPhysicalDeviceMemoryProperties(devs[i], &mp);
		kv_devinfo *d = &out[cnt];
		snprintf(d->name, sizeof d->name, "%s", p.deviceName);
		d->type = (int)p.deviceType;
		d->vendor = p.vendorID;
		d->device = p.deviceID;
		d->api = p.apiVersion;
		d->local_bytes = local_heap(&mp);
		d->max_alloc = p.limits.maxStorageBufferRange;
		d->subgroup_arith = 0;
		if (p.apiVersion >= VK_API_VERSION_1_1 && fi.vkGetPhysicalDeviceProperties2 != NULL) {
			VkPhysicalDeviceSubgroupProperties sub = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
			VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sub};
			fi.vkGetPhysicalDeviceProperties2(devs[i], &p2);
			d->subgroup_arith = (sub.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
				(sub.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT);
		}
	}
	fi.vkDestroyInstance(inst, NULL);
	return cnt;
}

static int find_mem(kv_ctx *c, uint32_t bits, VkMemoryPropertyFlags want, VkMemoryPropertyFlags prefer) {
	for (int pass = 0; pass < 2; pass++) {
		VkMemoryPropertyFlags w = pass == 0 ? (want | prefer) : want;
		for (uint32_t i = 0; i < c->memp.memoryTypeCount; i++) {
			if ((bits & (1u << i)) && (c->memp.memoryTypes[i].propertyFlags & w) == w) return (int)i;
		}
	}
	return -1;
}

// make_hbuf creates a host-visible, coherent, mapped storage/transfer buffer.
static int make_hbuf(kv_ctx *c, uint64_t size, hbuf *h, char *err) {
	memset(h, 0, sizeof *h);
	VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = size,
		.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT,
		.sharingMode = VK_SHARING_MODE_EXCLUSIVE};
	VkResult r = c->f.vkCreateBuffer(c->dev, &bi, NULL, &h->buf);
	if (r != VK_SUCCESS) return fail(err, "vkCreateBuffer (host)", r);
	VkMemoryRequirements req;
	c->f.vkGetBufferMemoryRequirements(c->dev, h->buf, &req);
	int mt = find_mem(c, req.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
		VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
	if (mt < 0) {
		snprintf(err, KV_ERRLEN, "no host-visible coherent memory type");
		return -1;
	}
	VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = req.size, .memoryTypeIndex = (uint32_t)mt};
	r = c->f.vkAllocateMemory(c->dev, &ai, NULL, &h->mem);
	if (r != VK_SUCCESS) return fail(err, "vkAllocateMemory (host)", r);
	r = c->f.vkBindBufferMemory(c->dev, h->buf, h->mem, 0);
	if (r != VK_SUCCESS) return fail(err, "vkBindBufferMemory (host)", r);
	r = c->f.vkMapMemory(c->dev, h->mem, 0, VK_WHOLE_SIZE, 0, &h->map);
	if (r != VK_SUCCESS) return fail(err, "vkMapMemory", r);
	h->size = size;
	return 0;
}

static void free_hbuf(kv_ctx *c, hbuf *h) {
	if (h->buf) c->f.vkDestroyBuffer(c->dev, h->buf, NULL);
	if (h->mem) c->f.vkFreeMemory(c->dev, h->mem, NULL); // unmaps
	memset(h, 0, sizeof *h);
}

static int alloc_set(kv_ctx *c, int which, VkDescriptorSet *set, char *err) {
	if (which == 1 && c->nspare > 0) {
		*set = c->spare[--c->nspare];
		return 0;
	}
	if (which == 1 && c->pool_left == 0) {
		if (c->npool == MAX_POOLS) {
			snprintf(err, KV_ERRLEN, "too many descriptor pools");
			return -1;
		}
		VkDescriptorPoolSize ps = {.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .descriptorCount = POOL_SETS};
		VkDescriptorPoolCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
			.maxSets = POOL_SETS, .poolSizeCount = 1, .pPoolSizes = &ps};
		VkResult r = c->f.vkCreateDescriptorPool(c->dev, &pi, NULL, &c->pools[c->npool]);
		if (r != VK_SUCCESS) return fail(err, "vkCreateDescriptorPool", r);
		c->npool++;
		c->pool_left = POOL_SETS;
	}
	VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
		.descriptorPool = c->pools[which == 0 ? 0 : c->npool - 1], .descriptorSetCount = 1, .pSetLayouts = &c->dsl[which]};
	VkResult r = c->f.vkAllocateDescriptorSets(c->dev, &ai, set);
	if (r != VK_SUCCESS) return fail(err, "vkAllocateDescriptorSets", r);
	if (which == 1) c->pool_left--;
	return 0;
}

static void write_set(kv_ctx *c, VkDescriptorSet set, VkBuffer buf, uint64_t size) {
	VkDescriptorBufferInfo bi = {.buffer = buf, .offset = 0, .range = size};
	VkWriteDescriptorSet w = {.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, .dstSet = set, .dstBinding = 0,
		.descriptorCount = 1, .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .pBufferInfo = &bi};
	c->f.vkUpdateDescriptorSets(c->dev, 1, &w, 0, NULL);
}

kv_ctx *kv_open(int index, int npipe, const void **spv, const size_t *spvlen, char *err) {
	if (npipe > MAX_PIPES) {
		snprintf(err, KV_ERRLEN, "too many pipelines");
		return NULL;
	}
	kv_ctx *c = calloc(1, sizeof *c);
	if (c == NULL) {
		snprintf(err, KV_ERRLEN, "out of host memory");
		return NULL;
	}
	if (make_instance(&c->inst, &c->fi, err) != 0) goto bad;
	uint32_t n = 0;
	VkPhysicalDevice devs[64];
	VkResult r = c->fi.vkEnumeratePhysicalDevices(c->inst, &n, NULL);
	if (r != VK_SUCCESS) { fail(err, "vkEnumeratePhysicalDevices", r); goto bad; }
	if (n > 64) n = 64;
	r = c->fi.vkEnumeratePhysicalDevices(c->inst, &n, devs);
	if (r != VK_SUCCESS && r != VK_INCOMPLETE) { fail(err, "vkEnumeratePhysicalDevices", r); goto bad; }
	if (index < 0 || (uint32_t)index >= n) {
		snprintf(err, KV_ERRLEN, "no Vulkan device %d (%u found)", index, n);
		goto bad;
	}
	c->phys = devs[index];
	// The kernels are SPIR-V 1.3 (Vulkan 1.1); the caller picks the
	// subgroup or the row-per-lane matvec kernels (kv_devinfo.subgroup_arith).
	VkPhysicalDeviceProperties props;
	c->fi.vkGetPhysicalDeviceProperties(c->phys, &props);
	if (props.apiVersion < VK_API_VERSION_1_1 || c->fi.vkGetPhysicalDeviceProperties2 == NULL) {
		snprintf(err, KV_ERRLEN, "%s supports Vulkan %u.%u only; the kernels need 1.1", props.deviceName,
			VK_API_VERSION_MAJOR(props.apiVersion), VK_API_VERSION_MINOR(props.apiVersion));
		goto bad;
	}
	c->fi.vkGetPhysicalDeviceMemoryProperties(c->phys, &c->memp);
	c->dev_bytes = local_heap(&c->memp);
	uint32_t nq = 0;
	VkQueueFamilyProperties qf[32];
	c->fi.vkGetPhysicalDeviceQueueFamilyProperties(c->phys, &nq, NULL);
	if (nq > 32) nq = 32;
	c->fi.vkGetPhysicalDeviceQueueFamilyProperties(c->phys, &nq, qf);
	int fam = -1;
	for (uint32_t i = 0; i < nq; i++) {
		if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
			// prefer a compute queue without graphics (a dedicated one)
			if (fam < 0 || !(qf[i].queueFlags & VK_QUEUE_GRAPHICS_BIT)) fam = (int)i;
		}
	}
	if (fam < 0) {
		snprintf(err, KV_ERRLEN, "device %d has no compute queue", index);
		goto bad;
	}
	c->qfam = (uint32_t)fam;
	float prio = 1.0f;
	VkDeviceQueueCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, .queueFamilyIndex = c->qfam,
		.queueCount = 1, .pQueuePriorities = &prio};
	VkDeviceCreateInfo di = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .queueCreateInfoCount = 1, .pQueueCreateInfos = &qi};
	r = c->fi.vkCreateDevice(c->phys, &di, NULL, &c->dev);
	if (r != VK_SUCCESS) { fail(err, "vkCreateDevice", r); goto bad; }
#define LOADD(fn) c->f.fn = (PFN_##fn)c->fi.vkGetDeviceProcAddr(c->dev, #fn); \
	if (c->f.fn == NULL) { snprintf(err, KV_ERRLEN, "Vulkan driver lacks %s", #fn); goto bad; }
	DEVICE_FUNCS(LOADD)
	c->f.vkGetDeviceQueue(c->dev, c->qfam, 0, &c->queue);

	VkDescriptorSetLayoutBinding b = {.binding = 0, .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
		.descriptorCount = 1, .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
	VkDescriptorSetLayoutCreateInfo li = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, .bindingCount = 1, .pBindings = &b};
	for (int i = 0; i < 2; i++) {
		r = c->f.vkCreateDescriptorSetLayout(c->dev, &li, NULL, &c->dsl[i]);
		if (r != VK_SUCCESS) { fail(err, "vkCreateDescriptorSetLayout", r); goto bad; }
	}
	VkPushConstantRange pr = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .offset = 0, .size = 32};
	VkPipelineLayoutCreateInfo pli = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, .setLayoutCount = 2,
		.pSetLayouts = c->dsl, .pushConstantRangeCount = 1, .pPushConstantRanges = &pr};
	r = c->f.vkCreatePipelineLayout(c->dev, &pli, NULL, &c->layout);
	if (r != VK_SUCCESS) { fail(err, "vkCreatePipelineLayout", r); goto bad; }
	for (int i = 0; i < npipe; i++) {
		VkShaderModuleCreateInfo si = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, .codeSize = spvlen[i], .pCode = spv[i]};
		VkShaderModule m;
		r = c->f.vkCreateShaderModule(c->dev, &si, NULL, &m);
		if (r != VK_SUCCESS) { fail(err, "vkCreateShaderModule", r); goto bad; }
		VkComputePipelineCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
			.stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, .stage = VK_SHADER_STAGE_COMPUTE_BIT,
				.module = m, .pName = "main"},
			.layout = c->layout};
		r = c->f.vkCreateComputePipelines(c->dev, VK_NULL_HANDLE, 1, &ci, NULL, &c->pipes[i]);
		c->f.vkDestroyShaderModule(c->dev, m, NULL);
		if (r != VK_SUCCESS) { fail(err, "vkCreateComputePipelines", r); goto bad; }
		c->npipe = i + 1;
	}
	// Pool 0 holds the scratch set only.
	VkDescriptorPoolSize ps = {.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .descriptorCount = 1};
	VkDescriptorPoolCreateInfo poi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, .maxSets = 1, .poolSizeCount = 1, .pPoolSizes = &ps};
	r = c->f.vkCreateDescriptorPool(c->dev, &poi, NULL, &c->pools[0]);
	if (r != VK_SUCCESS) { fail(err, "vkCreateDescriptorPool", r); goto bad; }
	c->npool = 1;
	if (alloc_set(c, 0, &c->scratch_set, err) != 0) goto bad;
	VkCommandPoolCreateInfo cpi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
		.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, .queueFamilyIndex = c->qfam};
	r = c->f.vkCreateCommandPool(c->dev, &cpi, NULL, &c->cpool);
	if (r != VK_SUCCESS) { fail(err, "vkCreateCommandPool", r); goto bad; }
	VkCommandBuffer cbs[2];
	VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = c->cpool,
		.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 2};
	r = c->f.vkAllocateCommandBuffers(c->dev, &cai, cbs);
	if (r != VK_SUCCESS) { fail(err, "vkAllocateCommandBuffers", r); goto bad; }
	c->cmd = cbs[0];
	c->up_cmd = cbs[1];
	VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
	r = c->f.vkCreateFence(c->dev, &fci, NULL, &c->fence);
	if (r != VK_SUCCESS) { fail(err, "vkCreateFence", r); goto bad; }
	return c;
bad:
	kv_close(c);
	return NULL;
}

void kv_close(kv_ctx *c) {
	if (c == NULL) return;
	if (c->dev) {
		if (c->f.vkDeviceWaitIdle) c->f.vkDeviceWaitIdle(c->dev);
		if (c->f.vkDestroyFence && c->fence) c->f.vkDestroyFence(c->dev, c->fence, NULL);
		if (c->f.vkDestroyCommandPool && c->cpool) c->f.vkDestroyCommandPool(c->dev, c->cpool, NULL);
		if (c->f.vkDestroyBuffer) {
			free_hbuf(c, &c->scratch);
			free_hbuf(c, &c->staging);
			for (wlist *w = c->wbufs; w != NULL;) {
				wlist *nx = w->next;
				c->f.vkDestroyBuffer(c->dev, w->b->buf, NULL);
				free(w->b);
				free(w);
				w = nx;
			}
			for (mblock *m = c->blocks; m != NULL;) {
				mblock *nx = m->next;
				c->f.vkFreeMemory(c->dev, m->mem, NULL);
				free(m);
				m = nx;
			}
			for (frange *r = c->free; r != NULL;) {
				frange *nx = r->next;
				free(r);
				r = nx;
			}
		}
		if (c->f.vkDestroyDescriptorPool) {
			for (int i = 0; i < c->npool; i++) c->f.vkDestroyDescriptorPool(c->dev, c->pools[i], NULL);
		}
		if (c->f.vkDestroyPipeline) {
			for (int i = 0; i < c->npipe; i++) c->f.vkDestroyPipeline(c->dev, c->pipes[i], NULL);
		}
		if (c->f.vkDestroyPipelineLayout && c->layout) c->f.vkDestroyPipelineLayout(c->dev, c->layout, NULL);
		if (c->f.vkDestroyDescriptorSetLayout) {
			for (int i = 0; i < 2; i++) {
				if (c->dsl[i]) c->f.vkDestroyDescriptorSetLayout(c->dev, c->dsl[i], NULL);
			}
		}
		if (c->f.vkDestroyDevice) c->f.vkDestroyDevice(c->dev, NULL);
	}
	if (c->inst && c->fi.vkDestroyInstance) c->fi.vkDestroyInstance(c->inst, NULL);
	free(c->spare);
	free(c);
}

uint64_t kv_device_bytes(kv_ctx *c) { return c->dev_bytes; }

int kv_blocks(kv_ctx *c) {
	int n = 0;
	for (mblock *m = c->blocks; m != NULL; m = m->next) n++;
	return n;
}

// take_range finds a released range that holds size bytes at an offset
// aligned to align, removes that part from the free list (what is left
// before and after it stays free) and returns its block and offset; -1
// when none fits.
static int take_range(kv_ctx *c, uint64_t size, uint64_t align, mblock **m, uint64_t *off) {
	if (align == 0) align = 1;
	for (frange **pr = &c->free; *pr != NULL; pr = &(*pr)->next) {
		frange *r = *pr;
		uint64_t a = (r->off + align - 1) / align * align;
		if (a + size > r->off + r->size) continue;
		*m = r->m;
		*off = a;
		uint64_t head = a - r->off, tail = r->off + r->size - (a + size);
		if (head == 0 && tail == 0) {
			*pr = r->next;
			free(r);
		} else if (head == 0) {
			r->off = a + size;
			r->size = tail;
		} else {
			r->size = head;
			if (tail > 0) {
				frange *t = calloc(1, sizeof *t);
				if (t != NULL) { // else the tail is lost until kv_close
					t->m = r->m;
					t->off = a + size;
					t->size = tail;
					t->next = r->next;
					r->next = t;
				}
			}
		}
		return 0;
	}
	return -1;
}

// put_range returns [off, off+size) of block m to the free list, merged
// with free neighbours.
static void put_range(kv_ctx *c, mblock *m, uint64_t off, uint64_t size) {
	frange **pr = &c->free;
	while (*pr != NULL && ((*pr)->m < m || ((*pr)->m == m && (*pr)->off < off))) pr = &(*pr)->next;
	frange *next = *pr;
	// pr points at the link to next; find the previous range to merge with.
	frange *prev = NULL;
	for (frange *r = c->free; r != NULL && r != next; r = r->next) prev = r;
	if (prev != NULL && prev->m == m && prev->off + prev->size == off) {
		prev->size += size;
		if (next != NULL && next->m == m && prev->off + prev->size == next->off) {
			prev->size += next->size;
			prev->next = next->next;
			free(next);
		}
		return;
	}
	if (next != NULL && next->m == m && off + size == next->off) {
		next->off = off;
		next->size += size;
		return;
	}
	frange *r = calloc(1, sizeof *r);
	if (r == NULL) return; // the range is lost until kv_close
	r->m = m;
	r->off = off;
	r->size = size;
	r->next = next;
	*pr = r;
}

void kv_release(kv_ctx *c, kv_wbuf *b) {
	if (c == NULL || b == NULL) return;
	for (wlist **pl = &c->wbufs; *pl != NULL; pl = &(*pl)->next) {
		if ((*pl)->b == b) {
			wlist *l = *pl;
			*pl = l->next;
			free(l);
			break;
		}
	}
	c->f.vkDestroyBuffer(c->dev, b->buf, NULL);
	put_range(c, b->m, b->off, b->span);
	if (b->set != VK_NULL_HANDLE) {
		if (c->nspare == c->capspare) {
			int cap = c->capspare == 0 ? 64 : 2 * c->capspare;
			VkDescriptorSet *s = realloc(c->spare, (size_t)cap * sizeof *s);
			if (s != NULL) {
				c->spare = s;
				c->capspare = cap;
			}
		}
		if (c->nspare < c->capspare) c->spare[c->nspare++] = b->set; // else the set stays allocated in its pool
	}
	free(b);
}

kv_wbuf *kv_weights(kv_ctx *c, uint64_t size, uint64_t block_hint, char *err) {
	VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = size,
		.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT, .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
	VkBuffer buf;
	VkResult r = c->f.vkCreateBuffer(c->dev, &bi, NULL, &buf);
	if (r != VK_SUCCESS) { fail(err, "vkCreateBuffer (weights)", r); return NULL; }
	VkMemoryRequirements req;
	c->f.vkGetBufferMemoryRequirements(c->dev, buf, &req);
	mblock *m = NULL;
	uint64_t off = 0;
	if (take_range(c, req.size, req.alignment, &m, &off) != 0) {
		m = c->blocks;
		if (m != NULL) off = (m->used + req.alignment - 1) / req.alignment * req.alignment;
	}
	int mt = find_mem(c, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
	if (mt < 0) mt = find_mem(c, req.memoryTypeBits, 0, 0);
	if (m == NULL || off + req.size > m->size) {
		uint64_t bs = block_hint > req.size ? block_hint : req.size;
		m = calloc(1, sizeof *m);
		if (m == NULL) {
			c->f.vkDestroyBuffer(c->dev, buf, NULL);
			snprintf(err, KV_ERRLEN, "out of host memory");
			return NULL;
		}
		VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = bs, .memoryTypeIndex = (uint32_t)mt};
		r = c->f.vkAllocateMemory(c->dev, &ai, NULL, &m->mem);
		if (r != VK_SUCCESS) {
			free(m);
			c->f.vkDestroyBuffer(c->dev, buf, NULL);
			fail(err, "vkAllocateMemory (weights)", r);
			return NULL;
		}
		m->size = bs;
		m->next = c->blocks;
		c->blocks = m;
		off = 0;
	}
	r = c->f.vkBindBufferMemory(c->dev, buf, m->mem, off);
	if (r != VK_SUCCESS) {
		c->f.vkDestroyBuffer(c->dev, buf, NULL);
		fail(err, "vkBindBufferMemory (weights)", r);
		return NULL;
	}
	if (off + req.size > m->used) m->used = off + req.size;
	kv_wbuf *w = calloc(1, sizeof *w);
	wlist *l = calloc(1, sizeof *l);
	if (w == NULL || l == NULL) {
		free(w);
		free(l);
		c->f.vkDestroyBuffer(c->dev, buf, NULL);
		snprintf(err, KV_ERRLEN, "out of host memory");
		return NULL;
	}
	w->buf = buf;
	w->size = size;
	w->m = m;
	w->off = off;
	w->span = req.size;
	l->b = w;
	l->next = c->wbufs;
	c->wbufs = l;
	if (alloc_set(c, 1, &w->set, err) != 0) return NULL; // buffer freed by kv_close
	write_set(c, w->set, buf, size);
	return w;
}

static int submit_wait(kv_ctx *c, VkCommandBuffer cb, uint64_t timeout_ns, char *err) {
	VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cb};
	VkResult r = c->f.vkResetFences(c->dev, 1, &c->fence);
	if (r != VK_SUCCESS) return fail(err, "vkResetFences", r);
	r = c->f.vkQueueSubmit(c->queue, 1, &si, c->fence);
	if (r != VK_SUCCESS) return fail(err, "vkQueueSubmit", r);
	r = c->f.vkWaitForFences(c->dev, 1, &c->fence, VK_TRUE, timeout_ns);
	if (r != VK_SUCCESS) return fail(err, "vkWaitForFences", r);
	return 0;
}

int kv_flush(kv_ctx *c, char *err) {
	if (!c->up_open) return 0;
	c->up_open = 0;
	c->staging_used = 0;
	VkResult r = c->f.vkEndCommandBuffer(c->up_cmd);
	if (r != VK_SUCCESS) return fail(err, "vkEndCommandBuffer", r);
	return submit_wait(c, c->up_cmd, UINT64_MAX, err);
}

int kv_upload(kv_ctx *c, kv_wbuf *b, uint64_t off, const void *data, uint64_t size, char *err) {
	if (c->staging.buf == NULL && make_hbuf(c, STAGING_BYTES, &c->staging, err) != 0) return -1;
	const char *p = data;
	while (size > 0) {
		if (c->staging_used == STAGING_BYTES) {
			int rc = kv_flush(c, err);
			if (rc != 0) return rc;
		}
		uint64_t n = STAGING_BYTES - c->staging_used;
		if (n > size) n = size;
		if (!c->up_open) {
			VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
				.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
			VkResult r = c->f.vkBeginCommandBuffer(c->up_cmd, &bi);
			if (r != VK_SUCCESS) return fail(err, "vkBeginCommandBuffer", r);
			c->up_open = 1;
		}
		memcpy((char *)c->staging.map + c->staging_used, p, n);
		VkBufferCopy cp = {.srcOffset = c->staging_used, .dstOffset = off, .size = n};
		c->f.vkCmdCopyBuffer(c->up_cmd, c->staging.buf, b->buf, 1, &cp);
		c->staging_used = (c->staging_used + n + 15) / 16 * 16;
		if (c->staging_used > STAGING_BYTES) c->staging_used = STAGING_BYTES;
		p += n;
		off += n;
		size -= n;
	}
	return 0;
}

float *kv_scratch(kv_ctx *c, uint64_t bytes, char *err) {
	if (c->scratch.buf != NULL && c->scratch.size >= bytes) return c->scratch.map;
	uint64_t size = bytes < (1u << 20) ? (1u << 20) : bytes;
	if (c->scratch.buf != NULL && size < c->scratch.size * 2) size = c->scratch.size * 2;
	free_hbuf(c, &c->scratch);
	if (make_hbuf(c, size, &c->scratch, err) != 0) {
		free_hbuf(c, &c->scratch);
		return NULL;
	}
	write_set(c, c->scratch_set, c->scratch.buf, size);
	return c->scratch.map;
}

int kv_run(kv_ctx *c, const kv_cmd *cmds, int n, uint64_t timeout_ns, char *err) {
	VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
	VkResult r = c->f.vkBeginCommandBuffer(c->cmd, &bi);
	if (r != VK_SUCCESS) return fail(err, "vkBeginCommandBuffer", r);
	VkMemoryBarrier hb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_HOST_WRITE_BIT,
		.dstAccessMask = VK_ACCESS_SHADER_READ_BIT};
	c->f.vkCmdPipelineBarrier(c->cmd, VK_PIPELINE_STAGE_HOST_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &hb, 0, NULL, 0, NULL);
	c->f.vkCmdBindDescriptorSets(c->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, c->layout, 0, 1, &c->scratch_set, 0, NULL);
	int pipe = -1;
	kv_wbuf *wb = NULL;
	for (int i = 0; i < n; i++) {
		const kv_cmd *k = &cmds[i];
		if (k->pipeline < 0 || k->pipeline >= c->npipe) {
			snprintf(err, KV_ERRLEN, "bad pipeline %d", k->pipeline);
			c->f.vkEndCommandBuffer(c->cmd);
			return -1;
		}
		if (k->barrier) {
			VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
				.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT, .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT};
			c->f.vkCmdPipelineBarrier(c->cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
		}
		if (k->pipeline != pipe) {
			c->f.vkCmdBindPipeline(c->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, c->pipes[k->pipeline]);
			pipe = k->pipeline;
		}
		if (k->weights != NULL && k->weights != wb) {
			c->f.vkCmdBindDescriptorSets(c->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, c->layout, 1, 1, &k->weights->set, 0, NULL);
			wb = k->weights;
		}
		c->f.vkCmdPushConstants(c->cmd, c->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, 32, k->push);
		c->f.vkCmdDispatch(c->cmd, k->gx, k->gy, k->gz);
	}
	VkMemoryBarrier ob = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
		.dstAccessMask = VK_ACCESS_HOST_READ_BIT};
	c->f.vkCmdPipelineBarrier(c->cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &ob, 0, NULL, 0, NULL);
	r = c->f.vkEndCommandBuffer(c->cmd);
	if (r != VK_SUCCESS) return fail(err, "vkEndCommandBuffer", r);
	return submit_wait(c, c->cmd, timeout_ns, err);
}

int kv_copy_bench(kv_ctx *c, uint64_t bytes, int iters, char *err) {
	VkBuffer b[2] = {VK_NULL_HANDLE, VK_NULL_HANDLE};
	VkDeviceMemory m[2] = {VK_NULL_HANDLE, VK_NULL_HANDLE};
	int rc = -1;
	for (int i = 0; i < 2; i++) {
		VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = bytes,
			.usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT, .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
		VkResult r = c->f.vkCreateBuffer(c->dev, &bi, NULL, &b[i]);
		if (r != VK_SUCCESS) { fail(err, "vkCreateBuffer (bandwidth)", r); goto done; }
		VkMemoryRequirements req;
		c->f.vkGetBufferMemoryRequirements(c->dev, b[i], &req);
		int mt = find_mem(c, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
		if (mt < 0) mt = find_mem(c, req.memoryTypeBits, 0, 0);
		VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = req.size, .memoryTypeIndex = (uint32_t)mt};
		r = c->f.vkAllocateMemory(c->dev, &ai, NULL, &m[i]);
		if (r != VK_SUCCESS) { fail(err, "vkAllocateMemory (bandwidth)", r); goto done; }
		r = c->f.vkBindBufferMemory(c->dev, b[i], m[i], 0);
		if (r != VK_SUCCESS) { fail(err, "vkBindBufferMemory (bandwidth)", r); goto done; }
	}
	VkCommandBufferBeginInfo cbi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
	VkResult r = c->f.vkBeginCommandBuffer(c->cmd, &cbi);
	if (r != VK_SUCCESS) { fail(err, "vkBeginCommandBuffer", r); goto done; }
	for (int it = 0; it < iters; it++) {
		if (it > 0) {
			VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT,
				.dstAccessMask = VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT};
			c->f.vkCmdPipelineBarrier(c->cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
		}
		VkBufferCopy cp = {.srcOffset = 0, .dstOffset = 0, .size = bytes};
		c->f.vkCmdCopyBuffer(c->cmd, b[it % 2], b[(it + 1) % 2], 1, &cp);
	}
	r = c->f.vkEndCommandBuffer(c->cmd);
	if (r != VK_SUCCESS) { fail(err, "vkEndCommandBuffer", r); goto done; }
	rc = submit_wait(c, c->cmd, UINT64_MAX, err);
done:
	for (int i = 0; i < 2; i++) {
		if (b[i]) c->f.vkDestroyBuffer(c->dev, b[i], NULL);
		if (m[i]) c->f.vkFreeMemory(c->dev, m[i], NULL);
	}
	return rc;
}

#endif // KV_HAVE_VULKAN_H
