# The declarations of status.h that the binding uses.
cdef extern from "status.h" nogil:
    enum:
        FL_MESSAGE_BYTES
        FL_OK
        FL_EINVAL
        FL_ESCRATCH
        FL_ETOOSMALL
        FL_ENOMEM
        FL_EUNSUPPORTED
        FL_ELIMIT
        FL_ETRUNCATED
        FL_EFAILED
        FL_EINTERRUPT
        FL_ETIMEOUT
        FL_ECANCELLED
        FL_EFORKED
        FL_ETHREADS
        FL_DONE
    const char *fl_strerror(int code)
