/*
 * table.h: gpuctl's text output: an aligned table, and the small
 * formatters its commands share (see table.c).
 */
#ifndef GPUCTL_TABLE_H
#define GPUCTL_TABLE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <protobuf-c/protobuf-c.h>

#include "proto/gpushare.pb-c.h"

/* Rows of cells, printed with each column as wide as its widest cell and two
 * spaces between columns; numeric columns are right-aligned (bit i of
 * `right` for column i). Row 0 is the header. Start one as `table t = {0};`. */
typedef struct table {
  int ncols;
  unsigned right; /* bit i: right-align column i */
  char **cells;   /* row-major, ncols per row, row 0 the header */
  size_t ncells, cap;
} table;

/* The header row: names up to a NULL; sets the number of columns. */
void table_header(table *t, unsigned right, const char *const *names);
/* The next cell, row by row. Out of memory exits 1. */
void table_cell(table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Print the table and free it. */
void table_fprint(FILE *f, table *t);
void table_print(table *t);
/* Free a table that is not printed. */
void table_free(table *t);

/* The formatters return a string that stays valid for the next 15 calls
 * (a ring of static slots), so several can appear in one printf. */

/* "5.00 GiB" */
const char *table_fsize(uint64_t b);
/* v with printf format fmt (one double conversion), or "-" when v is NaN
 * (a job without a test set has no test loss or accuracy) */
const char *table_fnum(const char *fmt, double v);
/* "test loss 0.4256, test accuracy 85.08%", or "no test set" when they
 * are NaN */
const char *table_ftest(double loss, double accuracy);
/* n, or "unlimited" for 0 */
const char *table_fcount_or_unlimited(uint32_t n);
/* local time "YYYY-MM-DD HH:MM:SS", or "-" for none */
const char *table_ftime(int64_t t);
/* Where job j is: "epoch 3, step 340/1875 (18.1%)" (the epoch it is in
 * while it runs, its last one after), "starting" for a running job that
 * has not reported a step yet (loading its data, building), "-" for one
 * that has run none */
const char *table_fprogress(const Gpushare__V1__Job *j);
/* v's name in d, or v as a number */
const char *table_enum_name(const ProtobufCEnumDescriptor *d, int v);
/* a JobState's name */
const char *table_state_name(int s);
/* a Precision's name */
const char *table_precision_name(int s);
/* "1000,1001", cut with "..." when long, "-" when empty */
const char *table_ids_list(const uint32_t *v, size_t n);
/* A job's dynamic loss scale for a job trained in `precision` (a Precision,
 * or -1 when not known): "-" where there is none (FLOAT32, MIXED_BFLOAT16,
 * or no figure: has is 0); with the precision not known, a scale of 1
 * reads as none. */
const char *table_fscale(int precision, int has, float scale);

/* The Precision of job j's spec, or -1 when its record has no spec. */
int table_job_precision(const Gpushare__V1__Job *j);
/* One "warning: ..." line on f for each epoch of job j in which more than
 * half of the optimizer steps were skipped (fp16 gradient overflow): that
 * epoch barely trained. Returns how many were printed. */
size_t table_skip_warnings(FILE *f, const Gpushare__V1__Job *j);

#endif
