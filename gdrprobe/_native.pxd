# What gdrprobe._native shares with the other native module (gdrprobe._nccl): the stop flag
# its loops poll, the loop clock, and the bounds check of what a loop touches.
from gdrprobe cimport _csrc as c


cdef class StopFlag:
    cdef int value


cdef c.gdr_clock _loop_clock(bint counter, double ns_per_tick)
cdef int _check_inside(str what, end, memory) except -1
