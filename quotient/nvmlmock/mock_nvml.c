/*
 * A mock NVIDIA management library: libnvidia-ml.so.1 for machines without a GPU.
 *
 * Written against NVIDIA's published nvml.h (the nvidia-nvml-dev package), so every signature, struct and return
 * code is the real ABI, and loaded by the unpatched pynvml through the dynamic loader, as a real driver is. What the
 * "GPUs" say comes from a state file (the path is in $QUOTIENT_NVML_MOCK_STATE), which quotient/nvmlmock/state.py
 * writes and documents: devices, processes, errors injected per call, Xid and ECC events.
 *
 * Why it is shaped this way:
 * - A driver profile (quotient/nvmlmock/profiles.py) is a set of -D flags that decides which versioned symbols
 *   exist, so a 470-era, a 535-era and a current driver are each their own build. A symbol that is not compiled in
 *   is absent from the library, which is exactly what pynvml turns into NVML_ERROR_FUNCTION_NOT_FOUND.
 * - The state is re-read only when the file changed (its device, inode, size and modification time, one stat per
 *   call): the writer replaces the file atomically and makes every modification time strictly later.
 * - nvmlEventSetWait blocks in poll(2) on an inotify watch of the state file's directory (and on a pipe that
 *   nvmlShutdown writes to), never in a busy loop; without inotify it re-checks every 100 ms.
 * - Only NVML's functions (and two counters for tests) are exported; the state file is read by mock_state.c.
 */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS /* define the old unversioned names beside the versioned ones */
/* Built with -fvisibility=hidden: NVML's functions, as nvml.h declares them, are what the library exports. */
#pragma GCC visibility push(default)
#include <nvml.h>
#pragma GCC visibility pop

#include "mock_state.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef MOCK_DRIVER_VERSION
#error "build through quotient/nvmlmock/build.py: a driver profile defines MOCK_DRIVER_VERSION and the symbol set"
#endif
#ifndef MOCK_NVML_VERSION
#error "build through quotient/nvmlmock/build.py: a driver profile defines MOCK_NVML_VERSION"
#endif

#define STATE_ENV "QUOTIENT_NVML_MOCK_STATE"
#define WAIT_WITHOUT_INOTIFY_MS 100
#define EXPORT __attribute__((visibility("default")))

/* ---------------------------------------------------------------------------------------------------------------- */
/* The state                                                                                                        */

struct nvmlDevice_st {
    unsigned int index;
};

struct nvmlEventSet_st {
    unsigned long long masks[MAX_DEVICES]; /* registered event types per device */
    unsigned long long delivered;          /* the id of the last event this set has consumed */
    int watch_fd;                          /* inotify on the state's directory, or -1 */
};

typedef struct {
    int known;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
} file_key;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static mock_state state_buffers[2];
static mock_state *state = &state_buffers[0]; /* the last state read successfully */
static int state_loaded;
static file_key state_key;
static char state_path[PATH_MAX];
static char state_dir[PATH_MAX];
static unsigned int refcount;
static struct nvmlDevice_st handles[MAX_DEVICES];
static int wake_pipe[2] = {-1, -1};
static pthread_once_t wake_once = PTHREAD_ONCE_INIT;
static unsigned long long reloads; /* successful parses of the state file */
static unsigned long long checks;  /* stat calls made to see whether it changed */

/* ---------------------------------------------------------------------------------------------------------------- */
/* Reading the state file when it changed                                                                           */

/* Parse the file into the spare buffer; on success it becomes the state. */
static int parse_state(FILE *file) {
    mock_state *next = state == &state_buffers[0] ? &state_buffers[1] : &state_buffers[0];
    if (!mock_state_parse(state_path, file, next)) {
        return 0;
    }
    state = next;
    reloads++;
    return 1;
}

static int same_key(const file_key *key, const struct stat *st) {
    return key->known && key->dev == st->st_dev && key->ino == st->st_ino && key->size == st->st_size &&
           key->mtime.tv_sec == st->st_mtim.tv_sec && key->mtime.tv_nsec == st->st_mtim.tv_nsec;
}

/* Re-read the state file if it changed since the last look. A file that cannot be read or parsed leaves the last
 * good state in place (said once per version of the file on stderr). Called with the lock held. */
static void refresh_locked(void) {
    struct stat st;
    checks++;
    if (stat(state_path, &st) != 0) {
        if (state_key.known) {
            mock_complain(state_path, 0, strerror(errno), NULL);
            state_key.known = 0;
        }
        return;
    }
    if (same_key(&state_key, &st)) {
        return;
    }
    state_key.known = 1;
    state_key.dev = st.st_dev;
    state_key.ino = st.st_ino;
    state_key.size = st.st_size;
    state_key.mtime = st.st_mtim;
    FILE *file = fopen(state_path, "re");
    if (file == NULL) {
        mock_complain(state_path, 0, strerror(errno), NULL);
        return;
    }
    if (parse_state(file)) {
        state_loaded = 1;
    }
    fclose(file);
}

/* ---------------------------------------------------------------------------------------------------------------- */
/* Entering and leaving a call                                                                                      */

static nvmlReturn_t leave(nvmlReturn_t result) {
    pthread_mutex_unlock(&lock);
    return result;
}

/* The error injected for this call (on this device, -1 for none), or NVML_SUCCESS. */
static nvmlReturn_t injected(const char *symbol, const char *base, int device) {
    for (unsigned int i = 0; i < state->error_count; i++) {
        const mock_error *e = &state->errors[i];
        int call = strcmp(e->call, "*") == 0 || strcmp(e->call, symbol) == 0 || strcmp(e->call, base) == 0;
        if (call && (e->device == -1 || e->device == device)) {
            return e->code;
        }
    }
    return NVML_SUCCESS;
}

/* Lock, check NVML is initialised, refresh the state, apply injected errors. On failure the lock is released. */
static nvmlReturn_t enter(const char *symbol, const char *base) {
    pthread_mutex_lock(&lock);
    if (refcount == 0) {
        return leave(NVML_ERROR_UNINITIALIZED);
    }
    refresh_locked();
    nvmlReturn_t error = injected(symbol, base, -1);
    return error == NVML_SUCCESS ? NVML_SUCCESS : leave(error);
}

/* As enter, for a call about a device: the handle must be ours and the device must answer. */
static nvmlReturn_t enter_device(nvmlDevice_t device, const char *symbol, const char *base, const mock_device **out) {
    pthread_mutex_lock(&lock);
    if (refcount == 0) {
        return leave(NVML_ERROR_UNINITIALIZED);
    }
    refresh_locked();
    if (device == NULL || device < &handles[0] || device >= &handles[MAX_DEVICES] ||
        device->index >= state->device_count) {
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    const mock_device *d = &state->devices[device->index];
    if (d->lost) {
        return leave(NVML_ERROR_GPU_IS_LOST);
    }
    nvmlReturn_t error = injected(symbol, base, (int)device->index);
    if (error != NVML_SUCCESS) {
        return leave(error);
    }
    *out = d;
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_out(char *target, unsigned int length, const char *text) {
    if (target == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    size_t needed = strlen(text) + 1;
    if (length < needed) {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(target, text, needed);
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------------------------- */
/* Initialisation                                                                                                   */

static void make_wake_pipe(void) {
    if (pipe2(wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        wake_pipe[0] = wake_pipe[1] = -1;
    }
}

static void drain(int fd) {
    char sink[4096];
    while (fd >= 0 && read(fd, sink, sizeof(sink)) > 0) {
    }
}

static nvmlReturn_t init(const char *symbol) {
    pthread_once(&wake_once, make_wake_pipe);
    pthread_mutex_lock(&lock);
    if (refcount == 0) {
        const char *path = getenv(STATE_ENV);
        if (path == NULL || *path == '\0' || strlen(path) >= sizeof(state_path)) {
            fprintf(stderr, "quotient nvml mock: set " STATE_ENV " to the state file (quotient/nvmlmock/state.py)\n");
            return leave(NVML_ERROR_DRIVER_NOT_LOADED);
        }
        snprintf(state_path, sizeof(state_path), "%s", path);
        snprintf(state_dir, sizeof(state_dir), "%s", path);
        char *slash = strrchr(state_dir, '/');
        if (slash == NULL) {
            snprintf(state_dir, sizeof(state_dir), ".");
        } else if (slash == state_dir) {
            state_dir[1] = '\0';
        } else {
            *slash = '\0';
        }
        for (unsigned int i = 0; i < MAX_DEVICES; i++) {
            handles[i].index = i;
        }
        state_key.known = 0;
        state_loaded = 0;
        refresh_locked();
        if (!state_loaded) {
            return leave(NVML_ERROR_DRIVER_NOT_LOADED);
        }
        drain(wake_pipe[0]);
    } else {
        refresh_locked();
    }
    nvmlReturn_t error = injected(symbol, "nvmlInit", -1);
    if (error != NVML_SUCCESS) {
        return leave(error);
    }
    refcount++;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlInit(void) { return init("nvmlInit"); }

nvmlReturn_t nvmlInit_v2(void) { return init("nvmlInit_v2"); }

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return init("nvmlInitWithFlags");
}

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    if (refcount == 0) {
        return leave(NVML_ERROR_UNINITIALIZED);
    }
    refcount--;
    if (refcount == 0 && wake_pipe[1] >= 0) {
        /* End the event waits in flight: they see NVML shut down and return. */
        ssize_t written = write(wake_pipe[1], "x", 1);
        (void)written;
    }
    return leave(NVML_SUCCESS);
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    default: return "Unknown Error";
    }
}

/* ---------------------------------------------------------------------------------------------------------------- */
/* System and discovery                                                                                             */

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t entered = enter("nvmlSystemGetDriverVersion", "nvmlSystemGetDriverVersion");
    return entered != NVML_SUCCESS ? entered : leave(copy_out(version, length, MOCK_DRIVER_VERSION));
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    nvmlReturn_t entered = enter("nvmlSystemGetNVMLVersion", "nvmlSystemGetNVMLVersion");
    return entered != NVML_SUCCESS ? entered : leave(copy_out(version, length, MOCK_NVML_VERSION));
}

static nvmlReturn_t device_count(unsigned int *count, const char *symbol) {
    nvmlReturn_t entered = enter(symbol, "nvmlDeviceGetCount");
    if (entered != NVML_SUCCESS) {
        return entered;
    }
    if (count == NULL) {
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    *count = state->device_count;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return device_count(count, "nvmlDeviceGetCount"); }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { return device_count(count, "nvmlDeviceGetCount_v2"); }

static nvmlReturn_t handle_by_index(unsigned int index, nvmlDevice_t *device, const char *symbol) {
    nvmlReturn_t entered = enter(symbol, "nvmlDeviceGetHandleByIndex");
    if (entered != NVML_SUCCESS) {
        return entered;
    }
    if (device == NULL || index >= state->device_count) {
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (state->devices[index].lost) {
        return leave(NVML_ERROR_GPU_IS_LOST);
    }
    nvmlReturn_t error = injected(symbol, "nvmlDeviceGetHandleByIndex", (int)index);
    if (error != NVML_SUCCESS) {
        return leave(error);
    }
    *device = &handles[index];
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return handle_by_index(index, device, "nvmlDeviceGetHandleByIndex");
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    return handle_by_index(index, device, "nvmlDeviceGetHandleByIndex_v2");
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    const mock_device *d;
    nvmlReturn_t entered = enter_device(device, "nvmlDeviceGetIndex", "nvmlDeviceGetIndex", &d);
    if (entered != NVML_SUCCESS) {
        return entered;
    }
    if (index == NULL) {
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    *index = device->index;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    const mock_device *d;
    nvmlReturn_t entered = enter_device(device, "nvmlDeviceGetUUID", "nvmlDeviceGetUUID", &d);
    return entered != NVML_SUCCESS ? entered : leave(copy_out(uuid, length, d->uuid));
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    const mock_device *d;
    nvmlReturn_t entered = enter_device(device, "nvmlDeviceGetName", "nvmlDeviceGetName", &d);
    return entered != NVML_SUCCESS ? entered : leave(copy_out(name, length, d->name));
}

/* ---------------------------------------------------------------------------------------------------------------- */
/* Per-instant queries                                                                                              */

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    const mock_device *d;
    nvmlReturn_t entered = enter_device(device, "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo", &d);
    if (entered != NVML_SUCCESS) {
        return entered;
    }
    if (memory == NULL) {
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    /* Version 1 counts what the driver reserves as used ("Sum of Reserved and Allocated device memory"). */
    unsigned long long used = d->used + d->reserved;
    memory->total = d->total;
    memory->used = used;
    memory->free = d->total > used ? d->total - used : 0;
    return leave(NVML_SUCCESS);
}

#ifdef MOCK_MEMORY_INFO_V2
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    const mock_device *d;
    nvmlReturn_t entered = enter_device(device, "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMemoryInfo", &d);
    if (entered != NVML_SUCCESS) {
        return entered;
    }
    if (memory == NULL) {
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (memory->version != nvmlMemory_v2) {
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    }
    unsigned long long taken = d->reserved + d->used;
    memory->total = d->total;
    memory->reserved = d->reserved;
    memory->used = d->used;
    memory->free = d->total > taken ? d->total - taken : 0;
    return leave(NVML_SUCCESS);
}
#endif

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    const mock_device *d;
    nvmlReturn_t entered =
        enter_device(device, "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetUtilizationRates", &d);
    if (entered != NVML_SUCCESS) {
        return entered;
    }
    if (utilization == NULL) {
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (!d->has_utilization) {
        return leave(NVML_ERROR_NOT_SUPPORTED);
    }
    utilization->gpu = d->gpu_util;
    utilization->memory = d->memory_util;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensor, unsigned int *temp) {
    const mock_device *d;
    nvmlReturn_t entered = enter_device(device, "nvmlDeviceGetTemperature", "nvmlDeviceGetTemperature", &d);
    if (entered != NVML_SUCCESS) {
        return entered;
    }
    if (temp == NULL || sensor != NVML_TEMPERATURE_GPU) {
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (!d->has_temperature) {
        return leave(NVML_ERROR_NOT_SUPPORTED);
    }
    *temp = d->temperature;
    return leave(NVML_SUCCESS);
}

#ifdef MOCK_TEMPERATURE_V
nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature) {
    const mock_device *d;
    nvmlReturn_t entered = enter_device(device, "nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperatureV", &d);
    if (entered != NVML_SUCCESS) {
        return entered;
    }
    if (temperature == NULL) {
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (temperature->version != nvmlTemperature_v1) {
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    }
    if (temperature->sensorType != NVML_TEMPERATURE_GPU) {
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (!d->has_temperature) {
        return leave(NVML_ERROR_NOT_SUPPORTED);
    }
    temperature->temperature = (int)d->temperature;
    return leave(NVML_SUCCESS);
}
#endif

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    const mock_device *d;
    nvmlReturn_t entered = enter_device(device, "nvmlDeviceGetPowerUsage", "nvmlDeviceGetPowerUsage", &d);
    if (entered != NVML_SUCCESS) {
        return entered;
    }
    if (power == NULL) {
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (!d->has_power) {
        return leave(NVML_ERROR_NOT_SUPPORTED);
    }
    *power = d->power_mw;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t error_type,
                                         nvmlEccCounterType_t counter_type, unsigned long long *count) {
    const mock_device *d;
    nvmlReturn_t entered = enter_device(device, "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetTotalEccErrors", &d);
    if (entered != NVML_SUCCESS) {
        return entered;
    }
    if (count == NULL || (error_type != NVML_MEMORY_ERROR_TYPE_CORRECTED &&
                          error_type != NVML_MEMORY_ERROR_TYPE_UNCORRECTED) ||
        (counter_type != NVML_VOLATILE_ECC && counter_type != NVML_AGGREGATE_ECC)) {
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (!d->has_ecc) {
        return leave(NVML_ERROR_NOT_SUPPORTED);
    }
    /* One set of counts serves both the volatile and the aggregate counter. */
    *count = error_type == NVML_MEMORY_ERROR_TYPE_CORRECTED ? d->ecc_corrected : d->ecc_uncorrected;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    const mock_device *d;
    nvmlReturn_t entered = enter_device(device, "nvmlDeviceGetMigMode", "nvmlDeviceGetMigMode", &d);
    if (entered != NVML_SUCCESS) {
        return entered;
    }
    if (current == NULL || pending == NULL) {
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (!d->has_mig) {
        return leave(NVML_ERROR_NOT_SUPPORTED);
    }
    *current = *pending = d->mig_mode;
    return leave(NVML_SUCCESS);
}

/* ---------------------------------------------------------------------------------------------------------------- */
/* Process lists                                                                                                    */

/* Version 1 entries are (pid, memory); versions 2 and 3 share nvmlProcessInfo_v2_t, which adds the MIG instances. */
static nvmlReturn_t processes(nvmlDevice_t device, unsigned int *count, void *infos, int version, int graphics,
                              const char *symbol, const char *base) {
    const mock_device *d;
    nvmlReturn_t entered = enter_device(device, symbol, base, &d);
    if (entered != NVML_SUCCESS) {
        return entered;
    }
    if (count == NULL) {
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (!d->has_process_lists) {
        return leave(NVML_ERROR_NOT_SUPPORTED);
    }
    unsigned int found = 0;
    for (unsigned int i = 0; i < state->process_count; i++) {
        const mock_process *p = &state->processes[i];
        found += p->device == device->index && p->graphics == graphics;
    }
    if (*count < found) {
        *count = found;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if (found > 0 && infos == NULL) {
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    unsigned int written = 0;
    for (unsigned int i = 0; i < state->process_count; i++) {
        const mock_process *p = &state->processes[i];
        if (p->device != device->index || p->graphics != graphics) {
            continue;
        }
        if (version == 1) {
            nvmlProcessInfo_v1_t *entry = (nvmlProcessInfo_v1_t *)infos + written;
            entry->pid = p->pid;
            entry->usedGpuMemory = p->used;
        } else {
            nvmlProcessInfo_v2_t *entry = (nvmlProcessInfo_v2_t *)infos + written;
            entry->pid = p->pid;
            entry->usedGpuMemory = p->used;
            entry->gpuInstanceId = p->gpu_instance;
            entry->computeInstanceId = p->compute_instance;
        }
        written++;
    }
    *count = written;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                  nvmlProcessInfo_v1_t *infos) {
    return processes(device, count, infos, 1, 0, "nvmlDeviceGetComputeRunningProcesses",
                     "nvmlDeviceGetComputeRunningProcesses");
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_v2_t *infos) {
    return processes(device, count, infos, 2, 0, "nvmlDeviceGetComputeRunningProcesses_v2",
                     "nvmlDeviceGetComputeRunningProcesses");
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                   nvmlProcessInfo_v1_t *infos) {
    return processes(device, count, infos, 1, 1, "nvmlDeviceGetGraphicsRunningProcesses",
                     "nvmlDeviceGetGraphicsRunningProcesses");
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                      nvmlProcessInfo_v2_t *infos) {
    return processes(device, count, infos, 2, 1, "nvmlDeviceGetGraphicsRunningProcesses_v2",
                     "nvmlDeviceGetGraphicsRunningProcesses");
}

#ifdef MOCK_RUNNING_PROCESSES_V3
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    return processes(device, count, infos, 3, 0, "nvmlDeviceGetComputeRunningProcesses_v3",
                     "nvmlDeviceGetComputeRunningProcesses");
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                      nvmlProcessInfo_t *infos) {
    return processes(device, count, infos, 3, 1, "nvmlDeviceGetGraphicsRunningProcesses_v3",
                     "nvmlDeviceGetGraphicsRunningProcesses");
}
#endif

/* ---------------------------------------------------------------------------------------------------------------- */
/* Events                                                                                                           */

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    nvmlReturn_t entered = enter("nvmlEventSetCreate", "nvmlEventSetCreate");
    if (entered != NVML_SUCCESS) {
        return entered;
    }
    if (set == NULL) {
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    struct nvmlEventSet_st *created = calloc(1, sizeof(*created));
    if (created == NULL) {
        return leave(NVML_ERROR_MEMORY);
    }
    /* Events written before the set existed are history: a set sees only what happens after it is made. */
    created->delivered = state->event_count > 0 ? state->events[state->event_count - 1].id : 0;
    created->watch_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (created->watch_fd >= 0 &&
        inotify_add_watch(created->watch_fd, state_dir,
                          IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_ATTRIB | IN_DELETE) < 0) {
        close(created->watch_fd);
        created->watch_fd = -1;
    }
    *set = created;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
    const mock_device *d;
    nvmlReturn_t entered =
        enter_device(device, "nvmlDeviceGetSupportedEventTypes", "nvmlDeviceGetSupportedEventTypes", &d);
    if (entered != NVML_SUCCESS) {
        return entered;
    }
    if (types == NULL) {
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (!d->has_events) {
        return leave(NVML_ERROR_NOT_SUPPORTED);
    }
    *types = d->event_types;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
    const mock_device *d;
    nvmlReturn_t entered = enter_device(device, "nvmlDeviceRegisterEvents", "nvmlDeviceRegisterEvents", &d);
    if (entered != NVML_SUCCESS) {
        return entered;
    }
    if (set == NULL) {
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (!d->has_events || (types & ~d->event_types) != 0) {
        return leave(NVML_ERROR_NOT_SUPPORTED);
    }
    set->masks[device->index] |= types;
    return leave(NVML_SUCCESS);
}

static long elapsed_ms(const struct timespec *since) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - since->tv_sec) * 1000L + (now.tv_nsec - since->tv_nsec) / 1000000L;
}

/* Block until the state file's directory changes, NVML shuts down, or timeout_ms passes. */
static void wait_for_change(nvmlEventSet_t set, long timeout_ms) {
    struct pollfd fds[2];
    nfds_t count = 0;
    if (wake_pipe[0] >= 0) {
        fds[count].fd = wake_pipe[0];
        fds[count].events = POLLIN;
        count++;
    }
    if (set->watch_fd >= 0) {
        fds[count].fd = set->watch_fd;
        fds[count].events = POLLIN;
        count++;
    } else if (timeout_ms > WAIT_WITHOUT_INOTIFY_MS) {
        timeout_ms = WAIT_WITHOUT_INOTIFY_MS;
    }
    if (poll(fds, count, (int)timeout_ms) > 0) {
        drain(set->watch_fd);
    }
}

static nvmlReturn_t event_wait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms,
                               const char *symbol) {
    struct timespec started;
    clock_gettime(CLOCK_MONOTONIC, &started);
    for (;;) {
        nvmlReturn_t entered = enter(symbol, "nvmlEventSetWait");
        if (entered != NVML_SUCCESS) {
            return entered;
        }
        if (set == NULL || data == NULL) {
            return leave(NVML_ERROR_INVALID_ARGUMENT);
        }
        for (unsigned int i = 0; i < state->event_count; i++) {
            const mock_event *e = &state->events[i];
            if (e->id <= set->delivered) {
                continue;
            }
            set->delivered = e->id;
            if ((set->masks[e->device] & e->type) != 0 && !state->devices[e->device].lost) {
                data->device = &handles[e->device];
                data->eventType = e->type;
                data->eventData = e->type == nvmlEventTypeXidCriticalError ? e->data : 0;
                data->gpuInstanceId = NO_INSTANCE;
                data->computeInstanceId = NO_INSTANCE;
                return leave(NVML_SUCCESS);
            }
        }
        /* A device of the set that fell off the bus fails every wait, as the driver's does. */
        for (unsigned int i = 0; i < state->device_count; i++) {
            if (set->masks[i] != 0 && state->devices[i].lost) {
                return leave(NVML_ERROR_GPU_IS_LOST);
            }
        }
        pthread_mutex_unlock(&lock);
        long remaining = (long)timeout_ms - elapsed_ms(&started);
        if (remaining <= 0) {
            return NVML_ERROR_TIMEOUT;
        }
        wait_for_change(set, remaining);
    }
}

nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    return event_wait(set, data, timeout_ms, "nvmlEventSetWait");
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    return event_wait(set, data, timeout_ms, "nvmlEventSetWait_v2");
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    pthread_mutex_lock(&lock);
    if (refcount == 0) {
        return leave(NVML_ERROR_UNINITIALIZED);
    }
    if (set == NULL) {
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (set->watch_fd >= 0) {
        close(set->watch_fd);
    }
    free(set);
    return leave(NVML_SUCCESS);
}

/* ---------------------------------------------------------------------------------------------------------------- */
/* For tests: how often the state file was parsed, and how often it was checked for a change.                      */

EXPORT unsigned long long quotient_mock_reloads(void) {
    pthread_mutex_lock(&lock);
    unsigned long long value = reloads;
    pthread_mutex_unlock(&lock);
    return value;
}

EXPORT unsigned long long quotient_mock_checks(void) {
    pthread_mutex_lock(&lock);
    unsigned long long value = checks;
    pthread_mutex_unlock(&lock);
    return value;
}
