"""hmla: sparse-attention training for MLA models. `hmla.torch` holds its kernels as torch operators."""
