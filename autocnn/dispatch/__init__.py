"""Dispatch: from a kernel problem to a loaded kernel that runs, for the training library
(autocnn.nn.cuda_backend) and the PyTorch front end (autocnn.torch.launch) alike.

Modules: ``kernels`` (GpuKernels: lookup -> quick tuning where no record covers a problem ->
plan -> compile and load -> launch on named buffers; KernelDispatch, what a backend says it
runs; ``prepare_all``, what preparing each problem cost), ``quick`` (quick tuning, the autotune
modes, and the TuningBudget that a model's problems share) and ``workspace_arena`` (the workspaces
of one operation's plans in one buffer).
"""
