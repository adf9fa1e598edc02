"""The current CUDA stream of an array's framework (the stream an op runs on when stream=None)."""


def current_stream(array):
    """The cudaStream_t (int) current for `array`'s framework and device."""
    mod = type(array).__module__.split(".")[0]
    if mod == "torch":
        import torch

        return torch.cuda.current_stream(array.device).cuda_stream
    if mod == "cupy":
        import cupy

        with cupy.cuda.Device(array.device.id):
            return cupy.cuda.get_current_stream().ptr
    # jax and others: no notion of a current stream here; the legacy default stream.
    return 0
