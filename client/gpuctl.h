/*
 * gpuctl.h: what the files of gpuctl, the command line, share.
 *
 * gpuctl is one program in several files: main.c reads the command line and
 * runs one command; cmd_admin.c, cmd_dataset.c, cmd_job.c and cmd_watch.c
 * hold the commands; table.c and pbjson.c print their results as text or
 * JSON. This header is the vocabulary between them: the context a command
 * runs in (gpuctl_cli), its parsed arguments (gpuctl_parsed), the exit
 * statuses and the type of a command's entry point. Each cmd_*.h declares
 * the commands of its cmd_*.c, which main.c's command table names, and what
 * that file lends the other commands. Every name here starts with gpuctl_
 * (GPUCTL_ for macros); what one file lends the others through its own
 * header starts with that file's name (cli_, table_, pbjson_), and what
 * serves one file only is static there.
 */
#ifndef GPUCTL_H
#define GPUCTL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "client/client.h"

#define GPUCTL_EXIT_OK 0
#define GPUCTL_EXIT_FAIL 1  /* refused by the daemon, or failed */
#define GPUCTL_EXIT_USAGE 2 /* the command line is wrong; nothing was done */
#define GPUCTL_EXIT_NOFIT 3 /* plan: the job, as written, does not fit its vdev */

#define GPUCTL_MAX_ARGS 128 /* positional arguments or values of one flag */
#define GPUCTL_MAX_FLAGS 8

/* A command's arguments, parsed against its flag table (main.c): pos[] the
 * positional ones, val[i][] the values given for flag i of the table, in
 * the table's order. */
typedef struct gpuctl_parsed {
  const char *pos[GPUCTL_MAX_ARGS];
  int npos;
  const char *val[GPUCTL_MAX_FLAGS][GPUCTL_MAX_ARGS]; /* values given for flag i */
  int nval[GPUCTL_MAX_FLAGS];
} gpuctl_parsed;

typedef struct gpuctl_cli gpuctl_cli;

/* A command: runs with its arguments parsed and checked, returns the exit
 * status. */
typedef int gpuctl_cmd_fn(gpuctl_cli *x, gpuctl_parsed *p);

/* A flag of a command, as the command table (main.c) lists it. */
typedef struct gpuctl_flag {
  const char *name;    /* "--memory" */
  const char *alias;   /* "-o", or NULL */
  const char *metavar; /* "SIZE"; NULL for a switch */
  int repeat;          /* may be given several times */
  int required;
  const char *help;
} gpuctl_flag;

/* A row of the command table (gpuctl_cli.cmd points at the one running). */
typedef struct gpuctl_command {
  const char *name;    /* "vdev create" */
  const char *args;    /* "NAME" for the usage line */
  int min_pos, max_pos; /* max_pos -1: any number */
  const char *summary;
  const gpuctl_flag *flags; /* terminated by a NULL name */
  gpuctl_cmd_fn *run;
  const char *details; /* extra help text, or NULL */
} gpuctl_command;

/* The context of one run of gpuctl. */
struct gpuctl_cli {
  const char *socket; /* --socket, or NULL for the default */
  int json;           /* --json */
  gs_client *c;       /* connected on first use */
  const gpuctl_command *cmd;
};

/* Declare Request `var` whose call is `field`, with its message
 * `field##_msg` initialised, on the stack. */
#define GPUCTL_REQ(var, field, CASE, Type, INIT) \
  Gpushare__V1__Request var = GPUSHARE__V1__REQUEST__INIT; \
  Type field##_msg = INIT; \
  var.call_case = GPUSHARE__V1__REQUEST__CALL_##CASE; \
  var.field = &field##_msg






#endif
