"""The current CUDA stream of an array's framework (the stream an op runs on when stream=None)."""


def current_stream(array):
    """The cudaStream_t (int) current for `array`'s framework and device."""
    mod = type(array).__module__.split(".")[0]
    if mod == "torch":
        import torch

        # torch's own raw-stream accessor (what Triton's launcher calls) is ~10x cheaper than
        # building a torch.cuda.Stream object; the public call where a torch lacks it
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return raw(array.device.index)
        return torch.cuda.current_stream(array.device).cuda_stream
    if mod == "cupy":
        import cupy

        with cupy.cuda.Device(array.device.id):
            return cupy.cuda.get_current_stream().ptr
    # jax and others: no notion of a current stream here; the legacy default stream.
    return 0


def current_device_stream(device_id):
    """The cudaStream_t (int) current on CUDA device `device_id` for torch, else cupy, when the
    program has imported it (neither is imported here); else 0, the legacy default stream. For
    calls that take no array (a layer's construction, StepMetadata.build)."""
    import sys

    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        if torch.cuda.is_available():
            return torch.cuda.current_stream(device_id).cuda_stream
    if "cupy" in sys.modules:
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(device_id):
            return cupy.cuda.get_current_stream().ptr
    return 0
