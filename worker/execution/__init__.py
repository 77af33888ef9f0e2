"""The execution layer: the device, the KV cache's size, the model runner and its
step buffers, CUDA graphs, and the tensor-parallel ranks."""
