/* The one error convention of csrc/.
 *
 * A function that can fail returns an int: FL_OK (0), or one of the negative codes below.
 * A function that returns a count, a size or an index returns it (>= 0), or a negative
 * code. A function that takes a `message` (FL_MESSAGE_BYTES) also writes there what went
 * wrong and with which input; fl_strerror gives every code's fixed description. */
#ifndef FASTLOAD_STATUS_H
#define FASTLOAD_STATUS_H

#define FL_MESSAGE_BYTES 512

enum {
    FL_OK = 0,
    FL_EINVAL = -1,        /* bad argument: null pointer, size, channel count, range */
    FL_ESCRATCH = -2,      /* scratch smaller than the matching *_scratch_bytes() */
    FL_ETOOSMALL = -3,     /* RandomCrop: the (padded) image is smaller than the crop */
    FL_ESHAPE = -4,        /* not the size the caller or the destination expects */
    FL_ENOMEM = -5,        /* out of memory */
    FL_EFORMAT = -6,       /* not in the expected format: bad magic or header */
    FL_ELIMIT = -7,        /* over a size limit (pixels, bytes) */
    FL_ETRUNCATED = -8,    /* the data ends too early */
    FL_ECORRUPT = -9,      /* the data is damaged */
    FL_ECAPACITY = -10,    /* an output buffer is too small */
    FL_EUNSUPPORTED = -11, /* not decoded here: the caller decodes another way */
    FL_EFAILED = -12,      /* failed: the message says why (I/O, a Python exception) */
    FL_EINTERRUPT = -13,   /* interrupted (Ctrl-C): fails the step, skipping or not */
    FL_ETIMEOUT = -14,     /* nothing ready within the time given */
    FL_ECANCELLED = -15,   /* the run was cancelled */
    FL_EFORKED = -16,      /* the object was made before this process forked */
    FL_ETHREADS = -17,     /* no thread could start */
    FL_DONE = -18          /* not an error: nothing more (every step was delivered) */
};

/* A static description of `code` ("unknown error" for a code not listed). */
const char *fl_strerror(int code);

#endif
