"""What the formulations that plan workspaces share: the workspace budget their default candidates
are sized for (fft, tc, unrolled, winograd), and conv_wgrad's second pass, which sums the splits'
partial sums from a workspace in a fixed order (igemm_conv_wgrad_reduce.cu.j2: igemm's two_pass,
tc's TWO_PASS)."""
from __future__ import annotations

from autocnn.device import DEFAULT_WORKSPACE_BYTES
from autocnn.kernels.geometry import cdiv
from autocnn.kernels.problem import ConvWgradProblem
from autocnn.kernels.steps import Launch

# The default workspace limit (device.DEFAULT_WORKSPACE_BYTES): the budget the formulations' default
# candidates are sized for. Constraints hold configs to limits.workspace_bytes, the limit in force.
WORKSPACE_LIMIT_BYTES = DEFAULT_WORKSPACE_BYTES
REDUCE_THREADS = 256


def wgrad_reduce_launch(p: ConvWgradProblem) -> Launch:
    """The second pass of a two-pass combine (igemm_conv_wgrad_reduce.cu.j2): a fixed-order sum of
    the splits' partial sums of dW and db."""
    n = p.K * (p.C // p.groups) * p.R * p.S + p.K      # dW (K filters of C/groups channels) and db
    return Launch("conv_wgrad_reduce", (cdiv(n, REDUCE_THREADS), 1, 1), (REDUCE_THREADS, 1, 1), 0,
                  ("ws", "ws_bias", "dw", "db"))
