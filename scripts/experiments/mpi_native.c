/* Replays a recorded all-reduce (torus_train.comm.mpi) in one call: MPI calls and local adds, no Python
 * between them. Built on first use with the mpicc of the MPI that mpi4py runs on (scripts/experiments/mpi_native.py).
 *
 * A program is an array of tt_op, executed in order. Communicators are Fortran handles (portable across MPI
 * ABIs) converted once per call. Only float32 and float64 with MPI_SUM are supported; the Python side never
 * hands anything else over.
 */
#include <mpi.h>
#include <stdint.h>
#include <string.h>

enum { TT_SENDRECV = 0, TT_ISEND = 1, TT_IRECV = 2, TT_WAITALL = 3, TT_ALLREDUCE = 4, TT_REDUCE = 5,
       TT_BCAST = 6, TT_ADD = 7 };
enum { TT_MAX_COMMS = 4, TT_MAX_REQS = 256 };

typedef struct {
    int32_t kind;
    int32_t comm;   /* index into the communicator table */
    int32_t dtype;  /* 0: float32, 1: float64 */
    int32_t peer;   /* destination, or root */
    int32_t src;    /* source of a receive */
    int32_t tag;
    int64_t count;  /* elements at a */
    int64_t count2; /* elements at b */
    void *a;        /* send buffer, or the buffer reduced in place; NULL: MPI_IN_PLACE (reduce at the root) */
    void *b;        /* receive buffer, or the addend of TT_ADD; NULL: none */
} tt_op;

int tt_op_size(void) { return (int)sizeof(tt_op); }

int tt_library_version(char *out, int len) {
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int n = 0;
    int rc = MPI_Get_library_version(v, &n);
    if (rc != MPI_SUCCESS) return rc;
    if (n >= len) n = len - 1;
    memcpy(out, v, (size_t)n);
    out[n] = 0;
    return n;
}

static void add_f32(float *restrict out, const float *restrict in, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] += in[i];
}

static void add_f64(double *restrict out, const double *restrict in, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] += in[i];
}

/* Returns MPI_SUCCESS, or the first MPI error code (or -1 for a malformed program). */
int tt_run(const tt_op *ops, int nops, const int32_t *fcomms, int ncomms) {
    MPI_Comm comms[TT_MAX_COMMS];
    MPI_Request reqs[TT_MAX_REQS];
    int nreqs = 0, rc = MPI_SUCCESS;
    if (ncomms > TT_MAX_COMMS) return -1;
    for (int i = 0; i < ncomms; i++) comms[i] = MPI_Comm_f2c((MPI_Fint)fcomms[i]);
    for (int k = 0; k < nops && rc == MPI_SUCCESS; k++) {
        const tt_op *o = &ops[k];
        if (o->comm < 0 || o->comm >= ncomms) return -1;
        MPI_Comm c = comms[o->comm];
        MPI_Datatype t = o->dtype ? MPI_DOUBLE : MPI_FLOAT;
        switch (o->kind) {
        case TT_SENDRECV:
            rc = MPI_Sendrecv(o->a, (int)o->count, t, o->peer, o->tag, o->b, (int)o->count2, t, o->src, o->tag, c,
                              MPI_STATUS_IGNORE);
            break;
        case TT_ISEND:
            if (nreqs == TT_MAX_REQS) return -1;
            rc = MPI_Isend(o->a, (int)o->count, t, o->peer, o->tag, c, &reqs[nreqs++]);
            break;
        case TT_IRECV:
            if (nreqs == TT_MAX_REQS) return -1;
            rc = MPI_Irecv(o->b, (int)o->count2, t, o->src, o->tag, c, &reqs[nreqs++]);
            break;
        case TT_WAITALL:
            rc = MPI_Waitall(nreqs, reqs, MPI_STATUSES_IGNORE);
            nreqs = 0;
            break;
        case TT_ALLREDUCE:
            rc = MPI_Allreduce(MPI_IN_PLACE, o->a, (int)o->count, t, MPI_SUM, c);
            break;
        case TT_REDUCE:
            rc = MPI_Reduce(o->a ? o->a : MPI_IN_PLACE, o->b, (int)o->count, t, MPI_SUM, o->peer, c);
            break;
        case TT_BCAST:
            rc = MPI_Bcast(o->a, (int)o->count, t, o->peer, c);
            break;
        case TT_ADD:
            if (o->dtype) add_f64((double *)o->a, (const double *)o->b, o->count);
            else add_f32((float *)o->a, (const float *)o->b, o->count);
            break;
        default:
            return -1;
        }
    }
    if (nreqs && rc == MPI_SUCCESS) return -1; /* an exchange without its WAITALL */
    return rc;
}
