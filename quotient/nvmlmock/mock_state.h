/*
 * The mock NVML driver's state: what its GPUs say, as read from the state file (quotient/nvmlmock/state.py writes it
 * and documents the format). mock_state.c parses; mock_nvml.c answers NVML's calls from the result.
 */
#ifndef QUOTIENT_MOCK_STATE_H
#define QUOTIENT_MOCK_STATE_H

#include <nvml.h>
#include <stdio.h>

#define STATE_MAGIC "quotient-nvml-mock"
#define STATE_FORMAT 1
#define MAX_DEVICES 64
#define MAX_PROCESSES 4096
#define MAX_ERRORS 256
#define MAX_EVENTS 4096
#define MAX_CALL_NAME 64
#define NO_INSTANCE 0xFFFFFFFFu
#define NOT_AVAILABLE ((unsigned long long)NVML_VALUE_NOT_AVAILABLE)

typedef struct {
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    unsigned long long total, reserved, used;
    int has_utilization;
    unsigned int gpu_util, memory_util;
    int has_temperature;
    unsigned int temperature;
    int has_power;
    unsigned int power_mw;
    int has_ecc;
    unsigned long long ecc_corrected, ecc_uncorrected;
    int has_mig;
    unsigned int mig_mode;
    int lost;
    int has_events;
    unsigned long long event_types;
    int has_process_lists;
} mock_device;

typedef struct {
    unsigned int device;
    unsigned int pid;
    unsigned long long used; /* NOT_AVAILABLE where the driver does not say */
    int graphics;
    unsigned int gpu_instance, compute_instance;
} mock_process;

typedef struct {
    char call[MAX_CALL_NAME]; /* a symbol, its unversioned name, or "*" */
    int device;               /* -1: any device, and calls about no device */
    nvmlReturn_t code;
} mock_error;

typedef struct {
    unsigned long long id;
    unsigned int device;
    unsigned long long type;
    unsigned long long data;
} mock_event;

typedef struct {
    unsigned int device_count;
    mock_device devices[MAX_DEVICES];
    unsigned int process_count;
    mock_process processes[MAX_PROCESSES];
    unsigned int error_count;
    mock_error errors[MAX_ERRORS];
    unsigned int event_count;
    mock_event events[MAX_EVENTS];
} mock_state;

/* Say on stderr what is wrong with the state file at path (line 0: the file as a whole). */
void mock_complain(const char *path, int line, const char *what, const char *line_text);

/* Parse the whole of file (the state file at path) into next; 1 on success, 0 (said on stderr) otherwise. */
int mock_state_parse(const char *path, FILE *file, mock_state *next);

#endif
