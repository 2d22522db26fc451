"""SkipRMSNorm's outputs bound over its inputs (an in-place residual update), one table for the
CPU kernels (test_kernel_aliasing.py) and the CUDA kernels run on the CPU
(test_cuda_emulated_aliasing.py): the op's rule is the same for both."""

# which input buffer each output (and skip) is bound to; absent: memory of its own; "s": None:
# the model leaves S out
ALIASES = {
    "S=X": {"s": "x"},
    "S=skip": {"s": "skip"},
    "Y=X": {"y": "x"},
    "Y=skip": {"y": "skip"},
    "Y=X,S=skip": {"y": "x", "s": "skip"},
    "Y=skip,S=X": {"y": "skip", "s": "x"},
    "Y=X,noS": {"y": "x", "s": None},
    "skip=X,S=X": {"skip": "x", "s": "x"},
    "skip=X,Y=X,noS": {"skip": "x", "y": "x", "s": None},
}
