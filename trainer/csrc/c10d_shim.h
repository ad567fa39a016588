/* C ABI of the trainer's c10d shim (c10d_shim.cpp): torch's own distributed engine (TCPStore
 * rendezvous, ProcessGroupGloo; ProcessGroupNCCL with the `nccl` feature) over tch's tensors.
 *
 * Every function that can fail returns NULL on success or a heap error message (free it with
 * rc10d_free_error); no C++ exception crosses this boundary. `tensor` is tch's C_tensor, i.e. a
 * `torch::Tensor *`. Collectives are asynchronous: they return a work handle whose
 * rc10d_work_wait blocks until the collective ends, fails or the timeout passes. */
#ifndef RC10D_SHIM_H
#define RC10D_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rc10d_store rc10d_store; /* c10::intrusive_ptr<c10d::Store>   */
typedef struct rc10d_pg rc10d_pg;       /* c10::intrusive_ptr<c10d::Backend> */
typedef struct rc10d_work rc10d_work;   /* c10::intrusive_ptr<c10d::Work>    */
typedef void *rc10d_tensor;             /* torch::Tensor *                   */

void rc10d_free_error(char *err);
void rc10d_free_bytes(uint8_t *bytes);

/* TCPStore: the server (rank 0 unless an agent hosts it) waits for `world` clients. A server
 * given port 0 binds one the OS picks; `bound_port` (may be null) receives the port in use. */
char *rc10d_tcp_store_new(const char *host, uint16_t port, int is_server, int world,
                          int64_t timeout_ms, rc10d_store **out, uint16_t *bound_port);
/* The keys of `base` under `prefix` (shares the connection). */
char *rc10d_prefix_store_new(const char *prefix, rc10d_store *base, rc10d_store **out);
char *rc10d_store_set(rc10d_store *s, const char *key, const uint8_t *value, size_t n);
/* Waits up to timeout_ms for `key`; the value is heap memory (rc10d_free_bytes). */
char *rc10d_store_get(rc10d_store *s, const char *key, int64_t timeout_ms, uint8_t **value,
                      size_t *n);
/* Removes `key` (no error when it is not there). */
char *rc10d_store_delete(rc10d_store *s, const char *key);
void rc10d_store_free(rc10d_store *s);

/* A gloo process group. host: the address this rank's gloo device binds (NULL: gloo's default
 * device, which honours GLOO_SOCKET_IFNAME). threads: gloo worker threads (<= 0: 2). */
char *rc10d_gloo_new(rc10d_store *s, int rank, int world, const char *host, int threads,
                     int64_t timeout_ms, rc10d_pg **out);
/* A NCCL process group on CUDA device `device` (only with the `nccl` feature; else an error). */
char *rc10d_nccl_new(rc10d_store *s, int rank, int world, int device, int64_t timeout_ms,
                     rc10d_pg **out);
void rc10d_pg_free(rc10d_pg *pg);

/* op: 0 sum, 3 min, 4 max (c10d::ReduceOp::RedOpType). */
char *rc10d_all_reduce(rc10d_pg *pg, rc10d_tensor t, int op, int64_t timeout_ms,
                       rc10d_work **out);
/* out = this rank's part of the reduction of `in` (in has world x out's elements, dim 0). */
char *rc10d_reduce_scatter(rc10d_pg *pg, rc10d_tensor out, rc10d_tensor in, int op,
                           int64_t timeout_ms, rc10d_work **w);
/* out = every rank's `in`, concatenated along dim 0 in rank order. */
char *rc10d_all_gather(rc10d_pg *pg, rc10d_tensor out, rc10d_tensor in, int64_t timeout_ms,
                       rc10d_work **w);
char *rc10d_broadcast(rc10d_pg *pg, rc10d_tensor t, int root, int64_t timeout_ms,
                      rc10d_work **w);
char *rc10d_barrier(rc10d_pg *pg, int64_t timeout_ms, rc10d_work **w);
/* Blocks until the collective is done; its error, or a timeout, comes back as the message. */
char *rc10d_work_wait(rc10d_work *w, int64_t timeout_ms);
void rc10d_work_free(rc10d_work *w);

/* t.grad = grad (a leaf's gradient slot, for ranks whose backward never reached it). */
char *rc10d_set_grad(rc10d_tensor t, rc10d_tensor grad);

#ifdef __cplusplus
}
#endif
#endif
