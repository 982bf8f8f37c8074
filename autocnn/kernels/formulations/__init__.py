"""Formulations: how an op is computed (direct tiling, implicit GEMM, tensor-core GEMM, ...), each
with its parameters, constraints, launch geometry and templates beside it."""
