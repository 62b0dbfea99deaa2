/*
 * Reading the mock NVML driver's state file: lines of tab-separated fields (quotient/nvmlmock/state.py documents
 * them), parsed with the C library alone. A file with any bad line is refused whole, saying which line and why, so
 * the driver keeps answering from the last good state rather than from half of a new one.
 */
#define _GNU_SOURCE
#include "mock_state.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FIELDS 24
#define MAX_FILE_BYTES (8 << 20)

void mock_complain(const char *path, int line, const char *what, const char *line_text) {
    fprintf(stderr, "quotient nvml mock: %s:%d: %s%s%s\n", path, line, what, line_text ? ": " : "",
            line_text ? line_text : "");
}

static int parse_u64(const char *text, unsigned long long max, unsigned long long *out) {
    char *end = NULL;
    if (text == NULL || *text == '\0' || *text == '-' || *text == '+') {
        return 0;
    }
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || end == NULL || *end != '\0' || value > max) {
        return 0;
    }
    *out = value;
    return 1;
}

/* A number or "-" (not supported: *present = 0). */
static int parse_optional(const char *text, unsigned long long max, int *present, unsigned long long *out) {
    if (text != NULL && strcmp(text, "-") == 0) {
        *present = 0;
        *out = 0;
        return 1;
    }
    *present = 1;
    return parse_u64(text, max, out);
}

static int copy_text(char *target, size_t size, const char *text) {
    size_t length = strlen(text);
    if (length == 0 || length >= size) {
        return 0;
    }
    memcpy(target, text, length + 1);
    return 1;
}

static int split(char *line, char **fields) {
    int count = 0;
    char *cursor = line;
    for (;;) {
        if (count == MAX_FIELDS) {
            return -1;
        }
        fields[count++] = cursor;
        char *tab = strchr(cursor, '\t');
        if (tab == NULL) {
            return count;
        }
        *tab = '\0';
        cursor = tab + 1;
    }
}

static const char *parse_device(mock_state *next, char **f, int n) {
    unsigned long long index, value, a, b;
    int present_a, present_b;
    if (n != 17) {
        return "a device line has 17 fields";
    }
    if (!parse_u64(f[1], MAX_DEVICES - 1, &index) || index != next->device_count) {
        return "device indexes must count up from 0 (at most 64 devices)";
    }
    mock_device *d = &next->devices[index];
    memset(d, 0, sizeof(*d));
    if (!copy_text(d->uuid, sizeof(d->uuid), f[2])) {
        return "the UUID must have 1 to 95 characters";
    }
    if (!copy_text(d->name, sizeof(d->name), f[3])) {
        return "the name must have 1 to 95 characters";
    }
    if (!parse_u64(f[4], ULLONG_MAX, &d->total) || !parse_u64(f[5], ULLONG_MAX, &d->reserved) ||
        !parse_u64(f[6], ULLONG_MAX, &d->used)) {
        return "memory total, reserved and used are byte counts";
    }
    if (!parse_optional(f[7], 100, &present_a, &a) || !parse_optional(f[8], 100, &present_b, &b) ||
        present_a != present_b) {
        return "utilisation is two percentages, or - and - where not supported";
    }
    d->has_utilization = present_a;
    d->gpu_util = (unsigned int)a;
    d->memory_util = (unsigned int)b;
    if (!parse_optional(f[9], 1000, &d->has_temperature, &value)) {
        return "temperature is degrees Celsius or -";
    }
    d->temperature = (unsigned int)value;
    if (!parse_optional(f[10], UINT_MAX, &d->has_power, &value)) {
        return "power is milliwatts or -";
    }
    d->power_mw = (unsigned int)value;
    if (!parse_optional(f[11], ULLONG_MAX, &present_a, &d->ecc_corrected) ||
        !parse_optional(f[12], ULLONG_MAX, &present_b, &d->ecc_uncorrected) || present_a != present_b) {
        return "ECC is two counts, or - and - where not supported";
    }
    d->has_ecc = present_a;
    if (!parse_optional(f[13], 1, &d->has_mig, &value)) {
        return "MIG mode is 0, 1 or -";
    }
    d->mig_mode = (unsigned int)value;
    if (!parse_u64(f[14], 1, &value)) {
        return "lost is 0 or 1";
    }
    d->lost = (int)value;
    if (!parse_optional(f[15], ULLONG_MAX, &d->has_events, &d->event_types)) {
        return "event types are a mask or -";
    }
    if (!parse_optional(f[16], 1, &d->has_process_lists, &value) || (d->has_process_lists && value != 1)) {
        return "process lists are 1 or -";
    }
    next->device_count++;
    return NULL;
}

static const char *parse_process(mock_state *next, char **f, int n) {
    unsigned long long device, pid, value;
    int present;
    if (n != 7) {
        return "a process line has 7 fields";
    }
    if (next->process_count == MAX_PROCESSES) {
        return "more than 4096 processes";
    }
    mock_process *p = &next->processes[next->process_count];
    if (!parse_u64(f[1], UINT_MAX, &device) || device >= next->device_count) {
        return "a process names a device listed above it";
    }
    if (!parse_u64(f[2], UINT_MAX, &pid)) {
        return "the pid is a number";
    }
    p->device = (unsigned int)device;
    p->pid = (unsigned int)pid;
    if (!parse_optional(f[3], ULLONG_MAX - 1, &present, &value)) {
        return "used memory is bytes or -";
    }
    p->used = present ? value : NOT_AVAILABLE;
    if (strcmp(f[4], "compute") == 0) {
        p->graphics = 0;
    } else if (strcmp(f[4], "graphics") == 0) {
        p->graphics = 1;
    } else {
        return "the kind is compute or graphics";
    }
    if (!parse_optional(f[5], UINT_MAX, &present, &value)) {
        return "the GPU instance is a number or -";
    }
    p->gpu_instance = present ? (unsigned int)value : NO_INSTANCE;
    if (!parse_optional(f[6], UINT_MAX, &present, &value)) {
        return "the compute instance is a number or -";
    }
    p->compute_instance = present ? (unsigned int)value : NO_INSTANCE;
    next->process_count++;
    return NULL;
}

static const char *parse_error(mock_state *next, char **f, int n) {
    unsigned long long device, code;
    if (n != 4) {
        return "an error line has 4 fields";
    }
    if (next->error_count == MAX_ERRORS) {
        return "more than 256 injected errors";
    }
    mock_error *e = &next->errors[next->error_count];
    if (!copy_text(e->call, sizeof(e->call), f[1])) {
        return "the call is a function name or *";
    }
    if (strcmp(f[2], "*") == 0) {
        e->device = -1;
    } else if (parse_u64(f[2], MAX_DEVICES - 1, &device)) {
        e->device = (int)device;
    } else {
        return "the device is an index or *";
    }
    if (!parse_u64(f[3], INT_MAX, &code) || code == NVML_SUCCESS) {
        return "the code is an NVML error code";
    }
    e->code = (nvmlReturn_t)code;
    next->error_count++;
    return NULL;
}

static const char *parse_event(mock_state *next, char **f, int n) {
    unsigned long long id, device, data;
    if (n != 5) {
        return "an event line has 5 fields";
    }
    if (next->event_count == MAX_EVENTS) {
        return "more than 4096 events";
    }
    mock_event *e = &next->events[next->event_count];
    if (!parse_u64(f[1], ULLONG_MAX, &id) || id == 0 ||
        (next->event_count > 0 && id <= next->events[next->event_count - 1].id)) {
        return "event ids are positive and increase down the file";
    }
    if (!parse_u64(f[2], UINT_MAX, &device) || device >= next->device_count) {
        return "an event names a device listed above it";
    }
    if (!parse_u64(f[4], ULLONG_MAX, &data)) {
        return "the event data is a number";
    }
    if (strcmp(f[3], "xid") == 0) {
        e->type = nvmlEventTypeXidCriticalError;
    } else if (strcmp(f[3], "ecc") == 0) {
        e->type = nvmlEventTypeDoubleBitEccError;
    } else {
        return "the event kind is xid or ecc";
    }
    e->id = id;
    e->device = (unsigned int)device;
    e->data = data;
    next->event_count++;
    return NULL;
}

int mock_state_parse(const char *path, FILE *file, mock_state *next) {
    next->device_count = next->process_count = next->error_count = next->event_count = 0;
    char *buffer = malloc(MAX_FILE_BYTES + 1);
    if (buffer == NULL) {
        mock_complain(path, 0, "out of memory", NULL);
        return 0;
    }
    size_t size = fread(buffer, 1, MAX_FILE_BYTES + 1, file);
    if (size > MAX_FILE_BYTES) {
        free(buffer);
        mock_complain(path, 0, "the state file is larger than 8 MiB", NULL);
        return 0;
    }
    buffer[size] = '\0';
    int line_number = 0;
    int ok = 1;
    int header = 0;
    char *save = NULL;
    for (char *line = strtok_r(buffer, "\n", &save); line != NULL && ok; line = strtok_r(NULL, "\n", &save)) {
        line_number++;
        if (line[0] == '#' || line[0] == '\0') {
            continue;
        }
        char copy[256];
        snprintf(copy, sizeof(copy), "%s", line);
        char *fields[MAX_FIELDS];
        int n = split(line, fields);
        const char *problem = NULL;
        if (n < 0) {
            problem = "too many fields";
        } else if (!header) {
            unsigned long long format;
            if (n != 2 || strcmp(fields[0], STATE_MAGIC) != 0 || !parse_u64(fields[1], 1000, &format) ||
                format != STATE_FORMAT) {
                problem = "the first line must be 'quotient-nvml-mock<TAB>1'";
            }
            header = 1;
        } else if (strcmp(fields[0], "device") == 0) {
            problem = parse_device(next, fields, n);
        } else if (strcmp(fields[0], "process") == 0) {
            problem = parse_process(next, fields, n);
        } else if (strcmp(fields[0], "error") == 0) {
            problem = parse_error(next, fields, n);
        } else if (strcmp(fields[0], "event") == 0) {
            problem = parse_event(next, fields, n);
        } else {
            problem = "a line starts with device, process, error or event";
        }
        if (problem != NULL) {
            mock_complain(path, line_number, problem, copy);
            ok = 0;
        }
    }
    free(buffer);
    if (ok && !header) {
        mock_complain(path, 0, "the state file is empty", NULL);
        ok = 0;
    }
    return ok;
}

