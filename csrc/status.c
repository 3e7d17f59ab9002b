/* Descriptions of the codes of status.h. */
#include "status.h"

const char *fl_strerror(int code) {
    switch (code) {
    case FL_OK: return "ok";
    case FL_EINVAL: return "invalid argument";
    case FL_ESCRATCH: return "scratch buffer too small";
    case FL_ETOOSMALL: return "the image (with its padding) is smaller than the crop";
    case FL_ESHAPE: return "not the expected size";
    case FL_ENOMEM: return "out of memory";
    case FL_EFORMAT: return "not in the expected format (bad header)";
    case FL_ELIMIT: return "over the size limit";
    case FL_ETRUNCATED: return "truncated data";
    case FL_ECORRUPT: return "corrupt data";
    case FL_ECAPACITY: return "output buffer too small";
    case FL_EUNSUPPORTED: return "not supported here";
    case FL_EFAILED: return "failed";
    case FL_EINTERRUPT: return "interrupted";
    case FL_ETIMEOUT: return "timed out";
    case FL_ECANCELLED: return "cancelled";
    case FL_EFORKED: return "made before this process forked";
    case FL_ETHREADS: return "no thread could start";
    case FL_DONE: return "done";
    }
    return "unknown error";
}
